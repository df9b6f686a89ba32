"""Learning curves from runs' TensorBoard events, as a PNG and a table:

    python -m rl_dqn.plot runs/<name> [runs/<other> ...] [--out curve.png] [--target 18] [--labels a,b]

Each run's evaluation score (the mean over its evaluation episodes, shaded one standard deviation of those episodes
either side) against wall minutes from launch on the left and against env steps on the right, every run on the same
two axes. The table gives each run's time and env steps to each `--scores` level (the first evaluation whose mean
reached it, at the moment its round finished) and its last and best score. A round that stopped at its screen
(eval.screen_episodes) is an open circle on the figure and marked * in the table.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

from rl_dqn.console import OneLineParser, description, duration


class EvalPoint(NamedTuple):
    env_steps: int      # env steps of the run when the evaluated weights were taken
    seconds: float      # seconds on the run's clock (from launch) when the round's score was known
    mean: float         # mean raw score of the round's episodes
    std: float          # their standard deviation
    logged_at: float = 0.0   # time.time() when the learner logged it (a resumed run's clock leaves out downtime)
    screened: bool = False   # the round stopped at its screen: the mean of eval.screen_episodes episodes


class PlotError(ValueError):
    """A folder that is not a run, or a run without evaluations."""


def load_events(run_dir: Path, events=None):
    """The run's TensorBoard scalars, every one kept (an EventAccumulator, reloaded; given one from an earlier
    call, it reads only what was written since). A resumed run's event files are read together, and what its
    earlier process wrote after the checkpoint it resumed from is left out, as TensorBoard leaves it out: without
    the warning TensorBoard prints for each such purge."""
    import logging

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    quiet = logging.getLogger("tensorboard")
    purges = _PurgeWarnings()
    quiet.addFilter(purges)
    try:
        events = events or EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        events.Reload()
    finally:
        quiet.removeFilter(purges)
    return events


class _PurgeWarnings:
    """A logging filter that drops TensorBoard's "Detected out of order event.step ..." (a resumed run)."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith("Detected out of order event.step")


def read_evals(run_dir: Path, events=None) -> list[EvalPoint]:
    """The evaluation rounds a run logged (eval/episode_return, eval/episode_return_std, eval/time_from_launch_s),
    in order of env steps, a resumed run's as `load_events` reads them (`events`: its accumulator to go on with)."""
    if not run_dir.is_dir():
        raise PlotError(f"{run_dir}: no such folder (a run folder is runs/<name>)")
    if not any(run_dir.glob("events.out.tfevents.*")):
        raise PlotError(f"{run_dir} holds no TensorBoard events (is it a run folder, runs/<name>?)")
    events = load_events(run_dir, events)
    try:
        events.FirstEventTimestamp()
    except ValueError:   # TensorBoard skips what it cannot parse, and found not one event
        raise PlotError(f"{run_dir}: its events.out.tfevents.* files hold no event TensorBoard can read (damaged, "
                        f"or not written by a run)") from None
    tags = set(events.Tags()["scalars"])
    wanted = ("eval/episode_return", "eval/episode_return_std", "eval/time_from_launch_s")
    if not set(wanted) <= tags:
        raise PlotError(f"{run_dir} has no evaluations with times (eval.every_env_steps=0, or no round finished)")
    columns = [{e.step: e for e in events.Scalars(tag)} for tag in wanted]
    steps = sorted(set(columns[0]) & set(columns[1]) & set(columns[2]))
    episodes = {e.step: e.value for e in events.Scalars("eval/episodes")} if "eval/episodes" in tags else {}
    whole = _round_episodes(run_dir)
    return [EvalPoint(step, columns[2][step].value, columns[0][step].value, columns[1][step].value,
                      columns[2][step].wall_time, 0 < episodes.get(step, whole) < whole) for step in steps]


