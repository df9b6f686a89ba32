"""Replay memory that stores each frame once, rebuilds observation stacks and n-step returns when it samples, and
draws transitions uniformly or in proportion to their priority.

The memory is split into one lane per env of the run; a lane holds that env's steps in order, in a ring. Entry
`k` of a lane is what a `Chunk` carries for one step: the newest frame of the observation acted on, the action,
the training reward, the terminal flag, and whether the observation starts an episode. The observation at `k` is
the stack of frames `k - S + 1 .. k`, with zeros in place of frames from before its episode's first step (the
same padding the env uses). Entry `k` is a transition only when `k + 1` does not start an episode (the step
between an episode's last observation and the next episode's first is the env's reset).

The n-step transition at `k` sums the rewards of steps `k .. k + m - 1` discounted by gamma per step and
bootstraps from the observation at `k + m` with gamma^m, where `m` is `n` or less when the episode ends first: a
terminal step ends the sum with no bootstrap; a truncation (time limit) bootstraps from the episode's real final
observation. It can be drawn once entry `k + n` is stored.

Drawing goes through a sum tree over every entry (`rl_dqn.sumtree`): an entry that cannot be drawn (a reset, one
whose n steps are not all stored yet, or one whose stack lost a frame to the ring) has priority 0. Uniform replay
gives every other entry priority 1; prioritized replay (Schaul et al. 2016, https://arxiv.org/abs/1511.05952)
gives it (|TD error| + eps)^alpha, at first either the largest priority seen so far or the TD error the
collector computed from its own Q-values (Ape-X), and after each update the error of the learner's batch.

Memory per transition is one frame plus 26 bytes (8 more with collector priorities): 7,082 bytes for Atari.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rl_dqn.sumtree import SumTree
from rl_dqn.types import Chunk


# Stores laid out [lane, position in the lane's ring, ...]: saved up to the furthest position written.
_PER_LANE = ("frames", "actions", "rewards", "terminated", "first", "q_taken", "q_max")


class Batch(NamedTuple):
    obs: torch.Tensor          # [B, S, *frame_shape]
    actions: torch.Tensor      # [B] int64
    returns: torch.Tensor      # [B] float32: discounted sum of the m rewards up to the bootstrap
    next_obs: torch.Tensor     # [B, S, *frame_shape]: the observation m steps later
    discounts: torch.Tensor    # [B] float32: gamma^m, or 0 when the episode terminated within the m steps
    index: torch.Tensor        # [B] int64: where each transition sits (for update_priorities)
    tick: torch.Tensor         # [B] int64: each transition's step in its lane, counted from the lane's first write
    weights: torch.Tensor      # [B] float32: importance-sampling weights (ones for uniform replay)


def bytes_needed(capacity: int, frame_shape: tuple[int, ...], frame_dtype: torch.dtype,
                 collector_priorities: bool = False) -> int:
    """Memory a ReplayMemory of `capacity` transitions allocates: per entry one frame, the action (8 bytes), the
    reward (4), two flags (2), the sum tree's leaf and write stamp (12) and, with collector priorities, two Q-values
    (8); the tree's upper levels add a small fraction of its leaves. One zero frame more stands in for the frames of
    a stack that reach back past its episode's start."""
    frame = torch.Size(frame_shape).numel() * torch.empty((), dtype=frame_dtype).element_size()
    return capacity * (frame + 26 + (8 if collector_priorities else 0)) + frame


