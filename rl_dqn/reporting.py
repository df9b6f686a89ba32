"""What the learner tells people: TensorBoard, the console lines and summary.json, on the run's clock. It takes plain
records of what happened (ChunkArrived, numbers, names) and knows nothing of the parts that report them."""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import NamedTuple

import torch

from rl_dqn import checkpoints, system
from rl_dqn.config import Config
from rl_dqn.console import duration, progress, say
from rl_dqn.metrics import Board, RateMeter
from rl_dqn.system import SystemMeter


class Counters(NamedTuple):
    """Where the run stands, as the learner's parts count it."""
    env_steps: int
    updates: int
    weights_version: int
    replay_size: int
    rejected: dict[str, int]      # refused chunks by cause
    dropped_chunks: int
    alive: int | None             # collectors in the run (None: no transport yet)
    lost: dict[str, str]          # collectors lost, with why


class ChunkArrived(NamedTuple):
    """A chunk that entered replay, as the report counts it."""
    collector: int                   # its slot
    sender: int                      # the process that sent it
    env_steps: int
    nbytes: int
    device: str                      # where its tensors arrived
    weights_version: int             # of the weights it was collected with
    episode_returns: list[float]     # raw scores of the episodes that ended in it
    episode_lengths: list[int]
    system: tuple[float, ...]        # its collector's newest (CPU %, memory MB, GPU memory MB), or ()
    episode_epsilons: list[float] | None = None   # the epsilon each episode was played at, where the chunk says


class _CollectorStats:
    def __init__(self):
        self.chunks = self.env_steps = self.episodes = 0
        self.first_weights_version: int | None = None
        self.last_weights_version: int | None = None
        self.chunk_device: str | None = None   # where its chunks arrived
        self.processes = 0                      # processes that have joined in its slot
        self.senders = 0                        # processes whose chunks entered replay
        self.system: tuple[float, ...] = ()     # its newest (CPU %, memory MB, GPU memory MB)


