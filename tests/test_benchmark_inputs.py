"""The scripts in benchmarks/ refuse bad command-line input in one line that names the flag, with exit code 2 and
no traceback, before they do any work: not a crash, a segfault, or a benchmark whose results are lost at its end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE = "configs/smoke.yaml"

# (script, its arguments, what the error line names); {tmp} is the test's own folder.
CASES = [
    ("evaluation.py", ["{tmp}/run", "--envs", "0", "--episodes", "1"], "argument --envs"),   # ale-py segfaulted
    ("evaluation.py", ["{tmp}/run", "--envs", "abc"], "argument --envs"),
    ("evaluation.py", ["{tmp}/run", "--threads", "0"], "argument --threads"),
    ("evaluation.py", ["{tmp}/run", "--episodes", "0"], "argument --episodes"),
    ("evaluation.py", ["{tmp}/no-such-run"], "run {tmp}/no-such-run"),
    ("evaluation.py", ["{tmp}/run"], "(EOFError: the file is empty)"),   # a zero-byte checkpoint
    ("random_scores.py", ["/nonexistent.yaml"], "config /nonexistent.yaml"),
    ("random_scores.py", ["--set", "train.lr=abc"], "--set train.lr=abc"),
    ("random_scores.py", [SMOKE, "--games", "NoSuchGame"], "--games NoSuchGame"),
    ("random_scores.py", ["--episodes", "0"], "argument --episodes"),
    ("random_scores.py", ["--csv", "{tmp}/no-folder/random.csv"], "--csv {tmp}/no-folder/random.csv"),
    ("learning.py", [SMOKE, "--seeds", "1,1"], "--seeds names a seed twice"),
    ("learning.py", [SMOKE, "--minutes", "nan"], "argument --minutes"),
    ("learning.py", [SMOKE, "--prefix", "../../tmp/x"], "argument --prefix"),
    ("learning.py", [SMOKE, "--downtime", "-5"], "argument --downtime"),
    ("learning.py", [SMOKE, "--downtime", "nan"], "argument --downtime"),
    ("learning.py", [SMOKE, "--seeds", "1,2", "train.lr=abc"], "override train.lr=abc"),
    ("soak.py", ["/nonexistent.yaml", "--minutes", "0.1"], "config /nonexistent.yaml"),
    ("soak.py", [SMOKE, "--kill-every-s", "0"], "argument --kill-every-s"),
    ("replay_memory.py", ["--transitions", "0"], "argument --transitions"),
    ("replay_memory.py", ["--transitions", "-5"], "argument --transitions"),
    ("network.py", ["--seconds", "-1"], "argument --seconds"),
    ("throughput.py", ["--seconds", "-1"], "argument --seconds"),
    ("throughput.py", ["--cleanrl", "/nonexistent.py"], "--cleanrl /nonexistent.py"),
    ("learner.py", ["--batches", "abc"], "argument --batches"),
    ("learner.py", ["--devices", "gpu"], "--devices gpu"),
    ("scaling.py", [SMOKE, "--prefix", "../../x"], "argument --prefix"),
    ("scaling.py", [SMOKE, "--seconds", "nan"], "argument --seconds"),
    ("whole_games.py", ["{tmp}/run", "--record", "nosuchbench"], "--record nosuchbench: no such benchmark"),
    ("transport.py", ["--quik"], "unrecognized arguments: --quik"),
    ("tensorpipe_transports.py", ["--quick"], "unrecognized arguments: --quick"),
    ("atari5_regression.py", ["{tmp}/no-checkout"], "checkout {tmp}/no-checkout"),
]


@pytest.mark.parametrize("script, args, named", CASES, ids=[f"{s}-{' '.join(a)}" for s, a, _ in CASES])
def test_bad_input_is_refused_in_one_line_with_exit_code_2(tmp_path, script, args, named):
    (tmp_path / "run/checkpoints").mkdir(parents=True)
    (tmp_path / "run/checkpoints/checkpoint_000000001.pt").touch()
    (tmp_path / "runs").mkdir()
    env = dict(os.environ, RL_DQN_RUNS_DIR=str(tmp_path / "runs"), TMPDIR=str(tmp_path))
    if script == "soak.py":   # where it would make its runs folder: in TMPDIR
        del env["RL_DQN_RUNS_DIR"]
    before = sorted(tmp_path.rglob("*"))
    result = subprocess.run([sys.executable, f"benchmarks/{script}", *(a.format(tmp=tmp_path) for a in args)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), result.stderr
    assert named.format(tmp=tmp_path) in lines[0], result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert sorted(tmp_path.rglob("*")) == before   # no runs, logs or folders left behind
