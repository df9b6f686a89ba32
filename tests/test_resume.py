"""Resuming a run that has ended: a no-op of one line that starts and writes nothing, unless the resuming config asks
for more (a larger train.total_env_steps, a higher or no eval.stop_score). How a run ended (summary.json "ended"),
and a node whose learner finished the run, which ends cleanly whatever a late collector does."""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from chain import chain_chunk, make_learner
from test_end_to_end import ROOT, finish, launch, processes_of

from rl_dqn import checkpoints
from rl_dqn.cli import finished_already
from rl_dqn.config import ConfigError, load_config
from rl_dqn.evaluate import EvalResult
from rl_dqn.supervisor import RoleSpec, supervise
from rl_dqn.transport import TransportError


def snapshot(folder: Path) -> dict[str, tuple[str | None, int]]:
    """Every file and folder under `folder` (itself included): a file's content hash, and each one's mtime."""
    return {str(path.relative_to(folder)): (hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None,
                                            path.stat().st_mtime_ns)
            for path in [folder, *sorted(folder.rglob("*"))]}


def environment(runs: Path) -> dict[str, str]:
    return dict(os.environ, RL_DQN_RUNS_DIR=str(runs), RL_DQN_PYTHON=sys.executable)


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def cfg_of(*overrides: str):
    return load_config(ROOT / "configs/smoke.yaml", ["run.name=r", *overrides])


# ----------------------------------------------------------------------------------------- the decision


def state(env_steps: int, stop_score_reached: dict | None = None, old: bool = False) -> dict:
    schedule = {"next_eval": 0, "best_eval": None, "elapsed_s": 1.0}
    if not old:   # checkpoints written before runs kept their stop-score ending have no such key
        schedule["stop_score_reached"] = stop_score_reached
    return {"counters": {"env_steps": env_steps, "updates": 1, "weights_version": 1}, "schedule": schedule}


def test_a_run_at_its_total_env_steps_has_nothing_to_do_unless_given_a_larger_one():
    line = finished_already(cfg_of("train.total_env_steps=12000"), state(12_288))
    assert line == ("run r already reached train.total_env_steps=12,000 at 12,288 env steps: nothing to do; to train "
                    "on, resume with a larger train.total_env_steps (e.g. train.total_env_steps=24000)")
    # The example always goes past where the run stands.
    assert "e.g. train.total_env_steps=24576)" in finished_already(cfg_of("train.total_env_steps=5000"), state(12_288))
    assert finished_already(cfg_of("train.total_env_steps=12289"), state(12_288)) is None
    assert finished_already(cfg_of("train.total_env_steps=12289"), state(12_288, old=True)) is None


def test_a_run_that_ended_at_its_stop_score_has_nothing_to_do_unless_the_score_rises_or_goes():
    stopped = {"eval": 19.7, "stop_score": 18.0, "env_steps": 603_112}
    total = "train.total_env_steps=3000000"
    line = finished_already(cfg_of(total, "eval.stop_score=18"), state(603_112, stopped))
    assert line == ("run r already ended at its eval.stop_score=18 (eval 19.70 at 603,112 env steps): nothing to do; "
                    "to train on, resume with eval.stop_score=null or a higher one (above 19.70)")
    # Any stop score the evaluation reached ends it too; one above its score, or none, trains on.
    assert finished_already(cfg_of(total, "eval.stop_score=19.7"), state(603_112, stopped)) == line
    assert finished_already(cfg_of(total, "eval.stop_score=20"), state(603_112, stopped)) is None
    assert finished_already(cfg_of(total, "eval.stop_score=null"), state(603_112, stopped)) is None
    # A checkpoint from before runs kept this, or of a run that did not stop at a score.
    assert finished_already(cfg_of(total, "eval.stop_score=18"), state(603_112, old=True)) is None
    assert finished_already(cfg_of(total, "eval.stop_score=18"), state(603_112)) is None
    # Both: the line asks for both.
    both = finished_already(cfg_of("train.total_env_steps=600000", "eval.stop_score=18"), state(603_112, stopped))
    assert both.endswith("resume with a larger train.total_env_steps (e.g. train.total_env_steps=1200000) and "
                         "eval.stop_score=null or a higher one (above 19.70)"), both


