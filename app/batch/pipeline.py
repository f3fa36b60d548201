"""The Dataset: the listed paths in small blocks -> decode tasks (CPU) -> the scoring actor pool; `score` writes it as
Parquet and sums it up. Streaming: Ray Data holds a bounded number of blocks in flight, never the whole collection."""

from __future__ import annotations

import functools
import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pa_fs
import ray.data

from app.batch.decoding import decode_batch
from app.batch.output import PartWriter, file_batches
from app.batch.scoring import SCHEMA, Scorer
from app.batch.sizing import Pool
from app.batch.sources import Listed
from app.config import AppArgs
from app.runtime.model_files import ModelFiles
from app.served_model.model_io import transform_of
from app.served_model.source import is_remote

# Paths per input block: one decode task's work (~64 x 150 KB of pixels out for a 224 x 224 model).
BLOCK_PATHS = 64
MIN_STORE_BUDGET = 96 * 2**20
SUMMARY_COLUMNS = ["variant", "engine", "error_code", "decode_cpu_ms", "infer_cpu_ms"]


@dataclass(frozen=True)
class Job:
    """What to score: the app's arguments, the variants, the pool, how many classes per image."""

    args: AppArgs
    variants: list[str]
    pool: Pool
    top: int
    block_paths: int = BLOCK_PATHS
    extra: dict[str, Any] = field(default_factory=dict)

    def portable_args(self) -> dict[str, Any]:
        """The arguments with every path absolute: the actors may start in another working directory (a remote
        file's URI as it is: each scoring actor fetches it into its node's cache)."""
        dumped = self.args.model_dump(mode="json")

        def portable(path: str) -> str:
            return path if is_remote(path) else str(self.args.resolved_path(path))

        for v in dumped["variants"].values():
            v["model_path"] = portable(v["model_path"])
            if v.get("fallback"):
                v["fallback"]["model_path"] = portable(v["fallback"]["model_path"])
        if dumped["model"].get("labels_path"):
            dumped["model"]["labels_path"] = portable(dumped["model"]["labels_path"])
        return dumped


def model_transform(job: Job) -> dict[str, Any]:
    """The declared transform, read from the chosen variants' files on this machine (the driver; remote ones fetched
    into its model cache)."""
    local = ModelFiles.for_node(job.args).local_all(job.args, job.variants)
    try:
        files = [f for f in local.args.model_files() if f[0].split(".")[1] in job.variants]
        t = transform_of(local.args.model, files)
    finally:
        local.release()
    if t is None:
        raise FileNotFoundError(f"none of the model files is on this machine: {', '.join(str(p) for _, p in files)}")
    return t.to_dict()


def decode_here(batch: dict[str, Any], transform: dict[str, Any], limits: dict[str, Any]) -> dict[str, Any]:
    """`decode_batch` in a Ray task, with the node it ran on (where the work went: docs/batch.md)."""
    out = decode_batch(batch, transform, limits)
    out["decode_node"] = np.array([ray.get_runtime_context().get_node_id()] * len(out["path"]), dtype=object)
    return out


def store_budget(job: Job, transform: dict[str, Any]) -> int:
    """Object store bytes the Dataset may hold at once: room for eight batches per scoring actor, at least 96 MiB (ten
    64-image blocks of 224 x 224 pixels). Without a cap Ray Data lets the cheap decode run ahead of inference up to its
    share of the object store (30% of a node's memory), so the pixels waiting would grow with the collection; and the
    store's pages, once touched, stay with the machine and in every process that touched them (Ray frees objects, not
    the pages under them), so the smaller the set in flight, the sooner they stop growing (docs/batch.md "Measured")."""
    pixels = int(transform["height"]) * int(transform["width"]) * int(transform["channels"])
    return max(MIN_STORE_BUDGET, job.pool.actors * job.pool.batch_size * pixels * 8)


