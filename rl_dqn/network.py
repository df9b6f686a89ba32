"""The Q-network. It knows nothing of envs or transports: observations in, one value per action out."""

from __future__ import annotations

import torch
from torch import nn


class QNetwork(nn.Module):
    """Nature DQN's CNN for stacked 84x84 frames (Mnih et al. 2015), or an MLP for vector observations.

    Observations are `[B, stack, *frame_shape]` in their stored dtype; uint8 frames are scaled to [0, 1] here so
    that collectors and the replay memory keep bytes.
    """

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, mlp_hidden: tuple[int, ...] = (256, 256)):
        super().__init__()
        self.is_image = len(obs_shape) == 3
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
            self.head = nn.Sequential(nn.Linear(features, 512), nn.ReLU(), nn.Linear(512, num_actions))
        else:
            layers, width = [nn.Flatten()], int(torch.Size(obs_shape).numel())
            for hidden in mlp_hidden:
                layers += [nn.Linear(width, hidden), nn.ReLU()]
                width = hidden
            self.torso = nn.Sequential(*layers)
            self.head = nn.Linear(width, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        if self.is_image:
            x = x / 255.0
        return self.head(self.torso(x))