def test_a_checkpoint_written_after_a_stop_score_ending_holds_it_and_older_ones_still_load(tmp_path):
    learner = make_learner(tmp_path, "eval.stop_score=475")
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    learner._evaluated(EvalResult(180, 2.0, 0, [470.0, 490.0], None, 0.1, 0.1))
    assert learner.reached_stop_score
    path = learner.save_checkpoint()
    saved = checkpoints.load_state(path)
    assert saved["schedule"]["stop_score_reached"] == {"eval": 480.0, "stop_score": 475.0, "env_steps": 180}
    assert "ended at its eval.stop_score=475 (eval 480.00 at 180 env steps)" in finished_already(learner.cfg, saved)
    # Reading the state leaves the replay file unread: a checkpoint whose replay is gone still answers.
    (path.parent / saved["replay_file"]).unlink()
    assert checkpoints.load_state(path)["counters"]["env_steps"] == 180
    # A checkpoint without the key (written before it existed) resumes, and ends nothing by a score.
    learner.save_checkpoint()
    old = torch.load(path := checkpoints.newest(tmp_path), weights_only=True)
    del old["schedule"]["stop_score_reached"]
    torch.save(old, path)
    fresh = make_learner(tmp_path / "again", "eval.stop_score=475")
    fresh.restore(path)
    assert fresh.intake.env_steps == 180 and not fresh.reached_stop_score
    assert finished_already(fresh.cfg, checkpoints.load_state(path)) is None


def test_a_run_resumed_after_its_stop_score_ending_trains_on_and_saves_that_it_no_longer_ended(tmp_path):
    """The command line resumes such a run only with eval.stop_score=null or a higher one; the learner then takes
    the checkpoint's counters but not its ending, trains on, and what it saves no longer stops a later resume."""
    learner = make_learner(tmp_path / "won", "eval.stop_score=475")
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    learner._evaluated(EvalResult(180, 2.0, 0, [470.0, 490.0], None, 0.1, 0.1))
    ended = learner.save_checkpoint()
    assert checkpoints.load_state(ended)["schedule"]["stop_score_reached"] is not None
    fresh = make_learner(tmp_path / "on", "eval.stop_score=null")
    fresh.restore(ended)
    assert not fresh.reached_stop_score and fresh.intake.env_steps == 180
    fresh.step()
    saved = checkpoints.load_state(fresh.save_checkpoint())
    assert saved["schedule"]["stop_score_reached"] is None and saved["counters"]["updates"] == 1
    assert finished_already(cfg_of("train.total_env_steps=3000", "eval.stop_score=475"), saved) is None


@pytest.mark.parametrize("content, reason", [(b"not a checkpoint", ""),
                                             (b"", "the file is empty; move it aside to resume from the one before it")])
def test_a_checkpoint_that_cannot_be_read_is_one_line_and_exit_2(tmp_path, content, reason):
    folder = tmp_path / "broken" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "checkpoint_000000001.pt").write_bytes(content)
    result = subprocess.run([sys.executable, "-m", "rl_dqn", "local", "configs/cartpole.yaml", "run.name=broken",
                             "run.resume=true"], cwd=ROOT, capture_output=True, text=True,
                            env=environment(tmp_path))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"rl_dqn: config error: run.resume: cannot continue from {folder}/"
                                    f"checkpoint_000000001.pt: {reason}") and len(result.stderr.splitlines()) == 1, \
        result.stderr
    assert result.stdout == ""


def _a_run_with_a_checkpoint(runs: Path) -> tuple[Path, dict[str, tuple[str | None, int]]]:
    """runs/t as its first process leaves it (config.yaml, run.json, a checkpoint with its replay), and a snapshot
    of its record."""
    from rl_dqn.config import save_config
    learner = make_learner(runs / "t")
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    save_config(learner.config_as_run(), runs / "t" / "config.yaml")
    learner.report.write_run_info(["first"], resumed=False)
    learner.save_checkpoint()
    learner.report.close()
    record = {name: snapshot(runs / "t")[name] for name in ("config.yaml", "run.json")}
    return runs / "t", record


def test_a_resume_that_would_change_the_runs_networks_is_refused_before_anything_is_written(tmp_path):
    """A resumed run keeps the networks it trained and its game: a config that changes them (here the hidden
    layers) is one line naming each changed key, exit code 2, and the run's config.yaml and run.json stay as the
    first process wrote them."""
    run, record = _a_run_with_a_checkpoint(tmp_path)
    result = subprocess.run([sys.executable, "-m", "rl_dqn", "local", "configs/cartpole.yaml", "run.name=t",
                             "run.resume=true", "network.mlp_hidden=[64]", "env.id=Acrobot-v1"],
                            cwd=ROOT, capture_output=True, text=True, env=environment(tmp_path))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "env.id: CartPole-v1 in the run, Acrobot-v1 now; network.mlp_hidden: [256, 256] in the run, [64] now" \
        in result.stderr, result.stderr
    assert {name: snapshot(run)[name] for name in record} == record


