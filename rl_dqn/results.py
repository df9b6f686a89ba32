"""Results as records, and the page generated from them.

    python -m rl_dqn.results record runs/<name> BENCHMARK   keep a finished run as results/BENCHMARK/<name>/
    python -m rl_dqn.results                                write docs/results.md and its figures from results/
    python -m rl_dqn.results --check                        exit 1 if docs/results.md or its figures' folder is not
                                                            what results/ gives

A record is what a reported result rests on, small enough to commit: the config as the run ran it (config.yaml), its
code and machine (run.json), its summary (summary.json) and its evaluation curve (eval.csv: env steps, seconds from
launch, mean score, its standard deviation over the round's episodes, episodes), and where its evaluation cut episodes
short, its final weights' scores in whole games (whole_games.json, benchmarks/whole_games.py). A benchmark is a folder
of records with a benchmark.yaml (its title, what it measures, the command that runs a seed, the scores its table times,
notes on records; for a change tried on a config over games, `against`: the config's benchmark, read env step for env
step, and for a change that acts only late in a run, `acts_from_env_steps`: where its rounds are split) and, for runs
reported before records existed, an earlier.md whose table the page shows as it is, marked as such, until re-runs
replace it. The page has one section per benchmark: a table with a row per record, linked to it, and a
figure of every record's curve drawn by rl_dqn.plot (for a change read against a base, against env steps beside the
base's seeds, and with `by_minutes` also against wall minutes).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import re
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

import yaml

from envs.config import game_of
from rl_dqn.console import OneLineParser, description, duration, first_line
from rl_dqn.plot import EvalPoint, PlotError, aligned, draw, draw_games, first_reaching, read_evals

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PAGE = ROOT / "docs" / "results.md"
FIGURES = ROOT / "docs" / "results"
BY_MINUTES = "-minutes"   # a benchmark read against a base is drawn against env steps; with by_minutes, also in
                          # <name>-minutes.png against wall minutes
CURVE = "eval.csv"
COLUMNS = ("env_steps", "wall_s", "mean", "std", "episodes")
RUN_FILES = ("config.yaml", "run.json", "summary.json")   # what a record copies from its run
RECORD_FILES = (*RUN_FILES, CURVE)
# What the page reads of a record's config, each an integer but env.id.
RECORD_CONFIG_KEYS = (("run", "seed"), ("eval", "episodes"), ("eval", "every_env_steps"), ("env", "id"))
BENCHMARK_KEYS = ("title", "about", "command")   # what a benchmark.yaml must give; the rest have defaults
# Optional in a record: its run's final weights played in whole games (benchmarks/whole_games.py), where the run's
# evaluation cut its episodes shorter than the games the baselines score.
WHOLE_GAMES = "whole_games.json"


class ResultsError(ValueError):
    """A run that cannot be recorded, or a record or benchmark that cannot be read."""


class Benchmark(NamedTuple):
    name: str             # its folder under results/
    title: str
    about: str            # what it measures and how, a paragraph
    command: str          # the command that runs one seed
    scores: list[float]   # the scores whose time the table gives
    target: float | None  # the score drawn as a dashed line on the figure
    order: int            # its place on the page
    notes: dict[str, str]  # a line about a record, by its folder's name (e.g. what else ran on the machine)
    games: list[str] = []  # a benchmark over Atari games (records told apart by env.id): the games, in table order
    against: str | None = None  # a candidate change's benchmark: the benchmark whose records it is read against
    by_minutes: bool = False  # read against a base: its own seeds also drawn against wall minutes (a final table)
    acts_from: int | None = None  # a change that acts only from these env steps on (a schedule that starts there):
                                  # read against its base before them, where it is the base, and after them apart


class GameRun(NamedTuple):
    """One seed of one game, as the table over games reads it."""
    game: str                  # ALE's name, e.g. Qbert for ALE/Qbert-v5
    seed: int
    points: list[EvalPoint]    # its evaluation curve
    env_steps: int | None      # the run's env steps at its end (summary.json)
    at_epsilon: float | None = None   # its training episodes' mean score at metrics.return_epsilon (summary.json)
    whole_games: float | None = None  # its final weights' mean score in whole games (whole_games.json)


# ------------------------------------------------------------------------------------------------ recording


def record(run_dir: Path, benchmark: str, results: Path = RESULTS) -> Path:
    """Copies what a finished run's result rests on into results/<benchmark>/<run name>/ and writes its evaluation
    curve as eval.csv; returns that folder."""
    check_benchmark_name(benchmark, results)
    folder = results / benchmark
    if not (folder / "benchmark.yaml").is_file():
        known = ", ".join(sorted(p.parent.name for p in results.glob("*/benchmark.yaml"))) or "none yet"
        raise ResultsError(f"no benchmark {benchmark!r} in {results} (a folder with a benchmark.yaml; there are: "
                           f"{known})")
    missing = [name for name in RUN_FILES if not (run_dir / name).is_file()]
    if missing:
        raise ResultsError(f"{run_dir} is not a finished run: it has no {', '.join(missing)}")
    target = folder / run_dir.name
    if target.exists():
        raise ResultsError(f"{target} already holds a record; remove it to record {run_dir} again")
    # Everything is read and checked before the record's folder is made, which then appears whole or not at all.
    try:
        whole = _round_episodes(yaml.safe_load((run_dir / "config.yaml").read_text()))
        command = _json(run_dir / "run.json").get("command") or []
        _json(run_dir / "summary.json").get("ended")
    except (yaml.YAMLError, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise ResultsError(f"{run_dir} is not a finished run of rl_dqn: its config.yaml, run.json or summary.json "
                           f"cannot be read ({type(e).__name__}: {first_line(e)})"
                           ) from None
    (bench,) = [b for b in benchmarks(results) if b.name == benchmark]
    ran, asked = _config_named(" ".join(map(str, command))), _config_named(bench.command)
    if ran and asked and ran != asked:
        raise ResultsError(f"{run_dir} ran {ran}, and benchmark {benchmark} runs {asked}: record it under a "
                           f"benchmark of its config")
    try:
        points = read_evals(run_dir)
        episodes = _episodes_logged(run_dir)
    except PlotError as e:
        raise ResultsError(str(e)) from None
    partial = folder / f".{run_dir.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in RUN_FILES:
        shutil.copyfile(run_dir / name, partial / name)
    with open(partial / CURVE, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(COLUMNS)
        for p in points:
            writer.writerow([p.env_steps, f"{p.seconds:.1f}", f"{p.mean:.4f}", f"{p.std:.4f}",
                             episodes.get(p.env_steps, whole)])
    partial.rename(target)
    return target


def check_benchmark_name(benchmark: str, results: Path = RESULTS) -> None:
    """Refuses a benchmark given as a path (`cartpole/`, `results/cartpole`): a benchmark is named by its folder in
    results/, and a name with a path in it would not match that folder's."""
    if Path(benchmark).name == benchmark and benchmark not in ("", ".", ".."):
        return
    meant = Path(benchmark).name
    hint = (f"did you mean {meant}?" if (results / meant / "benchmark.yaml").is_file() and meant not in ("", "..")
            else "a folder with a benchmark.yaml")
    raise ResultsError(f"benchmark {benchmark!r} is not a benchmark's name: give the name of its folder in {results}, "
                       f"with no path or slash ({hint})")


