"""The real launchers on real Atari with real RPC: the smoke run, two-node commands, and taking a run down."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_dqn.config import load_config, to_dict

ROOT = Path(__file__).resolve().parents[1]
TAGS = ["collector/episode_return", "collector/episode_length", "collector/env_steps_per_s", "learner/loss",
        "learner/q_mean", "learner/updates_per_s", "learner/replay_size", "transport/recv_mb_per_s",
        "weights/version", "weights/staleness", "learner/updates", "cluster/collectors_alive",
        "transport/rejected_chunks"]


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("RL_DQN_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("RL_DQN_PYTHON", sys.executable)   # the launchers use this interpreter, not .venv
    return tmp_path


def launch(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([str(ROOT / "launch" / script), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"{process.args} did not end within {timeout} s:\n{output[-3000:]}")
    return process.returncode, output


def processes_of(run_name: str) -> list[str]:
    result = subprocess.run(["pgrep", "-af", f"run.name={run_name}"], capture_output=True, text=True)
    return [line for line in result.stdout.splitlines() if "pgrep" not in line]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def scalars(run_dir: Path) -> dict[str, list[float]]:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_smoke_run_end_to_end(runs):
    code, output = finish(launch("local.sh", "configs/smoke.yaml", "run.name=smoke"), timeout=120)
    assert code == 0, output[-3000:]
    run_dir = runs / "smoke"
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
    # Evaluation every 1,000 env steps in its own process: raw scores of whole (time-limited) episodes.
    assert values.get("eval/episode_return") and values.get("eval/episode_return_vs_seconds")
    assert all(-21 <= r <= 21 for r in values["eval/episode_return"])
    assert summary["best_eval_return"] == max(values["eval/episode_return"])
    assert max(values["weights/version"]) > 0
    written = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert written == to_dict(load_config(ROOT / "configs/smoke.yaml", [
        "run.name=smoke", f"cluster.init_method={written['cluster']['init_method']}", "cluster.world_size=3",
        "cluster.interface=lo", "cluster.single_node=true"]))
    assert list((run_dir / "checkpoints").glob("checkpoint_*.pt"))
    assert not processes_of("smoke")


def test_two_node_commands(runs, monkeypatch):
    """The multi-node launchers on one machine: a learner node (tcp://) and a collector node of 2 collectors
    (env://, torchrun-style MASTER_ADDR and MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = ["cluster.world_size=3", "cluster.interface=lo"]
    learner = launch("learner.sh", "configs/smoke.yaml", "run.name=nodes",
                     f"cluster.init_method=tcp://127.0.0.1:{port}", *cluster)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    collectors = launch("collector.sh", "configs/smoke.yaml", "run.name=nodes", "cluster.init_method=env://",
                        *cluster, "cluster.rank=1")
    code, output = finish(learner, timeout=120)
    assert code == 0, output[-3000:]
    code, output = finish(collectors, timeout=30)
    assert code == 0, output[-3000:]
    summary = json.loads((runs / "nodes" / "summary.json").read_text())
    assert all(c["env_steps"] > 0 for c in summary["collectors"].values())


def test_a_collector_node_started_later_joins_a_running_learner(runs):
    """Collectors join whenever they come: a second collector node starts after the run has been training."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = [f"cluster.init_method=tcp://127.0.0.1:{port}", "cluster.world_size=3", "cluster.interface=lo",
               "collectors.count=1", "run.name=later", "train.total_env_steps=6000"]
    learner = launch("learner.sh", "configs/smoke.yaml", *cluster)
    first = launch("collector.sh", "configs/smoke.yaml", *cluster, "cluster.rank=1")
    wait_for(lambda: (runs / "later").exists() and scalars(runs / "later").get("learner/loss"), timeout=90,
             what="training with one collector")
    second = launch("collector.sh", "configs/smoke.yaml", *cluster, "cluster.rank=2")
    code, output = finish(learner, timeout=120)
    assert code == 0, output[-3000:]
    assert "[learner] collector1 joined (process 1 of its slot)" in output
    for node in (first, second):
        code, output = finish(node, timeout=30)
        assert code == 0, output[-3000:]
    summary = json.loads((runs / "later" / "summary.json").read_text())
    assert all(c["env_steps"] > 0 for c in summary["collectors"].values()), summary["collectors"]
    assert not processes_of("later")


def test_collector_node_without_a_gpu_joins_a_cuda_run_with_cpu_tensors(runs):
    """The collector side of a mixed cluster: a node with no GPU runs its collectors with transport.kind=cuda;
    they act on the CPU and send CPU tensors, with no device map. (The learner here is on the CPU, as this test
    must run where there is no GPU; over CUDA, a learner sends such collectors a CPU copy of its weights.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = [f"cluster.init_method=tcp://127.0.0.1:{port}", "cluster.world_size=3", "cluster.interface=lo",
               "run.name=mixed"]
    learner = launch("learner.sh", "configs/smoke.yaml", *cluster, "learner.device=cpu")
    collectors = launch("collector.sh", "configs/smoke.yaml", *cluster, "cluster.rank=1", "transport.kind=cuda",
                        "collectors.device=cpu")
    code, output = finish(learner, timeout=120)
    assert code == 0, output[-3000:]
    code, output = finish(collectors, timeout=30)
    assert code == 0, output[-3000:]
    assert "on cpu" in output
    summary = json.loads((runs / "mixed" / "summary.json").read_text())
    assert {c["chunk_device"] for c in summary["collectors"].values()} == {"cpu"}


@pytest.mark.cuda
def test_smoke_run_over_the_cuda_transport(runs):
    """transport.kind=cuda on one GPU shared by the learner and 2 collectors: chunks arrive on the learner's GPU,
    collectors act with CUDA weights of rising versions."""
    code, output = finish(launch("local.sh", "configs/smoke.yaml", "run.name=cuda", "transport.kind=cuda"),
                          timeout=180)
    assert code == 0, output[-3000:]
    summary = json.loads((runs / "cuda" / "summary.json").read_text())
    assert summary["updates"] == 2 * (summary["env_steps"] - 1000) // 32
    for name, c in summary["collectors"].items():
        assert c["chunk_device"] == "cuda:0", name
        assert c["last_weights_version"] > c["first_weights_version"]
    held = re.findall(r"\[(collector\d)\] stopped after .* weights version (\d+) on (\S+)", output)
    assert sorted(name for name, _, _ in held) == ["collector0", "collector1"]
    assert all(int(version) > 0 and device == "cuda:0" for _, version, device in held), held
    assert all(values for values in scalars(runs / "cuda").values())


LONG = ["train.total_env_steps=10000000", "metrics.interval_s=1"]


def test_sigterm_takes_the_run_down_and_keeps_what_was_learned(runs):
    process = launch("local.sh", "configs/smoke.yaml", "run.name=term", *LONG)
    wait_for(lambda: (runs / "term").exists() and len(scalars(runs / "term").get("learner/loss", [])) >= 2,
             timeout=90, what="training to start")
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code, output = finish(process, timeout=40)
    assert time.monotonic() - sent < 30
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert not processes_of("term")
    summary = json.loads((runs / "term" / "summary.json").read_text())
    checkpoints = sorted((runs / "term" / "checkpoints").glob("checkpoint_*.pt"))
    assert summary["updates"] > 0 and checkpoints[-1].name == f"checkpoint_{summary['updates']:09d}.pt"


def test_a_dead_collector_takes_the_run_down_and_is_named(runs):
    process = launch("local.sh", "configs/smoke.yaml", "run.name=dead", *LONG, "collectors.max_restarts=0")
    victim = wait_for(lambda: [line.split()[0] for line in processes_of("dead") if "--local-index=1" in line],
                      timeout=60, what="collector1 to start")
    wait_for(lambda: (runs / "dead" / "config.yaml").exists(), timeout=60, what="the learner to start")
    time.sleep(3)
    killed = time.monotonic()
    os.kill(int(victim[0]), signal.SIGKILL)
    code, output = finish(process, timeout=40)
    assert time.monotonic() - killed < 30
    assert code != 0
    assert "local: collector1 died (killed by SIGKILL)" in output
    assert not processes_of("dead")
    assert list((runs / "dead" / "checkpoints").glob("checkpoint_*.pt"))
