"""benchmarks/learning.py on the tiny smoke config: a run with a collector and then the learner killed at points of
its own progress, the run resumed, and the time to a score read back, in wall time from the first launch and on the
run's clock; a run that ended (at its total, at its own stop score) is never resumed, one that is refused is not
retried, a reused prefix is refused, and a kill that comes too late is named."""

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
import yaml

from rl_dqn.atari_scores import DOPAMINE_RAINBOW
from rl_dqn.plot import read_evals

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = [sys.executable, "benchmarks/learning.py", "configs/smoke.yaml"]
# One collector where the test watches the benchmark, not the run's collectors: a process fewer to start on 2 cores.
ONE = ["collectors.count=1"]
# For a test that waits for the run's first evaluation, or whose run ends there: it comes at 250 env steps, not 1,000.
SOON = ["eval.every_env_steps=250"]


def _env(runs: Path) -> dict[str, str]:
    return dict(os.environ, RL_DQN_RUNS_DIR=str(runs), RL_DQN_PYTHON=sys.executable)


def _assert_evaluated(run: Path) -> None:
    """Every round of Pong scores in [-21, 21], so every round reaches these tests' --scores -21, the one score that
    a smoke run, too short to learn, reaches for sure. What a broken run fails is the rest: rounds that ran and were
    logged (without them the benchmark prints no time to -21 and its table says "not reached"), scoring as Pong does."""
    scores = [point.mean for point in read_evals(run)]
    assert scores and all(-21 <= score <= 21 for score in scores), scores


def _kill_line(out: str, role: str) -> int:
    """The env steps at which the benchmark says it killed `role`."""
    found = re.search(rf"at ([\d,]+) env steps: killed the {role} \(pid \d+\) with SIGKILL", out)
    assert found, out
    return int(found[1].replace(",", ""))


