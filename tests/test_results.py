"""Results as records: a finished run kept as a record, the page and figures generated from the records, and the
repository's own page in step with its records."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from rl_dqn import results
from rl_dqn.config import load_config, save_config

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = """title: Pong somewhere
order: 1
about: >
  What it measures.
command: python benchmarks/learning.py configs/pong_cpu.yaml --seeds 1 --record pong_here
scores: [0, 18]
target: 18
"""


def finished_run(runs: Path, name: str, seed: int, rounds: list[tuple[int, float, float, float, int]],
                 config: str = "pong_cpu.yaml", game: str = "") -> Path:
    """A run folder as a finished run leaves it: config.yaml, run.json, summary.json and TensorBoard events with its
    evaluation rounds (env steps, seconds from launch, mean, std, episodes)."""
    folder = runs / name
    folder.mkdir(parents=True)
    save_config(load_config(ROOT / "configs" / config, [f"run.name={name}", f"run.seed={seed}",
                                                         *([f"env.id=ALE/{game}-v5"] if game else [])]),
                folder / "config.yaml")
    (folder / "run.json").write_text(json.dumps({"commit": "0123456789abcdef", "dirty": False,
                                                 "machine": {"cpu": "A CPU", "cores": 2, "amx": True, "gpus": []}}))
    (folder / "summary.json").write_text(json.dumps({"ended": "stop_score", "env_steps_per_s_training": 912.4,
                                                     "env_steps": rounds[-1][0] + 1_234}))
    writer = SummaryWriter(str(folder))
    for env_steps, seconds, mean, std, episodes in rounds:
        writer.add_scalar("eval/episode_return", mean, env_steps)
        writer.add_scalar("eval/episode_return_std", std, env_steps)
        writer.add_scalar("eval/time_from_launch_s", seconds, env_steps)
        writer.add_scalar("eval/episodes", episodes, env_steps)
    writer.close()
    return folder


@pytest.fixture
def store(tmp_path):
    (tmp_path / "results" / "pong_here").mkdir(parents=True)
    (tmp_path / "results" / "pong_here" / "benchmark.yaml").write_text(BENCHMARK)
    return tmp_path


def test_a_finished_run_becomes_a_record_and_a_row_of_the_page_with_its_figure(store):
    rounds = [(50_000, 130.0, -20.2, 0.4, 5), (100_000, 250.0, 16.0, 2.0, 20), (150_000, 371.5, 19.25, 1.1, 20)]
    run = finished_run(store / "runs", "pong-s3", 3, rounds)
    folder = results.record(run, "pong_here", store / "results")
    assert sorted(p.name for p in folder.iterdir()) == sorted(results.RECORD_FILES)
    with open(folder / "eval.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(results.COLUMNS) and [r[0] for r in rows[1:]] == ["50000", "100000", "150000"]
    assert results.curve(folder)[0].screened and not results.curve(folder)[1].screened   # 5 of 20 episodes
    text, figures = results.page(store / "results")
    row = next(line for line in text.splitlines() if line.startswith("| [pong-s3]"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # run, seed, to 0, to 18, last, best, env steps/s, commit, machine
    assert cells[1:] == ["3", "4m10s (100k)", "6m12s (150k)", "19.25 at 6m12s", "19.25", "912", "0123456",
                         "2 cores of A CPU, AMX"]
    assert "](../results/pong_here/pong-s3/)" in cells[0]
    assert list(figures) == ["pong_here"] and list(figures["pong_here"]) == ["seed 3"]
    (store / "docs/results").mkdir(parents=True)
    (store / "docs/results/pong_moved_away.png").write_bytes(b"a benchmark's figure before its records moved")
    written = results.write(store / "results", store / "docs/results.md", store / "docs/results")
    assert (store / "docs/results/pong_here.png").stat().st_size > 1000 and len(written) == 2
    assert sorted(p.name for p in (store / "docs/results").iterdir()) == ["pong_here.png"]


def test_what_cannot_be_recorded_is_refused_with_one_line(store):
    run = finished_run(store / "runs", "pong-s1", 1, [(50_000, 130.0, -20.0, 0.0, 5)])
    with pytest.raises(results.ResultsError, match="no benchmark 'nothing' .* there are: pong_here"):
        results.record(run, "nothing", store / "results")
    (run / "run.json").unlink()
    with pytest.raises(results.ResultsError, match="is not a finished run: it has no run.json"):
        results.record(run, "pong_here", store / "results")
    # A run of another config is not this benchmark's; one whose files cannot be read leaves no half a record.
    (run / "run.json").write_text(json.dumps({"command": ["rl_dqn", "local", "configs/smoke.yaml"]}))
    with pytest.raises(results.ResultsError, match="ran smoke.yaml, and benchmark pong_here runs pong_cpu.yaml"):
        results.record(run, "pong_here", store / "results")
    (run / "run.json").write_text(json.dumps({"command": ["rl_dqn", "local", "configs/pong_cpu.yaml"]}))
    config = (run / "config.yaml").read_text()
    for broken in ("eval: [", config.replace("eval:", "evaluation:")):
        (run / "config.yaml").write_text(broken)
        with pytest.raises(results.ResultsError, match="cannot be read"):
            results.record(run, "pong_here", store / "results")
    assert sorted(p.name for p in (store / "results" / "pong_here").iterdir()) == ["benchmark.yaml"]
    (run / "config.yaml").write_text(config)
    assert results.record(run, "pong_here", store / "results").name == "pong-s1"


@pytest.mark.parametrize("given", ["pong_here/", "results/pong_here", "../results/pong_here", "./pong_here"])
def test_a_benchmark_given_as_a_path_is_refused_in_one_line_naming_what_a_benchmark_name_is(store, capsys, given,
                                                                                          monkeypatch):
    run = finished_run(store / "runs", "pong-s1", 1, [(50_000, 130.0, -20.0, 0.0, 5)])
    with pytest.raises(results.ResultsError, match=f"benchmark '{given}' is not a benchmark's name: give the name of "
                                                   f"its folder in .*, with no path or slash \\(did you mean "
                                                   f"pong_here\\?\\)"):
        results.record(run, given, store / "results")
    assert sorted(p.name for p in (store / "results" / "pong_here").iterdir()) == ["benchmark.yaml"]
    # The command: one line and exit code 2, before it reads the run (its results/ the test's own).
    monkeypatch.setattr(results, "RESULTS", store / "results")
    monkeypatch.setattr(results.record, "__defaults__", (store / "results",))
    assert results.main(["record", str(run), "pong_here/"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("results: error: benchmark 'pong_here/' is not a benchmark's name") and \
        err.count("\n") == 1, err
    assert sorted(p.name for p in (store / "results" / "pong_here").iterdir()) == ["benchmark.yaml"]


def _damage(store: Path, how: str) -> str:
    """Damages pong_here's record pong-s1 (or its benchmark.yaml) as `how` says; returns the file the error names."""
    record = store / "results/pong_here/pong-s1"
    curve = (record / "eval.csv").read_text().splitlines()
    if how == "a word in eval.csv":
        (record / "eval.csv").write_text("\n".join([curve[0], "abc" + curve[1][curve[1].index(","):], *curve[2:]]))
    elif how == "a short row in eval.csv":
        (record / "eval.csv").write_text("\n".join([*curve, "200000,400.0"]))
    elif how == "eval.csv with its header only":
        (record / "eval.csv").write_text(curve[0] + "\n")
    elif how == "an empty eval.csv":
        (record / "eval.csv").write_text("")
    elif how == "no config.yaml":
        (record / "config.yaml").unlink()
        return str(record)
    elif how == "bad YAML in config.yaml":
        (record / "config.yaml").write_text("eval: [\n")
    elif how == "config.yaml without run.seed":
        (record / "config.yaml").write_text((record / "config.yaml").read_text().replace("  seed: 1\n", ""))
    elif how == "bad YAML in benchmark.yaml":
        (store / "results/pong_here/benchmark.yaml").write_text("title: [\n")
        return str(store / "results/pong_here/benchmark.yaml")
    elif how == "benchmark.yaml without about":
        (store / "results/pong_here/benchmark.yaml").write_text(BENCHMARK.replace("about: >\n  What it measures.\n",
                                                                                  ""))
        return str(store / "results/pong_here/benchmark.yaml")
    return str(record / ("config.yaml" if "config" in how else "eval.csv"))


