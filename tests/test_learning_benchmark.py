"""benchmarks/learning.py on the tiny smoke config: a run with a collector and then the learner killed, the run
resumed, and the time to a score read back, in wall time from the first launch and on the run's clock."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_learning_benchmark_kills_resumes_and_reports_time_to_a_score(tmp_path):
    env = dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path), RL_DQN_PYTHON=sys.executable)
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
    log = (tmp_path / "bench-s1.log").read_text()
    assert "collector0 died" in log and "resumed from checkpoint_" in log
    # Every score is at least -30: the first round reached it, timed both ways.
    assert re.search(r"reached -30 \S+ from the first launch in wall time \(\S+ on the run's clock\)", out), out
    # Where the time went, of the resumed process: its start-up counts from its own launch.
    found = re.search(r"first chunk ([\d.]+) s, first update ([\d.]+) s after resuming at \S+ on the run's clock; "
                      r"[\d,]+ env steps", out)
    summary = json.loads((tmp_path / "bench-s1/summary.json").read_text())
    assert found and summary["resumed_at_s"] > 0, out
    assert float(found[1]) == round(summary["first_data_s"] - summary["resumed_at_s"], 1)
    assert float(found[2]) == round(summary["training_start_s"] - summary["resumed_at_s"], 1)
    assert out.splitlines()[-1].startswith("bench-s1 ")
