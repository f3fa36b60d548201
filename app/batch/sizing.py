"""The scoring actor pool, from the cluster's nodes and the Serve config (pure: no Ray).

On a cluster with GPUs an actor asks for what a Classifier replica of the config asks for (its `num_gpus`, at least
one variant's worth; its `num_cpus`), and there are as many actors as the GPUs hold.

On CPU nodes (of at least 2 CPUs) the engines take every core, in several actors of few threads each: one engine thread
an actor up to 8 cores a node, then ceil(cores / 8) threads, as many actors as that fills the node's cores. One engine
of all the cores loses to them: its threads wait at every parallel step for the one a decode task preempted (on 2 cores,
1 actor of 2 threads did 13.2-15.9 CPU-ms an image, 2 actors of 1 thread 12.4-13.0, and 5-10% more images a second:
docs/batch.md "Measured"). Ray's logical CPUs are split, not the cores: the actors reserve half of a node's CPUs between
them and the decode tasks the other half (a decode costs a sixth of an inference; the OS shares the cores). Nodes of
one CPU: an actor takes a whole node, at most half of them, and the decode tasks the rest."""

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
        num_cpus, per_node, engine_threads = cpu_actors(math.floor(min(cores)))
        # A node's share, on each node; on 1-CPU nodes never more than half of them (two such nodes: one actor).
        default_actors = per_node * len(cores) if per_node > 1 or min(cores) >= 2 else max(1, len(cores) // 2)
    actors = default_actors if actors is None else actors
    if actors < 1:
        raise ValueError(f"--actors must be at least 1, got {actors}")
    threads = args.intra_op_threads or threads_for(num_cpus)
    if gpus_per_actor == 0 and args.intra_op_threads is None:
        threads = engine_threads
    return Pool(actors, num_cpus, gpus_per_actor, threads, batch_size or batch)


def cpu_actors(cores: int) -> tuple[float, int, int]:
    """(logical CPUs an actor reserves, actors a node, engine threads an actor) on CPU nodes of `cores` CPUs."""
    if cores < 2:
        return 1.0, 1, 1
    threads = max(1, math.ceil(cores / 8))
    per_node = max(1, cores // threads)
    return (cores / 2) / per_node, per_node, threads
