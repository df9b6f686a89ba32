"""The real launchers on real Atari with real RPC: torchrun and Slurm, two-node commands, and taking a run down (the
smoke run, launched once and read by several tests: test_smoke_run.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_dqn.supervisor import free_port

ROOT = Path(__file__).resolve().parents[1]
# Each test starts a real run (start-up alone is seconds of several processes on 2 cores): all are outside the fast
# inner loop, `-m "not slow"`, whose real-process test is the transport contract (test_transport.py).
pytestmark = pytest.mark.slow
TAGS = ["collector/episode_return", "collector/episode_length", "collector/env_steps_per_s", "learner/loss",
        "learner/q_mean", "learner/updates_per_s", "learner/replay_size", "transport/recv_mb_per_s",
        "weights/version", "weights/staleness", "learner/updates", "cluster/collectors_alive",
        "transport/rejected_chunks"]


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("RL_DQN_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("RL_DQN_PYTHON", sys.executable)   # the launchers use this interpreter, not .venv
    yield tmp_path
    # A failed test leaves nothing running to slow the tests after it (its runs have no end of their own, and each
    # is named after its folder, which only this test uses).
    for folder in tmp_path.iterdir():
        for line in processes_of(folder.name) if re.fullmatch(r"[\w.-]+", folder.name) else []:
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def launch(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([str(ROOT / "launch" / script), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def finish(process: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"{process.args} did not end within {timeout} s:\n{output[-3000:]}")
    return process.returncode, output


def processes_of(run_name: str) -> list[str]:
    """The processes (pid and command line) started for the run named exactly `run_name`: not `<run_name>2`, which
    may be another test's, running beside this one on another pytest-xdist worker. Run names are unique within the
    suite for that reason."""
    assert re.fullmatch(r"[\w.-]+", run_name), run_name
    pattern = "run.name=" + run_name.replace(".", "[.]") + "( |$)"
    result = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True)
    return [line for line in result.stdout.splitlines() if "pgrep" not in line]


def pid_of_role(run_name: str, role: str) -> int:
    """The process of the run that runs `role` (`python -m rl_dqn <role> ...`), e.g. its learner."""
    return int(wait_for(lambda: [line.split()[0] for line in processes_of(run_name) if f" rl_dqn {role} " in line],
                        timeout=60, what=f"the {role} of run {run_name} to start")[0])


def wait_for(condition, timeout: float, what: str):
    """The condition's first true value within `timeout` seconds. It is asked once more at the deadline, so that a
    machine that stalls (a busy neighbour, a paused VM) across the deadline does not fail a wait whose condition
    came true meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    if value := condition():
        return value
    pytest.fail(f"timed out waiting for {what}")


def wall_time(monotonic: float) -> float:
    """time.time() at a time.monotonic() reading: when a console line came, on TensorBoard's clock."""
    return time.time() - (time.monotonic() - monotonic)


def listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets these processes listen on (from `ss`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


def points(run_dir: Path) -> dict[str, list]:
    """Every scalar of the run's TensorBoard events: tag -> [ScalarEvent(wall_time, step, value), ...]."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}


def scalars(run_dir: Path) -> dict[str, list[float]]:
    return {tag: [e.value for e in found] for tag, found in points(run_dir).items()}


def summaries_of(run_dir: Path, plugin: str) -> list:
    """Every summary value of `plugin` (hparams, custom_scalars, ...) in the run's event files."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    found = []
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            found += [v for v in event.summary.value if v.metadata.plugin_data.plugin_name == plugin]
    return found


class Console:
    """Reads a launcher's output as it comes, so that a test can wait for a line: a run that lasts until the test
    has seen what it waits for is then ended by a signal, whatever the machine's speed."""

    def __init__(self, process: subprocess.Popen):
        self.process, self.lines = process, []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, text: str, timeout: float, after: float = 0.0) -> float:
        """When (time.monotonic()) the first line containing `text` printed after `after` came."""
        def seen():
            return next((t for t, line in list(self.lines) if text in line and t >= after), None)
        return wait_for(seen, timeout, f"a line with {text!r}; last lines:\n{self.text[-3000:]}")

    def wait_for_match(self, pattern: str, timeout: float) -> re.Match:
        """The first line that matches the regular expression `pattern`."""
        def seen():
            return next((m for _, line in list(self.lines) if (m := re.search(pattern, line))), None)
        return wait_for(seen, timeout, f"a line matching {pattern!r}; last lines:\n{self.text[-3000:]}")

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def finish(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail(f"{self.process.args} did not end within {timeout} s:\n{self.text[-3000:]}")
        self._reader.join(timeout=10)   # its last lines
        return code


# For tests that watch a run under way: one that goes on until the test has seen what it waits for, and ends it
# with a signal (a run of a fixed length could end first on a fast machine, or before a slow one shows anything).
# No evaluator, whose process and rounds would take the 2 cores' time from what these tests watch: the smoke run
# and test_sigterm_takes_the_run_down_and_keeps_what_was_learned run with one.
LONG = ["train.total_env_steps=10000000", "metrics.interval_s=1", "eval.every_env_steps=0"]


def rank_of(pid: int) -> int | None:
    """The RANK in a process's environment (torchrun sets it for each process it starts), or None."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(v.removeprefix(b"RANK=")) for v in environ if v.startswith(b"RANK=")), None)


def test_torchrun_starts_the_run_by_rank(runs):
    """`torchrun -m rl_dqn worker`: rank 0 is the learner, ranks 1 and 2 collectors, all through env:// with the
    variables torchrun sets and the rendezvous store torchrun's agent runs. Once both collectors' figures have
    reached the learner and it has trained, a SIGTERM to rank 0 ends the run: the learner stops its collectors and
    every process, and so torchrun, exits 0."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=3",
               "-m", "rl_dqn", "worker", "configs/smoke.yaml", "cluster.init_method=env://", "cluster.interface=lo",
               "run.name=torchrun", *LONG]
    console = Console(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")))
    # Without our launcher, collectors keep their progress lines to themselves but still send their figures (with
    # their chunks, from metrics.interval_s of acting on, which is also when the progress lines would come).
    # And an update: on a slow machine the figures can come before the replay holds train.learning_starts.
    figures = {"system/collector0/cpu_percent", "system/collector1/memory_mb"}

    def seen() -> bool:
        found = scalars(runs / "torchrun") if (runs / "torchrun").exists() else {}
        return figures <= set(found) and any(v > 0 for v in found.get("learner/updates", []))
    wait_for(seen, timeout=180, what=f"{figures} and an update in TensorBoard; last lines:\n{console.text[-3000:]}")
    learner = wait_for(lambda: next((pid for pid in (int(line.split()[0]) for line in processes_of("torchrun"))
                                     if rank_of(pid) == 0), None), timeout=30, what="the process of rank 0")
    os.kill(learner, signal.SIGTERM)
    assert console.finish(60) == 0, console.text[-3000:]
    assert "[learner] stopped on a signal after" in console.text, console.text[-3000:]
    assert "@progress" not in console.text
    summary = json.loads((runs / "torchrun" / "summary.json").read_text())
    assert summary["updates"] > 0
    assert all(c["env_steps"] > 0 for c in summary["collectors"].values()), summary["collectors"]
    assert not processes_of("torchrun")


def test_slurm_script_runs_a_two_node_job(runs, tmp_path):
    """launch/slurm.sbatch on a stand-in allocation: `srun` starts the script's node command once per node, side by
    side, here; `scontrol` names this host. The learner and a collector on node 0, a collector on node 1. Once each
    collector node has shown its own progress line, a SIGTERM to the learner ends the run, and with it the job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho localhost\n")
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env bash\n"
        "while [[ $1 == --* ]]; do shift; done\n"
        "pids=()\n"
        "for ((node = 0; node < SLURM_JOB_NUM_NODES; node++)); do SLURM_NODEID=$node \"$@\" & pids+=($!); done\n"
        "code=0; for pid in \"${pids[@]}\"; do wait $pid || code=$?; done; exit $code\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_NODELIST="node[1-2]",
               SLURM_JOB_NUM_NODES="2", SLURM_JOB_ID="42", SLURM_SUBMIT_DIR=str(ROOT), COLLECTORS_PER_NODE="1",
               INTERFACE="lo", TRANSPORT="cpu", MASTER_PORT=str(free_port()), RUN_NAME="slurm",
               DEVICE_MAP="1_0_0,2_0_0")
    console = Console(subprocess.Popen(["bash", str(ROOT / "launch" / "slurm.sbatch"), "configs/smoke.yaml", *LONG],
                                       cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env=env))
    # Each collector node's own progress line: the run's progress as the learner tells it, and its share (once its
    # collector has acted for metrics.interval_s and said so).
    for rank in (1, 2):
        console.wait_for_match(rf"\[collectors \(ranks {rank}\.\.{rank}\)\]: run env steps [\d,]+/10,000,000 "
                               r"\[[#-]{20}\] .* this node [\d,]+ steps/s \| collectors acting 1/1", timeout=180)
    # DEVICE_MAP goes to the learner alone: a collector refuses a map that names other collectors.
    roles = processes_of("slurm")
    assert [line for line in roles if " rl_dqn learner " in line and "transport.device_map=1_0_0,2_0_0" in line], roles
    assert not [line for line in roles if "device_map" in line and " rl_dqn learner " not in line], roles
    os.kill(pid_of_role("slurm", "learner"), signal.SIGTERM)
    assert console.finish(60) == 0, console.text[-3000:]
    summary = json.loads((runs / "slurm" / "summary.json").read_text())
    assert set(summary["collectors"]) == {"collector0", "collector1"}
    assert all(c["env_steps"] > 0 for c in summary["collectors"].values()), summary["collectors"]
    assert not processes_of("slurm")


def test_a_role_that_crashes_prints_where_each_of_its_threads_was(runs):
    """A fatal signal in a role (a crash in C++ code: TensorPipe, ale-py) prints every Python thread's stack before
    the process dies, so that the crash names the call it came from."""
    port = free_port()
    learner = Console(launch("learner.sh", "configs/smoke.yaml", f"cluster.init_method=tcp://127.0.0.1:{port}",
                             "cluster.world_size=2", "cluster.interface=lo", "collectors.count=1", "run.name=crash",
                             "learner.device=cpu", *LONG))
    learner.wait_for("waiting for 1 collectors", timeout=90)
    learner.process.send_signal(signal.SIGSEGV)   # learner.sh execs the learner: this is the learner
    assert learner.finish(30) == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in learner.text, learner.text[-3000:]
    assert re.search(r'File ".*rl_dqn/learner\.py", line \d+ in run', learner.text), learner.text[-3000:]


def test_collector_nodes_join_a_running_learner_whenever_they_come_and_leave_it_on_sigint(runs, monkeypatch):
    """The multi-node launchers on one machine: a learner node (tcp://) and two collector nodes of one collector
    each. The learner listens on its named interface only (loopback here). The first node joins by tcp://. The
    second starts after the run has been training, by env:// with torchrun's MASTER_ADDR and MASTER_PORT, and is
    the collector side of a mixed cluster: a node with no GPU runs its collectors with transport.kind=cuda; they act
    on the CPU and send CPU tensors, with no device map (its GPUs hidden where the machine has any). (The learner here
    is on the CPU, as this test must run where there is no GPU; over CUDA, a learner sends such collectors a CPU copy
    of its weights.) Once the second node's
    data has reached the learner, SIGINT ends the first node within 30 s, its collector leaves and the learner
    trains on; SIGINT to the learner then ends the run and the other node, with a checkpoint. (A two-node run that
    ends by itself at its total: test_faults.py's test_learner_death_then_resume_continues_the_run.)"""
    port = free_port()
    cluster = ["cluster.world_size=3", "cluster.interface=lo", "collectors.count=1", "run.name=nodes", *LONG]
    learner = Console(launch("learner.sh", "configs/smoke.yaml", f"cluster.init_method=tcp://127.0.0.1:{port}",
                             *cluster, "learner.device=cpu"))
    first = Console(launch("collector.sh", "configs/smoke.yaml", f"cluster.init_method=tcp://127.0.0.1:{port}",
                           *cluster, "cluster.rank=1"))
    wait_for(lambda: (runs / "nodes").exists() and scalars(runs / "nodes").get("learner/loss"), timeout=90,
             what=f"training with one collector; last lines:\n{learner.text[-3000:]}")
    # The learner's store (on the run's port) and TensorPipe's listener: loopback only, as cluster.interface says.
    addresses = listening({learner.process.pid})   # learner.sh execs the learner: this is the learner
    assert any(a.endswith(f":{port}") for a in addresses) and len(addresses) >= 2, addresses
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses
    # A node whose config puts its collector outside the run (a cluster.world_size the learner's is not): refused
    # in one line on each side, and not started again, since a new process would be refused the same way.
    outside = Console(launch("collector.sh", "configs/smoke.yaml", f"cluster.init_method=tcp://127.0.0.1:{port}",
                             *cluster, "cluster.world_size=4", "cluster.rank=3"))
    assert outside.finish(90) == 2, outside.text[-3000:]
    assert "the learner refused collector2: the run has collector slots 0..1" in outside.text, outside.text[-3000:]
    assert "restart" not in outside.text, outside.text[-3000:]
    learner.wait_for("[learner] refused a process asking to join as collector2: the run has collector slots 0..1 "
                     "(cluster.world_size - 1), not '2'", timeout=10)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")   # a node with no GPU, also on a machine that has one
    second = Console(launch("collector.sh", "configs/smoke.yaml", "cluster.init_method=env://", *cluster,
                            "cluster.rank=2", "transport.kind=cuda", "collectors.device=cpu"))
    learner.wait_for("[learner] collector1 joined (process 1 of its slot)", timeout=90)
    # Its figures travel with its chunks only, and the learner logs them once a chunk has entered replay.
    wait_for(lambda: scalars(runs / "nodes").get("system/collector1/cpu_percent"), timeout=90,
             what=f"collector1's chunks to enter replay; last lines:\n{learner.text[-3000:]}")
    sent = time.monotonic()
    first.process.send_signal(signal.SIGINT)
    assert first.finish(40) == 128 + signal.SIGINT and time.monotonic() - sent < 30, first.text[-3000:]
    left = learner.wait_for("[learner] collector0 left", timeout=60, after=sent)

    def trained_since_left() -> bool:
        """learner/updates, logged every interval, rose after collector0 left."""
        logged = [(e.wall_time, e.value) for e in points(runs / "nodes")["learner/updates"]]
        before = max((v for t, v in logged if t <= wall_time(left)), default=0.0)
        return any(v > before for t, v in logged if t > wall_time(left))
    wait_for(trained_since_left, timeout=60, what="the learner to train on with the other collector")
    learner.process.send_signal(signal.SIGINT)
    assert learner.finish(40) == 0, learner.text[-3000:]
    assert second.finish(30) == 0, second.text[-3000:]
    # learner.sh runs the learner in its own process: its start-up is timed from that process's start.
    assert re.search(r"\[learner\] start-up from launch: process 0\.0 s, ", learner.text), learner.text[-3000:]
    # Collectors that left said so in one line each: TensorPipe's C++ warnings about their closed pipes are not
    # shown, by learner.sh as by the launchers that supervise their roles.
    assert "tensorpipe_agent.cpp" not in learner.text + first.text + second.text, learner.text[-3000:]
    assert "[collector1] acting in 4 x ALE/Pong-v5 on cpu" in second.text, second.text[-3000:]
    summary = json.loads((runs / "nodes" / "summary.json").read_text())
    assert summary["updates"] > 0 and all(c["env_steps"] > 0 for c in summary["collectors"].values()), summary
    assert set(summary["collectors"]) == {"collector0", "collector1"}
    assert summary["collectors"]["collector1"]["chunk_device"] == "cpu"
    assert list((runs / "nodes" / "checkpoints").glob("checkpoint_*.pt"))
    assert not processes_of("nodes")


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


def test_sigterm_takes_the_run_down_and_keeps_what_was_learned(runs):
    """SIGTERM takes a one-node run (learner, 2 collectors, evaluator) down within 30 s and keeps its checkpoint.
    Before that, what a run shows while it goes on, which the smoke run (it ends by itself) need not last long enough
    to show on a fast machine: progress lines with an ETA, and the system figures of every role; and every socket of
    the run listens on loopback only."""
    console = Console(launch("local.sh", "configs/smoke.yaml", "run.name=term", *LONG, "eval.every_env_steps=1000"))
    # Progress lines once a second, the env steps rising, with an ETA once data has come.
    line = r"\[learner\] env steps ([\d,]+)/10,000,000 \[[#-]{20}\] +\d+% ETA (\S+) \| [\d,]+ steps/s"
    console.wait_for_match(r"\[learner\] env steps [\d,]+/10,000,000 \[[#-]{20}\] +\d+% ETA \d", timeout=120)
    wait_for(lambda: (runs / "term").exists() and len(scalars(runs / "term").get("learner/loss", [])) >= 2,
             timeout=90, what="training to start")
    # System figures per role (a collector's come with its chunks once it has acted for metrics.interval_s).
    figures = {f"system/{role}/{figure}" for role in ("learner", "collector0", "collector1")
               for figure in ("cpu_percent", "memory_mb")}
    wait_for(lambda: figures <= set(scalars(runs / "term")), timeout=60, what=f"{figures} in TensorBoard")
    # Every process has joined (its figures came with its chunks), and so listens: the learner's store, and
    # TensorPipe's listeners in the learner and both collectors.
    pids = {int(line.split()[0]) for line in processes_of("term")}
    pids |= {int(p) for pid in list(pids) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                                  text=True).stdout.split()}
    addresses = listening(pids)
    assert len(addresses) >= 4, addresses
    assert all(a.rsplit(":", 1)[0] in ("127.0.0.1", "[::ffff:127.0.0.1]") for a in addresses), addresses
    sent = time.monotonic()
    console.process.send_signal(signal.SIGTERM)
    code = console.finish(40)
    assert time.monotonic() - sent < 30
    assert code == 128 + signal.SIGTERM, console.text[-3000:]
    assert not processes_of("term")
    progress = re.findall(line, console.text)
    assert len(progress) >= 3, console.text[-3000:]
    steps = [int(done.replace(",", "")) for done, _ in progress]
    assert steps == sorted(steps) and steps[-1] > steps[0], steps
    values = scalars(runs / "term")
    for tag in figures:
        assert all(v >= 0 for v in values[tag]) and max(values[tag]) > 0, (tag, values[tag])
    assert max(values["system/learner/memory_mb"]) > 100
    summary = json.loads((runs / "term" / "summary.json").read_text())
    checkpoints = sorted((runs / "term" / "checkpoints").glob("checkpoint_*.pt"))
    assert summary["updates"] > 0 and checkpoints[-1].name == f"checkpoint_{summary['updates']:09d}.pt"


def test_a_dead_collector_takes_the_run_down_and_is_named(runs):
    process = launch("local.sh", "configs/smoke.yaml", "run.name=dead", *LONG, "collectors.max_restarts=0",
                     "collectors.count=1")
    victim = wait_for(lambda: [line.split()[0] for line in processes_of("dead") if "--local-index=0" in line],
                      timeout=60, what="collector0 to start")
    wait_for(lambda: (runs / "dead").exists() and scalars(runs / "dead").get("collector/env_steps_per_s"),
             timeout=60, what="data to reach the learner")
    killed = time.monotonic()
    os.kill(int(victim[0]), signal.SIGKILL)
    code, output = finish(process, timeout=40)
    assert time.monotonic() - killed < 30
    assert code != 0
    assert "local: collector0 died (killed by SIGKILL)" in output
    assert not processes_of("dead")
    folder = runs / "dead" / "checkpoints"
    assert list(folder.glob("checkpoint_*.pt")), (sorted(p.name for p in folder.glob("*")), output[-20000:])


def test_a_run_whose_training_diverges_ends_with_one_line_and_keeps_no_diverged_weights(runs):
    """At a learning rate of 1e30 the weights are NaN after the second update: the node ends (exit 1) with the
    learner's one line, no traceback, and no checkpoint of the NaN weights."""
    code, output = finish(launch("local.sh", "configs/smoke.yaml", "run.name=diverged", "train.lr=1e30",
                                 "eval.every_env_steps=0"), timeout=120)
    assert code == 1, output[-5000:]
    errors = [line for line in output.splitlines() if line.startswith("[learner] error:")]
    assert len(errors) == 1 and "training diverged: the online network's weights are NaN or infinite after update" \
        in errors[0] and "no checkpoint was saved before" in errors[0], output[-5000:]
    assert "Traceback" not in output
    assert not list((runs / "diverged" / "checkpoints").glob("checkpoint_*.pt"))
    assert json.loads((runs / "diverged" / "summary.json").read_text())["ended"] == "diverged"
