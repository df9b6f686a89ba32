"""TensorBoard writer and rate meters."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from rl_dqn.config import Config, to_dict

# The metrics of the HParams tab: each run's newest value of these scalars sits next to its hyperparameters.
HPARAM_METRICS = ("eval/episode_return", "eval/best_episode_return", "collector/episode_return")

# The Custom Scalars tab: charts side by side (tags are regular expressions).
LAYOUT = {
    "score": {
        "score vs env steps": ["Multiline", [r"eval/episode_return$", r"collector/episode_return$",
                                             r"collector/episode_return_at_epsilon$"]],
        "score vs wall time (s)": ["Multiline", [r"eval/episode_return_vs_seconds$"]],
    },
    "speed": {
        "env steps/s": ["Multiline", [r"collector/env_steps_per_s$"]],
        "updates/s": ["Multiline", [r"learner/updates_per_s$"]],
        "collectors alive": ["Multiline", [r"cluster/collectors_alive$"]],
    },
    "system": {
        "CPU % of each role (100 = a core)": ["Multiline", [r"system/(learner|collector\d+)/cpu_percent$"]],
        "CPU % of the learner's node (100 = every core)": ["Multiline", [r"system/learner_node/cpu_percent$"]],
        "memory MB": ["Multiline", [r"system/.*/memory_mb$"]],
        "GPU utilisation %": ["Multiline", [r"system/.*/gpu_util_percent$"]],
        "GPU memory MB": ["Multiline", [r"system/.*/gpu_memory_mb$"]],
    },
}

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


def hparam_values(cfg: Config) -> dict[str, float | int | str | bool]:
    """Every config key as `section.key`, in the types the HParams tab takes."""
    return {f"{section}.{key}": value if isinstance(value, (bool, int, float, str)) else str(value)
            for section, values in to_dict(cfg).items() for key, value in values.items()}


class Board:
    """TensorBoard event files in the run folder. Every scalar is against env steps of the run (as CleanRL's
    are), except `eval/episode_return_vs_seconds`, against seconds; `learner/updates` maps one to the other.
    A new run also writes its hyperparameters (Text and HParams tabs) and the Custom Scalars layout."""

    def __init__(self, run_dir: Path, cfg: Config):
        self.writer = SummaryWriter(log_dir=str(run_dir), flush_secs=10)
        if cfg.run.resume:
            return   # the run's first event file has them
        rows = "\n".join(f"|{key}|{value}|" for key, value in hparam_values(cfg).items())
        self.writer.add_text("hyperparameters", f"|key|value|\n|-|-|\n{rows}")
        for summary in hparams(hparam_values(cfg), dict.fromkeys(HPARAM_METRICS, 0.0)):
            self.writer._get_file_writer().add_summary(summary)
        self.writer.add_custom_scalars(LAYOUT)

    def resume_at(self, env_steps: int) -> None:
        """A resumed run: TensorBoard hides what an earlier process wrote after the step of the checkpoint the run
        resumes from, so each curve continues from the checkpoint. What it wrote at that step came before the
        checkpoint (the evaluation that ended a run at its total, say) and stays."""
        self.writer.close()
        self.writer = SummaryWriter(log_dir=self.writer.log_dir, flush_secs=10, purge_step=env_steps + 1)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, value, step)

    def histogram(self, tag: str, values: torch.Tensor, step: int) -> None:
        """A histogram of `values`' finite ones: NaN and infinities, which a learner whose training diverged computes
        until its next check stops it, cannot be binned (TensorBoard's writer raises); none where none is finite."""
        values = values.detach().float().cpu()
        values = values[values.isfinite()]
        if values.numel():
            self.writer.add_histogram(tag, values, step)

    def gif(self, tag: str, gif: bytes, height: int, width: int, step: int) -> None:
        """An animated GIF in the Images tab (what SummaryWriter.add_video writes, without its moviepy)."""
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
        self.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
