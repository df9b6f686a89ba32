"""(Double) DQN on a replay memory: the networks, the optimizer, the replay and its sampling, and step(), one update.
It knows nothing of collectors, transports, metrics or files; the learner role wires it to them."""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import os
import traceback
from pathlib import Path
from typing import NamedTuple

import torch

from envs import EnvSpec
from rl_dqn import dqn
from rl_dqn.config import Config
from rl_dqn.console import first_line
from rl_dqn.network import QNetwork
from rl_dqn.replay import ReplayMemory
from rl_dqn.types import Weights


def compute_threads(cfg: Config, device: torch.device) -> int:
    """The learner's compute threads on `device`: the training thread, and with learner.overlap the one preparing
    batches, except where the update is a captured CUDA graph (learner.cuda_graph on a GPU): one launch, with
    nothing to overlap."""
    captured = cfg.learner.cuda_graph and device.type == "cuda"
    return 2 if cfg.learner.overlap and not captured else 1


def torch_threads(cfg: Config, device: torch.device) -> int:
    """Intra-op threads for each of the learner's compute threads: learner.torch_threads, or the CPU cores shared
    out among them (see Trainer.step())."""
    return cfg.learner.torch_threads or max(1, (os.cpu_count() or 1) // compute_threads(cfg, device))


class Update(NamedTuple):
    """What one update computed, on the trainer's device: the batch's Q(s, a), its TD targets and the loss (with
    network.quantiles, the means of Q(s, a)'s quantiles and of the target's)."""
    q: torch.Tensor
    targets: torch.Tensor
    loss: torch.Tensor


def _described(error: Exception) -> str:
    """`error` in one line: its type, its message's first line and the line of this package that raised it."""
    message = first_line(error)
    ours = [frame for frame in traceback.extract_tb(error.__traceback__)
            if Path(frame.filename).parent.name == "rl_dqn"]
    where = f" (at rl_dqn/{Path(ours[-1].filename).name}:{ours[-1].lineno})" if ours else ""
    return f"{type(error).__name__}: {message}{where}"


# Failed captures' graphs, kept for the process's life: a capture's start gives the pinned-memory allocator a filter
# that refers to its graph by address, which a capture whose end raised leaves in place (capture_begin and
# capture_end in https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/cuda/CUDAGraph.cpp), so the graph freed
# would leave the allocator a dangling pointer.
_FAILED_GRAPHS: list[torch.cuda.CUDAGraph] = []


def _end_allocation_to(pool, device: torch.device) -> None:
    """After a capture that failed, the caching allocator stops giving the device's memory out of the graph's pool.
    A torch whose capture_end raises before it ends that itself leaves the allocator believing a capture is under
    way: it then keeps every freed block that another stream used, and a later synchronisation of the allocator
    (an allocation that must free cached memory first) fails an internal assertion. The pool itself is left to the
    graph: a torch that releases it after a failed capture does, one that does not keeps it until the process ends.
    A private function of torch's (one torch.cuda.memory.use_mem_pool calls), tried as it is found."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(index, pool)
    except (AttributeError, RuntimeError):   # capture_end ended it, or a torch that names it otherwise
        pass


class Trainer:
    """The online and target Q-networks, Adam, the replay memory (on the same device) and the sampling generator.
    `cfg` is the config as this process runs it (network.precision resolved for `device`).

    An update runs eagerly, or on static buffers (`static`, by default learner.cuda_graph on a GPU): its inputs
    written into fixed tensors, Adam's learning rate and step count on the device, no host sync. On a GPU that
    form is captured once as a CUDA graph and replayed; on the CPU, where there are no graphs, it runs as it is,
    which lets a test compare its math with the eager update's anywhere."""

    def __init__(self, cfg: Config, spec: EnvSpec, device: torch.device, static: bool | None = None):
        t = cfg.train
        self.cfg, self.device = cfg, device
        torch.manual_seed(cfg.run.seed)
        self.network = QNetwork.for_env(spec.obs_shape, spec.num_actions, cfg.network, device)
        self.target = copy.deepcopy(self.network).for_acting(channels_last=self.network.channels_last)
        # learner.cuda_graph: on a GPU the whole update is one captured CUDA graph (see _replay_graph()), whose Adam
        # keeps its step count and learning rate on the device (capturable). Fused Adam: one kernel for all
        # parameters, on the CPU too.
        self.static = cfg.learner.cuda_graph and device.type == "cuda" if static is None else static
        self.optimizer = torch.optim.Adam(self.network.parameters(), lr=self._lr_value(t.lr), eps=t.adam_eps,
                                          fused=True, capturable=self.static)
        self.replay = ReplayMemory(t.replay_capacity, cfg.num_envs, spec.frame_shape, spec.obs_dtype,
                                   spec.frame_stack, replay_device=device, n_step=t.n_step, gamma=t.gamma,
                                   prioritized=t.prioritized, alpha=t.priority_alpha, priority_eps=t.priority_eps,
                                   initial_priority=t.initial_priority)
        self.generator = torch.Generator(device).manual_seed(cfg.run.seed)
        self.updates = 0
        # eval.ema_updates: a moving average of the online network's parameters, which the evaluator plays.
        self.averaged = [p.detach().clone() for p in self.network.parameters()] if cfg.eval.ema_updates else None
        # learner.overlap: the helper thread prepares the next batch during an update (see step()); a captured
        # graph runs the whole update as one launch, with nothing to overlap.
        self._helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learner-batches") \
            if cfg.learner.overlap and not self.static else None
        self._prepared: concurrent.futures.Future | None = None
        self._generator_before_prepared: torch.Tensor | None = None   # its state before the prepared batch
        self._env_steps = 0   # of the update in progress: the beta and n-step schedules follow it
        # Sums since mean_loss_and_q() last read them, so that an update never waits on a host sync.
        self._loss_sum = torch.zeros((), device=device)
        self._q_sum = torch.zeros((), device=device)
        self._summed = 0
        # The captured update's inputs, written before each replay: the sampling offsets and beta.
        self._offsets = torch.zeros(t.batch_size, dtype=torch.float64, device=device)
        self._beta = torch.zeros((), dtype=torch.float64, device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, Update]] = {}   # by the n of the n-step returns
        self._capture_stream: torch.cuda.Stream | None = None   # see _capture()
        self._lr_set: float | None = t.lr   # the learning rate Adam holds on the device
        self.capture_error: str | None = None   # why the update could not be captured, where it could not

    def step(self, env_steps: int) -> Update:
        """One update (Double DQN's, or with train.double false Nature DQN's, or with train.munchausen_alpha
        Munchausen DQN's) on an n-step batch, drawn uniformly or by priority (then weighted by importance and
        re-prioritized by its TD errors, or with network.quantiles by each sample's quantile loss), `env_steps` into
        the run: as a replay of the captured CUDA graph of the whole update (learner.cuda_graph, on a GPU), or
        eagerly."""
        t = self.cfg.train
        self._env_steps = env_steps
        lr = dqn.linear_schedule(env_steps, t.lr, t.lr_end, t.lr_decay_start_env_steps,
                                 t.lr_decay_end_env_steps or t.total_env_steps)
        update = self._replay_graph(lr) if self.static else self._eager_step(lr)
        self.updates += 1
        self._summed += 1
        if self.updates % t.target_update_updates == 0:
            self.target.load_state_dict(self.network.state_dict())   # in place: a captured graph reads these
        return update

    def _eager_step(self, lr: float) -> Update:
        """The update as separate operations. With learner.overlap the helper thread computes the online network's
        values of s' (Double DQN's), or the target network's of s (Munchausen's), while this thread computes the
        online network's of s, then samples the next batch, converts its frames and evaluates the target network on
        its s' while this one runs the backward pass and the optimizer. Each side runs whole operations on its own
        cores, which on a small CPU wastes less than splitting every operation over all of them. The helper is idle
        again when it returns, so replay inserts, checkpoints and target refreshes never run beside it."""
        t = self.cfg.train
        prepared = self._take_prepared()
        batch, inputs, next_inputs, next_target = prepared or self._prepare_batch()
        beside = self._helper.submit(self._values_beside, inputs, next_inputs) \
            if self._helper is not None and (t.double or t.munchausen_alpha) else None   # Nature DQN's: nothing
        q = self._taken(inputs, batch.actions)
        online, now_target = beside.result() if beside is not None else self._values_beside(inputs, next_inputs)
        targets, loss = self._loss(batch, q, online, next_target, now_target, drawn_before_chunks=bool(prepared))
        # Not across a target refresh: the prepared batch's targets would come from the old target network.
        if self._helper is not None and (self.updates + 1) % t.target_update_updates != 0:
            self._generator_before_prepared = self.generator.get_state()
            self._prepared = self._helper.submit(self._prepare_batch)
        for group in self.optimizer.param_groups:   # a float: the fused step reads it, no recompilation
            group["lr"] = lr
        self._apply(loss, q)
        if self._prepared is not None:
            concurrent.futures.wait([self._prepared])
        return self._result(q, targets, loss)

    def _taken(self, inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The online network's Q(s, a) of the batch's actions `[B]`, or with network.quantiles its quantiles
        `[B, N]`."""
        if not self.network.quantiles:
            return self.network(inputs).gather(1, actions[:, None]).squeeze(1)
        return dqn.quantiles_of(self.network.quantile_values(inputs), actions)

    def _target_values(self, inputs: torch.Tensor) -> torch.Tensor:
        """The target network's values of a batch of states (s', and s for Munchausen's bonus): Q-values
        `[B, actions]`, or with network.quantiles their quantiles `[B, actions, N]`."""
        return self.target.quantile_values(inputs) if self.target.quantiles else self.target(inputs)

    def _values_beside(self, inputs: torch.Tensor, next_inputs: torch.Tensor
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """What the target takes besides the target network's values of s': the online network's Q-values of s'
        (Double DQN's choice, else None) and the target network's values of s (Munchausen's bonus, else None)."""
        t = self.cfg.train
        with torch.no_grad():
            return (self._online_values(next_inputs) if t.double else None,
                    self._target_values(inputs) if t.munchausen_alpha else None)

    def _loss(self, batch, q: torch.Tensor, next_online: torch.Tensor | None, next_target: torch.Tensor,
              now_target: torch.Tensor | None, drawn_before_chunks: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The TD targets and the loss of Q(s, a) `q` (with network.quantiles, of its quantiles against the
        target's), from the online network's values of s' `next_online` (Double DQN's), the target network's of s'
        `next_target` and of s `now_target` (Munchausen's); the batch's new priorities go into the replay (before
        the next batch is drawn): its absolute TD errors, or each sample's quantile loss."""
        t = self.cfg.train
        weights = batch.weights if t.prioritized else None
        with torch.no_grad():
            if t.munchausen_alpha:
                targets = dqn.munchausen_target(batch.returns, batch.discounts, batch.actions, now_target,
                                                next_target, t.munchausen_tau, t.munchausen_alpha, t.munchausen_clip)
            elif self.network.quantiles:
                targets = dqn.quantile_target(batch.returns, batch.discounts, next_target,
                                              next_online if t.double else None)
            elif t.double:
                targets = dqn.double_dqn_target(batch.returns, batch.discounts, next_online, next_target)
            else:
                targets = dqn.dqn_target(batch.returns, batch.discounts, next_target)
        if self.network.quantiles:
            loss, errors = dqn.quantile_huber_loss(q, targets, weights)
        else:
            loss, errors = dqn.td_loss(q, targets, weights), q.detach() - targets
        # A batch prepared during the last update was drawn before the chunks that have entered since, which may
        # have overwritten what it drew: update_priorities() checks each entry against its step (batch.tick).
        self.replay.update_priorities(batch.index, errors, batch.tick if drawn_before_chunks else None)
        return targets, loss

    def _result(self, q: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor) -> Update:
        """What the update reports: with network.quantiles the quantiles' means, Q(s, a) and its target."""
        if self.network.quantiles:
            q, targets = q.mean(dim=1), targets.mean(dim=1)
        return Update(q.detach(), targets, loss.detach())

    def _apply(self, loss: torch.Tensor, q: torch.Tensor) -> None:
        """The gradient step on `loss`, the weights' moving average and the sums that mean_loss_and_q() reads, all
        in place (a captured graph replays them on the same tensors)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.network.parameters(), self.cfg.train.max_grad_norm)
        self.optimizer.step()
        if self.averaged is not None:   # one fused pass over all parameters, recording no autograd history
            with torch.no_grad():
                torch._foreach_lerp_(self.averaged, list(self.network.parameters()), 1.0 / self.cfg.eval.ema_updates)
        self._loss_sum.add_(loss.detach())
        self._q_sum.add_(q.detach().mean())

    # -------------------------------------------------------------------------------- the captured update

    def _replay_graph(self, lr: float) -> Update:
        """The whole update (sampling, both networks, the loss, new priorities, backward, clipping, Adam, the moving
        average) as one CUDA graph launch: its kernels would each cost more to launch from Python than to run at
        the batch sizes DQN uses. Only its inputs are written first: the sampling offsets from the trainer's
        generator (the stream of random numbers the eager update draws), beta, and the learning rate when it
        changes. The graph is captured at the first update and again after load_state() (once per n of the n-step
        returns while train.n_step_end shortens them)."""
        n_step = self._graph_inputs(lr)
        if self.device.type != "cuda":
            return self._graph_body(n_step)   # nothing to capture: the same operations, run as they come
        if n_step not in self._graphs:
            try:
                self._graphs[n_step] = self._capture(n_step)
            except RuntimeError as e:   # an operation CUDA graphs cannot hold: train on, eagerly
                # Where the capture's end failed after an operation in it had (the usual way), the first error
                # says which.
                self._fall_back(_described(e.__context__ if isinstance(e.__context__, Exception) else e))
            if not self.static:   # outside the handler, whose traceback would hold the failed capture's tensors
                return self._eager_step(lr)
        graph, update = self._graphs[n_step]
        graph.replay()
        return update

    def _fall_back(self, why: str) -> None:
        """Updates run eagerly from now on (`capture_error` says why), Adam reading a float learning rate again."""
        self.capture_error = why
        self.static, self._graphs = False, {}
        for group in self.optimizer.param_groups:
            group["lr"], group["capturable"] = float(group["lr"]), False
        self.optimizer.zero_grad(set_to_none=True)

    def _graph_inputs(self, lr: float) -> int:
        """Writes what the graph reads (the offsets, beta, the learning rate) for the update in progress; returns
        the n of its n-step returns."""
        t = self.cfg.train
        torch.rand(t.batch_size, generator=self.generator, dtype=torch.float64, device=self.device,
                   out=self._offsets)
        self._beta.fill_(dqn.beta_schedule(self._env_steps, t.priority_beta, t.learning_starts,
                                           t.priority_beta_env_steps or t.total_env_steps))
        if self._lr_set != lr:
            for group in self.optimizer.param_groups:
                if isinstance(group["lr"], torch.Tensor):
                    group["lr"].fill_(lr)
                else:
                    group["lr"] = lr
            self._lr_set = lr
        return self._n_step()

    def _graph_body(self, n_step: int) -> Update:
        """What the graph holds: one update whose sampling reads self._offsets and self._beta and whose Adam reads
        its learning rate from the device. The same operations as the eager update without learner.overlap."""
        batch = self.replay.sample_at(self._offsets, self._beta, n_step)
        with torch.no_grad():
            next_inputs = self.target.inputs(batch.next_obs)
            next_target = self._target_values(next_inputs)
            inputs = self.network.inputs(batch.obs)
            online, now_target = self._values_beside(inputs, next_inputs)
        q = self._taken(inputs, batch.actions)
        targets, loss = self._loss(batch, q, online, next_target, now_target)
        self._apply(loss, q)
        return self._result(q, targets, loss)

    def _capture(self, n_step: int) -> tuple[torch.cuda.CUDAGraph, Update]:
        """Captures _graph_body() after warming it up (_warm_up()), on a stream of the trainer's own: of high
        priority, a pool of streams that nothing else here draws from, while TensorPipe sends and receives CUDA
        tensors on streams it draws from the pool of normal priority, in turn, on threads of its own; work it put on
        a stream being captured would be captured with the update. (A torch that instantiates graphs with their
        nodes' priorities then also runs each replay's kernels ahead of other work waiting on the GPU: the update
        is the learner's critical path.) After a capture that fails, the thread is on its own stream again and the
        caching allocator out of the capture (_end_allocation_to())."""
        self._warm_up(n_step)
        if self._capture_stream is None:
            self._capture_stream = torch.cuda.Stream(self.device, priority=-1)
        graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
        self.optimizer.zero_grad(set_to_none=True)
        # torch.cuda.graph leaves its stream current where the capture's end raises: the outer context puts the
        # thread's own stream back.
        with torch.cuda.stream(torch.cuda.current_stream(self.device)):
            try:
                with torch.cuda.graph(graph, pool=pool, stream=self._capture_stream,
                                      capture_error_mode="thread_local"):
                    update = self._graph_body(n_step)
            except RuntimeError:
                _end_allocation_to(pool, self.device)
                _FAILED_GRAPHS.append(graph)
                raise
        return graph, update

    def _warm_up(self, n_step: int) -> None:
        """Runs _graph_body() three times, on a side stream on a GPU (as torch.cuda.graphs' whole-network capture
        asks: https://pytorch.org/docs/stable/notes/cuda.html#whole-network-capture), changing nothing that stays:
        every tensor the update writes is put back as it was, also when an update fails, and Adam's state, if it
        has none yet, is made by a step on zero gradients, which leaves the parameters as they are.

        The copies are made and put back with autograd off. A parameter's copy made with it on would keep that
        parameter's gradient accumulator alive, bound to the stream it was made on, and the warm-up and the capture
        on another stream would then accumulate gradients across streams (which a capture cannot hold); putting
        the parameters back in place with it on is refused outright."""
        if not self.optimizer.state:
            for p in self.network.parameters():
                p.grad = torch.zeros_like(p)
            self.optimizer.step()
            for state in self.optimizer.state.values():
                state["step"].zero_()
        with torch.no_grad():
            kept = [tensor.clone() for tensor in self._written_by_update()]
        side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                for _ in range(3):
                    self._graph_body(n_step)
        finally:
            if side is not None:
                torch.cuda.current_stream(self.device).wait_stream(side)
            with torch.no_grad():
                for tensor, value in zip(self._written_by_update(), kept):
                    tensor.copy_(value)

    def _written_by_update(self) -> list[torch.Tensor]:
        """Every tensor an update writes that outlives it."""
        tree = self.replay.tree
        written = [*self.network.parameters(), *self.network.buffers(), *(self.averaged or []),
                   self._loss_sum, self._q_sum, self.replay.max_priority, *tree.levels]
        for state in self.optimizer.state.values():
            written += [value for value in state.values() if isinstance(value, torch.Tensor)]
        return written

    def _lr_value(self, lr: float) -> float | torch.Tensor:
        """The learning rate as Adam holds it: on the device for a captured graph, else a float."""
        return torch.tensor(lr, dtype=torch.float32, device=self.device) if self.static else lr

    def _n_step(self) -> int:
        t = self.cfg.train
        return round(dqn.linear_schedule(self._env_steps, t.n_step, t.n_step_end, t.n_step_decay_start_env_steps,
                                         t.n_step_decay_end_env_steps or t.total_env_steps))

    @property
    def lr(self) -> float:
        """The learning rate of the newest update (before the first, train.lr or a resumed optimizer's)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def _prepare_batch(self) -> tuple:
        """A batch, its observations converted for the online network (QNetwork.inputs()), its next observations
        converted once for both networks, and the target network's values of them: under learner.overlap all of it
        is done here, off the training thread's path."""
        t = self.cfg.train
        beta = dqn.beta_schedule(self._env_steps, t.priority_beta, t.learning_starts,
                                 t.priority_beta_env_steps or t.total_env_steps)
        batch = self.replay.sample(t.batch_size, self.generator, beta, self._n_step())
        with torch.no_grad():
            next_inputs = self.target.inputs(batch.next_obs)        # converted once for both networks
            return batch, self.network.inputs(batch.obs), next_inputs, self._target_values(next_inputs)

    def _online_values(self, next_inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.network(next_inputs)

    def _take_prepared(self) -> tuple | None:
        prepared, self._prepared, self._generator_before_prepared = self._prepared, None, None
        return prepared.result() if prepared is not None else None

    def mean_loss_and_q(self) -> tuple[float, float] | None:
        """The mean loss and Q(s, a) of the updates since the last call (None: there were none). A host sync."""
        if not self._summed:
            return None
        means = ((self._loss_sum / self._summed).item(), (self._q_sum / self._summed).item())
        self._loss_sum.zero_()
        self._q_sum.zero_()
        self._summed = 0
        return means

    def finite(self) -> bool:
        """Whether every parameter of the online network (and of its moving average) is finite: False once training
        has diverged, since a NaN or an infinity in a loss or a gradient reaches every weight the step moves. A host
        sync."""
        tensors = [*self.network.parameters(), *(self.averaged or [])]
        with torch.no_grad():
            return bool(torch.stack([tensor.isfinite().all() for tensor in tensors]).all())

    def weights(self, version: int) -> Weights:
        """A snapshot of the online network on the trainer's device, detached from the copy that keeps training
        (the transport sends it as it is, or a CPU copy to a collector it cannot reach GPU to GPU)."""
        return Weights(version, {k: v.detach().clone() for k, v in self.network.state_dict().items()})

    def evaluated_weights(self) -> dict[str, torch.Tensor]:
        """What the evaluator plays, as a CPU state dict of the online network: its weights, or their moving
        average with eval.ema_updates."""
        state = self.network.state_dict()
        if self.averaged is not None:
            state |= dict(zip((name for name, _ in self.network.named_parameters()), self.averaged))
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def state(self) -> dict:
        """Networks, optimizer, the sampling generator and the weights' moving average if any (with `updates`, all a
        resumed trainer needs): it draws the batch that this one has prepared but not trained on yet."""
        optimizer = self.optimizer.state_dict()
        for group in optimizer["param_groups"]:   # as an eager trainer holds them, so either kind can resume it
            group["lr"], group["capturable"] = float(group["lr"]), False
        return {"network": self.network.state_dict(), "target": self.target.state_dict(),
                "optimizer": optimizer,
                "generator": self._generator_before_prepared if self._prepared is not None
                else self.generator.get_state(),
                "averaged": self.averaged}

    def load_state(self, state: dict, updates: int) -> bool:
        """Continues from state() after `updates` updates. Returns False when its generator was another kind of
        device's (a CPU generator's state and a CUDA one's differ in size): sampling then goes on from a seed of the
        run and its updates instead of the saved stream."""
        self.network.load_state_dict(state["network"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:
            group["lr"], group["capturable"] = self._lr_value(float(group["lr"])), self.static
        self._graphs, self._lr_set = {}, None   # Adam's state tensors are new: capture again
        if self.averaged is not None:   # a run that had none (or an older checkpoint) starts one from the weights
            for average, saved in zip(self.averaged, state.get("averaged") or self.network.parameters()):
                average.copy_(saved.detach())
        self.updates = updates
        self._take_prepared()
        if state["generator"].numel() == self.generator.get_state().numel():
            self.generator.set_state(state["generator"])
            return True
        self.generator.manual_seed(self.cfg.run.seed * 1_000_003 + self.updates)
        return False

    def close(self) -> None:
        if self._helper is not None:
            self._helper.shutdown()
