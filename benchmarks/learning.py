"""Time to a score: runs a config through ./launch/local.sh for each seed and prints how long from launch it took
to reach each score, and where the wall time went.

    python benchmarks/learning.py CONFIG [--seeds 1,2,3] [--games Qbert,Pong] [--minutes 10] [--stop-at 18]
                                  [--scores 0,10,18] [--prefix NAME] [--record BENCHMARK [--whole-games N]]
                                  [--kill-collector-at MIN | --kill-collector-at-env-steps N]
                                  [--kill-learner-at MIN | --kill-learner-at-env-steps N] [--downtime S]
                                  [section.key=value ...]

Each seed runs alone, one after another, as `./launch/local.sh CONFIG run.seed=S run.name=<prefix>-s<S>
[overrides]`, its output in runs/<prefix>-s<S>.log. If the folder of any requested seed already holds a run, nothing
runs (exit code 2): a run there would be refused, or resumed and timed as if it were new. A seed ends when its run
ends by itself, at train.total_env_steps or at an evaluation that reached eval.stop_score (the `ended` of the
summary.json that launch wrote), or when this script stops it (SIGINT: a final checkpoint, then exit) after
`--minutes` of wall time or as soon as an evaluation reaches `--stop-at`; one line says which. Time to a score is
the run's clock from the launch of the command to the end of the first evaluation round whose mean score reached
it, so start-up and evaluation are inside it.

`--games` runs each seed of each Atari game in turn (games first, then seeds), each as `env.id=ALE/<Game>-v5`
named <prefix>-<Game>-s<seed>, and ends with a table of the games: each seed's last evaluation (the score at the time
limit) and best, beside the random and human scores and Dopamine's DQN and Rainbow at 10M frames, the mean's
human-normalised score, and the Atari-5 estimate of the 57-game median once its five games have run
(rl_dqn/atari_scores.py). With `--whole-games N` (and `--record`), each recorded run's final weights then play N
whole games into its record, as benchmarks/whole_games.py does, and the table gives their scores too.

A run that is refused (exit code 2: a config error, a resume with no checkpoint to resume from), or that fails by
itself (its learner died without a summary, or ended on an error), is not resumed: this script resumes only the
learner it killed (below), since an unplanned failure is a finding to report, and one that recurs would be
resumed until the time limit. Its last error line is printed, the next seed runs, and the exit code is 1.

Ctrl-C or SIGTERM to this script (also where it was started in the background of a script), or SIGINT to the run
by hand (or SIGINT or SIGTERM to its learner), stops that seed as its time limit would, runs no further seed and
prints the table of what ran (exit code 130); between a killed learner and its resumption (below) it resumes
nothing, and the run stays at its last checkpoint.

Where the time went, for each run (from its summary.json and TensorBoard events): start-up (launch to the first
chunk in replay, and to the first update), the share of wall time the learner spent in updates, the CPU use of the
learner and of the collectors (mean of system/*/cpu_percent, 100 = one core) and of the evaluator (its rounds' CPU
seconds over the run's wall time), and the evaluation rounds' wall seconds. Of a resumed run, start-up, the learner's
share and the evaluator's figures are its last process's, from that process's launch; the CPU use of the learner and
collectors, from TensorBoard, is the whole run's. Nothing else should run on the machine meanwhile: on a small
machine another job's CPU comes out of the run's time.

Faults while it learns: `--kill-collector-at` SIGKILLs collector0 (its node's launcher starts a new process in its
slot) and `--kill-learner-at` SIGKILLs the learner (its node stops), at minutes of wall time from the first launch;
`--kill-collector-at-env-steps` and `--kill-learner-at-env-steps` do so once the run has taken that many env steps,
which holds at any machine speed. The env steps are those the learner last printed to the log (`[learner] env steps
1,234/12,000 ...`, every metrics.interval_s), so such a kill comes up to one interval late. `--downtime` seconds
after the killed learner's node stops, the run is launched again with run.resume=true; a learner killed before its
first checkpoint leaves nothing to resume from (refused, as above). A kill still pending when the run ends is named
in a warning: that process was not killed. The run's clock leaves out the downtime, so each score's time is also
given in wall time from the first launch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from rl_dqn.cli import check_env  # noqa: E402
from rl_dqn.config import RUN_SEED_MAX, ConfigError, load_config  # noqa: E402
from rl_dqn.console import LAUNCHED_AT_ENV, duration  # noqa: E402
from rl_dqn.plot import EvalPoint, PlotError, first_reaching, load_events, read_evals, score_list, table  # noqa: E402
from rl_dqn.results import (RESULTS, GameRun, ResultsError, check_benchmark_name, games_text, record,  # noqa: E402
                            return_at_epsilon, whole_games_mean)
from rl_dqn.supervisor import EXIT_BAD_INPUT  # noqa: E402
import whole_games  # noqa: E402  (benchmarks/whole_games.py, beside this script)

POLL_S = 10.0
KILL_POLL_S = 0.5   # while a kill at a number of env steps is pending: a fraction of the usual metrics.interval_s
INTERRUPTED = (-signal.SIGINT, 128 + signal.SIGINT)
# summary.json's `ended` of a run that is over: it is never resumed.
ENDINGS = {"total_env_steps": "it reached train.total_env_steps",
           "stop_score": "an evaluation reached its eval.stop_score"}


def runs_dir() -> Path:
    return Path(os.environ.get("RL_DQN_RUNS_DIR") or ROOT / "runs")


class Kill(NamedTuple):
    """When a process of the run is SIGKILLed: `at` wall seconds from the first launch, or once the run's env steps
    reach `at`."""
    at: float
    unit: str = "s"   # "s" or "env steps"

    def due(self, elapsed_s: float, env_steps: int) -> bool:
        return (elapsed_s if self.unit == "s" else env_steps) >= self.at

    def when(self) -> str:
        return duration(self.at) if self.unit == "s" else f"{self.at:,.0f} env steps"


class Faults(NamedTuple):
    """Processes killed with SIGKILL during a run (None: never)."""
    collector: Kill | None = None   # collector0; its node's launcher starts a new one in its slot
    learner: Kill | None = None     # the learner; its node stops, and after `downtime_s` the run is resumed
    downtime_s: float = 30.0


class Outcome(NamedTuple):
    launched: float     # time.time() at the first launch
    wall_s: float       # from there to the end of the last launch
    interrupted: bool   # this script was sent SIGINT or SIGTERM, or the run was stopped by a signal from outside
    failed: bool        # refused (exit code 2) or failed by itself, and not resumed


def run_one(config: str, seed: int, name: str, overrides: list[str], limit_s: float, stop_at: float | None,
            log: Path, faults: Faults = Faults()) -> Outcome:
    """Runs one seed until it ends by itself, reaches `stop_at` or its time limit (wall time from its first launch),
    killing what `faults` says when it says; the run is resumed with run.resume=true after its learner was killed
    here, and after nothing else. An interrupted run was stopped as at its time limit."""
    argv = [str(ROOT / "launch/local.sh"), config, f"run.seed={seed}", f"run.name={name}", *overrides]
    folder = runs_dir() / name
    launched = time.time()
    pending = {role: kill for role, kill in (("collector", faults.collector), ("learner", faults.learner)) if kill}
    evaluations, steps = Progress(folder), EnvSteps(log)
    interrupted = failed = False
    with open(log, "w") as out:
        while True:
            print(f"$ {shlex.join(argv)}", flush=True)
            started, log_from = time.time(), log.stat().st_size
            # A resumed run's clock goes on from its checkpoint's, counting from this launch.
            env = dict(os.environ, **{LAUNCHED_AT_ENV: repr(started)})
            process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            killed_learner, checked = False, started
            try:
                while process.poll() is None and time.time() - launched < limit_s:
                    # Wakes for the next kill that is due, and as soon as the run exits.
                    elapsed = time.time() - launched
                    wake = [POLL_S, limit_s - elapsed]
                    wake += [kill.at - elapsed if kill.unit == "s" else KILL_POLL_S for kill in pending.values()]
                    try:
                        process.wait(timeout=max(min(wake), 0.1))
                    except subprocess.TimeoutExpired:
                        pass
                    if process.poll() is not None:
                        break
                    elapsed, env_steps = time.time() - launched, steps.newest()
                    for role, kill in list(pending.items()):
                        # No such process (a collector between two processes, a run ending): tried again next time.
                        if kill.due(elapsed, env_steps) and (pid := _kill(name, role)):
                            del pending[role]
                            killed_learner |= role == "learner"
                            print(f"  {duration(elapsed)} from launch, at {env_steps:,} env steps: killed the {role} "
                                  f"(pid {pid}) with SIGKILL", flush=True)
                    if stop_at is not None and time.time() - checked >= POLL_S:
                        checked = time.time()
                        if evaluations.reached(stop_at):
                            print(f"  reached {stop_at:g}: stopping the run", flush=True)
                            break
                else:   # the time limit, unless the run exited meanwhile
                    if process.poll() is None:
                        print(f"  {duration(limit_s)} from launch, the time limit: stopping the run", flush=True)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                stopped_here = _stop(process)
            code, ended = process.returncode, _ended(folder, since=started)
            at = f"{duration(time.time() - launched)} from launch"
            # Ended by a signal that did not come from here: someone stopped the run by hand.
            interrupted |= not stopped_here and (code in INTERRUPTED or ended == "signal")
            if interrupted:
                break
            if ended in ENDINGS or (not stopped_here and code == 0 and ended != "error"):
                how = "ended"
                print(f"  the run ended {at}: {ENDINGS.get(ended, 'exit code 0')}", flush=True)
            elif stopped_here and ended != "diverged":   # at its time limit or --stop-at
                how = "was stopped"
            elif code == EXIT_BAD_INPUT or not killed_learner or ended in ("error", "diverged"):
                what = "was refused" if code == EXIT_BAD_INPUT else "failed"
                print(f"  the run {what} (exit code {code}) {at}, not resumed: {_last_error(log, log_from)} "
                      f"(its output: {log})", flush=True)
                failed = True
                break
            elif time.time() - launched >= limit_s:
                print(f"  the run stopped (exit code {code}) {at}, at its time limit: not resumed", flush=True)
                break
            else:
                print(f"  the run stopped (exit code {code}) {at}; resuming it in {faults.downtime_s:g} s", flush=True)
                try:
                    time.sleep(faults.downtime_s)
                except KeyboardInterrupt:   # the run stays stopped at its last checkpoint; run.resume=true goes on
                    interrupted = True
                    break
                argv = [*argv, "run.resume=true"] if "run.resume=true" not in argv else argv
                continue
            for role, kill in pending.items():
                print(f"  the run {how} {at}, before the {role}'s scheduled kill at {kill.when()}: the {role} was "
                      f"not killed", flush=True)
            break
    return Outcome(launched, time.time() - launched, interrupted, failed)


def _ended(run_dir: Path, since: float) -> str | None:
    """How the run ended, as the summary.json written after `since` (time.time()) says; None without one (a learner
    killed with SIGKILL writes none, and leaves an earlier process's in place)."""
    path = run_dir / "summary.json"
    try:
        if path.stat().st_mtime < since:
            return None
        return json.loads(path.read_text()).get("ended")
    except (OSError, ValueError):
        return None


def _last_error(log: Path, start: int) -> str:
    """The last error line that a launch wrote to the log from byte `start` on, or else its last line."""
    with open(log, "rb") as f:
        f.seek(start)
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "] error: " in line or line.startswith("rl_dqn: ") or " died (" in line]
    return (errors or lines or ["it printed nothing"])[-1]


