"""Time to a score: runs a config through ./launch/local.sh for each seed and prints how long from launch it took
to reach each score, and where the wall time went.

    python benchmarks/learning.py CONFIG [--seeds 1,2,3] [--minutes 10] [--stop-at 18] [--scores 0,10,18]
                                  [--prefix NAME] [--kill-collector-at MIN] [--kill-learner-at MIN [--downtime S]]
                                  [section.key=value ...]

Each seed runs alone, one after another, as `./launch/local.sh CONFIG run.seed=S run.name=<prefix>-s<S>
[overrides]`, and is stopped (SIGINT: a final checkpoint, then exit) after `--minutes` of wall time, or as soon as
an evaluation reaches `--stop-at`. Time to a score is the run's clock from the launch of the command to the end of
the first evaluation round whose mean score reached it, so start-up and evaluation are inside it. Ctrl-C or SIGTERM
to this script (also where it was started in the background of a script), or SIGINT to the run by hand, stops that
seed as its time limit would, runs no further seed and prints the table of what ran (exit code 130); between a
killed learner and its resumption (below) it resumes nothing, and the run stays at its last checkpoint.

Where the time went, for each run (from its summary.json and TensorBoard events): start-up (launch to the first
chunk in replay, and to the first update), the share of wall time the learner spent in updates, the CPU use of the
learner and of the collectors (mean of system/*/cpu_percent, 100 = one core) and of the evaluator (its rounds' CPU
seconds over the run's wall time), and the evaluation rounds' wall seconds. Of a resumed run, start-up, the learner's
share and the evaluator's figures are its last process's, from that process's launch; the CPU use of the learner and
collectors, from TensorBoard, is the whole run's. Nothing else should run on the machine meanwhile: on a small
machine another job's CPU comes out of the run's time.

Faults while it learns: `--kill-collector-at` SIGKILLs collector0 (its node's launcher starts a new process in its
slot), `--kill-learner-at` SIGKILLs the learner (its node stops), and `--downtime` seconds later the run is launched
again with run.resume=true. The run's clock then leaves out the downtime, so each score's time is also given in wall
time from the first launch.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rl_dqn.cli import LAUNCHED_AT_ENV  # noqa: E402
from rl_dqn.console import duration  # noqa: E402
from rl_dqn.plot import EvalPoint, PlotError, first_reaching, load_events, read_evals, score_list, table  # noqa: E402

POLL_S = 10.0


def runs_dir() -> Path:
    return Path(os.environ.get("RL_DQN_RUNS_DIR") or ROOT / "runs")


class Faults(NamedTuple):
    """Processes killed with SIGKILL during a run, at wall seconds from its launch (None: never)."""
    collector_at_s: float | None = None   # collector0; its node's launcher starts a new one in its slot
    learner_at_s: float | None = None     # the learner; its node stops, and after `downtime_s` the run is resumed
    downtime_s: float = 30.0


def run_one(config: str, seed: int, name: str, overrides: list[str], limit_s: float, stop_at: float | None,
            log: Path, faults: Faults = Faults()) -> tuple[float, float, bool]:
    """Runs one seed to its time limit (wall time from its first launch) or its score, killing what `faults` says
    when it says (a killed learner's run is resumed with run.resume=true); returns time.time() at the first launch,
    the wall seconds from there to the end, and whether the run was interrupted (this script was sent SIGINT or
    SIGTERM, or the run was stopped with SIGINT from outside), in which case it was stopped as at its time limit."""
    interrupted = False
    argv = [str(ROOT / "launch/local.sh"), config, f"run.seed={seed}", f"run.name={name}", *overrides]
    launched = time.time()
    due = {"collector": faults.collector_at_s, "learner": faults.learner_at_s}
    progress = Progress(runs_dir() / name)
    with open(log, "w") as out:
        while True:
            print(f"$ {shlex.join(argv)}", flush=True)
            # A resumed run's clock goes on from its checkpoint's, counting from this launch.
            env = dict(os.environ, **{LAUNCHED_AT_ENV: repr(time.time())})
            process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                while process.poll() is None and time.time() - launched < limit_s:
                    # Wakes for the next kill that is due, and as soon as the run exits.
                    wake = min([limit_s, *(at for at in due.values() if at is not None)]) - (time.time() - launched)
                    try:
                        process.wait(timeout=min(POLL_S, max(wake, 0.1)))
                    except subprocess.TimeoutExpired:
                        pass
                    if process.poll() is not None:
                        break
                    for role, at in due.items():
                        if at is not None and time.time() - launched >= at:
                            due[role] = None
                            pid = _kill(name, role)
                            print(f"  {duration(time.time() - launched)} from launch: killed the {role} (pid {pid}) "
                                  f"with SIGKILL", flush=True)
                    if stop_at is not None and progress.reached(stop_at):
                        print(f"  reached {stop_at:g}: stopping the run", flush=True)
                        break
            except KeyboardInterrupt:
                interrupted = True
            finally:
                stopped_here = _stop(process)
            # Ended by a SIGINT that did not come from here: someone stopped the run by hand.
            interrupted |= not stopped_here and process.returncode in (-signal.SIGINT, 128 + signal.SIGINT)
            if interrupted or process.returncode in (0, -signal.SIGINT, 128 + signal.SIGINT) \
                    or time.time() - launched >= limit_s:
                break
            print(f"  the run stopped (exit code {process.returncode}) {duration(time.time() - launched)} from launch; "
                  f"resuming it in {faults.downtime_s:g} s", flush=True)
            try:
                time.sleep(faults.downtime_s)
            except KeyboardInterrupt:   # the run stays stopped at its last checkpoint; run.resume=true goes on
                interrupted = True
                break
            argv = [*argv, "run.resume=true"] if "run.resume=true" not in argv else argv
    if process.returncode not in (0, -signal.SIGINT, 128 + signal.SIGINT):
        print(f"  exited with code {process.returncode}; its output: {log}", flush=True)
    return launched, time.time() - launched, interrupted


def _kill(name: str, role: str) -> int:
    """SIGKILLs the run's learner, or its collector0."""
    pattern = f"rl_dqn learner .*run.name={name}( |$)" if role == "learner" else \
        f"rl_dqn collector .*run.name={name} .*--local-index=0"
    pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    if not pids:
        raise RuntimeError(f"no {role} process of run {name} to kill")
    os.kill(int(pids[0]), signal.SIGKILL)
    return int(pids[0])


def _stop(process: subprocess.Popen) -> bool:
    """Stops the run if it still runs (True) as its time limit does; False when it had ended by itself."""
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGINT)   # the learner saves its final checkpoint and summary
    try:
        process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return True


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


