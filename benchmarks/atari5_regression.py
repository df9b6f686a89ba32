"""Refit the Atari-5 coefficients (rl_dqn.atari_scores.ATARI5) from a checkout of https://github.com/maitchison/Atari-5.

    python benchmarks/atari5_regression.py PATH_TO_ATARI5_CHECKOUT

Does what the repository's atari5.py does (run_init, fit_model) without pandas or scikit-learn: loads
PapersWithCode.csv as committed and the additional CSVs, drops BANNED_ALGOS, normalises with Atari-Human.csv, keeps
the algorithms with scores for at least 40 of the 57 games and a 57-game median above 40%, and fits
log10(1 + median) on log10(1 + max(HNS, 0)) of the five games, with no intercept, over the algorithms that have all
five. Prints the coefficients, how many algorithms they were fitted on, the 10-fold cross-validated relative error as
atari5.py reports it, and whether they match ATARI5 to 3 significant digits (exit status 1 if not).
"""

from __future__ import annotations

import ast
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arguments  # noqa: E402  (benchmarks/arguments.py, beside this script)
from rl_dqn.atari_scores import ATARI5  # noqa: E402

# atari5.py builds this list inside run_init; these are its entries with the file's defaults
# (USE_RAINBOW_RIVERRAID = True, USE_UPDATED_A3C = False, INCLUDE_FIRSTRETURN = False).
ADDITIONAL_DATA_SETS = ["RAINBOW (fixed).csv", "SEED.csv", "INCREASE.csv", "DRLQR.csv", "BOOTDQN.csv", "LASER.csv",
                        "REVISITING.csv", "NEAT.csv", "REACTOR.csv", "NGU.csv", "SIMPLE.csv"]
PAPERS_WITH_CODE = "PapersWithCode.csv"
HUMAN_SCORES = "Atari-Human.csv"
REQUIRED = ["atari5.py", "atari_util.py", HUMAN_SCORES, PAPERS_WITH_CODE, *ADDITIONAL_DATA_SETS]
# ATARI5's ALE names in the repository's spelling.
REPO_NAMES = {"BattleZone": "battlezone", "DoubleDunk": "doubledunk", "NameThisGame": "namethisgame",
              "Phoenix": "phoenix", "Qbert": "qbert"}
# atari5.py's "good" algorithms: scores for at least MIN_GAMES of the 57 games and a 57-game median above MIN_MEDIAN
# (human-normalised, percent).
MIN_GAMES, MIN_MEDIAN = 40, 40.0
CV_FOLDS, CV_SEED = 10, 1982  # atari5.py's KFold(10, shuffle=True, random_state=1982)


class Score(NamedTuple):
    source: str
    """the CSV's name up to its first dot, as atari5.py's 'Source' (BANNED_ALGOS names are '<source>.<algorithm>')"""
    algorithm: str
    game: str
    """in the repository's spelling, e.g. 'battlezone'"""
    score: float
    """raw game score"""


def read_literal(path: Path, name: str) -> Any:
    """The value of the first module-level `name = <literal>` in a Python file, read without importing the file
    (atari5.py imports scikit-learn, statsmodels and matplotlib)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{path} has no module-level {name}")


def clean_game(name: str, aliases: dict[str, str | None]) -> str | None:
    """atari5.py's clean_up_atari_game_name: letters only, lower case, then its game_map (None: not one of the 57)."""
    key = "".join(c for c in name if c.isalpha()).lower()
    return aliases.get(key, key)


def parse_cell(text: str) -> float:
    """A score in the additional CSVs: '-' or empty is none; NGU.csv writes thousands as '189.1k'."""
    if text in ("", "-"):
        return math.nan
    return float(text[:-1]) * 1000 if text.endswith("k") else float(text)


def load_scores(checkout: Path, aliases: dict[str, str | None]) -> list[Score]:
    """Every (algorithm, game) score of PapersWithCode.csv and the additional CSVs, in atari5.py's row order."""
    with open(checkout / PAPERS_WITH_CODE, newline="", encoding="utf-8") as f:
        scores = [Score("PapersWithCode", row["Algorithm"], row["Game"].lower(), float(row["Score"] or "nan"))
                  for row in csv.DictReader(f)]
    for name in ADDITIONAL_DATA_SETS:
        with open(checkout / name, newline="", encoding="utf-8") as f:
            header, *rows = csv.reader(f)
        # pandas.melt order: every game of the first algorithm column, then the next column
        for column, algorithm in enumerate(header[1:], start=1):
            for row in rows:
                game, value = clean_game(row[0], aliases), parse_cell(row[column])
                if game is not None and not math.isnan(value):
                    scores.append(Score(name.split(".")[0], algorithm, game, value))
    return scores