def _config_named(command: str) -> str | None:
    """The file name of the first YAML config a command names (None: it names none)."""
    found = re.search(r"(\S+)\.yaml\b", command)
    return Path(found.group(0)).name if found else None


def whole_games_path(run_dir: Path, benchmark: str, results: Path = RESULTS) -> Path:
    """Where the whole-game scores of a recorded run's final weights go in its record: results/<benchmark>/<run
    name>/whole_games.json. Refused where the run has no record there, the record is another run's of the same name
    (its run.json differs), or it has them already."""
    target = results / benchmark / run_dir.name
    if not (run_dir / "run.json").is_file():
        raise ResultsError(f"{run_dir} is not a finished run: it has no run.json")
    if not (target / "run.json").is_file():
        raise ResultsError(f"{run_dir.name} has no record in {results / benchmark}: record it first "
                           f"(python -m rl_dqn.results record {run_dir} {benchmark})")
    if _json(target / "run.json") != _json(run_dir / "run.json"):
        raise ResultsError(f"{target} is the record of another run named {run_dir.name}: its run.json differs from "
                           f"{run_dir}'s")
    if (target / WHOLE_GAMES).exists():
        raise ResultsError(f"{target / WHOLE_GAMES} exists; remove it to play {run_dir} again")
    return target / WHOLE_GAMES


def _episodes_logged(run_dir: Path) -> dict[int, int]:
    from rl_dqn.plot import load_events
    events = load_events(run_dir)
    if "eval/episodes" not in events.Tags()["scalars"]:
        return {}
    return {e.step: int(e.value) for e in events.Scalars("eval/episodes")}


def _round_episodes(config: dict) -> int:
    return int(config["eval"]["episodes"])


# ------------------------------------------------------------------------------------------------ reading


