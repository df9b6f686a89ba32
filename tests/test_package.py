"""The installable package: pyproject.toml's metadata and `rl-dqn` command, the launchers that install and run it,
envs below rl_dqn, and console lines through logging."""

from __future__ import annotations

import ast
import importlib
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_dqn import cli
from rl_dqn.console import say

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["local", "learner", "collectors", "collector", "worker", "play", "doctor", "plot", "results"]


@pytest.fixture(scope="module")
def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")   # Python >= 3.11: the tests that read pyproject.toml skip on 3.10
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_metadata_names_the_package_its_version_and_python(pyproject):
    project = pyproject["project"]
    assert project["name"] == "rl-dqn"
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"])
    assert project["requires-python"] == ">=3.10"
    assert (ROOT / project["readme"]).is_file()
    assert pyproject["build-system"]["build-backend"] == "setuptools.build_meta"


def test_the_packages_declared_are_every_package_in_the_tree(pyproject):
    found = sorted(".".join(p.parent.relative_to(ROOT).parts) for top in ("rl_dqn", "envs")
                   for p in (ROOT / top).rglob("__init__.py"))
    assert sorted(pyproject["tool"]["setuptools"]["packages"]) == found
    assert "rl_dqn.transport" in found


def test_dependencies_are_named_in_requirements_which_pins_each_exactly(pyproject):
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    pins = dict(line.split("==") for line in lines if line)
    assert pins["torch"] == "2.13.0"
    assert all(re.fullmatch(r"[\w.+-]+", version) for version in pins.values()), pins
    wanted = (pyproject["project"]["dependencies"] + pyproject["project"]["optional-dependencies"]["test"]
              + pyproject["build-system"]["requires"])   # setuptools builds the editable install offline
    names = {re.split(r"[<>=!~ \[]", d)[0].lower() for d in wanted}
    assert names == {name.lower() for name in pins}