class Report:
    """The run's clock counts from the launch (`launched_at`, time.time() when the command started), or from now;
    a resumed run's goes on from its checkpoint's time (resume_at())."""

    def __init__(self, cfg: Config, run_dir: Path, device: torch.device, collectors: list[str],
                 launched_at: float | None = None):
        self.cfg, self.run_dir = cfg, run_dir
        self.collector_names = collectors   # each slot's name, e.g. collector0
        self.board = Board(run_dir, cfg)
        self.started = time.monotonic() - (0.0 if launched_at is None else max(time.time() - launched_at, 0.0))
        self.best_eval: float | None = None
        self.last_eval: tuple[float, float, int] | None = None   # mean, std, env steps
        self._returns = collections.deque(maxlen=20)
        # (env steps, score) of the training episodes played at metrics.return_epsilon, over the latest
        # metrics.return_epsilon_env_steps
        self._returns_at_epsilon: collections.deque[tuple[int, float]] = collections.deque()
        self._resumed_env_steps = 0   # where this process took the run over from a checkpoint
        self._collectors = [_CollectorStats() for _ in range(cfg.num_collectors)]
        self._sender = [-1] * cfg.num_collectors     # the process whose chunks each slot's last chunk came from
        self._env_meter, self._update_meter, self._byte_meter = RateMeter(), RateMeter(), RateMeter()
        self._training_meter = RateMeter()   # seconds spent in updates: its rate is the share of wall time
        self._staleness_sum = self._staleness_count = 0
        self._first_data: tuple[float, int] | None = None        # (when, env steps after the first chunk)
        self._training_start: tuple[float, int, int] | None = None   # (when, env steps, updates)
        self._finished: float | None = None   # when the run stopped taking data and training (before the final save)
        self._eval_rounds, self._eval_round_s, self._eval_cpu_s = 0, 0.0, 0.0
        self._resumed_at_s = 0.0   # the run's clock when this process took it over from a checkpoint
        self._system = SystemMeter(device, gpu_utilization=True)

    def write_run_info(self, argv: list[str], resumed: bool) -> None:
        """runs/<name>/run.json: the code (commit) and the machine the run ran on, and its command; a resumed run
        keeps what its first process wrote and adds each resumption's under "resumed"."""
        path = self.run_dir / "run.json"
        this = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": argv, **system.code_version(),
                "machine": system.machine()}
        info = None
        if resumed and path.is_file():
            try:
                info = json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError):
                pass
            if not isinstance(info, dict):   # kept, not overwritten: it may still be read by hand
                path.replace(aside := path.with_name("run.json.unreadable"))
                say("learner", f"{path} is not a JSON object: kept as {aside.name}, and a new run.json begun")
                info = None
        if info is None:
            info = this | {"resumed": []}
        else:
            info.setdefault("resumed", []).append(this)
        path.write_text(json.dumps(info, indent=2))

    def elapsed(self) -> float:
        """Seconds on the run's clock."""
        return time.monotonic() - self.started

    def resume_at(self, env_steps: int, elapsed_s: float, best_eval: float | None) -> None:
        self.started -= elapsed_s
        self._resumed_at_s = elapsed_s
        self._resumed_env_steps = env_steps
        self.best_eval = best_eval
        self.board.resume_at(env_steps)

    # ------------------------------------------------------------------------------------------- events

    def chunk(self, chunk: ChunkArrived, env_steps: int, weights_version: int) -> None:
        """A chunk entered replay; `env_steps` counts it; the learner's weights are at `weights_version`."""
        now = time.monotonic()
        if self._first_data is None:   # rates count from the first chunk's end (a resumed run's too)
            self._first_data = (now, env_steps)
        self._env_meter.add(chunk.env_steps)
        self._byte_meter.add(chunk.nbytes)
        stats = self._collectors[chunk.collector]
        if chunk.sender != self._sender[chunk.collector]:
            self._sender[chunk.collector] = chunk.sender
            stats.senders += 1
        stats.chunk_device = chunk.device
        stats.chunks += 1
        stats.env_steps += chunk.env_steps
        stats.episodes += len(chunk.episode_returns)
        if stats.first_weights_version is None:
            stats.first_weights_version = chunk.weights_version
        stats.last_weights_version = chunk.weights_version
        stats.system = chunk.system or stats.system
        self._staleness_sum += weights_version - chunk.weights_version
        self._staleness_count += 1
        for score, length in zip(chunk.episode_returns, chunk.episode_lengths):
            self._returns.append(score)
            self.board.scalar("collector/episode_return", score, env_steps)
            self.board.scalar("collector/episode_length", length, env_steps)
        m = self.cfg.metrics
        if m.return_epsilon is not None and chunk.episode_epsilons is not None:
            # Within 1%: epsilons come as float32, and a schedule's end may not be hit exactly.
            for score, epsilon in zip(chunk.episode_returns, chunk.episode_epsilons):
                if abs(epsilon - m.return_epsilon) <= 0.01 * m.return_epsilon:
                    self._returns_at_epsilon.append((env_steps, score))
                    self.board.scalar("collector/episode_return_at_epsilon", score, env_steps)
            while self._returns_at_epsilon and \
                    self._returns_at_epsilon[0][0] <= env_steps - m.return_epsilon_env_steps:
                self._returns_at_epsilon.popleft()

    def refused(self, collector, cause: str) -> None:
        say("learner", f"refused a chunk from collector {collector}: {cause} (counted in transport/rejected_chunks; "
                       f"logged once per cause)")

    def updated(self, seconds: float, env_steps: int, updates: int, q: torch.Tensor, targets: torch.Tensor) -> None:
        """Update number `updates`, which took `seconds`, with its batch's Q(s, a) and TD targets (read only for a
        histogram); the first one starts the training clock."""
        if self._training_start is None:
            self._training_start = (time.monotonic() - seconds, env_steps, updates - 1)
        self._update_meter.add(1)
        self._training_meter.add(seconds)
        every = self.cfg.metrics.histogram_every_updates
        if every and updates % every == 0:
            self.board.histogram("learner/q_values", q, env_steps)
            self.board.histogram("learner/td_errors", q - targets, env_steps)

    def membership(self, what: str, name: str, slot: int, detail: str) -> None:
        """One line per collector that `what` ("joined", "left", "lost", or "outside": a process refused a slot
        the run does not have) in `slot`."""
        if what == "joined":
            self._collectors[slot].processes += 1
        say("learner", {"joined": f"{name} joined ({detail})", "left": f"{name} left",
                        "lost": f"{name} lost: {detail}; training goes on, its slot is open for a new process",
                        "outside": f"refused a process asking to join as {name}: {detail}"}[what])

    def collectors_alive(self, alive: int, env_steps: int) -> None:
        self.board.scalar("cluster/collectors_alive", alive, env_steps)

    def evaluated(self, env_steps: int, elapsed_s: float, weights_version: int, scores: list[float],
                  video: bytes | None, round_s: float, round_cpu_s: float) -> tuple[float, float, bool]:
        """Logs an evaluation round: the scores of weights version `weights_version`, taken at `env_steps` and
        `elapsed_s` on the run's clock, the round's play (wall and CPU seconds) and its video. Returns its mean and
        std score, and whether it is the run's best so far."""
        values = torch.tensor(scores, dtype=torch.float64)
        mean, std = values.mean().item(), values.std(unbiased=False).item()
        best = self.best_eval is None or mean > self.best_eval
        if best:
            self.best_eval = mean
        self.last_eval = (mean, std, env_steps)
        self.board.scalar("eval/episode_return", mean, env_steps)
        self.board.scalar("eval/episode_return_std", std, env_steps)
        self.board.scalar("eval/best_episode_return", self.best_eval, env_steps)
        # When the score was known, on the run's clock (from launch, the round's play included): against env
        # steps, and as the x of score against wall time (its own chart).
        known_s = self.elapsed()
        self._eval_rounds += 1
        self._eval_round_s += round_s
        self._eval_cpu_s += round_cpu_s
        self.board.scalar("eval/time_from_launch_s", known_s, env_steps)
        self.board.scalar("eval/episode_return_vs_seconds", mean, int(known_s))
        self.board.scalar("eval/round_s", round_s, env_steps)
        self.board.scalar("eval/round_cpu_s", round_cpu_s, env_steps)
        self.board.scalar("eval/episodes", len(scores), env_steps)
        if video is not None:
            self.board.gif("eval/video", video, 210, 160, env_steps)
        say("learner", f"eval at {env_steps:,} env steps (weights v{weights_version} of "
                       f"{duration(elapsed_s)}, scored by {duration(known_s)} in {round_s:.0f} s): "
                       f"{mean:.2f} +- {std:.2f} over {len(scores)} episodes"
                       + (f" (below eval.screen_score {self.cfg.eval.screen_score:g}: the round stops there)"
                          if len(scores) < self.cfg.eval.episodes else ""))
        return mean, std, best

    def finish(self) -> None:
        """The run stopped taking data and training: its rates end here (the final save comes after)."""
        self._finished = time.monotonic()

    # -------------------------------------------------------------------------------------- periodic

    def log(self, counters: Counters, loss_and_q: tuple[float, float] | None, lr: float) -> None:
        """Every metrics.interval_s: the scalars, the system figures and the console's progress line."""
        env_rate, update_rate = self._env_meter.rate(), self._update_meter.rate()
        board, steps = self.board, counters.env_steps
        board.scalar("learner/training_percent", 100 * self._training_meter.rate(), steps)
        board.scalar("collector/env_steps_per_s", env_rate, steps)
        board.scalar("transport/recv_mb_per_s", self._byte_meter.rate() / 1e6, steps)
        board.scalar("learner/updates_per_s", update_rate, steps)
        board.scalar("learner/updates", counters.updates, steps)
        board.scalar("learner/replay_size", counters.replay_size, steps)
        board.scalar("transport/rejected_chunks", sum(counters.rejected.values()), steps)
        if counters.alive is not None:
            board.scalar("cluster/collectors_alive", counters.alive, steps)
        if loss_and_q is not None:
            board.scalar("learner/loss", loss_and_q[0], steps)
            board.scalar("learner/q_mean", loss_and_q[1], steps)
            board.scalar("learner/lr", lr, steps)
        held = [s.last_weights_version for s in self._collectors if s.last_weights_version is not None]
        if held:
            board.scalar("weights/version", min(held), steps)
        if self._staleness_count:
            board.scalar("weights/staleness", self._staleness_sum / self._staleness_count, steps)
            self._staleness_sum = self._staleness_count = 0
        self._log_system(steps)
        say("learner", self.progress_line(counters, env_rate, update_rate))

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

    def progress_line(self, counters: Counters, env_rate: float, update_rate: float) -> str:
        """`env steps 1,234/10,000 [##---] 12% ETA 3m05s | 2,345 steps/s | ...`: the ETA at the mean rate since
        training began (collecting alone, before train.learning_starts, runs faster than the rest will), or since
        data first arrived until then."""
        total, steps = self.cfg.train.total_env_steps, counters.env_steps
        since = self._training_start[:2] if self._training_start is not None else self._first_data
        mean_rate = 0.0
        if since is not None and (elapsed := time.monotonic() - since[0]) > 0:
            mean_rate = (steps - since[1]) / elapsed
        parts = [f"env steps {progress(steps, total, mean_rate)}", f"{env_rate:,.0f} steps/s",
                 f"{update_rate:,.1f} updates/s", f"replay {counters.replay_size:,}"]
        if self._returns:
            parts.append(f"return {sum(self._returns) / len(self._returns):.1f} (last {len(self._returns)})")
        if self.last_eval is not None:
            parts.append(f"eval {self.last_eval[0]:.1f} (best {self.best_eval:.1f})")
        if counters.alive is not None:
            parts.append(f"collectors {counters.alive}/{self.cfg.num_collectors}")
        parts.append(f"weights v{counters.weights_version}")
        return " | ".join(parts)

    # ------------------------------------------------------------------------------------------ the end

    def closing_lines(self, how: str, counters: Counters) -> list[str]:
        """The final summary: what the run did, how it scored, where everything is."""
        wall = self.elapsed()
        rate = counters.env_steps / max(wall, 1e-9)
        lines = [f"{how} after {duration(wall)}: {counters.env_steps:,} env steps ({rate:,.0f}/s), "
                 f"{counters.updates:,} updates, weights v{counters.weights_version}"]
        if self.last_eval is not None:
            mean, std, at = self.last_eval
            lines.append(f"eval: last {mean:.2f} +- {std:.2f} (at {at:,} env steps), best {self.best_eval:.2f}")
        elif self._returns:
            lines.append(f"no evaluation ran; training episodes scored {sum(self._returns) / len(self._returns):.2f}"
                         f" (last {len(self._returns)})")
        if (at := self.returns_at_epsilon(counters.env_steps)) is not None and at["episodes"]:
            lines.append(f"training episodes at epsilon {at['epsilon']:g} scored {at['mean']:.2f} from "
                         f"{at['from_env_steps']:,} env steps on ({at['episodes']} episodes)")
        lines.append(f"run folder {self.run_dir}: config.yaml, summary.json, TensorBoard events "
                     f"(tensorboard --logdir {self.run_dir.parent})")
        if found := checkpoints.all_of(self.run_dir):
            video = " --video episode.mp4" if self.cfg.env.is_atari else ""   # videos are of Atari screens
            lines.append(f"newest checkpoint {found[-1]} (watch it: ./launch/play.sh {self.run_dir}{video}; "
                         f"continue the run: run.resume=true run.name={self.run_dir.name})")
        if (best := checkpoints.best_path(self.run_dir)).is_file():
            score = f"score {self.best_eval:.2f}; " if self.best_eval is not None else ""
            lines.append(f"best evaluated network {best} ({score}./launch/play.sh {self.run_dir} --best)")
        return lines

    def returns_at_epsilon(self, env_steps: int) -> dict | None:
        """The mean score of the training episodes played at metrics.return_epsilon that ended within the last
        metrics.return_epsilon_env_steps of `env_steps` (None for the mean when there were none), or None where
        metrics.return_epsilon is null. `from_env_steps` is where the window starts: no earlier than this
        process's resumption, since a checkpoint does not keep the episodes."""
        m = self.cfg.metrics
        if m.return_epsilon is None:
            return None
        start = max(env_steps - m.return_epsilon_env_steps, self._resumed_env_steps, 0)
        scores = [score for at, score in self._returns_at_epsilon if at > start]
        return {"epsilon": m.return_epsilon, "env_steps": m.return_epsilon_env_steps, "from_env_steps": start,
                "episodes": len(scores), "mean": sum(scores) / len(scores) if scores else None}

    def write_summary(self, counters: Counters, ended: str | None) -> None:
        """runs/<name>/summary.json: what the run did, for people and scripts (benchmarks, tests). Its rates end
        where the run stopped training; `wall_s` includes the final checkpoint, which takes seconds with a large
        replay. `ended` says how this process's run ended: "total_env_steps" or "stop_score" (the run is complete),
        "signal" (SIGINT or SIGTERM), "diverged" (the weights became NaN or infinite), "error" (e.g. no collector
        for cluster.join_timeout_s), or None (the learner was closed without running)."""
        now = time.monotonic()
        end = self._finished or now
        summary = {
            "ended": ended, "env_steps": counters.env_steps, "updates": counters.updates,
            "weights_version": counters.weights_version, "wall_s": now - self.started,
            "replay_size": counters.replay_size, "env_steps_per_s": None, "env_steps_per_s_training": None,
            "recent_returns": list(self._returns), "best_eval_return": self.best_eval,
            "returns_at_epsilon": self.returns_at_epsilon(counters.env_steps),
            "collectors": {name: vars(s) for name, s in zip(self.collector_names, self._collectors)},
            "lost_collectors": dict(counters.lost),
            "rejected_chunks": dict(counters.rejected), "dropped_chunks": counters.dropped_chunks,
            # Where this process's time went, in seconds on the run's clock: start-up until the first chunk and the
            # first update, time spent in updates, and the evaluation rounds' play (wall and CPU, in their process).
            # A resumed run's process took over at resumed_at_s, so its share of the clock is wall_s - resumed_at_s.
            "resumed_at_s": self._resumed_at_s,
            "first_data_s": None if self._first_data is None else self._first_data[0] - self.started,
            "training_start_s": None if self._training_start is None else self._training_start[0] - self.started,
            "updating_s": self._training_meter.total,
            "eval_rounds": self._eval_rounds, "eval_round_s": self._eval_round_s, "eval_round_cpu_s": self._eval_cpu_s,
        }
        if self._first_data is not None and end > self._first_data[0]:
            summary["env_steps_per_s"] = (counters.env_steps - self._first_data[1]) / (end - self._first_data[0])
        if self._training_start is not None and end > self._training_start[0]:
            since, steps, updates = self._training_start
            summary["env_steps_per_s_training"] = (counters.env_steps - steps) / (end - since)
            summary["updates_per_s_training"] = (counters.updates - updates) / (end - since)
        # Written whole or not at all: a full disk leaves the summary an earlier process wrote (a resumed run's).
        checkpoints.write_bytes_atomically(self.run_dir / "summary.json", json.dumps(summary, indent=2).encode())

    def close(self) -> None:
        self.board.close()
