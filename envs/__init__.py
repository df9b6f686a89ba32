"""Environments behind one vector interface: Atari through ale-py's threaded vector env with the standard DQN
preprocessing, and classic control through gymnasium's vector API.

Everything the agent needs from a step is a `StepResult` of tensors; observations are always
`[num_envs, frame_stack, *frame_shape]`, so the newest frame of every env is `obs[:, -1]`.
"""

from envs.vector import EnvError, EnvSpec, StepResult, VectorEnv, describe_env, make_vector_env

__all__ = ["EnvError", "EnvSpec", "StepResult", "VectorEnv", "describe_env", "make_vector_env"]
