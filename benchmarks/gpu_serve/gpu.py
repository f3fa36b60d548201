"""The node's GPUs: how many (Ray's --num-gpus), and what they did during a step (nvidia-smi every 500 ms).

Utilisation is the share of time a kernel ran (nvidia-smi's utilization.gpu), not of the GPU's capacity: a GPU at
40% waits for work more than half the time, which says the serving path, not the GPU, sets the pace.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from typing import IO, Any

from benchmarks.device import nvidia_smi

QUERY = ["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-lms", "500"]


def gpu_count() -> int:
    """GPUs nvidia-smi lists (0 without it or a driver)."""
    return len(nvidia_smi("--query-gpu=index") or [])


def summarise(lines: Iterable[str]) -> dict[str, Any] | None:
    """`util, memory` lines (one per GPU per sample) -> mean and max utilisation (%), max and mean memory used
    (MiB); None when no line parsed (no GPU: the report says n/a)."""
    util, mem = [], []
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        with contextlib.suppress(ValueError):
            if len(fields) == 2:
                u, m = float(fields[0]), float(fields[1])
                util.append(u)
                mem.append(m)
    if not util:
        return None
    return {
        "samples": len(util),
        "util_mean_pct": round(sum(util) / len(util), 1),
        "util_max_pct": max(util),
        "mem_used_max_mib": max(mem),
        "mem_used_mean_mib": round(sum(mem) / len(mem), 1),
    }


class Sampler:
    """nvidia-smi's loop in the background while a step runs: start(), then stop() -> summarise()'s figures."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.out: IO[bytes] | None = None

    def start(self) -> None:
        if shutil.which("nvidia-smi") is None:
            return
        self.out = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop(): it outlives this call)
        self.proc = subprocess.Popen(["nvidia-smi", *QUERY], stdout=self.out, stderr=subprocess.DEVNULL)

    def stop(self) -> dict[str, Any] | None:
        if self.proc is None or self.out is None:
            return None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.out.seek(0)
        text = self.out.read().decode(errors="replace")
        self.out.close()
        self.proc = self.out = None
        return summarise(text.splitlines())
