"""Chunks into replay: each delivery checked before it can enter, each collector's chunks put in in its send order,
and the replay-ratio gate that decides when a chunk is answered (a collector waits for its answers). It calls
nothing back: admit() says what happened to a delivery, release() which answers are due."""

from __future__ import annotations

import collections
import math
from typing import Iterator, NamedTuple

import torch

from envs import EnvSpec
from rl_dqn.config import Config
from rl_dqn.replay import ReplayMemory
from rl_dqn.transport import Standing
from rl_dqn.types import Chunk


class Admission(NamedTuple):
    """What became of a delivery."""
    refused: str | None      # why it cannot enter replay (None: it was taken)
    first_of_cause: bool     # the first delivery refused for that cause (worth a line)
    entered: list[Chunk]     # the chunks that entered replay because of it, in order: it (unless refused) and
                             # those held behind it


class Intake:
    """Where each delivery goes: refused, into replay, or held until the chunks its collector sent before it have
    arrived. `env_steps` counts the env steps in replay."""

    def __init__(self, cfg: Config, spec: EnvSpec, replay: ReplayMemory):
        self.cfg, self.spec, self.replay = cfg, spec, replay
        self.env_steps = 0                               # env steps in chunks put into replay
        self.rejected: dict[str, int] = {}               # refused chunks by cause
        self.dropped_chunks = 0                          # chunks of a replaced process left behind by a gap
        # Chunks are inserted in each collector's send order (RPCs may be served out of order).
        self._next_seq = [0] * cfg.num_collectors
        self._held: list[dict[int, Chunk]] = [{} for _ in range(cfg.num_collectors)]
        self._lane_sender = [-1] * cfg.num_collectors    # the process whose chunks each slot's lanes continue
        # Per slot, the seqs of each process's chunks that were refused: its later chunks go in without them.
        self._gaps: list[dict[int, set[int]]] = [{} for _ in range(cfg.num_collectors)]
        self._after_gap = [False] * cfg.num_collectors   # the next chunk into a slot's lanes follows a refused one
        self._waiting = collections.deque()              # deliveries whose answer is withheld
        self._chunk_env_steps = cfg.collectors.chunk_steps * cfg.env.envs_per_collector
        # What a chunk's tensors must be: field -> (shape, or None for any length, dtype).
        T, E = cfg.collectors.chunk_steps, cfg.env.envs_per_collector
        self._fields = {
            "frames": ((T, E, *spec.frame_shape), spec.obs_dtype), "actions": ((T, E), torch.int64),
            "rewards": ((T, E), torch.float32), "terminated": ((T, E), torch.bool), "first": ((T, E), torch.bool),
            "episode_returns": (None, torch.float64), "episode_lengths": (None, torch.int64)}
        if replay.initial_priority == "collectors":
            self._fields |= {"q_taken": ((T, E), torch.float32), "q_max": ((T, E), torch.float32)}

    # ------------------------------------------------------------------------------------------ data in

    def admit(self, chunk, standing: Standing) -> Admission:
        """Checks a delivery whose sender stands as `standing` in the run (the transport says), and puts it into
        replay, or holds it, as ingest() does."""
        if (cause := self.refusal(chunk, standing)) is not None:
            self.rejected[cause] = self.rejected.get(cause, 0) + 1
            return Admission(cause, self.rejected[cause] == 1, self._leave_out(chunk, standing))
        return Admission(None, False, self.ingest(chunk))

    def _leave_out(self, chunk, standing: Standing) -> list[Chunk]:
        """A refused chunk of the process whose chunks its slot's lanes continue, or are about to (the newest of
        its slot): that process's later chunks go into replay without it, where they would wait for it forever.
        Returns those that entered now, held behind it (see _put_in_order)."""
        if not (isinstance(chunk, Chunk) and isinstance(chunk.collector, int)
                and 0 <= chunk.collector < self.cfg.num_collectors and isinstance(chunk.seq, int) and chunk.seq >= 0):
            return []
        i = chunk.collector
        if chunk.sender != self._lane_sender[i] and standing is not Standing.NEWEST:
            return []
        self._gaps[i].setdefault(chunk.sender, set()).add(chunk.seq)
        return self._put_in_order(i) if chunk.sender == self._lane_sender[i] else []

    def refusal(self, chunk, standing: Standing) -> str | None:
        """Why a delivery cannot enter replay (None: it can): one cause per kind of bad data. The value checks
        cost one host sync per chunk."""
        cfg, spec = self.cfg, self.spec
        if not isinstance(chunk, Chunk):
            return f"not a chunk ({type(chunk).__name__})"
        if not (isinstance(chunk.collector, int) and 0 <= chunk.collector < cfg.num_collectors):
            return "unknown sender"
        if standing is Standing.UNKNOWN:
            return "unknown sender"
        # Chunks of a process that was replaced still continue its lanes until the new process's first arrives.
        if standing is Standing.FORMER and chunk.sender != self._lane_sender[chunk.collector]:
            return "from a collector process that was replaced"
        for field, (shape, dtype) in self._fields.items():
            value = getattr(chunk, field)
            if not isinstance(value, torch.Tensor):
                return f"{field} is not a tensor"
            if value.layout is not torch.strided or value.is_meta:
                return f"{field} is not a dense tensor holding data"
            if value.dtype != dtype:
                return f"{field} has dtype {value.dtype}, not {dtype}"
            if shape is not None and tuple(value.shape) != shape:
                return f"{field} has shape {tuple(value.shape)}, not {shape}"
        if chunk.episode_returns.dim() != 1 or chunk.episode_lengths.shape != chunk.episode_returns.shape:
            return "episode_returns and episode_lengths are not two lists of the same length"
        epsilons = chunk.episode_epsilons
        if epsilons is not None and not (isinstance(epsilons, torch.Tensor) and epsilons.dtype == torch.float32
                                         and epsilons.shape == chunk.episode_returns.shape):
            return "episode_epsilons is not None or a float32 list as long as episode_returns"
        if not (isinstance(chunk.seq, int) and chunk.seq >= 0 and isinstance(chunk.weights_version, int)):
            return "seq or weights_version is not a count"
        if not (isinstance(chunk.system, tuple) and len(chunk.system) in (0, 3) and
                all(isinstance(v, float) and math.isfinite(v) for v in chunk.system)):
            return "system figures are not three finite numbers"
        if chunk.sender == self._lane_sender[chunk.collector] and (chunk.seq < self._next_seq[chunk.collector] or
                                                                   chunk.seq in self._held[chunk.collector]):
            return "a chunk sent twice"
        device = chunk.rewards.device
        checks = [((chunk.actions < 0) | (chunk.actions >= spec.num_actions)).any(),
                  f"action out of range 0..{spec.num_actions - 1}",
                  ~torch.isfinite(chunk.rewards).all(), "non-finite reward",
                  ~torch.isfinite(chunk.episode_returns).all().to(device), "non-finite episode return",
                  (chunk.episode_lengths < 0).any().to(device), "negative episode length"]
        if chunk.frames.is_floating_point():
            checks += [~torch.isfinite(chunk.frames).all().to(device), "non-finite frame"]
        if "q_taken" in self._fields:   # a collector's Q-values become initial priorities: one NaN poisons sampling
            checks += [~(torch.isfinite(chunk.q_taken).all() & torch.isfinite(chunk.q_max).all()).to(device),
                       "non-finite Q-value"]
        if epsilons is not None:
            checks += [~((epsilons >= 0) & (epsilons <= 1)).all().to(device), "episode epsilon outside 0..1"]
        flags = torch.stack(checks[0::2]).tolist()
        return next((cause for flagged, cause in zip(flags, checks[1::2]) if flagged), None)

    def ingest(self, chunk: Chunk) -> list[Chunk]:
        """Puts a checked chunk into replay once every earlier chunk of its collector is in; returns the chunks that
        entered now (none while it waits for an earlier one). A new process in a slot starts its lanes' next
        episodes (its first steps start episodes), so its chunks follow on from the chunks of the one it replaced;
        that one's chunks still held back by a gap are dropped and counted. A chunk that was refused is passed over
        once the chunk after it arrives, which starts new episodes in its lanes."""
        i = chunk.collector
        if chunk.sender != self._lane_sender[i]:
            self._lane_sender[i] = chunk.sender
            self.dropped_chunks += len(self._held[i])
            self._held[i] = {}
            self._next_seq[i] = 0
            self._after_gap[i] = False
            self._gaps[i] = {chunk.sender: self._gaps[i].get(chunk.sender, set())}   # the replaced one's go
        self._held[i][chunk.seq] = chunk
        return self._put_in_order(i)

    def _put_in_order(self, i: int) -> list[Chunk]:
        """Puts slot `i`'s held chunks into replay while the next in its sender's order is there, passing over
        those refused once the chunk right after them is there (until then their place stays open: a good chunk
        sent again under a refused one's seq takes it); returns those that entered."""
        refused = self._gaps[i].get(self._lane_sender[i], set())
        entered = []
        while True:
            if (ready := self._held[i].pop(self._next_seq[i], None)) is not None:
                if self._after_gap[i]:
                    # The steps before it were refused: its first step starts each of its lanes' next episode,
                    # as a new process's does (the previous chunk's last step ends a truncated one).
                    ready = ready._replace(first=ready.first.clone())
                    ready.first[0] = True
                    self._after_gap[i] = False
                self.replay.extend(i * self.cfg.env.envs_per_collector, ready)
                self.env_steps += ready.env_steps
                entered.append(ready)
            elif self._next_seq[i] in refused:
                following = self._next_seq[i] + 1
                while following in refused:
                    following += 1
                if following not in self._held[i]:
                    return entered
                self._after_gap[i] = True
                self._next_seq[i] = following
                continue
            else:
                return entered
            self._next_seq[i] += 1

    # ------------------------------------------------------------------------------------- replay ratio

    def owed_samples(self, updates: int) -> float:
        """Gradient samples the replay ratio asks for that `updates` have not trained on yet."""
        t = self.cfg.train
        if t.replay_ratio == 0 or self.env_steps < t.learning_starts:
            return 0.0
        return t.replay_ratio * (self.env_steps - t.learning_starts) - updates * t.batch_size

    def wants_update(self, updates: int) -> bool:
        return self.owed_samples(updates) >= self.cfg.train.batch_size and self.replay.ready

    def _answers_due(self, updates: int) -> bool:
        """Chunks are answered unless the learner owes more than one chunk's worth of training and can train
        (below one batch it cannot, and holding answers then would stall the run)."""
        allowance = self.cfg.train.replay_ratio * self._chunk_env_steps
        return self.owed_samples(updates) <= allowance or not self.wants_update(updates)

    def hold(self, delivery) -> None:
        """Keeps a delivery's answer until the replay ratio lets it go (release())."""
        self._waiting.append(delivery)

    def release(self, updates: int) -> Iterator:
        """The held deliveries whose answers are due now, oldest first."""
        while self._waiting and self._answers_due(updates):
            yield self._waiting.popleft()