def benchmarks(results: Path = RESULTS) -> list[Benchmark]:
    found = []
    for path in sorted(results.glob("*/benchmark.yaml")):
        try:
            data = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise ResultsError(f"{path} is not readable YAML: {_one_line(e)}") from None
        missing = [key for key in BENCHMARK_KEYS if not isinstance(data, dict) or key not in data]
        if missing:
            raise ResultsError(f"{path} has no {', '.join(missing)} (a benchmark.yaml is a mapping that gives at "
                               f"least {', '.join(BENCHMARK_KEYS)})")
        try:
            found.append(Benchmark(path.parent.name, data["title"], data["about"].strip(), data["command"].strip(),
                                   [float(s) for s in data.get("scores", [])], data.get("target"),
                                   int(data.get("order", 100)), dict(data.get("notes") or {}),
                                   [str(g) for g in data.get("games") or []], data.get("against"),
                                   bool(data.get("by_minutes", False)),
                                   None if data.get("acts_from_env_steps") is None
                                   else int(data["acts_from_env_steps"])))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ResultsError(f"{path}: {type(e).__name__}: {_one_line(e)}") from None
    return sorted(found, key=lambda b: (b.order, b.name))


def _one_line(error: Exception) -> str:
    """A parser's error as one line: YAML's names the line and column of its problem."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        return f"{error.problem} (line {error.problem_mark.line + 1}, column {error.problem_mark.column + 1})"
    return " ".join(str(error).split())


def records(benchmark: Benchmark, results: Path = RESULTS) -> list[Path]:
    """The benchmark's record folders, in order of their run's seed, then name. A folder there that lacks a record's
    files is refused, not left off the page; a record being written (.<name>.partial) is not one yet."""
    folders = [p for p in (results / benchmark.name).iterdir() if p.is_dir() and not p.name.startswith(".")]
    for folder in folders:
        missing = [name for name in RECORD_FILES if not (folder / name).is_file()]
        if missing:
            raise ResultsError(f"{folder} is not a whole record: it has no {', '.join(missing)} (a record has "
                               f"{', '.join(RECORD_FILES)})")
    return sorted(folders, key=lambda f: (_config(f)["run"]["seed"], f.name))


def curve(record_dir: Path) -> list[EvalPoint]:
    """A record's evaluation curve as rl_dqn.plot draws it."""
    whole = _round_episodes(_config(record_dir))
    path = record_dir / CURVE
    try:
        with open(path, newline="") as f:
            head, *rows = list(csv.reader(f)) or [[]]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ResultsError(f"{path} cannot be read: {_one_line(e)}") from None
    if not head:
        raise ResultsError(f"{path} is empty: a record's curve is the header {','.join(COLUMNS)} and a row per "
                           f"evaluation round")
    if tuple(head) != COLUMNS:
        raise ResultsError(f"{path} does not start with the header {','.join(COLUMNS)}")
    # record() writes a round per evaluation the run logged, and records only a run that has them.
    if not rows:
        raise ResultsError(f"{path} has no evaluation rounds: a record's curve has at least one")
    points = []
    for line, row in enumerate(rows, start=2):
        try:
            steps, seconds, mean, std, episodes = row
            point = EvalPoint(int(steps), float(seconds), float(mean), float(std),
                              screened=0 < int(episodes) < whole)
        except ValueError:
            point = None
        if point is None or not all(map(math.isfinite, point[1:4])):
            raise ResultsError(f"{path}, line {line}: {','.join(row)!r} is not {len(COLUMNS)} numbers "
                               f"({','.join(COLUMNS)}; env steps and episodes whole)")
        points.append(point)
    return points


def _config(record_dir: Path) -> dict:
    """A record's config.yaml, parsed once per version of the file (the page reads each several times). Not to be
    changed by the caller: the next reader gets the same dict."""
    path = record_dir / "config.yaml"
    try:
        stat = path.stat()
    except OSError:
        raise ResultsError(f"{path}: no such file (a record keeps the config its run ran)") from None
    return _parsed(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4096)
def _parsed(path: Path, mtime_ns: int, size: int) -> dict:
    try:
        # libyaml's parser where PyYAML has it: the Python one takes most of the page's time.
        config = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ResultsError(f"{path} is not readable YAML: {_one_line(e)}") from None
    for section, key in RECORD_CONFIG_KEYS:
        try:
            value = config[section][key]
            if isinstance(value, bool) or not isinstance(value, str if key == "id" else int):
                raise TypeError
        except (KeyError, TypeError):
            raise ResultsError(f"{path} is not a run's config: it has no {section}.{key} that is "
                               + ("a string" if key == "id" else "an integer")) from None
    return config


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ResultsError(f"{path} cannot be read: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path} is not readable JSON ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path} is not a JSON object")
    return data


