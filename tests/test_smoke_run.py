"""The smoke run (Pong, 4,000 env steps, learner + 2 collectors over real RPC, evaluation with video), launched once
for this file by its real launcher: what it wrote (summary, dashboard, console, checkpoints a player can load), and,
as a run that reached its total, resumed to a no-op that starts and writes nothing. The tests that read it live in
this one file, so that pytest-xdist's `--dist loadfile` runs it once, on one worker."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_end_to_end import ROOT, TAGS, finish, launch, processes_of, scalars, summaries_of
from test_faults import two_nodes
from test_resume import environment, snapshot, summary_of

from rl_dqn.config import load_config, to_dict
from rl_dqn.network import resolve_precision

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[Path, str]:
    """The smoke run's folder and its console output. The tests leave it as they found it."""
    runs = tmp_path_factory.mktemp("runs")
    code, output = finish(launch("local.sh", "configs/smoke.yaml", "run.name=smoke", env=environment(runs)),
                          timeout=300)
    assert code == 0, output[-3000:]
    return runs / "smoke", output


def test_smoke_run_end_to_end(smoke):
    run_dir, _ = smoke
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 4000 and summary["updates"] > 0
    # The replay ratio holds for the whole run: 2 samples per env step after 1,000, in batches of 32.
    assert summary["updates"] == 2 * (summary["env_steps"] - 1000) // 32
    for name in ("collector0", "collector1"):
        c = summary["collectors"][name]
        assert c["chunks"] > 0 and c["env_steps"] > 0, f"no data from {name}"
        assert c["last_weights_version"] > c["first_weights_version"], f"{name} never adopted newer weights"
    values = scalars(run_dir)
    for tag in TAGS:
        assert values.get(tag), f"TensorBoard tag {tag} holds no value"
    assert all(-21 <= r <= 21 for r in values["collector/episode_return"])   # raw Pong scores
    # The episodes of the env that acts at metrics.return_epsilon (0.4, Ape-X's first of eight, collector0's first)
    # also on their own, their epsilons having come over RPC with the chunks; all within the summary's window of 250k
    # env steps. Its first episode ends at env.max_episode_frames, which it reaches unless collector0 took less than
    # its share of the run's env steps.
    at = values.get("collector/episode_return_at_epsilon", [])
    cfg = load_config(run_dir / "config.yaml")
    if summary["collectors"]["collector0"]["env_steps"] // cfg.env.envs_per_collector >= \
            cfg.env.max_episode_frames // cfg.env.frame_skip:
        assert at, "the env at metrics.return_epsilon ran a whole episode, and none was logged"
    assert all(at.count(r) <= values["collector/episode_return"].count(r) for r in at)
    assert summary["returns_at_epsilon"] == {"epsilon": 0.4, "env_steps": 250_000, "from_env_steps": 0,
                                             "episodes": len(at), "mean": pytest.approx(sum(at) / len(at)) if at
                                             else None}
    # Evaluation every 1,000 env steps in its own process: raw scores of whole (time-limited) episodes.
    assert values.get("eval/episode_return") and values.get("eval/episode_return_vs_seconds")
    assert all(-21 <= r <= 21 for r in values["eval/episode_return"])
    # When each score was known, from the launch: after the first chunk arrived and before the run ended.
    known = values["eval/time_from_launch_s"]
    assert len(known) == len(values["eval/episode_return"]) and known == sorted(known)
    assert 0 < summary["first_data_s"] <= summary["training_start_s"] < known[0] <= known[-1] < summary["wall_s"]
    assert summary["eval_rounds"] == len(known) and summary["eval_round_s"] > 0 and summary["updating_s"] > 0
    assert summary["best_eval_return"] == max(values["eval/episode_return"])
    best = torch.load(run_dir / "checkpoints/best.pt", weights_only=True)   # the best round's network, kept
    assert best["eval"]["mean"] == summary["best_eval_return"] and best["eval"]["episodes"] == 2
    assert max(values["weights/version"]) > 0
    # The config as the learner ran it: network.precision's `auto` resolved for its device.
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert written["network"]["precision"] == resolve_precision("auto", "cpu")
    assert written == to_dict(load_config(ROOT / "configs/smoke.yaml", [
        "run.name=smoke", f"cluster.init_method={written['cluster']['init_method']}", "cluster.world_size=3",
        "cluster.interface=lo", "cluster.single_node=true", f"network.precision={written['network']['precision']}"]))
    assert list((run_dir / "checkpoints").glob("checkpoint_*.pt"))
    assert not processes_of("smoke")


