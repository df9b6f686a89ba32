"""Faults with real processes, real Atari and real RPC: a collector killed or hung and replaced while the learner
trains on, a learner killed and its run resumed (all slow), and a multi-node learner that names no interface, or one
the node lacks, refused at start. (A collector node stopped by SIGINT, and the sockets a run listens on:
tests/test_end_to_end.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_end_to_end import (LONG, ROOT, Console, launch, points, processes_of, runs, scalars,  # noqa: F401 (runs)
                             wait_for, wall_time)

from rl_dqn.supervisor import free_port


def pid_of(run: str, index: int) -> int:
    return int(wait_for(lambda: [line.split()[0] for line in processes_of(run) if f"--local-index={index}" in line],
                        timeout=60, what=f"collector{index} to start")[0])


def wait_for_training(run_dir) -> None:
    wait_for(lambda: len(scalars(run_dir).get("learner/loss", [])) >= 2, timeout=60, what="training")


def end_with_sigterm(console: Console, runs, run: str) -> dict:
    console.process.send_signal(signal.SIGTERM)
    assert console.finish(40) == 128 + signal.SIGTERM, console.text[-3000:]
    assert not processes_of(run)
    return json.loads((runs / run / "summary.json").read_text())


@pytest.mark.slow
def test_a_killed_collector_is_replaced_while_the_learner_trains_on(runs):
    # A linear epsilon schedule: the new process must take it up where the run stands, not from its start.
    console = Console(launch("local.sh", "configs/smoke.yaml", "run.name=kill", *LONG, "collectors.exploration=linear",
                             "collectors.epsilon_decay_env_steps=1000", "collectors.epsilon_end=0.05"))
    console.wait_for("[learner] collector1 joined (process 1 of its slot)", timeout=90)
    victim = pid_of("kill", 1)
    wait_for_training(runs / "kill")
    replay_before = scalars(runs / "kill")["learner/replay_size"][-1]
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    lost = console.wait_for("[learner] collector1 lost: ", timeout=60, after=killed)
    console.wait_for("collector1 died (killed by SIGKILL); starting a new process (restart 1 of 10)", timeout=60)
    rejoined = console.wait_for("[learner] collector1 joined (process 2 of its slot)", timeout=60, after=killed)
    # The new process says it acts as soon as its admission brings the weights; the learner says it joined when its
    # loop next reads the membership, which may come later: any line of collector1's after the kill is the new one's.
    acting = console.wait_for("[collector1] acting in", timeout=60, after=killed)
    line = next(line for t, line in console.lines if t == acting and "[collector1] acting in" in line)
    assert line.endswith("epsilon 0.05..0.05"), line
    # The run goes on until the new process's chunks have entered replay. They bring its system figures (once it
    # has acted for metrics.interval_s), which the learner logs for the slot every interval: figures logged after
    # the new process joined that were not logged before come from it. (The old process's last chunk entered
    # replay before it was lost; the new one joined a restart delay and a start-up later, and the learner logged
    # that chunk's figures in between.)
    def new_figures() -> set[tuple[float, float]]:
        found = points(runs / "kill")
        logged = [(cpu.wall_time, (cpu.value, memory.value)) for cpu, memory in
                  zip(found.get("system/collector1/cpu_percent", []), found.get("system/collector1/memory_mb", []))]
        joined = wall_time(rejoined)
        return {pair for t, pair in logged if t > joined} - {pair for t, pair in logged if t <= joined}
    wait_for(new_figures, timeout=90, what=f"the new collector1's chunks to enter replay; last lines:\n"
                                           f"{console.text[-3000:]}")
    summary = end_with_sigterm(console, runs, "kill")
    # The new process's chunks entered replay; nothing that arrived was lost.
    slot = summary["collectors"]["collector1"]
    assert slot["processes"] == 2 and slot["senders"] == 2, slot
    assert summary["dropped_chunks"] == 0 and summary["rejected_chunks"] == {}
    assert summary["replay_size"] >= replay_before
    # The learner trained on with the other collector while the slot had no process: its update count, logged every
    # second, rose between the loss and the new process's joining.
    logged = [(e.wall_time, e.value) for e in points(runs / "kill")["learner/updates"]]
    at_loss = max((v for t, v in logged if t <= wall_time(lost)), default=0.0)
    assert any(v > at_loss for t, v in logged if wall_time(lost) < t <= wall_time(rejoined)), (lost, rejoined, logged)
    values = scalars(runs / "kill")
    # One collector alive after the kill, two again once the new process joined (at the very end, as SIGTERM takes
    # the run down, the count may fall as collectors leave).
    alive = values["cluster/collectors_alive"]
    assert 1 in alive and 2 in alive[alive.index(1):], alive


@pytest.mark.slow
def test_a_hung_collector_is_dropped_and_replaced_when_it_wakes(runs):
    """SIGSTOP: the learner's ping times out (5 s quiet + transport.rpc_timeout_s); it trains on with the other
    collector. Woken up, the dropped process learns from its next answer that it is out, exits, and is replaced."""
    console = Console(launch("local.sh", "configs/smoke.yaml", "run.name=hang", *LONG, "transport.rpc_timeout_s=3"))
    console.wait_for("[learner] collector1 joined (process 1 of its slot)", timeout=90)
    victim = pid_of("hang", 1)
    wait_for_training(runs / "hang")
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    lost = console.wait_for("[learner] collector1 lost: no answer within transport.rpc_timeout_s", timeout=30)
    assert lost - stopped < 2 * (5 + 3)   # its quiet time and one ping's timeout, with room for a loaded machine

    def trained_since_lost() -> bool:
        """learner/updates, logged every interval, rose after the loss."""
        logged = [(e.wall_time, e.value) for e in points(runs / "hang")["learner/updates"]]
        before = max((v for t, v in logged if t <= wall_time(lost)), default=0.0)
        return any(v > before for t, v in logged if t > wall_time(lost))
    wait_for(trained_since_lost, timeout=60, what="the learner to train on with the other collector")
    os.kill(victim, signal.SIGCONT)
    console.wait_for("collector1 died", timeout=60, after=stopped)
    console.wait_for("[learner] collector1 joined (process 2 of its slot)", timeout=60, after=stopped)
    summary = end_with_sigterm(console, runs, "hang")
    assert summary["collectors"]["collector1"]["processes"] == 2
    assert summary["lost_collectors"] == {"collector1": "no answer within transport.rpc_timeout_s (hung, or too slow)"}


def two_nodes(run: str, *extra: str) -> tuple[list[str], int]:
    port = free_port()
    return [f"cluster.init_method=tcp://127.0.0.1:{port}", "cluster.world_size=3", "cluster.interface=lo",
            f"run.name={run}", *extra], port


def env_steps_of(checkpoint) -> int:
    """The run's env steps when the checkpoint was written."""
    return torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)["counters"]["env_steps"]