def test_a_resume_whose_replay_file_is_broken_names_that_file_and_leaves_the_runs_record_be(tmp_path):
    """The checkpoint reads but the replay file beside it does not: the learner refuses to go on (exit code 2 for
    the node too), naming the replay file rather than the checkpoint, and nothing of the run is rewritten."""
    run, record = _a_run_with_a_checkpoint(tmp_path)
    replay = next((run / "checkpoints").glob("replay_*.pt"))
    replay.write_bytes(replay.read_bytes()[:1000])
    result = subprocess.run([sys.executable, "-m", "rl_dqn", "local", "configs/cartpole.yaml", "run.name=t",
                             "run.resume=true", "collectors.count=2", "env.envs_per_collector=2",
                             "train.replay_capacity=1200"],
                            cwd=ROOT, capture_output=True, text=True, env=environment(tmp_path), timeout=120)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"its replay file {replay.name}: " in result.stderr, result.stderr
    assert {name: snapshot(run)[name] for name in record} == record


def test_a_resume_whose_replay_does_not_fit_the_config_is_refused_before_any_role_starts(tmp_path):
    """The run's replay has 4 lanes (2 collectors x 2 envs) of 300 steps; one more collector would make 6 of 200.
    Refused in one line, exit code 2, that names the keys and the way on without the replay, before any role
    starts: nothing in the run folder changes, not even a new TensorBoard file."""
    run, _ = _a_run_with_a_checkpoint(tmp_path)
    before = snapshot(run)
    result = subprocess.run([sys.executable, "-m", "rl_dqn", "local", "configs/cartpole.yaml", "run.name=t",
                             "run.resume=true", "collectors.count=3", "env.envs_per_collector=2",
                             "train.replay_capacity=1200"],
                            cwd=ROOT, capture_output=True, text=True, env=environment(tmp_path), timeout=120)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stdout + result.stderr
    replay = next((run / "checkpoints").glob("replay_*.pt")).name
    assert f"its replay file {replay}: it holds 4 lanes of 300 steps, where this config's replay has 6 of 200" \
        in result.stderr and f"move {replay} aside to resume with an empty replay" in result.stderr, result.stderr
    assert "[learner]" not in result.stdout + result.stderr
    assert snapshot(run) == before


@pytest.mark.parametrize("saved, reason", [([1, 2], "it holds a list, not an rl_dqn checkpoint"),
                                           ({"a": 1}, "not a learner checkpoint (it has no network, target, "),
                                           ("cut", "the file is cut short"),
                                           ("elsewhere", "its replay_file is '../../x.pt', not the name of a file ")])
def test_a_checkpoint_that_reads_but_is_no_learners_is_one_line_and_exit_2(tmp_path, saved, reason):
    run, _ = _a_run_with_a_checkpoint(tmp_path)
    newest = checkpoints.newest(run)
    if saved == "cut":
        newest.write_bytes(newest.read_bytes()[:5000])
    elif saved == "elsewhere":
        torch.save(torch.load(newest, weights_only=True) | {"replay_file": "../../x.pt"}, newest)
    else:
        torch.save(saved, newest)
    result = subprocess.run([sys.executable, "-m", "rl_dqn", "local", "configs/cartpole.yaml", "run.name=t",
                             "run.resume=true"], cwd=ROOT, capture_output=True, text=True, env=environment(tmp_path),
                            timeout=120)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stdout + result.stderr
    assert result.stderr.startswith(f"rl_dqn: config error: run.resume: cannot continue from {newest}: {reason}"), \
        result.stderr


def test_a_replay_moved_aside_resumes_the_networks_and_counters_with_an_empty_replay(tmp_path, capsys):
    learner = make_learner(tmp_path)
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    path = learner.save_checkpoint()
    learner.report.close()
    (path.parent / checkpoints.load_state(path)["replay_file"]).unlink()
    fresh = make_learner(tmp_path)
    fresh.restore(path)
    fresh.report.close()
    assert fresh.intake.env_steps == learner.intake.env_steps > 0 and len(fresh.trainer.replay) == 0
    assert "is gone: the replay starts empty" in capsys.readouterr().out


def test_a_resume_with_an_unreadable_run_json_keeps_it_aside_and_begins_a_new_one(tmp_path):
    learner = make_learner(tmp_path / "t")
    (tmp_path / "t" / "run.json").write_text('{"broken')
    learner.report.write_run_info(["again"], resumed=True)
    learner.report.close()
    assert (tmp_path / "t" / "run.json.unreadable").read_text() == '{"broken'
    info = json.loads((tmp_path / "t" / "run.json").read_text())
    assert info["command"] == ["again"] and info["resumed"] == []


# -------------------------------------------------------------------------------- how a learner ended


class NoCollectors:
    """A learner's endpoint that no collector joins."""

    def __init__(self):
        self.alive, self.lost, self.changes = set(), {}, queue.SimpleQueue()

    def receive(self, timeout: float) -> list:
        time.sleep(timeout)
        return []

    def publish(self, weights, env_steps: int | None = None) -> int:
        return 0

    def watch(self) -> None:
        pass

    def stop_collectors(self, timeout: float) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("ended", ["total_env_steps", "stop_score", "signal", "error"])
