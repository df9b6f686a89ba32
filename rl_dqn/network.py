"""The Q-network. It knows nothing of envs or transports: observations in, one value per action out."""

from __future__ import annotations

import torch
from torch import nn

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


class QNetwork(nn.Module):
    """Nature DQN's CNN for stacked 84x84 frames (Mnih et al. 2015), or an MLP for vector observations, with a
    plain or a dueling head (Wang et al. 2016, https://arxiv.org/abs/1511.06581).

    Observations are `[B, stack, *frame_shape]` in their stored dtype; uint8 frames are scaled to [0, 1] here
    (`inputs()`) so that collectors and the replay memory keep bytes.

    With `precision="bf16"` the torso and the hidden layers of the head run under autocast in bfloat16 while the
    parameters stay float32; the output layers always run in float32, because bfloat16 keeps about 3 significant
    digits of Q and the gaps between the actions' values are often smaller than that.
    """

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, mlp_hidden: tuple[int, ...] = (256, 256),
                 dueling: bool = False, precision: str = "fp32"):
        super().__init__()
        self.is_image = len(obs_shape) == 3
        self.dueling = dueling
        self.compute_dtype = PRECISIONS[precision]
        if self.is_image:
            stack, height, width = obs_shape
            self.torso = nn.Sequential(
                nn.Conv2d(stack, 32, kernel_size=8, stride=4), nn.ReLU(),
                nn.Conv2d(32, 64, kernel_size=4, stride=2), nn.ReLU(),
                nn.Conv2d(64, 64, kernel_size=3, stride=1), nn.ReLU(),
                nn.Flatten(),
            )
            with torch.no_grad():
                features = self.torso(torch.zeros(1, stack, height, width)).shape[1]

            def hidden() -> nn.Module:
                return nn.Sequential(nn.Linear(features, 512), nn.ReLU())
            width = 512
        else:
            layers, width = [nn.Flatten()], int(torch.Size(obs_shape).numel())
            for size in mlp_hidden:
                layers += [nn.Linear(width, size), nn.ReLU()]
                width = size
            self.torso = nn.Sequential(*layers)

            def hidden() -> nn.Module:
                return nn.Identity()
        # Q (or the advantage, when dueling) and, when dueling, the state value: each its own hidden layer.
        self.head_hidden, self.head = hidden(), nn.Linear(width, num_actions)
        if dueling:
            self.value_hidden, self.value = hidden(), nn.Linear(width, 1)

    @classmethod
    def for_env(cls, obs_shape: tuple[int, ...], num_actions: int, network_cfg) -> QNetwork:
        """The network that `network_cfg` (a config's `network` section) describes."""
        return cls(obs_shape, num_actions, network_cfg.mlp_hidden, network_cfg.dueling, network_cfg.precision)

    def for_acting(self) -> QNetwork:
        """This network in eval mode for acting only (collectors, evaluation, play; never trained): under bf16 the
        layers that compute in bfloat16 store their weights in it, so that a forward pass does not cast them
        again (a batch of 8 Pong stacks on one thread: 1.7 ms against 2.3). load_state_dict() takes float32
        weights as before and rounds them once."""
        if self.compute_dtype != torch.float32:
            for layer in (self.torso, self.head_hidden, *((self.value_hidden,) if self.dueling else ())):
                layer.to(self.compute_dtype)
        return self.eval()

    def inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """What the first layer takes: uint8 frames scaled to [0, 1] in the compute dtype, in one pass over the
        batch (the division in float32, stored in bfloat16 under bf16), other observations as float32. forward()
        calls it; a caller that feeds one batch to two networks (the learner's s' to the online and the target
        network) calls it once and passes its result, which it returns unchanged."""
        if obs.dtype == torch.uint8:
            return torch.div(obs, 255.0, out=torch.empty(obs.shape, dtype=self.compute_dtype, device=obs.device))
        return obs if obs.dtype == self.compute_dtype else obs.float()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.inputs(obs)
        mixed = self.compute_dtype != torch.float32
        with torch.autocast(x.device.type, dtype=self.compute_dtype, enabled=mixed):
            features = self.torso(x)
            h = self.head_hidden(features)
            v = self.value_hidden(features) if self.dueling else None
        q = self.head(h.float())
        if not self.dueling:
            return q
        return self.value(v.float()) + q - q.mean(dim=1, keepdim=True)
