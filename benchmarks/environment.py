"""What a benchmark ran on: printed first and stored beside every result.

Versions come from package metadata, so describing the environment imports neither Ray nor ONNX Runtime.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.device import nvidia_smi

PACKAGES = (
    "ray",
    "onnxruntime-gpu",
    "onnxruntime",
    "numpy",
    "opencv-python-headless",
    "opencv-python",
    "fastapi",
    "uvicorn",
    "aiohttp",
)
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def memory_total_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def gpus() -> list[str]:
    """GPU names and memory from nvidia-smi, [] when there is none (or no driver)."""
    rows = nvidia_smi("--query-gpu=name,memory.total,driver_version")
    return [f"{name}, {mem} MiB, driver {driver}" for name, mem, driver in (r for r in rows or [] if len(r) == 3)]


def host_name() -> str:
    """The host name made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"


def stamp(now: datetime | None = None) -> str:
    """Date and time for result file names: runs on one day do not overwrite each other."""
    return (now or datetime.now()).strftime("%Y-%m-%d-%H%M%S")


def describe_environment() -> dict[str, Any]:
    return {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable_cores(),
        "memory_total_mb": memory_total_mb(),
        "load_average_1_5_15": load_average(),
        "gpus": gpus(),
        "packages": package_versions(),
    }


def format_environment(env: dict[str, Any]) -> str:
    pkgs = ", ".join(f"{k} {v}" for k, v in env["packages"].items())
    mem = f"{env['memory_total_mb'] / 1024:.1f} GiB" if env.get("memory_total_mb") else "?"
    lines = [
        f"host      {env['host']}  ({env['platform']}, Python {env['python']})",
        f"cpu       {env['cpu_model']}: {env['usable_cpus']} usable of {env['logical_cpus']} logical, {mem} RAM",
        f"load avg  {env['load_average_1_5_15']}  (other work on this machine makes the numbers noisier)",
        f"gpu       {'; '.join(env['gpus']) or 'none'}",
        f"packages  {pkgs}",
    ]
    return "\n".join(lines)


def print_environment(env: dict[str, Any] | None = None) -> dict[str, Any]:
    env = env or describe_environment()
    print(format_environment(env), flush=True)
    return env
