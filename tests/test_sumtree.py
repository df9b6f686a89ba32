"""Sum tree: batched sets keep every sum exact, find and sample pick leaves in proportion to priority and never
one of priority 0, and a tree on CUDA makes the same choices as one on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from rl_dqn.sumtree import SumTree

SHAPES = [(capacity, fanout) for capacity in (1, 5, 64, 65, 1000, 4097) for fanout in (2, 3, 64, 512)]


def random_sets(tree: SumTree, generator: torch.Generator, rounds: int = 20) -> torch.Tensor:
    """Sets random batches, with repeats and zeros, in `tree` and in a plain tensor; returns the tensor."""
    leaves = torch.zeros(tree.capacity, dtype=torch.float64)
    for _ in range(rounds):
        size = int(torch.randint(1, 2 * tree.capacity + 2, (), generator=generator))
        index = torch.randint(tree.capacity, (size,), generator=generator)
        priority = torch.rand(size, generator=generator, dtype=torch.float64)
        priority[torch.rand(size, generator=generator) < 0.3] = 0
        tree.set(index, priority)
        for i, p in zip(index.tolist(), priority.tolist()):   # the last write wins
            leaves[i] = p
    return leaves


@pytest.mark.parametrize("capacity,fanout", SHAPES)
def test_sums_follow_batched_sets_with_repeats(capacity, fanout):
    tree = SumTree(capacity, fanout=fanout)
    leaves = random_sets(tree, torch.Generator().manual_seed(capacity * 10 + fanout))
    assert torch.equal(tree.get(torch.arange(capacity)), leaves)
    assert tree.total().item() == pytest.approx(leaves.sum().item(), rel=1e-12, abs=1e-12)
    assert tree.count() == int((leaves > 0).sum())
    for level, parents in zip(tree.levels, tree.levels[1:]):   # every parent is the sum of its children
        assert torch.equal(parents[:len(level) // fanout], level.view(-1, fanout).sum(1))


def test_constructor_names_the_bad_argument():
    with pytest.raises(ValueError, match="capacity"):
        SumTree(0)
    with pytest.raises(ValueError, match="fanout"):
        SumTree(10, fanout=1)
    with pytest.raises(TypeError, match="index"):
        SumTree(10).set(torch.tensor([1], dtype=torch.int32), torch.tensor([1.0]))


@pytest.mark.parametrize("capacity,fanout", [(5, 2), (65, 3), (1000, 64), (4097, 64), (4097, 2)])
def test_find_agrees_with_brute_force_and_skips_zeros(capacity, fanout):
    generator = torch.Generator().manual_seed(capacity + fanout)
    leaves = torch.rand(capacity, generator=generator, dtype=torch.float64)
    leaves[torch.rand(capacity, generator=generator) < 0.5] = 0   # many zero leaves interleaved
    leaves[0] = leaves[-1] = 0                                    # and at both edges
    leaves[capacity // 2] = 0.5
    tree = SumTree(capacity, fanout=fanout)
    tree.set(torch.arange(capacity), leaves)
    total = tree.total()
    ends = leaves.cumsum(0)
    u = torch.cat([torch.rand(20_000, generator=generator, dtype=torch.float64) * total,
                   ends[:-1],                                   # exactly on every boundary
                   torch.tensor([0.0, torch.nextafter(total, torch.tensor(0.0, dtype=torch.float64)),
                                 total, total * 2])])
    found = tree.find(u)
    assert (leaves[found] > 0).all()
    # Brute force on u well inside a leaf; within a few ulps of a boundary either neighbour is right.
    expected = torch.searchsorted(ends, u, right=True).clamp(max=capacity - 1)
    inside = (u - ends[expected] + leaves[expected] > 1e-9) & (ends[expected] - u > 1e-9)
    assert inside.sum() > 10_000
    assert torch.equal(found[inside], expected[inside])
    last_positive = int(torch.nonzero(leaves).max())
    assert found[-3:].tolist() == [last_positive] * 3            # just below total, at total, past it
    assert found[-4] == int(torch.nonzero(leaves).min())         # u = 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("capacity,fanout", [(65, 3), (1000, 64), (4097, 2), (1200, 64)])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_tree_holding_nan_or_infinity_still_draws_leaves_of_the_tree(device, capacity, fanout, bad):
    """A learner that diverged puts NaN (or infinite) TD errors into the tree: its draws mean nothing then, but
    they stay leaves of the tree, so that the learner lives to say it diverged."""
    tree = SumTree(capacity, device, fanout=fanout)
    tree.set(torch.arange(capacity // 2, device=device), torch.rand(capacity // 2, dtype=torch.float64))
    tree.set(torch.tensor([capacity // 3, capacity // 2 + 1], device=device), torch.tensor(bad))
    generator = torch.Generator(device).manual_seed(capacity)
    index, _ = tree.sample(512, generator)
    assert 0 <= int(index.min()) and int(index.max()) < capacity
    u = torch.tensor([0.0, 1.0, 1e300, math.inf, math.nan], dtype=torch.float64, device=device)
    assert int(tree.find(u).max()) < capacity


@pytest.mark.parametrize("draws,batch_size", [(200, 1000), (5000, 4)])
def test_sampling_proportions(draws, batch_size):
    # Leaves 1..10 hold priorities 1..10, with zeros at 0 and 11..15. With 1000 strata almost every stratum lies
    # inside one leaf; with 4, the draw within each stratum decides, so its uniformity is tested too.
    leaves = torch.zeros(16, dtype=torch.float64)
    leaves[1:11] = torch.arange(1, 11, dtype=torch.float64)
    tree = SumTree(16, fanout=4)
    tree.set(torch.arange(16), leaves)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(16, dtype=torch.float64)
    for _ in range(draws):
        index, probability = tree.sample(batch_size, generator)
        assert torch.allclose(probability, leaves[index] / leaves.sum(), rtol=0, atol=1e-12)
        counts += torch.bincount(index, minlength=16)
    n = draws * batch_size
    p = leaves / leaves.sum()
    # Stratified draws vary less than independent ones, so the binomial bound is loose on this side only.
    assert ((counts / n - p).abs() <= 4 * (p * (1 - p) / n).sqrt()).all()
    assert counts[leaves == 0].sum() == 0


def test_each_stratum_gets_one_sample():
    batch_size, per_stratum = 32, 7
    tree = SumTree(batch_size * per_stratum, fanout=3)
    tree.set(torch.arange(batch_size * per_stratum), torch.tensor(1.0))
    generator = torch.Generator().manual_seed(1)
    for _ in range(50):
        index, probability = tree.sample(batch_size, generator)
        assert torch.equal(index // per_stratum, torch.arange(batch_size))
        assert torch.all(probability == 1 / (batch_size * per_stratum))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_cuda_tree_matches_cpu_tree():
    # Whole-number priorities keep every sum exact, so both devices must make the same choices bit for bit.
    capacity, fanout = 100_003, 16
    trees = [SumTree(capacity, device, fanout) for device in ("cpu", "cuda")]
    generator = torch.Generator().manual_seed(2)
    for _ in range(10):
        index = torch.randint(capacity, (5000,), generator=generator)   # with repeats
        priority = torch.randint(0, 4, (5000,), generator=generator).double()
        for tree in trees:
            tree.set(index, priority)
    cpu, cuda = trees
    assert torch.equal(cpu.get(torch.arange(capacity)), cuda.get(torch.arange(capacity)).cpu())
    assert cpu.total().item() == cuda.total().item() and cpu.count() == cuda.count()
    u = torch.rand(10_000, generator=generator, dtype=torch.float64) * cpu.total()
    assert torch.equal(cpu.find(u), cuda.find(u).cpu())
    drawn = [tree.sample(512, torch.Generator().manual_seed(3)) for tree in trees]
    assert torch.equal(drawn[0][0], drawn[1][0].cpu()) and torch.equal(drawn[0][1], drawn[1][1].cpu())
    assert (cuda.get(drawn[1][0]) > 0).all()
