"""Where inference runs: --device cpu|cuda|auto, and what a process holds in host and device memory."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psutil

from app.runtime import RuntimeOptions


def runtime_options(device: str, threads: int | None = None) -> RuntimeOptions:
    """cuda insists on the GPU (loading fails without one), auto uses one when /dev has an NVIDIA device."""
    prefer_gpu = device == "cuda" or (device == "auto" and any(Path("/dev").glob("nvidia[0-9]*")))
    return RuntimeOptions(threads=threads or os.cpu_count() or 1, prefer_gpu=prefer_gpu, require_gpu=device == "cuda")


def rss_mib() -> float:
    """Resident memory of this process."""
    return float(psutil.Process().memory_info().rss / 2**20)


def peak_rss_mib(pid: int | str = "self") -> float | None:
    """VmHWM, the peak RSS since start or reset_peak_rss (psutil has no equivalent); None when it is gone."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        return None


def reset_peak_rss() -> bool:
    """Make VmHWM start again from the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def nvidia_smi(*query: str) -> list[list[str]] | None:
    """Rows of `nvidia-smi <query> --format=csv,noheader,nounits`; None without nvidia-smi or a driver."""
    if shutil.which("nvidia-smi") is None:
        return None
    cmd = ["nvidia-smi", *query, "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_used_mib(index: int = 0) -> float | None:
    """Memory in use on the whole device (every process); None without nvidia-smi."""
    rows = nvidia_smi("--query-gpu=index,memory.used") or []
    return next((float(r[1]) for r in rows if len(r) == 2 and r[0] == str(index)), None)
