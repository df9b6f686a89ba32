"""The env section of a run's config: a frozen dataclass whose checks name the `env.*` key at fault.

It lives here, beside the code that reads it, so that envs imports nothing from rl_dqn (envs sits below the agent);
rl_dqn.config takes `EnvConfig` and `ConfigError` from here and loads the section from YAML with the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class ConfigError(ValueError):
    """A config key with a value that is not allowed (or a key that does not exist)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


def require(ok: bool, key: str, message: str) -> None:
    """A config check: ConfigError(key, message) unless `ok`."""
    if not ok:
        raise ConfigError(key, message)


def game_of(env_id: str) -> str:
    """The game of an env id: `ALE/Qbert-v5` -> `Qbert`, `CartPole-v1` -> `CartPole`."""
    return env_id.split("/")[-1].rsplit("-v", 1)[0]


@dataclass(frozen=True)
class EnvConfig:
    id: str = "ALE/Pong-v5"
    """gymnasium id: `ALE/<Game>-v5` for Atari, or a classic-control id such as `CartPole-v1`"""
    envs_per_collector: int = 8
    """environments each collector steps together as one vector"""
    threads_per_collector: int = 1
    """threads stepping one collector's Atari vector (ale-py's AtariVectorEnv)"""
    frame_skip: int = 4
    """emulator frames per agent step, max-pooled over the last two (Atari)"""
    frame_stack: int = 4
    """84x84 grayscale frames per observation (Atari)"""
    noop_max: int = 30
    """at most this many no-op agent steps at the start of an episode (Atari)"""
    sticky_action_prob: float = 0.25
    """probability that the emulator repeats the previous action on each frame (Atari; 0.25 is ALE v5's)"""
    max_episode_frames: int = 108_000
    """episodes are truncated after this many emulator frames (Atari; 108,000 frames = 30 minutes of play)"""
    terminal_on_life_loss: bool = True
    """a lost life is a terminal state for the TD target; the game itself goes on (Atari)"""
    clip_rewards: bool = True
    """train on the sign of each reward; reported returns stay the raw game score"""

    def __post_init__(self):
        require(self.id != "", "env.id", "must name a gymnasium environment, e.g. ALE/Pong-v5 or CartPole-v1")
        # gymnasium's own form of an id (gymnasium.envs.registration's ENV_ID_RE): no spaces or other characters
        require(re.fullmatch(r"(?:[\w:-]+/)?[\w:.-]+?(?:-v\d+)?", self.id) is not None, "env.id",
                 f"must be a gymnasium id such as ALE/Pong-v5 or CartPole-v1 (letters, digits and _:.-/), "
                 f"got {self.id!r}")
        require(self.envs_per_collector >= 1, "env.envs_per_collector", f"must be >= 1, got {self.envs_per_collector}")
        require(self.threads_per_collector >= 1, "env.threads_per_collector",
                 f"must be >= 1, got {self.threads_per_collector}")
        require(self.frame_skip >= 1, "env.frame_skip", f"must be >= 1, got {self.frame_skip}")
        require(self.frame_stack >= 1, "env.frame_stack", f"must be >= 1, got {self.frame_stack}")
        require(self.noop_max >= 0, "env.noop_max", f"must be >= 0, got {self.noop_max}")
        require(0.0 <= self.sticky_action_prob < 1.0, "env.sticky_action_prob",
                 f"must be in [0, 1), got {self.sticky_action_prob}")
        require(self.max_episode_frames >= self.frame_skip, "env.max_episode_frames",
                 f"must be >= env.frame_skip ({self.frame_skip}), got {self.max_episode_frames}")

    @property
    def is_atari(self) -> bool:
        return self.id.startswith("ALE/")
