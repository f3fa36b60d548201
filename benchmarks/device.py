"""Where inference runs: --device cpu|cuda|auto, and what the GPU holds (a process's own memory: benchmarks.procs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from app.runtime import RuntimeOptions


def runtime_options(device: str, threads: int | None = None) -> RuntimeOptions:
    """cuda insists on the GPU (loading fails without one), auto uses one when /dev has an NVIDIA device."""
    prefer_gpu = device == "cuda" or (device == "auto" and any(Path("/dev").glob("nvidia[0-9]*")))
    return RuntimeOptions(threads=threads or os.cpu_count() or 1, prefer_gpu=prefer_gpu, require_gpu=device == "cuda")


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
