"""Console lines: one per role and event, progress bars with an ETA. No torch here: the node launchers use it."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

# A collector's machine-readable progress line starts with its role and this mark; a node's launcher sums them,
# and sets PROGRESS_ENV=1 for the processes it starts so that they write these lines.
PROGRESS_MARK = "@progress"
PROGRESS_ENV = "RL_DQN_PROGRESS_LINES"
# time.time() when the run's command started, handed down to the processes it starts: the run's clock (time to a
# score) counts from there. A benchmark that starts the command may set it earlier.
LAUNCHED_AT_ENV = "RL_DQN_LAUNCHED_AT"


def description(doc: str) -> str:
    """A module docstring's first paragraph, for a command's --help: where it leads into the usage lines below it,
    its colon becomes a full stop."""
    first = doc.split("\n\n")[0].strip()
    return first[:-1] + "." if first.endswith(":") else first


class OneLineParser(argparse.ArgumentParser):
    """Command-line parsing whose errors are one line, `<name>: error: <message> (usage: ...)`, and exit code 2."""

    name = "rl_dqn"

    def error(self, message):
        usage = " ".join(self.format_usage().split()).removeprefix("usage: ")
        self.exit(2, f"{self.name}: error: {message} (usage: {usage})\n")


class _ConsoleHandler(logging.Handler):
    """Writes `[role] message` to the current sys.stdout, looked up at each line (so that pytest's capsys and any
    later redirection see it), and flushes it: a node's launcher reads its roles' lines as they come."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            role = getattr(record, "role", record.name.removeprefix("rl_dqn."))
            stream = sys.stdout
            stream.write(f"[{role}] {record.getMessage()}\n")
            stream.flush()
        except Exception:
            self.handleError(record)


# Console lines are records of the "rl_dqn.<role>" loggers, written by one handler on "rl_dqn" that each process sets
# up when it first imports this module. That logger does not propagate, so a root handler (logging.basicConfig)
# does not print them twice. To change what shows, use logging as usual, e.g.
#   logging.getLogger("rl_dqn").setLevel(logging.WARNING)             only the "warning: ..." lines
#   logging.getLogger("rl_dqn.learner").addHandler(logging.FileHandler("learner.log"))
#   logging.getLogger("rl_dqn").propagate = True                       also to the root logger's handlers
def _set_up_console() -> None:
    logger = logging.getLogger("rl_dqn")
    if any(isinstance(h, _ConsoleHandler) for h in logger.handlers):
        return
    logger.addHandler(_ConsoleHandler())
    if logger.level == logging.NOTSET:   # a level the user set before this import stays
        logger.setLevel(logging.INFO)
    logger.propagate = False


_set_up_console()


def say(role: str, message: str) -> None:
    """One console line, `[role] message`, logged by the "rl_dqn.<role>" logger: at WARNING for a message that
    starts with "warning:", else at INFO."""
    level = logging.WARNING if message.startswith("warning:") else logging.INFO
    logging.getLogger(f"rl_dqn.{role}").log(level, message, extra={"role": role})


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


def first_line(error: BaseException) -> str:
    """An error's message as one line: its first ("" where it has none); load_state_dict's, YAML's and torch's run
    over several."""
    return (str(error).strip().splitlines() or [""])[0]


def proc_stat(pid: int | str = "self") -> list[str]:
    """/proc/<pid>/stat's fields from the state on (field 3), past the command name, which may hold spaces and
    parentheses: [0] the state, [1] the parent's pid, [19] the start in clock ticks since boot. OSError where the
    process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_started_at() -> float | None:
    """time.time() when this process started (Linux: /proc), or None where that cannot be read. Its age is the
    uptime less its start in clock ticks since boot, both to 10 ms (the boot time /proc/stat gives is in whole
    seconds, too coarse for a start-up line)."""
    try:
        ticks = int(proc_stat()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """Where a role's start-up goes, in seconds from the run's launch (`launched_at`, time.time() when its command
    started; this process's own start where there is none): `mark()` each step as it ends, `line()` the whole."""

    def __init__(self, launched_at: float | None):
        started = process_started_at()
        self.launched_at = launched_at if launched_at is not None else started or time.time()
        self.marks: list[tuple[str, float]] = []
        if started is not None and launched_at is not None:
            # At least 0: a launch this process marked itself is its own start, read again (/proc's clocks: 10 ms).
            self.marks.append(("process", max(0.0, started - self.launched_at)))

    def mark(self, step: str) -> None:
        self.marks.append((step, time.time() - self.launched_at))

    def line(self) -> str:
        """`from launch: process 0.4 s, joined 2.9 s, ...`: when each step ended."""
        return "from launch: " + ", ".join(f"{step} {seconds:.1f} s" for step, seconds in self.marks)