def test_the_console_script_names_a_callable_that_ends_the_process(pyproject):
    assert pyproject["project"]["scripts"] == {"rl-dqn": "rl_dqn.cli:entry"}
    module, name = pyproject["project"]["scripts"]["rl-dqn"].split(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_the_command_lists_every_subcommand():
    rl_dqn = Path(sys.executable).with_name("rl-dqn")   # the console script, where `pip install -e .` put it
    command = [str(rl_dqn)] if rl_dqn.exists() else [sys.executable, "-m", "rl_dqn"]
    result = subprocess.run([*command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "{" + ",".join(COMMANDS) + "}" in result.stdout
    bad = subprocess.run([*command, "fly"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "invalid choice: 'fly'" in bad.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_each_subcommand_has_help_and_exits_0(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m rl_dqn {command} ")   # the command it was given, not the module's
    # A description is a sentence, not one cut off where its module's docstring goes on to its usage lines.
    assert ":\n\npositional arguments:" not in out and ":\n\noptions:" not in out, out


def test_a_tool_keeps_its_own_arguments_and_one_line_errors(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["plot"])
    assert done.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "the following arguments are required: runs" in error


def test_each_launcher_runs_a_subcommand_of_the_package_under_its_own_name(pyproject):
    for script in ("local", "learner", "collector", "play", "doctor"):
        text = (ROOT / f"launch/{script}.sh").read_text()
        command = re.search(r'^RL_DQN_PROG="\$0" exec "\$PYTHON" -m rl_dqn (\w+) "\$@"$', text, re.M)
        assert command and command[1] in COMMANDS, script
        # Its help and its errors name the launcher the user ran (as the README does), not the package.
        result = subprocess.run([f"./launch/{script}.sh", "--help"], cwd=ROOT, capture_output=True, text=True,
                                timeout=60, env=os.environ | {"RL_DQN_PYTHON": sys.executable})
        assert result.returncode == 0 and result.stdout.startswith(f"usage: ./launch/{script}.sh ["), result
        if script not in ("play", "doctor"):   # an argument a role does not take: refused with that role's usage
            result = subprocess.run([f"./launch/{script}.sh", "configs/smoke.yaml", "--bogus"], cwd=ROOT,
                                    capture_output=True, text=True, timeout=60,
                                    env=os.environ | {"RL_DQN_PYTHON": sys.executable})
            assert result.returncode == 2 and result.stderr == (
                f"rl_dqn: error: unrecognized arguments: --bogus (usage: ./launch/{script}.sh [-h] config "
                f"[section.key=value ...])\n"), result
    venv = (ROOT / "launch/_venv.sh").read_text()
    # The venv is set up again when either file changes; requirements.txt pins a build backend that pyproject.toml
    # accepts, so that the editable install builds offline.
    assert 'cat "$root/requirements.txt" "$root/pyproject.toml" | sha256sum' in venv
    assert "--no-deps --no-build-isolation -e" in venv
    backend, = pyproject["build-system"]["requires"]
    lowest = tuple(int(v) for v in backend.split(">=")[1].split("."))
    pinned = next(line.split("==")[1].split()[0] for line in (ROOT / "requirements.txt").read_text().splitlines()
                  if line.startswith("setuptools=="))
    assert tuple(int(v) for v in pinned.split(".")) >= lowest


def test_envs_imports_nothing_from_rl_dqn():
    for path in (ROOT / "envs").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not [n for n in names if n.split(".")[0] == "rl_dqn"], f"{path.name} imports {names}"
    code = ("import sys, envs, envs.config, envs.vector; envs.make_vector_env; "
            "found = [m for m in sys.modules if m.startswith('rl_dqn')]; assert not found, found")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_config_loads_without_the_emulator_and_keeps_env_errors():
    code = ("import sys; from rl_dqn.config import ConfigError, EnvConfig, load_config; import envs; "
            "assert EnvConfig is envs.EnvConfig and ConfigError is envs.config.ConfigError; "
            "heavy = [m for m in ('torch', 'gymnasium', 'ale_py', 'envs.vector') if m in sys.modules]; "
            "assert not heavy, heavy\n"
            "try: load_config('configs/smoke.yaml', ['env.frame_skip=0'])\n"
            "except ConfigError as e: print(e)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "env.frame_skip: must be >= 1, got 0\n"


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def rl_dqn_logger():
    logger = logging.getLogger("rl_dqn")
    records, level = Records(), logger.level
    logger.addHandler(records)
    try:
        yield logger, records.records
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)


def test_say_prints_the_same_line_through_logging(rl_dqn_logger, capsys):
    logger, records = rl_dqn_logger
    say("learner", "env steps 1,000/4,000 [#####---------------]  25% ETA 5s | 100%")
    say("collector0", "warning: env.threads_per_collector: 4 threads on 2 cores")
    assert capsys.readouterr().out == ("[learner] env steps 1,000/4,000 [#####---------------]  25% ETA 5s | 100%\n"
                                       "[collector0] warning: env.threads_per_collector: 4 threads on 2 cores\n")
    assert [(r.name, r.levelno) for r in records] == [("rl_dqn.learner", logging.INFO),
                                                      ("rl_dqn.collector0", logging.WARNING)]
    logger.setLevel(logging.WARNING)   # what a user does for fewer lines: the warnings stay
    say("learner", "eval at 1,024 env steps")
    say("learner", "warning: evaluation stopped")
    assert capsys.readouterr().out == "[learner] warning: evaluation stopped\n"


def test_say_writes_once_where_the_root_logger_is_configured_too(rl_dqn_logger, capsys):
    root = logging.getLogger()
    extra = logging.StreamHandler(sys.stdout)
    root.addHandler(extra)
    try:
        say("local", "run x: learner + 2 collectors")
    finally:
        root.removeHandler(extra)
    assert capsys.readouterr().out == "[local] run x: learner + 2 collectors\n"


def test_a_start_up_line_times_the_process_from_its_start_to_within_a_fraction_of_a_second():
    """A fresh interpreter's start, as rl_dqn.console reads it from /proc, falls between the moment its parent
    started it and the moment it ended, to within the 10 ms of /proc's clocks (the boot time /proc/stat gives, in
    whole seconds, put it up to a second early)."""
    code = "from rl_dqn.console import process_started_at; print(process_started_at())"
    for _ in range(3):
        before = time.time()
        started = float(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                       check=True).stdout)
        after = time.time()
        assert before - 0.05 <= started <= after + 0.05, (before, started, after)