def load_human(checkout: Path, aliases: dict[str, str | None]) -> dict[str, tuple[float, float]]:
    """Atari-Human.csv as game -> (random score, human score)."""
    with open(checkout / HUMAN_SCORES, newline="", encoding="utf-8") as f:
        return {clean_game(row["Game"], aliases): (float(row["Random"]), float(row["Human"]))
                for row in csv.DictReader(f)}


def log_score(hns: float) -> float:
    """atari5.py's transform: log10(1 + max(x, 0)); nan stays nan."""
    return math.log10(1 + max(hns, 0.0)) if not math.isnan(hns) else math.nan


def fit_data(checkout: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """The regression's inputs (one row per algorithm with all five games, by name) and targets, and how many
    algorithms met the 40-game and 40% requirements."""
    printable_57 = read_literal(checkout / "atari_util.py", "canonical_57")
    canonical_57 = {"".join(game.split(" ")).lower() for game in printable_57}
    banned = read_literal(checkout / "atari5.py", "BANNED_ALGOS")
    aliases = read_literal(checkout / "atari5.py", "game_map")
    aliases.update({game.split(" ")[0].lower(): "".join(game.split(" ")).lower()
                    for game in printable_57 if " " in game})
    human = load_human(checkout, aliases)

    def hns(s: Score) -> float:
        random, best = human.get(s.game, (math.nan, math.nan))
        return 100 * (s.score - random) / (best - random)

    kept = [s for s in load_scores(checkout, aliases)
            if f"{s.source}.{s.algorithm}" not in banned and not s.algorithm.startswith("_")]
    # The median uses an algorithm's last score on each game; the inputs average its scores on a game (the mean of
    # atari5.py's pivot_table), which differ only where an algorithm name appears twice.
    last: dict[str, dict[str, float]] = defaultdict(dict)
    logs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for s in kept:
        last[s.algorithm][s.game] = hns(s)
        if not math.isnan(hns(s)):
            logs[s.algorithm, s.game].append(log_score(hns(s)))
    targets = {}
    for algorithm, games in last.items():
        of_57 = [value for game, value in games.items() if game in canonical_57]
        median = float(np.median(of_57)) if of_57 else math.nan  # nan if any score is nan, as in atari5.py
        if len(of_57) >= MIN_GAMES and median > MIN_MEDIAN:
            targets[algorithm] = log_score(median)
    fitted = [a for a in sorted(targets) if all(logs[a, REPO_NAMES[game]] for game in ATARI5)]
    x = np.array([[np.mean(logs[a, REPO_NAMES[game]]) for game in ATARI5] for a in fitted])
    y = np.array([targets[a] for a in fitted])
    return x, y, len(targets)


def fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares without intercept, as LinearRegression(fit_intercept=False)."""
    return np.linalg.lstsq(x, y, rcond=None)[0]


def cross_validated_error(x: np.ndarray, y: np.ndarray) -> float:
    """atari5.py's relative error, in percent: the mean over KFold(10, shuffle=True, random_state=1982) of each
    fold's mean absolute log10 error, times ln(10) * 100."""
    order = np.arange(len(y))
    np.random.RandomState(CV_SEED).shuffle(order)
    errors = []
    for test in np.array_split(order, CV_FOLDS):
        train = np.setdiff1d(order, test)
        errors.append(np.abs(x[test] @ fit(x[train], y[train]) - y[test]).mean())
    return float(np.mean(errors)) * math.log(10) * 100


def same_to_3_digits(a: float, b: float) -> bool:
    """Whether `a` is within half a unit of the third significant digit of `b`."""
    return abs(a - b) <= 0.5 * 10 ** (math.floor(math.log10(abs(b))) - 2)


def main() -> int:
    parser = arguments.parser(__doc__)
    parser.add_argument("checkout", type=Path, help="a checkout of github.com/maitchison/Atari-5")
    checkout = parser.parse_args().checkout
    missing = [name for name in REQUIRED if not (checkout / name).is_file()]
    if missing:
        parser.error(f"checkout {checkout}: not a checkout of github.com/maitchison/Atari-5 (no "
                     f"{', '.join(missing)})")
    x, y, qualified = fit_data(checkout)
    coefficients = fit(x, y)
    print(f"fitted on {len(y)} algorithms (of {qualified} with >= {MIN_GAMES} of the 57 games and a median "
          f"above {MIN_MEDIAN:.0f}%)")
    print(f"{'game':<14} {'fitted':>10} {'ATARI5':>10}")
    for game, value in zip(ATARI5, coefficients):
        print(f"{game:<14} {value:>#10.4g} {ATARI5[game]:>#10.4g}")
    print(f"10-fold cross-validated relative error: {cross_validated_error(x, y):.1f}%")
    matches = all(same_to_3_digits(value, ATARI5[game]) for game, value in zip(ATARI5, coefficients))
    print(f"matches rl_dqn/atari_scores.py ATARI5 to 3 significant digits: {'yes' if matches else 'no'}")
    return 0 if matches else 1


if __name__ == "__main__":
    sys.exit(main())