@pytest.mark.parametrize("how, error", [
    ("a word in eval.csv", r"eval.csv, line 2: 'abc,130.0,-20.0000,0.0000,5' is not 5 numbers \(env_steps,wall_s,mean,"
                           r"std,episodes; env steps and episodes whole\)"),
    ("a short row in eval.csv", r"eval.csv, line 4: '200000,400.0' is not 5 numbers"),
    ("eval.csv with its header only", r"eval.csv has no evaluation rounds: a record's curve has at least one"),
    ("an empty eval.csv", r"eval.csv is empty: a record's curve is the header env_steps,wall_s,mean,std,episodes"),
    ("no config.yaml", r"pong-s1 is not a whole record: it has no config.yaml \(a record has config.yaml, run.json, "
                       r"summary.json, eval.csv\)"),
    ("bad YAML in config.yaml", r"config.yaml is not readable YAML: did not find expected node content \(line 2, "),
    ("config.yaml without run.seed", r"config.yaml is not a run's config: it has no run.seed that is an integer"),
    ("bad YAML in benchmark.yaml", r"benchmark.yaml is not readable YAML: .* \(line 2, column 1\)"),
    ("benchmark.yaml without about", r"benchmark.yaml has no about \(a benchmark.yaml is a mapping that gives at "
                                     r"least title, about, command\)"),
])
def test_a_damaged_record_or_benchmark_is_named_in_one_line_and_the_page_is_left_as_it_was(store, monkeypatch,
                                                                                             capsys, how, error):
    rounds = [(50_000, 130.0, -20.0, 0.0, 5), (100_000, 250.0, 16.0, 2.0, 20)]
    results.record(finished_run(store / "runs", "pong-s1", 1, rounds), "pong_here", store / "results")
    page, figures = store / "docs/results.md", store / "docs/results"
    results.write(store / "results", page, figures)
    before = {p: p.read_bytes() for p in [page, *figures.iterdir()]}
    named = _damage(store, how)
    # The command as it runs on the repository's results/, here on this test's.
    write, make_page = results.write, results.page
    monkeypatch.setattr(results, "page", lambda folder=store / "results": make_page(folder))
    monkeypatch.setattr(results, "write", lambda: write(store / "results", page, figures))
    monkeypatch.setattr(results, "PAGE", page)
    monkeypatch.setattr(results, "FIGURES", figures)
    for argv in ([], ["--check"]):
        assert results.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"results: error: {named}") and err.count("\n") == 1, err
        assert re.search(error, err), err
    assert {p: p.read_bytes() for p in [page, *figures.iterdir()]} == before


