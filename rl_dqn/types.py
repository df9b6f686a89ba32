"""The objects that cross a process boundary: a chunk of transitions, its acknowledgement, a weights snapshot."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Chunk(NamedTuple):
    """`T` consecutive vector steps of one collector's `E` envs, each new frame carried once.

    Entry `[t, e]` describes env `e` at one step: the newest frame of the observation the agent acted on, the
    action, and what the step returned. The full observation stack is rebuilt from the frames of earlier entries,
    so a chunk never ships a frame twice. An observation flagged `first` starts an episode: frames before it are
    not part of its stack (the env pads with zeros), and the step before it was the env's reset, not a transition.
    """

    collector: int
    """collector index in the run (0-based); decides the chunk's replay lanes and its envs' epsilons"""
    seq: int
    """chunks this collector sent before this one; the learner inserts a collector's chunks in this order"""
    weights_version: int
    """version of the newest weights that chose actions in this chunk (of its last step; weights adopted during the
    chunk chose only the steps after)"""
    frames: torch.Tensor
    """[T, E, *frame_shape] newest frame of each observation acted on (uint8 for Atari)"""
    actions: torch.Tensor
    """[T, E] int64 actions taken"""
    rewards: torch.Tensor
    """[T, E] float32 training rewards (clipped where configured)"""
    terminated: torch.Tensor
    """[T, E] bool: the step reached a terminal state for training (game over, or a lost life where configured)"""
    first: torch.Tensor
    """[T, E] bool: the observation acted on starts an episode"""
    episode_returns: torch.Tensor
    """[K] float64 raw game scores of the K episodes that ended in this chunk"""
    episode_lengths: torch.Tensor
    """[K] int64 agent steps of those episodes"""
    q_taken: torch.Tensor | None = None
    """[T, E] float32 the collector's Q(s, a) for the action taken (for Ape-X initial priorities, with
    train.initial_priority: collectors; None otherwise)"""
    q_max: torch.Tensor | None = None
    """[T, E] float32 the collector's max_a Q(s, a)"""
    sender: int = -1
    """RPC id of the process that sent it (its transport sets it): tells the process now filling the slot from one
    it replaced"""
    system: tuple[float, ...] = ()
    """the sending process's (CPU percent, resident memory MB, GPU memory MB) over its latest metrics interval,
    for TensorBoard; GPU memory is 0 for a collector that acts on the CPU; empty before its first sample"""
    episode_epsilons: torch.Tensor | None = None
    """[K] float32 the epsilon each of the K episodes was played at (the highest its env acted at in it), in the
    order of episode_returns; None where the sender does not say"""

    @property
    def env_steps(self) -> int:
        return self.actions.numel()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self if isinstance(t, torch.Tensor))


class Ack(NamedTuple):
    """The learner's answer to a chunk. It is sent when the learner wants more data, which throttles collectors."""

    env_steps: int
    """env steps the learner has received from the whole run"""
    stop: bool
    """the run is over: the collector stops"""
    dropped: bool = False
    """the learner dropped this process from the run (it took it for dead, or another process took its slot): it
    exits, so that its launcher can start a new one"""


class Weights(NamedTuple):
    """A versioned snapshot of the learner's Q-network."""

    version: int
    """1 + the number of broadcasts before this one; the weights a learner starts from are version 0"""
    state: dict[str, torch.Tensor]
    """the network's state_dict, detached from the learner's training copy"""
