"""Command-line input shared by the benchmarks: a parser whose errors are one line with exit code 2, and argparse
types that refuse, before any work, what would crash a benchmark or lose what it measured.

Imported by the scripts beside it, whose folder is on sys.path when they run.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from envs.config import ConfigError  # noqa: E402
from rl_dqn.config import FOLDER_NAME, RUN_SEED_MAX  # noqa: E402
from rl_dqn.console import OneLineParser, description  # noqa: E402


def parser(doc: str, **kwargs) -> OneLineParser:
    """A benchmark's parser: `<script>.py: error: <message> (usage: ...)`, exit code 2."""
    made = OneLineParser(description=description(doc), **kwargs)
    made.name = made.prog
    return made


def count(text: str) -> int:
    """An integer >= 1, for an argparse type."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def seed(text: str) -> int:
    """A seed from 0 to 2^31 - 1 (run.seed's range), for an argparse type."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= RUN_SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {RUN_SEED_MAX:,}, got {text!r}")
    return value


def counts(text: str) -> list[int]:
    """`20,8,4`: integers >= 1 separated by commas, for an argparse type."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be integers >= 1 separated by commas, got {text!r}")
    return values


def positive(text: str) -> float:
    """A finite number > 0, for an argparse type: nan passes a `<= 0` check and inf never ends a timed loop."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def non_negative(text: str) -> float:
    """A finite number >= 0, for an argparse type."""
    value = _number(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def finite(text: str) -> float:
    """A finite number, for an argparse type: nan compares false with every score, so it is never reached."""
    value = _number(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def probability(text: str) -> float:
    """A number in [0, 1], for an argparse type."""
    value = _number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r}")
    return value


def folder_name(text: str) -> str:
    """A run-name prefix, for an argparse type: empty (the script's default) or a folder name as run.name takes, so
    that the runs and their logs land in runs/ and nowhere else."""
    if text and (FOLDER_NAME.fullmatch(text) is None or text in (".", "..")):
        raise argparse.ArgumentTypeError(f"must be a folder name of letters, digits and ._+=- characters, got "
                                         f"{text!r}")
    return text


def config_error(error: ConfigError, config: str | Path, overrides: list[str], flag: str) -> str:
    """A parser.error message for a config that load_config refused, naming what it came from: the config file, an
    override given with `flag` (e.g. --set), or a key in the file itself."""
    if error.key == "config":
        return f"config {config}: {str(error).removeprefix('config: ')}"
    given = [o for o in overrides if o == error.key or o.startswith(f"{error.key}=")]
    return f"{flag} {given[-1]}: {error}" if given else f"config {config}: {error}"


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
