"""Shared test settings, and the smoke run that several test files read."""

import os
import sys
from pathlib import Path

import pytest
import torch

# Tests run beside the processes they start; torch's default pool (one thread per core) in several processes on
# 2 cores makes small ops 60-100x slower, so the test process keeps to one thread.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA not available")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smoke(tmp_path_factory) -> tuple[Path, str]:
    """The smoke run (Pong, 4,000 env steps, learner + 2 collectors, evaluation with video), launched once for the
    session: its folder and its console output. The tests that read it (test_end_to_end.py) and those that resume
    it as a run that reached its total (test_resume.py) leave it as it was."""
    from test_end_to_end import finish, launch
    runs = tmp_path_factory.mktemp("runs")
    env = dict(os.environ, RL_DQN_RUNS_DIR=str(runs), RL_DQN_PYTHON=sys.executable)
    code, output = finish(launch("local.sh", "configs/smoke.yaml", "run.name=smoke", env=env), timeout=300)
    assert code == 0, output[-3000:]
    return runs / "smoke", output
