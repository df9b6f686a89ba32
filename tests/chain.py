"""A learner on a tiny known problem, for the tests of its parts: chunks of a two-step chain whose values are known,
and a learner configured for them."""

from __future__ import annotations

from pathlib import Path

import torch

from envs import EnvSpec
from rl_dqn.config import load_config
from rl_dqn.learner import Learner
from rl_dqn.types import Chunk

ROOT = Path(__file__).resolve().parents[1]
SPEC = EnvSpec((1, 4), torch.float32, 2)
S0, S1, S2 = [1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]


def chain_chunk(collector: int, seq: int, episodes: int, envs: int = 2, coin: bool = False) -> Chunk:
    """Episodes of a two-step chain in every env: s0 -> s1 (reward 0), s1 -> s2 (reward 1, terminal), then the
    env's reset step from the final observation s2. Whatever the action, Q(s1, .) = 1 and Q(s0, .) = gamma. With
    `coin`, s1's reward is +1 or -1 with even odds in each episode and env: a return with a spread, whose
    expectation is 0."""
    frames = torch.tensor([S0, S1, S2] * episodes).view(3 * episodes, 1, 4).expand(-1, envs, -1).clone()
    T = 3 * episodes
    actions = torch.randint(2, (T, envs), generator=torch.Generator().manual_seed(seq))
    rewards = torch.tensor([0.0, 1.0, 0.0] * episodes).view(T, 1).expand(-1, envs).clone()
    if coin:
        tosses = torch.rand(episodes, envs, generator=torch.Generator().manual_seed(1000 * collector + seq))
        rewards[1::3] = torch.where(tosses < 0.5, -1.0, 1.0)
    terminated = torch.tensor([False, True, False] * episodes).view(T, 1).expand(-1, envs).clone()
    first = torch.tensor([True, False, False] * episodes).view(T, 1).expand(-1, envs).clone()
    return Chunk(collector, seq, 0, frames, actions, rewards, terminated, first,
                 torch.ones(episodes * envs, dtype=torch.float64), torch.full((episodes * envs,), 2),
                 torch.zeros(T, envs), torch.zeros(T, envs))   # the collector's Q-values: an untrained network


def make_learner(tmp_path, *overrides) -> Learner:
    """A learner of the chain on the CPU, also on a machine with a GPU (an override of learner.device moves it)."""
    cfg = load_config(ROOT / "configs/cartpole.yaml", [
        "run.name=t", "learner.device=cpu", "collectors.count=2", "env.envs_per_collector=2",
        "collectors.chunk_steps=30", "train.replay_capacity=1200", "train.learning_starts=64", "train.batch_size=32",
        "train.gamma=0.9", "train.lr=0.001", "train.target_update_updates=20", *overrides])
    return Learner(cfg, SPEC, tmp_path)
