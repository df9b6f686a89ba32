"""The process settings every role takes: malloc keeps freed memory instead of faulting it back in every update;
denormal floats are flushed to zero, in the role's threads and the threads it starts."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Page faults per update of configs/pong.yaml's learner on CPU (its chunks, from random frames), in a process of
# its own because the setting holds for the whole process. In bfloat16, as an explicit choice, whatever the CPU: each
# update's autocast copies of the weights and activations are megabytes that malloc's defaults hand back to the
# system and fault back in every update (in float32 nothing that large is freed per update, kept or not).
_FAULTS_PER_UPDATE = """
import resource, sys, tempfile, torch
from pathlib import Path
from envs import EnvSpec
from rl_dqn.config import load_config
from rl_dqn.learner import Learner
from rl_dqn.system import keep_freed_memory
from rl_dqn.types import Chunk
kept = sys.argv[1] == "kept" and keep_freed_memory()
torch.set_num_threads(2)
cfg = load_config("configs/pong.yaml", ["run.name=t", "train.replay_capacity=4096", "train.learning_starts=32",
                                        "learner.device=cpu", "network.precision=bf16"])
learner = Learner(cfg, EnvSpec((4, 84, 84), torch.uint8, 6), Path(tempfile.mkdtemp()))
T, E = cfg.collectors.chunk_steps, cfg.env.envs_per_collector
for seq in range(4):
    for collector in range(cfg.num_collectors):
        learner.intake.ingest(Chunk(collector, seq, 0, torch.randint(0, 255, (T, E, 84, 84), dtype=torch.uint8),
                             torch.randint(0, 6, (T, E)), torch.zeros(T, E), torch.zeros(T, E, dtype=torch.bool),
                             torch.zeros(T, E, dtype=torch.bool), torch.zeros(0, dtype=torch.float64),
                             torch.zeros(0, dtype=torch.int64)))
for _ in range(40):   # the first updates grow malloc's heaps: faults are counted once those have settled
    learner.step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    learner.step()
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
learner.report.close()
"""


def _faults_per_update(mode: str) -> tuple[bool, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", _FAULTS_PER_UPDATE, mode], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.slow   # two processes that train a Pong learner
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's malloc's")
def test_learner_updates_reuse_freed_memory_instead_of_faulting_it_back_in():
    _, default = _faults_per_update("default")
    if default < 100:   # before the second process, which could show nothing here
        pytest.skip(f"{default} page faults per update with malloc's defaults here: too few for the setting to show")
    kept, faults = _faults_per_update("kept")
    assert kept
    assert faults < default / 5, f"{faults} page faults per update kept, {default} with malloc's defaults"


# A denormal (below float32's smallest normal number, 1.2e-38) survives arithmetic by default and becomes zero once
# the process is configured, in the calling thread and in a thread started afterwards (the learner's helper).
_DENORMALS = """
import concurrent.futures, sys, torch
from rl_dqn.system import configure_process
def survives():
    return (torch.tensor([1e-39]) * 1.0).item() != 0.0
before = survives()
if sys.argv[1] == "configured":
    configure_process()
print(before, survives(), concurrent.futures.ThreadPoolExecutor(1).submit(survives).result())
"""


@pytest.mark.slow   # two fresh interpreters
def test_a_configured_process_and_its_later_threads_flush_denormals_to_zero():
    def run(mode: str) -> list[str]:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        return subprocess.run([sys.executable, "-c", _DENORMALS, mode], cwd=ROOT, env=env, capture_output=True,
                              text=True, check=True).stdout.split()
    assert run("default") == ["True", "True", "True"]
    assert run("configured") == ["True", "False", "False"]


def test_the_machine_of_a_result_says_its_cpus_family_and_model_where_proc_cpuinfo_has_them():
    from rl_dqn.system import machine
    info = machine()
    assert info["cores"] >= 1 and info["cpu"]
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "cpu family" not in cpuinfo:
        pytest.skip("no x86 family in /proc/cpuinfo")
    family, model = info["cpu_family"].split(".")
    assert any(line.split(":")[0].strip() == "cpu family" and line.split(":")[1].strip() == family
               for line in cpuinfo.splitlines()) and model.isdigit()
