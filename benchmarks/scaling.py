"""How the whole pipeline scales with collectors: env steps/s, updates/s and where the CPU goes, per collector count,
replay ratio and transport.

    python benchmarks/scaling.py CONFIG [--collectors 1,2,4,8,14] [--ratios 2,0] [--transports cpu,cuda]
                                 [--seconds 30] [--prefix NAME] [section.key=value ...]

Each combination runs the config through ./launch/local.sh, one after another, as
`CONFIG collectors.count=N train.replay_ratio=R transport.kind=K train.learning_starts=5000 eval.every_env_steps=0
learner.checkpoint_replay=false metrics.interval_s=2 [overrides]`, and is stopped (SIGINT) `--seconds` after its
learner reported its first training (ratio 0: its first data), so start-up is left out. From the run's summary.json
and TensorBoard events it prints:

- env steps/s and updates/s from the first update to the stop (ratio 0: from the first chunk);
- the learner's training share: the part of that time its loop spent in updates (on a GPU with learner.cuda_graph,
  launching them);
- the learner's CPU (100 = one core busy), the collectors' CPU, as the mean over them and their sum, the node's CPU
  (100 = every core busy) and, on a GPU, its utilisation, each the mean of the run's samples after the first.

With a replay ratio above 0 the learner holds the collectors to it, so env steps/s is the rate at which the learner
trains divided by the ratio, or the collectors' own rate, whichever is lower: where the ratio-0 rate of the same
collectors is higher, the learner is what bounds the run. Nothing else should run on the machine meanwhile.

Ctrl-C or SIGTERM stops the run that is going (it is left out of the table, being cut short) and ends the benchmark
with the table of the runs that finished, exit code 130.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from rl_dqn.config import ConfigError, load_config  # noqa: E402
from rl_dqn.plot import load_events  # noqa: E402

SETTINGS = ["train.learning_starts=5000", "eval.every_env_steps=0", "learner.checkpoint_replay=false",
            "metrics.interval_s=2"]
# The learner's progress line: `[learner] env steps 12,345/... | 1,234 steps/s | 56.7 updates/s | ...`.
PROGRESS = re.compile(r"\[learner\] env steps ([\d,]+)/.*\| ([\d,.]+) updates/s")


def runs_dir() -> Path:
    return Path(os.environ.get("RL_DQN_RUNS_DIR") or ROOT / "runs")


def ratio_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be numbers separated by commas, got {text!r}") from None
    if not values or not all(0 <= v < math.inf for v in values):   # nan is neither
        raise argparse.ArgumentTypeError(f"must be finite numbers >= 0, got {text!r}")
    return values


def transport_list(text: str) -> list[str]:
    values = text.split(",")
    if not values or any(v not in ("cpu", "cuda") for v in values):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cpu,cuda, got {text!r}")
    return values


def run_one(config: str, name: str, settings: list[str], seconds: float, training: bool, log: Path,
            start_timeout_s: float = 300.0) -> tuple[int, str | None]:
    """Runs the config until `seconds` after its learner first trained (or first took data), then stops it with
    SIGINT; returns the exit code and, when the run never got that far, why."""
    argv = [str(ROOT / "launch/local.sh"), config, f"run.name={name}", *settings]
    print(f"$ {' '.join(argv)}", flush=True)
    with open(log, "w") as out:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        launched, since, problem = time.monotonic(), None, None
        try:
            for line in process.stdout:
                out.write(line)
                if since is None and (found := PROGRESS.search(line)):
                    steps, updates = int(found[1].replace(",", "")), float(found[2].replace(",", ""))
                    if (updates > 0) if training else (steps > 0):
                        since = time.monotonic()
                now = time.monotonic()
                if since is not None and now - since >= seconds:
                    break
                if since is None and now - launched > start_timeout_s:
                    problem = f"no {'update' if training else 'data'} within {start_timeout_s:g} s of the launch"
                    break
            else:
                problem = problem or "the run ended before its measurement did"
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
            try:
                rest, _ = process.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                rest, _ = process.communicate()
            out.write(rest or "")
    return process.returncode, problem


def figures(run_dir: Path, training: bool) -> dict[str, float | None]:
    """The run's rates (summary.json) and the mean CPU and GPU figures of its processes (TensorBoard)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    since = summary["training_start_s"] if training else summary["first_data_s"]
    wall = summary["wall_s"] - (since or 0.0)
    found = {
        "env_steps_per_s": summary["env_steps_per_s_training"] if training else summary["env_steps_per_s"],
        "updates_per_s": summary.get("updates_per_s_training") or 0.0,
        "training_share": summary["updating_s"] / wall if wall > 0 else None,
    }
    events = load_events(run_dir)
    tags = events.Tags()["scalars"]

    def mean(tag: str) -> float | None:
        values = [e.value for e in events.Scalars(tag)][1:] if tag in tags else []
        return sum(values) / len(values) if values else None

    found["learner_cpu"] = mean("system/learner/cpu_percent")
    collectors = [m for tag in tags if re.fullmatch(r"system/collector\d+/cpu_percent", tag)
                  if (m := mean(tag)) is not None]
    found["collector_cpu_mean"] = sum(collectors) / len(collectors) if collectors else None
    found["collector_cpu_sum"] = sum(collectors) if collectors else None
    found["node_cpu"] = mean("system/learner_node/cpu_percent")
    found["gpu_util"] = mean("system/learner/gpu_util_percent")
    return found


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> int:
    parser = arguments.parser(__doc__)
    parser.add_argument("config", help="e.g. configs/pong_gpu.yaml")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    parser.add_argument("--collectors", type=arguments.counts, default=[1, 2, 4, 8],
                        help="collector counts (default 1,2,4,8)")
    parser.add_argument("--ratios", type=ratio_list, default=[2.0, 0.0], help="train.replay_ratio values (default 2,0)")
    parser.add_argument("--transports", type=transport_list, default=["cpu"],
                        help="transport.kind values: cpu, cuda or cpu,cuda (default cpu)")
    parser.add_argument("--seconds", type=arguments.positive, default=30.0,
                        help="seconds measured per run (default 30)")
    parser.add_argument("--prefix", type=arguments.folder_name, default="",
                        help="run names are <prefix>-<transport>-c<N>-r<R> (default: scaling and the time)")
    args = parser.parse_intermixed_args()
    if not (ROOT / args.config).is_file() and not Path(args.config).is_file():
        parser.error(f"no such config: {args.config}")
    prefix = args.prefix or f"scaling-{time.strftime('%Y%m%d-%H%M%S')}"
    # Each combination is checked as its launch checks it: a refused one is a line in the output, easily missed.
    config = ROOT / args.config if (ROOT / args.config).is_file() else Path(args.config)   # as launch finds it
    combinations = [(transport, ratio, count) for transport in args.transports for ratio in args.ratios
                    for count in args.collectors]
    for transport, ratio, count in combinations:
        name = f"{prefix}-{transport}-c{count}-r{ratio:g}"
        try:
            load_config(config, [f"run.name={name}", *SETTINGS, f"collectors.count={count}",
                                 f"train.replay_ratio={ratio:g}", f"transport.kind={transport}", *args.overrides])
        except ConfigError as e:
            parser.error(arguments.config_error(e, args.config, args.overrides, "override"))
        # A combination found taken midway would end the benchmark there, with what ran before it lost.
        if (runs_dir() / name).exists():
            parser.exit(2, f"{parser.prog}: error: {runs_dir() / name} already holds a run; choose another --prefix\n")
    runs_dir().mkdir(parents=True, exist_ok=True)
    rows = []
    header = (f"{'transport':>9} {'collectors':>10} {'ratio':>5} {'env steps/s':>11} {'updates/s':>9} "
              f"{'training':>8} {'learner CPU':>11} {'collector CPU':>13} {'collectors CPU':>14} {'node CPU':>8} "
              f"{'GPU util':>8}")
    # Also where this was started in the background of a script, which inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    interrupted, name = False, prefix
    try:
        for transport, ratio, count in combinations:
            name = f"{prefix}-{transport}-c{count}-r{ratio:g}"
            settings = [*SETTINGS, f"collectors.count={count}", f"train.replay_ratio={ratio:g}",
                        f"transport.kind={transport}", *args.overrides]
            code, problem = run_one(args.config, name, settings, args.seconds, ratio > 0, runs_dir() / f"{name}.log")
            if problem is not None or not (runs_dir() / name / "summary.json").exists():
                why = problem or f"exited with code {code} and wrote no summary"
                print(f"  {name}: {why}; its output: {runs_dir() / f'{name}.log'}", flush=True)
                continue
            f = figures(runs_dir() / name, ratio > 0)
            row = (f"{transport:>9} {count:>10} {ratio:>5g} {_cell(f['env_steps_per_s'], ',.0f'):>11} "
                   f"{_cell(f['updates_per_s'], ',.1f'):>9} "
                   f"{_cell(None if f['training_share'] is None else 100 * f['training_share'], '.0f'):>7}% "
                   f"{_cell(f['learner_cpu'], '.0f'):>10}% {_cell(f['collector_cpu_mean'], '.0f'):>12}% "
                   f"{_cell(f['collector_cpu_sum'], ',.0f'):>13}% {_cell(f['node_cpu'], '.0f'):>7}% "
                   f"{_cell(f['gpu_util'], '.0f'):>7}%")
            rows.append(row)
            print(f"  {header.strip()}\n  {row.strip()}", flush=True)
    except KeyboardInterrupt:   # run_one stops its run on the way out
        print(f"  {name}: interrupted; it is left out, and no further run starts", flush=True)
        interrupted = True
    print()
    print(f"rl_dqn pipeline on {os.cpu_count()} CPU cores: {' '.join([args.config, *args.overrides])}, "
          f"{args.seconds:g} s per run from its first update (ratio 0: its first data)")
    print(header)
    print("\n".join(rows))
    return 130 if interrupted else 0 if rows else 1


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
