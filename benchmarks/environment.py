"""What a benchmark ran on, printed first and stored beside every result. Versions come from package metadata,
so describing the environment imports neither Ray nor ONNX Runtime."""

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

import psutil

from benchmarks.device import nvidia_smi

PACKAGES = "ray onnxruntime-gpu onnxruntime openvino numpy opencv-python-headless fastapi uvicorn".split()  # noqa: SIM905
REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M) if cpuinfo.is_file() else None
    return found[1].strip() if found else platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may run on (its affinity), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else psutil.cpu_count() or 1


def host_name() -> str:
    """The host name made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"


def stamp() -> str:
    """Date and time for result file names: runs on one day do not overwrite each other."""
    return datetime.now().strftime("%Y-%m-%d-%H%M%S")


def describe_environment() -> dict[str, Any]:
    installed = {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}
    versions = {name: installed[name] for name in PACKAGES if name in installed}
    gpus = [row for row in nvidia_smi("--query-gpu=name,memory.total,driver_version") or [] if len(row) == 3]
    return {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "logical_cpus": psutil.cpu_count(),
        "usable_cpus": usable_cores(),
        "memory_total_mb": psutil.virtual_memory().total / 2**20,
        "load_average_1_5_15": [round(x, 2) for x in psutil.getloadavg()],
        "gpus": [f"{name}, {mem} MiB, driver {driver}" for name, mem, driver in gpus],
        "packages": versions,
    }


def format_environment(env: dict[str, Any]) -> str:
    mem = f"{env['memory_total_mb'] / 1024:.1f} GiB" if env.get("memory_total_mb") else "?"
    return (
        f"host      {env['host']}  ({env['platform']}, Python {env['python']})\n"
        f"cpu       {env['cpu_model']}: {env['usable_cpus']} usable of {env['logical_cpus']} logical, {mem} RAM\n"
        f"load avg  {env['load_average_1_5_15']}  (other work on this machine makes the numbers noisier)\n"
        f"gpu       {'; '.join(env['gpus']) or 'none'}\n"
        f"packages  {', '.join(f'{k} {v}' for k, v in env['packages'].items())}"
    )


def print_environment() -> dict[str, Any]:
    env = describe_environment()
    print(format_environment(env), flush=True)
    return env