# ------------------------------------------------------------------------------------------------ the page


def page(results: Path = RESULTS) -> tuple[str, dict[str, dict[str, list[EvalPoint]]]]:
    """docs/results.md, and the curves of each benchmark's figure (by benchmark name, then by label)."""
    parts = ["# Results", "",
             "Generated by `python -m rl_dqn.results` from the records in [results/](../results/): each row links to "
             "its record (the config as it ran, the commit and machine in run.json, summary.json, and the evaluation "
             "curve as eval.csv). Time counts from the launch of the run's command, start-up and evaluation "
             "included; a score is the mean of an evaluation round's episodes, reached when its round finished. "
             "A score marked * is the mean of a round that stopped at its screen (eval.screen_episodes).", ""]
    figures: dict[str, dict[str, list[EvalPoint]]] = {}
    for bench in benchmarks(results):
        parts += [f"## {bench.title}", "", bench.about, "", f"`{bench.command}`", ""]
        folders = records(bench, results)
        if folders and bench.games:
            played = {f: game_run(f) for f in folders}
            random = random_for(bench, results)
            parts += games_markdown(played, bench.games, results, random) + [""]
            # By game, then by seed: rl_dqn.plot.draw_games draws them as a grid.
            figures[bench.name] = {game: {f"seed {run.seed}": run.points for run in played.values()
                                          if run.game == game} for game in _game_order(played.values(), bench.games)}
            if bench.against:
                base, based = _base(bench, results)
                parts += _against_markdown(bench, base, list(played.values()), based, results) + [""]
                if bench.by_minutes:   # its own seeds alone: the base's ran on machines of other speeds
                    figures[bench.name + BY_MINUTES] = {game: dict(runs) for game, runs in figures[bench.name].items()}
                for run in based:   # the base's seeds drawn beside the change's, in the games the change ran
                    if run.game in figures[bench.name]:
                        figures[bench.name][run.game][f"{base.name} seed {run.seed}"] = run.points
        if folders:
            parts += _table(bench, folders, results)
            parts += [""] + [f"- {name}: {note}" for name, note in bench.notes.items()] if bench.notes else []
            if not bench.games:
                figures[bench.name] = {f"seed {_config(f)['run']['seed']}": curve(f) for f in folders}
            drawn = ("each game's evaluation score against env steps, every seed, beside the seeds of "
                     f"{bench.against}" if bench.against else "each game's evaluation score against wall time, "
                     "every seed" if bench.games else "evaluation score against wall time and env steps, every record")
            parts += ["", f"![{bench.title}: {drawn}](results/{bench.name}.png)", ""]
            if bench.name + BY_MINUTES in figures:
                parts += [f"![{bench.title}: each game's evaluation score against wall time, every seed]"
                          f"(results/{bench.name}{BY_MINUTES}.png)", ""]
        earlier = results / bench.name / "earlier.md"
        if earlier.is_file():
            parts += ["Reported before records existed (a table kept as it was written; no record, no curve; a "
                      "re-run with a record replaces it):", "", earlier.read_text().strip(), ""]
    return "\n".join(parts).rstrip() + "\n", figures


def _table(bench: Benchmark, folders: list[Path], results: Path) -> list[str]:
    head = ["run", "seed", *[f"to {s:g}" for s in bench.scores], "last", "best", "env steps/s", "commit",
            "machine"]
    rows = ["| " + " | ".join(head) + " |", "|" + "-|" * len(head)]
    for folder in folders:
        points, summary, info = curve(folder), _json(folder / "summary.json"), _json(folder / "run.json")
        cells = []
        for score in bench.scores:
            p = first_reaching(points, score)
            cells.append("not reached" if p is None else
                         f"{duration(p.seconds)} ({p.env_steps / 1e3:,.0f}k){'*' * p.screened}")
        last = points[-1] if points else None
        rate = summary.get("env_steps_per_s_training") or summary.get("env_steps_per_s")
        commit = (info.get("commit") or "unknown")[:7] + ("+" if info.get("dirty") else "")
        link = folder.relative_to(results.parent).as_posix()
        rows.append("| " + " | ".join([
            f"[{folder.name}](../{link}/)", str(_config(folder)["run"]["seed"]), *cells,
            "-" if last is None else f"{last.mean:.2f}{'*' * last.screened} at {duration(last.seconds)}",
            "-" if not points else f"{max(p.mean for p in points):.2f}",
            "-" if rate is None else f"{rate:,.0f}", commit, _machine(info.get("machine", {}))]) + " |")
    return rows


