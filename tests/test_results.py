"""Results as records: a finished run kept as a record, the page and figures generated from the records, and the
repository's own page in step with its records."""

from __future__ import annotations

import csv
import json
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


def finished_run(runs: Path, name: str, seed: int, rounds: list[tuple[int, float, float, float, int]]) -> Path:
    """A run folder as a finished run leaves it: config.yaml, run.json, summary.json and TensorBoard events with its
    evaluation rounds (env steps, seconds from launch, mean, std, episodes)."""
    folder = runs / name
    folder.mkdir(parents=True)
    save_config(load_config(ROOT / "configs/pong_cpu.yaml", [f"run.name={name}", f"run.seed={seed}"]),
                folder / "config.yaml")
    (folder / "run.json").write_text(json.dumps({"commit": "0123456789abcdef", "dirty": False,
                                                 "machine": {"cpu": "A CPU", "cores": 2, "amx": True, "gpus": []}}))
    (folder / "summary.json").write_text(json.dumps({"ended": "stop_score", "env_steps_per_s_training": 912.4}))
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
    written = results.write(store / "results", store / "docs/results.md", store / "docs/results")
    assert (store / "docs/results/pong_here.png").stat().st_size > 1000 and len(written) == 2


def test_what_cannot_be_recorded_is_refused_with_one_line(store):
    run = finished_run(store / "runs", "pong-s1", 1, [(50_000, 130.0, -20.0, 0.0, 5)])
    with pytest.raises(results.ResultsError, match="no benchmark 'nothing' .* there are: pong_here"):
        results.record(run, "nothing", store / "results")
    (run / "run.json").unlink()
    with pytest.raises(results.ResultsError, match="is not a finished run: it has no run.json"):
        results.record(run, "pong_here", store / "results")


def test_runs_reported_before_records_keep_their_table_marked_as_such(store):
    (store / "results/pong_here/earlier.md").write_text("| seed | time to 18 |\n|-|-|\n| 6 | 8m11s |\n")
    text, figures = results.page(store / "results")
    assert "Reported before records existed" in text and "| 6 | 8m11s |" in text
    assert figures == {} and "pong_here.png" not in text


def test_the_repositorys_results_page_is_the_one_its_records_give():
    """docs/results.md is `python -m rl_dqn.results`'s output from results/ (the figures come with it)."""
    result = subprocess.run([sys.executable, "-m", "rl_dqn.results", "--check"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    _, figures = results.page()
    assert all((results.FIGURES / f"{name}.png").is_file() for name in figures)
