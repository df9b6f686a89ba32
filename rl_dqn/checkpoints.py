"""A run's checkpoint files: the one place that knows their names, how they are written and which are kept.

    runs/<name>/checkpoints/
      checkpoint_<updates>.pt   the learner's state: networks, optimizer, counters, schedules, the sampling
                                generator, the config and the env's shapes (the newest learner.keep_checkpoints)
      replay_<updates>.pt       the replay contents, beside the newest checkpoint only (learner.checkpoint_replay)
      best.pt                   the network the run's evaluations scored best, with its score (no optimizer)

Each file is written to a temporary name, flushed to disk and renamed, so a crash at any point leaves the previous
one whole. A big file (a replay's contents) goes to disk as it is written, and says how far it has got as it goes.
"""

from __future__ import annotations

import os
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from rl_dqn.console import first_line, say

BEST = "best.pt"


def folder(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def best_path(run_dir: Path) -> Path:
    """Where a run keeps the network its evaluations scored best (it may not exist yet)."""
    return folder(run_dir) / BEST


def all_of(run_dir: Path) -> list[Path]:
    """The run's learner checkpoints, oldest first."""
    return sorted(folder(run_dir).glob("checkpoint_*.pt"))


def newest(run_dir: Path) -> Path:
    found = all_of(run_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {folder(run_dir)}")
    return found[-1]


def best(run_dir: Path) -> Path:
    path = best_path(run_dir)
    if not path.is_file():
        raise FileNotFoundError(f"no {BEST} in {folder(run_dir)}: the run finished no evaluation "
                                f"(eval.every_env_steps)")
    return path


def save(run_dir: Path, state: dict, replay: dict | None, updates: int, keep: int,
         progress: Callable[[int], None] | None = None) -> Path:
    """checkpoint_<updates>.pt, and replay_<updates>.pt first when `replay` is given (the checkpoint names it);
    then only the newest `keep` checkpoints and the newest replay stay. `progress` hears the bytes written so far,
    about once a second while the files are written. A replay that cannot be written (a full disk) does not keep
    the checkpoint from being written without it; that is said in a line. A checkpoint that cannot be written
    raises OSError, and the checkpoints written before it stay."""
    where = folder(run_dir)
    where.mkdir(parents=True, exist_ok=True)
    for stale in where.glob("*.partial"):   # a process killed while writing (SIGKILL) left it: no file to resume
        stale.unlink(missing_ok=True)
    if replay is not None:
        replay_path = where / f"replay_{updates:09d}.pt"
        try:
            save_atomically(replay, replay_path, progress)
            state = state | {"replay_file": replay_path.name}
        except OSError as e:
            say("learner", f"warning: the replay could not be saved ({e.strerror or first_line(e)}: {replay_path}); "
                           f"the checkpoint is written without it, and a resume starts with an empty replay")
    path = where / f"checkpoint_{updates:09d}.pt"
    try:
        save_atomically(state, path, progress)
    except BaseException:
        if "replay_file" in state and not path.exists():   # named by no checkpoint, it only takes the space
            (where / state["replay_file"]).unlink(missing_ok=True)
        raise
    for old in all_of(run_dir)[:-keep]:
        old.unlink()
    # The newest replay that a kept checkpoint names (replay_N goes with checkpoint_N): an older one, or one whose
    # checkpoint is gone (a run resumed with learner.checkpoint_replay off), is gigabytes that no resume reads.
    kept = {old.name.removeprefix("checkpoint_") for old in all_of(run_dir)}
    if "replay_file" not in state:   # this checkpoint_N, written again, may no longer name the replay_N beside it
        kept.discard(path.name.removeprefix("checkpoint_"))
    named = [old for old in sorted(where.glob("replay_*.pt")) if old.name.removeprefix("replay_") in kept]
    for old in where.glob("replay_*.pt"):
        if old not in named[-1:]:
            old.unlink()
    return path


def save_best(run_dir: Path, state: dict) -> Path:
    path = best_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomically(state, path)
    return path


def best_score(run_dir: Path) -> float | None:
    """The evaluation score of the network best.pt holds; None where there is none, or it cannot be read."""
    try:
        score = read(best_path(run_dir), mmap=True)["eval"]["mean"]
    except (CheckpointError, KeyError, TypeError):
        return None
    return float(score) if isinstance(score, (int, float)) else None


class CheckpointError(ValueError):
    """A checkpoint or replay file that cannot be read as one: the file, and why in a few words."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


# What a learner checkpoint holds besides its identity (config, spec); a file without them is another kind.
LEARNER_KEYS = ("network", "target", "optimizer", "generator", "counters", "schedule")


def read(path: Path, mmap: bool = False) -> dict:
    """A checkpoint file's contents on the CPU (with `mmap`, its tensors mapped from the file, not read), or
    CheckpointError where it is not a file of torch.save's that holds a dict."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except MemoryError:   # a file too big for this machine is not a damaged one
        raise
    # Bytes that are not torch.save's reach an unpickler, which can fail in any way (a text file gives KeyError).
    except Exception as e:   # noqa: BLE001
        raise CheckpointError(path, _unreadable(path, e)) from None
    if not isinstance(state, dict):
        raise CheckpointError(path, f"it holds a {type(state).__name__}, not an rl_dqn checkpoint")
    return state


def _unreadable(path: Path, error: Exception) -> str:
    try:
        return _what_is_wrong(path, error)
    except OSError as e:   # its folder cannot be searched, say
        return e.strerror or (error.strerror if isinstance(error, OSError) else None) or type(error).__name__


def _what_is_wrong(path: Path, error: Exception) -> str:
    if path.is_dir():
        return "it is a folder"
    if not path.is_file() or not os.access(path, os.R_OK):   # no such file, no permission: as the system says
        return error.strerror if isinstance(error, OSError) and error.strerror else "cannot be opened"
    if path.stat().st_size == 0:
        return "the file is empty"
    # torch.save writes a zip archive: one that begins as one but lacks its end (the central directory) was cut
    # short, as by a full disk or a copy stopped midway.
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            return "not in torch.save's zip format"
    if not zipfile.is_zipfile(path):
        return "the file is cut short"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    reason = first_line(error) or type(error).__name__
    if reason.startswith("Weights only load failed"):   # torch's advice to load it unsafely: not for a user here
        return "not a file torch.save wrote with tensors and plain data only"
    return reason


def require_keys(state: dict, path: Path, keys: tuple[str, ...], kind: str) -> dict:
    missing = [key for key in keys if key not in state]
    if missing:
        raise CheckpointError(path, f"not {kind} (it has no {', '.join(missing)})")
    return state


def load(path: Path) -> tuple[dict, dict | None]:
    """A learner checkpoint's state, and the replay contents it names (None when it names none, or when its replay
    file has been moved aside: the run goes on with an empty replay), on the CPU."""
    state = require_keys(read(path), path, LEARNER_KEYS, "a learner checkpoint")
    replay = replay_path(path, state)
    if replay is None or not replay.exists():
        return state, None
    return state, read(replay)


def replay_path(path: Path, state: dict) -> Path | None:
    """The replay file beside the checkpoint at `path` that its `state` names; None when it names none."""
    name = state.get("replay_file")
    if not name:
        return None
    if not (isinstance(name, str) and Path(name).name == name):   # a file beside it, never one elsewhere
        raise CheckpointError(path, f"its replay_file is {name!r}, not the name of a file beside it")
    return path.parent / name


def load_state(path: Path) -> dict:
    """A learner checkpoint's state alone, to read its counters and schedule: the replay file it names stays unread,
    and its tensors are mapped from the file rather than read (mmap), so this is cheap for any size of network."""
    return require_keys(read(path, mmap=True), path, LEARNER_KEYS, "a learner checkpoint")


def save_atomically(state: dict, path: Path, progress: Callable[[int], None] | None = None) -> None:
    """Writes `state` to `path` whole or not at all: OSError, naming `path`, where the disk cannot take it."""
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as f:
            torch.save(state, _Writing(f, progress))
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException as e:   # a full disk, or a signal: a file cut short leaves no space taken
        partial.unlink(missing_ok=True)
        # A write that failed partway (or was cut by Ctrl-C) leaves torch's zip writer at the wrong offset, and its
        # closing check raises RuntimeError ("unexpected pos") over the error that says why; a failed write names no
        # file, a failed open the partial one.
        cut = isinstance(e, RuntimeError) and isinstance(e.__context__, (OSError, KeyboardInterrupt))
        cause = e.__context__ if cut else e
        if isinstance(cause, OSError) and cause.errno is not None and cause.filename in (None, str(partial)):
            raise OSError(cause.errno, cause.strerror, str(path)) from None
        if cause is not e:
            raise cause from None
        raise


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Writes `data` to `path` whole or not at all, as save_atomically() writes a state; OSError where it cannot."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


class _Writing:
    """The file torch.save writes to, which hands each tensor's storage over in one write: written in slices and
    synced every SYNC_BYTES, so that a file of gigabytes reaches the disk as it goes (its last sync is short) and
    `progress` hears the bytes of the file written so far, at most once every TELL_S."""

    SLICE_BYTES = 64 << 20
    SYNC_BYTES = 512 << 20
    TELL_S = 1.0

    def __init__(self, f, progress: Callable[[int], None] | None):
        self.f, self.progress = f, progress
        self.written = self.synced = 0
        self.told = time.monotonic()

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), self.SLICE_BYTES):
            self.written += self.f.write(view[start:start + self.SLICE_BYTES])
            if self.written - self.synced >= self.SYNC_BYTES:
                self.f.flush()
                os.fsync(self.f.fileno())
                self.synced = self.written
            if self.progress is not None and time.monotonic() - self.told >= self.TELL_S:
                self.told = time.monotonic()
                self.progress(self.written)
        return len(view)

    def flush(self) -> None:
        self.f.flush()
