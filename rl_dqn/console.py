"""Console lines: one per role and event, progress bars with an ETA. No torch here: the node launchers use it."""

from __future__ import annotations

import argparse
import sys

# A collector's machine-readable progress line starts with its role and this mark; a node's launcher sums them,
# and sets PROGRESS_ENV=1 for the processes it starts so that they write these lines.
PROGRESS_MARK = "@progress"
PROGRESS_ENV = "RL_DQN_PROGRESS_LINES"


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