@pytest.mark.slow
def test_learner_death_then_resume_continues_the_run(runs):
    """kill -9 the learner of a two-node run (a learner node and a collector node, of one collector): its collector
    notices and exits cleanly within 30 s. Started again with run.resume=true, the learner continues from its last
    checkpoint: counters, replay and curves go on. (The run is killed long before its train.total_env_steps; the
    resumed part is given one a little beyond where the run had come, and ends there by itself: both nodes exit
    0.)"""
    cluster, _ = two_nodes("resume", "learner.checkpoint_every_updates=40", *LONG, "cluster.world_size=2",
                           "collectors.count=1")
    learner = Console(launch("learner.sh", "configs/smoke.yaml", *cluster))
    collectors = Console(launch("collector.sh", "configs/smoke.yaml", *cluster, "cluster.rank=1"))
    checkpoints = runs / "resume" / "checkpoints"

    def checkpoint_after_a_loss_point() -> bool:
        """Two checkpoints, the newer one later in the run than the loss curve's first point (so that the resumed
        run keeps a part of the curve)."""
        found = sorted(checkpoints.glob("checkpoint_*.pt"))
        losses = points(runs / "resume").get("learner/loss") if len(found) >= 2 else None
        try:
            return bool(losses) and env_steps_of(found[-1]) > losses[0].step
        except (OSError, RuntimeError):   # deleted as newer ones were written (learner.keep_checkpoints)
            return False
    wait_for(checkpoint_after_a_loss_point, timeout=120, what="two checkpoints")
    os.kill(learner.process.pid, signal.SIGKILL)    # learner.sh execs the learner: this is the learner
    killed = time.monotonic()
    assert collectors.finish(40) != 0
    assert time.monotonic() - killed < 30
    assert "learner unreachable" in collectors.text and "starting a new process" not in collectors.text
    assert "Traceback" not in collectors.text
    assert not processes_of("resume")
    saved = sorted(checkpoints.glob("checkpoint_*.pt"))[-1]
    saved_updates = int(saved.stem.split("_")[1])
    saved_env_steps = env_steps_of(saved)
    before = [(e.step, e.value) for e in points(runs / "resume")["learner/loss"]]
    total = max(saved_env_steps, *(step for step, _ in before)) + 1000   # past where the run had come

    learner = Console(launch("learner.sh", "configs/smoke.yaml", *cluster, "run.resume=true",
                             f"train.total_env_steps={total}"))
    collectors = Console(launch("collector.sh", "configs/smoke.yaml", *cluster, "cluster.rank=1",
                                f"train.total_env_steps={total}"))
    assert learner.finish(180) == 0, learner.text[-3000:]
    assert collectors.finish(30) == 0, collectors.text[-3000:]
    resumed = next(line for _, line in learner.lines if "resumed from" in line)
    assert saved.name in resumed and "replay 0 transitions" not in resumed and "holds no replay" not in resumed
    assert f"{saved_env_steps:,} env steps" in resumed, resumed
    summary = json.loads((runs / "resume" / "summary.json").read_text())
    # Counters went on from the checkpoint: the replay ratio holds over both parts of the run.
    assert summary["env_steps"] >= total
    assert summary["updates"] == 2 * (summary["env_steps"] - 1000) // 32 > saved_updates
    # Curves go on from the checkpoint: what was logged before it is kept (what the killed learner logged after it
    # is hidden), and the resumed part's points follow, up to past where the curve had stood.
    after = [(e.step, e.value) for e in points(runs / "resume")["learner/loss"]]
    kept = [p for p in before if p[0] < saved_env_steps]
    assert kept and after[:len(kept)] == kept, (saved_env_steps, before, after)
    assert all(step >= saved_env_steps for step, _ in after[len(kept):]) and after[-1][0] >= total, after
    assert not processes_of("resume")


