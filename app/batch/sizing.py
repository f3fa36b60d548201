"""The scoring actor pool, from the cluster's nodes and the Serve config (pure: no Ray).

On a cluster with GPUs an actor asks for what a Classifier replica of the config asks for (its `num_gpus`, at least
one variant's worth; its `num_cpus`), and there are as many actors as the GPUs hold. On CPU nodes an actor reserves half
of a node's cores, one actor a node (at most half the cluster's CPUs), and the decode tasks have the rest; the engine's
threads still span the node's cores (inference is most of the work)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from app.config import AppArgs, ClassifierConfig, classifier_deployment_name
from app.runtime import threads_for


@dataclass(frozen=True)
class Pool:
    actors: int
    num_cpus: float
    num_gpus: float
    threads: int  # each engine's intra-op threads
    batch_size: int  # images per engine call

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def _deployment(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    for app in cfg.get("applications") or []:
        for d in app.get("deployments") or []:
            if d.get("name") == name:
                return dict(d)
    return {}


def classifier_asks(cfg: dict[str, Any], variants: list[str]) -> tuple[float, float, int]:
    """(num_cpus, num_gpus, max_batch_size): the most any of the variants' Classifier deployments asks for."""
    cpus, gpus, batch = 0.0, 0.0, 0
    for v in variants:
        d = _deployment(cfg, classifier_deployment_name(v))
        options = d.get("ray_actor_options") or {}
        cpus = max(cpus, float(options.get("num_cpus", 1.0)))
        gpus = max(gpus, float(options.get("num_gpus", 0.0)))
        batch = max(batch, ClassifierConfig.model_validate(d.get("user_config") or {}).max_batch_size)
    return cpus, gpus, batch


def size_pool(
    nodes: list[dict[str, float]],
    cfg: dict[str, Any],
    args: AppArgs,
    variants: list[str],
    actors: int | None = None,
    gpus_per_actor: float | None = None,
    batch_size: int | None = None,
) -> Pool:
    """The pool for the alive nodes' resources (`ray.nodes()`' "Resources"); the flags, where given, win."""
    cpus, gpus, batch = classifier_asks(cfg, variants)
    total_gpus = sum(n.get("GPU", 0.0) for n in nodes)
    if gpus_per_actor is None:
        gpus_per_actor = (gpus or 1.0) if total_gpus > 0 else 0.0
    if gpus_per_actor < 0:
        raise ValueError(f"--gpus-per-actor must be at least 0, got {gpus_per_actor}")
    if gpus_per_actor > 0:
        num_cpus = max(1.0, cpus)
        default_actors = max(1, math.floor(total_gpus / gpus_per_actor + 1e-9))
    else:
        cores = [n.get("CPU", 0.0) for n in nodes if n.get("CPU", 0.0) >= 1]
        if not cores:
            raise ValueError("no node offers a CPU or a GPU to score on")
        num_cpus = float(max(1, math.floor(min(cores) / 2)))
        # One a node, but never more than half the CPUs in all: the decode tasks need the rest (two 1-CPU nodes: one).
        default_actors = max(1, min(len(cores), math.floor(sum(cores) / (2 * num_cpus))))
    actors = default_actors if actors is None else actors
    if actors < 1:
        raise ValueError(f"--actors must be at least 1, got {actors}")
    threads = args.intra_op_threads or threads_for(num_cpus)
    if gpus_per_actor == 0 and args.intra_op_threads is None:
        # On a CPU node the engine takes every core, as the single-process `report` does: a decode costs a fraction of
        # an inference (docs/batch.md "Measured"), so the decode tasks' share of the cores idles most of the time.
        threads = max(1, math.floor(min(n.get("CPU", 0.0) for n in nodes if n.get("CPU", 0.0) >= 1)))
    return Pool(actors, num_cpus, gpus_per_actor, threads, batch_size or batch)
