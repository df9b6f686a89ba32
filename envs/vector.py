"""Vectorized Atari and classic-control envs with DQN preprocessing, returning tensors."""

from __future__ import annotations

import warnings
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from envs.config import EnvConfig

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import ale_py
    from ale_py.vector_env import AtariVectorEnv

gym.register_envs(ale_py)
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)   # no banner from every process


class EnvError(ValueError):
    """An env id that does not exist or cannot be used here."""


class EnvSpec(NamedTuple):
    obs_shape: tuple[int, ...]     # (frame_stack, *frame_shape)
    obs_dtype: torch.dtype
    num_actions: int

    @property
    def frame_shape(self) -> tuple[int, ...]:
        return self.obs_shape[1:]

    @property
    def frame_stack(self) -> int:
        return self.obs_shape[0]


class StepResult(NamedTuple):
    obs: torch.Tensor          # [E, S, *frame] observation after the step; a reset observation where `first`
    reward: torch.Tensor       # [E] float32 training reward: the raw reward, or its sign where clipping is on
    raw_reward: torch.Tensor   # [E] float32 change of the game score
    terminated: torch.Tensor   # [E] bool training terminal: game over, or a lost life where configured
    truncated: torch.Tensor    # [E] bool the episode hit its time limit (not terminal: the target bootstraps)
    game_over: torch.Tensor    # [E] bool the game itself ended (terminated, not by a lost life)
    first: torch.Tensor        # [E] bool `obs` starts an episode: this step was the env's reset (reward 0)

    @property
    def episode_end(self) -> torch.Tensor:
        """The episode ended on this step; the next step resets the env and its action is ignored."""
        return self.game_over | self.truncated


class VectorEnv:
    """E envs stepped together. Autoreset is next-step: after an episode ends, the following step resets the env
    and returns its first observation with `first` set, so an episode's final observation is never lost."""

    num_envs: int
    spec: EnvSpec
    screen: np.ndarray | None = None   # env 0's game screen, RGB [H, W, 3], where the env keeps it

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Starts every env anew, from `seed` (then kept for later resets) or the seed the env was made with."""
        raise NotImplementedError

    def step(self, actions: torch.Tensor) -> StepResult:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def _gym_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    try:
        return gym.spec(env_id)
    except gym.error.Error as e:
        raise EnvError(f"unknown environment {env_id!r}: {e}") from None


def describe_env(cfg: EnvConfig) -> EnvSpec:
    """Observation shape, dtype and action count of `cfg.id`, checked without stepping it."""
    spec = _gym_spec(cfg.id)
    if str(spec.entry_point).startswith("ale_py"):
        if not cfg.is_atari or spec.version != 5:
            raise EnvError(f"{cfg.id}: give Atari games as ALE/<Game>-v5 (frame skip, sticky actions and the "
                           f"time limit come from env.frame_skip, env.sticky_action_prob and env.max_episode_frames)")
        if spec.kwargs.get("obs_type", "rgb") != "rgb":
            raise EnvError(f"{cfg.id}: only screen observations are supported, not {spec.kwargs['obs_type']}")
    env = _make(cfg.id)
    space, actions = env.observation_space, env.action_space
    env.close()
    if not isinstance(actions, gym.spaces.Discrete):
        raise EnvError(f"{cfg.id} has {actions} actions; DQN needs Discrete ones")
    if cfg.is_atari:
        return EnvSpec((cfg.frame_stack, 84, 84), torch.uint8, int(actions.n))
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise EnvError(f"{cfg.id} observes {space}; non-Atari envs need a flat Box observation (a vector)")
    return EnvSpec((1, *space.shape), torch.float32, int(actions.n))


def _make(env_id: str) -> gym.Env:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return gym.make(env_id)
    except Exception as e:  # noqa: BLE001 - a missing optional dependency, a broken registration
        raise EnvError(f"{env_id} cannot be created here: {str(e).strip().splitlines()[0]}") from None


def make_vector_env(cfg: EnvConfig, num_envs: int, seed: int, screen: bool = False) -> VectorEnv:
    """Atari for `ALE/...` ids, otherwise any gymnasium env with a Box observation and Discrete actions.
    `screen`: env 0's game screen in colour is kept after every reset and step (`VectorEnv.screen`), for videos."""
    if cfg.is_atari:
        return AtariVector(cfg, num_envs, seed, screen)
    if screen:
        raise EnvError(f"videos are recorded from Atari games (ALE/...), not from {cfg.id}")
    return ClassicVector(cfg, num_envs, seed)