def test_dashboard_has_hparams_layout_histograms_system_figures_and_a_video(smoke):
    import cv2
    import numpy as np
    from tensorboard.plugins.custom_scalar.layout_pb2 import Layout
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
    run_dir, _ = smoke
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "histograms": 0})
    events.Reload()
    tags = events.Tags()
    # HParams: every config key, with the final evaluation score among the metrics.
    plugin_data = [HParamsPluginData.FromString(v.metadata.plugin_data.content)
                   for v in summaries_of(run_dir, "hparams")]
    session = next(d.session_start_info for d in plugin_data if d.HasField("session_start_info"))
    assert session.hparams["train.lr"].number_value == pytest.approx(1e-4)
    assert session.hparams["env.id"].string_value == "ALE/Pong-v5"
    assert session.hparams["network.precision"].string_value == resolve_precision("auto", "cpu")
    experiment = next(d.experiment for d in plugin_data if d.HasField("experiment"))
    assert {m.name.tag for m in experiment.metric_infos} >= {"eval/episode_return", "eval/best_episode_return"}
    assert "eval/best_episode_return" in tags["scalars"]
    # Custom scalars: score against env steps and against wall time side by side.
    layout = Layout.FromString(summaries_of(run_dir, "custom_scalars")[0].tensor.string_val[0])
    score = next(c for c in layout.category if c.title == "score")
    assert [chart.title for chart in score.chart] == ["score vs env steps", "score vs wall time (s)"]
    # Histograms every metrics.histogram_every_updates (20) updates.
    for tag in ("learner/q_values", "learner/td_errors"):
        assert len(events.Histograms(tag)) >= 3, tag
    # System figures of the learner and its node (the learner logs them as it closes, however short the run). A
    # collector's come with its chunks once it has acted for metrics.interval_s, which a short run on a fast machine
    # may not last: test_sigterm_takes_the_run_down_and_keeps_what_was_learned waits for them in a run that goes on.
    for figure in ("cpu_percent", "memory_mb"):
        values = [e.value for e in events.Scalars(f"system/learner/{figure}")]
        assert values and all(v >= 0 for v in values) and max(values) > 0, figure
    assert max(e.value for e in events.Scalars("system/learner/memory_mb")) > 100
    assert events.Scalars("system/learner_node/cpu_percent")
    # The evaluation's video: an animated GIF of the game screen, up to eval.video_max_steps (100) steps.
    gif = events.Images("eval/video")[0]
    ok, animation = cv2.imdecodeanimation(np.frombuffer(gif.encoded_image_string, np.uint8))
    assert ok and 20 <= len(animation.frames) <= 101 and animation.frames[0].shape[:2] == (210, 160)
    assert (gif.height, gif.width) == (210, 160)


def test_console_shows_progress_and_a_final_summary(smoke):
    """The smoke run's lines. It ends by itself, after as many progress lines as the machine's speed gives it (one,
    as it closes, at the least): test_sigterm_takes_the_run_down_and_keeps_what_was_learned waits for lines with an
    ETA in a run that goes on."""
    run_dir, output = smoke
    progress = re.findall(r"\[learner\] env steps ([\d,]+)/4,000 \[([#-]{20})\] +(\d+)% ETA (\S+) \| .*steps/s", output)
    assert progress, output[-3000:]
    steps = [int(done.replace(",", "")) for done, *_ in progress]
    assert steps == sorted(steps) and steps[-1] >= 4000, progress
    assert progress[-1][1] == "#" * 20 and progress[-1][3] == "-", progress[-1]   # done: a full bar, no ETA
    assert "@progress" not in output   # the collectors' machine lines stay with the launcher
    assert re.search(r"\[learner\] done after \S+: [\d,]+ env steps", output)
    assert re.search(r"\[learner\] eval: last -?\d+\.\d\d \+- \d+\.\d\d \(at [\d,]+ env steps\), best", output)
    assert f"[learner] newest checkpoint {run_dir}/checkpoints/checkpoint_" in output
    assert f"[learner] best evaluated network {run_dir}/checkpoints/best.pt (score " in output