def _machine(machine: dict) -> str:
    gpus = machine.get("gpus") or []
    family = f" (family {machine['cpu_family']})" if machine.get("cpu_family") else ""
    cpu = f"{machine.get('cores', '?')} cores of {machine.get('cpu', 'an unknown CPU')}{family}"
    extras = ", AMX" if machine.get("amx") else ", AVX512-BF16" if machine.get("avx512_bf16") else ""
    return (f"{gpus[0]}, " if gpus else "") + cpu + extras


def write(results: Path = RESULTS, page_path: Path = PAGE, figures_dir: Path = FIGURES) -> list[Path]:
    """Writes the page and one figure per benchmark with records, removes the figures no benchmark draws any more;
    returns the files written."""
    text, figures = page(results)
    page_path.parent.mkdir(parents=True, exist_ok=True)
    page_path.write_text(text)
    written = [page_path]
    titles = {b.name: b for b in benchmarks(results)}
    for name, curves in figures.items():
        bench = titles.get(name) or titles[name.removesuffix(BY_MINUTES)]
        out = figures_dir / f"{name}.png"
        if bench.games:
            from rl_dqn import atari_scores as ref
            if bench.against and name == bench.name:   # against env steps: Dopamine's agents iteration by iteration
                steps = {game: {name: (ref.ITERATION_ENV_STEPS, curve[game]) for name, curve in (
                    ("Dopamine DQN (training returns)", ref.DOPAMINE_DQN_CURVE),
                    ("Dopamine Rainbow (training returns)", ref.DOPAMINE_RAINBOW_CURVE)) if game in curve}
                    for game in curves}
                draw_games(curves, out, bench.title, by_env_steps=True, steps=steps)
            else:
                levels = {game: {name: scores[game] for name, scores in (
                    ("Dopamine DQN at 10M frames", ref.DOPAMINE_DQN),
                    ("Dopamine Rainbow at 10M frames", ref.DOPAMINE_RAINBOW)) if game in scores}
                    for game in curves}
                draw_games(curves, out, bench.title, levels)
        else:
            draw(curves, out, [bench.target] if bench.target is not None else [], bench.title)
        written.append(out)
    for stale in _stale_figures(figures, figures_dir):
        stale.unlink()
    return written


def _stale_figures(figures: dict, figures_dir: Path) -> list[Path]:
    """The figures in figures_dir that no benchmark draws any more (one renamed, or whose records moved)."""
    return sorted(p for p in figures_dir.glob("*.png") if p.stem not in figures)


# ------------------------------------------------------------------------------------------------ over games


def game_run(record_dir: Path) -> GameRun:
    config, summary = _config(record_dir), _json(record_dir / "summary.json")
    return GameRun(game_of(config["env"]["id"]), int(config["run"]["seed"]), curve(record_dir),
                   summary.get("env_steps"), return_at_epsilon(summary), whole_games_mean(record_dir))


def whole_games_mean(record_dir: Path) -> float | None:
    """The mean score of a record's final weights in whole games (whole_games.json), None where they were not
    played."""
    path = record_dir / WHOLE_GAMES
    if not path.is_file():
        return None
    mean = _json(path).get("mean")
    if isinstance(mean, bool) or not isinstance(mean, (int, float)):
        raise ResultsError(f"{path} has no mean score (`mean`, a number)")
    return mean


def return_at_epsilon(summary: dict) -> float | None:
    """A run's summary.json's mean score of its training episodes at metrics.return_epsilon over its last
    metrics.return_epsilon_env_steps; None for a run that has none (or predates them)."""
    return (summary.get("returns_at_epsilon") or {}).get("mean")


def _game_order(runs, games: list[str]) -> list[str]:
    """`games` first, in their order, then any other game that ran, by name."""
    played = {run.game for run in runs}
    return [g for g in games if g in played] + sorted(played - set(games))