def test_a_record_being_written_is_not_on_the_page_and_a_folder_short_of_a_records_files_is_refused(store):
    run = finished_run(store / "runs", "pong-s1", 1, [(50_000, 130.0, -20.0, 0.0, 5)])
    folder = results.record(run, "pong_here", store / "results")
    # What a `record` that was killed leaves: its next try removes it.
    shutil.copytree(folder, store / "results/pong_here/.pong-s2.partial")
    text, figures = results.page(store / "results")
    assert "pong-s2" not in text and list(figures["pong_here"]) == ["seed 1"]
    (store / "results/pong_here/pong-s3").mkdir()
    (store / "results/pong_here/pong-s3/config.yaml").write_bytes((folder / "config.yaml").read_bytes())
    with pytest.raises(results.ResultsError, match="pong-s3 is not a whole record: it has no run.json, summary.json, "
                                                   "eval.csv"):
        results.page(store / "results")


def test_a_benchmarks_random_scores_or_a_records_whole_games_that_cannot_be_read_are_named(tmp_path):
    (tmp_path / results.RANDOM_CSV).write_text("game,config,episodes,mean,std,min,max\n"
                                               "Qbert,atari_cpu.yaml,20,x,1,0,3\n")
    with pytest.raises(results.ResultsError, match="random.csv is not a table of game,config,episodes,mean,std,min,"
                                                   "max .*ValueError: could not convert string to float: 'x'"):
        results.random_here(tmp_path)
    (tmp_path / results.WHOLE_GAMES).write_text(json.dumps({"scores": [1.0]}))
    with pytest.raises(results.ResultsError, match=r"whole_games.json has no mean score \(`mean`, a number\)"):
        results.whole_games_mean(tmp_path)


