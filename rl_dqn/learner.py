"""The learner role: ingest chunks -> replay -> step() -> publish weights; metrics and checkpoints."""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import dataclasses
import json
import math
import os
import queue
import threading
import time
from pathlib import Path

import torch

from envs import EnvSpec
from rl_dqn import dqn
from rl_dqn.config import Config, to_dict
from rl_dqn.evaluate import EvalResult, Evaluator, best_path
from rl_dqn.console import duration, progress, say
from rl_dqn.metrics import Board, RateMeter
from rl_dqn.network import QNetwork, describe_precision, resolve_precision
from rl_dqn.replay import ReplayMemory
from rl_dqn.system import SystemMeter
from rl_dqn.transport import LEARNER_RANK, TransportError, collector_rank, place, worker_name
from rl_dqn.types import Ack, Chunk, Weights


class _CollectorStats:
    def __init__(self):
        self.chunks = self.env_steps = self.episodes = 0
        self.first_weights_version: int | None = None
        self.last_weights_version: int | None = None
        self.chunk_device: str | None = None   # where its chunks arrived
        self.processes = 0                      # processes that have joined in its slot
        self.senders = 0                        # processes whose chunks entered replay
        self.system: tuple[float, ...] = ()     # its newest (CPU %, memory MB, GPU memory MB)