def test_the_summary_says_how_the_run_ended(tmp_path, ended):
    learner = make_learner(tmp_path, "eval.every_env_steps=0", "cluster.join_timeout_s=0.2",
                           "train.total_env_steps=180" if ended == "total_env_steps" else "train.total_env_steps=1000")
    for seq in range(3):
        learner.intake.ingest(chain_chunk(0, seq, episodes=10))   # 180 env steps
    if ended == "stop_score":
        learner._evaluated(EvalResult(180, 2.0, 0, [480.0], None, 0.1, 0.1))
    elif ended == "signal":
        learner.stop.set()
    if ended == "error":
        with pytest.raises(TransportError, match="no collector has been in the run"):
            learner.run(NoCollectors())
    else:
        learner.run(NoCollectors())
    assert learner.ended == ended
    assert summary_of(tmp_path)["ended"] == ended
    if ended == "total_env_steps":   # it trained what the replay ratio asked for
        assert learner.trainer.updates == 16 * (180 - 64) // 32


# ------------------------------------------------------------------------------------------ the node


def role(label: str, code: str, *args: str, finishes_run: bool = False, restarts: int = 0) -> RoleSpec:
    return RoleSpec(label, [sys.executable, "-c", code, *args], finishes_run=finishes_run, restarts=restarts)


# The learner: it finishes once the collector is running (exit 0), with "second" once a second process of the
# collector is, or, with "wait", when asked to stop.
LEARNER = """
import os, pathlib, signal, sys, time
started, pid_file = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
pid_file.write_text(str(os.getpid()))   # once it can be asked to stop
needed = {"finish": 1, "second": 2}.get(sys.argv[3])
while needed is None or not started.exists() or started.read_text().count("started") < needed:
    time.sleep(0.05)
print("[learner] done")
"""

# A collector that was joining as the run ended: once the learner has finished (its process is gone) or it is
# asked to stop, it exits 1 ("error"), or it hangs there ("hang", deaf to SIGTERM), or, with "die", exits 1 as soon as
# the learner can be asked to stop (it has written its pid file).
# With "die-once", its first process is killed (SIGKILL) as it starts, and the next one runs until asked to stop;
# with "die-as-node-stops", it is killed (SIGKILL) just as the node is asked to stop (SIGTERM).
COLLECTOR = """
import os, pathlib, signal, sys, time
started, pid_file, how = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
def give_up(*_):
    print("[collector0] error: stopped while joining the run", flush=True)
    sys.exit(1)
signal.signal(signal.SIGTERM, {"hang": signal.SIG_IGN, "die-once": lambda *_: sys.exit(0)}.get(how, give_up))
with open(started, "a") as f:
    f.write("started\\n")
if how == "die":
    for _ in range(600):
        if pid_file.exists():
            break
        time.sleep(0.05)
    print("[collector0] error: the learner refused collector0")
    sys.exit(1)
if how == "die-once" and started.read_text().count("started") == 1:
    os.kill(os.getpid(), signal.SIGKILL)
if how == "die-as-node-stops":
    while not pid_file.exists():
        time.sleep(0.05)
    os.kill(os.getppid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGKILL)
while not pid_file.exists():
    time.sleep(0.05)
pid = int(pid_file.read_text())
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(0.05)
if how in ("hang", "die-once"):
    while True:
        time.sleep(1)
give_up()
"""


def node(tmp_path, collector: str, learner: str = "finish", restarts: int = 3, grace_s: float = 20.0) -> int:
    files = [str(tmp_path / "started"), str(tmp_path / "learner.pid")]
    return supervise([role("learner", LEARNER, *files, learner, finishes_run=True),
                      role("collector0", COLLECTOR, *files, collector, restarts=restarts)],
                     node="local", grace_s=grace_s)


def test_a_collector_that_fails_after_the_learner_finished_does_not_fail_the_node(tmp_path, capsys):
    assert node(tmp_path, "error") == 0
    out, err = capsys.readouterr()
    assert "local: the run is complete; not stopped cleanly, which does not fail it: collector0 (exited with code " \
           "1: [collector0] error: stopped while joining the run)" in out, out + err
    # It was not started again, and nothing was said to be an error of the node.
    assert (tmp_path / "started").read_text() == "started\n"
    assert "died" not in err and "starting a new process" not in err, err


def test_a_collector_that_hangs_after_the_learner_finished_is_killed_and_the_node_ends_cleanly(tmp_path, capsys):
    assert node(tmp_path, "hang", grace_s=1.0) == 0
    out, err = capsys.readouterr()
    # Killed once its grace of 1 s is up (the node's poll can wake late on a loaded machine: the seconds may be 2).
    assert re.search(r"local: the run is complete; not stopped cleanly, which does not fail it: collector0 \(killed "
                     r"by SIGKILL, still running [12] s after the run ended\)", out), out + err
    assert (tmp_path / "started").read_text() == "started\n"


