"""System figures of a role for TensorBoard: its CPU use and memory, its node's CPU use, its GPU's use."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _node_cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of every core of this node since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
    return sum(fields) - idle, sum(fields)


class SystemMeter:
    """Samples this process's CPU use (100 = one core busy) and resident memory, its node's CPU use (100 = every
    core busy) and, when the role works on a GPU, that GPU's utilisation and the memory torch holds there. Each
    sample covers the time since the previous one."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._gpu_util_works = self.device.type == "cuda"
        self._last = (time.monotonic(), time.process_time(), *_node_cpu_times())

    def sample(self) -> dict[str, float]:
        now = (time.monotonic(), time.process_time(), *_node_cpu_times())
        (wall0, cpu0, busy0, total0), (wall1, cpu1, busy1, total1) = self._last, now
        self._last = now
        figures = {
            "cpu_percent": 100.0 * (cpu1 - cpu0) / max(wall1 - wall0, 1e-9),
            "memory_mb": int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE / 2**20,
            "node_cpu_percent": 100.0 * (busy1 - busy0) / max(total1 - total0, 1),
        }
        if self.device.type == "cuda":
            figures["gpu_memory_mb"] = torch.cuda.memory_reserved(self.device) / 2**20
            if (util := self._gpu_utilization()) is not None:
                figures["gpu_util_percent"] = util
        return figures

    def _gpu_utilization(self) -> float | None:
        """Percent of the last sample period the GPU was busy (NVML through torch, or nvidia-smi); None where
        neither answers (then it is not asked again)."""
        if not self._gpu_util_works:
            return None
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        try:
            return float(torch.cuda.utilization(index))
        except Exception:  # noqa: BLE001 - no NVML bindings: ask nvidia-smi
            pass
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                  f"--id={index}"], capture_output=True, text=True, timeout=5, check=True).stdout
            return float(out.strip().splitlines()[0])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            self._gpu_util_works = False
            return None
