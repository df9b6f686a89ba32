"""Replay memory: stacks rebuilt from frames stored once equal the stacks the env produced, across episode ends
(lost lives, time limits) and ring wrap-around."""

from __future__ import annotations

import collections

import pytest
import torch

from envs import EnvSpec, make_vector_env
from rl_dqn.collector import ChunkBuilder
from rl_dqn.config import EnvConfig
from rl_dqn.replay import ReplayMemory
from rl_dqn.types import Chunk


def hand_chunk(values, first, terminated=None, actions=None) -> Chunk:
    """One env, frames of shape (1,) holding readable values."""
    T = len(values)
    return Chunk(0, 0, 0, torch.tensor(values, dtype=torch.float32).view(T, 1, 1),
                 torch.tensor(actions or list(range(T))).view(T, 1), torch.ones(T, 1),
                 torch.tensor(terminated or [False] * T, dtype=torch.bool).view(T, 1),
                 torch.tensor(first, dtype=torch.bool).view(T, 1),
                 torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.int64))


def test_stacks_by_hand():
    # Ticks 0..7 hold frames 1..8. An episode starts at 0 and another at 4: tick 3 was the first episode's
    # final observation, and 3 -> 4 was the env's reset, not a transition.
    replay = ReplayMemory(capacity=100, num_lanes=1, frame_shape=(1,), frame_dtype=torch.float32, frame_stack=3)
    replay.extend(0, hand_chunk([1, 2, 3, 4, 5, 6, 7, 8], first=[1, 0, 0, 0, 1, 0, 0, 0],
                                terminated=[0, 0, 1, 0, 0, 0, 0, 0]))
    batch = replay._gather(torch.tensor([0, 0, 0]), torch.tensor([1, 2, 5]))
    assert batch.obs.flatten(1).tolist() == [[0, 1, 2], [1, 2, 3], [0, 5, 6]]
    assert batch.next_obs.flatten(1).tolist() == [[1, 2, 3], [2, 3, 4], [5, 6, 7]]
    assert batch.terminated.tolist() == [False, True, False]
    assert batch.actions.tolist() == [1, 2, 5]
    # Transitions: 0,1,2 and 4,5,6; not 3 (reset) and not 7 (no successor yet).
    assert len(replay) == 7
    generator = torch.Generator().manual_seed(0)
    drawn = {tuple(o) for _ in range(100) for o in replay.sample(7, generator).obs.flatten(1).tolist()}
    assert drawn == {(0, 0, 1), (0, 1, 2), (1, 2, 3), (0, 0, 5), (0, 5, 6), (5, 6, 7)}


def test_a_chunk_bridges_into_the_next_one():
    replay = ReplayMemory(capacity=100, num_lanes=1, frame_shape=(1,), frame_dtype=torch.float32, frame_stack=2)
    replay.extend(0, hand_chunk([1, 2, 3], first=[1, 0, 0]))
    assert len(replay) == 2
    replay.extend(0, hand_chunk([4, 5], first=[0, 0]))
    batch = replay._gather(torch.tensor([0]), torch.tensor([2]))
    assert batch.obs.flatten().tolist() == [2, 3] and batch.next_obs.flatten().tolist() == [3, 4]


def test_memory_per_transition_is_one_frame_plus_scalars():
    replay = ReplayMemory(capacity=1000, num_lanes=4, frame_shape=(84, 84), frame_dtype=torch.uint8, frame_stack=4)
    stored = sum(t.nbytes for t in (replay.frames, replay.actions, replay.rewards, replay.terminated, replay.first))
    assert stored / 1000 == 84 * 84 + 14


@pytest.mark.parametrize("seed", [0, 1])
def test_replay_stacks_equal_the_env_stacks(seed):
    """Breakout with a short time limit: lost lives, truncations and resets in every lane; the ring (60 steps per
    lane) wraps more than twice; the envs sit in lanes 3..5 of 6, as a second collector's would."""
    cfg = EnvConfig(id="ALE/Breakout-v5", sticky_action_prob=0.0, max_episode_frames=240, noop_max=10)
    E, T, chunks = 3, 10, 16
    env = make_vector_env(cfg, E, seed)
    spec: EnvSpec = env.spec
    replay = ReplayMemory(capacity=6 * 60, num_lanes=6, frame_shape=spec.frame_shape, frame_dtype=spec.obs_dtype,
                          frame_stack=spec.frame_stack)
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
            assert batch.actions[0] == seen_actions[k][e] and batch.rewards[0] == seen_rewards[k][e]
            assert batch.terminated[0] == seen_terminated[k][e]
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
    replay.extend(0, hand_chunk([1, 2], first=[1, 0]))
    with pytest.raises(ValueError, match="fewer than a batch"):
        replay.sample(32)