def test_a_collector_that_dies_while_the_run_goes_on_is_started_again_in_its_slot(tmp_path, capsys, monkeypatch):
    """The node's side of a collector killed in a run (tests/test_faults.py kills one in a real run): a new process
    takes its slot, and the run goes on and ends cleanly."""
    monkeypatch.setattr("rl_dqn.supervisor.RESTART_DELAY_S", 0.1)
    assert node(tmp_path, "die-once", learner="second") == 0
    out, err = capsys.readouterr()
    assert "local: collector0 died (killed by SIGKILL); starting a new process (restart 1 of 3)" in err, err
    assert (tmp_path / "started").read_text() == "started\nstarted\n"
    assert "not stopped cleanly" not in out and "stopping the other roles" not in err, out + err


def test_a_collector_that_dies_as_the_node_is_asked_to_stop_is_not_started_again_nor_a_failure(tmp_path, capsys):
    """A collector killed (SIGKILL) at the moment the node gets SIGTERM, both seen in one pass of the node: it would
    have been started again, so its death is no failure of the node, which stops as asked (128 + SIGTERM)."""
    assert node(tmp_path, "die-as-node-stops", learner="wait") == 128 + signal.SIGTERM
    _, err = capsys.readouterr()
    assert "local: SIGTERM: stopping every role" in err, err
    assert "stopping the other roles" not in err and "starting a new process" not in err, err
    assert (tmp_path / "started").read_text() == "started\n"


def test_a_collector_that_dies_before_the_run_ends_still_fails_the_node(tmp_path, capsys):
    assert node(tmp_path, "die", learner="wait", restarts=0) == 1
    _, err = capsys.readouterr()
    assert "local: collector0 died (exited with code 1: [collector0] error: the learner refused collector0); " \
           "stopping the other roles" in err, err


def test_a_resume_knows_the_best_score_of_a_round_scored_after_its_checkpoint(tmp_path):
    """best.pt, written after the newest checkpoint, holds a better network than the checkpoint knows of: a round
    after the resume that scores less does not replace it, and the run's closing lines name its score."""
    learner = make_learner(tmp_path)
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    learner.step()
    path = learner.save_checkpoint()   # its schedule knows of no evaluation
    checkpoints.save_best(tmp_path, {"network": learner.trainer.network.state_dict(),
                                     "eval": {"mean": 5.0, "std": 0.0, "episodes": 2, "env_steps": 60,
                                              "weights_version": 0}})
    learner.close()
    resumed = make_learner(tmp_path, "run.resume=true")
    resumed.restore(path)
    assert resumed.report.best_eval == 5.0
    mean, _, best = resumed.report.evaluated(120, 10.0, 1, [1.0, 3.0], None, 1.0, 1.0)
    assert mean == 2.0 and not best
    assert any("best evaluated network" in line and "(score 5.00; " in line
               for line in resumed.closing_lines("done"))
    resumed.close()


def test_a_replay_that_cannot_be_written_leaves_the_checkpoint_written_without_it_and_no_partial_file(
        tmp_path, monkeypatch, capsys):
    """A full disk while the replay (gigabytes) is written: the learned weights are still saved, and the replay's
    partial file does not keep the space."""
    import errno
    writing = checkpoints._Writing

    class FullDisk(writing):   # as a disk fills: the file begins, then part of a write goes in and it fails
        def write(self, data):
            if Path(self.f.name).name.startswith("replay_") and self.written:
                self.f.write(memoryview(data).cast("B")[:len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)
    monkeypatch.setattr(checkpoints, "_Writing", FullDisk)
    learner = make_learner(tmp_path)
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    learner.step()
    path = learner.save_checkpoint()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [path.name]
    assert "replay_file" not in checkpoints.load_state(path) and checkpoints.load_state(path)["counters"]["updates"]
    assert "[learner] warning: the replay could not be saved (No space left on device: " in capsys.readouterr().out
    learner.close()


def test_a_checkpoint_the_disk_cannot_take_is_said_and_training_goes_on_with_no_file_left_to_take_space(
        tmp_path, monkeypatch, capsys):
    """A full disk at a checkpoint: the learner trains on (it tries again a period later) rather than dying with a
    traceback; the replay written just before, which no checkpoint names, is removed, as is a partial file that a
    killed process left. The last checkpoint failing too is left for the learner's exit to say."""
    import errno
    writing, full = checkpoints._Writing, [True]

    class FullDisk(writing):   # as a disk fills: the file begins, then part of a write goes in and it fails
        def write(self, data):
            if full[0] and Path(self.f.name).name.startswith("checkpoint_") and self.written:
                self.f.write(memoryview(data).cast("B")[:len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)
    monkeypatch.setattr(checkpoints, "_Writing", FullDisk)
    learner = make_learner(tmp_path, "learner.checkpoint_every_updates=1")
    learner.intake.ingest(chain_chunk(0, 0, episodes=30))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints/replay_000000007.pt.partial").write_bytes(b"PK")   # a SIGKILL while it was written
    learner._train_one()
    assert list((tmp_path / "checkpoints").iterdir()) == []
    assert (f"[learner] warning: checkpoint 1 could not be written (No space left on device: "
            f"{tmp_path / 'checkpoints/checkpoint_000000001.pt'}); the newest on disk is none; training goes on, and "
            f"the next checkpoint is tried 1 updates later") in capsys.readouterr().out
    full[0] = False
    learner._train_one()
    assert learner.unsaved is None and learner.trainer.updates == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_000000002.pt",
                                                                            "replay_000000002.pt"]
    full[0] = True
    learner.ended = "total_env_steps"
    learner.close()
    assert learner.unsaved.startswith("No space left on device: ")
    assert "the newest on disk is checkpoint_000000002.pt; what the run learned after it is not saved" in \
        capsys.readouterr().out
    assert json.loads((tmp_path / "summary.json").read_text())["updates"] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_000000002.pt",
                                                                            "replay_000000002.pt"]


