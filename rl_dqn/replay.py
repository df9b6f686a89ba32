"""Replay memory that stores each frame once and rebuilds observation stacks when it samples.

The memory is split into one lane per env of the run; a lane holds that env's steps in order, in a ring. Entry
`k` of a lane is what a `Chunk` carries for one step: the newest frame of the observation acted on, the action,
the training reward, the terminal flag, and whether the observation starts an episode. The observation at `k` is
the stack of frames `k - S + 1 .. k`, with zeros in place of frames from before its episode's first step (the
same padding the env uses); the next observation is the stack at `k + 1`. Entry `k` is a transition only when
`k + 1` is stored and does not start an episode (the step between an episode's last observation and the next
episode's first is the env's reset). So a truncated episode's last transition bootstraps from its real final
observation, and a terminal one is masked by its flag.

Memory per transition is one frame plus 14 bytes: 7,070 bytes for Atari, so 1M transitions take 7.1 GB.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rl_dqn.types import Chunk


class Batch(NamedTuple):
    obs: torch.Tensor          # [B, S, *frame_shape]
    actions: torch.Tensor      # [B] int64
    rewards: torch.Tensor      # [B] float32
    next_obs: torch.Tensor     # [B, S, *frame_shape]
    terminated: torch.Tensor   # [B] bool: no bootstrap from next_obs

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device, non_blocking=True) for t in self))


class ReplayMemory:
    """extend(lanes, chunk), sample(batch_size) -> Batch, len()."""

    def __init__(self, capacity: int, num_lanes: int, frame_shape: tuple[int, ...], frame_dtype: torch.dtype,
                 frame_stack: int, replay_device: torch.device | str = "cpu"):
        self.lane_capacity = capacity // num_lanes
        if self.lane_capacity < frame_stack + 1:
            raise ValueError(f"capacity {capacity} leaves {self.lane_capacity} steps per lane for {num_lanes} lanes; "
                             f"need at least {frame_stack + 1}")
        self.num_lanes = num_lanes
        self.frame_stack = frame_stack
        self.device = torch.device(replay_device)
        shape = (num_lanes, self.lane_capacity)
        self.frames = torch.zeros(*shape, *frame_shape, dtype=frame_dtype, device=self.device)
        self.actions = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self.rewards = torch.zeros(shape, dtype=torch.float32, device=self.device)
        self.terminated = torch.zeros(shape, dtype=torch.bool, device=self.device)
        self.first = torch.zeros(shape, dtype=torch.bool, device=self.device)
        # Steps ever written to each lane; entry k of a lane sits at position k % lane_capacity.
        self.written = torch.zeros(num_lanes, dtype=torch.int64, device=self.device)
        self._stack_offsets = torch.arange(-frame_stack + 1, 2, device=self.device)  # k-S+1 .. k+1

    def extend(self, first_lane: int, chunk: Chunk) -> None:
        """Appends a chunk's T steps to lanes first_lane .. first_lane + E - 1, in one copy per field."""
        steps, envs = chunk.actions.shape
        lanes = torch.arange(first_lane, first_lane + envs, device=self.device)
        ticks = self.written[lanes, None] + torch.arange(steps, device=self.device)   # [E, T]
        positions = (lanes[:, None], ticks % self.lane_capacity)
        for store, values in ((self.frames, chunk.frames), (self.actions, chunk.actions),
                              (self.rewards, chunk.rewards), (self.terminated, chunk.terminated),
                              (self.first, chunk.first)):
            store[positions] = values.to(self.device, non_blocking=True).transpose(0, 1)
        self.written[lanes] += steps

    def _sample_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per lane, the lowest entry whose stack is still stored and the count of entries that have a successor."""
        oldest = (self.written - self.lane_capacity).clamp(min=0)
        # Once a lane has wrapped, frames before `oldest` are gone: start S-1 later so every stack is whole.
        low = torch.where(self.written > self.lane_capacity, oldest + self.frame_stack - 1, oldest)
        count = (self.written - 1 - low).clamp(min=0)
        return low, count

    def __len__(self) -> int:
        """Entries that can be sampled (a few of them are resets and are skipped when drawn)."""
        return int(self._sample_range()[1].sum())

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Batch:
        """Draws `batch_size` transitions uniformly from everything stored, as whole-batch tensor ops."""
        low, count = self._sample_range()
        total = int(count.sum())
        if total < batch_size:
            raise ValueError(f"replay holds {total} transitions, fewer than a batch of {batch_size}")
        cumulative = count.cumsum(0)
        lanes, ticks = [], []
        needed = batch_size
        while needed > 0:
            # Draw a few extra so that one round almost always covers the resets it has to drop.
            u = torch.randint(total, (needed + needed // 8 + 4,), generator=generator).to(self.device)
            lane = torch.searchsorted(cumulative, u, right=True)
            tick = low[lane] + u - (cumulative[lane] - count[lane])
            valid = ~self.first[lane, (tick + 1) % self.lane_capacity]
            lanes.append(lane[valid][:needed])
            ticks.append(tick[valid][:needed])
            needed -= len(lanes[-1])
        return self._gather(torch.cat(lanes), torch.cat(ticks))

    def _gather(self, lane: torch.Tensor, tick: torch.Tensor) -> Batch:
        """Builds the stacks at `tick` and `tick + 1` from the S + 1 frames they share."""
        S = self.frame_stack
        window = tick[:, None] + self._stack_offsets                       # [B, S+1]: k-S+1 .. k+1
        positions = window % self.lane_capacity
        rows = lane[:, None]
        frames = self.frames[rows, positions]                              # [B, S+1, *frame]
        # The frame at tick t belongs to an earlier episode when an episode starts in (t, k]; the same holds for
        # both stacks, since k+1 never starts one (such entries were not drawn). A reverse cumulative OR:
        starts = self.first[rows, positions[:, 1:S]]                       # [B, S-1]: ticks k-S+2 .. k
        earlier = starts.flip(1).cummax(1).values.flip(1)                  # [B, S-1]: ticks k-S+1 .. k-1
        keep = torch.ones(len(tick), S + 1, dtype=torch.bool, device=self.device)   # ticks k-S+1 .. k+1
        keep[:, :S - 1] = ~earlier
        frames = frames * keep.view(*keep.shape, *([1] * (frames.dim() - 2)))
        obs, next_obs = frames[:, :S], frames[:, 1:]
        k = tick % self.lane_capacity
        return Batch(obs, self.actions[lane, k], self.rewards[lane, k], next_obs, self.terminated[lane, k])
