"""Runs one node's role processes and takes them all down together.

The node ends when its roles end. A role with restarts left (a collector) that dies is started again: the new
process joins the running learner in the same slot. Any other role that dies stops the others, and the node exits
non-zero, naming the role and why. On SIGINT or SIGTERM every role is asked to stop (each then flushes what it
holds), and whatever is still running after `grace_s` is killed, so nothing outlives the node. A role writing a
checkpoint says so as the file grows (SAVING): the node waits while it does, up to `grace_s` after its last word.

A node's checks of the run (`checks`) take seconds, most of them importing torch and the env: the roles start at
once and load their modules meanwhile (GATE_ENV), each then waiting for the word to go on, which it gets once the
checks pass; when they fail, the roles are taken down before doing anything, and the node alone says why.

Once the role that finishes the run (the learner) has exited 0, the run is complete: no role is started again, the
roles still running are asked to stop, and the node exits 0 whatever they do then; one line names any that did not
stop cleanly (one that was joining as the run ended, say).
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, NamedTuple

from rl_dqn.console import PROGRESS_ENV, PROGRESS_MARK, progress


class RoleSpec(NamedTuple):
    label: str          # e.g. "learner", "collector0"
    argv: list[str]
    finishes_run: bool  # its clean exit means the run is complete (the learner)
    restarts: int = 0   # times a new process is started when it dies


# Exit codes after which a new process would fail the same way: bad input, and a collector whose learner is gone.
EXIT_BAD_INPUT, EXIT_LEARNER_LOST = 2, 3
NOT_RESTARTED = {EXIT_BAD_INPUT: "bad input", EXIT_LEARNER_LOST: "the learner is gone"}
RESTART_DELAY_S = 1.0
# A role started with GATE_ENV set loads its modules, then reads one line from its stdin before doing anything else:
# GO when the node's checks passed; anything else (the end of its stdin) when they failed, and it leaves quietly.
GATE_ENV, GO = "RL_DQN_GATE", "go"
# The key of a role's progress report while a checkpoint it writes grows: the bytes written so far.
SAVING = "saving_bytes"

# Looked up once here: die_with_parent() runs in the child between fork and exec, where loading a library could
# wait forever on a lock that one of the parent's other threads held at the fork.
try:
    _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):   # no glibc
    _prctl = None
_PR_SET_PDEATHSIG, _SIGTERM = 1, int(signal.SIGTERM)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (for a one-node run's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Role:
    def __init__(self, spec: RoleSpec, env: dict[str, str]):
        self.spec, self.env = spec, env
        self.gate: bool | None = None if GATE_ENV in env else True   # None: the node's checks are running
        self.restarts_left = spec.restarts
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self.progress: tuple[float, dict] | None = None   # (when, report) of its newest progress line
        self.saving_at: float | None = None   # when it last said a checkpoint it writes had grown
        self._start()

    def _start(self) -> None:
        spec, env = self.spec, self.env
        gated = GATE_ENV in env
        self.process = subprocess.Popen(spec.argv, env=env, stdin=subprocess.PIPE if gated else None,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                        start_new_session=True, preexec_fn=die_with_parent)
        self._reader = threading.Thread(target=self._forward, daemon=True)
        self._reader.start()
        if gated:
            self.open_gate(self.gate)   # a process started again once the checks passed goes on at once

    def open_gate(self, go: bool | None) -> None:
        """Tells the process to go on (True) or to leave (False); None: not yet."""
        self.gate = go
        if go is None or self.process.stdin is None or self.process.stdin.closed:
            return
        try:
            try:
                if go:
                    self.process.stdin.write(GO + "\n")
            finally:
                self.process.stdin.close()
        except OSError:   # it has died meanwhile: the node sees it as it polls
            pass

    def _forward(self) -> None:
        for line in self.process.stdout:
            line = line.rstrip("\n")
            if PROGRESS_MARK in line and (report := _progress_report(line)) is not None:
                if SAVING in report:
                    self.saving_at = time.monotonic()
                else:
                    self.progress = (time.monotonic(), report)
                continue
            if line.strip():
                self.tail.append(line.strip())
            sys.stdout.write((line if line.startswith("[") else f"[{self.spec.label}] {line}") + "\n")
            sys.stdout.flush()

    def why(self) -> str:
        """How the role ended; for an error exit, with the error line it printed (TensorPipe's own warnings may
        follow it) or else its last line."""
        code = self.process.returncode
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        errors = [line for line in self.tail if "] error: " in line or line.startswith("rl_dqn: ")]
        last = errors[-1] if errors else self.tail[-1] if self.tail else ""
        return f"exited with code {code}" + (f": {last}" if last else "")

    def finish_output(self) -> None:
        self._reader.join(timeout=2.0)

    def may_restart(self) -> bool:
        return self.restarts_left > 0 and self.process.returncode not in NOT_RESTARTED

    def restart(self) -> None:
        self.finish_output()
        self.restarts_left -= 1
        self.tail.clear()
        self.progress = None   # the new process reports once it acts
        time.sleep(RESTART_DELAY_S)
        self._start()


def _progress_report(line: str) -> dict | None:
    try:
        report = json.loads(line.split(PROGRESS_MARK, 1)[1])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


class NodeProgress:
    """One line per interval for a node that runs collectors only: the run's progress as the learner last told
    them, and this node's share (its collectors' progress lines are not shown one by one)."""

    def __init__(self, node: str, total_env_steps: int, interval_s: float):
        self.node, self.total, self.interval_s = node, total_env_steps, interval_s
        self._last = time.monotonic()

    def line(self, roles: list[_Role]) -> str | None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return None
        self._last = now
        running = [r for r in roles if r.process.poll() is None]
        fresh = [r.progress[1] for r in running if r.progress is not None and now - r.progress[0] < 2 * self.interval_s]
        if not fresh:
            # Said of collectors that reported before: not while they start (joining says itself), nor once done.
            reported = any(r.progress is not None for r in running)
            return f"{self.node}: no collector has reported in the last {2 * self.interval_s:g} s" if reported else None
        newest = max(fresh, key=lambda r: r["run_env_steps"])
        rate = sum(r["rate"] for r in fresh)
        run = progress(min(newest["run_env_steps"], self.total), self.total, newest["run_rate"])
        return (f"{self.node}: run env steps {run} | this node {rate:,.0f} steps/s | collectors acting "
                f"{len(fresh)}/{len(roles)} | weights v{min(r['weights_version'] for r in fresh)}")


def die_with_parent() -> None:
    """Children get SIGTERM if this process dies without cleaning up (Linux prctl PR_SET_PDEATHSIG)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, _SIGTERM)


