"""Replay memory: stacks rebuilt from frames stored once equal the stacks the env produced, across episode ends
(lost lives, time limits) and ring wrap-around."""

from __future__ import annotations

import collections

import pytest
import torch

from envs import EnvSpec, make_vector_env
from rl_dqn.collector import ChunkBuilder
from rl_dqn.config import EnvConfig
from rl_dqn.replay import ReplayMemory, bytes_needed
from rl_dqn.types import Chunk


def hand_chunk(values, first, terminated=None, actions=None, rewards=None) -> Chunk:
    """One env, frames of shape (1,) holding readable values."""
    T = len(values)
    return Chunk(0, 0, 0, torch.tensor(values, dtype=torch.float32).view(T, 1, 1),
                 torch.tensor(actions or list(range(T))).view(T, 1),
                 torch.tensor(rewards, dtype=torch.float32).view(T, 1) if rewards else torch.ones(T, 1),
                 torch.tensor(terminated or [False] * T, dtype=torch.bool).view(T, 1),
                 torch.tensor(first, dtype=torch.bool).view(T, 1),
                 torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64))


def test_stacks_by_hand():
    # Ticks 0..7 hold frames 1..8. An episode starts at 0 and another at 4: tick 3 was the first episode's
    # final observation, and 3 -> 4 was the env's reset, not a transition.
    replay = ReplayMemory(capacity=100, num_lanes=1, frame_shape=(1,), frame_dtype=torch.float32, frame_stack=3,
                          gamma=0.5)
    replay.extend(0, hand_chunk([1, 2, 3, 4, 5, 6, 7, 8], first=[1, 0, 0, 0, 1, 0, 0, 0],
                                terminated=[0, 0, 1, 0, 0, 0, 0, 0]))
    batch = replay._gather(torch.tensor([0, 0, 0]), torch.tensor([1, 2, 5]))
    assert batch.obs.flatten(1).tolist() == [[0, 1, 2], [1, 2, 3], [0, 5, 6]]
    assert batch.next_obs.flatten(1).tolist() == [[1, 2, 3], [2, 3, 4], [5, 6, 7]]
    assert batch.discounts.tolist() == [0.5, 0.0, 0.5]
    assert batch.actions.tolist() == [1, 2, 5]
    # Transitions: 0,1,2 and 4,5,6; not 3 (reset) and not 7 (no successor yet).
    assert len(replay) == 6
    generator = torch.Generator().manual_seed(0)
    drawn = {tuple(o) for _ in range(100) for o in replay.sample(7, generator).obs.flatten(1).tolist()}
    assert drawn == {(0, 0, 1), (0, 1, 2), (1, 2, 3), (0, 0, 5), (0, 5, 6), (5, 6, 7)}


@pytest.mark.parametrize("filler", [float("nan"), 255.0])
def test_no_frame_is_read_before_it_is_written(filler):
    # The store is not zeroed when it is made: whatever its unwritten frames hold, stacks that reach back past a
    # lane's first step or an episode's start read zeros there, before and after the ring wraps.
    replay = ReplayMemory(capacity=24, num_lanes=2, frame_shape=(1,), frame_dtype=torch.float32, frame_stack=3)
    replay.frames.fill_(filler)
    generator = torch.Generator().manual_seed(0)
    for start in range(0, 40, 4):
        replay.extend(0, hand_chunk(list(range(start + 1, start + 5)), first=[start % 8 == 0, 0, 0, 0]))
        stacks = {tuple(o) for o in replay.sample(256, generator).obs.flatten(1).tolist()}
        assert all(0 <= v <= start + 4 for stack in stacks for v in stack), stacks
        if start == 0:
            assert {(0, 0, 1), (0, 1, 2)} <= stacks


def test_a_chunk_bridges_into_the_next_one():
    replay = ReplayMemory(capacity=100, num_lanes=1, frame_shape=(1,), frame_dtype=torch.float32, frame_stack=2)
    replay.extend(0, hand_chunk([1, 2, 3], first=[1, 0, 0]))
    assert len(replay) == 2
    replay.extend(0, hand_chunk([4, 5], first=[0, 0]))
    batch = replay._gather(torch.tensor([0]), torch.tensor([2]))
    assert batch.obs.flatten().tolist() == [2, 3] and batch.next_obs.flatten().tolist() == [3, 4]


def one_lane(n_step: int, frame_stack: int = 1, **kwargs) -> ReplayMemory:
    return ReplayMemory(capacity=100, num_lanes=1, frame_shape=(1,), frame_dtype=torch.float32,
                        frame_stack=frame_stack, n_step=n_step, gamma=0.5, **kwargs)