def test_ctrl_c_partway_through_a_checkpoint_file_is_a_keyboardinterrupt_and_leaves_the_older_file(tmp_path,
                                                                                                  monkeypatch):
    """Ctrl-C while a file is written cuts torch's zip writer short, which then raises its own RuntimeError over the
    interrupt: the caller gets the KeyboardInterrupt, and the file written before stays whole."""
    writing, cut = checkpoints._Writing, [False]

    class CtrlC(writing):
        def write(self, data):
            if cut[0] and self.written:
                raise KeyboardInterrupt
            return super().write(data)
    monkeypatch.setattr(checkpoints, "_Writing", CtrlC)
    path = tmp_path / "state.pt"
    checkpoints.save_atomically({"weights": torch.zeros(1000)}, path)
    cut[0] = True
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save_atomically({"weights": torch.ones(1000)}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]
    assert torch.equal(checkpoints.read(path)["weights"], torch.zeros(1000))


def test_a_best_network_the_disk_cannot_take_is_said_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """A full disk when a round scores best: the run goes on, and a later round that scores better than what best.pt
    holds (though not better than the round that could not be saved) is saved once there is space."""
    import errno
    writing = checkpoints._Writing

    class FullDisk(writing):
        def write(self, data):
            if full[0] and Path(self.f.name).name.startswith(checkpoints.BEST) and self.written:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)
    full = [False]
    monkeypatch.setattr(checkpoints, "_Writing", FullDisk)
    learner = make_learner(tmp_path)
    learner.eval_state = learner.trainer.evaluated_weights()
    for mean, disk_full in ((5.0, False), (10.0, True), (8.0, False)):
        full[0] = disk_full
        learner._evaluated(EvalResult(60, 10.0, 0, [mean], None, 1.0, 1.0))
        if disk_full:
            assert (f"[learner] warning: the network that scored 10.00 could not be saved as best.pt (No space left "
                    f"on device: {tmp_path / 'checkpoints/best.pt'}); training goes on") in capsys.readouterr().out
            assert checkpoints.best_score(tmp_path) == 5.0 and learner.report.best_eval == 5.0
    assert checkpoints.best_score(tmp_path) == 8.0
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [checkpoints.BEST]
    learner.close()


