"""The plot command: evaluation curves read back from a run's TensorBoard events (a resumed run's too), a PNG with
every run on it, and each run's time to a score."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from rl_dqn.plot import EvalPoint, first_reaching, fitted_title, load_events, read_evals, table

ROOT = Path(__file__).resolve().parents[1]


def write_evals(run_dir: Path, rounds: list[tuple[int, float, float, float]], purge_step: int | None = None) -> None:
    """Evaluation rounds (env steps, seconds from launch, mean, std) as the learner logs them."""
    writer = SummaryWriter(str(run_dir), purge_step=purge_step)
    for steps, seconds, mean, std in rounds:
        writer.add_scalar("eval/episode_return", mean, steps)
        writer.add_scalar("eval/episode_return_std", std, steps)
        writer.add_scalar("eval/time_from_launch_s", seconds, steps)
        writer.add_scalar("eval/episode_return_vs_seconds", mean, int(seconds))
    writer.close()


def test_a_resumed_runs_curve_goes_on_from_its_checkpoint_without_what_the_lost_process_wrote_after_it(tmp_path):
    run = tmp_path / "pong"
    # The first process evaluated at 50k, 100k and 150k, checkpointed at 120k and died; the resumed one goes on.
    write_evals(run, [(50_000, 70.0, -21.0, 0.0), (100_000, 140.0, -15.0, 2.0), (150_000, 210.0, -5.0, 3.0)])
    # TensorBoard reads a folder's event files in name order: seconds since the epoch, then a per-process counter
    # that here, after other tests' writers, may go from 9 to 10 within one second. A resumed process starts in a
    # later second; so does this one.
    time.sleep(1.01 - time.time() % 1)
    write_evals(run, [(150_000, 215.0, -8.0, 3.0), (200_000, 280.0, 18.5, 1.0)], purge_step=120_000)
    points = read_evals(run)
    assert [p[:4] for p in points] == [(50_000, 70.0, -21.0, 0.0), (100_000, 140.0, -15.0, 2.0),
                                       (150_000, 215.0, -8.0, 3.0), (200_000, 280.0, 18.5, 1.0)]
    assert 0 < points[0].logged_at <= points[-1].logged_at <= time.time()


def test_a_run_read_as_it_goes_reads_only_what_is_new_and_keeps_tensorboards_purge_warning_out(tmp_path, caplog):
    run = tmp_path / "pong"
    write_evals(run, [(50_000, 70.0, -21.0, 0.0), (100_000, 140.0, -15.0, 2.0), (150_000, 210.0, -5.0, 3.0)])
    events = load_events(run)
    assert [p.mean for p in read_evals(run, events)] == [-21.0, -15.0, -5.0]
    write_evals(run, [(150_000, 215.0, -8.0, 3.0), (200_000, 280.0, 18.5, 1.0)], purge_step=120_000)
    with caplog.at_level(logging.INFO, logger="tensorboard"):
        assert [p.mean for p in read_evals(run, events)] == [-21.0, -15.0, -8.0, 18.5]
        assert [p.mean for p in read_evals(run)] == [-21.0, -15.0, -8.0, 18.5]
    assert not [r for r in caplog.records if "out of order" in r.getMessage()]


def test_time_to_a_score_is_the_first_round_that_reached_it():
    points = [EvalPoint(50_000, 70.0, -21.0, 0.0), EvalPoint(100_000, 140.0, 0.5, 2.0),
              EvalPoint(150_000, 210.0, -1.0, 3.0), EvalPoint(200_000, 281.0, 19.0, 1.0)]
    assert first_reaching(points, 0.0) == points[1]
    assert first_reaching(points, 18.0) == points[3]
    assert first_reaching(points, 20.0) is None
    text = table({"a": points}, [0.0, 18.0, 20.0])
    assert "2m20s (100k)" in text and "4m41s (200k)" in text and "not reached" in text and "19.0 at 4m41s" in text


def test_rounds_that_stopped_at_their_screen_are_marked_in_the_table(tmp_path):
    run = tmp_path / "pong"
    write_evals(run, [(50_000, 70.0, -21.0, 0.0), (100_000, 140.0, 12.0, 2.0), (150_000, 210.0, 18.5, 1.0)])
    writer = SummaryWriter(str(run))
    for steps, episodes in [(50_000, 5), (100_000, 5), (150_000, 20)]:
        writer.add_scalar("eval/episodes", episodes, steps)
    writer.close()
    (run / "config.yaml").write_text("eval:\n  episodes: 20\n  screen_episodes: 5\n")
    points = read_evals(run)
    assert [p.screened for p in points] == [True, True, False]
    lines = table({"pong": points}, [10.0, 18.0]).splitlines()
    assert "2m20s (100k)*" in lines[1] and "3m30s (150k)" in lines[1] and "(150k)*" not in lines[1]
    assert lines[-1].startswith("* a round that stopped at its screen")
    (run / "config.yaml").unlink()   # without the run's config nothing is marked
    assert not any(p.screened for p in read_evals(run))


def test_a_run_stopped_before_its_first_round_has_a_line_in_the_table(tmp_path):
    write_evals(tmp_path / "s1", [(50_000, 60.0, -20.0, 1.0), (100_000, 125.0, 18.2, 2.0)])
    lines = table({"s1": read_evals(tmp_path / "s1"), "s2": []}, [18.0]).splitlines()
    assert lines[1].split()[:2] == ["s1", "2"] and "18.2 at 2m05s" in lines[1]
    assert lines[2].split() == ["s2", "0", "not", "reached", "none", "none"]


def test_the_plot_command_draws_every_run_into_a_png_and_prints_their_times(tmp_path):
    write_evals(tmp_path / "s1", [(50_000, 60.0, -20.0, 1.0), (100_000, 125.0, 18.2, 2.0)])
    write_evals(tmp_path / "s2", [(50_000, 62.0, -19.0, 1.0), (100_000, 130.0, 5.0, 4.0), (150_000, 200.0, 19.5, 1.0)])
    out = tmp_path / "docs" / "curve.png"
    result = subprocess.run([sys.executable, "-m", "rl_dqn.plot", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out",
                             str(out), "--target", "18"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split()[0] == "s1" and "2m05s (100k)" in lines[1]
    assert lines[2].split()[0] == "s2" and "3m20s (150k)" in lines[2]
    from PIL import Image
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > image.size[1] > 200


@pytest.mark.parametrize("args, message", [
    (["{missing}"], "missing: no such folder"),
    (["{tmp}"], "holds no TensorBoard events"),
    (["{empty}"], "has no evaluations with times"),
    (["{empty}", "--out", "{tmp}/curve.jpg"], "--out must name a .png file"),
    (["{empty}", "--out", "{tmp}/a.png"], "--out must name a .png file, got '{tmp}/a.png', a folder"),
    (["{empty}", "--out", "{tmp}/notes.txt/b/a.png"], "--out '{tmp}/notes.txt/b/a.png': '{tmp}/notes.txt' is a file, "
                                                      "not a folder"),
    (["{garbage}"], "garbage: its events.out.tfevents.* files hold no event TensorBoard can read"),
    (["{empty}", "--labels", "a,b"], "--labels gives 2 labels for 1 runs"),
    (["{empty}", "{empty}", "--labels", "x,x"], "each run needs a label of its own; x names more than one"),
])
def test_the_plot_command_refuses_what_it_cannot_draw_with_one_line(tmp_path, args, message):
    writer = SummaryWriter(str(tmp_path / "empty"))   # a run stopped before its first evaluation
    writer.add_scalar("learner/loss", 1.0, 1)
    writer.close()
    (tmp_path / "a.png").mkdir()
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage/events.out.tfevents.1.host").write_bytes(bytes(range(256)) * 8)
    args = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty", garbage=tmp_path / "garbage",
                     tmp=tmp_path) for a in args]
    message = message.format(tmp=tmp_path)
    result = subprocess.run([sys.executable, "-m", "rl_dqn.plot", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) <= 2, result.stderr


@pytest.mark.parametrize("inches, size", [(7.0, "medium"), (11.0, "large"), (14.4, "medium")])
def test_a_long_title_is_broken_into_lines_that_fit_the_figure(inches, size):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title = ("A candidate for configs/atari_cpu.yaml: returns shortened from 10 steps to 3 between 1M and 1.5M env "
             "steps, read env step for env step against the mean of the config's three-seed table")
    wrapped = fitted_title(title, inches, size)
    figure = plt.figure(figsize=(inches, 4.0), dpi=100)
    text = figure.suptitle(wrapped, fontsize=size)
    figure.canvas.draw()
    extent = text.get_window_extent()
    plt.close(figure)
    assert wrapped.replace("\n", " ") == title
    assert "\n" in wrapped
    assert 0 <= extent.x0 and extent.x1 <= inches * 100
