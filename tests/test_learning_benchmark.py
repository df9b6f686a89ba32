"""benchmarks/learning.py on the tiny smoke config: a run with a collector and then the learner killed, the run
resumed, and the time to a score read back, in wall time from the first launch and on the run's clock."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_learning_benchmark_kills_resumes_and_reports_time_to_a_score(tmp_path):
    runs = tmp_path / "runs"   # not there yet: the benchmark makes it
    env = dict(os.environ, RL_DQN_RUNS_DIR=str(runs), RL_DQN_PYTHON=sys.executable)
    result = subprocess.run(
        [sys.executable, "benchmarks/learning.py", "configs/smoke.yaml", "--prefix", "bench", "--minutes", "3",
         "--kill-collector-at", "0.25", "--kill-learner-at", "0.45", "--downtime", "2", "--scores", "-30",
         "train.total_env_steps=12000", "learner.checkpoint_every_updates=20", "eval.video=false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert re.search(r"killed the collector \(pid \d+\) with SIGKILL", out), out
    assert re.search(r"killed the learner \(pid \d+\) with SIGKILL", out), out
    assert "resuming it in 2 s" in out and "run.resume=true" in out
    log = (runs / "bench-s1.log").read_text()
    assert "collector0 died" in log and "resumed from checkpoint_" in log
    # Every score is at least -30: the first round reached it, timed both ways.
    assert re.search(r"reached -30 \S+ from the first launch in wall time \(\S+ on the run's clock\)", out), out
    # Where the time went, of the resumed process: its start-up counts from its own launch.
    found = re.search(r"first chunk ([\d.]+) s, first update ([\d.]+) s after resuming at \S+ on the run's clock; "
                      r"[\d,]+ env steps", out)
    summary = json.loads((runs / "bench-s1/summary.json").read_text())
    assert found and summary["resumed_at_s"] > 0, out
    assert float(found[1]) == round(summary["first_data_s"] - summary["resumed_at_s"], 1)
    assert float(found[2]) == round(summary["training_start_s"] - summary["resumed_at_s"], 1)
    assert out.splitlines()[-1].startswith("bench-s1 ")


def _wait_for_first_evaluation(run: Path, process: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.time() + timeout_s
    while not any(run.glob("events.out.tfevents.*")) or "eval at" not in _read(run.with_suffix(".log")):
        assert process.poll() is None and time.time() < deadline, f"no evaluation in {run}"
        time.sleep(1)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILLs the benchmark's session: it and any run it left behind, whatever happened."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.slow
@pytest.mark.parametrize("who", ["the benchmark", "the run, by hand"])
def test_an_interrupted_seed_ends_the_benchmark_with_what_it_has(tmp_path, who):
    """SIGINT to the benchmark, even started where SIGINT is ignored (the background of a script), or to the run by
    hand, stops that seed as its time limit would, runs no further seed, and prints the table of what ran."""
    env = dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path), RL_DQN_PYTHON=sys.executable)
    process = subprocess.Popen(
        [sys.executable, "benchmarks/learning.py", "configs/smoke.yaml", "--prefix", "stop", "--seeds", "1,2",
         "--minutes", "3", "--scores", "-30", "train.total_env_steps=1000000", "eval.video=false"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        _wait_for_first_evaluation(tmp_path / "stop-s1", process)
        if who == "the benchmark":
            process.send_signal(signal.SIGINT)
        else:
            subprocess.run(["pkill", "-INT", "-f", "rl_dqn local .*run.name=stop-s1( |$)"], check=True)
        out, err = process.communicate(timeout=120)
    finally:
        _kill_group(process)
    assert process.returncode == 130, out[-3000:] + err[-3000:]
    assert re.search(r"interrupted \S+ from launch: seed 1 stopped, seeds 2 not run", out), out
    assert not (tmp_path / "stop-s2").exists() and "Traceback" not in err, err
    assert json.loads((tmp_path / "stop-s1/summary.json").read_text())["env_steps"] > 0
    assert out.splitlines()[-1].startswith("stop-s1 ")


@pytest.mark.slow
def test_an_interrupt_between_a_killed_learner_and_its_resumption_ends_the_benchmark(tmp_path):
    """SIGINT while the benchmark waits to resume a run whose learner it killed: it resumes nothing, runs no further
    seed and prints the table of what ran, instead of raising out of its wait."""
    env = dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path), RL_DQN_PYTHON=sys.executable)
    stdout = tmp_path / "benchmark.out"
    with open(stdout, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "benchmarks/learning.py", "configs/smoke.yaml", "--prefix", "down", "--seeds", "1,2",
             "--minutes", "3", "--kill-learner-at", "0.6", "--downtime", "120", "--scores", "-30",
             "train.total_env_steps=1000000", "learner.checkpoint_every_updates=20", "eval.video=false"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 180
        while "resuming it in 120 s" not in _read(stdout):
            assert process.poll() is None and time.time() < deadline, _read(stdout)
            time.sleep(1)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)   # well within the downtime: the wait itself was cut short
    finally:
        _kill_group(process)
    out = _read(stdout)
    assert process.returncode == 130, out[-3000:] + err[-3000:]
    assert re.search(r"interrupted \S+ from launch: seed 1 stopped, seeds 2 not run", out), out
    assert "run.resume=true" not in out and "Traceback" not in err, err
    assert not (tmp_path / "down-s2").exists()
    assert out.splitlines()[-1].startswith("down-s1 ")


@pytest.mark.slow
def test_a_run_that_ends_at_its_own_stop_score_ends_its_seed_and_the_next_one_runs(tmp_path):
    """configs/pong_cpu.yaml ends a run at its first evaluation of 18 (eval.stop_score), the score its benchmark
    commands watch for with --stop-at: whichever of the two stops a run, its seed ends with its time to the score,
    it is not taken for a crash (nothing resumed), and the next seed runs."""
    env = dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path), RL_DQN_PYTHON=sys.executable)
    result = subprocess.run(
        [sys.executable, "benchmarks/learning.py", "configs/smoke.yaml", "--prefix", "own", "--seeds", "1,2",
         "--minutes", "3", "--stop-at", "-30", "--scores", "-30", "train.total_env_steps=1000000",
         "eval.stop_score=-30", "eval.video=false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "resuming it in" not in out and "run.resume=true" not in out and "Traceback" not in result.stderr, out
    for seed in (1, 2):
        summary = json.loads((tmp_path / f"own-s{seed}/summary.json").read_text())
        assert 0 < summary["env_steps"] < 1_000_000 and summary["best_eval_return"] >= -30, summary
    rows = [line for line in out.splitlines() if line.startswith("own-s")]   # the table: each seed's time to -30
    assert [row.split()[0] for row in rows] == ["own-s1", "own-s2"] and "not reached" not in "".join(rows), out