class Progress:
    """A run's evaluations as it goes, read from its TensorBoard events with one accumulator, so that each poll
    reads only what was written since the last (a new reader per poll parses the whole file, which grows to
    a few MB within an hour: seconds of CPU a minute taken from the run it measures)."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.events = run_dir, None

    def reached(self, score: float) -> bool:
        if self.events is None and not any(self.run_dir.glob("events.out.tfevents.*")):
            return False
        try:
            self.events = self.events or load_events(self.run_dir)
            return first_reaching(read_evals(self.run_dir, self.events), score) is not None
        except PlotError:
            return False


def where_time_went(run_dir: Path) -> str:
    """One line: start-up, the learner's share of time in updates, CPU by role, evaluation (see the module's doc for
    a resumed run)."""
    if not (run_dir / "summary.json").exists():   # a learner killed and not resumed writes none
        return f"no {run_dir / 'summary.json'}: its learner did not exit by itself"
    summary = json.loads((run_dir / "summary.json").read_text())
    resumed = summary.get("resumed_at_s", 0.0)
    wall = summary["wall_s"] - resumed
    cpu = _cpu_by_role(run_dir)
    after = f" after resuming at {duration(resumed)} on the run's clock" if resumed else ""
    parts = [f"first chunk {_s(summary['first_data_s'], resumed)}, first update "
             f"{_s(summary['training_start_s'], resumed)}{after}",
             f"{summary['env_steps']:,} env steps at {summary['env_steps_per_s_training'] or 0:,.0f}/s "
             f"and {summary.get('updates_per_s_training') or 0:,.1f} updates/s while training",
             f"learner updating {100 * summary['updating_s'] / wall:.0f}% of the time",
             f"CPU: learner {cpu.get('learner', 0):.0f}%, collectors {cpu.get('collectors', 0):.0f}%, "
             f"evaluator {100 * summary['eval_round_cpu_s'] / wall:.0f}% (100 = a core)",
             f"{summary['eval_rounds']} evaluation rounds, "
             f"{summary['eval_round_s'] / max(summary['eval_rounds'], 1):.0f} s each on average"]
    return "; ".join(parts)


def _s(value: float | None, since: float = 0.0) -> str:
    return "never" if value is None else f"{value - since:.1f} s"


def _cpu_by_role(run_dir: Path) -> dict[str, float]:
    """Mean CPU % of the learner, and the sum of the collectors' means, from TensorBoard's system figures."""
    events = load_events(run_dir)
    means = {}
    for tag in events.Tags()["scalars"]:
        if tag == "system/learner/cpu_percent" or tag.startswith("system/collector") and tag.endswith("cpu_percent"):
            values = [e.value for e in events.Scalars(tag)]
            role = "learner" if "learner" in tag else "collectors"
            means[role] = means.get(role, 0.0) + sum(values) / max(len(values), 1)
    return means


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="e.g. configs/pong_cpu.yaml")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    parser.add_argument("--seeds", default="1", help="seeds, run one after another (default 1)")
    parser.add_argument("--minutes", type=float, default=10.0, help="wall minutes per run (default 10)")
    parser.add_argument("--stop-at", type=float, default=None, help="stop a run once an evaluation reaches this")
    parser.add_argument("--scores", type=score_list, default=[0.0, 10.0, 18.0], help="default 0,10,18")
    parser.add_argument("--kill-collector-at", type=float, default=None, metavar="MINUTES",
                        help="SIGKILL collector0 this many minutes after launch (its launcher starts a new one)")
    parser.add_argument("--kill-learner-at", type=float, default=None, metavar="MINUTES",
                        help="SIGKILL the learner this many minutes after launch, then resume the run")
    parser.add_argument("--downtime", type=float, default=30.0, metavar="SECONDS",
                        help="seconds between the killed learner's run stopping and its resumption (default 30)")
    parser.add_argument("--prefix", default="", help="run names are <prefix>-s<seed> (default: the config's name "
                                                     "and the time)")
    args = parser.parse_intermixed_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds must be integers separated by commas, got {args.seeds!r}")
    if args.minutes <= 0:
        parser.error(f"--minutes must be > 0, got {args.minutes}")
    if not (ROOT / args.config).is_file() and not Path(args.config).is_file():
        parser.error(f"no such config: {args.config}")
    # Ctrl-C or SIGTERM stops the seed that runs and ends the benchmark with what it has, also where this was started
    # in the background of a script, which inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    prefix = args.prefix or f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    results: dict[str, list[EvalPoint]] = {}
    runs_dir().mkdir(parents=True, exist_ok=True)   # RL_DQN_RUNS_DIR may name a folder not made yet
    for seed in seeds:
        name = f"{prefix}-s{seed}"
        folder = runs_dir() / name
        faults = Faults(None if args.kill_collector_at is None else 60 * args.kill_collector_at,
                        None if args.kill_learner_at is None else 60 * args.kill_learner_at, args.downtime)
        launched, wall, interrupted = run_one(args.config, seed, name, args.overrides, 60 * args.minutes,
                                              args.stop_at, runs_dir() / f"{name}.log", faults)
        later = seeds[seeds.index(seed) + 1:]
        if interrupted:
            print(f"  interrupted {duration(wall)} from launch: seed {seed} stopped"
                  + (f", seeds {','.join(map(str, later))} not run" if later else ""), flush=True)
        try:
            results[name] = read_evals(folder)
        except PlotError as e:
            print(f"  {e}", flush=True)
            if interrupted:
                break
            continue
        print(f"  {duration(wall)} from launch to exit; " + where_time_went(folder), flush=True)
        if faults != Faults():
            # The run's clock leaves out the time between the learner's death and the resumed launch.
            for score in args.scores:
                if (point := first_reaching(results[name], score)) is not None:
                    print(f"  reached {score:g} {duration(point.logged_at - launched)} from the first launch in wall "
                          f"time ({duration(point.seconds)} on the run's clock), at {point.env_steps:,} env steps",
                          flush=True)
        if interrupted:
            break
    if not results:
        return 1
    print()
    print(table(results, args.scores))
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