def test_n_step_returns_across_a_terminal_by_hand():
    # Ticks 0..9, rewards 1, 2, 4, ...; the step from tick 3 is terminal (tick 4 is the final observation, 4 -> 5
    # the reset) and a new episode runs from tick 5.
    replay = one_lane(n_step=3)
    replay.extend(0, hand_chunk(list(range(10)), first=[1, 0, 0, 0, 0, 1, 0, 0, 0, 0],
                                terminated=[0, 0, 0, 1, 0, 0, 0, 0, 0, 0], rewards=[2.0 ** i for i in range(10)]))
    ticks = torch.tensor([0, 1, 2, 3, 5, 6])
    batch = replay._gather(torch.zeros(6, dtype=torch.int64), ticks)
    assert batch.returns.tolist() == [1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4 + 0.25 * 8, 4 + 0.5 * 8, 8,
                                      32 + 0.5 * 64 + 0.25 * 128, 64 + 0.5 * 128 + 0.25 * 256]
    assert batch.discounts.tolist() == [0.125, 0.0, 0.0, 0.0, 0.125, 0.125]
    assert batch.next_obs.flatten().tolist() == [3, 4, 4, 4, 8, 9]
    # Drawable: those six; not 4 (the reset), not 7..9 (their three steps are not all stored yet).
    assert len(replay) == 6
    drawn = set(replay.sample(64, torch.Generator().manual_seed(0)).obs.flatten().tolist())
    assert drawn == {0, 1, 2, 3, 5, 6}


def test_n_step_returns_across_a_truncation_by_hand():
    # An episode truncated after ticks 0..2 (tick 2 is its final observation, 2 -> 3 the reset): it bootstraps
    # from tick 2 with gamma^m for the m steps that remained.
    replay = one_lane(n_step=3)
    replay.extend(0, hand_chunk(list(range(8)), first=[1, 0, 0, 1, 0, 0, 0, 0], rewards=[2.0 ** i for i in range(8)]))
    batch = replay._gather(torch.zeros(3, dtype=torch.int64), torch.tensor([0, 1, 3]))
    assert batch.returns.tolist() == [1 + 0.5 * 2, 2, 8 + 0.5 * 16 + 0.25 * 32]
    assert batch.discounts.tolist() == [0.25, 0.5, 0.125]
    assert batch.next_obs.flatten().tolist() == [2, 2, 6]
    assert len(replay) == 4   # 0, 1, 3, 4


def test_shorter_returns_from_the_same_memory_by_hand():
    # A memory of 3-step returns draws 1- and 2-step ones too, up to a terminal (the step from tick 3) as before.
    replay = one_lane(n_step=3)
    replay.extend(0, hand_chunk(list(range(10)), first=[1, 0, 0, 0, 0, 1, 0, 0, 0, 0],
                                terminated=[0, 0, 0, 1, 0, 0, 0, 0, 0, 0], rewards=[2.0 ** i for i in range(10)]))
    lanes, ticks = torch.zeros(4, dtype=torch.int64), torch.tensor([0, 2, 3, 5])
    two = replay._gather(lanes, ticks, n_step=2)
    assert two.returns.tolist() == [1 + 0.5 * 2, 4 + 0.5 * 8, 8, 32 + 0.5 * 64]
    assert two.discounts.tolist() == [0.25, 0.0, 0.0, 0.25] and two.next_obs.flatten().tolist() == [2, 4, 4, 7]
    one = replay._gather(lanes, ticks, n_step=1)
    assert one.returns.tolist() == [1, 4, 8, 32]
    assert one.discounts.tolist() == [0.5, 0.5, 0.0, 0.5] and one.next_obs.flatten().tolist() == [1, 3, 4, 6]
    drawn = replay.sample(64, torch.Generator().manual_seed(0), n_step=1)
    assert torch.equal(drawn.next_obs.flatten(), torch.where(drawn.obs.flatten() == 3, 4.0, drawn.obs.flatten() + 1))
    for n in (0, 4):
        with pytest.raises(ValueError, match="from 1 to the memory's n_step"):
            replay.sample(8, torch.Generator().manual_seed(0), n_step=n)


