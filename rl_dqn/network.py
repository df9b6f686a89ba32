"""The Q-network. It knows nothing of envs or transports: observations in, one value per action out."""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}

# The convolutional torsos for stacked 84x84 frames: (out channels, kernel, stride) per layer, then the width of the
# fully connected hidden layer. `nips` has about a third of `nature`'s multiply-adds per sample (its speed on a CPU:
# docs/benchmarks.md).
TORSOS = {
    # Mnih et al. 2015, "Human-level control through deep reinforcement learning" (Nature).
    "nature": (((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512),
    # Mnih et al. 2013, "Playing Atari with Deep Reinforcement Learning" (https://arxiv.org/abs/1312.5602).
    "nips": (((16, 8, 4), (32, 4, 2)), 256),
}


def fast_bfloat16(device: torch.device | str) -> tuple[bool, str]:
    """Whether `device` computes bfloat16 convolutions and matrix products fast, and why, as PyTorch sees it: CUDA
    GPUs of compute capability 8.0 or newer; CPUs with AVX512-BF16 or AMX that PyTorch may use (ATEN_CPU_CAPABILITY
    and ONEDNN_MAX_CPU_ISA narrow what it may). Elsewhere bfloat16 is emulated, and slower than float32
    (https://pytorch.org/docs/stable/amp.html#cpu-op-specific-behavior; docs/benchmarks.md)."""
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return major >= 8, f"compute capability {major}.{minor}"
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if isa and isa != "ALL" and "BF16" not in isa and "AMX" not in isa and not isa.startswith("AVX10"):
        return False, f"ONEDNN_MAX_CPU_ISA={isa}"
    capability = torch.backends.cpu.get_cpu_capability()
    if "AVX512" not in capability:
        return False, f"PyTorch uses {capability} on this CPU"
    if torch.cpu._is_amx_tile_supported():
        return True, "this CPU has AMX"
    if torch.cpu._is_avx512_bf16_supported():
        return True, "this CPU has AVX512-BF16"
    return False, "this CPU has neither AVX512-BF16 nor AMX"


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """`fp32` or `bf16`: network.precision as given, or for `auto` bfloat16 where `device` computes it fast."""
    if precision != "auto":
        return precision
    return "bf16" if fast_bfloat16(device)[0] else "fp32"


def describe_precision(precision: str, device: torch.device | str) -> tuple[str, str | None]:
    """What network.precision comes to on `device`, in words for a role's first line, and a warning where an
    explicit bf16 will be emulated there."""
    fast, why = fast_bfloat16(device)
    chosen = resolve_precision(precision, device)
    if precision == "auto":
        return f"{chosen} (network.precision=auto: {why})", None
    if chosen == "bf16" and not fast:
        return chosen, (f"network.precision=bf16 on a device without fast bfloat16 ({why}): it is emulated, several "
                        f"times slower than fp32; set network.precision=auto or fp32")
    return chosen, None


def background(frames: torch.Tensor) -> torch.Tensor:
    """The most common pixel value of the newest frame of each uint8 observation `[..., stack, height, width]`, shaped
    `[..., 1, 1, 1]` (the lowest value where two are as common), on a grid of every 4th pixel each way (441 of an
    84x84 frame's 7,056): the flat background that covers most of an Atari screen, whatever its colour. One
    histogram of 256 bins per observation, counted for the whole batch at once, over the grid rather than every
    pixel to keep it cheap. Counted by scatter_add_ into a histogram of fixed size, with no host sync (bincount reads
    its input's largest value back to the host on a GPU), so that a CUDA graph can hold it."""
    grid = frames[..., -1, ::4, ::4]
    newest = grid.reshape(-1, grid.shape[-2] * grid.shape[-1]).long()
    counts = torch.zeros(newest.shape[0], 256, dtype=torch.int32, device=frames.device)
    counts.scatter_add_(1, newest, torch.ones_like(newest, dtype=torch.int32))
    return counts.argmax(dim=1).to(torch.uint8).view(frames.shape[:-3] + (1, 1, 1))


def channels_last_copy(frames: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`frames` `[B, C, H, W]` converted to `dtype` in the channels-last layout, one strided copy per channel (C is
    the frame stack, 4 for Atari), which on a CPU is faster than converting in one copy into that layout
    (docs/tried.md, Speed)."""
    batch, channels, height, width = frames.shape
    out = torch.empty(batch, height, width, channels, dtype=dtype, device=frames.device)
    for c in range(channels):
        out[..., c].copy_(frames[:, c])
    return out.permute(0, 3, 1, 2)


class QNetwork(nn.Module):
    """A CNN for stacked 84x84 frames (`torso`: one of TORSOS), or an MLP for vector observations, with a plain or
    a dueling head (Wang et al. 2016, https://arxiv.org/abs/1511.06581). With `quantiles` N >= 2 the head gives N
    quantiles of each action's return, as QR-DQN's (Dabney et al. 2017, https://arxiv.org/abs/1710.10044):
    quantile_values() returns them and forward() their mean, the action's Q-value, so that whoever acts on the
    network needs no other path.

    Observations are `[B, stack, *frame_shape]` in their stored dtype; uint8 frames are taken as scaled to [0, 1],
    less `frame_offset` (network.frame_offset: `none`, `half` or `background`; see `inputs()` and `_features()`), so
    that collectors and the replay memory keep bytes.

    With `precision="bf16"` the torso and the hidden layers of the head run under autocast in bfloat16 while the
    parameters stay float32; the output layers always run in float32, because bfloat16 keeps about 3 significant
    digits of Q and the gaps between the actions' values are often smaller than that.
    """

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, mlp_hidden: tuple[int, ...] = (256, 256),
                 dueling: bool = False, precision: str = "fp32", torso: str = "nature",
                 frame_offset: str = "none", norm: str = "none", quantiles: int = 0):
        super().__init__()
        self.is_image = len(obs_shape) == 3
        if frame_offset not in ("none", "half", "background"):
            raise ValueError(f"frame_offset must be none, half or background, got {frame_offset!r}")
        if norm not in ("none", "layer"):
            raise ValueError(f"norm must be none or layer, got {norm!r}")
        if quantiles < 0 or quantiles == 1:
            raise ValueError(f"quantiles must be 0 (Q-values) or at least 2, got {quantiles}")

        def dense(inputs: int, outputs: int) -> list[nn.Module]:
            """A hidden fully connected layer: with `norm="layer"` its outputs are normalized (LayerNorm, with its
            own gain and bias) before the ReLU."""
            return [nn.Linear(inputs, outputs), *((nn.LayerNorm(outputs),) if norm == "layer" else ()), nn.ReLU()]
        self.frame_offset = frame_offset
        self.dueling = dueling
        self.quantiles, self.num_actions = quantiles, num_actions
        self.compute_dtype = PRECISIONS[precision]
        if self.is_image:
            stack, height, frame_width = obs_shape
            convolutions, width = TORSOS[torso]
            layers, channels = [], stack
            for out, kernel, stride in convolutions:
                layers += [nn.Conv2d(channels, out, kernel_size=kernel, stride=stride), nn.ReLU()]
                channels = out
            self.torso = nn.Sequential(*layers, nn.Flatten())
            with torch.no_grad():
                features = self.torso(torch.zeros(1, stack, height, frame_width)).shape[1]

            def hidden() -> nn.Module:
                return nn.Sequential(*dense(features, width))
        else:
            layers, width = [nn.Flatten()], int(torch.Size(obs_shape).numel())
            for size in mlp_hidden:
                layers += dense(width, size)
                width = size
            self.torso = nn.Sequential(*layers)

            def hidden() -> nn.Module:
                return nn.Identity()
        # Q (or the advantage, when dueling) and, when dueling, the state value: each its own hidden layer; with
        # quantiles, N outputs for each.
        outputs = max(quantiles, 1)
        self.head_hidden, self.head = hidden(), nn.Linear(width, num_actions * outputs)
        if dueling:
            self.value_hidden, self.value = hidden(), nn.Linear(width, outputs)
        self.channels_last = False
        self.set_layout(channels_last=self.is_image)

    def set_layout(self, channels_last: bool) -> QNetwork:
        """Frames and convolution kernels channels-last in memory (for training, on every device, and for acting in
        bfloat16; see for_acting()), or in the plain layout. The values are the same up to the order of sums (oneDNN
        may sum in another order in each layout). Training is faster channels-last, in float32 and in bfloat16, on
        the CPUs measured (docs/tried.md, Speed; `python benchmarks/network.py` times both layouts). A GPU's tensor
        cores take channels-last too."""
        self.channels_last = channels_last and self.is_image
        self.torso.to(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
        return self

    @classmethod
    def for_env(cls, obs_shape: tuple[int, ...], num_actions: int, network_cfg, device: torch.device | str
                ) -> QNetwork:
        """The network that `network_cfg` (a config's `network` section) describes, on `device`, computing in the
        precision network.precision gives there, channels-last as constructed (the layout it trains fastest in, see
        set_layout(); moving it to `device` keeps the layout)."""
        precision = resolve_precision(network_cfg.precision, device)
        return cls(obs_shape, num_actions, network_cfg.mlp_hidden, network_cfg.dueling, precision,
                   network_cfg.torso, network_cfg.frame_offset, network_cfg.norm, network_cfg.quantiles).to(device)

    def for_acting(self, channels_last: bool | None = None) -> QNetwork:
        """This network in eval mode for forward passes only (collectors, evaluation, play, the learner's target
        network; never trained). Under bf16 the layers that compute in bfloat16 store their weights in it, so that a
        forward pass does not cast them again; load_state_dict() takes float32 weights as before and rounds them
        once. Its layout: `channels_last`, or by default channels-last in bfloat16 and plain in float32, whichever
        acted faster at a collector's and an evaluation round's batch sizes on the CPUs measured (`python
        benchmarks/network.py`). The learner's target network takes the inputs it converts once for itself and the
        online network, so it keeps the online network's layout."""
        if channels_last is None:
            channels_last = self.compute_dtype != torch.float32
        if self.compute_dtype != torch.float32:
            for layer in (self.torso, self.head_hidden, *((self.value_hidden,) if self.dueling else ())):
                layer.to(self.compute_dtype)
        return self.set_layout(channels_last=channels_last).eval()

    def inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """What the network's first layer takes, in the compute dtype and the network's layout: uint8 frames as
        pixel values (0-255, less each observation's background value with frame_offset `background`; integers,
        exact in either dtype), other observations as float32. The scaling to [0, 1] and a constant offset are
        folded into the first convolution (see _features()), so that a batch of frames costs one conversion where
        scaling it took three passes. forward() calls it; a caller that feeds one batch to two networks (the
        learner's s' to the online and the target network) calls it once and passes its result, which it returns
        unchanged."""
        if obs.dtype != torch.uint8:
            return obs if obs.dtype == self.compute_dtype else obs.float()
        if self.channels_last and obs.dim() == 4:
            pixels = channels_last_copy(obs, self.compute_dtype)
        else:
            pixels = obs.to(self.compute_dtype)
        if self.frame_offset == "background":
            pixels.sub_(background(obs).to(self.compute_dtype))
        return pixels

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        """The torso on inputs(). For frames its first convolution computes conv(W, (x - c) / 255) + b, the scaled
        frames' value, as conv(W / 255, x) + b - c * sum(W / 255) (no padding, so every output sums a whole
        kernel; c is 127.5 with frame_offset `half`, else 0): the same function up to rounding, and autograd
        differentiates it through W and b as before. Its weights take 4,096 multiplications (the NIPS torso)
        where scaling the frames took 903,168 per batch of 32."""
        if not self.is_image:
            return self.torso(x)
        first, *rest = self.torso
        weight = first.weight * (1.0 / 255.0)
        offset = 127.5 if self.frame_offset == "half" else 0.0
        bias = first.bias.float() - offset * weight.float().sum(dim=(1, 2, 3)) if offset else first.bias
        x = torch.nn.functional.conv2d(x, weight, bias, first.stride)
        for layer in rest:
            x = layer(x)
        return x

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values `[B, actions]`: with quantiles, the mean of each action's quantiles."""
        values = self._values(obs)
        return values.mean(dim=2) if self.quantiles else values

    def quantile_values(self, obs: torch.Tensor) -> torch.Tensor:
        """With quantiles N: each action's N quantiles of the return, `[B, actions, N]`, in the order of the
        quantile fractions (2i + 1) / 2N (dqn.quantile_fractions())."""
        if not self.quantiles:
            raise ValueError("quantile_values() of a network without quantiles (network.quantiles=0)")
        return self._values(obs)

    def _values(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values `[B, actions]`, or with quantiles the quantiles `[B, actions, N]` (a dueling head adds each
        quantile of the state value to the advantages' quantile less their mean over the actions)."""
        x = self.inputs(obs)
        mixed = self.compute_dtype != torch.float32
        # No cast cache: each weight is cast once per call anyway, and casts cached while a CUDA graph is captured
        # would be kept from memory the graph's replays reuse (torch.cuda.make_graphed_callables asks the same).
        # In float32 no autocast region is entered: the update then runs on any device, the meta one included.
        with torch.autocast(x.device.type, dtype=self.compute_dtype, cache_enabled=False) if mixed else \
                contextlib.nullcontext():
            features = self._features(x)
            h = self.head_hidden(features)
            v = self.value_hidden(features) if self.dueling else None
        q = self.head(h.float())
        if self.quantiles:
            q = q.view(q.shape[0], self.num_actions, self.quantiles)
        if not self.dueling:
            return q
        value = self.value(v.float())
        return (value[:, None] if self.quantiles else value) + q - q.mean(dim=1, keepdim=True)