def test_runs_reported_before_records_keep_their_table_marked_as_such(store):
    (store / "results/pong_here/earlier.md").write_text("| seed | time to 18 |\n|-|-|\n| 6 | 8m11s |\n")
    text, figures = results.page(store / "results")
    assert "Reported before records existed" in text and "| 6 | 8m11s |" in text
    assert figures == {} and "pong_here.png" not in text


GAMES_BENCHMARK = """title: Atari somewhere
about: >
  Games.
command: python benchmarks/learning.py configs/atari_cpu.yaml --games Qbert,Pong --record atari_here
games: [BattleZone, DoubleDunk, NameThisGame, Phoenix, Qbert, Pong]
"""


def test_a_benchmark_over_games_has_a_row_per_game_beside_the_reference_scores_and_the_atari5_estimate(store):
    from rl_dqn import atari_scores as ref
    (store / "results/atari_here").mkdir()
    (store / "results/atari_here/benchmark.yaml").write_text(GAMES_BENCHMARK)
    (store / "results/atari_here/random.csv").write_text("game,config,episodes,mean,std,min,max\n"
                                                         "Qbert,atari_cpu.yaml,20,151.25,60.1,0,300\n")
    last = {("Qbert", 1): 3000.0, ("Qbert", 2): 5000.0, ("Pong", 1): 15.2, ("Seaquest", 1): 400.0}
    for (game, seed), score in last.items():
        run = finished_run(store / "runs", f"a-{game}-s{seed}", seed,
                           [(100_000, 300.0, score / 2, 1.0, 10), (200_000, 600.0, score, 1.0, 10)], "atari_cpu.yaml",
                           game)
        results.record(run, "atari_here", store / "results")
    text, figures = results.page(store / "results")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| game")
            and not line.startswith("| [") and not line.startswith("| run")}
    # In the benchmark's order, then the games it does not list; one seed's score links to its record.
    assert list(rows) == ["Qbert", "Pong", "Seaquest"]
    qbert = rows["Qbert"]
    assert qbert[1] == ("[3,000 (s1)](../results/atari_here/a-Qbert-s1/) / "
                        "[5,000 (s2)](../results/atari_here/a-Qbert-s2/)")
    assert qbert[2:5] == ["4,000", "3,000 / 5,000", "201k / 201k"]
    assert qbert[5:10] == [f"{ref.RANDOM['Qbert']:,.0f}", "151", f"{ref.HUMAN['Qbert']:,.0f}",
                           f"{ref.DOPAMINE_DQN['Qbert']:,.0f}", f"{ref.DOPAMINE_RAINBOW['Qbert']:,.0f}"]
    hns = 100 * (4000 - ref.RANDOM["Qbert"]) / (ref.HUMAN["Qbert"] - ref.RANDOM["Qbert"])
    assert qbert[10] == f"{hns:.1f}%" and qbert[11] == ("yes" if 4000 >= ref.DOPAMINE_RAINBOW["Qbert"] else "no")
    # Both seeds' last rounds came at 200k env steps: Rainbow's first iteration (its first 250k env steps) there.
    first = f"{ref.DOPAMINE_RAINBOW_CURVE['Qbert'][0]:,.0f}"
    # The records' summaries predate the training episodes at an epsilon: the page leaves their column out.
    assert qbert[12:] == [f"{first} / {first}", "2 of 2"]
    assert rows["Pong"][6] == "-"   # random.csv has no row for it
    assert rows["Pong"][10] == f"{100 * (15.2 - ref.RANDOM['Pong']) / (ref.HUMAN['Pong'] - ref.RANDOM['Pong']):.1f}%"
    assert rows["Seaquest"][5:] == ["-"] * 9   # no reference scores for it
    assert ("Atari-5 estimate of the median human-normalised score over 57 games: not yet (no run of BattleZone, "
            "DoubleDunk, NameThisGame, Phoenix)") in text
    # Every record also has its row in the table of runs; the figure is a grid of the games, seeds by label.
    assert "| [a-Qbert-s2](../results/atari_here/a-Qbert-s2/) | 2 |" in text
    assert figures["atari_here"] == {"Qbert": {"seed 1": results.curve(store / "results/atari_here/a-Qbert-s1"),
                                               "seed 2": results.curve(store / "results/atari_here/a-Qbert-s2")},
                                     "Pong": {"seed 1": results.curve(store / "results/atari_here/a-Pong-s1")},
                                     "Seaquest": {"seed 1": results.curve(store / "results/atari_here/a-Seaquest-s1")}}
    results.write(store / "results", store / "docs/results.md", store / "docs/results")
    assert (store / "docs/results/atari_here.png").stat().st_size > 1000


