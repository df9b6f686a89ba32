"""The learner role: chunks -> replay -> updates -> weights, in one loop. Its parts know nothing of the role or of
each other; this module wires them:

- `Trainer` (trainer.py): the networks, the optimizer, the replay memory and its sampling, step();
- `Intake` (intake.py): checks each delivered chunk, puts chunks into replay in their send order, and holds the
  replay ratio by withholding answers;
- `Report` (reporting.py): TensorBoard, the console lines and summary.json, on the run's clock;
- `checkpoints` (checkpoints.py): the files a run keeps, and how they are written;
- an `Evaluator` process (evaluate.py) that plays the current weights every eval.every_env_steps.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from envs import EnvSpec
from rl_dqn import checkpoints
from rl_dqn.config import Config, to_dict
from rl_dqn.console import StartupClock, first_line, say
from rl_dqn.evaluate import EvalResult, Evaluator
from rl_dqn.intake import Intake
from rl_dqn.network import describe_precision, resolve_precision
from rl_dqn.replay import bytes_needed
from rl_dqn.reporting import ChunkArrived, Counters, Report
from rl_dqn.trainer import Trainer, Update
from rl_dqn.transport import (LEARNER_RANK, LearnerEndpoint, Membership, TransportError, collector_rank, place,
                              slot_of, worker_name)
from rl_dqn.types import Ack, Chunk

__all__ = ["Learner", "TrainingDiverged"]

BURST_S = 0.005   # the longest the loop trains before it looks at the transport again


def next_round(env_steps: int, every_env_steps: int) -> int:
    """The env steps at which the evaluation round after one started at `env_steps` is due: the next multiple of
    eval.every_env_steps."""
    return (env_steps // every_env_steps + 1) * every_env_steps


class TrainingDiverged(Exception):
    """The online network's weights are no longer finite: the run stops before they are published, evaluated or
    saved, and its newest checkpoint stays the last one trained before. (Not a RuntimeError, which the evaluation's
    handler takes for a failed evaluator.)"""


class Learner:
    """Double DQN on a replay memory filled by the collectors, at a fixed replay ratio.

    The replay ratio (gradient samples per env step) is held on both sides: the learner idles while it is
    ahead of the data, and withholds its answers to chunks while it is behind, which makes the collectors wait.
    So the learning dynamics do not depend on how fast the hardware steps envs or trains.
    """

    def __init__(self, cfg: Config, spec: EnvSpec, run_dir: Path, stop: threading.Event | None = None,
                 device: torch.device | str | None = None, launched_at: float | None = None,
                 startup: StartupClock | None = None):
        self.cfg, self.spec, self.run_dir = cfg, spec, run_dir
        self.transport: LearnerEndpoint | None = None
        self.stop = stop or threading.Event()
        # Where it trains and keeps its replay: learner.device as placed on this node (a GPU when there is one).
        self.device = torch.device(device) if device is not None else \
            place(cfg, LEARNER_RANK, torch.cuda.device_count()).device
        # network.precision as this process computes (auto: bf16 where its device computes it fast).
        self.precision = resolve_precision(cfg.network.precision, self.device)
        # Where the time to the first update goes: the role's clock (marked from its first step) or a new one.
        self.startup = startup or StartupClock(launched_at)
        self.trainer = Trainer(cfg, spec, self.device)
        self.startup.mark(f"replay and networks on {self.device}")
        self.report = Report(self.config_as_run(), run_dir, self.device,
                             [worker_name(collector_rank(i)) for i in range(cfg.num_collectors)], launched_at)
        self.intake = Intake(cfg, spec, self.trainer.replay)
        self.weights_version = 0
        self.evaluating = cfg.eval.every_env_steps > 0   # until the evaluator fails
        self.evaluator: Evaluator | None = None
        self.next_eval = cfg.eval.every_env_steps   # a multiple of it: see _evaluate()
        self.last_round_env_steps = -1   # the env steps of the round last started (this process)
        self.eval_state: dict[str, torch.Tensor] | None = None   # the weights the evaluator is playing
        # The evaluation that reached eval.stop_score, which ends the run: {"eval": its mean score, "stop_score",
        # "env_steps"}; kept in the checkpoints, so that a resume knows how the run ended.
        self.stop_score_reached: dict | None = None
        # How run() ended, for summary.json: "total_env_steps", "stop_score", "signal", "diverged" or "error"
        # (None: not run).
        self.ended: str | None = None
        self.unsaved: str | None = None   # why the newest checkpoint could not be written, until one is
        # Told the bytes written, about once a second, while a checkpoint is written (see checkpoints.save).
        self.saving: Callable[[int], None] | None = None
        self._closed = False

    def config_as_run(self) -> Config:
        """The config as this process runs it, network.precision resolved for its device: what the run folder's
        config.yaml and TensorBoard's hyperparameters show."""
        return dataclasses.replace(self.cfg, network=dataclasses.replace(self.cfg.network, precision=self.precision))

    @property
    def reached_stop_score(self) -> bool:
        """An evaluation reached eval.stop_score: the run ends."""
        return self.stop_score_reached is not None

    def counters(self) -> Counters:
        transport = self.transport
        return Counters(self.intake.env_steps, self.trainer.updates, self.weights_version, len(self.trainer.replay),
                        self.intake.rejected, self.intake.dropped_chunks,
                        None if transport is None else len(transport.alive),
                        {} if transport is None else transport.lost)

    # ------------------------------------------------------------------------------------------- the loop

    def run(self, transport: LearnerEndpoint) -> None:
        """Trains until the collectors together reach train.total_env_steps, an evaluation reaches eval.stop_score,
        or until asked to stop. Collectors may die, hang, leave and join at any time; the run ends with an error only
        when none has been alive for cluster.join_timeout_s."""
        self.transport = transport
        intake, trainer = self.intake, self.trainer
        precision, warning = describe_precision(self.cfg.network.precision, self.device)
        if warning is not None:
            say("learner", f"warning: {warning}")
        say("learner", f"training on {self.device} in {precision}, replay {self.cfg.train.replay_capacity:,} "
                       f"transitions in {self.cfg.num_envs} lanes, waiting for {self.cfg.num_collectors} collectors")
        self.startup.mark("joined")
        total = self.cfg.train.total_env_steps
        first_chunk_at, first_update_at = intake.env_steps, trainer.updates   # (a resumed run's are not 0)
        failing = True
        try:
            self.publish()   # a learner that cannot publish its first weights has done nothing to save
            self.ended = "error"   # unless the loops below end
            last_log = alone_since = time.monotonic()
            while not self.stop.is_set() and not self.reached_stop_score and intake.env_steps < total:
                deliveries = transport.receive(timeout=0 if intake.wants_update(trainer.updates) else 0.05)
                now = time.monotonic()
                for delivery in deliveries:
                    admission = intake.admit(delivery.chunk, transport.sender_standing(delivery.chunk))
                    self._report_chunks(admission.entered)   # a refused chunk lets those held behind it in
                    if admission.refused is not None:
                        if admission.first_of_cause:
                            self.report.refused(getattr(delivery.chunk, "collector", "?"), admission.refused)
                        # A sender that is not in the run learns so from the answer (the transport marks it).
                        transport.acknowledge(delivery, Ack(intake.env_steps, stop=False))
                        continue
                    intake.hold(delivery)
                for delivery in intake.release(trainer.updates):
                    transport.acknowledge(delivery, Ack(intake.env_steps, stop=False))
                if first_chunk_at is not None and intake.env_steps > first_chunk_at:
                    self.startup.mark("first chunk")
                    first_chunk_at = None
                # Updates while the replay ratio asks for them, for up to BURST_S: where an update is one CUDA graph
                # launch, the rest of the loop (answers, membership, evaluation, logs) then runs once per several
                # updates rather than once per update; where an update takes longer, once per update.
                burst_end = now + BURST_S
                while intake.wants_update(trainer.updates) and not self.reached_stop_score:
                    self._train_one()
                    if time.monotonic() >= burst_end:
                        break
                if first_update_at is not None and trainer.updates > first_update_at:
                    self.startup.mark("first update")
                    say("learner", f"start-up {self.startup.line()}")
                    first_update_at = None
                transport.watch()
                self._follow_membership()
                if transport.alive:
                    alone_since = now
                elif now - alone_since > self.cfg.cluster.join_timeout_s:
                    raise TransportError(f"no collector has been in the run for cluster.join_timeout_s="
                                         f"{self.cfg.cluster.join_timeout_s:g} s")
                if self.evaluating:
                    self._evaluate()
                if now - last_log >= self.cfg.metrics.interval_s:
                    last_log = now
                    self.log()
            # The collectors have reached the total and wait for answers that stay withheld: train what the replay
            # ratio still asks for, so that a run of N env steps gets the same updates on any hardware.
            while not self.stop.is_set() and not self.reached_stop_score and intake.wants_update(trainer.updates):
                self._train_one()
            # A signal that came after the run had done all its work leaves it ended at its total.
            self.ended = "stop_score" if self.reached_stop_score else \
                "total_env_steps" if intake.env_steps >= total and not intake.wants_update(trainer.updates) else \
                "signal"
            if self.ended == "total_env_steps" and self.evaluating:
                self._last_evaluation()
            failing = False
        finally:
            # Weights found diverged only as the run closes are raised, unless an error is ending the run already.
            self.close(raise_diverged=not failing)

    def _report_chunks(self, entered: list[Chunk]) -> None:
        """The chunks that just entered replay, each counted at the env steps it brought the run to."""
        env_steps = self.intake.env_steps - sum(chunk.env_steps for chunk in entered)
        for c in entered:
            env_steps += c.env_steps
            self.report.chunk(ChunkArrived(c.collector, c.sender, c.env_steps, c.nbytes, str(c.frames.device),
                                           c.weights_version, c.episode_returns.tolist(), c.episode_lengths.tolist(),
                                           c.system, None if c.episode_epsilons is None else
                                           c.episode_epsilons.tolist()), env_steps, self.weights_version)

    def step(self) -> Update:
        """One update, timed and reported."""
        started = time.perf_counter()
        captured = self.trainer.static
        update = self.trainer.step(self.intake.env_steps)
        if captured and not self.trainer.static:
            say("learner", f"warning: learner.cuda_graph: the update could not be captured as a CUDA graph "
                           f"({self.trainer.capture_error}); it runs eagerly")
        self.report.updated(time.perf_counter() - started, self.intake.env_steps, self.trainer.updates, update.q,
                            update.targets)
        return update

    def _train_one(self) -> None:
        self.step()
        updates = self.trainer.updates
        if updates % self.cfg.learner.publish_every_updates == 0:
            self.publish()
        if updates % self.cfg.learner.checkpoint_every_updates == 0:
            self._try_checkpoint("training goes on, and the next checkpoint is tried "
                                 f"{self.cfg.learner.checkpoint_every_updates:,} updates later")

    def publish(self) -> None:
        self._check_finite()
        if self.trainer.updates > 0:
            self.weights_version += 1
        self.transport.publish(self.trainer.weights(self.weights_version), self.intake.env_steps)

    def _follow_membership(self) -> None:
        """One line per collector that joins, leaves or is lost; `cluster/collectors_alive` after each. A joiner
        got the newest weights with its admission, and gets the next broadcasts like the others."""
        changed = False
        while True:
            try:
                change = self.transport.changes.get_nowait()
            except queue.Empty:
                break
            changed = True
            joined = change.what is Membership.JOINED
            self.report.membership(change.what.value, change.name, slot_of(change.name) if joined else -1,
                                   change.detail)
        if changed:
            self.report.collectors_alive(len(self.transport.alive), self.intake.env_steps)

    def log(self) -> None:
        self.report.log(self.counters(), self.trainer.mean_loss_and_q(), self.trainer.lr)

    # ------------------------------------------------------------------------------------------ evaluation

    def _evaluate(self) -> None:
        """Logs a finished evaluation round, and starts one with the current weights (or their moving average,
        eval.ema_updates) every eval.every_env_steps (when the previous round is still playing, as soon as it is
        done)."""
        try:
            if self.evaluator is None:
                self.evaluator = Evaluator(self.cfg)
            if (result := self.evaluator.poll()) is not None:
                self._evaluated(result)
            env_steps = self.intake.env_steps
            if not self.evaluator.busy and env_steps >= self.next_eval:
                self._check_finite()
                state = self.trainer.evaluated_weights()
                self.evaluator.submit(state, env_steps, self.report.elapsed(), self.weights_version)
                self.eval_state = state
                self.last_round_env_steps = env_steps
                # Due at the next multiple of every_env_steps, not every_env_steps after this round: a round that
                # started late (chunks come in whole, or the one before was still playing) does not push the rest
                # later, so rounds compare at the same env steps across runs and the run's total gets its own.
                self.next_eval = next_round(env_steps, self.cfg.eval.every_env_steps)
        except RuntimeError as e:
            say("learner", f"evaluation stopped, training goes on: {e}")
            self.evaluating = False
            self.close_evaluator()

    def _last_evaluation(self) -> None:
        """At the run's total: the round due there is started, and the round still playing is scored and logged
        before the run closes, rather than dropped (a signal drops it). The final weights are scored also where
        the total is not a multiple of eval.every_env_steps."""
        if self.last_round_env_steps < self.cfg.train.total_env_steps:
            self.next_eval = min(self.next_eval, self.cfg.train.total_env_steps)
        self._evaluate()
        if self.evaluator is None or not self.evaluator.busy:
            return
        say("learner", "reached train.total_env_steps: scoring the evaluation round still playing before the end")
        while self.evaluating and self.evaluator is not None and self.evaluator.busy and not self.stop.is_set():
            time.sleep(0.05)
            self._evaluate()

    def _evaluated(self, result: EvalResult) -> None:
        """checkpoints/best.pt: the network that scored best in the run's evaluations so far (the weights that
        round played, not the newer ones trained since), with its score. DQN's score can fall again after a peak,
        so this is the one to keep (`./launch/play.sh runs/<name> --best`); it holds no optimizer state."""
        mean, std, best = self.report.evaluated(**result._asdict())
        if best and self.eval_state is not None:
            try:
                checkpoints.save_best(self.run_dir, {
                    "network": self.eval_state,
                    "eval": {"mean": mean, "std": std, "episodes": len(result.scores), "env_steps": result.env_steps,
                             "weights_version": result.weights_version}} | self._identity())
            except OSError as e:   # a full disk: the run goes on, best.pt stays what it was
                say("learner", f"warning: the network that scored {mean:.2f} could not be saved as best.pt "
                               f"({e.strerror or first_line(e)}: {e.filename}); training goes on")
                # Later rounds are weighed against what best.pt holds, so that a better one than that is saved.
                self.report.best_eval = checkpoints.best_score(self.run_dir)
        stop_score = self.cfg.eval.stop_score
        if stop_score is not None and mean >= stop_score:
            self.stop_score_reached = {"eval": mean, "stop_score": stop_score, "env_steps": result.env_steps}
            say("learner", f"eval {mean:.2f} at {result.env_steps:,} env steps reached eval.stop_score={stop_score:g}: "
                           f"the run ends here")

    def close_evaluator(self) -> None:
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None

    def _check_finite(self) -> None:
        """Raises TrainingDiverged where the online network's weights are no longer finite (a host sync: it runs
        when weights are published, evaluated or saved, every learner.publish_every_updates at the most)."""
        if self.ended == "diverged" or not self.trainer.finite():
            self.ended = "diverged"
            raise self._diverged()

    def _diverged(self) -> TrainingDiverged:
        kept = checkpoints.all_of(self.run_dir)
        return TrainingDiverged(
            f"training diverged: the online network's weights are NaN or infinite after update "
            f"{self.trainer.updates:,} ({self.intake.env_steps:,} env steps), and are not kept; "
            + (f"the newest checkpoint, {kept[-1].name}, was trained before (run.resume=true continues from it)"
               if kept else "no checkpoint was saved before")
            + "; a lower train.lr or train.max_grad_norm may keep it from diverging")

    # ------------------------------------------------------------------------------------------ checkpoints

    def _identity(self) -> dict:
        """What a checkpoint needs besides weights to be played: the run's config and its env's shapes."""
        return {"config": to_dict(self.cfg),
                "spec": {"obs_shape": list(self.spec.obs_shape), "obs_dtype": str(self.spec.obs_dtype),
                         "num_actions": self.spec.num_actions}}

    def save_checkpoint(self) -> Path:
        """checkpoints/checkpoint_<updates>.pt (and with learner.checkpoint_replay the replay contents beside it):
        the trainer's state, the counters and the rest of the run's clock (schedules such as epsilon and beta
        follow from env_steps), and the evaluation that ended the run at eval.stop_score, if one did."""
        self._check_finite()
        trainer = self.trainer
        state = trainer.state() | {
            "counters": {"env_steps": self.intake.env_steps, "updates": trainer.updates,
                         "weights_version": self.weights_version},
            "schedule": {"next_eval": self.next_eval, "best_eval": self.report.best_eval,
                         "elapsed_s": self.report.elapsed(), "stop_score_reached": self.stop_score_reached},
        } | self._identity()
        replay = trainer.replay.state_dict() if self.cfg.learner.checkpoint_replay else None
        return checkpoints.save(self.run_dir, state, replay, trainer.updates, self.cfg.learner.keep_checkpoints,
                                self.saving)

    def _try_checkpoint(self, then: str) -> bool:
        """save_checkpoint(), or where the disk cannot take it (full, say), a line that says so, names the newest
        checkpoint that is there and what happens `then`; whether it was written."""
        try:
            self.save_checkpoint()
            self.unsaved = None
            return True
        except OSError as e:
            self.unsaved = f"{e.strerror or first_line(e)}: {e.filename or checkpoints.folder(self.run_dir)}"
        newest = checkpoints.all_of(self.run_dir)
        say("learner", f"warning: checkpoint {self.trainer.updates:,} could not be written ({self.unsaved}); the "
                       f"newest on disk is {newest[-1].name if newest else 'none'}; {then}")
        return False

    def restore(self, path: Path) -> None:
        """Continues from a checkpoint: network, target, optimizer, counters, schedules, the sampling generator
        and, when the checkpoint has them, the replay contents. A run that had ended at its eval.stop_score trains
        on (the command line resumes it only with none or a higher one), so its stop_score_reached is not taken."""
        state, replay = checkpoints.load(path)
        counters, schedule = state["counters"], state["schedule"]
        if not self.trainer.load_state(state, counters["updates"]):
            say("learner", f"the checkpoint's sampling state is not a {self.device.type} generator's: the run goes "
                           f"on with batches drawn from a new seed")
        self.intake.env_steps = counters["env_steps"]
        self.weights_version = counters["weights_version"]
        self.next_eval = schedule["next_eval"]
        if replay is not None:
            self.trainer.replay.load_state_dict(replay)
        # best.pt may hold a better round than the checkpoint knows of: one scored after it was written.
        best = [score for score in (schedule["best_eval"], checkpoints.best_score(self.run_dir)) if score is not None]
        self.report.resume_at(self.intake.env_steps, schedule["elapsed_s"], max(best, default=None))
        say("learner", f"resumed from {path.name}: {self.intake.env_steps:,} env steps, {self.trainer.updates:,} "
                       f"updates, weights v{self.weights_version}, replay {len(self.trainer.replay):,} transitions"
                       + ("" if replay is not None else f" ({self._no_replay(path, state)})"))

    @staticmethod
    def _no_replay(path: Path, state: dict) -> str:
        moved = checkpoints.replay_path(path, state)
        return (f"its replay file {moved.name} is gone: the replay starts empty" if moved is not None
                else "the checkpoint holds no replay")

    # ------------------------------------------------------------------------------------------ the end

    def close(self, raise_diverged: bool = True) -> None:
        """Final checkpoint, metrics and summary, then stop the collectors and leave. Safe to call twice. Weights
        that diverged since they were last checked are not saved; that raises TrainingDiverged once all else is
        done (with `raise_diverged`), or is said in a line."""
        if self._closed:
            return
        self._closed = True
        diverged_now = False
        try:
            self.report.finish()
            self.close_evaluator()
            self.trainer.close()
            # A learner whose run() never began (its transport failed to start, or its first publish) has learned
            # nothing since it started: a resumed run's checkpoint, replay and summary stay as they are.
            if self.ended is not None:
                diverged_now = self._save_last()
        finally:
            self.report.close()
            try:
                if self.transport is not None:
                    self.transport.stop_collectors(timeout=min(self.cfg.transport.rpc_timeout_s, 10.0))
            finally:
                if self.transport is not None:
                    self.transport.close()
        if diverged_now and raise_diverged:
            raise self._diverged()
        if diverged_now:
            say("learner", self._diverged().args[0])

    def _save_last(self) -> bool:
        """The last checkpoint (unless the weights diverged), metrics and summary; whether the weights were found
        diverged only now."""
        diverged_now = self.ended != "diverged" and not self.trainer.finite()
        if diverged_now:
            self.ended = "diverged"
        if self.ended != "diverged":
            replay = self.trainer.replay
            size = bytes_needed(len(replay), replay.frames.shape[2:], replay.frames.dtype)
            if self.cfg.learner.checkpoint_replay and size >= 1 << 30:   # a file that takes a while to write
                say("learner", f"writing the last checkpoint with the replay's {len(replay):,} transitions "
                               f"({size / 2**30:.1f} GiB), for run.resume")
            self._try_checkpoint("what the run learned after it is not saved")
        self.log()
        try:
            self.write_summary()
        except OSError as e:
            say("learner", f"warning: the run's summary.json could not be written ({e.strerror or first_line(e)})")
        return diverged_now

    def write_summary(self) -> None:
        self.report.write_summary(self.counters(), self.ended)

    def closing_lines(self, how: str) -> list[str]:
        return self.report.closing_lines(how, self.counters())