def test_play_prints_the_score_and_records_a_video_that_decodes(smoke, tmp_path, capsys):
    import cv2

    from rl_dqn.evaluate import main as play
    run_dir, _ = smoke
    env = dict(os.environ, RL_DQN_PYTHON=sys.executable)
    for name in ("episode.mp4", "episode.gif"):
        code, output = finish(launch("play.sh", str(run_dir), "--episodes", "2", "--video", str(tmp_path / name),
                                     "--video-max-steps", "60", env=env), timeout=120)
        assert code == 0, output
        assert re.search(r"checkpoint_\d+\.pt: 2 episodes, score -?\d+\.\d\d \+- \d+\.\d\d", output), output
        if name.endswith(".mp4"):
            video, frames = cv2.VideoCapture(str(tmp_path / name)), []
            while (read := video.read())[0]:
                frames.append(read[1])
            assert video.get(cv2.CAP_PROP_FPS) == pytest.approx(15.0)
            assert len(frames) == 61, len(frames)
        else:
            ok, animation = cv2.imreadanimation(str(tmp_path / name))
            assert ok
            frames = animation.frames
            # A GIF stores a screen that repeats the one before as a longer showing of it (in hundredths of a
            # second): 61 frames of play time at 15 fps.
            assert sum(round(d * 15 / 1000) for d in animation.durations) == 61 and len(frames) <= 61, \
                animation.durations
        assert frames[0].shape[:2] == (210, 160), (name, frames[0].shape)
        assert len({f.tobytes() for f in frames}) > 10   # the game moves
    # A given checkpoint, and the run's best network (in this process: the launcher is the one above).
    checkpoint = sorted((run_dir / "checkpoints").glob("checkpoint_*.pt"))[0]
    assert play([str(checkpoint), "--episodes", "1"]) == 0
    assert f"{checkpoint}: 1 episodes" in capsys.readouterr().out
    assert play([str(run_dir), "--best", "--episodes", "1"]) == 0
    assert f"{run_dir / 'checkpoints/best.pt'}: 1 episodes" in capsys.readouterr().out
    # Bad input through the launcher: one line, exit 2 (the other refusals: test_evaluate.py, in-process).
    code, output = finish(launch("play.sh", str(tmp_path / "nothing"), env=env), timeout=60)
    assert code == 2 and output.strip() == f"play: error: {tmp_path / 'nothing'} is neither a run folder nor a " \
                                           f"checkpoint file", output


# ------------------------------------------------------------------- resumed: a run that reached its total


def at_its_total(smoke: tuple[Path, str], role: str) -> str:
    steps = summary_of(smoke[0])["env_steps"]
    assert summary_of(smoke[0])["ended"] == "total_env_steps" and steps < 8000
    return (f"[{role}] run smoke already reached train.total_env_steps=4,000 at {steps:,} env steps: nothing to do; to "
            f"train on, resume with a larger train.total_env_steps (e.g. train.total_env_steps=8000)")


def test_resuming_a_run_that_reached_its_total_starts_and_changes_nothing(smoke):
    runs = smoke[0].parent
    before = snapshot(runs)
    code, output = finish(launch("local.sh", "configs/smoke.yaml", "run.name=smoke", "run.resume=true",
                                 env=environment(runs)), timeout=120)
    assert code == 0, output
    # The collectors' last chunks can take the run past its total: the line gives where it ended.
    assert output.splitlines() == [at_its_total(smoke, "local")], output
    assert "joining the run" not in output and not processes_of("smoke")
    assert snapshot(runs) == before


def test_a_multi_node_learner_resuming_a_finished_run_exits_before_joining(smoke):
    runs = smoke[0].parent
    before = snapshot(runs)
    cluster, port = two_nodes("smoke", "run.resume=true")
    code, output = finish(launch("learner.sh", "configs/smoke.yaml", *cluster, env=environment(runs)), timeout=120)
    assert code == 0, output
    assert output.splitlines() == [at_its_total(smoke, "learner")], output
    assert snapshot(runs) == before
