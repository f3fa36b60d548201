"""Where inference runs: --device cpu|cuda|auto, and what a process holds in host and device memory."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from app.runtime import RuntimeOptions

DEVICES = ("cpu", "cuda", "auto")


def gpu_visible() -> bool:
    """An NVIDIA device node exists, so trying CUDA is worth ONNX Runtime's loud failure when it is not."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


def runtime_options(device: str, threads: int | None = None) -> RuntimeOptions:
    """cuda insists on the GPU (loading fails without one), auto uses one when it sees one, cpu never does."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
    prefer_gpu = device == "cuda" or (device == "auto" and gpu_visible())
    return RuntimeOptions(threads=threads or os.cpu_count() or 1, prefer_gpu=prefer_gpu, require_gpu=device == "cuda")


def proc_status_kib(key: str) -> int | None:
    """A `Vm*` line of /proc/self/status in KiB (VmRSS: resident now, VmHWM: resident peak)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
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
    try:
        out = subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_memory_mib(pid: int | None = None) -> float | None:
    """Device memory this process holds (nvidia-smi); None without nvidia-smi or when it cannot see our pid
    (common in containers: then use gpu_used_mib before and after)."""
    rows = nvidia_smi("--query-compute-apps=pid,used_memory")
    pid = pid or os.getpid()
    used = [float(r[1]) for r in rows or [] if len(r) == 2 and r[0].isdigit() and int(r[0]) == pid]
    return sum(used) if used else None


def gpu_used_mib(index: int = 0) -> float | None:
    """Memory in use on the whole device (every process), from nvidia-smi; None without it."""
    rows = nvidia_smi("--query-gpu=index,memory.used")
    found = [float(r[1]) for r in rows or [] if len(r) == 2 and r[0] == str(index)]
    return found[0] if found else None