def _score(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def _steps(env_steps: int | None) -> str:
    if env_steps is None:
        return "-"
    return f"{env_steps / 1e6:.2f}M" if env_steps >= 1e6 else f"{env_steps / 1e3:,.0f}k"


GAMES_HEAD = ["game", "last evaluation (each seed)", "mean", "best (each seed)", "env steps (each seed)", "random",
              "random here", "human", "Dopamine DQN", "Dopamine Rainbow", "human-normalised", "at or above Rainbow",
              "Rainbow at the same env steps (each seed)", "seeds at or above it",
              "training episodes at metrics.return_epsilon, mean at the end (each seed)",
              "final weights in whole games (each seed)", "their mean: at or above Rainbow"]
OPTIONAL = 3   # the last columns of GAMES_HEAD, each left out of a table where no run has it
# A benchmark's random.csv (benchmarks/random_scores.py --csv): the random policy's scores, played as its runs evaluate.
RANDOM_CSV = "random.csv"
RANDOM_COLUMNS = ("game", "config", "episodes", "mean", "std", "min", "max")


def random_here(folder: Path, config: str | None = None) -> dict[str, float]:
    """The mean random-policy score of each game in `folder`'s random.csv, if it has one (with `config`, only if
    every row was played with that config file, e.g. atari_cpu.yaml)."""
    if not (folder / RANDOM_CSV).is_file():
        return {}
    path = folder / RANDOM_CSV
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if config is not None and any(row["config"] != config for row in rows):
            return {}
        return {row["game"]: float(row["mean"]) for row in rows}
    except (OSError, UnicodeDecodeError, csv.Error, KeyError, TypeError, ValueError) as e:
        raise ResultsError(f"{path} is not a table of {','.join(RANDOM_COLUMNS)} (benchmarks/random_scores.py "
                           f"--csv): {type(e).__name__}: {_one_line(e)}") from None


def random_for(bench: Benchmark, results: Path) -> dict[str, float]:
    """The random-policy scores beside a benchmark over games: its own random.csv, else that of another benchmark
    whose random policy played with the config file its command runs (a candidate's runs play as its base's do)."""
    config = next((Path(word).name for word in bench.command.split() if word.endswith(".yaml")), None)
    return random_here(results / bench.name) or next(
        (scores for other in benchmarks(results) if config and (scores := random_here(results / other.name, config))),
        {})


def games_rows(runs: list[GameRun], games: list[str], link=None,
               random: dict[str, float] | None = None) -> tuple[list[list[str]], str]:
    """The table over games: a row per game, its seeds' last evaluation (the score at the run's end or time limit),
    their mean, each seed's best and env steps, beside the random and human scores and Dopamine's agents at 10M
    frames (rl_dqn.atari_scores), the random policy's score here (`random`, by game) where measured, the mean's
    human-normalised score (percent) and whether it is at or above Rainbow's; then Rainbow over the same env steps
    as each seed's last evaluation (its training return in that iteration: a run that reached fewer env steps than
    10M frames is read against Rainbow's curve where it stood) and how many seeds are at or above it; and a line with
    the Atari-5 estimate of the 57-game median. `link(run, text)` may wrap a seed's score (the page links it to its
    record)."""
    from rl_dqn import atari_scores as ref
    link = link or (lambda run, text: text)
    random = random or {}
    rows, means = [], {}
    for game in _game_order(runs, games):
        of_game = sorted((r for r in runs if r.game == game and r.points), key=lambda r: r.seed)
        if not of_game:
            continue
        mean = sum(r.points[-1].mean for r in of_game) / len(of_game)
        means[game] = mean
        rainbow = ref.DOPAMINE_RAINBOW.get(game)
        known = game in ref.RANDOM and game in ref.HUMAN
        alongside = [ref.dopamine_at(ref.DOPAMINE_RAINBOW_CURVE, game, r.points[-1].env_steps) for r in of_game]
        level_or_above = sum(value is not None and r.points[-1].mean >= value for r, value in zip(of_game, alongside))
        rows.append([
            game,
            " / ".join(link(r, f"{_score(r.points[-1].mean)} (s{r.seed})") for r in of_game),
            _score(mean),
            " / ".join(_score(max(p.mean for p in r.points)) for r in of_game),
            " / ".join(_steps(r.env_steps) for r in of_game),
            _score(ref.RANDOM.get(game)), _score(random.get(game)), _score(ref.HUMAN.get(game)),
            _score(ref.DOPAMINE_DQN.get(game)), _score(rainbow),
            f"{ref.human_normalized(game, mean):.1f}%" if known else "-",
            "-" if rainbow is None else "yes" if mean >= rainbow else "no",
            "-" if rainbow is None else " / ".join(_score(value) for value in alongside),
            "-" if rainbow is None else f"{level_or_above} of {len(of_game)}",
            "-" if all(r.at_epsilon is None for r in of_game) else
            " / ".join(_score(r.at_epsilon) for r in of_game),
            *_whole_games_cells(of_game, rainbow)])
    return rows, _atari5_line(runs, means)


def _whole_games_cells(of_game: list[GameRun], rainbow: float | None) -> list[str]:
    """Each seed's final weights in whole games, and the mean of the seeds that have them against Rainbow's."""
    played = [r.whole_games for r in of_game if r.whole_games is not None]
    if not played:
        return ["-", "-"]
    mean = sum(played) / len(played)
    return [" / ".join(_score(r.whole_games) for r in of_game),
            _score(mean) + ("" if rainbow is None else f" ({'yes' if mean >= rainbow else 'no'})")]


def _atari5_line(runs: list[GameRun], means: dict[str, float]) -> str:
    from rl_dqn import atari_scores as ref
    missing = [g for g in ref.ATARI5 if g not in means]
    if missing:
        return (f"Atari-5 estimate of the median human-normalised score over 57 games: not yet (no run of "
                f"{', '.join(missing)})")
    by_seed = []
    for seed in sorted({r.seed for r in runs}):
        last = {r.game: r.points[-1].mean for r in runs if r.seed == seed and r.points}
        if all(g in last for g in ref.ATARI5):
            by_seed.append(f"seed {seed} {ref.atari5_median(last):.1f}%")
    whole = {g: [r.whole_games for r in runs if r.game == g and r.whole_games is not None] for g in ref.ATARI5}
    in_whole_games = "" if not all(whole.values()) else (
        f"; from the means of the final weights in whole games "
        f"{ref.atari5_median({g: sum(v) / len(v) for g, v in whole.items()}):.1f}%")
    return (f"Atari-5 estimate of the median human-normalised score over 57 games: "
            f"{ref.atari5_median(means):.1f}% from the means" + (f" ({', '.join(by_seed)})" if by_seed else "") +
            in_whole_games)


def games_text(runs: list[GameRun], games: list[str]) -> str:
    """The table over games as aligned text, for a console."""
    rows, atari5 = games_rows(runs, games)
    return "\n".join([*aligned(_shown([GAMES_HEAD, *rows])), atari5])


def _shown(table: list[list[str]]) -> list[list[str]]:
    """The table over games (its head first) without those of its optional last columns that no run has: the training
    episodes at metrics.return_epsilon (runs before summary.json kept them), the final weights in whole games (runs
    never played so)."""
    first = len(table[0]) - OPTIONAL
    kept = [i for i in range(len(table[0])) if i < first or any(row[i] != "-" for row in table[1:])]
    return [[row[i] for i in kept] for row in table]


def games_markdown(played: dict[Path, GameRun], games: list[str], results: Path,
                   random: dict[str, float] | None = None) -> list[str]:
    """The table over games as Markdown, each seed's score linked to its record, `random` the random policy's
    scores here (random_here)."""
    folders = {id(run): folder for folder, run in played.items()}

    def link(run: GameRun, text: str) -> str:
        return f"[{text}](../{folders[id(run)].relative_to(results.parent).as_posix()}/)"
    rows, atari5 = games_rows(list(played.values()), games, link, random)
    head, *rows = _shown([GAMES_HEAD, *rows])
    return ["| " + " | ".join(head) + " |", "|" + "-|" * len(head),
            *["| " + " | ".join(row) + " |" for row in rows], "", atari5]


def against_rows(runs: list[GameRun], base: list[GameRun], games: list[str], every: int,
                 acts_from: int | None = None) -> tuple[list[list[str]], str]:
    """A candidate's runs (`runs`) against its base's (`base`) env step for env step, so that runs on machines of
    different speeds compare where their 30-minute scores cannot: for each game both ran, the evaluations at
    the same env steps (rounds every `every` env steps, matched by their number; a game's several seeds averaged
    where all of them have the round), the mean score over those rounds on each side, the difference of those means
    in human-normalised points, and in how many of the rounds the candidate scored more. The line after: on how many
    games it is ahead, and the Atari-5 estimate from each side's mean scores over the rounds compared.

    With `acts_from` (a change that acts only after so many env steps), each game has two rows, the rounds up to
    then and those after: up to then the candidate's runs are the base's config, so their lead there is their seeds'
    own, and the line says on how many games the lead grew after."""
    from rl_dqn import atari_scores as ref

    def by_round(of: list[GameRun], game: str) -> dict[int, float]:
        seeds = [{round(p.env_steps / every): p.mean for p in r.points} for r in of if r.game == game and r.points]
        shared = set.intersection(*(set(s) for s in seeds)) if seeds else set()
        return {k: sum(s[k] for s in seeds) / len(seeds) for k in shared}

    rows, ahead, played, means, grew, split = [], 0, 0, ({}, {}), 0, 0
    for game in _game_order([*runs, *base], games):
        mine, theirs = by_round(runs, game), by_round(base, game)
        common = sorted(set(mine) & set(theirs))
        if not common:
            continue
        played += 1
        def sides(rounds: list[int]) -> tuple[float, float]:
            return sum(mine[k] for k in rounds) / len(rounds), sum(theirs[k] for k in rounds) / len(rounds)

        mean = sides(common)
        means[0][game], means[1][game] = mean
        ahead += mean[0] > mean[1]
        known = game in ref.RANDOM and game in ref.HUMAN   # else the lead is told in raw score
        phases = [common] if acts_from is None else [[k for k in common if k * every <= acts_from],
                                                     [k for k in common if k * every > acts_from]]
        leads = []
        for rounds in (phase for phase in phases if phase):
            side = sides(rounds)
            lead = (ref.human_normalized(game, side[0]) - ref.human_normalized(game, side[1]) if known
                    else side[0] - side[1])
            leads.append(lead)
            rows.append([game, f"{len(rounds)}, {_steps(rounds[0] * every)} to {_steps(rounds[-1] * every)}",
                         _score(side[0]), _score(side[1]), f"{lead:+.1f}" if known else "-",
                         f"{sum(mine[k] > theirs[k] for k in rounds)} of {len(rounds)}"])
        if acts_from is not None and len(leads) == 2:
            split += 1
            grew += leads[1] > leads[0]
    if not rows:
        return rows, "No game has evaluations at the same env steps on both sides yet."
    line = f"Ahead here, over the rounds compared, on {ahead} of {played} games."
    if acts_from is not None:
        line += (f" The change acts after {_steps(acts_from)} env steps: the runs' lead over the base's mean grew "
                 f"after it on {grew} of {split} games with rounds on both sides (before it, their lead is their "
                 f"seeds' own).")
    if all(g in means[0] for g in ref.ATARI5):
        line += (f" The Atari-5 estimate from those mean scores: {ref.atari5_median(means[0]):.1f}% against "
                 f"{ref.atari5_median(means[1]):.1f}%.")
    return rows, line


def _base(bench: Benchmark, results: Path) -> tuple[Benchmark, list[GameRun]]:
    """The benchmark a candidate is read against, and its runs."""
    base = next((b for b in benchmarks(results) if b.name == bench.against), None)
    if base is None:
        raise ResultsError(f"{results / bench.name / 'benchmark.yaml'}: against: {bench.against!r} is not a "
                           f"benchmark in {results}")
    return base, [game_run(f) for f in records(base, results)]


def _against_markdown(bench: Benchmark, base: Benchmark, runs: list[GameRun], based: list[GameRun],
                      results: Path) -> list[str]:
    every = int(_config(records(bench, results)[0])["eval"]["every_env_steps"])
    if every <= 0:
        raise ResultsError(f"{results / bench.name}: its runs have no evaluation period (eval.every_env_steps "
                           f"{every}) to match rounds by")
    rows, line = against_rows(runs, based, bench.games, every, bench.acts_from)
    head = ["game", "evaluations compared", "mean score here", f"mean score of {base.name}",
            "difference, human-normalised", "ahead here"]
    return [f"Env step for env step against [{base.title}](#{_anchor(base.title)}): the evaluations both ran at the "
            f"same env steps, so that runs on machines of different speeds compare.", "",
            "| " + " | ".join(head) + " |", "|" + "-|" * len(head),
            *["| " + " | ".join(row) + " |" for row in rows], "", line]


def _anchor(title: str) -> str:
    """The anchor GitHub gives a heading."""
    return "".join(c for c in title.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def main(argv: list[str] | None = None, prog: str = "python -m rl_dqn.results") -> int:
    parser = OneLineParser(prog=prog, description=description(__doc__))
    parser.name = "results"
    parser.add_argument("what", nargs="*", metavar="record RUN_DIR BENCHMARK",
                        help="record a finished run; with nothing, write the page and its figures")
    parser.add_argument("--check", action="store_true",
                        help="only check that docs/results.md and its figures are up to date")
    args = parser.parse_args(argv)
    try:
        if args.what:
            if len(args.what) != 3 or args.what[0] != "record":
                parser.error("give `record RUN_DIR BENCHMARK`, or nothing to write the page")
            print(f"recorded {record(Path(args.what[1]), args.what[2])}")
            return 0
        if args.check:
            text, figures = page()
            if not PAGE.is_file() or PAGE.read_text() != text:
                print(f"results: {PAGE} is out of date: python -m rl_dqn.results", file=sys.stderr)
                return 1
            stale = _stale_figures(figures, FIGURES)
            if stale:
                print(f"results: {', '.join(p.name for p in stale)} in {FIGURES} belong to no benchmark: "
                      "python -m rl_dqn.results removes them", file=sys.stderr)
                return 1
            return 0
        for path in write():
            print(f"wrote {path}")
    except ResultsError as e:
        print(f"results: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
