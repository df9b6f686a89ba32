"""TensorBoard writer, rate meters and the console line."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from rl_dqn.config import Config, to_dict


class RateMeter:
    """Counts something and reports its rate per second since the previous report."""

    def __init__(self):
        self.total = 0.0
        self._last_total, self._last_time = 0.0, time.monotonic()

    def add(self, amount: float) -> None:
        self.total += amount

    def rate(self) -> float:
        now = time.monotonic()
        rate = (self.total - self._last_total) / max(now - self._last_time, 1e-9)
        self._last_total, self._last_time = self.total, now
        return rate


class Board:
    """TensorBoard event files in the run folder. Every tag is against env steps of the run (as CleanRL's are),
    except `eval/episode_return_vs_seconds`, against seconds; `learner/updates` maps one to the other."""

    def __init__(self, run_dir: Path, cfg: Config):
        self.writer = SummaryWriter(log_dir=str(run_dir), flush_secs=10)
        rows = "\n".join(f"|{section}.{key}|{value}|" for section, values in to_dict(cfg).items()
                         for key, value in values.items())
        self.writer.add_text("hyperparameters", f"|key|value|\n|-|-|\n{rows}")

    def resume_at(self, env_steps: int) -> None:
        """A resumed run: TensorBoard hides what an earlier process wrote from this step on (it was written after
        the checkpoint the run resumes from), so each curve continues from the checkpoint."""
        self.writer.close()
        self.writer = SummaryWriter(log_dir=self.writer.log_dir, flush_secs=10, purge_step=env_steps)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def say(role: str, message: str) -> None:
    """One console line, prefixed with the role."""
    print(f"[{role}] {message}", file=sys.stdout, flush=True)
