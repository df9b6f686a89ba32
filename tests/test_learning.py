"""The agent learns: CartPole-v1 through the distributed pipeline (learner + 2 collectors over RPC)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_dqn import checkpoints
from rl_dqn.evaluate import evaluate, load_player

ROOT = Path(__file__).resolve().parents[1]
STOP = 400


@pytest.mark.slow
def test_cartpole_reaches_195(tmp_path, monkeypatch):
    """The network the run kept as its best (checkpoints/best.pt, chosen by the run's own evaluations) scores
    >= 195 over 20 fresh episodes. DQN's CartPole score can fall from a peak late in a run, so the newest
    checkpoint's score is printed beside it but not required, and so is the time from launch: how fast it learns
    is the learning benchmark's to measure, and the subprocess's timeout only stops a run that hangs. The run ends at
    its first evaluation of 400 (eval.stop_score; the config's own 475 is the benchmark's target), which is
    enough to show that it learned and well above the 195 required of best.pt on fresh episodes."""
    monkeypatch.setenv("RL_DQN_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("RL_DQN_PYTHON", sys.executable)
    started = time.monotonic()
    result = subprocess.run([str(ROOT / "launch/local.sh"), "configs/cartpole.yaml", "run.name=learn",
                             f"eval.stop_score={STOP}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    best = evaluate(*load_player(checkpoints.best(tmp_path / "learn")), episodes=20, epsilon=0.0)
    elapsed = time.monotonic() - started
    newest = evaluate(*load_player(checkpoints.newest(tmp_path / "learn")), episodes=20, epsilon=0.0)
    mean = sum(best) / len(best)
    print(f"CartPole: mean greedy return {mean:.1f} over 20 episodes (best.pt), {sum(newest) / 20:.1f} (newest "
          f"checkpoint), {elapsed:.0f} s from launch to evaluation")
    assert len(best) == 20 and mean >= 195, best
    # The run ended at its first evaluation of STOP or more, if it had one, else at its total (100k env steps).
    summary = json.loads((tmp_path / "learn/summary.json").read_text())
    reached = summary["best_eval_return"] >= STOP
    assert ("[learner] reached eval.stop_score after" in result.stdout) == reached, result.stdout[-3000:]
    assert (summary["env_steps"] < 100_000) == reached, summary["env_steps"]