def test_one_step_is_the_plain_dqn_transition():
    replay = one_lane(n_step=1, frame_stack=2)
    replay.extend(0, hand_chunk([1, 2, 3, 4], first=[1, 0, 0, 0], terminated=[0, 1, 0, 0], rewards=[5, 6, 7, 8]))
    batch = replay._gather(torch.zeros(2, dtype=torch.int64), torch.tensor([0, 1]))
    assert batch.returns.tolist() == [5, 6] and batch.discounts.tolist() == [0.5, 0.0]
    assert batch.obs.flatten(1).tolist() == [[0, 1], [1, 2]] and batch.next_obs.flatten(1).tolist() == [[1, 2], [2, 3]]


def test_importance_weights_by_hand():
    replay = one_lane(n_step=1, prioritized=True, alpha=0.5, priority_eps=1e-12)
    replay.extend(0, hand_chunk([0, 1, 2, 3, 4], first=[1, 0, 0, 0, 0]))
    index = torch.tensor([0, 1, 2, 3])
    # |TD| 1, 4, 16, 9 -> priorities sqrt: 1, 2, 4, 3 -> P = 0.1, 0.2, 0.4, 0.3
    replay.update_priorities(index, torch.tensor([1.0, -4.0, 16.0, -9.0]))
    batch = replay.sample(64, torch.Generator().manual_seed(0), beta=1.0)
    # w = (N P)^-beta over the batch's largest; entry 0 (the rarest) is always drawn by the first stratum
    expected = {0: 1.0, 1: 0.5, 2: 0.25, 3: 1 / 3}
    assert 0 in batch.index.tolist()
    for i, w in zip(batch.index.tolist(), batch.weights.tolist()):
        assert w == pytest.approx(expected[i], rel=1e-6)
    assert batch.obs.flatten().tolist() == batch.index.float().tolist()
    half = replay.sample(64, torch.Generator().manual_seed(0), beta=0.5)
    for i, w in zip(half.index.tolist(), half.weights.tolist()):
        assert w == pytest.approx(expected[i] ** 0.5, rel=1e-6)
    # Drawn in proportion: 6.4, 12.8, 25.6 and 19.2 of 64, one per stratum, so within one of that.
    counts = torch.bincount(batch.index, minlength=4).tolist()
    assert all(abs(c - 64 * p) <= 1 for c, p in zip(counts, [0.1, 0.2, 0.4, 0.3]))


def test_new_transitions_enter_with_the_collectors_td_error():
    replay = one_lane(n_step=2, prioritized=True, alpha=1.0, priority_eps=1e-12, initial_priority="collectors")
    chunk = hand_chunk([0, 1, 2, 3], first=[1, 0, 0, 0], rewards=[1, 1, 1, 1])
    replay.extend(0, chunk._replace(q_taken=torch.tensor([[3.0], [0.0], [0.0], [0.0]]),
                                    q_max=torch.tensor([[0.0], [0.0], [4.0], [8.0]])))
    # Entry 0: 1 + 0.5 * 1 + 0.25 * max Q(tick 2) - Q(tick 0, a) = 1.5 + 1 - 3 = -0.5; entry 1: 1.5 + 2 - 0 = 3.5
    assert replay.tree.get(torch.tensor([0, 1, 2, 3])).tolist() == pytest.approx([0.5, 3.5, 0.0, 0.0])
    assert replay.max_priority.item() == pytest.approx(3.5)


def test_a_lane_that_wraps_never_draws_a_stack_it_lost():
    replay = ReplayMemory(capacity=12, num_lanes=1, frame_shape=(1,), frame_dtype=torch.float32, frame_stack=3,
                          n_step=2, gamma=0.5)
    for start in range(0, 40, 4):
        replay.extend(0, hand_chunk(list(range(start + 1, start + 5)), first=[start == 0, 0, 0, 0]))
        written = start + 4
        drawable = {int(o[-1]) for o in replay.sample(256, torch.Generator().manual_seed(start)).obs.flatten(1)}
        # Frames 1.. sit at ticks 0..; tick k is drawable when k+2 is stored and its whole stack is in the ring.
        oldest = max(written - 12, 0)
        low = oldest + 2 if written > 12 else 0
        assert drawable == {k + 1 for k in range(low, written - 2)}, (start, drawable)