def _round_episodes(run_dir: Path) -> int:
    """eval.episodes of the run (its config.yaml), or 0 where that cannot be read."""
    import yaml
    try:
        return int(yaml.safe_load((run_dir / "config.yaml").read_text())["eval"]["episodes"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return 0


def first_reaching(points: list[EvalPoint], score: float) -> EvalPoint | None:
    """The first evaluation whose mean score is at least `score`."""
    return next((p for p in points if p.mean >= score), None)


def table(runs: dict[str, list[EvalPoint]], scores: list[float]) -> str:
    """One line per run: time from launch (and env steps) to each score, last and best evaluation; a run with no
    evaluation yet has its line too."""
    head = ["run", "evals", *[f"to {s:g}" for s in scores], "last", "best"]
    rows = []
    for label, points in runs.items():
        reached = [first_reaching(points, s) for s in scores]
        cells = [f"{duration(p.seconds)} ({p.env_steps / 1e3:,.0f}k){'*' * p.screened}" if p is not None
                 else "not reached" for p in reached]
        if not points:   # stopped before its first round finished
            rows.append([label, "0", *cells, "none", "none"])
            continue
        last = points[-1]
        rows.append([label, str(len(points)), *cells,
                     f"{last.mean:.1f}{'*' * last.screened} at {duration(last.seconds)}",
                     f"{max(p.mean for p in points):.1f}"])
    lines = aligned([head, *rows])
    if any("*" in cell for row in rows for cell in row):
        lines.append("* a round that stopped at its screen: the mean of its eval.screen_episodes episodes only")
    return "\n".join(lines)


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows of cells as lines of text, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def fitted_title(title: str, inches: float, size: str = "large") -> str:
    """`title` broken into lines that fit a figure `inches` wide at matplotlib's font `size` (`large`, a suptitle's
    default, or `medium`): a long benchmark's title would otherwise run past both edges of the PNG."""
    per_inch = {"large": 10, "medium": 12}[size]   # characters of DejaVu Sans at 100 dpi, with a margin
    return textwrap.fill(title, max(20, int(inches * per_inch)), break_on_hyphens=False)


def draw(runs: dict[str, list[EvalPoint]], out: Path, targets: list[float] = (), title: str = "") -> None:
    """Score against wall minutes and against env steps, every run on both axes, into a PNG."""
    import matplotlib
    matplotlib.use("Agg")   # files only, no display
    import matplotlib.pyplot as plt

    figure, (by_time, by_steps) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    # Ten colours, then tab20's lighter shades of the same ten: no two of up to 20 runs share one.
    colours = [plt.get_cmap("tab20").colors[i] for i in (*range(0, 20, 2), *range(1, 20, 2))]
    for (label, points), colour in zip(runs.items(), itertools.cycle(colours)):
        mean = [p.mean for p in points]
        low = [p.mean - p.std for p in points]
        high = [p.mean + p.std for p in points]
        for axes, x in ((by_time, [p.seconds / 60 for p in points]), (by_steps, [p.env_steps / 1e6 for p in points])):
            (line,) = axes.plot(x, mean, label=label, color=colour)
            axes.fill_between(x, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
            for screened in (False, True):   # rounds that stopped at their screen: open circles
                chosen = [(xi, m) for xi, m, p in zip(x, mean, points) if p.screened == screened]
                if chosen:
                    axes.plot(*zip(*chosen), linestyle="none", marker="o" if screened else ".",
                              markersize=4 if screened else 6, color=line.get_color(),
                              markerfacecolor="none" if screened else line.get_color())
    for axes, xlabel in ((by_time, "wall minutes from launch"), (by_steps, "env steps (millions)")):
        for target in targets:
            axes.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        axes.set_xlabel(xlabel)
        axes.grid(alpha=0.3)
    by_time.set_ylabel("evaluation score (mean, +- std of episodes)")
    if any(p.screened for points in runs.values() for p in points):
        by_steps.annotate("o: a round that stopped at its screen (fewer episodes)", (0.01, 0.01),
                          xycoords="axes fraction", fontsize="x-small", color="grey")
    by_time.legend(fontsize="small", loc="lower right")
    if title:
        figure.suptitle(fitted_title(title, figure.get_figwidth()))
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)


def draw_games(games: dict[str, dict[str, list[EvalPoint]]], out: Path, title: str = "",
               levels: dict[str, dict[str, float]] | None = None, by_env_steps: bool = False,
               steps: dict[str, dict[str, tuple[int, tuple[float, ...]]]] | None = None) -> None:
    """A grid of games, each its evaluation score against wall minutes from launch (or, `by_env_steps`, against
    millions of env steps, where runs on machines of different speeds compare), every run of it drawn (its label,
    e.g. `seed 2`, in the same colour in every game), each game's `levels` (by name, e.g. another agent's score)
    as grey lines of their own dash, and with `by_env_steps` each game's `steps` (by name: env steps per step and
    the values, e.g. another agent's score per training iteration) as grey staircases of their own dash, into a
    PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(4, len(games))
    rows = -(-len(games) // columns)
    figure, grid = plt.subplots(rows, columns, figsize=(max(3.6 * columns, 7.0), 2.9 * rows + 0.6), squeeze=False,
                                layout="constrained")
    labels = sorted({label for runs in games.values() for label in runs})
    colours = dict(zip(labels, itertools.cycle(plt.get_cmap("tab10").colors)))
    levels = levels or {}
    steps = (steps or {}) if by_env_steps else {}
    level_names = sorted({name for of_game in [*levels.values(), *steps.values()] for name in of_game})
    dashes = dict(zip(level_names, itertools.cycle(["--", ":", "-."])))
    for axes, (game, runs) in zip(grid.flat, games.items()):
        for name, value in levels.get(game, {}).items():
            axes.axhline(value, color="grey", linestyle=dashes[name], linewidth=0.9)
        for name, (width, values) in steps.get(game, {}).items():
            edges = [i * width / 1e6 for i in range(len(values) + 1)]
            axes.stairs(values, edges, baseline=None, color="grey", linestyle=dashes[name], linewidth=0.9)
        for label, points in runs.items():
            x = [p.env_steps / 1e6 if by_env_steps else p.seconds / 60 for p in points]
            axes.plot(x, [p.mean for p in points], marker=".", markersize=4, label=label,
                      color=colours[label])
        axes.set_title(game, fontsize="medium")
        axes.grid(alpha=0.3)
        axes.tick_params(labelsize="small")
    for axes in grid.flat[len(games):]:
        axes.axis("off")
    for axes in grid[-1]:
        axes.set_xlabel("env steps (millions)" if by_env_steps else "wall minutes from launch", fontsize="small")
    for axes in grid[:, 0]:
        axes.set_ylabel("evaluation score", fontsize="small")
    handles = [plt.Line2D([], [], color=colours[label], marker=".") for label in labels]
    handles += [plt.Line2D([], [], color="grey", linestyle=dashes[name], linewidth=0.9) for name in level_names]
    # As many legend columns as the grid's width holds (Dopamine's names are long): 2 for one game, 3 for two, 4 for
    # three, 6 for four or more.
    figure.legend(handles, [*labels, *level_names], loc="outside lower center",
                  ncols=min(len(labels) + len(level_names), 6, max(2, round(1.5 * columns))), fontsize="small")
    if title:
        figure.suptitle(fitted_title(title, figure.get_figwidth(), "medium"), fontsize="medium")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)


def score_list(text: str) -> list[float]:
    """`0,10,18` as finite numbers, for an argparse type (nan compares false with every score: never reached)."""
    try:
        scores = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        scores = [math.nan]
    if not all(map(math.isfinite, scores)):
        raise argparse.ArgumentTypeError(f"must be finite numbers separated by commas, got {text!r}")
    return scores


def main(argv: list[str] | None = None, prog: str = "python -m rl_dqn.plot") -> int:
    parser = OneLineParser(prog=prog, description=description(__doc__))
    parser.name = "plot"
    parser.add_argument("runs", nargs="+", type=Path, help="run folders, e.g. runs/<name>")
    parser.add_argument("--out", type=Path, default=Path("curve.png"), help="the PNG to write (default curve.png)")
    parser.add_argument("--labels", default="", help="a label per run, separated by commas (default: folder names)")
    parser.add_argument("--target", type=score_list, default=[], help="scores drawn as dashed lines, e.g. 18")
    parser.add_argument("--scores", type=score_list, default=[0.0, 10.0, 18.0],
                        help="scores whose time the table gives (default 0,10,18)")
    parser.add_argument("--title", default="", help="a title over the figure")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [run.name for run in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"--labels gives {len(labels)} labels for {len(args.runs)} runs")
    if len(set(labels)) != len(labels):   # a run per label: two of one label would show as one
        twice = sorted({label for label in labels if labels.count(label) > 1})
        parser.error(f"each run needs a label of its own; {', '.join(twice)} names more than one (give --labels)")
    if args.out.suffix.lower() != ".png" or args.out.is_dir():
        parser.error(f"--out must name a .png file, got {str(args.out)!r}"
                     + (", a folder" if args.out.is_dir() else ""))
    # Its folder is made where missing; one that is there as a file would fail only after the runs were read.
    blocking = next((folder for folder in args.out.parents if folder.exists() and not folder.is_dir()), None)
    if blocking is not None:
        parser.error(f"--out {str(args.out)!r}: {str(blocking)!r} is a file, not a folder")
    try:
        runs = {label: read_evals(run) for label, run in zip(labels, args.runs)}
    except PlotError as e:
        print(f"plot: error: {e}", file=sys.stderr)
        return 2
    print(table(runs, args.scores))
    draw(runs, args.out, args.target, args.title)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