def test_a_candidate_is_read_against_its_base_at_the_same_env_steps_whatever_its_machines_speed(store):
    from rl_dqn import atari_scores as ref
    for name, against in (("atari_base", ""), ("atari_change", "against: atari_base\n")):
        (store / "results" / name).mkdir()
        (store / "results" / name / "benchmark.yaml").write_text(
            GAMES_BENCHMARK.replace("atari_here", name) + against)
    (store / "results/atari_base/random.csv").write_text("game,config,episodes,mean,std,min,max\n"
                                                         "Qbert,atari_cpu.yaml,20,151.25,60.1,0,300\n")
    # The base's rounds come twice as fast on its clock; rounds are matched by env steps (every 100k), not time.
    base = {("Qbert", 1): [1000.0, 2000.0, 3000.0], ("Qbert", 2): [3000.0, 2000.0, 1000.0], ("Pong", 1): [-5.0, 5.0]}
    change = {("Qbert", 1): [4000.0, 1000.0], ("Pong", 1): [0.0, 0.0, 0.0], ("Seaquest", 1): [100.0]}
    for name, scores in (("atari_base", base), ("atari_change", change)):
        for (game, seed), means in scores.items():
            rounds = [(100_000 * (i + 1) + 96 * i, (150.0 if name == "atari_base" else 300.0) * (i + 1), m, 1.0, 10)
                      for i, m in enumerate(means)]
            results.record(finished_run(store / "runs" / name, f"x-{game}-s{seed}", seed, rounds, "atari_cpu.yaml",
                                        game), name, store / "results")
    runs = [results.game_run(f) for f in (store / "results/atari_change").glob("x-*")]
    based = [results.game_run(f) for f in (store / "results/atari_base").glob("x-*")]
    rows, line = results.against_rows(runs, based, ["Pong", "Qbert"], 100_000)
    # Qbert: the base's two seeds average 2,000 at both rounds the change ran; Pong: two rounds in common; Seaquest
    # has no base run.
    hns = lambda game, score: ref.human_normalized(game, score)
    assert rows == [["Pong", "2, 100k to 200k", "0.0", "0.0", "+0.0", "1 of 2"],
                    ["Qbert", "2, 100k to 200k", "2,500", "2,000", f"{hns('Qbert', 2500) - hns('Qbert', 2000):+.1f}",
                     "1 of 2"]]
    assert line == "Ahead here, over the rounds compared, on 1 of 2 games."
    text, figures = results.page(store / "results")
    runs_of = lambda game: results.curve(store / f"results/atari_change/x-{game}-s1")
    assert "| Qbert | 2, 100k to 200k | 2,500 | 2,000 |" in text
    # Its figure draws the base's seeds beside its own in the games it ran, against env steps.
    assert set(figures["atari_change"]["Qbert"]) == {"seed 1", "atari_base seed 1", "atari_base seed 2"}
    assert set(figures["atari_change"]) == {"Qbert", "Pong", "Seaquest"}
    assert "each game's evaluation score against env steps, every seed, beside the seeds of atari_base" in text
    assert "atari_change-minutes" not in figures
    # With by_minutes (a final table), a second figure against wall minutes, its own seeds alone: the base's ran on
    # another clock.
    with (store / "results/atari_change/benchmark.yaml").open("a") as f:
        f.write("by_minutes: true\n")
    text, figures = results.page(store / "results")
    assert figures["atari_change-minutes"] == {game: {"seed 1": runs_of(game)} for game in ("Qbert", "Pong",
                                                                                             "Seaquest")}
    assert "evaluation score against wall time, every seed](results/atari_change-minutes.png)" in text
    written = results.write(store / "results", store / "docs/results.md", store / "docs/results")
    assert {p.name for p in written if p.suffix == ".png"} == {"atari_base.png", "atari_change.png",
                                                               "atari_change-minutes.png"}
    # The change's table over games shows the base's random-policy scores, as its runs play the same config; a
    # benchmark of another config has none.
    change_row = next(line for line in text.splitlines() if line.startswith("| Qbert | [1,000 (s1)]"))
    assert change_row.split(" | ")[6] == "151"
    other = {b.name: b for b in results.benchmarks(store / "results")}["atari_change"]
    assert results.random_for(other, store / "results") == {"Qbert": 151.25}
    other = other._replace(command=other.command.replace("atari_cpu.yaml", "pong_cpu.yaml"))
    assert results.random_for(other, store / "results") == {}
    assert "Env step for env step against [Atari somewhere](#atari-somewhere)" in text
    (store / "results/atari_change/benchmark.yaml").write_text(GAMES_BENCHMARK + "against: atari_elsewhere\n")
    with pytest.raises(results.ResultsError, match="against: 'atari_elsewhere' is not a benchmark"):
        results.page(store / "results")