@pytest.mark.slow   # a launcher's refusal; the same refusals are checked fast in test_config.py
def test_a_multi_node_learner_refuses_an_interface_the_node_lacks(runs):
    cluster, _ = two_nodes("iface", *LONG)
    cluster = [c if not c.startswith("cluster.interface") else "cluster.interface=nosuch0" for c in cluster]
    learner = Console(launch("learner.sh", "configs/smoke.yaml", *cluster))
    assert learner.finish(60) == 2
    assert "config error: cluster.interface: no IPv4 address on interface 'nosuch0'; this node has " in learner.text


@pytest.mark.slow   # a launcher's refusal; the same refusals are checked fast in test_config.py
def test_a_multi_node_run_must_name_its_interface():
    result = subprocess.run([str(ROOT / "launch" / "learner.sh"), "configs/smoke.yaml", "cluster.world_size=3",
                             "cluster.init_method=tcp://127.0.0.1:29500"], cwd=ROOT, capture_output=True, text=True,
                            env=dict(os.environ, RL_DQN_PYTHON=sys.executable))
    assert result.returncode == 2 and result.stderr.startswith("rl_dqn: config error: cluster.interface: must name")


def test_a_role_still_running_after_its_stop_signal_says_where_each_thread_stands():
    """A role that a stop signal does not end within STOPPING_STACKS_S prints every thread's stack (once), before
    its supervisor kills it; the signal itself still asks the role to stop."""
    code = ("import os, signal, sys, threading, time\n"
            "from rl_dqn import cli\n"
            "cli.STOPPING_STACKS_S = 0.5\n"
            "stop = cli._stop_on_signals()\n"
            "def stuck_somewhere(): time.sleep(30)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "print('stop asked', stop.wait(5), flush=True)\n"
            "threading.Thread(target=stuck_somewhere, daemon=True).start()\n"
            "time.sleep(2)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stop asked True"
    assert done.stderr.startswith("Timeout (0:00:00.500000)!"), done.stderr
    assert "in stuck_somewhere" in done.stderr and done.stderr.count("Timeout") == 1, done.stderr


def test_a_role_writing_a_checkpoint_tells_its_node_as_the_file_grows(capsys, monkeypatch):
    """The line its node's supervisor reads to wait for a stopping learner while its checkpoint grows (the node's
    side: tests/test_resume.py)."""
    import faulthandler
    import threading

    from rl_dqn import cli
    from rl_dqn.console import PROGRESS_ENV
    from rl_dqn.supervisor import SAVING, _progress_report
    monkeypatch.setenv(PROGRESS_ENV, "1")
    stop = threading.Event()
    stop.set()
    told = cli._saving_told("learner", stop)
    try:
        told(4096)
    finally:
        faulthandler.cancel_dump_traceback_later()
    line = capsys.readouterr().out.strip()
    assert line.startswith("[learner] @progress") and _progress_report(line) == {SAVING: 4096}, line