class EnvSteps:
    """The run's env steps as its learner last printed them to the seed's log (`[learner] env steps 1,234/12,000
    ...`, every metrics.interval_s), reading only what was written since the last call."""

    LINE = re.compile(rb"^\[learner\] env steps ([\d,]+)/", re.MULTILINE)

    def __init__(self, log: Path):
        self.log, self.read_to, self.rest, self.steps = log, 0, b"", 0

    def newest(self) -> int:
        with open(self.log, "rb") as f:
            f.seek(self.read_to)
            new = f.read()
        self.read_to += len(new)
        # A line still being written is kept for the next call.
        whole, _, self.rest = (self.rest + new).rpartition(b"\n")
        for found in self.LINE.finditer(whole):
            self.steps = int(found[1].replace(b",", b""))
        return self.steps


def _kill(name: str, role: str) -> int | None:
    """SIGKILLs the run's learner, or its collector0; returns its pid, or None where there is no such process."""
    name = re.sub(r"([.\[\](){}*+?|^$\\])", r"\\\1", name)   # pgrep's extended regex: a run name's dot or plus as such
    pattern = f"rl_dqn learner .*run.name={name}( |$)" if role == "learner" else \
        f"rl_dqn collector .*run.name={name} .*--local-index=0"
    pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    if not pids:
        return None
    try:
        os.kill(int(pids[0]), signal.SIGKILL)
    except ProcessLookupError:   # it ended meanwhile
        return None
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
    parser = arguments.parser(__doc__)
    parser.add_argument("config", help="e.g. configs/pong_cpu.yaml")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    parser.add_argument("--seeds", default="1", help="seeds, run one after another (default 1)")
    parser.add_argument("--games", default="", help="Atari games, each run as env.id=ALE/<Game>-v5 for every seed, "
                                                    "e.g. BattleZone,DoubleDunk,NameThisGame,Phoenix,Qbert")
    parser.add_argument("--minutes", type=arguments.positive, default=10.0, help="wall minutes per run (default 10)")
    parser.add_argument("--stop-at", type=arguments.finite, default=None,
                        help="stop a run once an evaluation reaches this")
    parser.add_argument("--scores", type=score_list, default=None,
                        help="scores whose time the table gives (default 0,10,18, Pong's; none with --games)")
    for role, who, then in (("collector", "collector0", " (its launcher starts a new one)"),
                            ("learner", "the learner", ", then resume the run")):
        group = parser.add_mutually_exclusive_group()
        group.add_argument(f"--kill-{role}-at", type=arguments.non_negative, default=None, metavar="MINUTES",
                           help=f"SIGKILL {who} this many minutes after launch{then}")
        group.add_argument(f"--kill-{role}-at-env-steps", type=int, default=None, metavar="N",
                           help=f"SIGKILL {who} once the run has taken N env steps, as its learner last printed "
                                f"them{then}")
    parser.add_argument("--downtime", type=arguments.non_negative, default=30.0, metavar="SECONDS",
                        help="seconds between the killed learner's run stopping and its resumption (default 30)")
    parser.add_argument("--record", default="", metavar="BENCHMARK",
                        help="keep each seed that ran to its end or its time limit as a record in "
                             "results/BENCHMARK/ (python -m rl_dqn.results), from which docs/results.md is made")
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)   # tests' own folder
    parser.add_argument("--whole-games", type=int, default=0, metavar="N",
                        help="with --record: each recorded run's final weights then play N whole games into its "
                             "record (benchmarks/whole_games.py; default 0, none)")
    parser.add_argument("--prefix", type=arguments.folder_name, default="",
                        help="run names are <prefix>-s<seed> (default: the config's name and the time)")
    args = parser.parse_intermixed_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds must be integers separated by commas, got {args.seeds!r}")
    if min(seeds) < 0 or max(seeds) > RUN_SEED_MAX:
        parser.error(f"--seeds must be integers from 0 to {RUN_SEED_MAX:,} (run.seed), got {args.seeds!r}")
    # A seed given twice would run twice, its second run's log overwriting the first's.
    if len(set(seeds)) != len(seeds):
        parser.error(f"--seeds names a seed twice: {args.seeds}")
    if not (ROOT / args.config).is_file() and not Path(args.config).is_file():
        parser.error(f"no such config: {args.config}")
    # Each run's name and seed are the benchmark's: an override of them would name every run alike, or label every
    # seed's run with one seed, and the benchmark would read back folders no run wrote.
    for override in args.overrides:
        key = override.partition("=")[0]
        if key == "run.name":
            parser.error(f"override {override}: the benchmark names each run <prefix>-s<seed> (with --games, "
                         f"<prefix>-<Game>-s<seed>); give --prefix instead")
        if key == "run.seed":
            parser.error(f"override {override}: the benchmark sets each run's run.seed from --seeds; give --seeds "
                         f"instead")
    games = _games(parser, args)
    if args.scores is None:
        args.scores = [] if games else [0.0, 10.0, 18.0]
    faults = Faults(_kill_at(parser, args, "collector"), _kill_at(parser, args, "learner"), args.downtime)
    prefix = args.prefix or f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    # (name, its game or None, seed, the run's overrides), in the order they run.
    plan = [(f"{prefix}-{game}-s{seed}" if game else f"{prefix}-s{seed}", game, seed,
             [*args.overrides, f"env.id=ALE/{game}-v5"] if game else args.overrides)
            for game in games or [None] for seed in seeds]
    # Checked as each launch checks it, so that a bad override is one line here and not one refused launch per seed.
    config = ROOT / args.config if (ROOT / args.config).is_file() else Path(args.config)   # as launch finds it
    checked_envs = set()
    for name, _, seed, overrides in plan:
        try:
            cfg = load_config(config, [f"run.seed={seed}", f"run.name={name}", *overrides])
            if cfg.env.id not in checked_envs:   # as the learner checks it, once per game
                checked_envs.add(cfg.env.id)
                check_env(cfg)
        except ConfigError as e:
            parser.error(arguments.config_error(e, args.config, overrides, "override"))
    if args.record:
        try:
            check_benchmark_name(args.record, args.results)
        except ResultsError as e:
            parser.error(f"--record: {e}")
    # A run there would be refused (exit code 2), and so resumed, and timed, as if it were this seed's.
    if args.record and not (args.results / args.record / "benchmark.yaml").is_file():
        parser.error(f"--record {args.record}: no such benchmark in {_shown(args.results)} (a folder with a "
                     f"benchmark.yaml)")
    if args.whole_games < 0 or (args.whole_games and not args.record):
        parser.error(f"--whole-games must be >= 0 and needs --record (its scores go into the run's record), got "
                     f"--whole-games {args.whole_games}" + ("" if args.record else " without --record"))
    taken = [folder for name, *_ in plan if _holds_a_run(folder := runs_dir() / name)]
    if taken:
        parser.exit(2, f"{parser.prog}: error: {', '.join(map(_shown, taken))} already "
                       f"{'holds a run' if len(taken) == 1 else 'hold runs'}; choose another --prefix\n")
    # Ctrl-C or SIGTERM stops the seed that runs and ends the benchmark with what it has, also where this was started
    # in the background of a script, which inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    results: dict[str, list[EvalPoint]] = {}
    failed = False
    runs_dir().mkdir(parents=True, exist_ok=True)   # RL_DQN_RUNS_DIR may name a folder not made yet
    for index, (name, game, seed, overrides) in enumerate(plan):
        folder = runs_dir() / name
        outcome = run_one(args.config, seed, name, overrides, 60 * args.minutes, args.stop_at,
                          runs_dir() / f"{name}.log", faults)
        launched, wall, interrupted = outcome.launched, outcome.wall_s, outcome.interrupted
        failed |= outcome.failed
        if interrupted:
            later = plan[index + 1:]
            rest = (", ".join(f"{g} seed {s}" for _, g, s, _ in later) if game else
                    f"seeds {','.join(str(s) for _, _, s, _ in later)}")
            print(f"  interrupted {duration(wall)} from launch: {f'{game} ' if game else ''}seed {seed} stopped"
                  + (f", {rest} not run" if later else ""), flush=True)
        if outcome.failed and not any(folder.glob("events.out.tfevents.*")):   # refused: nothing to read back
            continue
        try:
            results[name] = read_evals(folder)
        except PlotError as e:   # it ran, but no round finished: its line in the table says so
            print(f"  {e}", flush=True)
            results[name] = []
            if interrupted:
                break
            continue
        print(f"  {duration(wall)} from launch to exit; " + where_time_went(folder), flush=True)
        if args.record and not interrupted and not outcome.failed:
            try:
                print(f"  recorded {_shown(record(folder, args.record, args.results))}", flush=True)
            except ResultsError as e:
                print(f"  not recorded: {e}", flush=True)
            else:
                if args.whole_games:   # its final weights in whole games; their own line says how they scored
                    try:
                        failed |= whole_games.main([str(folder), "--record", args.record, "--results",
                                                    str(args.results), "--episodes", str(args.whole_games)]) != 0
                    except KeyboardInterrupt:   # Ctrl-C or SIGTERM: nothing written, and no further seed runs
                        print(f"  interrupted while its final weights played whole games: none kept, no further "
                              f"seed runs; python benchmarks/whole_games.py {_shown(folder)} --record "
                              f"{args.record} plays them", flush=True)
                        interrupted = True
        if faults.collector or faults.learner:
            # The run's clock leaves out the time between the learner's death and the resumed launch.
            for score in args.scores:
                if (point := first_reaching(results[name], score)) is not None:
                    print(f"  reached {score:g} {duration(point.logged_at - launched)} from the first launch in wall "
                          f"time ({duration(point.seconds)} on the run's clock), at {point.env_steps:,} env steps",
                          flush=True)
        if interrupted:
            break
    if not results:
        return 130 if interrupted else 1
    print()
    print(table(results, args.scores))
    if games:
        played = [GameRun(game, seed, results[name], *_summary_figures(runs_dir() / name),
                          whole_games=whole_games_mean(args.results / args.record / name) if args.record else None)
                  for name, game, seed, _ in plan if name in results]
        print()
        print(games_text(played, games))
    measured = any(results.values())   # some run had a round of evaluation to read
    return 130 if interrupted else 1 if failed or not measured else 0