def test_a_change_that_acts_late_is_read_before_and_after_it_acts(store):
    from rl_dqn import atari_scores as ref
    for name, extra in (("atari_base", ""), ("atari_late", "against: atari_base\nacts_from_env_steps: 200000\n")):
        (store / "results" / name).mkdir()
        (store / "results" / name / "benchmark.yaml").write_text(GAMES_BENCHMARK.replace("atari_here", name) + extra)
    # Pong's run is ahead by 5 up to 200k env steps (its seed's luck: the config is the base's there) and by 7.5
    # after; Qbert's by 1,000 before and by 500 after.
    base = {"Pong": [-5.0, 0.0, 5.0, 10.0], "Qbert": [1000.0, 2000.0, 3000.0, 4000.0]}
    late = {"Pong": [0.0, 5.0, 10.0, 20.0], "Qbert": [2000.0, 3000.0, 3500.0, 4500.0]}
    for name, scores in (("atari_base", base), ("atari_late", late)):
        for game, means in scores.items():
            rounds = [(100_000 * (i + 1) + 96 * i, 150.0 * (i + 1), m, 1.0, 10) for i, m in enumerate(means)]
            results.record(finished_run(store / "runs" / name, f"x-{game}-s1", 1, rounds, "atari_cpu.yaml", game),
                           name, store / "results")
    runs = [results.game_run(f) for f in (store / "results/atari_late").glob("x-*")]
    based = [results.game_run(f) for f in (store / "results/atari_base").glob("x-*")]
    rows, line = results.against_rows(runs, based, ["Pong", "Qbert"], 100_000, 200_000)
    lead = lambda game, mine, theirs: f"{ref.human_normalized(game, mine) - ref.human_normalized(game, theirs):+.1f}"
    assert rows == [["Pong", "2, 100k to 200k", "2.5", "-2.5", lead("Pong", 2.5, -2.5), "2 of 2"],
                    ["Pong", "2, 300k to 400k", "15.0", "7.5", lead("Pong", 15.0, 7.5), "2 of 2"],
                    ["Qbert", "2, 100k to 200k", "2,500", "1,500", lead("Qbert", 2500, 1500), "2 of 2"],
                    ["Qbert", "2, 300k to 400k", "4,000", "3,500", lead("Qbert", 4000, 3500), "2 of 2"]]
    assert line == ("Ahead here, over the rounds compared, on 2 of 2 games. The change acts after 200k env steps: "
                    "the runs' lead over the base's mean grew after it on 1 of 2 games with rounds on both sides "
                    "(before it, their lead is their seeds' own).")
    text, _ = results.page(store / "results")
    assert "| Pong | 2, 300k to 400k | 15.0 | 7.5 |" in text and "grew after it on 1 of 2 games" in text