def scored(listed: Listed, job: Job) -> ray.data.Dataset:
    """The lazy Dataset of output rows (`app.batch.scoring` SCHEMA)."""
    transform = model_transform(job)
    ctx = ray.data.DataContext.get_current()  # the Dataset takes the driver's context when it is made, below
    limits = ctx.execution_options.resource_limits
    ctx.execution_options.resource_limits = limits.copy(object_store_memory=store_budget(job, transform))
    table = listed.table()
    blocks = [table.slice(i, job.block_paths) for i in range(0, table.num_rows, job.block_paths)]
    pool = job.pool
    return (
        ray.data.from_arrow(blocks)
        .map_batches(
            functools.partial(decode_here, transform=transform, limits=job.args.limits.model_dump()),
            batch_size=job.block_paths,  # one call a block: its pixels are the output block, never re-concatenated
            num_cpus=1,
            # A decode reserves the decode budget, as a Preprocessor's DecodeBudget holds one decode's worth per slot.
            # Asked of the decode tasks only, it also keeps Ray Data from fusing them into the scoring actors, where
            # decoding would run on the actors' (GPU nodes') few CPUs instead of in tasks across the cluster.
            memory=job.args.limits.max_decode_bytes,
        )
        .map_batches(
            Scorer,
            fn_constructor_kwargs={
                "args": job.portable_args(),
                "variants": job.variants,
                "top": job.top,
                "batch_size": pool.batch_size,
                "threads": pool.threads,
                "declaration": json.dumps(job.args.model.model_dump(mode="json"), sort_keys=True),
            },
            batch_size=pool.batch_size,
            zero_copy_batch=True,  # the actor only reads its batch: a view of the block, not a copy
            compute=ray.data.ActorPoolStrategy(size=pool.actors),
            num_cpus=pool.num_cpus,
            num_gpus=pool.num_gpus,
        )
    )


def score(listed: Listed, job: Job, output: str) -> dict[str, Any]:
    """Score every listed image with every variant into Parquet under `output` (`app.batch.output`: written here,
    on the driver, as the scored blocks arrive); the summary."""
    started = time.perf_counter()
    first: float | None = None  # when the first scored rows arrived: the Dataset's and the pool's start

    def timed(batches: Iterable[pa.Table]) -> Iterator[pa.Table]:
        nonlocal first
        for b in batches:
            if first is None:
                first = time.perf_counter() - started
            yield b

    with PartWriter(output, SCHEMA) as writer:
        writer.write_all(timed(scored(listed, job).iter_batches(batch_format="pyarrow", batch_size=None)))
    seconds = time.perf_counter() - started
    summary = summarize(writer.fs, writer.files, seconds, job)
    return summary | {"first_rows_s": None if first is None else round(first, 3)}


def summarize(fs: pa_fs.FileSystem, files: list[str], seconds: float, job: Job) -> dict[str, Any]:
    """Images, img/s, errors by code (per image), CPU-ms per image by stage, the engines that ran: read back from this
    run's Parquet files a record batch at a time (the driver's memory does not grow with the collection)."""
    first = job.variants[0]
    images, rows, decode_ms = 0, 0, 0.0
    errors: Counter[str] = Counter()
    infer: dict[str, list[float]] = {}  # variant -> [CPU-ms summed, images]
    engines: dict[str, str] = {}
    for batch in file_batches(fs, files, SUMMARY_COLUMNS):
        d = batch.to_pydict()
        rows += batch.num_rows
        for variant, engine, code, decode, inference in zip(
            d["variant"], d["engine"], d["error_code"], d["decode_cpu_ms"], d["infer_cpu_ms"], strict=True
        ):
            engines[variant] = engine
            if variant == first:
                images += 1
                decode_ms += decode
                if code:
                    errors[code] += 1
            if not code:
                total = infer.setdefault(variant, [0.0, 0])
                total[0], total[1] = total[0] + inference, total[1] + 1
    return {
        "images": images,
        "rows": rows,
        "variants": job.variants,
        "seconds": round(seconds, 3),
        "images_per_s": round(images / seconds, 2) if seconds > 0 else 0.0,
        "errors": dict(sorted(errors.items())),
        "cpu_ms_per_image": {
            "decode": round(decode_ms / max(1, images), 3),
            **{f"infer_{v}": round(ms / max(1, n), 3) for v, (ms, n) in infer.items()},
        },
        "engines": engines,
        "pool": job.pool.describe(),
        "files": len(files),
        **job.extra,
    }
