"""A sum tree for proportional prioritized replay (Schaul et al. 2016, https://arxiv.org/abs/1511.05952).

Every operation works on a whole batch as tensor ops on one device, CPU or CUDA, with no host sync except
`count()`. The tree is wide (fan-out F, 512 by default), so 1M leaves sit 3 levels below the root and a batched `set`
or `find` is a few kernel launches per level: on a GPU an update's cost is in its number of small kernels, not in
their work, and on the CPU a wider row costs little more than a narrow one. Each level is a float64 tensor padded to a
multiple of F, so the F children of node n are `level.view(-1, F)[n]`. A parent is always recomputed as the sum of
its children, never moved by a delta, so rounding errors cannot build up over millions of updates.
"""

from __future__ import annotations

import torch


class SumTree:
    """set(index, priority), get(index), total(), count(), find(mass), sample(batch_size)."""

    def __init__(self, capacity: int, device: torch.device | str = "cpu", fanout: int = 512):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if fanout < 2:
            raise ValueError(f"fanout must be at least 2, got {fanout}")
        self.capacity = capacity
        self.device = torch.device(device)
        self.fanout = fanout
        # levels[0] holds the leaves, levels[-1] the root alone; there is always at least one parent level.
        self.levels = []
        nodes = capacity
        while not self.levels or nodes > 1:
            parents = -(-nodes // fanout)
            self.levels.append(torch.zeros(parents * fanout, dtype=torch.float64, device=self.device))
            nodes = parents
        self.levels.append(torch.zeros(1, dtype=torch.float64, device=self.device))
        # For each level below the root, how many of its entries are nodes (the rows of the level below) or leaves
        # (the capacity): the rest is padding, which find() never walks into.
        self._nodes = [capacity] + [len(level) // fanout for level in self.levels[:-2]]
        # For each leaf, the position in the latest `set` batch of its last write (scratch; stale entries unread).
        self._last_write = torch.zeros(capacity, dtype=torch.int32, device=self.device)
        # Made once, not at each call: a call is a few small operations per level, each a kernel launch on a GPU.
        self._zero = torch.zeros((), dtype=torch.float64, device=self.device)
        self._counting = torch.arange(4096, dtype=torch.int32, device=self.device)   # 0, 1, 2, ... (_first())

    def set(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Sets leaves `index` (int64, any order, in [0, capacity)) to `priority` (>= 0, float, broadcast to the
        shape of `index`) and refreshes their ancestors. Where an index repeats, the last write in the batch wins.

        Bounds and signs are not checked: that would sync with the device on every call.
        """
        if index.dtype != torch.int64:
            raise TypeError(f"index must be int64, got {index.dtype}")
        index = index.to(self.device)
        priority = priority.to(self.device, torch.float64).expand(index.shape).flatten()
        index = index.flatten()
        leaves = self.levels[0]
        # A scatter with repeated indices may keep any of the values. Give every write to a leaf the value of its
        # last write, so whichever one lands, the result is the same on CPU and CUDA.
        self._last_write.scatter_reduce_(0, index, self._first(len(index)), "amax", include_self=False)
        leaves[index] = priority[self._last_write[index]]
        node = index
        for children, parents in zip(self.levels, self.levels[1:]):
            node = node // self.fanout
            parents[node] = children.view(-1, self.fanout)[node].sum(1)

    def get(self, index: torch.Tensor) -> torch.Tensor:
        """The priorities (float64) of leaves `index`."""
        return self.levels[0][index.to(self.device)]

    def total(self) -> torch.Tensor:
        """The sum of all priorities, a 0-dim tensor on the tree's device (a copy: later sets do not change it)."""
        return self.levels[-1][0].clone()

    def count(self) -> int:
        """How many leaves have a priority above 0: a pass over the leaves, and a sync with the device."""
        return int((self.levels[0][:self.capacity] > 0).sum())

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """For each u in `mass` (0 <= u < total, which must be > 0), the leaf i with prefix(i) <= u < prefix(i) + p_i.

        Never returns a leaf of priority 0: at each level u is kept below the sum of the row's children, which
        can differ from the parent's value in the last bit (a different summation order). A tree holding NaN (the
        TD errors of a learner that diverged) gives leaves of no meaning, but always leaves of the tree: each node
        is kept to its level's rows, so that a draw never indexes past them (on a GPU, a device-side assertion that
        ends the process before the learner can say what happened).
        """
        u = mass.to(self.device, torch.float64).flatten().clamp(min=0)
        node = None   # the root, the one row of the level below it
        for level, nodes in zip(reversed(self.levels[:-1]), reversed(self._nodes)):
            rows = level.view(-1, self.fanout)
            rows = rows[0].expand(len(u), -1) if node is None else rows[node]
            # Each row's sums before each child and after the last: [B, F+1], starting at 0.
            sums = torch.nn.functional.pad(rows, (1, 0)).cumsum(1)
            u = torch.minimum(u, torch.nextafter(sums[:, -1], self._zero))
            # right=True: past the last sum not above u (sums[0] = 0 <= u), i.e. 1 + the first child whose end
            # exceeds u, which has positive mass since its end exceeds the one before. The clamp only matters when
            # the whole tree is 0 (or NaN).
            child = torch.searchsorted(sums, u[:, None], right=True).sub_(1).clamp_(0, self.fanout - 1)
            u = u - sums.gather(1, child)[:, 0]
            child = child[:, 0]
            node = (child if node is None else child.add_(node, alpha=self.fanout)).clamp_(max=nodes - 1)
        return node

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draws one leaf from each of `batch_size` equal strata of the total mass, as Schaul et al. do to lower
        the variance of a batch. Returns (indices int64, probabilities p_i / total float64).

        Random numbers come from `generator` (on its own device, then moved), so a CPU generator gives the same
        draws for a tree on CPU and on CUDA.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        rng_device = generator.device if generator is not None else self.device
        return self.sample_at(torch.rand(batch_size, generator=generator, dtype=torch.float64, device=rng_device))

    def sample_at(self, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """sample() with its random numbers given: one offset in [0, 1) per stratum. With no host sync and shapes
        fixed by `offsets`, so that it can run inside a captured CUDA graph whose offsets are drawn before each
        replay."""
        batch_size = len(offsets)
        total = self.levels[-1][0]
        index = self.find((self._first(batch_size) + offsets.to(self.device)) * (total / batch_size))
        return index, self.levels[0][index] / total

    def _first(self, count: int) -> torch.Tensor:
        """0, 1, ..., count - 1 (int32) on the tree's device: a view of a tensor made once, or for a count beyond it
        (a large insert, a restore) a new one. The tensor made once is never replaced: a captured CUDA graph reads
        it where it was at the capture."""
        if count > len(self._counting):
            return torch.arange(count, dtype=torch.int32, device=self.device)
        return self._counting[:count]