def test_new_priorities_skip_what_a_chunk_has_overwritten_or_made_undrawable_since_the_draw():
    # learner.overlap draws the next batch before the chunks that came in meanwhile enter. Ticks 0..11 fill the
    # lane, and ticks 0..9 are drawn; ticks 12..15 then overwrite positions 0..3: 12 and 13 are new entries that are
    # drawable, 14 and 15 wait for their n steps, and 4 and 5 lost a frame of their stacks.
    replay = ReplayMemory(capacity=12, num_lanes=1, frame_shape=(1,), frame_dtype=torch.float32, frame_stack=3,
                          n_step=2, gamma=0.5, prioritized=True, alpha=1.0, priority_eps=1e-12)
    for start in range(0, 12, 4):
        replay.extend(0, hand_chunk(list(range(start + 1, start + 5)), first=[start == 0, 0, 0, 0]))
    batch = replay._gather(torch.zeros(10, dtype=torch.int64), torch.arange(10))
    replay.extend(0, hand_chunk([13, 14, 15, 16], first=[0, 0, 0, 0]))
    replay.update_priorities(batch.index, torch.full((10,), 3.0), batch.tick)
    # Positions 0, 1: the chunk's new entries at the memory's largest priority then (1); 2..5: not drawable;
    # 6..9: the drawn entries, still there, at their TD errors.
    assert replay.tree.get(torch.arange(10)).tolist() == pytest.approx([1, 1, 0, 0, 0, 0, 3, 3, 3, 3])
    drawn = {int(o[-1]) - 1 for o in replay.sample(256, torch.Generator().manual_seed(0)).obs.flatten(1)}
    assert drawn == {6, 7, 8, 9, 10, 11, 12, 13}


def test_a_saved_memory_holds_what_was_written_and_restores_to_the_same_draws(tmp_path):
    def memory():
        return ReplayMemory(capacity=2_000, num_lanes=2, frame_shape=(84, 84), frame_dtype=torch.uint8,
                            frame_stack=4, n_step=3, prioritized=True)

    def chunk(steps, start):
        frames = (torch.arange(start, start + steps * 2) % 251).to(torch.uint8).view(steps, 2, 1, 1)
        return Chunk(0, 0, 0, frames.expand(steps, 2, 84, 84).contiguous(), torch.zeros(steps, 2, dtype=torch.int64),
                     torch.ones(steps, 2), torch.zeros(steps, 2, dtype=torch.bool),
                     (torch.arange(steps) == 0).view(steps, 1).expand(steps, 2) & (start == 0),
                     torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64))

    replay = memory()
    replay.frames.fill_(255)   # what an allocation may hold before anything is written: never saved
    for start in range(0, 100, 20):
        replay.extend(0, chunk(10, start))
    path = tmp_path / "replay.pt"
    torch.save(replay.state_dict(), path)
    # 50 of the 1,000 positions of each lane written: the file holds those frames, not the memory's capacity.
    assert 2 * 50 * 84 * 84 < path.stat().st_size < 2 * 60 * 84 * 84 + 100_000
    for source in (replay, None):
        if source is None:     # and once more, after the lanes have wrapped: then every position is saved
            for start in range(100, 2_500, 20):
                replay.extend(0, chunk(10, start))
            torch.save(replay.state_dict(), path)
        restored = memory()
        restored.load_state_dict(torch.load(path, weights_only=True))
        for store in ("frames", "actions", "rewards", "first", "written"):
            assert torch.equal(getattr(restored, store), getattr(replay, store)), store
        a, b = (m.sample(64, torch.Generator().manual_seed(3), beta=0.4) for m in (replay, restored))
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    saved = replay.state_dict()
    with pytest.raises(ValueError, match="frames"):
        memory().load_state_dict(saved | {"frames": saved["frames"][:1]})
    cut = {name: value[:, :10] if value.dim() > 1 else value for name, value in memory().state_dict().items()}
    with pytest.raises(ValueError, match="fewer steps per lane"):
        memory().load_state_dict(cut | {"written": torch.tensor([50, 50])})


def test_memory_per_transition_is_one_frame_plus_scalars():
    replay = ReplayMemory(capacity=100_000, num_lanes=4, frame_shape=(84, 84), frame_dtype=torch.uint8,
                          frame_stack=4)
    tensors = [t for t in vars(replay).values() if isinstance(t, torch.Tensor)]
    tensors += [t for t in vars(replay.tree).values() if isinstance(t, torch.Tensor)]
    tensors += [t for level in getattr(replay.tree, "levels", []) for t in [level]]
    # Counted once per allocation: the frames are a view of the store that also holds the zero frame.
    stored = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
    assert 84 * 84 + 14 + 8 <= stored / 100_000 <= 84 * 84 + 27
    # What the learner checks against the memory it has (cli.check_replay_memory), within the tree's upper levels.
    assert 0 <= stored - bytes_needed(100_000, (84, 84), torch.uint8) <= 100_000
    collector = ReplayMemory(capacity=100_000, num_lanes=4, frame_shape=(84, 84), frame_dtype=torch.uint8,
                             frame_stack=4, prioritized=True, initial_priority="collectors")
    assert collector.q_taken.nbytes + collector.q_max.nbytes == \
        bytes_needed(100_000, (84, 84), torch.uint8, True) - bytes_needed(100_000, (84, 84), torch.uint8)