def test_the_atari5_estimate_comes_from_each_seed_that_ran_all_five_games_and_from_the_means():
    from rl_dqn import atari_scores as ref
    human = {game: ref.HUMAN[game] for game in ref.ATARI5}
    runs = [results.GameRun(game, 1, [results.EvalPoint(100, 1.0, score, 0.0)], 100) for game, score in human.items()]
    runs += [results.GameRun(game, 2, [results.EvalPoint(100, 1.0, ref.RANDOM[game], 0.0)], 100) for game in human]
    runs.append(results.GameRun("Qbert", 3, [results.EvalPoint(100, 1.0, ref.HUMAN["Qbert"], 0.0)], 100))
    _, line = results.games_rows(runs, list(ref.ATARI5))
    # Seed 1 plays at human level (100% on each game), seed 2 at random (0%); seed 3 ran one game only.
    at_human = 10 ** (sum(ref.ATARI5.values()) * math.log10(101)) - 1
    means = {game: (human[game] + ref.RANDOM[game] + (human[game] if game == "Qbert" else 0)) /
             (3 if game == "Qbert" else 2) for game in human}
    assert line == (f"Atari-5 estimate of the median human-normalised score over 57 games: "
                    f"{ref.atari5_median(means):.1f}% from the means (seed 1 {at_human:.1f}%, seed 2 0.0%)")


def test_the_table_over_games_gives_each_seeds_training_return_at_its_epsilon_where_its_summary_has_one():
    point = [results.EvalPoint(100, 1.0, 5.0, 0.0)]
    runs = [results.GameRun("Pong", 1, point, 100, 12.5), results.GameRun("Pong", 2, point, 100),
            results.GameRun("Qbert", 1, point, 100)]
    rows, _ = results.games_rows(runs, ["Pong", "Qbert"])
    head = "training episodes at metrics.return_epsilon, mean at the end (each seed)"
    column = results.GAMES_HEAD.index(head)
    assert [row[column] for row in rows] == ["12.5 / -", "-"]
    assert head in results.games_text(runs, ["Pong", "Qbert"])                   # shown: one run has it
    assert head not in results.games_text(runs[1:], ["Pong", "Qbert"])            # none has it: left out
    summary = {"returns_at_epsilon": {"epsilon": 0.01, "env_steps": 250000, "from_env_steps": 0, "episodes": 3,
                                      "mean": 12.5}}
    assert results.return_at_epsilon(summary) == 12.5
    assert results.return_at_epsilon({"returns_at_epsilon": None}) is None is results.return_at_epsilon({})


