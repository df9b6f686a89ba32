"""System figures of a role for TensorBoard (its CPU use and memory, its node's CPU use, its GPU's use), and the
C library's memory setting that every role takes."""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import time
from pathlib import Path

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3     # glibc's mallopt() parameters
_MALLOC_ENVIRONMENT = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
    """Makes glibc's malloc keep freed memory for the next allocation instead of handing it back to the kernel.

    By default it hands back the top of its heap once a few MB there are free, and a learner update frees that
    much (the batch, the activations), so every update faulted its memory in again, paying for page faults in the
    kernel's CPU time (docs/benchmarks.md). The heap now keeps up to 1 GiB free at its top; blocks over 32 MiB (the
    replay memory, large CPU batches) are still mapped apart and handed back when freed. Malloc settings the user put
    in the environment win. Returns False where this changed nothing (such settings, or a C library that is not
    glibc)."""
    if any(name in os.environ for name in _MALLOC_ENVIRONMENT):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def flush_denormals() -> bool:
    """Makes this thread, and threads it starts from now on, compute with denormal floats flushed to zero (the x86
    FTZ and DAZ flags), as TensorFlow's CPU kernels do (tensorflow/core/platform/denormal.h).

    Adam's moment estimates of a weight whose gradient stays zero (a ReLU unit that no longer fires) decay
    geometrically into the denormal range below 1.2e-38, and every operation on a denormal takes a slow path, which
    made Adam's step a large share of the learner's time (`python benchmarks/network.py` times it both ways). Values
    that small change no update. Returns False where the CPU has no such flags."""
    return torch.set_flush_denormal(True)


def configure_process() -> None:
    """What every role's process sets before it computes: malloc keeps freed memory, denormals are flushed."""
    keep_freed_memory()
    flush_denormals()


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes a new allocation can take on `device` without swapping or failing: the kernel's MemAvailable for the
    CPU, the free memory of a GPU; None where it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    kib = next((int(line.split()[1]) for line in lines if line.startswith("MemAvailable:")), None)
    return None if kib is None else kib * 1024


def machine() -> dict:
    """What a result was measured on: the CPU (model, x86 family.model, the cores this process may use, whether it has
    AVX512-BF16 or AMX, which decide network.precision: auto), the GPUs and the software."""
    from importlib import metadata

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    def field(name: str) -> str | None:
        return next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                     if line.split(":", 1)[0].strip() == name), None)
    model = field("model name") or "unknown CPU"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    # A virtual machine's model name can be as bare as "AMD EPYC", which spans generations that differ in speed;
    # the x86 family and model numbers tell them apart (family 25 is Zen 3/4, 26 is Zen 5).
    family, number = field("cpu family"), field("model")
    return {"cpu": model, "cpu_family": family and f"{family}.{number}", "cores": cores,
            "avx512_bf16": torch.cpu._is_avx512_bf16_supported(),
            "amx": torch.cpu._is_amx_tile_supported(), "gpus": gpus, "torch": torch.__version__,
            "gymnasium": version("gymnasium"), "ale_py": version("ale-py")}


def code_version(root: Path = Path(__file__).resolve().parents[1]) -> dict:
    """The git commit of the code at `root` and whether its tracked files differ from it (None where it is not a
    git checkout)."""
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def _node_cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of every core of this node since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
    return sum(fields) - idle, sum(fields)


class SystemMeter:
    """Samples this process's CPU use (100 = one core busy) and resident memory, its node's CPU use (100 = every
    core busy) and, when the role works on a GPU, the memory torch holds there and (with `gpu_utilization`) that
    GPU's utilisation. Each sample covers the time since the previous one; nothing here blocks the caller."""

    def __init__(self, device: torch.device | str = "cpu", gpu_utilization: bool = False):
        self.device = torch.device(device)
        self._last = (time.monotonic(), time.process_time(), *_node_cpu_times())
        self._utilization = _GpuUtilization(self.device) if gpu_utilization and self.device.type == "cuda" else None

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
            if self._utilization is not None and (util := self._utilization.latest) is not None:
                figures["gpu_util_percent"] = util
        return figures


class _GpuUtilization:
    """The GPU's utilisation (percent of the last sampling period it was busy), read every few seconds on a thread
    of its own: from NVML through torch where its bindings are installed, else from `nvidia-smi`; given up where
    neither answers."""

    def __init__(self, device: torch.device, every_s: float = 5.0):
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._torch_index = index
        # nvidia-smi numbers GPUs physically; CUDA_VISIBLE_DEVICES (which SLURM sets) renumbers them for torch.
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        self._smi_id = visible[index] if index < len(visible) else str(index)
        self.latest: float | None = None
        self._every_s = every_s
        threading.Thread(target=self._run, name="gpu-utilization", daemon=True).start()

    def _read(self) -> float | None:
        try:
            return float(torch.cuda.utilization(self._torch_index))
        except Exception:  # noqa: BLE001 - no NVML bindings: ask nvidia-smi
            pass
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                  f"--id={self._smi_id}"], capture_output=True, text=True, timeout=10,
                                 check=True).stdout
            return float(out.strip().splitlines()[0])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None

    def _run(self) -> None:
        while (value := self._read()) is not None:
            self.latest = value
            time.sleep(self._every_s)