def torch_threads(cfg: Config) -> int:
    """Intra-op threads for each of the learner's compute threads: learner.torch_threads, or the CPU cores shared
    out among them (see Learner.step())."""
    return cfg.learner.torch_threads or max(1, (os.cpu_count() or 1) // (2 if cfg.learner.overlap else 1))


class Learner:
    """Double DQN on a replay memory filled by the collectors, at a fixed replay ratio.

    The replay ratio (gradient samples per env step) is held on both sides: the learner idles while it is
    ahead of the data, and withholds its answers to chunks while it is behind, which makes the collectors wait.
    So the learning dynamics do not depend on how fast the hardware steps envs or trains.
    """

    def __init__(self, cfg: Config, spec: EnvSpec, run_dir: Path, stop: threading.Event | None = None,
                 device: torch.device | str | None = None, launched_at: float | None = None):
        self.cfg, self.spec, self.run_dir = cfg, spec, run_dir
        self.transport = None
        self.stop = stop or threading.Event()
        # Where it trains and keeps its replay: learner.device as placed on this node (a GPU when there is one).
        self.device = torch.device(device) if device is not None else \
            place(cfg, LEARNER_RANK, torch.cuda.device_count()).device
        # The config as this process runs it: network.precision resolved for its device (auto: bf16 where the device
        # computes it fast). The run folder's config.yaml and TensorBoard's hyperparameters show this one.
        precision = resolve_precision(cfg.network.precision, self.device)
        self.used_cfg = dataclasses.replace(cfg, network=dataclasses.replace(cfg.network, precision=precision))
        torch.manual_seed(cfg.run.seed)
        self.network = QNetwork.for_env(spec.obs_shape, spec.num_actions, cfg.network, self.device)
        self.target = copy.deepcopy(self.network).for_acting()
        # The fused kernel: 0.5 ms per step for the Nature CNN on 2 CPU cores against 6 ms for the default.
        self.optimizer = torch.optim.Adam(self.network.parameters(), lr=cfg.train.lr, eps=cfg.train.adam_eps,
                                          fused=True)
        t = cfg.train
        self.replay = ReplayMemory(t.replay_capacity, cfg.num_envs, spec.frame_shape, spec.obs_dtype,
                                   spec.frame_stack, replay_device=self.device, n_step=t.n_step, gamma=t.gamma,
                                   prioritized=t.prioritized, alpha=t.priority_alpha, priority_eps=t.priority_eps,
                                   initial_priority=t.initial_priority)
        self.generator = torch.Generator(self.device).manual_seed(cfg.run.seed)
        # learner.overlap: the helper thread prepares the next batch during an update (see step()).
        self._helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learner-batches") \
            if cfg.learner.overlap else None
        self._prepared: concurrent.futures.Future | None = None
        self._generator_before_prepared: torch.Tensor | None = None   # its state before the prepared batch
        self.env_steps = 0
        self.updates = 0
        self.weights_version = 0
        # Chunks are inserted in each collector's send order (RPCs may be served out of order).
        self._next_seq = [0] * cfg.num_collectors
        self._held: list[dict[int, Chunk]] = [{} for _ in range(cfg.num_collectors)]
        self._lane_sender = [-1] * cfg.num_collectors    # the process whose chunks each slot's lanes continue
        self.rejected: dict[str, int] = {}               # refused chunks by cause
        self.dropped_chunks = 0                          # chunks of a replaced process left behind by a gap
        self._waiting = collections.deque()          # deliveries whose answer is withheld
        self._chunk_env_steps = cfg.collectors.chunk_steps * cfg.env.envs_per_collector
        # What a chunk's tensors must be: field -> (shape, or None for any length, dtype).
        T, E = cfg.collectors.chunk_steps, cfg.env.envs_per_collector
        self._chunk_fields = {
            "frames": ((T, E, *spec.frame_shape), spec.obs_dtype), "actions": ((T, E), torch.int64),
            "rewards": ((T, E), torch.float32), "terminated": ((T, E), torch.bool), "first": ((T, E), torch.bool),
            "episode_returns": (None, torch.float64), "episode_lengths": (None, torch.int64)}
        if self.replay.initial_priority == "collectors":
            self._chunk_fields |= {"q_taken": ((T, E), torch.float32), "q_max": ((T, E), torch.float32)}
        # Metrics: sums since the last log line, so the update itself never waits on a host sync.
        self._loss_sum = torch.zeros((), device=self.device)
        self._q_sum = torch.zeros((), device=self.device)
        self._stat_updates = 0
        self._staleness_sum = self._staleness_count = 0
        self._returns = collections.deque(maxlen=20)
        self._collectors = [_CollectorStats() for _ in range(cfg.num_collectors)]
        self._env_meter, self._update_meter, self._byte_meter = RateMeter(), RateMeter(), RateMeter()
        self._training_meter = RateMeter()   # seconds spent in updates: its rate is the share of wall time
        # The run's clock (eval times, ETA, summary) counts from the launch (`launched_at`, time.time() when the
        # command started), or from now; a resumed run's goes on from its checkpoint's time.
        self._started = time.monotonic() - (0.0 if launched_at is None else max(time.time() - launched_at, 0.0))
        self._first_data_time: float | None = None
        self._first_data_steps = 0
        self._training_start: tuple[float, int, int] | None = None   # (when, env steps, updates)
        self._finished: float | None = None   # when the run stopped taking data and training (before the final save)
        self.board = Board(run_dir, self.used_cfg)
        self.evaluator: Evaluator | None = None
        self._next_eval = cfg.eval.every_env_steps
        self._best_eval: float | None = None
        self._eval_state: dict[str, torch.Tensor] | None = None   # the weights the evaluator is playing
        self._last_eval: tuple[float, float, int] | None = None   # mean, std, env steps
        self._eval_rounds, self._eval_round_s, self._eval_cpu_s = 0, 0.0, 0.0
        self._system = SystemMeter(self.device, gpu_utilization=True)

    # ------------------------------------------------------------------------------------------- data in

    def ingest(self, chunk: Chunk) -> None:
        """Puts a chunk into replay once every earlier chunk of its collector is in. A new process in a slot
        starts its lanes' next episodes (its first steps start episodes), so its chunks follow on from the
        chunks of the one it replaced; that one's chunks still held back by a gap are dropped and counted."""
        i = chunk.collector
        if chunk.sender != self._lane_sender[i]:
            self._lane_sender[i] = chunk.sender
            self._collectors[i].senders += 1
            self.dropped_chunks += len(self._held[i])
            self._held[i] = {}
            self._next_seq[i] = 0
        self._held[i][chunk.seq] = chunk
        while (ready := self._held[i].pop(self._next_seq[i], None)) is not None:
            self._next_seq[i] += 1
            self.replay.extend(i * self.cfg.env.envs_per_collector, ready)
            self._account(ready)

    def refusal(self, chunk) -> str | None:
        """Why a delivery cannot enter replay (None: it can): one cause per kind of bad data. The value checks
        cost one host sync per chunk."""
        cfg, spec = self.cfg, self.spec
        if not isinstance(chunk, Chunk):
            return f"not a chunk ({type(chunk).__name__})"
        if not (isinstance(chunk.collector, int) and 0 <= chunk.collector < cfg.num_collectors):
            return "unknown sender"
        standing = self.transport.sender_standing(chunk)
        if standing == "unknown":
            return "unknown sender"
        # Chunks of a process that was replaced still continue its lanes until the new process's first arrives.
        if standing == "former" and chunk.sender != self._lane_sender[chunk.collector]:
            return "from a collector process that was replaced"
        for field, (shape, dtype) in self._chunk_fields.items():
            value = getattr(chunk, field)
            if not isinstance(value, torch.Tensor):
                return f"{field} is not a tensor"
            if value.dtype != dtype:
                return f"{field} has dtype {value.dtype}, not {dtype}"
            if shape is not None and tuple(value.shape) != shape:
                return f"{field} has shape {tuple(value.shape)}, not {shape}"
        if chunk.episode_returns.dim() != 1 or chunk.episode_lengths.shape != chunk.episode_returns.shape:
            return "episode_returns and episode_lengths are not two lists of the same length"
        if not (isinstance(chunk.seq, int) and chunk.seq >= 0 and isinstance(chunk.weights_version, int)):
            return "seq or weights_version is not a count"
        if not (isinstance(chunk.system, tuple) and len(chunk.system) in (0, 3) and
                all(isinstance(v, float) and math.isfinite(v) for v in chunk.system)):
            return "system figures are not three finite numbers"
        if chunk.sender == self._lane_sender[chunk.collector] and (chunk.seq < self._next_seq[chunk.collector] or
                                                                   chunk.seq in self._held[chunk.collector]):
            return "a chunk sent twice"
        bad = torch.stack([(chunk.actions < 0).any(), (chunk.actions >= spec.num_actions).any(),
                           ~torch.isfinite(chunk.rewards).all(),
                           ~torch.isfinite(chunk.episode_returns).all().to(chunk.rewards.device)]).tolist()
        for flagged, cause in zip(bad, (f"action out of range 0..{spec.num_actions - 1}",
                                        f"action out of range 0..{spec.num_actions - 1}",
                                        "non-finite reward", "non-finite episode return")):
            if flagged:
                return cause
        return None

    def _refuse(self, delivery, cause: str) -> None:
        self.rejected[cause] = self.rejected.get(cause, 0) + 1
        if self.rejected[cause] == 1:
            sender = getattr(delivery.chunk, "collector", "?")
            say("learner", f"refused a chunk from collector {sender}: {cause} (counted in transport/rejected_chunks; "
                           f"logged once per cause)")
        # A sender that is not in the run learns so from the answer (the transport marks it).
        self.transport.acknowledge(delivery, Ack(self.env_steps, stop=False))

    def _account(self, chunk: Chunk) -> None:
        now = time.monotonic()
        if self._first_data_time is None:   # rates count from the first chunk's end (a resumed run's too)
            self._first_data_time, self._first_data_steps = now, self.env_steps + chunk.env_steps
        self.env_steps += chunk.env_steps
        self._env_meter.add(chunk.env_steps)
        self._byte_meter.add(chunk.nbytes)
        stats = self._collectors[chunk.collector]
        stats.chunk_device = str(chunk.frames.device)
        stats.chunks += 1
        stats.env_steps += chunk.env_steps
        stats.episodes += len(chunk.episode_returns)
        if stats.first_weights_version is None:
            stats.first_weights_version = chunk.weights_version
        stats.last_weights_version = chunk.weights_version
        stats.system = chunk.system or stats.system
        self._staleness_sum += self.weights_version - chunk.weights_version
        self._staleness_count += 1
        for score, length in zip(chunk.episode_returns.tolist(), chunk.episode_lengths.tolist()):
            self._returns.append(score)
            self.board.scalar("collector/episode_return", score, self.env_steps)
            self.board.scalar("collector/episode_length", length, self.env_steps)

    # ------------------------------------------------------------------------------------- replay ratio

    def _owed_samples(self) -> float:
        """Gradient samples the replay ratio asks for that have not been trained on yet."""
        if self.cfg.train.replay_ratio == 0 or self.env_steps < self.cfg.train.learning_starts:
            return 0.0
        wanted = self.cfg.train.replay_ratio * (self.env_steps - self.cfg.train.learning_starts)
        return wanted - self.updates * self.cfg.train.batch_size

    def wants_update(self) -> bool:
        return self._owed_samples() >= self.cfg.train.batch_size and self.replay.ready

    def answers_due(self) -> bool:
        """Chunks are answered unless the learner owes more than one chunk's worth of training and can train
        (below one batch it cannot, and holding answers then would stall the run)."""
        allowance = self.cfg.train.replay_ratio * self._chunk_env_steps
        return self._owed_samples() <= allowance or not self.wants_update()

    def _release_answers(self) -> None:
        while self._waiting and self.answers_due():
            self.transport.acknowledge(self._waiting.popleft(), Ack(self.env_steps, stop=False))

    # ------------------------------------------------------------------------------------------- training

    def step(self) -> None:
        """One Double DQN update on an n-step batch, drawn uniformly or by priority (then weighted by importance
        and re-prioritized by its TD errors).

        With learner.overlap the helper thread computes the online network's values of s' while this thread
        computes those of s, then samples the next batch and evaluates the target network on it while this one
        runs the backward pass and the optimizer. Each side runs whole operations on its own cores, which on a
        small CPU wastes less than splitting every operation over all of them. The helper is idle again when
        step() returns, so replay inserts, checkpoints and target refreshes never run beside it."""
        t = self.cfg.train
        if self._training_start is None:
            self._training_start = (time.monotonic(), self.env_steps, self.updates)
        batch, next_inputs, next_target = self._take_prepared() or self._prepare_batch()
        if self._helper is not None:
            next_online = self._helper.submit(self._online_values, next_inputs)
        q = self.network(batch.obs).gather(1, batch.actions[:, None]).squeeze(1)
        with torch.no_grad():
            online = next_online.result() if self._helper is not None else self._online_values(next_inputs)
            targets = dqn.double_dqn_target(batch.returns, batch.discounts, online, next_target)
        loss = dqn.td_loss(q, targets, batch.weights if t.prioritized else None)
        self.replay.update_priorities(batch.index, q.detach() - targets)   # before the next batch is drawn
        # Not across a target refresh: the prepared batch's targets would come from the old target network.
        if self._helper is not None and (self.updates + 1) % t.target_update_updates != 0:
            self._generator_before_prepared = self.generator.get_state()
            self._prepared = self._helper.submit(self._prepare_batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.network.parameters(), t.max_grad_norm)
        self.optimizer.step()
        if self._prepared is not None:
            concurrent.futures.wait([self._prepared])
        self.updates += 1
        self._update_meter.add(1)
        self._loss_sum += loss.detach()
        self._q_sum += q.detach().mean()
        self._stat_updates += 1
        if self.cfg.metrics.histogram_every_updates and self.updates % self.cfg.metrics.histogram_every_updates == 0:
            self.board.histogram("learner/q_values", q, self.env_steps)
            self.board.histogram("learner/td_errors", q - targets, self.env_steps)
        if self.updates % t.target_update_updates == 0:
            self.target.load_state_dict(self.network.state_dict())

    def _prepare_batch(self) -> tuple:
        """A batch, its next observations scaled for the networks, and the target network's values of them."""
        t = self.cfg.train
        beta = dqn.beta_schedule(self.env_steps, t.priority_beta, t.learning_starts, t.total_env_steps)
        batch = self.replay.sample(t.batch_size, self.generator, beta)
        with torch.no_grad():
            next_inputs = self.target.inputs(batch.next_obs)        # scaled once for both networks
            return batch, next_inputs, self.target(next_inputs)

    def _online_values(self, next_inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.network(next_inputs)

    def _take_prepared(self) -> tuple | None:
        prepared, self._prepared, self._generator_before_prepared = self._prepared, None, None
        return prepared.result() if prepared is not None else None

    def weights(self) -> Weights:
        """A snapshot of the online network on the learner's device, detached from the copy that keeps training
        (the transport sends it as it is, or a CPU copy to a collector it cannot reach GPU to GPU)."""
        return Weights(self.weights_version, {k: v.detach().clone() for k, v in self.network.state_dict().items()})

    def publish(self) -> None:
        if self.updates > 0:
            self.weights_version += 1
        self.transport.publish(self.weights(), self.env_steps)

    # ------------------------------------------------------------------------------------------- the loop

    def run(self, transport) -> None:
        """Trains until the collectors together reach train.total_env_steps, or until asked to stop. Collectors
        may die, hang, leave and join at any time; the run ends with an error only when none has been alive for
        cluster.join_timeout_s."""
        self.transport = transport
        precision, warning = describe_precision(self.cfg.network.precision, self.device)
        if warning is not None:
            say("learner", f"warning: {warning}")
        say("learner", f"training on {self.device} in {precision}, replay {self.cfg.train.replay_capacity:,} "
                       f"transitions in {self.cfg.num_envs} lanes, waiting for {self.cfg.num_collectors} collectors")
        self.publish()
        total = self.cfg.train.total_env_steps
        last_log = alone_since = time.monotonic()
        try:
            while not self.stop.is_set() and self.env_steps < total:
                deliveries = self.transport.receive(timeout=0 if self.wants_update() else 0.05)
                now = time.monotonic()
                for delivery in deliveries:
                    if (cause := self.refusal(delivery.chunk)) is not None:
                        self._refuse(delivery, cause)
                        continue
                    self.ingest(delivery.chunk)
                    self._waiting.append(delivery)
                self._release_answers()
                if self.wants_update():
                    self._train_one()
                self.transport.watch()
                self._follow_membership()
                if self.transport.alive:
                    alone_since = now
                elif now - alone_since > self.cfg.cluster.join_timeout_s:
                    raise TransportError(f"no collector has been in the run for cluster.join_timeout_s="
                                         f"{self.cfg.cluster.join_timeout_s:g} s")
                if self.cfg.eval.every_env_steps:
                    self._evaluate()
                if now - last_log >= self.cfg.metrics.interval_s:
                    last_log = now
                    self.log()
            # The collectors have reached the total and wait for answers that stay withheld: train what the replay
            # ratio still asks for, so that a run of N env steps gets the same updates on any hardware.
            while not self.stop.is_set() and self.wants_update():
                self._train_one()
        finally:
            self.close()

    def _follow_membership(self) -> None:
        """One line per collector that joins, leaves or is lost; `cluster/collectors_alive` after each."""
        changed = False
        while True:
            try:
                what, name, detail = self.transport.changes.get_nowait()
            except queue.Empty:
                break
            changed = True
            slot = int(name.removeprefix("collector"))
            if what == "joined":
                self._collectors[slot].processes += 1
                # The newest weights went out with the admission; it gets the next broadcasts like the others.
            say("learner", {"joined": f"{name} joined ({detail})", "left": f"{name} left",
                            "lost": f"{name} lost: {detail}; training goes on, its slot is open for a new process"
                            }[what])
        if changed:
            self.board.scalar("cluster/collectors_alive", len(self.transport.alive), self.env_steps)

    def _train_one(self) -> None:
        started = time.perf_counter()
        self.step()
        self._training_meter.add(time.perf_counter() - started)
        if self.updates % self.cfg.learner.publish_every_updates == 0:
            self.publish()
        if self.updates % self.cfg.learner.checkpoint_every_updates == 0:
            self.save_checkpoint()

    # ------------------------------------------------------------------------------------------ evaluation

    def _evaluate(self) -> None:
        """Logs a finished evaluation round, and starts one with the current weights every eval.every_env_steps
        (when the previous round is still playing, as soon as it is done)."""
        try:
            if self.evaluator is None:
                self.evaluator = Evaluator(self.cfg)
            if (result := self.evaluator.poll()) is not None:
                self._log_eval(result)
            if not self.evaluator.busy and self.env_steps >= self._next_eval:
                state = {k: v.detach().to("cpu", copy=True) for k, v in self.network.state_dict().items()}
                self.evaluator.submit(state, self.env_steps, time.monotonic() - self._started, self.weights_version)
                self._eval_state = state
                self._next_eval = self.env_steps + self.cfg.eval.every_env_steps
        except RuntimeError as e:
            say("learner", f"evaluation stopped, training goes on: {e}")
            self.cfg = dataclasses.replace(self.cfg, eval=dataclasses.replace(self.cfg.eval, every_env_steps=0))
            self._close_evaluator()

    def _log_eval(self, result: EvalResult) -> None:
        scores = torch.tensor(result.scores, dtype=torch.float64)
        mean, std = scores.mean().item(), scores.std(unbiased=False).item()
        if self._best_eval is None or mean > self._best_eval:
            self._best_eval = mean
            if self._eval_state is not None:
                self.save_best(self._eval_state, result, mean, std)
        self._last_eval = (mean, std, result.env_steps)
        self.board.scalar("eval/episode_return", mean, result.env_steps)
        self.board.scalar("eval/episode_return_std", std, result.env_steps)
        self.board.scalar("eval/best_episode_return", self._best_eval, result.env_steps)
        # When the score was known, on the run's clock (from launch, the round's play included): against env
        # steps, and as the x of score against wall time (its own chart).
        known_s = time.monotonic() - self._started
        self._eval_rounds += 1
        self._eval_round_s += result.round_s
        self._eval_cpu_s += result.round_cpu_s
        self.board.scalar("eval/time_from_launch_s", known_s, result.env_steps)
        self.board.scalar("eval/episode_return_vs_seconds", mean, int(known_s))
        self.board.scalar("eval/round_s", result.round_s, result.env_steps)
        self.board.scalar("eval/round_cpu_s", result.round_cpu_s, result.env_steps)
        if result.video is not None:
            self.board.gif("eval/video", result.video, 210, 160, result.env_steps)
        say("learner", f"eval at {result.env_steps:,} env steps (weights v{result.weights_version} of "
                       f"{duration(result.elapsed_s)}, scored by {duration(known_s)} in {result.round_s:.0f} s): "
                       f"{mean:.2f} +- {std:.2f} over {len(result.scores)} episodes")

    def _close_evaluator(self) -> None:
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None

    def close(self) -> None:
        """Final checkpoint, metrics and summary, then stop the collectors and leave. Safe to call twice."""
        if self.board is None:
            return
        self._finished = time.monotonic()
        self._close_evaluator()
        if self._helper is not None:
            self._helper.shutdown()
        try:
            self.save_checkpoint()
            self.log()
            self.write_summary()
        finally:
            self.board.close()
            self.board = None
            try:
                if self.transport is not None:
                    self.transport.stop_collectors(timeout=min(self.cfg.transport.rpc_timeout_s, 10.0))
            finally:
                if self.transport is not None:
                    self.transport.close()

    # ----------------------------------------------------------------------------------------- reporting

    def log(self) -> None:
        env_rate, update_rate = self._env_meter.rate(), self._update_meter.rate()
        board, steps = self.board, self.env_steps
        board.scalar("learner/training_percent", 100 * self._training_meter.rate(), steps)
        board.scalar("collector/env_steps_per_s", env_rate, steps)
        board.scalar("transport/recv_mb_per_s", self._byte_meter.rate() / 1e6, steps)
        board.scalar("learner/updates_per_s", update_rate, steps)
        board.scalar("learner/updates", self.updates, steps)
        board.scalar("learner/replay_size", len(self.replay), steps)
        board.scalar("transport/rejected_chunks", sum(self.rejected.values()), steps)
        if self.transport is not None:
            board.scalar("cluster/collectors_alive", len(self.transport.alive), steps)
        if self._stat_updates:
            board.scalar("learner/loss", (self._loss_sum / self._stat_updates).item(), steps)
            board.scalar("learner/q_mean", (self._q_sum / self._stat_updates).item(), steps)
            self._loss_sum.zero_()
            self._q_sum.zero_()
            self._stat_updates = 0
        held = [s.last_weights_version for s in self._collectors if s.last_weights_version is not None]
        if held:
            board.scalar("weights/version", min(held), steps)
        if self._staleness_count:
            board.scalar("weights/staleness", self._staleness_sum / self._staleness_count, steps)
            self._staleness_sum = self._staleness_count = 0
        self._log_system(steps)
        say("learner", self.progress_line(env_rate, update_rate))

    def _log_system(self, steps: int) -> None:
        """CPU, memory and GPU figures of the learner and its node, and each collector's newest from its chunks."""
        for key, value in self._system.sample().items():
            role = "learner_node" if key == "node_cpu_percent" else "learner"
            self.board.scalar(f"system/{role}/{key.removeprefix('node_')}", value, steps)
        for i, stats in enumerate(self._collectors):
            if stats.system:
                cpu, memory, gpu_memory = stats.system
                self.board.scalar(f"system/collector{i}/cpu_percent", cpu, steps)
                self.board.scalar(f"system/collector{i}/memory_mb", memory, steps)
                if gpu_memory > 0:   # it acts on a GPU
                    self.board.scalar(f"system/collector{i}/gpu_memory_mb", gpu_memory, steps)

    def progress_line(self, env_rate: float, update_rate: float) -> str:
        """`env steps 1,234/10,000 [##---] 12% ETA 3m05s | 2,345 steps/s | ...`: the ETA at the mean rate since
        training began (collecting alone, before train.learning_starts, runs faster than the rest will), or since
        data first arrived until then."""
        total, steps = self.cfg.train.total_env_steps, self.env_steps
        since = self._training_start[:2] if self._training_start is not None else \
            (self._first_data_time, self._first_data_steps)
        mean_rate = 0.0
        if since[0] is not None and (elapsed := time.monotonic() - since[0]) > 0:
            mean_rate = (steps - since[1]) / elapsed
        parts = [f"env steps {progress(steps, total, mean_rate)}", f"{env_rate:,.0f} steps/s",
                 f"{update_rate:,.1f} updates/s", f"replay {len(self.replay):,}"]
        if self._returns:
            parts.append(f"return {sum(self._returns) / len(self._returns):.1f} (last {len(self._returns)})")
        if self._last_eval is not None:
            parts.append(f"eval {self._last_eval[0]:.1f} (best {self._best_eval:.1f})")
        if self.transport is not None:
            parts.append(f"collectors {len(self.transport.alive)}/{self.cfg.num_collectors}")
        parts.append(f"weights v{self.weights_version}")
        return " | ".join(parts)

    def closing_lines(self, how: str) -> list[str]:
        """The final summary: what the run did, how it scored, where everything is."""
        wall = time.monotonic() - self._started
        rate = self.env_steps / max(wall, 1e-9)
        lines = [f"{how} after {duration(wall)}: {self.env_steps:,} env steps ({rate:,.0f}/s), "
                 f"{self.updates:,} updates, weights v{self.weights_version}"]
        if self._last_eval is not None:
            mean, std, at = self._last_eval
            lines.append(f"eval: last {mean:.2f} +- {std:.2f} (at {at:,} env steps), best {self._best_eval:.2f}")
        elif self._returns:
            lines.append(f"no evaluation ran; training episodes scored {sum(self._returns) / len(self._returns):.2f}"
                         f" (last {len(self._returns)})")
        checkpoints = sorted((self.run_dir / "checkpoints").glob("checkpoint_*.pt"))
        lines.append(f"run folder {self.run_dir}: config.yaml, summary.json, TensorBoard events "
                     f"(tensorboard --logdir {self.run_dir.parent})")
        if checkpoints:
            lines.append(f"newest checkpoint {checkpoints[-1]} (watch it: ./launch/play.sh {self.run_dir} "
                         f"--video episode.mp4; continue the run: run.resume=true run.name={self.run_dir.name})")
        if (best := best_path(self.run_dir)).is_file():
            lines.append(f"best evaluated network {best} (score {self._best_eval:.2f}; ./launch/play.sh "
                         f"{self.run_dir} --best)")
        return lines

    def _identity(self) -> dict:
        """What a checkpoint needs besides weights to be played: the run's config and its env's shapes."""
        return {"config": to_dict(self.cfg),
                "spec": {"obs_shape": list(self.spec.obs_shape), "obs_dtype": str(self.spec.obs_dtype),
                         "num_actions": self.spec.num_actions}}

    def checkpoint_state(self) -> dict:
        return {
            "network": self.network.state_dict(), "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "counters": {"env_steps": self.env_steps, "updates": self.updates,
                         "weights_version": self.weights_version},
            # Schedules (epsilon, beta) follow from env_steps; these are the rest of the run's clock.
            "schedule": {"next_eval": self._next_eval, "best_eval": self._best_eval,
                         "elapsed_s": time.monotonic() - self._started},
            # A resumed run draws the batch that this one has prepared but not trained on yet.
            "generator": self._generator_before_prepared if self._prepared is not None
            else self.generator.get_state(),
        } | self._identity()

    def save_best(self, state: dict[str, torch.Tensor], result: EvalResult, mean: float, std: float) -> Path:
        """checkpoints/best.pt: the network that scored best in the run's evaluations so far (the weights that
        round played, not the newer ones trained since), with its score. DQN's score can fall again after a peak,
        so this is the one to keep (`./launch/play.sh runs/<name> --best`); it holds no optimizer state."""
        path = best_path(self.run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        _save_atomically({"network": state, "eval": {"mean": mean, "std": std, "episodes": len(result.scores),
                                                     "env_steps": result.env_steps,
                                                     "weights_version": result.weights_version}}
                         | self._identity(), path)
        return path

    def save_checkpoint(self) -> Path:
        """Writes checkpoints/checkpoint_<updates>.pt, and with learner.checkpoint_replay the replay contents
        next to it, each atomically (a temporary file, flushed to disk, then renamed): a crash at any point leaves
        the previous checkpoint whole. Keeps the newest `learner.keep_checkpoints`, and the newest replay only."""
        folder = self.run_dir / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        state = self.checkpoint_state()
        if self.cfg.learner.checkpoint_replay:
            replay_path = folder / f"replay_{self.updates:09d}.pt"
            _save_atomically(self.replay.state_dict(), replay_path)
            state["replay_file"] = replay_path.name
        path = folder / f"checkpoint_{self.updates:09d}.pt"
        _save_atomically(state, path)
        for old in sorted(folder.glob("checkpoint_*.pt"))[:-self.cfg.learner.keep_checkpoints]:
            old.unlink()
        for old in sorted(folder.glob("replay_*.pt"))[:-1]:
            old.unlink()
        return path

    def restore(self, path: Path) -> None:
        """Continues from a checkpoint: network, target, optimizer, counters, schedules, the sampling generator
        and, when the checkpoint has them, the replay contents."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.network.load_state_dict(state["network"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        counters, schedule = state["counters"], state["schedule"]
        self.env_steps, self.updates = counters["env_steps"], counters["updates"]
        self.weights_version = counters["weights_version"]
        self._next_eval, self._best_eval = schedule["next_eval"], schedule["best_eval"]
        self._started -= schedule["elapsed_s"]
        self._take_prepared()
        if state["generator"].numel() == self.generator.get_state().numel():
            self.generator.set_state(state["generator"])
        else:
            # A checkpoint of a run on the other kind of device (a CPU generator's state is 5,056 bytes, a CUDA
            # one's 16): sampling goes on from a seed of the run and its updates instead of the saved stream.
            self.generator.manual_seed(self.cfg.run.seed * 1_000_003 + self.updates)
            say("learner", f"the checkpoint's sampling state is not a {self.device.type} generator's: the run goes "
                           f"on with batches drawn from a new seed")
        replay = state.get("replay_file")
        if replay is not None:
            self.replay.load_state_dict(torch.load(path.parent / replay, map_location="cpu", weights_only=True))
        self.board.resume_at(self.env_steps)
        say("learner", f"resumed from {path.name}: {self.env_steps:,} env steps, {self.updates:,} updates, "
                       f"weights v{self.weights_version}, replay {len(self.replay):,} transitions"
                       + ("" if replay is not None else " (the checkpoint holds no replay)"))

    def write_summary(self) -> None:
        """runs/<name>/summary.json: what the run did, for people and scripts (benchmarks, tests). Its rates end
        where the run stopped training; `wall_s` includes the final checkpoint, which takes seconds with a large
        replay."""
        now = time.monotonic()
        end = self._finished or now
        summary = {
            "env_steps": self.env_steps, "updates": self.updates, "weights_version": self.weights_version,
            "wall_s": now - self._started, "replay_size": len(self.replay),
            "env_steps_per_s": None, "env_steps_per_s_training": None,
            "recent_returns": list(self._returns), "best_eval_return": self._best_eval,
            "collectors": {worker_name(collector_rank(i)): vars(s) for i, s in enumerate(self._collectors)},
            "lost_collectors": dict(self.transport.lost) if self.transport is not None else {},
            "rejected_chunks": dict(self.rejected), "dropped_chunks": self.dropped_chunks,
            # Where this process's time went, in seconds on the run's clock: start-up until the first chunk and the
            # first update, time spent in updates, and the evaluation rounds' play (wall and CPU, in their process).
            "first_data_s": None if self._first_data_time is None else self._first_data_time - self._started,
            "training_start_s": None if self._training_start is None else self._training_start[0] - self._started,
            "updating_s": self._training_meter.total,
            "eval_rounds": self._eval_rounds, "eval_round_s": self._eval_round_s, "eval_round_cpu_s": self._eval_cpu_s,
        }
        if self._first_data_time is not None and end > self._first_data_time:
            summary["env_steps_per_s"] = (self.env_steps - self._first_data_steps) / (end - self._first_data_time)
        if self._training_start is not None and end > self._training_start[0]:
            since, steps, updates = self._training_start
            summary["env_steps_per_s_training"] = (self.env_steps - steps) / (end - since)
            summary["updates_per_s_training"] = (self.updates - updates) / (end - since)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))


def _save_atomically(state: dict, path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)

