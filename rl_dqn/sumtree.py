"""A sum tree for proportional prioritized replay (Schaul et al. 2016, https://arxiv.org/abs/1511.05952).

Every operation works on a whole batch as tensor ops on one device, CPU or CUDA, with no host sync except
`count()`. The tree is wide (fan-out F, 64 by default), so 1M leaves sit 4 levels below the root and a batched `set` or
`find` is a few kernel launches per level. Each level is a float64 tensor padded to a multiple of F, so the F
children of node n are `level.view(-1, F)[n]`. A parent is always recomputed as the sum of its children, never
moved by a delta, so rounding errors cannot build up over millions of updates.
"""

from __future__ import annotations

import torch


class SumTree:
    """set(index, priority), get(index), total(), count(), find(mass), sample(batch_size)."""

    def __init__(self, capacity: int, device: torch.device | str = "cpu", fanout: int = 64):
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
        self._positive = torch.zeros((), dtype=torch.int64, device=self.device)

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
        order = torch.arange(len(index), dtype=torch.int32, device=self.device)
        self._last_write.scatter_reduce_(0, index, order, "amax", include_self=False)
        last = self._last_write[index]
        priority = priority[last]
        turned_on = (priority > 0).long() - (leaves[index] > 0).long()
        self._positive += (turned_on * (last == order)).sum()                        # once per leaf
        leaves[index] = priority
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
        """How many leaves have a priority above 0 (syncs with the device)."""
        return int(self._positive)

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """For each u in `mass` (0 <= u < total, which must be > 0), the leaf i with prefix(i) <= u < prefix(i) + p_i.

        Never returns a leaf of priority 0: at each level u is kept below the sum of the row's children, which
        can differ from the parent's value in the last bit (a different summation order). A tree holding NaN (the
        TD errors of a learner that diverged) gives leaves of no meaning, but always leaves of the tree: each node
        is kept to its level's rows, so that a draw never indexes past them (on a GPU, a device-side assertion that
        ends the process before the learner can say what happened).
        """
        u = mass.to(self.device, torch.float64).flatten().clamp(min=0)
        node = torch.zeros_like(u, dtype=torch.int64)
        zero = u.new_zeros(())
        for level, nodes in zip(reversed(self.levels[:-1]), reversed(self._nodes)):
            ends = level.view(-1, self.fanout)[node].cumsum(1)                      # [B, F]
            u = torch.minimum(u, torch.nextafter(ends[:, -1], zero))
            # right=True: the first child whose end exceeds u, which has positive mass since ends[c] > ends[c-1].
            # The clamp only matters when the whole tree is 0 (or NaN).
            child = torch.searchsorted(ends, u[:, None], right=True)[:, 0].clamp(max=self.fanout - 1)
            before = ends.gather(1, (child - 1).clamp(min=0)[:, None])[:, 0]
            u = u - torch.where(child > 0, before, zero)
            node = (node * self.fanout + child).clamp(max=nodes - 1)
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
        strata = torch.arange(batch_size, dtype=torch.float64, device=self.device)
        index = self.find((strata + offsets.to(self.device)) * (total / batch_size))
        return index, self.levels[0][index] / total
