"""The scripts in benchmarks/ refuse bad command-line input in one line that names the flag, with exit code 2 and
no traceback, before they do any work: not a crash, a segfault, or a benchmark whose results are lost at its end.

Each script's cases run in one interpreter of their own, as the script runs from the command line (its main() with
sys.argv set), so that torch is imported once per script, not once per case."""

from __future__ import annotations

import json
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
    ("evaluation.py", ["{tmp}/run"], "(the file is empty)"),   # a zero-byte checkpoint
    ("evaluation.py", ["{tmp}/run", "--seed", "99999999999999999999"], "argument --seed"),   # past torch's seeds
    ("random_scores.py", ["--seed", "-1"], "argument --seed"),
    ("learning.py", [SMOKE, "--seeds", "1,2147483648"], "--seeds must be integers from 0 to 2,147,483,647"),
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
    ("learning.py", [SMOKE, "--seeds", "1,2", "env.id=ALE/NoSuchGame-v5"], "override env.id=ALE/NoSuchGame-v5"),
    ("learning.py", [SMOKE, "--scores", "0,nan"], "argument --scores"),
    ("soak.py", ["/nonexistent.yaml", "--minutes", "0.1"], "config /nonexistent.yaml"),
    ("soak.py", [SMOKE, "--kill-every-s", "0"], "argument --kill-every-s"),
    ("soak.py", [SMOKE, "--hang-share", "2"], "argument --hang-share"),
    ("soak.py", [SMOKE, "--hang-s", "0"], "argument --hang-s"),
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


# Runs one script's cases in this interpreter: argv = [script, cases file, results file]. Each case gets its own
# folder (its {tmp}, also TMPDIR's place for tempfile) holding a run with an empty checkpoint; it reports the exit
# code, what was printed, and whether anything was left in its folder or in the runs folder.
DRIVER = """
import contextlib, io, json, os, runpy, sys, tempfile
from pathlib import Path
script, cases, out = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), sys.argv[3]
sys.path.insert(0, str(Path(script).resolve().parent))   # as for a script run by its path: its folder first
module, results = None, []
for args, tmp in cases:
    (Path(tmp) / "run/checkpoints").mkdir(parents=True)
    (Path(tmp) / "run/checkpoints/checkpoint_000000001.pt").touch()
    runs = Path(os.environ.get("RL_DQN_RUNS_DIR") or Path(tmp) / "runs")
    before = sorted(map(str, [*Path(tmp).rglob("*"), *runs.rglob("*")]))
    tempfile.tempdir = tmp
    sys.argv = [script, *args]
    module = module or runpy.run_path(script, run_name="benchmark")
    err, out_text, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out_text):
        try:
            code = module["main"]() or 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    after = sorted(map(str, [*Path(tmp).rglob("*"), *runs.rglob("*")]))
    results.append([code, out_text.getvalue(), err.getvalue(), after != before])
    Path(out).write_text(json.dumps(results))   # after each case: a case that kills the interpreter ends only its own
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[int, tuple[int, str, str, bool, Path]]:
    """Every case's (exit code, stdout, stderr, whether it left anything behind, its folder), by its index."""
    by_script: dict[str, list[int]] = {}
    for index, (script, _, _) in enumerate(CASES):
        by_script.setdefault(script, []).append(index)
    found = {}
    for script, indices in by_script.items():
        folder = tmp_path_factory.mktemp(script.removesuffix(".py"))
        tmps = [folder / f"case{i}" for i in indices]
        cases = [[[a.format(tmp=tmp) for a in CASES[i][1]], str(tmp)] for i, tmp in zip(indices, tmps)]
        (folder / "cases.json").write_text(json.dumps(cases))
        (folder / "runs").mkdir()
        env = dict(os.environ, RL_DQN_RUNS_DIR=str(folder / "runs"))
        if script == "soak.py":   # where it would make its runs folder: TMPDIR's, each case's own
            del env["RL_DQN_RUNS_DIR"]
        done = subprocess.run([sys.executable, "-c", DRIVER, f"benchmarks/{script}", str(folder / "cases.json"),
                               str(folder / "results.json")], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        results = json.loads((folder / "results.json").read_text()) if (folder / "results.json").is_file() else []
        for n, (i, tmp) in enumerate(zip(indices, tmps)):
            # A case that crashed the interpreter (a segfault), and those after it, get what the interpreter printed.
            crashed = (done.returncode, done.stdout, done.stderr, True)
            found[i] = (*(results[n] if n < len(results) else crashed), tmp)
    return found


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{s}-{' '.join(a)}" for s, a, _ in CASES])
def test_bad_input_is_refused_in_one_line_with_exit_code_2(outcomes, index):
    script, _, named = CASES[index]
    code, out, err, left_behind, tmp = outcomes[index]
    assert code == 2, out[-2000:] + err[-2000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), err
    assert named.format(tmp=tmp) in lines[0], err
    assert out == "" and "Traceback" not in err
    assert not left_behind   # no runs, logs or folders left behind