def supervise(specs: list[RoleSpec], node: str, grace_s: float = 20.0, progress: NodeProgress | None = None,
              checks: Callable[[], bool] | None = None) -> int:
    """Runs the roles of `specs` to the node's end and returns its exit code. `checks`, when given, runs while the
    roles load their modules: True lets them go on; False (nothing to do) or an exception (bad input) ends the
    node before they do anything, returning 0 or raising it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{PROGRESS_ENV: "1"})
    if checks is not None:
        env[GATE_ENV] = "1"
    roles = [_Role(spec, env) for spec in specs]
    if checks is not None:
        go = False
        try:   # under the default signal handlers: Ctrl-C stops checks that hang
            go = checks()
        finally:
            for role in roles:
                role.open_gate(go)
            if not go:   # they have done nothing: no grace
                _take_down(roles)
        if not go:
            return 0
    interrupted: list[int] = []

    def on_signal(signum, _frame):
        interrupted.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    failed: str | None = None
    failed_code = 1   # the node's exit code when a role failed: 2 when that role refused its input
    complete = False   # the learner finished the run
    stuck: list[_Role] = []   # killed, still running `waited` seconds after being asked to stop
    waited = 0.0
    stop_deadline: float | None = None
    try:
        while True:
            time.sleep(0.1)
            for role in roles:
                role.process.poll()   # each poll updates its returncode
            if progress is not None and (line := progress.line(roles)) is not None:
                print(line, flush=True)
            if stop_deadline is None:
                complete = _finished(roles)
                for role in [] if complete else roles:
                    code = role.process.returncode
                    if code is not None and code != 0:
                        role.finish_output()
                        if role.may_restart() and interrupted:   # a death it would see to, as the node stops
                            print(f"{node}: {role.spec.label} died ({role.why()}) as the node stops; not started "
                                  f"again", file=sys.stderr, flush=True)
                            continue
                        if role.may_restart():
                            used = role.spec.restarts - role.restarts_left + 1
                            print(f"{node}: {role.spec.label} died ({role.why()}); starting a new process "
                                  f"(restart {used} of {role.spec.restarts})", file=sys.stderr, flush=True)
                            role.restart()
                            continue
                        failed = f"{node}: {role.spec.label} died ({role.why()}); stopping the other roles"
                        failed_code = EXIT_BAD_INPUT if code == EXIT_BAD_INPUT else 1
                        break
                if failed or interrupted or complete:
                    if failed:
                        print(failed, file=sys.stderr, flush=True)
                    elif interrupted:
                        print(f"{node}: {signal.Signals(interrupted[0]).name}: stopping every role "
                              f"(at most {grace_s:g} s)", file=sys.stderr, flush=True)
                    # The learner of a complete run waited for every collector it knew to say goodbye: those still
                    # running are leaving, which a signal does not change, or were joining and never hear its word.
                    _signal_all(roles, signal.SIGTERM)
                    stop_deadline = time.monotonic() + grace_s
            elif time.monotonic() > _deadline(roles, stop_deadline, grace_s):
                stuck = [r for r in roles if r.process.poll() is None]
                waited = time.monotonic() - stop_deadline + grace_s
                if not complete:   # else the last line names them
                    print(f"{node}: killing {', '.join(r.spec.label for r in stuck)}, still running {waited:.0f} s "
                          f"after being asked to stop", file=sys.stderr, flush=True)
                _signal_all(roles, signal.SIGKILL)
                break
            # Only once what ended has been seen to (the exit codes read at the top of this pass, not polled again):
            # a node whose one role died starts it again, or fails with that role's exit code.
            if all(role.process.returncode is not None for role in roles):
                break
    finally:
        _take_down(roles)
        for s, handler in previous.items():
            signal.signal(s, handler)
    if failed:
        return failed_code
    if interrupted:
        return 128 + interrupted[0]
    bad = [r for r in roles if r.process.returncode != 0]
    if complete:
        if bad:
            print(f"{node}: the run is complete; not stopped cleanly, which does not fail it: " + ", ".join(
                f"{r.spec.label} ({r.why()}" + (f", still running {waited:.0f} s after the run ended)" if r in stuck
                                                else ")") for r in bad), flush=True)
        return 0
    for role in bad:
        print(f"{node}: {role.spec.label} {role.why()}", file=sys.stderr, flush=True)
    return 1 if bad else 0


def _take_down(roles: list[_Role]) -> None:
    """Kills what still runs of `roles`, and waits for each and for the last of its output."""
    for role in roles:
        if role.process.poll() is None:
            role.process.kill()
        role.process.wait()
        role.finish_output()


def _deadline(roles: list[_Role], stop_deadline: float, grace_s: float) -> float:
    """When the roles still running are killed: `stop_deadline`, or later while one says a checkpoint it writes is
    growing (grace_s after it last said so)."""
    saving = [r.saving_at + grace_s for r in roles if r.saving_at is not None and r.process.poll() is None]
    return max([stop_deadline, *saving])


def _finished(roles: list[_Role]) -> bool:
    """The role that finishes the run has exited 0 (as of the roles' last poll)."""
    return any(r.spec.finishes_run and r.process.returncode == 0 for r in roles)


def _signal_all(roles: list[_Role], signum: int) -> None:
    for role in roles:
        if role.process.poll() is None:
            try:
                role.process.send_signal(signum)
            except ProcessLookupError:
                pass
