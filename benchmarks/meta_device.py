"""The learner's update on PyTorch's meta device, where tensors have shapes, dtypes and a device but no values: what
a CUDA graph of the update holds can be checked and counted there on a machine without a GPU. An operation that
reads a value back to the host (.item(), a tensor as a bool, nonzero, a mask) fails on meta tensors, as one that
mixes in a tensor of another device does (a 0-dim one excepted, which Operators reports).

Used by tests/test_trainer.py (what a capture needs) and by benchmarks/learner.py --operators (how many).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

META = torch.device("meta")
# Operators that make a view or an alias of a tensor: no kernel runs for them.
VIEWS = {"view", "t", "unsqueeze", "squeeze", "select", "slice", "expand", "permute", "transpose", "detach",
         "alias", "_unsafe_view", "as_strided", "lift_fresh", "unbind", "split", "split_with_sizes", "chunk"}
_FUSED_ADAM = "_fused_adam_.tensor_lr"   # Adam reading its learning rate from the device, as a captured one does


def on_meta(trainer) -> None:
    """Moves every tensor `trainer` (an rl_dqn.trainer.Trainer) holds to the meta device: its networks and their
    gradients, Adam's state and learning rate, the moving average, the replay and its sum tree, its own buffers;
    and points each device it keeps there. A tensor held in two places (a parameter in its module and in Adam's
    groups) stays one tensor."""
    moved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # id -> (a tensor, its meta copy), the copies' too
    visited: set[int] = set()

    def tensor(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in moved:
            copy = t.detach().to(META)
            if isinstance(t, torch.nn.Parameter):
                copy = torch.nn.Parameter(copy, requires_grad=t.requires_grad)
                copy.grad = None if t.grad is None else t.grad.detach().to(META)
            moved[id(t)], moved[id(copy)] = (t, copy), (copy, copy)
        return moved[id(t)][1]

    def value(v):
        if isinstance(v, torch.Tensor):
            return tensor(v)
        if isinstance(v, torch.device):
            return META
        if isinstance(v, list):
            return [value(x) for x in v]
        if isinstance(v, torch.nn.Module) or type(v).__module__.startswith("rl_dqn.") and hasattr(v, "__dict__"):
            instance(v)
        return v

    def instance(o) -> None:
        if id(o) in visited or dataclasses.is_dataclass(o):   # the config: frozen, and holds no tensor
            return
        visited.add(id(o))
        if isinstance(o, torch.nn.Module):
            for table in (o._parameters, o._buffers):
                for name, t in table.items():
                    table[name] = None if t is None else tensor(t)
            for child in o.children():
                instance(child)
        for name, v in list(vars(o).items()):
            if name not in ("optimizer", "generator", "_parameters", "_buffers", "_modules"):
                setattr(o, name, value(v))

    instance(trainer)
    optimizer = trainer.optimizer
    state = {tensor(p): {k: value(v) for k, v in s.items()} for p, s in optimizer.state.items()}
    optimizer.state.clear()
    optimizer.state.update(state)
    for group in optimizer.param_groups:
        group["params"] = [tensor(p) for p in group["params"]]
        group["lr"] = value(group["lr"])


class Operators(TorchDispatchMode):
    """Records the operators run inside it, as a CUDA graph would hold them: each with its tensors' shapes, dtypes
    and devices and its other arguments' values (`ops`), the part of the update it belongs to (`parts`, see
    part()), and those that touched a tensor off the meta device (`elsewhere`)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.parts: list[str] = []
        self.elsewhere: list[str] = []
        self._within = ["other"]

    @contextlib.contextmanager
    def part(self, name: str):
        """Operators run inside belong to part `name` (the innermost part, where parts nest)."""
        self._within.append(name)
        try:
            yield
        finally:
            self._within.pop()

    def kernels(self) -> Counter:
        """Per part, the operators that run a kernel (views and aliases left out)."""
        return Counter(part for op, part in zip(self.ops, self.parts)
                       if op.split("(")[0].split(".")[1] not in VIEWS and not op.startswith("profiler."))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        devices = set()

        def described(a):
            if isinstance(a, torch.Tensor):
                devices.add(a.device)
                return f"{a.dtype}{list(a.shape)}@{a.device.type}"
            if isinstance(a, (list, tuple)):
                return "(" + ", ".join(described(x) for x in a) + ")"
            return type(a).__name__ if isinstance(a, torch.ScriptObject) else repr(a)

        op = f"{func}{described(args)} {described(sorted(kwargs.items()))} -> {described(result)}"
        self.ops.append(op)
        self.parts.append(self._within[-1])
        if devices - {META}:
            self.elsewhere.append(op)
        return result


@contextlib.contextmanager
def fused_adam_kernel():
    """Fused Adam with its learning rate on the device (as a captured update's Adam reads it) has no meta kernel in
    torch: while inside, one that checks what the CUDA kernel needs (every tensor on one device) and changes
    nothing stands in for it."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{_FUSED_ADAM}", "Meta"):
        yield
        return

    def meta_kernel(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, **options):
        devices = {t.device for t in [*params, *grads, *exp_avgs, *exp_avg_sqs, *max_exp_avg_sqs, *state_steps, lr]}
        if len(devices) != 1:
            raise RuntimeError(f"fused Adam's tensors are on several devices: {sorted(map(str, devices))}")

    library = torch.library.Library("aten", "IMPL")
    library.impl(_FUSED_ADAM, meta_kernel, "Meta")
    try:
        yield
    finally:
        library._destroy()


# The parts of an update that recorded_parts() tells apart, in the order it runs them; `other` is in none of them.
PARTS = ["draw", "batch", "inputs", "target network", "online network on s'", "online network on s", "loss",
         "priorities", "gradient step", "other"]


def recorded_parts(trainer, operators: Operators) -> None:
    """Wraps the parts of `trainer`'s update (already on the meta device) so that `operators` tells them apart: the
    draw (the sum tree's walk and the importance weights), the batch's gather, the frames made into the networks'
    inputs, each network's values, the loss, the new priorities, and the gradient step (backward, clipping, Adam,
    the moving average and sums); what is in none of them is `other`."""
    def wrapped(name: str, method):
        def call(*args, **kwargs):
            with operators.part(name):
                return method(*args, **kwargs)
        return call

    replay = trainer.replay
    for owner, attribute, name in [
            (replay, "sample_at", "draw"), (replay, "_gather", "batch"),
            (trainer.network, "inputs", "inputs"), (trainer.target, "inputs", "inputs"),
            (trainer, "_target_values", "target network"), (trainer, "_values_beside", "online network on s'"),
            (trainer, "_taken", "online network on s"), (trainer, "_loss", "loss"),
            (replay, "update_priorities", "priorities"), (trainer, "_apply", "gradient step")]:
        setattr(owner, attribute, wrapped(name, getattr(owner, attribute)))