def test_a_role_that_ends_while_the_node_prints_its_line_is_seen_to_before_the_node_ends(capsys):
    """The node's only role exits after the pass's poll read its exit codes, while the node prints its line: the
    next pass handles that exit (here: a refusal of its input, exit 2, the node's), rather than the node ending
    without having seen it."""
    class WaitingLine:
        def line(self, roles):
            for role in roles:
                if role.process.returncode is None:   # until it has exited, left for its Popen to collect
                    os.waitid(os.P_PID, role.process.pid, os.WEXITED | os.WNOWAIT)
            return None
    refused = RoleSpec("collector0", [sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(2)"],
                       finishes_run=False, restarts=2)
    assert supervise([refused], node="node", progress=WaitingLine()) == 2
    assert capsys.readouterr().err.endswith("node: collector0 died (exited with code 2); stopping the other roles\n")


def test_a_collector_nodes_line_speaks_of_silence_only_of_collectors_that_reported_before():
    from types import SimpleNamespace

    from rl_dqn.supervisor import NodeProgress

    def collector(reported_at, running=True):
        return SimpleNamespace(progress=None if reported_at is None else (reported_at, report),
                               process=SimpleNamespace(poll=lambda: None if running else 0))

    def line(roles):
        lines._last = -math.inf   # its interval is up
        return lines.line(roles)
    lines = NodeProgress("node", total_env_steps=8_000, interval_s=5.0)
    report = {"rate": 500.0, "run_env_steps": 4_000, "run_rate": 1_000.0, "weights_version": 3}
    assert line([collector(None), collector(None)]) is None                                  # starting
    assert line([collector(time.monotonic()), collector(None)]).startswith("node: run env steps 4,000/8,000 ")
    assert line([collector(time.monotonic() - 11), collector(None)]) == \
        "node: no collector has reported in the last 10 s"                                    # gone quiet
    assert line([collector(time.monotonic(), running=False)]) is None                        # done


@pytest.mark.parametrize("code, restarted", [(1, True), (2, False)])
def test_a_collector_node_of_one_collector_restarts_it_unless_its_input_was_refused(code, restarted, capsys,
                                                                                   monkeypatch):
    """The node's only role ends between two of its polls: it is started again as on a node of several, and a
    refusal of its input (exit 2, which a new process would meet again) is the node's exit code."""
    monkeypatch.setattr("rl_dqn.supervisor.RESTART_DELAY_S", 0.1)
    dies = RoleSpec("collector0", [sys.executable, "-c", f"raise SystemExit({code})"], finishes_run=False, restarts=2)
    assert supervise([dies], node="node") == code
    err = capsys.readouterr().err
    assert err.count("starting a new process") == (2 if restarted else 0), err
    assert err.endswith(f"node: collector0 died (exited with code {code}); stopping the other roles\n"), err


# A learner that, asked to stop, writes a checkpoint for argv[2] seconds, saying so as the file grows as the real
# one does (rl_dqn.cli), then writes argv[1] and hangs. Its pid file (argv[3]) says it can be asked to stop.
SAVING_LEARNER = """
import json, os, pathlib, signal, sys, time
from rl_dqn.console import PROGRESS_MARK
from rl_dqn.supervisor import SAVING
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
pathlib.Path(sys.argv[3]).write_text(str(os.getpid()))
while not stopping:
    time.sleep(0.05)
while time.monotonic() - stopping[0] < float(sys.argv[2]):
    print(f"[learner] {PROGRESS_MARK} {json.dumps({SAVING: 1})}", flush=True)
    time.sleep(0.2)
pathlib.Path(sys.argv[1]).write_text("saved")
time.sleep(60)
"""


def test_a_stopping_role_is_waited_for_while_its_checkpoint_grows_and_killed_once_it_goes_quiet(tmp_path, capsys):
    """A replay of gigabytes takes longer to write than the node's grace: the node waits while the learner says its
    checkpoint grows, and kills it grace_s after it last said so."""
    saved = tmp_path / "saved"
    started = time.monotonic()
    code = supervise([role("learner", SAVING_LEARNER, str(saved), "3", str(tmp_path / "pid"), finishes_run=True),
                      role("collector0", COLLECTOR, str(tmp_path / "started"), str(tmp_path / "pid"), "die")],
                     node="local", grace_s=1.0)
    took = time.monotonic() - started
    _, err = capsys.readouterr()
    assert code == 1 and saved.read_text() == "saved", err
    killed = [line for line in err.splitlines() if line.startswith("local: killing learner")]
    assert killed and 3.5 < took < 15, (took, err)
    assert "@progress" not in err


# A role as the real ones start under a node's checks (rl_dqn.cli._checks_passed): it writes "loaded" to argv[1]
# once its modules would be loaded, waits for the node's word, and writes what it got; then, as argv[2] says, it
# ends ("finish"), or, a collector, dies once by SIGKILL ("die-once") and ends in its second process, or, a learner,
# ends once the collector whose log is argv[3] has gone on twice ("after-restart").
GATED = """
import os, pathlib, signal, sys, time
from rl_dqn.cli import _checks_passed
log, how = pathlib.Path(sys.argv[1]), sys.argv[2]
with open(log, "a") as f:
    f.write("loaded\\n")
went = _checks_passed()
with open(log, "a") as f:
    f.write(f"went {went}\\n")
if how == "die-once" and log.read_text().count("loaded") == 1:
    os.kill(os.getpid(), signal.SIGKILL)
while how == "after-restart" and pathlib.Path(sys.argv[3]).read_text().count("went") < 2:
    time.sleep(0.05)
"""


def gated_node(tmp_path, checks, collector: str = "finish") -> int:
    learner = ["after-restart", str(tmp_path / "collector")] if collector == "die-once" else ["finish"]
    return supervise([role("learner", GATED, str(tmp_path / "learner"), *learner, finishes_run=True),
                      role("collector0", GATED, str(tmp_path / "collector"), collector, restarts=1)],
                     node="local", checks=checks)


def until(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_roles_load_their_modules_while_the_node_checks_the_run_and_go_on_once_it_passes(tmp_path,
                                                                                               monkeypatch):
    """Both roles were loaded before the checks ended, and neither went on before; a collector started again after
    they passed goes on at once."""
    monkeypatch.setattr("rl_dqn.supervisor.RESTART_DELAY_S", 0.1)
    learner, collector = tmp_path / "learner", tmp_path / "collector"

    def checks() -> bool:
        assert until(lambda: all(log.exists() and "loaded" in log.read_text() for log in (learner, collector))), \
            "the roles did not start during the checks"
        assert learner.read_text() == collector.read_text() == "loaded\n"
        return True

    assert gated_node(tmp_path, checks, collector="die-once") == 0
    assert learner.read_text() == "loaded\nwent True\n"
    assert collector.read_text() == "loaded\nwent True\nloaded\nwent True\n"


@pytest.mark.parametrize("outcome", ["nothing to do", "bad input", "ctrl-c"])
def test_checks_that_fail_take_the_roles_down_before_they_do_anything(tmp_path, outcome):
    learner = tmp_path / "learner"
    raised = {"bad input": ConfigError("env.id", "no such game"), "ctrl-c": KeyboardInterrupt()}.get(outcome)

    def checks() -> bool:
        assert until(lambda: learner.exists() and "loaded" in learner.read_text())
        if raised is not None:
            raise raised
        return False

    if raised is not None:
        with pytest.raises(type(raised)):
            gated_node(tmp_path, checks)
    else:
        assert gated_node(tmp_path, checks) == 0
    for log in (learner, tmp_path / "collector"):   # each was let go with False, or killed before it asked
        assert not log.exists() or log.read_text() in ("", "loaded\n", "loaded\nwent False\n"), log.read_text()


# ------------------------------------------------------------------------------------ real runs


@pytest.mark.slow
def test_a_run_ended_at_its_stop_score_resumes_only_with_none_or_a_higher_one(tmp_path):
    """Any Pong score reaches -30: the run ends at its first evaluation, long before its total, and its newest
    checkpoint says so; resumed with that stop score, it does nothing. (Resumed with none, it trains on:
    test_a_run_resumed_after_its_stop_score_ending_trains_on_and_saves_that_it_no_longer_ended, in memory, and a
    resumed run's counters, replay and curves go on: test_faults.py's test_learner_death_then_resume_continues_the_run
    and test_learning_benchmark.py's test_the_learning_benchmark_kills_resumes_and_reports_time_to_a_score.)"""
    runs, env = tmp_path, environment(tmp_path)
    stop = ["run.name=won", "eval.stop_score=-30", "eval.video=false", "eval.every_env_steps=250",
            "train.total_env_steps=100000", "collectors.count=1"]
    code, output = finish(launch("local.sh", "configs/smoke.yaml", *stop, env=env), timeout=300)
    assert code == 0, output[-3000:]
    summary = summary_of(runs / "won")
    assert summary["ended"] == "stop_score", summary
    stopped = checkpoints.load_state(checkpoints.newest(runs / "won"))["schedule"]["stop_score_reached"]
    assert stopped["stop_score"] == -30 and stopped["eval"] >= -21 and stopped["env_steps"] >= 250, stopped

    before = snapshot(runs)
    code, output = finish(launch("local.sh", "configs/smoke.yaml", *stop, "run.resume=true", env=env), timeout=120)
    assert code == 0, output
    assert output.splitlines() == [
        f"[local] run won already ended at its eval.stop_score=-30 (eval {stopped['eval']:.2f} at "
        f"{stopped['env_steps']:,} env steps): nothing to do; to train on, resume with eval.stop_score=null or a "
        f"higher one (above {stopped['eval']:.2f})"], output
    assert snapshot(runs) == before and not processes_of("won")

    # The run's own config.yaml resumes it, on a free port rather than the one it names, which may be taken now.
    saved = yaml.safe_load((runs / "won" / "config.yaml").read_text())
    env_steps = checkpoints.load_state(checkpoints.newest(runs / "won"))["counters"]["env_steps"]
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # the run's own connections may linger there
        taken.bind(("127.0.0.1", int(saved["cluster"]["init_method"].rsplit(":", 1)[1])))
        taken.listen()
        code, output = finish(launch("local.sh", str(runs / "won" / "config.yaml"), "run.resume=true",
                                     "eval.stop_score=null", f"train.total_env_steps={env_steps + 500}",
                                     env=env), timeout=300)
    assert code == 0, output[-3000:]
    assert summary_of(runs / "won")["ended"] == "total_env_steps" and not processes_of("won"), output[-3000:]