def test_a_recorded_runs_final_weights_play_whole_games_into_its_record_and_the_table_shows_them(store):
    import torch

    from rl_dqn.config import to_dict
    from rl_dqn.network import QNetwork
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import whole_games
    (store / "results/atari_here").mkdir()
    (store / "results/atari_here/benchmark.yaml").write_text(GAMES_BENCHMARK)
    run = finished_run(store / "runs", "a-Pong-s1", 1, [(100_000, 300.0, -20.0, 1.0, 10)], "atari_cpu.yaml", "Pong")
    results.record(run, "atari_here", store / "results")
    cfg = load_config(run / "config.yaml")
    torch.manual_seed(0)
    (run / "checkpoints").mkdir()
    torch.save({"config": to_dict(cfg), "spec": {"obs_shape": [4, 84, 84], "num_actions": 6},
                "network": QNetwork.for_env((4, 84, 84), 6, cfg.network, "cpu").state_dict()},
               run / "checkpoints/checkpoint_000000001.pt")
    args = [str(run), "--record", "atari_here", "--results", str(store / "results"), "--episodes", "2",
            "--max-episode-frames", "400"]
    assert whole_games.main(args) == 0
    played = json.loads((store / "results/atari_here/a-Pong-s1" / results.WHOLE_GAMES).read_text())
    assert played["checkpoint"] == "checkpoint_000000001.pt" and played["episodes"] == len(played["scores"]) == 2
    assert played["max_episode_frames"] == 400 and played["epsilon"] == cfg.eval.epsilon
    assert played["mean"] == sum(played["scores"]) / 2 and -21 <= played["mean"] <= 21
    assert results.game_run(store / "results/atari_here/a-Pong-s1").whole_games == played["mean"]
    text, _ = results.page(store / "results")
    head = next(line for line in text.splitlines() if line.startswith("| game |"))
    assert head.endswith("| final weights in whole games (each seed) | their mean: at or above Rainbow |")
    pong = next(line for line in text.splitlines() if line.startswith("| Pong |"))
    assert pong.endswith(f"| {played['mean']:.1f} | {played['mean']:.1f} (no) |")
    # Played once: a second play, a run with no record, and a record of another run of that name are refused.
    other = finished_run(store / "elsewhere", "a-Pong-s1", 1, [(100_000, 300.0, -20.0, 1.0, 10)], "atari_cpu.yaml",
                         "Pong")
    (other / "run.json").write_text(json.dumps({"commit": "fedcba9876543210"}))
    unrecorded = finished_run(store / "runs", "a-Pong-s2", 2, [(100_000, 300.0, -20.0, 1.0, 10)], "atari_cpu.yaml",
                              "Pong")
    for path, error in [(run, "whole_games.json exists; remove it to play"),
                        (unrecorded, "a-Pong-s2 has no record in"),
                        (other, "is the record of another run named a-Pong-s1: its run.json differs")]:
        with pytest.raises(results.ResultsError, match=error):
            results.whole_games_path(path, "atari_here", store / "results")
    assert whole_games.main([str(unrecorded), *args[1:]]) == 2


def test_the_atari5_estimate_also_comes_from_the_final_weights_in_whole_games_once_each_game_has_them():
    from rl_dqn import atari_scores as ref
    point = [results.EvalPoint(100, 1.0, 0.0, 0.0)]
    runs = [results.GameRun(game, 1, point, 100, None, ref.HUMAN[game]) for game in ref.ATARI5]
    runs += [results.GameRun(game, 2, point, 100, None, ref.RANDOM[game]) for game in ref.ATARI5]
    _, line = results.games_rows(runs, list(ref.ATARI5))
    means = {game: (ref.HUMAN[game] + ref.RANDOM[game]) / 2 for game in ref.ATARI5}
    assert line.endswith(f"; from the means of the final weights in whole games {ref.atari5_median(means):.1f}%")
    _, line = results.games_rows(runs[1:], list(ref.ATARI5))   # seed 2 of the first game only: its mean is random's
    means[next(iter(ref.ATARI5))] = ref.RANDOM[next(iter(ref.ATARI5))]
    assert line.endswith(f"{ref.atari5_median(means):.1f}%")
    _, line = results.games_rows([r._replace(whole_games=None) if r.game == "Qbert" else r for r in runs],
                                 list(ref.ATARI5))
    assert "whole games" not in line


def test_the_repositorys_results_page_is_the_one_its_records_give():
    """docs/results.md is `python -m rl_dqn.results`'s output from results/ (the figures come with it)."""
    result = subprocess.run([sys.executable, "-m", "rl_dqn.results", "--check"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    _, figures = results.page()
    assert all((results.FIGURES / f"{name}.png").is_file() for name in figures)


def test_a_records_machine_names_its_cpu_family_where_the_model_name_is_too_bare_to():
    # Two "AMD EPYC" machines of different generations differ in env steps per second.
    zen5 = {"cpu": "AMD EPYC", "cpu_family": "26.2", "cores": 2, "avx512_bf16": True, "amx": False, "gpus": []}
    assert results._machine(zen5) == "2 cores of AMD EPYC (family 26.2), AVX512-BF16"
    assert results._machine({"cpu": "AMD EPYC", "cores": 2}) == "2 cores of AMD EPYC"   # records from before
