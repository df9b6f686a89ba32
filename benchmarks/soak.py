"""Soak: a one-node run left alone for a long time while a random collector is killed every few minutes.

    python benchmarks/soak.py --minutes 30 --kill-every-s 180 [--hang-share 0.5 [--hang-s S]] [CONFIG]
                              [section.key=value ...]

With --hang-share, that share of the faults hangs the collector instead (SIGSTOP, then SIGCONT --hang-s later): the
learner should drop it once its ping goes unanswered, and the woken process learn that it is out, exit and be
replaced.

Prints, at the end: how long the learner ran and whether it ever stopped training, every fault and how long the
slot took to get a new process contributing again, what data was lost (chunks dropped or refused, and whether
replay ever shrank), and the learner's memory over the run (resident set size, first and last quarter).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from rl_dqn.config import MAX_RESTARTS, ConfigError, load_config  # noqa: E402


def rss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024


def pids_of(run: str) -> dict[str, int]:
    out = subprocess.run(["pgrep", "-af", f"run.name={run}"], capture_output=True, text=True).stdout
    roles = {}
    for line in out.splitlines():
        pid, command = line.split(maxsplit=1)
        if " -m rl_dqn learner " in command:
            roles["learner"] = int(pid)
        elif (index := re.search(r"--local-index=(\d+)", command)) is not None:
            roles[f"collector{index.group(1)}"] = int(pid)
    return roles


def main() -> int:
    parser = arguments.parser(__doc__)
    parser.add_argument("config", nargs="?", default="configs/smoke.yaml")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    parser.add_argument("--minutes", type=arguments.positive, default=30.0)
    parser.add_argument("--kill-every-s", type=arguments.positive, default=180.0)
    parser.add_argument("--hang-share", type=arguments.probability, default=0.0,
                        help="the share of faults that hang a collector (SIGSTOP) rather than kill it")
    parser.add_argument("--hang-s", type=arguments.positive, default=None,
                        help="how long a hung collector stays stopped before SIGCONT wakes it (default: twice the "
                             "5 s + transport.rpc_timeout_s within which the learner drops a hung collector)")
    parser.add_argument("--seed", type=arguments.seed, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    run = f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    # Every fault may land on one slot: its launcher must restart it that often (collectors.max_restarts), or the
    # node stops, as it is meant to, once a slot has used its restarts.
    restarts = min(MAX_RESTARTS, math.ceil(args.minutes * 60 / args.kill_every_s))
    settings = [f"run.name={run}", "train.total_env_steps=1000000000000", "metrics.interval_s=5",
                "eval.every_env_steps=0", f"collectors.max_restarts={max(10, restarts)}", *args.overrides]
    # Checked as the launch checks it, before a folder for the run is made: a refused run leaves no summary to read.
    try:
        cfg = load_config(ROOT / args.config, settings)
    except ConfigError as e:
        parser.error(arguments.config_error(e, args.config, args.overrides, "override"))
    if args.hang_s is None:
        args.hang_s = 2 * (5 + cfg.transport.rpc_timeout_s)
    runs = Path(os.environ.get("RL_DQN_RUNS_DIR") or tempfile.mkdtemp(prefix="soak-"))
    command = [sys.executable, "-m", "rl_dqn", "local", args.config, *settings]
    env = dict(os.environ, RL_DQN_RUNS_DIR=str(runs), PYTHONPATH=str(ROOT))
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in process.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    threading.Thread(target=read, daemon=True).start()
    started = time.monotonic()
    end = started + args.minutes * 60
    memory: list[tuple[float, float]] = []
    kills: list[tuple[float, str, bool]] = []   # (when, which collector, hung rather than killed)
    stopped: dict[int, float] = {}   # pid of a hung collector -> when it is woken
    learner_pids = set()
    next_kill = started + args.kill_every_s

    def wake(pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        del stopped[pid]

    while time.monotonic() < end and process.poll() is None:
        time.sleep(min(5.0, args.hang_s / 4))
        for pid in [pid for pid, at in stopped.items() if time.monotonic() >= at]:
            wake(pid)
        roles = pids_of(run)
        if "learner" in roles:
            learner_pids.add(roles["learner"])
            if (mb := rss_mb(roles["learner"])) is not None:
                memory.append((time.monotonic() - started, mb))
        collectors = sorted(name for name in roles if name.startswith("collector") and roles[name] not in stopped)
        if time.monotonic() >= next_kill and collectors:
            victim = rng.choice(collectors)
            hang = rng.random() < args.hang_share
            os.kill(roles[victim], signal.SIGSTOP if hang else signal.SIGKILL)
            kills.append((time.monotonic(), victim, hang))
            if hang:
                stopped[roles[victim]] = time.monotonic() + args.hang_s
            print(f"[soak] {time.monotonic() - started:7.0f} s: {'hung' if hang else 'killed'} {victim} "
                  f"(pid {roles[victim]})", flush=True)
            next_kill += args.kill_every_s
    for pid in list(stopped):   # a stopped process would not hear the launcher's SIGTERM
        wake(pid)
    alive_at_end = process.poll() is None
    if alive_at_end:
        process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=60)
    wall = time.monotonic() - started

    # Each fault: when the learner dropped a hung process, when its slot's new process joined and when that process
    # acted (its first chunk follows at once).
    def after(at: float, text: str) -> float | None:
        return next((t - at for t, line in lines if t > at and text in line), None)
    recoveries = [(victim, hang, after(at, f"[learner] {victim} lost: ") if hang else None,
                   after(at, f"[learner] {victim} joined"), after(at, f"[{victim}] acting in"))
                  for at, victim, hang in kills]
    summary = json.loads((runs / run / "summary.json").read_text())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(runs / run), size_guidance={"scalars": 0})
    events.Reload()
    rates = [e.value for e in events.Scalars("learner/updates_per_s")]
    replay = [e.value for e in events.Scalars("learner/replay_size")]
    first_training = next((i for i, r in enumerate(rates) if r > 0), len(rates))
    idle = sum(1 for r in rates[first_training:-1] if r == 0)

    faults = "killed or hung" if args.hang_share else "killed"
    print(f"\nsoak of {run}: {wall / 60:.1f} min, a collector {faults} every {args.kill_every_s:g} s; "
          f"launcher exit {code} ({'ended by the soak' if alive_at_end else 'ended by itself'})")
    if not alive_at_end:
        print("the launcher's last lines:\n" + "\n".join(f"  {line}" for _, line in lines[-15:]))
    print(f"learner: {len(learner_pids)} process(es) over the whole run (1 = never restarted); "
          f"{summary['env_steps']:,} env steps, {summary['updates']:,} updates; "
          f"{idle} of {len(rates) - first_training - 1} five-second intervals without an update once training began")
    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:.1f} s"
    for victim, hang, lost, joined, acting in recoveries:
        print(f"  {f'hung {victim} for {args.hang_s:g} s' if hang else f'killed {victim}'}: "
              + (f"dropped by the learner after {seconds(lost)}, " if hang else "")
              + f"new process joined after {seconds(joined)}, acting after {seconds(acting)}")
    # Replay size counts drawable transitions: once the memory is full it moves a little as the lanes' heads
    # advance (a transition is drawable once its n steps are in). Before that, a fall would be lost data.
    full = next(i for i, size in enumerate(replay) if size >= 0.99 * max(replay))
    shrank = sum(1 for a, b in zip(replay[:full + 1], replay[1:full + 1]) if b < a)
    print(f"data lost: {summary['dropped_chunks']} chunks dropped, refused {summary['rejected_chunks'] or 'none'}; "
          f"replay size fell {shrank} times while filling; once full it stayed in "
          f"{min(replay[full:]):,.0f}..{max(replay):,.0f} drawable transitions")
    if memory:
        quarter = max(1, len(memory) // 4)
        first = sum(mb for _, mb in memory[:quarter]) / quarter
        last = sum(mb for _, mb in memory[-quarter:]) / quarter
        print(f"learner memory (RSS): {first:,.0f} MB in the first quarter, {last:,.0f} MB in the last "
              f"({last - first:+,.0f} MB over {(memory[-1][0] - memory[0][0]) / 60:.0f} min); peak "
              f"{max(mb for _, mb in memory):,.0f} MB")
    print("per slot: " + ", ".join(f"{name} {s['processes']} processes, {s['env_steps']:,} env steps"
                                    for name, s in summary["collectors"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