class AtariVector(VectorEnv):
    """ale-py's threaded C++ vector env (faster than gymnasium's vector API over AtariPreprocessing: see
    docs/benchmarks.md, Throughput), with the DQN preprocessing of Mnih et al. 2015 / Machado et al. 2018: up to
    `noop_max` no-ops at reset, `frame_skip` with max-pooling of the last two frames, 84x84 grayscale,
    `frame_stack` frames zero-padded at an episode's start, FIRE at reset where the game needs it, sticky actions.

    The emulator runs without its own reward clipping or episodic-life handling: raw scores and true game ends
    come from ALE, and the training signals (clipped reward, terminal on a lost life) are derived here.
    """

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int, screen: bool = False):
        self.cfg, self.num_envs, self._seed = cfg, num_envs, self._emulator_seed(seed, num_envs)
        self._env = self._emulator(cfg, num_envs, (84, 84), grayscale=True, stack=cfg.frame_stack)
        self.spec = EnvSpec((cfg.frame_stack, 84, 84), torch.uint8, int(self._env.single_action_space.n))
        self._lives = np.zeros(num_envs, dtype=np.int32)
        self._ended = np.zeros(num_envs, dtype=bool)
        # The screen: env 0 played a second time, in colour at full size. Same game, seed and actions make the same
        # episode (the emulator is deterministic; each step checks that the score agrees).
        self._mirror = self._emulator(cfg, 1, (210, 160), grayscale=False, stack=1) if screen else None
        self.screen: np.ndarray | None = None   # [210, 160, 3] uint8 RGB, with `screen`

    @staticmethod
    def _emulator(cfg: EnvConfig, num_envs: int, size: tuple[int, int], grayscale: bool, stack: int):
        return AtariVectorEnv(
            _gym_spec(cfg.id).kwargs["game"], num_envs, num_threads=min(cfg.threads_per_collector, num_envs),
            frameskip=cfg.frame_skip, stack_num=stack, img_height=size[0], img_width=size[1], grayscale=grayscale,
            maxpool=True, noop_max=cfg.noop_max, repeat_action_probability=cfg.sticky_action_prob,
            max_num_frames_per_episode=cfg.max_episode_frames, reward_clipping=False, episodic_life=False,
            use_fire_reset=True)

    @staticmethod
    def _emulator_seed(seed: int, num_envs: int) -> int:
        """`seed` as ale-py takes it: env k is seeded with seed + k, a C int, so seeds are taken modulo the range
        that leaves room for every env (a run's envs derive theirs from run.seed, its env index and restarts)."""
        return seed % (2**31 - num_envs)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        self._seed = self._seed if seed is None else self._emulator_seed(seed, self.num_envs)
        obs, info = self._env.reset(seed=self._seed)
        self._lives = info["lives"]
        self._ended[:] = False
        if self._mirror is not None:
            self.screen = self._mirror.reset(seed=self._seed)[0][0, -1]
        return torch.from_numpy(obs)

    def step(self, actions: torch.Tensor) -> StepResult:
        obs, raw_reward, game_over, truncated, info = self._env.step(actions.numpy())
        if self._mirror is not None:
            screens, mirror_reward, *_ = self._mirror.step(actions[:1].numpy())
            if mirror_reward[0] != raw_reward[0]:
                raise EnvError("the recorded screen no longer shows env 0's game (the two emulators diverged)")
            self.screen = screens[0, -1]
        first = self._ended
        life_lost = (info["lives"] < self._lives) & ~first
        self._lives = info["lives"]
        self._ended = game_over | truncated
        reward = np.sign(raw_reward) if self.cfg.clip_rewards else raw_reward
        terminated = game_over | life_lost if self.cfg.terminal_on_life_loss else game_over
        return StepResult(torch.from_numpy(obs), torch.from_numpy(reward.astype(np.float32)),
                          torch.from_numpy(raw_reward.astype(np.float32)), torch.from_numpy(terminated),
                          torch.from_numpy(truncated), torch.from_numpy(game_over), torch.from_numpy(first))

    def close(self) -> None:
        self._env.close()
        if self._mirror is not None:
            self._mirror.close()


class ClassicVector(VectorEnv):
    """gymnasium's synchronous vector env (next-step autoreset) for small envs such as CartPole; observations
    get a stack axis of 1."""

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int):
        self.cfg, self.num_envs, self._seed = cfg, num_envs, seed
        self.spec = describe_env(cfg)
        self._env = gym.make_vec(cfg.id, num_envs=num_envs, vectorization_mode="sync",
                                 vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP})
        self._ended = np.zeros(num_envs, dtype=bool)

    def _obs(self, obs: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(obs, dtype=np.float32)).unsqueeze(1)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        self._seed = self._seed if seed is None else seed
        obs, _ = self._env.reset(seed=self._seed)
        self._ended[:] = False
        return self._obs(obs)

    def step(self, actions: torch.Tensor) -> StepResult:
        obs, raw_reward, terminated, truncated, _ = self._env.step(actions.numpy())
        first = self._ended
        self._ended = terminated | truncated
        raw_reward = raw_reward.astype(np.float32)
        reward = np.sign(raw_reward) if self.cfg.clip_rewards else raw_reward
        return StepResult(self._obs(obs), torch.from_numpy(reward), torch.from_numpy(raw_reward),
                          torch.from_numpy(terminated), torch.from_numpy(truncated), torch.from_numpy(terminated),
                          torch.from_numpy(first))

    def close(self) -> None:
        self._env.close()
