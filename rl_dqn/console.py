"""Console lines: one per role and event, progress bars with an ETA. No torch here: the node launchers use it."""

from __future__ import annotations

import argparse
import os
import sys
import time

# A collector's machine-readable progress line starts with its role and this mark; a node's launcher sums them,
# and sets PROGRESS_ENV=1 for the processes it starts so that they write these lines.
PROGRESS_MARK = "@progress"
PROGRESS_ENV = "RL_DQN_PROGRESS_LINES"
# time.time() when the run's command started, handed down to the processes it starts: the run's clock (time to a
# score) counts from there. A benchmark that starts the command may set it earlier.
LAUNCHED_AT_ENV = "RL_DQN_LAUNCHED_AT"


class OneLineParser(argparse.ArgumentParser):
    """Command-line parsing whose errors are one line, `<name>: error: <message> (usage: ...)`, and exit code 2."""

    name = "rl_dqn"

    def error(self, message):
        usage = " ".join(self.format_usage().split()).removeprefix("usage: ")
        self.exit(2, f"{self.name}: error: {message} (usage: {usage})\n")


def say(role: str, message: str) -> None:
    """One console line, prefixed with the role."""
    print(f"[{role}] {message}", file=sys.stdout, flush=True)


def progress_bar(fraction: float, width: int = 20) -> str:
    filled = round(max(0.0, min(fraction, 1.0)) * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def duration(seconds: float) -> str:
    """4s, 3m05s, 2h07m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress(done: int, total: int, rate: float) -> str:
    """`1,234/10,000 [##------------------] 12% ETA 3m05s` at `rate` per second."""
    eta = f"ETA {duration((total - done) / rate)}" if rate > 0 and done < total else "ETA -"
    return f"{done:,}/{total:,} {progress_bar(done / total)} {100 * done / total:3.0f}% {eta}"


def launched_at() -> float | None:
    """time.time() when the run's command started (LAUNCHED_AT_ENV), or None where it was not set."""
    try:
        return float(os.environ[LAUNCHED_AT_ENV])
    except (KeyError, ValueError):
        return None


def process_started_at() -> float | None:
    """time.time() when this process started (Linux: /proc), or None where that cannot be read."""
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])   # field 22: starttime
        boot = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class StartupClock:
    """Where a role's start-up goes, in seconds from the run's launch (`launched_at`, time.time() when its command
    started; this process's own start where there is none): `mark()` each step as it ends, `line()` the whole."""

    def __init__(self, launched_at: float | None):
        started = process_started_at()
        self.launched_at = launched_at if launched_at is not None else started or time.time()
        self.marks: list[tuple[str, float]] = []
        if started is not None and launched_at is not None:
            self.marks.append(("process", started - self.launched_at))

    def mark(self, step: str) -> None:
        self.marks.append((step, time.time() - self.launched_at))

    def line(self) -> str:
        """`from launch: process 0.4 s, joined 2.9 s, ...`: when each step ended."""
        return "from launch: " + ", ".join(f"{step} {seconds:.1f} s" for step, seconds in self.marks)
