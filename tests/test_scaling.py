"""benchmarks/scaling.py on the tiny smoke config: a row per run with its rates and its processes' CPU, and a
benchmark interrupted midway that stops its run and ends with the table of the runs that finished."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # each test launches runs

ROOT = Path(__file__).resolve().parents[1]
# The smoke run trains from 500 env steps (scaling.py's own 5,000 would outlast its 4,000) and does not end by itself.
BENCHMARK = [sys.executable, "benchmarks/scaling.py", "configs/smoke.yaml", "--collectors", "1", "--seconds", "3",
             "train.total_env_steps=1000000", "train.learning_starts=500"]
# A row of the table: transport, collectors, ratio, env steps/s, updates/s, training share, then the CPU columns.
ROW = re.compile(r"^ +cpu +1 +(\d+) +([\d,]+) +([\d,.]+) +(\d+|-)% +(\d+|-)% .*%$")


def _env(runs: Path) -> dict[str, str]:
    return dict(os.environ, RL_DQN_RUNS_DIR=str(runs), RL_DQN_PYTHON=sys.executable)


def _table(out: str) -> list[re.Match]:
    """The rows of the table that ends the output, after its title line."""
    tail = out[out.index("rl_dqn pipeline on "):].splitlines()[2:]
    return [ROW.match(line) for line in tail if line.strip()]


def test_the_table_has_a_row_per_run_with_its_rates_and_cpu(tmp_path):
    result = subprocess.run([*BENCHMARK, "--ratios", "2,0", "--prefix", "t"], cwd=ROOT, env=_env(tmp_path),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = _table(result.stdout)
    assert all(rows) and [row[1] for row in rows] == ["2", "0"], result.stdout
    training, collecting = rows
    assert float(training[2].replace(",", "")) > 0 and float(training[3].replace(",", "")) > 0, training[0]
    assert 0 < int(training[4]) <= 100 and training[5] != "-", training[0]   # training share, the learner's CPU
    assert float(collecting[2].replace(",", "")) > 0 and float(collecting[3]) == 0, collecting[0]
    assert {p.name for p in tmp_path.iterdir() if p.is_dir()} == {"t-cpu-c1-r2", "t-cpu-c1-r0"}


def test_an_interrupted_benchmark_stops_its_run_and_prints_the_rows_that_finished(tmp_path):
    """Ctrl-C reaches the benchmark and its run's launcher (one process group): the run that was going is stopped
    and left out, no further run starts, and the table of the finished runs ends the output, exit code 130."""
    prefix = tmp_path.name   # the test's own: its run is looked for among the machine's processes
    process = subprocess.Popen([*BENCHMARK, "--ratios", "0,2,0.5", "--prefix", prefix], cwd=ROOT,
                               env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    out = []
    try:
        for line in process.stdout:
            out.append(line)
            if line.startswith("$ ") and f"run.name={prefix}-cpu-c1-r2 " in line:   # the first run is measured
                time.sleep(2)
                os.killpg(process.pid, signal.SIGINT)
                break
        rest, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    out = "".join(out) + rest
    assert process.returncode == 130, out[-3000:] + err[-3000:]
    assert f"{prefix}-cpu-c1-r2: interrupted; it is left out, and no further run starts" in out, out
    assert "Traceback" not in out + err, out + err
    rows = _table(out)
    assert all(rows) and [row[1] for row in rows] == ["0"], out
    assert not (tmp_path / f"{prefix}-cpu-c1-r0.5").exists()
    deadline = time.monotonic() + 30   # the run's roles, in sessions of their own, stop within their grace
    while subprocess.run(["pgrep", "-f", f"run.name={prefix}-cpu-c1-r2"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the interrupted run's processes are still running"
        time.sleep(0.2)
