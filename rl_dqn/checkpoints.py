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
import pickle
import time
from collections.abc import Callable
from pathlib import Path

import torch

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
    about once a second while the files are written."""
    where = folder(run_dir)
    where.mkdir(parents=True, exist_ok=True)
    if replay is not None:
        replay_path = where / f"replay_{updates:09d}.pt"
        save_atomically(replay, replay_path, progress)
        state = state | {"replay_file": replay_path.name}
    path = where / f"checkpoint_{updates:09d}.pt"
    save_atomically(state, path, progress)
    for old in all_of(run_dir)[:-keep]:
        old.unlink()
    for old in sorted(where.glob("replay_*.pt"))[:-1]:
        old.unlink()
    return path


def save_best(run_dir: Path, state: dict) -> Path:
    path = best_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomically(state, path)
    return path


def load(path: Path) -> tuple[dict, dict | None]:
    """A checkpoint's state, and the replay contents it names (None when it holds no replay), on the CPU."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    replay = state.get("replay_file")
    if replay is None:
        return state, None
    try:
        return state, torch.load(path.parent / replay, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as e:   # say which of the two files is bad
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"its replay file {replay}: {reason}") from None


def load_state(path: Path) -> dict:
    """A checkpoint's state alone, to read its counters and schedule: the replay file it names stays unread, and
    its tensors are mapped from the file rather than read (mmap), so this is cheap for any size of network."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def save_atomically(state: dict, path: Path, progress: Callable[[int], None] | None = None) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        torch.save(state, _Writing(f, progress))
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


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
