"""What the learner tells people, from plain records: summary.json (each collector's chunks, processes and figures;
rates that end where training ended), evaluation rounds and the best of them, and the membership lines."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from rl_dqn.config import load_config
from rl_dqn.reporting import ChunkArrived, Counters, Report

ROOT = Path(__file__).resolve().parents[1]


def make_report(tmp_path, *overrides) -> Report:
    cfg = load_config(ROOT / "configs/cartpole.yaml", ["run.name=t", "collectors.count=2", "eval.episodes=2",
                                                       *overrides])
    return Report(cfg, tmp_path, torch.device("cpu"), ["collector0", "collector1"])


def arrived(collector: int, sender: int, version: int, returns: tuple[float, ...] = ()) -> ChunkArrived:
    return ChunkArrived(collector, sender, 60, 1_000, "cpu", version, list(returns), [9] * len(returns),
                        (12.5, 300.0, 0.0))


def counters(env_steps: int, updates: int) -> Counters:
    return Counters(env_steps, updates, 3, 240, {}, 0, 2, {})


def test_the_summary_counts_each_collectors_chunks_and_its_rates_end_where_training_ended(tmp_path):
    report = make_report(tmp_path)
    report.membership("joined", "collector0", 0, "process 1 of its slot")
    for seq in range(3):
        report.chunk(arrived(0, sender=5, version=seq, returns=(-21.0,)), 60 * (seq + 1), weights_version=seq)
    report.chunk(arrived(1, sender=7, version=2), 240, weights_version=3)
    for update in range(1, 4):
        report.updated(0.01, 240, update, torch.zeros(32), torch.ones(32))
    report.finish()   # the final checkpoint would come now, then the summary
    report.write_summary(counters(240, 3), "total_env_steps")
    first = json.loads((tmp_path / "summary.json").read_text())
    time.sleep(0.3)   # a slow save would add this much before the summary is written
    report.write_summary(counters(240, 3), "total_env_steps")
    again = json.loads((tmp_path / "summary.json").read_text())
    assert first["collectors"]["collector0"] == {
        "chunks": 3, "env_steps": 180, "episodes": 3, "first_weights_version": 0, "last_weights_version": 2,
        "chunk_device": "cpu", "processes": 1, "senders": 1, "system": [12.5, 300.0, 0.0]}
    assert first["collectors"]["collector1"]["chunks"] == 1 and first["collectors"]["collector1"]["processes"] == 0
    assert first["recent_returns"] == [-21.0] * 3 and first["ended"] == "total_env_steps"
    assert again["updates_per_s_training"] == first["updates_per_s_training"] > 0
    assert again["env_steps_per_s"] == first["env_steps_per_s"] > 0
    assert again["wall_s"] >= first["wall_s"] + 0.3
    report.close()


def test_an_evaluation_round_is_logged_on_the_runs_clock_and_the_best_kept(tmp_path, capsys):
    report = make_report(tmp_path, "eval.screen_episodes=1", "eval.screen_score=0")
    assert report.evaluated(60, 1.0, 1, [10.0, 20.0], None, 0.5, 0.4) == (15.0, 5.0, True)
    assert report.evaluated(120, 2.0, 2, [-5.0], None, 0.2, 0.1) == (-5.0, 0.0, False)
    assert report.best_eval == 15.0 and report.last_eval == (-5.0, 0.0, 120)
    out = capsys.readouterr().out
    assert "[learner] eval at 60 env steps (weights v1 of 1s, scored by " in out
    assert "15.00 +- 5.00 over 2 episodes\n" in out
    assert "-5.00 +- 0.00 over 1 episodes (below eval.screen_score 0: the round stops there)" in out
    report.close()


def test_training_episodes_at_the_return_epsilon_are_averaged_over_the_latest_env_steps(tmp_path):
    """summary.json's returns_at_epsilon: the episodes played at metrics.return_epsilon (a float32 0.01 among them)
    that ended within metrics.return_epsilon_env_steps of the run's end, and since a resumption; episodes at other
    epsilons, and chunks that do not say, count only among all returns."""
    report = make_report(tmp_path, "metrics.return_epsilon=0.01", "metrics.return_epsilon_env_steps=100")
    f32 = torch.tensor(0.01, dtype=torch.float32).item()
    report.chunk(arrived(0, 5, 0, (1.0, 2.0))._replace(episode_epsilons=[f32, 0.0105]), 60, weights_version=0)
    report.chunk(arrived(0, 5, 1, (10.0, 20.0, 40.0))._replace(episode_epsilons=[0.4, f32, 0.005]), 120,
                 weights_version=1)
    report.chunk(arrived(1, 7, 1, (30.0,)), 180, weights_version=1)    # no epsilons: not among them
    assert report.returns_at_epsilon(120) == {"epsilon": 0.01, "env_steps": 100, "from_env_steps": 20,
                                              "episodes": 2, "mean": (1.0 + 20.0) / 2}
    assert report.returns_at_epsilon(180)["episodes"] == 1        # the one at 60 env steps is 120 behind
    assert report.returns_at_epsilon(300) == {"epsilon": 0.01, "env_steps": 100, "from_env_steps": 200,
                                              "episodes": 0, "mean": None}
    report.write_summary(counters(180, 0), "total_env_steps")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["returns_at_epsilon"]["mean"] == 20.0
    assert summary["recent_returns"] == [1.0, 2.0, 10.0, 20.0, 40.0, 30.0]
    assert "training episodes at epsilon 0.01 scored 20.00 from 80 env steps on (1 episodes)" in \
        report.closing_lines("done", counters(180, 0))
    report.close()
    resumed = make_report(tmp_path / "resumed", "metrics.return_epsilon_env_steps=100")
    resumed.resume_at(1_000, 50.0, None)
    assert resumed.returns_at_epsilon(1_050)["from_env_steps"] == 1_000   # not before its own episodes
    resumed.close()
    off = make_report(tmp_path / "off", "metrics.return_epsilon=null")
    off.chunk(arrived(0, 5, 0, (1.0,))._replace(episode_epsilons=[0.0]), 60, weights_version=0)
    assert off.returns_at_epsilon(60) is None
    off.close()


def test_a_resumed_runs_curves_keep_what_came_before_its_checkpoint_and_hide_what_came_after(tmp_path):
    """A run that ended at its total with an evaluation at its last step, extended: that evaluation stays."""
    from rl_dqn.metrics import Board
    from rl_dqn.plot import load_events
    cfg = load_config(ROOT / "configs/cartpole.yaml", ["run.name=t"])
    first = Board(tmp_path, cfg)
    for step, score in ((50, 1.0), (100, 2.0), (120, 9.0)):   # the checkpoint is at 100
        first.scalar("eval/episode_return", score, step)
    first.writer.close()
    # TensorBoard reads a folder's event files in name order: seconds since the epoch, then a per-process counter
    # that here, after other tests' writers, may go from 9 to 10 within one second. A resumed process starts in a
    # later second; so does this one.
    time.sleep(1.01 - time.time() % 1)
    resumed = Board(tmp_path, load_config(ROOT / "configs/cartpole.yaml", ["run.name=t", "run.resume=true"]))
    resumed.resume_at(100)
    resumed.scalar("eval/episode_return", 3.0, 150)
    resumed.writer.close()
    curve = [(e.step, e.value) for e in load_events(tmp_path).Scalars("eval/episode_return")]
    assert curve == [(50, 1.0), (100, 2.0), (150, 3.0)]


@pytest.mark.parametrize("env_id, play", [("CartPole-v1", "play.sh {run}; "),
                                           ("ALE/Pong-v5", "play.sh {run} --video episode.mp4; ")])
def test_the_closing_lines_say_how_to_watch_the_run_as_play_can(tmp_path, env_id, play):
    """A video only of an Atari game: play refuses --video for other envs."""
    report = make_report(tmp_path, f"env.id={env_id}")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint_000000001.pt").write_bytes(b"")
    (line,) = [line for line in report.closing_lines("done", counters(180, 0)) if "watch it" in line]
    assert play.format(run=tmp_path) in line
    report.close()


@pytest.mark.parametrize("what, detail, line", [
    ("joined", "process 2 of its slot", "[learner] collector1 joined (process 2 of its slot)"),
    ("left", "", "[learner] collector1 left"),
    ("lost", "no answer", "[learner] collector1 lost: no answer; training goes on, its slot is open for a new process"),
])
def test_one_line_per_collector_that_joins_leaves_or_is_lost(tmp_path, capsys, what, detail, line):
    report = make_report(tmp_path)
    report.membership(what, "collector1", 1, detail)
    assert capsys.readouterr().out == line + "\n"
    report.close()
