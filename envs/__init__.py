"""Environments behind one vector interface: Atari through ale-py's threaded vector env with the standard DQN
preprocessing, and classic control through gymnasium's vector API.

Everything the agent needs from a step is a `StepResult` of tensors; observations are always
`[num_envs, frame_stack, *frame_shape]`, so the newest frame of every env is `obs[:, -1]`.

`EnvConfig` (envs.config) is the env section of a run's config. This package imports nothing from rl_dqn.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from envs.config import EnvConfig

if TYPE_CHECKING:
    from envs.vector import EnvError, EnvSpec, StepResult, VectorEnv, describe_env, make_vector_env

__all__ = ["EnvConfig", "EnvError", "EnvSpec", "StepResult", "VectorEnv", "describe_env", "make_vector_env"]


def __getattr__(name: str):
    # envs.vector (torch, gymnasium, ale-py) loads on first use, so that reading a config (rl_dqn.config imports
    # envs.config) does not pay for the emulator: https://peps.python.org/pep-0562/
    if name in __all__:
        return getattr(importlib.import_module("envs.vector"), name)
    raise AttributeError(f"module 'envs' has no attribute {name!r}")