def _games(parser: argparse.ArgumentParser, args) -> list[str]:
    """--games as a list of Atari game names, each one ALE has (ALE/<Game>-v5)."""
    if not args.games:
        return []
    if any(o.startswith("env.id=") for o in args.overrides):
        parser.error("--games sets env.id for each run; give the games there, not an env.id= override")
    import ale_py
    import gymnasium
    gymnasium.register_envs(ale_py)
    games = [g.strip() for g in args.games.split(",")]
    unknown = [g for g in games if f"ALE/{g}-v5" not in gymnasium.registry]
    if unknown:
        parser.error(f"--games: no Atari game {', '.join(map(repr, unknown))} (ALE/<Game>-v5 as gymnasium "
                     f"registers them, e.g. Pong, Breakout, Qbert, BattleZone)")
    if len(set(games)) != len(games):
        parser.error(f"--games names a game twice: {args.games}")
    return games


def _summary_figures(run_dir: Path) -> tuple[int | None, float | None]:
    """A run's env steps at its end and the mean score of its training episodes at metrics.return_epsilon then
    (None for what its summary.json does not say)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None, None
    return summary.get("env_steps"), return_at_epsilon(summary)


def _kill_at(parser: argparse.ArgumentParser, args, role: str) -> Kill | None:
    minutes, env_steps = getattr(args, f"kill_{role}_at"), getattr(args, f"kill_{role}_at_env_steps")
    if minutes is not None:
        return Kill(60 * minutes)
    if env_steps is not None:
        if env_steps < 1:
            parser.error(f"--kill-{role}-at-env-steps must be >= 1, got {env_steps}")
        return Kill(env_steps, "env steps")
    return None


def _holds_a_run(folder: Path) -> bool:
    """As the run itself decides: a folder that is there and not empty."""
    return folder.is_dir() and any(folder.iterdir())


def _shown(path: Path) -> str:
    """`path` from the working directory where it is below it (runs/bench-s1), else as it is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
