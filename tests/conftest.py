"""Shared test settings."""

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


@pytest.fixture(autouse=True)
def _launch_clock_of_its_own(monkeypatch):
    """A command run in this process sets the launch time its child processes inherit (console.LAUNCHED_AT_ENV);
    each test starts without one, so that the runs it launches measure start-up from their own launch."""
    from rl_dqn.console import LAUNCHED_AT_ENV
    monkeypatch.delenv(LAUNCHED_AT_ENV, raising=False)
