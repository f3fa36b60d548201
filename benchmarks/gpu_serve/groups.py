"""Where the node's CPU goes during a step, by process group: the Routers, the Preprocessors, each Classifier variant,
the app's side deployments, HAProxy, Serve's proxy and controller, Ray's own daemons, and wrk.

A group's CPU is the sum of its processes' user + system time (psutil cpu_times, benchmarks/cost.py) read before and
after the measured window; over the window's length that is cores used, and over the cores the group was given
(num_replicas x num_cpus, HAProxy's threads, wrk's threads) the share that says whether it was the limit: a group at
90% or more of its cores cannot go faster. A Ray worker's process title names it
(`ray::ServeReplica:<app>:<deployment>`, with `.<method>` while one runs; benchmarks/procs.py); HAProxy is the binary
the admission front execs in its own pid.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psutil

from benchmarks.cost import process_cpu_s
from benchmarks.gpu_serve.shape import CLASSIFIER, PREPROCESSOR, ROUTER
from benchmarks.procs import REPLICA_TITLE

HAPROXY, SERVE, RAY, WRK, SIDE = "HAProxy", "Serve proxy/controller", "Ray system", "wrk", "side deployments"
SERVE_ACTORS = ("ray::ServeController", "ray::ProxyActor", "ray::HAProxyManager")
# Ray's daemons and its other workers, by their command line: raylet, GCS, the dashboard and its agents, the log
# monitor, idle workers, and the `ray start --block` that holds them.
RAY_SYSTEM = re.compile(r"raylet|gcs_server|dashboard|runtime_env|log_monitor|monitor\.py|ray\.scripts\.scripts|^ray::")
SATURATED = 0.9  # a group using this share of its cores or more is the limit


def group_of(argv: Sequence[str]) -> str | None:
    """The group of a process from its command line (a Ray worker's argv[0] is its title); None: not the node's."""
    title = argv[0] if argv else ""
    if title.startswith(REPLICA_TITLE):
        parts = re.split(r"[:#]", title[len(REPLICA_TITLE) :].strip(), maxsplit=1)
        deployment = re.split(r"[.\s#]", parts[-1], maxsplit=1)[0]
        return deployment if deployment in (ROUTER, PREPROCESSOR) or deployment.startswith(CLASSIFIER) else SIDE
    if title.startswith(SERVE_ACTORS):
        return SERVE
    name = os.path.basename(title.split()[0]) if title.strip() else ""
    if name == "haproxy":
        return HAPROXY
    if name == "wrk":
        return WRK
    return RAY if RAY_SYSTEM.search(" ".join(argv)) else None


def classify(table: Mapping[int, Sequence[str]]) -> dict[int, str]:
    """{pid: group} of the processes of a table ({pid: argv}) that belong to a group."""
    return {pid: g for pid, argv in table.items() if (g := group_of(argv)) is not None}


Reading = dict[tuple[int, float], tuple[str, float]]  # (pid, creation time) -> (group, CPU seconds so far)


def read_cpu(pids: Iterable[int]) -> Reading:
    """Each grouped process's CPU seconds so far (processes gone meanwhile, or in no group, are left out)."""
    out: Reading = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            group = group_of(p.cmdline())
            if group is not None:
                out[(pid, p.create_time())] = (group, process_cpu_s(p))
    return out


def cpu_by_group(before: Reading, after: Reading) -> dict[str, float]:
    """CPU seconds per group between two readings: a process in `after` only started in between (all of its CPU);
    one in `before` only ended in between (its last part is not known, so it counts nothing)."""
    out: dict[str, float] = {}
    for key, (group, cpu) in after.items():
        spent = cpu - before[key][1] if key in before else cpu
        out[group] = out.get(group, 0.0) + max(0.0, spent)
    return out


def usage(cpu_s: dict[str, float], window_s: float, given: dict[str, float | None]) -> dict[str, dict[str, Any]]:
    """Per group: CPU seconds, cores used over the window, the cores it was given (None: nothing reserved for it) and
    the share of them used. Groups given cores but unseen are listed with 0."""
    out = {}
    for group in [*given, *sorted(set(cpu_s) - set(given))]:
        spent, cores = cpu_s.get(group, 0.0), given.get(group)
        used = spent / window_s if window_s > 0 else None
        share = used / cores if used is not None and cores else None
        out[group] = {"cpu_s": round(spent, 3), "cores_used": _r(used), "cores_given": cores, "share": _r(share)}
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def saturated(groups: dict[str, dict[str, Any]], threshold: float = SATURATED) -> list[tuple[str, float]]:
    """The groups at `threshold` of their cores or more, the busiest first."""
    full = [(g, u["share"]) for g, u in groups.items() if u.get("share") is not None and u["share"] >= threshold]
    return sorted(full, key=lambda x: -x[1])


def given_cores(deployments: dict[str, float], haproxy_threads: int, wrk_threads: int) -> dict[str, float | None]:
    """The cores each group was given: the deployments' (num_replicas x num_cpus), HAProxy's threads, wrk's threads;
    Serve's actors, the side deployments and Ray's daemons get none of their own (num_cpus 0)."""
    out: dict[str, float | None] = {n: c for n, c in deployments.items() if n in (ROUTER, PREPROCESSOR)}
    out |= {n: c for n, c in deployments.items() if n.startswith(CLASSIFIER)}
    return out | {HAPROXY: float(haproxy_threads), SERVE: None, SIDE: None, RAY: None, WRK: float(wrk_threads)}
