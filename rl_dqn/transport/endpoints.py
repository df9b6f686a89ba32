"""What the roles may use of their transport: one Protocol per endpoint, and the values that cross the seam. The
RPC endpoints (rpc.py) satisfy them; so can an in-memory one (a test drives a Collector that way)."""

from __future__ import annotations

import enum
import queue
from typing import NamedTuple, Protocol, runtime_checkable

from rl_dqn.types import Ack, Chunk, Weights


class Standing(enum.Enum):
    """Where the process that sent a chunk stands in the run."""
    NEWEST = "newest"     # the newest process admitted to its slot (alive, or dropped for a hang and not replaced)
    FORMER = "former"     # a process admitted to its slot before the newest
    UNKNOWN = "unknown"   # no process the run admitted


class Membership(enum.Enum):
    JOINED = "joined"     # a process joined a slot (detail: which process of its slot)
    LEFT = "left"         # it said goodbye
    LOST = "lost"         # it died or hung (detail: why)
    OUTSIDE = "outside"   # a process asked for a slot the run does not have (detail: why it was refused)


class Change(NamedTuple):
    """A change in the run's membership, for the learner to report."""
    what: Membership
    name: str             # the slot's name, e.g. collector3
    detail: str


class Delivery(Protocol):
    """A chunk as it reached the learner; answered with LearnerEndpoint.acknowledge()."""
    chunk: Chunk


@runtime_checkable
class LearnerEndpoint(Protocol):
    """The learner's side: chunks in, answers and weights out, and who is in the run."""
    alive: set[str]                      # collectors in the run
    lost: dict[str, str]                 # collector name -> why it was last dropped
    changes: queue.SimpleQueue[Change]   # membership changes not yet reported

    def receive(self, timeout: float) -> list[Delivery]:
        """The chunks that arrived, waiting up to `timeout` s for the first."""

    def acknowledge(self, delivery: Delivery, ack: Ack) -> None:
        """Answers a chunk: its collector may send another."""

    def sender_standing(self, chunk: Chunk) -> Standing: ...

    def publish(self, weights: Weights, env_steps: int | None = None) -> int:
        """Sends weights to every collector without waiting for a slow one; returns how many it went to."""

    def watch(self) -> None:
        """Pings collectors not heard from lately and drops those that do not answer."""

    def stop_collectors(self, timeout: float) -> None:
        """Tells every collector that the run is over, and answers the chunks still held."""

    def close(self) -> None: ...


@runtime_checkable
class CollectorEndpoint(Protocol):
    """A collector's side: chunks out (at most collectors.max_chunks_in_flight unanswered), weights in."""
    env_steps_at_join: int               # where the run stood when this process joined

    @property
    def stop_requested(self) -> bool:
        """The learner said the run is over."""

    def wait_weights(self, timeout: float) -> Weights | None:
        """Blocks until the first weights arrive; None if the run or this process stops first."""

    def poll_weights(self) -> Weights | None:
        """The newest weights not yet taken, or None."""

    def send(self, chunk: Chunk) -> Ack | None:
        """Sends a chunk, first waiting for the oldest answer while too many are unanswered; returns the newest
        answer so far."""

    def close(self) -> None: ...