class ReplayMemory:
    """extend(first_lane, chunk), sample(batch_size) -> Batch, update_priorities(index, td_errors, tick), len()."""

    def __init__(self, capacity: int, num_lanes: int, frame_shape: tuple[int, ...], frame_dtype: torch.dtype,
                 frame_stack: int, replay_device: torch.device | str = "cpu", n_step: int = 1, gamma: float = 0.99,
                 prioritized: bool = False, alpha: float = 0.6, priority_eps: float = 1e-6,
                 initial_priority: str = "max"):
        self.lane_capacity = capacity // num_lanes
        if self.lane_capacity < frame_stack + n_step + 1:
            raise ValueError(f"capacity {capacity} leaves {self.lane_capacity} steps per lane for {num_lanes} lanes; "
                             f"need at least frame_stack + n_step + 1 = {frame_stack + n_step + 1}")
        if initial_priority not in ("max", "collectors"):
            raise ValueError(f"initial_priority must be max or collectors, got {initial_priority!r}")
        self.num_lanes, self.frame_stack, self.n_step, self.gamma = num_lanes, frame_stack, n_step, gamma
        self.prioritized, self.alpha, self.priority_eps = prioritized, alpha, priority_eps
        self.initial_priority = initial_priority if prioritized else "max"
        self.device = d = torch.device(replay_device)
        shape = (num_lanes, self.lane_capacity)
        # Left as allocated, not zeroed: no frame is read before it is written (_stack masks what reaches back past
        # an episode's start, and each lane starts with one; state_dict zeroes the unwritten ones it saves), so a
        # large memory takes its pages as chunks fill it instead of writing all of them before the first chunk.
        # One row more, after the last lane, holds a zero frame, which _stack gathers in place of a masked one.
        rows = num_lanes * self.lane_capacity + 1
        self._frame_rows = torch.empty(rows, *frame_shape, dtype=frame_dtype, device=d)
        self._frame_rows[-1] = 0
        self.frames = self._frame_rows[:-1].view(*shape, *frame_shape)
        self.actions = torch.zeros(shape, dtype=torch.int64, device=d)
        self.rewards = torch.zeros(shape, dtype=torch.float32, device=d)
        self.terminated = torch.zeros(shape, dtype=torch.bool, device=d)
        self.first = torch.zeros(shape, dtype=torch.bool, device=d)
        if self.initial_priority == "collectors":
            # What the collector's network said at each step: Q(s, a) of the action taken and max_a Q(s, a).
            self.q_taken = torch.zeros(shape, dtype=torch.float32, device=d)
            self.q_max = torch.zeros(shape, dtype=torch.float32, device=d)
        # Steps ever written to each lane; entry k of a lane sits at position k % lane_capacity.
        self.written = torch.zeros(num_lanes, dtype=torch.int64, device=d)
        self.tree = SumTree(num_lanes * self.lane_capacity, d)
        self.max_priority = torch.ones((), dtype=torch.float64, device=d)   # largest |TD error| + eps seen
        self._discount_powers = gamma ** torch.arange(n_step + 1, dtype=torch.float32, device=d)
        # Made once, not in each batch: a batch is a few dozen small operations, each a kernel launch on a GPU.
        self._steps = torch.arange(n_step + 2, device=d)                     # an n-step window's offsets
        self._stacked = torch.arange(-frame_stack + 1, 1, device=d)           # a frame stack's offsets
        self._ready = False

    # ------------------------------------------------------------------------------------------- data in

    def extend(self, first_lane: int, chunk: Chunk) -> None:
        """Appends a chunk's T steps to lanes first_lane .. first_lane + E - 1, in one copy per field, and gives
        the entries it completed their priorities."""
        steps, envs = chunk.actions.shape
        if steps + self.frame_stack + self.n_step > self.lane_capacity:
            raise ValueError(f"a chunk of {steps} steps does not fit a lane of {self.lane_capacity} steps with "
                             f"frame_stack {self.frame_stack} and n_step {self.n_step}")
        lanes = torch.arange(first_lane, first_lane + envs, device=self.device)
        before = self.written[lanes]
        ticks = before[:, None] + torch.arange(steps, device=self.device)   # [E, T]
        positions = (lanes[:, None], ticks % self.lane_capacity)
        fields = [(self.frames, chunk.frames), (self.actions, chunk.actions), (self.rewards, chunk.rewards),
                  (self.terminated, chunk.terminated), (self.first, chunk.first)]
        if self.initial_priority == "collectors":
            if chunk.q_taken is None or chunk.q_max is None:
                raise ValueError("prioritized replay with collector priorities needs chunks with q_taken and q_max")
            fields += [(self.q_taken, chunk.q_taken), (self.q_max, chunk.q_max)]
        for store, values in fields:
            store[positions] = values.to(self.device, non_blocking=True).transpose(0, 1)
        self.written[lanes] += steps
        self._prioritize_new(lanes, before, steps)

    def _prioritize_new(self, lanes: torch.Tensor, before: torch.Tensor, steps: int) -> None:
        S, n, cap = self.frame_stack, self.n_step, self.lane_capacity
        base = lanes[:, None] * cap
        # Nothing just written can be drawn yet, nor can the S - 1 entries after the ones it overwrote, whose
        # stacks lost a frame (where nothing was overwritten, those writes go to a just-written entry instead).
        written = before[:, None] + torch.arange(steps, device=self.device)
        stale = before[:, None] + steps - cap + torch.arange(S - 1, device=self.device)
        stale = torch.where(before[:, None] + steps - cap >= 1, stale, before[:, None])
        zeros = torch.cat([written, stale], dim=1) % cap
        self.tree.set((base + zeros).flatten(), torch.zeros((), dtype=torch.float64, device=self.device))
        # Entries whose n-step window this chunk completed: before - n .. before + steps - n - 1, when stored whole
        # (one below 0 does not exist: its position, a distinct one not yet written, keeps priority 0).
        ticks = before[:, None] - n + torch.arange(steps, device=self.device)    # [E, T]
        low, _ = self._sample_range()
        lane = lanes[:, None].expand_as(ticks).flatten()
        tick = ticks.flatten()
        drawable = (tick >= low[lane]) & ~self.first[lane, (tick + 1) % cap]
        if self.initial_priority == "collectors":
            returns, discounts, next_tick = self._n_step(lane, tick)
            td = returns + discounts * self.q_max[lane, next_tick % cap] - self.q_taken[lane, tick % cap]
            td = torch.where(drawable, td.abs(), 0.0)
            priority = self._priority(td)
            self._raise_max_priority(td)
        elif self.prioritized:
            priority = self.max_priority ** self.alpha
        else:
            priority = torch.ones((), dtype=torch.float64, device=self.device)
        self.tree.set(lane * cap + tick % cap, torch.where(drawable, priority, 0.0))
        if not self._ready:
            self._ready = bool(self.tree.total() > 0)

    # ------------------------------------------------------------------------------------ saving, restoring

    def _stores(self) -> dict[str, torch.Tensor]:
        stores = {"frames": self.frames, "actions": self.actions, "rewards": self.rewards,
                  "terminated": self.terminated, "first": self.first, "written": self.written,
                  "priorities": self.tree.levels[0][:self.tree.capacity], "max_priority": self.max_priority}
        if self.initial_priority == "collectors":
            stores |= {"q_taken": self.q_taken, "q_max": self.q_max}
        return stores

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything the memory holds (tensors on its device). Of each lane only the positions written so far are
        kept, so a memory far from full saves in proportion to what it holds, not to its capacity."""
        filled = int(self.written.max().clamp(max=self.lane_capacity))
        # Frames never written hold whatever their allocation held: zeroed here, so that what is saved is only
        # what was written (they are overwritten before they are read, so the memory itself does not change).
        self.frames[torch.arange(self.lane_capacity, device=self.device) >= self.written[:, None]] = 0
        return {name: store[:, :filled].clone() if name in _PER_LANE and filled < self.lane_capacity else store
                for name, store in self._stores().items()}

    @staticmethod
    def saved_mismatch(state: dict, capacity: int, num_lanes: int) -> str | None:
        """Why a replay that state_dict() saved as `state` cannot go into a memory of `capacity` over `num_lanes`
        lanes, said in a few words; None when its lanes and their length are this memory's (load_state_dict checks
        the rest)."""
        frames, priorities = state.get("frames"), state.get("priorities")
        if not (isinstance(frames, torch.Tensor) and frames.dim() > 1 and isinstance(priorities, torch.Tensor)):
            return "it holds no replay memory's frames and priorities"
        saved = (frames.shape[0], priorities.numel() // max(1, frames.shape[0]))
        if saved == (num_lanes, capacity // num_lanes):
            return None
        return (f"it holds {saved[0]} lanes of {saved[1]:,} steps, where this config's replay has {num_lanes} of "
                f"{capacity // num_lanes:,}")

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restores what `state_dict` saved, into a memory of the same capacity, lanes and frame shape."""
        mismatch = ("train.replay_capacity, the number of collectors, env.envs_per_collector and the env must stay "
                    "the same")
        frames = state.get("frames")
        # Steps saved per lane; -1 (refused below, naming the frames) when there is no such count that fits here.
        fits = isinstance(frames, torch.Tensor) and frames.dim() > 1 and frames.shape[1] <= self.lane_capacity
        filled = frames.shape[1] if fits else -1
        for name, store in self._stores().items():
            if name not in state:
                raise ValueError(f"the saved replay has no {name!r}")
            saved = state[name]
            want = (store.shape[0], filled, *store.shape[2:]) if name in _PER_LANE else tuple(store.shape)
            if saved.dtype != store.dtype or tuple(saved.shape) != want:
                raise ValueError(f"the saved replay's {name} is {tuple(saved.shape)} {saved.dtype}, this one's "
                                 f"{tuple(store.shape)} {store.dtype}: {mismatch}")
        if int(state["written"].max().clamp(max=self.lane_capacity)) > filled:
            raise ValueError("the saved replay holds fewer steps per lane than its counts say were written")
        for name, store in self._stores().items():
            if name in _PER_LANE:
                store[:, :filled] = state[name]
                store[:, filled:] = 0
            elif name != "priorities":
                store.copy_(state[name])
        self.tree.set(torch.arange(self.tree.capacity, device=self.device), state["priorities"].to(self.device))
        self._ready = bool(self.tree.total() > 0)

    # --------------------------------------------------------------------------------------------- reading

    def _sample_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per lane, the lowest entry whose stack is still stored and the count of entries from there whose
        n steps are stored."""
        oldest = (self.written - self.lane_capacity).clamp(min=0)
        # Once a lane has wrapped, frames before `oldest` are gone: start S-1 later so every stack is whole.
        low = torch.where(self.written > self.lane_capacity, oldest + self.frame_stack - 1, oldest)
        count = (self.written - self.n_step - low).clamp(min=0)
        return low, count

    def __len__(self) -> int:
        """Transitions that can be drawn."""
        return self.tree.count()

    @property
    def ready(self) -> bool:
        """Whether anything can be drawn yet."""
        return self._ready

    def sample(self, batch_size: int, generator: torch.Generator | None = None, beta: float = 1.0,
               n_step: int | None = None) -> Batch:
        """Draws `batch_size` transitions (stratified over the priority mass, with replacement), as whole-batch
        tensor ops. Importance weights (N P(i))^-beta are normalised by the batch's largest, as in Schaul et al.
        (N cancels out), so they only ever scale the loss down. Returns sum `n_step` rewards (from 1 to the
        memory's n_step, which it is when None): the memory stores single steps, so a run can shorten them."""
        if not self._ready:
            raise ValueError("replay holds no transition yet that can be drawn")
        rng_device = generator.device if generator is not None else self.device
        offsets = torch.rand(batch_size, generator=generator, dtype=torch.float64, device=rng_device)
        return self.sample_at(offsets.to(self.device), beta, n_step)

    def sample_at(self, offsets: torch.Tensor, beta: float | torch.Tensor = 1.0, n_step: int | None = None) -> Batch:
        """sample() with its random numbers given (one offset in [0, 1) per transition, on the memory's device) and
        `beta` a number or a 0-dim tensor: no host sync and fixed shapes, so that a captured CUDA graph can hold it
        (rl_dqn.trainer). The memory must be `ready`."""
        batch_size = len(offsets)
        index, probability = self.tree.sample_at(offsets)
        lane, position = index // self.lane_capacity, index % self.lane_capacity
        newest = self.written[lane] - 1
        tick = newest - (newest - position) % self.lane_capacity
        if self.prioritized:
            weights = probability.pow(-beta)
            weights = (weights / weights.max()).float()
        else:
            weights = torch.ones(batch_size, device=self.device)
        return self._gather(lane, tick, index, weights, n_step)

    def update_priorities(self, index: torch.Tensor, td_errors: torch.Tensor, tick: torch.Tensor | None = None
                          ) -> None:
        """New priorities from the absolute TD errors of a sampled batch (no-op for uniform replay). With `tick`
        (the batch's Batch.tick), an entry that is no longer the one drawn there, or no longer drawable, keeps the
        priority extend() gave it: learner.overlap draws the next batch before the chunks that come in meanwhile
        enter, and those may overwrite what it drew, or take a frame from its stack."""
        if not self.prioritized:
            return
        errors = td_errors.detach().abs().double()
        self._raise_max_priority(errors)
        priority = self._priority(errors)
        if tick is not None:
            lane = index // self.lane_capacity
            low, count = self._sample_range()
            drawn = (tick >= low[lane]) & (tick < low[lane] + count[lane])
            priority = torch.where(drawn, priority, self.tree.get(index))
        self.tree.set(index, priority)

    def _raise_max_priority(self, abs_td: torch.Tensor) -> None:
        """max_priority rises to the largest |TD error| + eps of `abs_td`, in place: a captured CUDA graph reads and
        writes the tensor it was captured with."""
        torch.maximum(self.max_priority, abs_td.max() + self.priority_eps, out=self.max_priority)

    def _priority(self, abs_td: torch.Tensor) -> torch.Tensor:
        return (abs_td.double() + self.priority_eps) ** self.alpha

    def _n_step(self, lane: torch.Tensor, tick: torch.Tensor, n: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For entries `tick` of `lane`: the discounted sum of up to `n` rewards (the memory's n_step when None),
        the bootstrap discount (0 when terminal) and the entry to bootstrap from, each [B]."""
        n, cap = self.n_step if n is None else n, self.lane_capacity
        if not 1 <= n <= self.n_step:
            raise ValueError(f"n-step returns of {n} steps: must be from 1 to the memory's n_step ({self.n_step})")
        # Entries k .. k+n+1 of each lane: k .. k+n-1 hold the n steps, and step k+i ends a truncated episode
        # when k+i+2 starts the next one (k+i+1 is its final observation). The last step's end is never read: an
        # end only cuts the steps after it.
        window = (tick[:, None] + self._steps[:n + 2]) % cap
        rows = lane[:, None]
        rewards, terminal = self.rewards[rows, window[:, :n]], self.terminated[rows, window[:, :n]]
        ends = (terminal | self.first[rows, window[:, 2:]]).long()
        included = ends.cumsum(1) == ends                                  # no end before the step
        returns = (rewards * included * self._discount_powers[:n]).sum(1)
        m = included.sum(1)
        terminated = (terminal & included).any(1)
        discounts = self._discount_powers[m].masked_fill_(terminated, 0.0)
        return returns, discounts, tick + m

    def _stack(self, lane: torch.Tensor, tick: torch.Tensor) -> torch.Tensor:
        """The observations at `tick` (any shape, `lane` broadcast to it): frames k-S+1 .. k, zeroed where they
        belong to an earlier episode, `[*tick.shape, S, *frame]`."""
        S = self.frame_stack
        positions = (tick[..., None] + self._stacked) % self.lane_capacity
        rows = lane.expand_as(tick)[..., None]
        index = rows * self.lane_capacity + positions                      # [..., S]: rows of the flattened store
        if S > 1:
            # The frame at tick t belongs to an earlier episode when an episode starts in (t, k]: a reverse
            # cumulative OR over the start flags of ticks k-S+2 .. k. Such a frame is gathered from the zero row
            # instead, a select on the indices rather than on the frames (a frame never written may hold
            # anything, NaN included, so a product would not do).
            starts = self.first[rows, positions[..., 1:]]
            earlier = starts.flip(-1).cummax(-1).values.flip(-1)           # [..., S-1]: ticks k-S+1 .. k-1
            index[..., :-1].masked_fill_(earlier, len(self._frame_rows) - 1)
        # Whole frames as rows of the flattened store: on the CPU this copies each frame at once, where
        # frames[rows, positions] went element by element (docs/benchmarks.md, Replay memory).
        frames = self._frame_rows.index_select(0, index.flatten())
        return frames.view(*positions.shape, *self.frames.shape[2:])

    def _gather(self, lane: torch.Tensor, tick: torch.Tensor, index: torch.Tensor | None = None,
                weights: torch.Tensor | None = None, n_step: int | None = None) -> Batch:
        returns, discounts, next_tick = self._n_step(lane, tick, n_step)
        k = tick % self.lane_capacity
        if index is None:
            index = lane * self.lane_capacity + k
        if weights is None:
            weights = torch.ones(len(tick), device=self.device)
        obs, next_obs = self._stack(lane, torch.stack([tick, next_tick]))   # both in one gather
        return Batch(obs, self.actions[lane, k], returns, next_obs, discounts, index, tick, weights)