@pytest.mark.slow
def test_the_learning_benchmark_kills_resumes_and_reports_time_to_a_score(tmp_path):
    """The kills come at env steps of the run, as its learner printed them, so the run is mid-way at any machine
    speed: collector0 at 1,500 and the learner at 3,000 of 5,000. A checkpoint every 20 updates (one per 320 env
    steps after train.learning_starts=1000, at train.replay_ratio=2) leaves the learner one to resume from."""
    runs = tmp_path / "runs"   # not there yet: the benchmark makes it
    result = subprocess.run(
        [*BENCHMARK, "--prefix", "bench", "--minutes", "8", "--kill-collector-at-env-steps", "1500",
         "--kill-learner-at-env-steps", "3000", "--downtime", "2", "--scores", "-21", "train.total_env_steps=5000",
         "learner.checkpoint_every_updates=20", "metrics.interval_s=1", "eval.video=false"],
        cwd=ROOT, env=_env(runs), capture_output=True, text=True, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert 1500 <= _kill_line(out, "collector") < 3000 <= _kill_line(out, "learner") < 5000, out
    assert out.count("resuming it in 2 s") == 1 and "run.resume=true" in out, out
    assert "scheduled kill" not in out, out
    log = (runs / "bench-s1.log").read_text()
    assert "collector0 died" in log and "resumed from checkpoint_" in log
    # The resumed run ended at its total, and that ending was not taken for a crash.
    summary = json.loads((runs / "bench-s1/summary.json").read_text())
    assert summary["ended"] == "total_env_steps" and summary["env_steps"] >= 5000, summary
    assert re.search(r"the run ended \S+ from launch: it reached train.total_env_steps", out), out
    _assert_evaluated(runs / "bench-s1")
    assert re.search(r"reached -21 \S+ from the first launch in wall time \(\S+ on the run's clock\)", out), out
    # Where the time went, of the resumed process: its start-up counts from its own launch.
    found = re.search(r"first chunk ([\d.]+) s, first update ([\d.]+) s after resuming at \S+ on the run's clock; "
                      r"[\d,]+ env steps", out)
    assert found and summary["resumed_at_s"] > 0, out
    assert float(found[1]) == round(summary["first_data_s"] - summary["resumed_at_s"], 1)
    assert float(found[2]) == round(summary["training_start_s"] - summary["resumed_at_s"], 1)
    assert out.splitlines()[-1].startswith("bench-s1 ") and "not reached" not in out.splitlines()[-1], out


def test_a_reused_prefix_is_refused_in_one_line_before_anything_runs(tmp_path):
    """A run folder of any requested seed that holds a run would be refused by the run, and so resumed and timed as
    if it were new: the benchmark refuses it first, and runs no seed."""
    (tmp_path / "bench-s2").mkdir()
    (tmp_path / "bench-s2/summary.json").write_text("{}")
    result = subprocess.run([*BENCHMARK, "--prefix", "bench", "--seeds", "1,2"], cwd=ROOT, env=_env(tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == f"learning.py: error: {tmp_path / 'bench-s2'} already holds a run; choose another " \
                            f"--prefix\n" and result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench-s2"]


def test_a_refused_run_is_not_resumed_and_the_next_seed_runs(tmp_path):
    """Exit code 2 is bad input: the same launch would be refused again. Each seed's error line is printed once, and
    the benchmark ends with exit code 1. A resume with nothing to resume from passes the benchmark's own check of the
    config, and is refused by the run."""
    result = subprocess.run([*BENCHMARK, "--prefix", "bad", "--seeds", "1,2", "--kill-learner-at-env-steps", "100",
                             "run.resume=true"], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                            timeout=120)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    for seed in (1, 2):
        assert len(re.findall(rf"run.name=bad-s{seed}", out)) == 1, out
    assert len(re.findall(r"the run was refused \(exit code 2\) \S+ from launch, not resumed: rl_dqn: config error: "
                          r"run.resume: \S+ holds no checkpoint to resume from", out)) == 2, out
    assert "resuming it in" not in out and "scheduled kill" not in out and "Traceback" not in result.stderr, out


@pytest.mark.slow
def test_a_run_with_no_evaluation_has_its_line_in_the_table_and_the_benchmark_exits_1(tmp_path):
    """A run that ended with no round of evaluation to read: the benchmark says so, gives it its line in the table,
    and exits 1, since it measured nothing."""
    result = subprocess.run([*BENCHMARK, "--prefix", "blind", "--minutes", "3", "--scores", "-21",
                             "train.total_env_steps=1500", "eval.every_env_steps=0", *ONE],
                            cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr[-3000:]
    assert f"{tmp_path / 'blind-s1'} has no evaluations with times" in out, out
    assert out.splitlines()[-1].split() == ["blind-s1", "0", "not", "reached", "none", "none"], out


@pytest.mark.slow
def test_a_learner_killed_before_its_first_checkpoint_is_resumed_once_and_then_refused(tmp_path):
    """With the smoke config's checkpoint every 1,000 updates (at about 17,000 env steps), the learner killed at 1,000
    leaves no checkpoint: the resume is refused ("holds no checkpoint", exit code 2) and not tried again."""
    result = subprocess.run(
        [*BENCHMARK, "--prefix", "early", "--minutes", "5", "--kill-learner-at-env-steps", "1000", "--downtime", "1",
         "train.total_env_steps=1000000", "eval.video=false", *ONE],
        cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=400)
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr[-3000:]
    assert out.count("resuming it in 1 s") == 1 and out.count("run.resume=true") == 1, out
    assert re.search(r"the run was refused \(exit code 2\) \S+ from launch, not resumed: .*holds no checkpoint to "
                     r"resume from", out), out


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
@pytest.mark.parametrize("who, prefix", [("the benchmark", "stop"), ("the run, by hand", "halt")])
def test_an_interrupted_seed_ends_the_benchmark_with_what_it_has(tmp_path, who, prefix):
    """SIGINT to the benchmark, even started where SIGINT is ignored (the background of a script), or to the run by
    hand, stops that seed as its time limit would, runs no further seed, and prints the table of what ran. (Each case
    names its runs apart: the SIGINT by hand finds its run by name, among the runs of tests beside it.)"""
    process = subprocess.Popen(
        [*BENCHMARK, "--prefix", prefix, "--seeds", "1,2", "--minutes", "3", "--scores", "-21",
         "train.total_env_steps=1000000", "eval.video=false", *ONE, *SOON],
        cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        _wait_for_first_evaluation(tmp_path / f"{prefix}-s1", process)
        if who == "the benchmark":
            process.send_signal(signal.SIGINT)
        else:
            subprocess.run(["pkill", "-INT", "-f", f"rl_dqn local .*run.name={prefix}-s1( |$)"], check=True)
        out, err = process.communicate(timeout=120)
    finally:
        _kill_group(process)
    assert process.returncode == 130, out[-3000:] + err[-3000:]
    assert re.search(r"interrupted \S+ from launch: seed 1 stopped, seeds 2 not run", out), out
    assert not (tmp_path / f"{prefix}-s2").exists() and "Traceback" not in err, err
    assert json.loads((tmp_path / f"{prefix}-s1/summary.json").read_text())["env_steps"] > 0
    assert out.splitlines()[-1].startswith(f"{prefix}-s1 ")


@pytest.mark.slow
def test_an_interrupt_between_a_killed_learner_and_its_resumption_ends_the_benchmark(tmp_path):
    """SIGINT while the benchmark waits to resume a run whose learner it killed: it resumes nothing, runs no further
    seed and prints the table of what ran, instead of raising out of its wait."""
    stdout = tmp_path / "benchmark.out"
    with open(stdout, "w") as out:
        process = subprocess.Popen(
            [*BENCHMARK, "--prefix", "down", "--seeds", "1,2", "--minutes", "3", "--kill-learner-at-env-steps", "2000",
             "--downtime", "120", "--scores", "-21", "train.total_env_steps=1000000",
             "learner.checkpoint_every_updates=20", "eval.video=false", *ONE, *SOON],
            cwd=ROOT, env=_env(tmp_path), stdout=out, stderr=subprocess.PIPE, text=True, start_new_session=True)
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
def test_a_run_that_ends_at_its_own_stop_score_ends_kills_nothing_and_the_next_game_runs(tmp_path):
    """configs/pong_cpu.yaml ends a run at its first evaluation of 18 (eval.stop_score). Here only the run's own
    eval.stop_score, which every round reaches, is set, and no --stop-at: the run ends itself (its summary says so,
    and the benchmark stopped nothing), it ends with its time to the score, it is not taken for a crash (nothing
    resumed), and the next run, the next of --games, runs. Each run ends long before the learner's kill at 6 minutes
    and never reaches the collector's at 50,000 env steps: the benchmark says so for each, kills nothing and does
    not wait for the kill's time. Each run is recorded, and its final weights then play a whole game into its
    record (--whole-games). The games' table ends the output, with the whole games' scores. (A run that ended at its
    train.total_env_steps is not resumed either: test_the_learning_benchmark_kills_resumes_and_reports_time_to_a_score.)
    """
    store = tmp_path / "results"
    (store / "games").mkdir(parents=True)
    (store / "games/benchmark.yaml").write_text("title: Games\nabout: Games.\ncommand: python benchmarks/learning.py "
                                                "configs/smoke.yaml --games Pong,Breakout\ngames: [Pong, Breakout]\n")
    started = time.monotonic()
    result = subprocess.run(
        [*BENCHMARK, "--prefix", "own", "--games", "Pong,Breakout", "--minutes", "8", "--kill-learner-at", "6",
         "--kill-collector-at-env-steps", "50000", "--downtime", "2", "--scores", "-21", "--record", "games",
         "--results", str(store), "--whole-games", "1",
         "train.total_env_steps=1000000", "eval.stop_score=-21", "eval.video=false", *ONE, *SOON],
        cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert time.monotonic() - started < 6 * 60, out   # the first run's kill was not waited for
    played = {game: json.loads((store / f"games/own-{game}-s1/whole_games.json").read_text())
              for game in ("Pong", "Breakout")}
    for game, whole in played.items():
        assert whole["episodes"] == len(whole["scores"]) == 1 and whole["max_episode_frames"] == 108_000, whole
        assert f"own-{game}-s1: {whole['mean']:.2f} +- 0.00 over 1 episodes cut at 108,000 frames" in out, out
    assert -21 <= played["Pong"]["mean"] <= 21 and played["Breakout"]["mean"] >= 0, played
    assert "stopping the run" not in out, out
    assert "resuming it in" not in out and "run.resume=true" not in out and "Traceback" not in result.stderr, out
    assert len(re.findall(r"the run ended \S+ from launch: an evaluation reached its eval.stop_score", out)) == 2, out
    assert len(re.findall(r"the run ended \S+ from launch, before the learner's scheduled kill at 6m00s: the "
                          r"learner was not killed", out)) == 2, out
    assert len(re.findall(r"the run ended \S+ from launch, before the collector's scheduled kill at 50,000 env "
                          r"steps: the collector was not killed", out)) == 2, out
    assert "killed the" not in out, out
    for game in ("Pong", "Breakout"):
        run = tmp_path / f"own-{game}-s1"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["ended"] == "stop_score" and 0 < summary["env_steps"] < 1_000_000, summary
        assert yaml.safe_load((run / "config.yaml").read_text())["env"]["id"] == f"ALE/{game}-v5"
        _assert_evaluated(run)
    rows = [line for line in out.splitlines() if re.match(r"own-\S+ +\d+ ", line)]   # the table: each run's time to -21
    assert [row.split()[0] for row in rows] == ["own-Pong-s1", "own-Breakout-s1"] and "not reached" not in "".join(
        rows), out
    head, *games = out[out.index("\ngame ") + 1:].splitlines()
    assert head.rstrip().endswith("final weights in whole games (each seed)  their mean: at or above Rainbow"), out
    assert [row.split()[0] for row in games[:2]] == ["Pong", "Breakout"], out
    for row, (game, whole) in zip(games, played.items()):   # one seed: its score, then the mean against Rainbow's
        shown = f"{whole['mean']:.1f}"
        above = "yes" if whole["mean"] >= DOPAMINE_RAINBOW[game] else "no"
        assert row.split()[-3:] == [shown, shown, f"({above})"], row
    assert games[2] == ("Atari-5 estimate of the median human-normalised score over 57 games: not yet (no run of "
                        "BattleZone, DoubleDunk, NameThisGame, Phoenix, Qbert)"), out


@pytest.mark.parametrize("args, error", [
    (["--games", "Pong,Qbertt"], "--games: no Atari game 'Qbertt' (ALE/<Game>-v5 as gymnasium registers them, e.g. "
                                 "Pong, Breakout, Qbert, BattleZone)"),
    (["--games", "Pong", "env.id=ALE/Qbert-v5"], "--games sets env.id for each run; give the games there, not an "
                                                 "env.id= override"),
    (["--games", "Pong,Pong"], "--games names a game twice: Pong,Pong"),
    # Checked once for each game, with its env.id, before any seed launches: not refused by every launch in turn.
    (["--games", "Pong,Qbert", "--seeds", "1,2", "train.no_such_key=1"],
     "override train.no_such_key=1: train.no_such_key: unknown key; allowed: total_env_steps, learning_starts"),
    (["--seeds", "1,2,1"], "--seeds names a seed twice: 1,2,1"),
])
def test_games_that_cannot_run_are_refused_in_one_line_before_anything_runs(tmp_path, args, error):
    result = subprocess.run([*BENCHMARK, "--prefix", "bad", *args], cwd=ROOT, env=_env(tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"learning.py: error: {error}") and " (usage: learning.py " in result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, error", [
    (["run.name=x"], "override run.name=x: the benchmark names each run <prefix>-s<seed> (with --games, "
                     "<prefix>-<Game>-s<seed>); give --prefix instead"),
    (["--seeds", "1,2", "run.seed=5"], "override run.seed=5: the benchmark sets each run's run.seed from --seeds; give "
                                       "--seeds instead"),
    (["--record", "div/"], "--record: benchmark 'div/' is not a benchmark's name: give the name of its folder in "
                           "{results}, with no path or slash (did you mean div?)"),
    (["--record", "../results/div"], "--record: benchmark '../results/div' is not a benchmark's name"),
])
def test_what_the_benchmark_sets_itself_and_a_benchmark_given_as_a_path_are_refused_before_anything_runs(tmp_path, args,
                                                                                                       error):
    """A run.name or run.seed override would win over the benchmark's own, so that it read back folders no run wrote
    or labelled every seed's run with one seed; a --record with a path would fail only once the seeds had run.
    (--minutes keeps a run that starts anyway short.)"""
    store = tmp_path / "results"
    (store / "div").mkdir(parents=True)
    (store / "div/benchmark.yaml").write_text("title: D\nabout: D.\ncommand: python benchmarks/learning.py "
                                              "configs/smoke.yaml\n")
    result = subprocess.run([*BENCHMARK, "--prefix", "bad", "--minutes", "0.05", "--results", str(store), *args],
                            cwd=ROOT, env=_env(tmp_path / "runs"), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stdout + result.stderr
    assert result.stderr.startswith(f"learning.py: error: {error.format(results=store)}"), result.stderr
    assert result.stdout == "" and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_run_stopped_at_the_benchmarks_stop_at_is_told_from_one_that_ended_itself(tmp_path):
    """--stop-at without eval.stop_score: the benchmark stops the run (SIGINT, so the run's summary says it ended on
    a signal) and says so, and nothing says the run ended itself."""
    result = subprocess.run(
        [*BENCHMARK, "--prefix", "cut", "--minutes", "3", "--stop-at", "-21", "--scores", "-21",
         "train.total_env_steps=1000000", "eval.video=false", *ONE],
        cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=400)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "reached -21: stopping the run" in out and "the run ended" not in out and "resuming it in" not in out, out
    summary = json.loads((tmp_path / "cut-s1/summary.json").read_text())
    assert summary["ended"] == "signal" and 0 < summary["env_steps"] < 1_000_000, summary
    _assert_evaluated(tmp_path / "cut-s1")


def test_a_run_whose_weights_diverge_before_the_benchmark_stops_it_has_failed_and_is_not_recorded(tmp_path):
    """Adam at a learning rate of 1e30 makes the weights NaN within two updates, and nothing checks them before the
    time limit (no publish after the first, no checkpoint, no evaluation): the run finds it as the benchmark stops
    it and exits 1 with its one line, and the benchmark counts that seed failed, not stopped, and records nothing."""
    store = tmp_path / "results"
    (store / "div").mkdir(parents=True)
    (store / "div/benchmark.yaml").write_text("title: D\nabout: D.\ncommand: python benchmarks/learning.py "
                                              "configs/smoke.yaml\n")
    result = subprocess.run(
        [*BENCHMARK, "--prefix", "div", "--minutes", "0.6", "--record", "div", "--results", str(store),
         "train.total_env_steps=1000000", "train.lr=1e30", "learner.publish_every_updates=1000000",
         "learner.checkpoint_every_updates=1000000", "eval.every_env_steps=0", "eval.video=false",
         "train.learning_starts=32", *ONE],
        cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr[-3000:]
    assert "the time limit: stopping the run" in out, out
    assert re.search(r"the run failed \(exit code \d+\) .*: \[learner\] error: training diverged: ", out), out
    assert json.loads((tmp_path / "div-s1/summary.json").read_text())["ended"] == "diverged"
    assert not (store / "div/div-s1").exists()
