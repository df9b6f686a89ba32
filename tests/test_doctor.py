"""./launch/doctor.sh: what this machine is to a config, exit 0 when it can run as written and 2 with one line per
problem when it cannot; the GPU acceptance run's report, from checks that run here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rl_dqn.console import proc_stat
from rl_dqn.doctor import Step, acceptance_run, main

ROOT = Path(__file__).resolve().parents[1]
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")


def doctor(*args: str, runs: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, RL_DQN_PYTHON=sys.executable, RL_DQN_RUNS_DIR=str(runs))
    return subprocess.run([str(ROOT / "launch/doctor.sh"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def doctor_here(tmp_path, monkeypatch, capsys):
    """The doctor command run in this process (its launcher is tested above; a fresh interpreter costs seconds),
    with its runs folder in tmp_path: (exit code, stdout, stderr)."""
    monkeypatch.setattr("rl_dqn.cli.RUNS_DIR", tmp_path)

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err
    return run


def test_the_quick_start_config_can_run_here_and_the_report_says_on_what(tmp_path):
    result = doctor(runs=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"torch {torch.__version__}" in out and "cores for this process" in out
    assert "AVX512-BF16" in out and "TensorPipe in this torch build: transports uv" in out
    from rl_dqn.network import resolve_precision
    learner = "cuda:0" if torch.cuda.is_available() else "cpu"   # learner.device and collectors.device: auto
    assert f"learner: {learner}, {resolve_precision('auto', learner)} (network.precision=auto" in out
    assert f"collector1: {learner[:4]}" in out
    assert "evaluator: cpu, 5 episodes on 5 envs then 15 episodes on 15 envs" in out
    assert "GB free under" in out and out.rstrip().endswith("configs/pong_cpu.yaml can run here as written")


@pytest.mark.parametrize("args, problem", [
    # The replay's memory, as the launchers refuse it, and the disk its checkpoints need: a line each.
    (["configs/pong_cpu.yaml", "train.replay_capacity=100000000000"],
     ["train.replay_capacity: 100,000,000,000 transitions of 7,082 bytes need ", "learner.checkpoint_replay: a full "
                                                                                 "replay checkpoint needs "]),
    (["configs/pong_cpu.yaml", "train.replay_capacity=1000000000", "learner.checkpoint_replay=false"],
     "train.replay_capacity: 1,000,000,000 transitions of 7,082 bytes need 6,595.6 GiB on "),
    (["configs/pong_cpu.yaml", "train.bach_size=3"], "train.bach_size: unknown key"),
    pytest.param(["configs/pong_cpu.yaml", "transport.kind=cuda"], "transport.kind: cuda needs a CUDA GPU",
                 marks=no_gpu),
    # What the launchers refuse before they start anything, the doctor refuses too.
    (["configs/cartpole.yaml", "eval.video=true"], "eval.video: videos are recorded from Atari games"),
    (["configs/cartpole.yaml", "run.name=taken"], "run.name: {runs}/taken already holds a run"),
    (["configs/cartpole.yaml", "run.name=nothing", "run.resume=true"], "run.resume: {runs}/nothing holds no checkpoint"),
    (["configs/cartpole.yaml", "run.name=broken", "run.resume=true"], "run.resume: cannot continue from "),
])
def test_a_config_that_cannot_run_here_exits_2_with_a_line_per_problem(doctor_here, tmp_path, args, problem):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.yaml").write_text("run: {}\n")
    (tmp_path / "broken" / "checkpoints").mkdir(parents=True)
    (tmp_path / "broken" / "checkpoints" / "checkpoint_000000001.pt").write_bytes(b"PK\x03\x04 cut")
    code, _, err = doctor_here(*args)
    problems = [problem] if isinstance(problem, str) else problem
    assert code == 2 and len(err.strip().splitlines()) == len(problems)
    for line, expected in zip(err.splitlines(), problems):
        assert line.startswith(f"doctor: {expected.format(runs=tmp_path)}"), line


@no_gpu
def test_the_gpu_acceptance_run_needs_a_gpu_and_says_so_in_one_line(doctor_here, tmp_path):
    code, _, err = doctor_here("--gpu")
    assert code == 2
    assert err.strip() == ("doctor: no CUDA GPU here (torch.cuda.is_available() is False); the GPU acceptance run "
                           "needs one")
    assert not list(tmp_path.iterdir())


def test_the_gpu_acceptance_run_of_a_config_that_cannot_load_stops_before_it_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)   # the config is refused before any GPU is used
    assert acceptance_run("configs/pong_gpu.yaml", ["train.lr=fast"], tmp_path, quick=True) == 2
    assert capsys.readouterr().err == "doctor: config error: train.lr: must be a number, got 'fast'\n"
    assert not list(tmp_path.iterdir())


def test_the_acceptance_report_gives_each_check_its_result_error_and_figures(tmp_path):
    steps = [Step("a check that passes", [sys.executable, "-c", "print('round trip 0.74 ms')"], 60),
             Step("a check that fails", [sys.executable, "-c", "raise SystemExit('ValueError: no stream found')"], 60),
             Step("a check that hangs", [sys.executable, "-c", "import time; time.sleep(30)"], 1)]
    assert acceptance_run("configs/pong_cpu.yaml", [], tmp_path, steps) == 1
    (folder,) = tmp_path.iterdir()
    text = (folder / "report.md").read_text()
    assert folder.name.startswith("doctor-") and f"torch {torch.__version__}" in text
    assert "| a check that passes | passed |" in text and "round trip 0.74 ms" in text
    assert "| a check that fails | FAILED: exit code 1: ValueError: no stream found |" in text
    assert "| a check that hangs | FAILED: did not finish within 1 s |" in text


def test_the_report_is_written_after_each_check_so_a_cut_off_run_keeps_it(tmp_path):
    reads_the_report = ("import pathlib, sys; (report,) = pathlib.Path(sys.argv[1]).glob('doctor-*/report.md'); "
                        "sys.exit(0 if '| the first check | passed |' in report.read_text() else 1)")
    steps = [Step("the first check", [sys.executable, "-c", "print('done')"], 60),
             Step("the second check", [sys.executable, "-c", reads_the_report, str(tmp_path)], 60)]
    assert acceptance_run("configs/pong_cpu.yaml", [], tmp_path, steps) == 0


def test_tensorpipes_verbose_log_does_not_push_a_checks_figures_out_of_the_report(tmp_path):
    noisy = ("print('ingest: cuda 1,763 MB/s'); "
             "[print(f'V1125 17:51:45.{i:06d}  1937 tensorpipe/core/pipe_impl.cc:382] Pipe is calling a callback')"
             " for i in range(500)]")
    steps = [Step("transport", [sys.executable, "-c", noisy], 60, {"TP_VERBOSE_LOGGING": "1"})]
    assert acceptance_run("configs/pong_cpu.yaml", [], tmp_path, steps) == 0
    (report,) = tmp_path.glob("doctor-*/report.md")
    assert "ingest: cuda 1,763 MB/s" in report.read_text()


# A step that starts a process which leaves for a session of its own, ignores SIGINT and says its pid in a file,
# then sleeps: what a benchmark and its run are to the doctor (the run's roles run in sessions of their own).
STARTS_A_RUN = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import os, signal, sys, time; "
                "os.setsid(); signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(120)', sys.argv[1]]); time.sleep(120)")


def _alive(pid: int) -> bool:
    try:
        state = proc_stat(pid)[0]
    except OSError:
        return False
    return state not in ("Z", "X")   # a zombie has ended; its reaper may be slow to collect it


def _pid_in(path: Path, within_s: float = 30.0) -> int:
    deadline = time.monotonic() + within_s
    while not (path.is_file() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.05)
    return int(path.read_text())


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _kill(pid_file: Path) -> None:
    """Where a test failed, the process it started is not left behind."""
    if pid_file.is_file() and pid_file.read_text():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_a_step_past_its_limit_is_stopped_with_the_processes_it_started(tmp_path, monkeypatch):
    """A benchmark stopped at its limit takes its run down with it: SIGINT to the step's process group, then SIGKILL
    to what is left of its process tree, a process in a session of its own that ignored SIGINT included."""
    monkeypatch.setattr("rl_dqn.doctor.STOP_GRACE_S", 1.0)
    pid_file = tmp_path / "run.pid"
    steps = [Step("a benchmark that overruns", [sys.executable, "-c", STARTS_A_RUN, str(pid_file)], 5)]
    try:
        assert acceptance_run("configs/pong_cpu.yaml", [], tmp_path / "runs", steps) == 1
        assert _gone(_pid_in(pid_file))
    finally:
        _kill(pid_file)
    (report,) = (tmp_path / "runs").glob("doctor-*/report.md")
    assert "| a benchmark that overruns | FAILED: did not finish within 5 s |" in report.read_text()


@pytest.mark.parametrize("given", [None, "/opt/node/bin/python3"])
def test_the_steps_launch_their_runs_with_the_doctors_interpreter_unless_told_otherwise(tmp_path, monkeypatch,
                                                                                        given):
    if given is None:
        monkeypatch.delenv("RL_DQN_PYTHON", raising=False)
    else:
        monkeypatch.setenv("RL_DQN_PYTHON", given)
    steps = [Step("says", [sys.executable, "-c", "import os; print('python:', os.environ['RL_DQN_PYTHON'])"], 60)]
    assert acceptance_run("configs/pong_cpu.yaml", [], tmp_path, steps) == 0
    (log,) = tmp_path.glob("doctor-*/1-says.log")
    assert log.read_text() == f"python: {given or sys.executable}\n"


@pytest.mark.slow
def test_a_doctor_sent_sigterm_stops_the_step_that_runs_and_keeps_its_report(tmp_path):
    """`timeout` signals the doctor's process group, which the steps' own sessions are outside: the doctor stops the
    step itself, reports it as interrupted and exits 143. A second signal kills what is left of the step at once
    instead of waiting out STOP_GRACE_S (here a minute)."""
    pid_file = tmp_path / "run.pid"
    doctor_run = ("import sys; from pathlib import Path; import rl_dqn.doctor as doctor; doctor.STOP_GRACE_S = 60.0; "
                  "steps = [doctor.Step('first', [sys.executable, '-c', 'print(1)'], 60), "
                  f"doctor.Step('long', [sys.executable, '-c', {STARTS_A_RUN!r}, {str(pid_file)!r}], 120)]; "
                  f"sys.exit(doctor.acceptance_run('configs/pong_cpu.yaml', [], Path({str(tmp_path)!r}), steps))")
    process = subprocess.Popen([sys.executable, "-c", doctor_run], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        run = _pid_in(pid_file, within_s=60)
        process.send_signal(signal.SIGTERM)
        time.sleep(1)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
        assert time.monotonic() - signalled < 15, "the second signal did not cut the stop short"
        assert process.returncode == 128 + signal.SIGTERM, err
        assert err.startswith("doctor --gpu: interrupted; report so far: ") and err.count("\n") == 1
        assert _gone(run)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        _kill(pid_file)
    (report,) = tmp_path.glob("doctor-*/report.md")
    assert "| first | passed |" in report.read_text() and "| long | FAILED: interrupted |" in report.read_text()


def test_the_quick_node_run_fits_its_9_minutes_and_runs_scripts_that_exist(doctor_here):
    """--gpu --quick: each step's time limit sums to at most 9 minutes, and every script and test file it names is
    in the repository, for configs/pong_gpu.yaml (its default), whose config loads."""
    from rl_dqn.doctor import NODE_CONFIG, node_steps
    steps = node_steps(NODE_CONFIG, [], "doctor-x")
    assert sum(step.timeout_s for step in steps) <= 9 * 60
    named = [arg for step in steps for arg in step.argv[1:] if arg.endswith((".py", ".yaml"))]
    assert named and all((ROOT / path).is_file() for path in named), named
    assert doctor_here(NODE_CONFIG)[0] == 0


@pytest.mark.parametrize("args", [["--quick"], ["--quick", "configs/pong_gpu.yaml"]])
def test_quick_goes_with_gpu(doctor_here, args):
    code, _, err = doctor_here(*args)
    assert code == 2 and err.startswith("doctor: error: --quick goes with --gpu (usage: ") and err.count("\n") == 1