@pytest.mark.parametrize("seed", [0, 1])
def test_replay_stacks_equal_the_env_stacks(seed):
    """Breakout with a short time limit: lost lives, truncations and resets in every lane; the ring (60 steps per
    lane) wraps more than twice; the envs sit in lanes 3..5 of 6, as a second collector's would."""
    cfg = EnvConfig(id="ALE/Breakout-v5", sticky_action_prob=0.0, max_episode_frames=240, noop_max=10)
    E, T, chunks = 3, 10, 16
    env = make_vector_env(cfg, E, seed)
    spec: EnvSpec = env.spec
    replay = ReplayMemory(capacity=6 * 60, num_lanes=6, frame_shape=spec.frame_shape, frame_dtype=spec.obs_dtype,
                          frame_stack=spec.frame_stack, n_step=1, gamma=0.9)
    builder = ChunkBuilder(T, E, spec)
    generator = torch.Generator().manual_seed(seed)
    seen_obs, seen_actions, seen_rewards, seen_terminated, starts = [], [], [], [], 0
    obs, first = env.reset(), torch.ones(E, dtype=torch.bool)
    try:
        for _ in range(chunks * T):
            actions = torch.randint(spec.num_actions, (E,), generator=generator)
            result = env.step(actions)
            builder.add(obs, first, actions, result)
            seen_obs.append(obs.clone())
            seen_actions.append(actions)
            seen_rewards.append(result.reward)
            seen_terminated.append(result.terminated)
            obs, first = result.obs, result.first
            starts += int(first.sum())
            if builder.full:
                replay.extend(3, builder.take(0, 0, 0))
    finally:
        env.close()
    seen_obs = torch.stack(seen_obs)       # [ticks, E, 4, 84, 84]: the stack each action was chosen on
    ticks = chunks * T
    assert torch.stack(seen_terminated).any() and starts >= 6, "lives were lost and episodes restarted"

    checked = 0
    low, count = replay._sample_range()
    assert count[:3].tolist() == [0, 0, 0]
    for lane in range(3, 6):
        e = lane - 3
        for k in range(int(low[lane]), int(low[lane] + count[lane])):
            if replay.first[lane, (k + 1) % replay.lane_capacity]:
                continue   # k -> k+1 was a reset, not a transition
            batch = replay._gather(torch.tensor([lane]), torch.tensor([k]))
            assert torch.equal(batch.obs[0], seen_obs[k, e]), (lane, k)
            assert torch.equal(batch.next_obs[0], seen_obs[k + 1, e]), (lane, k)
            assert batch.actions[0] == seen_actions[k][e] and batch.returns[0] == seen_rewards[k][e]
            assert batch.discounts[0] == (0.0 if seen_terminated[k][e] else 0.9)
            checked += 1
    assert low[3] >= ticks - replay.lane_capacity and checked > 150

    # sample() draws only real transitions, and only from the lanes that hold data.
    successors = collections.defaultdict(set)   # the same stack can recur, e.g. right after a reset
    for k in range(ticks - 1):
        for e in range(E):
            if not replay_first_of(seen_obs, k + 1, e):
                successors[seen_obs[k, e].numpy().tobytes()].add(seen_obs[k + 1, e].numpy().tobytes())
    batch = replay.sample(128, torch.Generator().manual_seed(seed))
    for o, n in zip(batch.obs, batch.next_obs):
        assert n.numpy().tobytes() in successors[o.numpy().tobytes()]


def replay_first_of(seen_obs: torch.Tensor, k: int, e: int) -> bool:
    """An observation starts an episode when its stack is zero-padded (Breakout frames are never all zero)."""
    return bool((seen_obs[k, e, :3] == 0).all())


def test_sampling_an_almost_empty_memory_says_so():
    replay = ReplayMemory(capacity=100, num_lanes=1, frame_shape=(1,), frame_dtype=torch.float32, frame_stack=1)
    replay.extend(0, hand_chunk([1, 2], first=[1, 1]))   # an episode of one observation: no transition yet
    with pytest.raises(ValueError, match="no transition yet"):
        replay.sample(32)
