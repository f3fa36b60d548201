"""The Classifier deployment: one model variant on the fastest correct engine of its node, batched.

A replica owns its collaborators: the engine (`VariantEngine`: opened, warmed up, measured and gated at start), the
batch decoder (`BatchDecoder`: host pixels, or decode_in: gpu's encoded images decoded in the batch) and Serve's
dynamic batching, which this class sets from the live user_config and runs: a request's images are split into engine
batches, each batch decoded and run in one call, and the request's rows joined back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
from pydantic import ValidationError
from ray import serve

from app.config import AppArgs, ClassifierConfig
from app.config.app_file import errors_line
from app.config.classifier import VERSION_KEYS
from app.errors import ServiceError
from app.imaging.payloads import Encoded, Pixels, Scores
from app.runtime import top_k
from app.serve import batch_trace
from app.serve.batch_decoder import BatchDecoder, Done, Item, join, split
from app.serve.metrics import ClassifierMetrics
from app.serve.model_release import Releases
from app.serve.serve_internals import max_ongoing_requests, replica_id
from app.serve.tracing import turn_on_here
from app.serve.variant_engine import VariantEngine
from app.tracing import spans

logger = logging.getLogger("ray.serve")


def _flush_log() -> None:
    """Serve's throughput-optimised mode (configs/serve.env) buffers a replica's log records, 1,000 at a time
    (RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE): flushed here, the engine's start-up story (what runs, a fallback and why,
    CUDA graphs) is in the replica's log file when it starts serving, not after its thousandth request."""
    for handler in logger.handlers:
        handler.flush()


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


@serve.deployment(name="Classifier", ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=32)
class Classifier:
    """One model variant behind dynamic batching; the engine is chosen, checked and measured at start.

    The engine is opened by the first `reconfigure` (Serve runs it before the replica takes traffic):
    how many batches run in parallel is a live user_config setting, and OpenVINO compiles for it.
    """

    def __init__(self, variant: str, args: dict[str, Any], transform: dict[str, Any] | None = None) -> None:
        """transform: the model's, as the deploy read it (VariantEngine checks this node's file against it)."""
        turn_on_here()
        self.variant = variant
        self.args = AppArgs.model_validate(args)
        num_cpus = float(ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0))
        gpu = bool(ray.get_gpu_ids())
        self.replica_id = replica_id()
        self.metrics = ClassifierMetrics(self.args.model.name)
        self.versions = Releases(self.args, variant, transform, gpu, num_cpus, self.metrics)
        self.decoder = BatchDecoder.for_replica(self.args, variant, gpu, num_cpus, self.metrics)
        self.cfg: ClassifierConfig | None = None
        self._batch: Callable[[Item], Awaitable[Done]] | None = None
        self._executor: ThreadPoolExecutor | None = None

    # -- configuration (live) ------------------------------------------------------

    @property
    def model(self) -> VariantEngine:
        """The serving version's engine."""
        assert self.versions.serving is not None, "reconfigure opens the model before any request"
        return self.versions.serving.engine

    def reconfigure(self, config: dict[str, Any]) -> None:
        """At start (before any request) and on every user_config change: the model version it names (a new one is
        released in place, `app.serve.model_release`), then the batching. Serve runs it in a thread of the replica
        (a plain method), so the event loop keeps serving while a new version is prepared."""
        cfg = self._checked(self._validated(config or {}))
        versions = self.versions
        opening = False
        if versions.serving is None:
            versions.start(cfg)  # a failure of the args' version fails the replica, one line naming the URI
            opening = True
        elif (version := versions.wanted(cfg)) is not None:
            t0 = time.perf_counter()
            new = versions.release(cfg, version)  # warmed up and measured: no reopen below
            if new is not None:  # from the next batch on (each batch takes the version serving when it starts)
                versions.switched(new, t0)
            elif self.model.needs_reopen(cfg, self.cfg):  # refused: the serving engine takes the batching as asked
                self.model.open(cfg)
                opening = True
        elif self.model.needs_reopen(cfg, self.cfg):
            self.model.open(cfg)
            opening = True
        model = self.model
        self._set_batching(cfg)
        self.decoder.open(cfg, model.io, model.engine, self.args.limits)
        if cfg.warmup:
            model.warm_up(cfg.max_batch_size)
        if opening:  # a reopened engine may be another one (auto chooses again): its own figures, not the last's
            model.measure(cfg)
            _flush_log()
        if cfg.profile_batches != (self.cfg.profile_batches if self.cfg else 0) and cfg.profile_batches > 0:
            model.start_profile(cfg.profile_batches, cfg.profile_dir, self.replica_id)
        self.cfg = cfg
        logger.info(
            "Classifier_%s batching: max_batch_size=%d batch_wait_timeout_s=%s max_concurrent_batches=%d",
            self.variant,
            cfg.max_batch_size,
            cfg.batch_wait_timeout_s,
            cfg.max_concurrent_batches,
        )

    def _validated(self, config: dict[str, Any]) -> ClassifierConfig:
        """The user_config; live, a malformed model version (a bad digest, plain http) is a refused release, not a
        failed replica: the rest applies and the serving version stays."""
        try:
            return ClassifierConfig.model_validate(config)
        except ValidationError as e:
            if self.cfg is None or not any(k in config for k in VERSION_KEYS):
                raise
            rest = ClassifierConfig.model_validate({k: v for k, v in config.items() if k not in VERSION_KEYS})
            self.versions.refuse_malformed({k: config.get(k) for k in VERSION_KEYS}, errors_line(e, "user_config"))
            return rest.model_copy(update=self.versions.asked)

    def _checked(self, cfg: ClassifierConfig) -> ClassifierConfig:
        """At deploy a bad value fails the replica, naming the field; live it is logged (and clamped)."""
        problems = self.args.batching_problems(self.variant, cfg, max_ongoing_requests())
        if problems and self.cfg is None:
            raise ValueError(f"Classifier_{self.variant}: {'; '.join(problems)}")
        for problem in problems:
            logger.warning("Classifier_%s: %s (live change; `python -m app.config` checks it)", self.variant, problem)
        if self.args.may_use_tensorrt(self.variant):
            cfg = cfg.model_copy(update={"max_batch_size": min(cfg.max_batch_size, self.args.tensorrt.max_batch_size)})
        return cfg

    def _set_batching(self, cfg: ClassifierConfig) -> None:
        if self._batch is None or self.cfg is None or cfg.max_concurrent_batches != self.cfg.max_concurrent_batches:
            # max_concurrent_batches has no live setter in serve.batch: make a new batcher (old one drains).
            if self._executor is not None:
                self._executor.shutdown(wait=False)  # its queued batches still finish
            self._executor = ThreadPoolExecutor(cfg.max_concurrent_batches, thread_name_prefix="engine")
            self._batch = serve.batch(
                max_batch_size=cfg.max_batch_size,
                batch_wait_timeout_s=cfg.batch_wait_timeout_s,
                max_concurrent_batches=cfg.max_concurrent_batches,
                batch_size_fn=lambda items: sum(len(it) for it in items),
            )(self._run_batch)
        else:
            self._batch.set_max_batch_size(cfg.max_batch_size)  # type: ignore[attr-defined]
            self._batch.set_batch_wait_timeout_s(cfg.batch_wait_timeout_s)  # type: ignore[attr-defined]

    # -- requests ---------------------------------------------------------------------

    async def __call__(
        self, pixels: Pixels | Encoded, top: int, full: bool = False, rows: list[int] | None = None
    ) -> Scores:
        """Top-k per image; with `full`, the whole logits rows too (for the V2 protocol's outputs).

        `pixels`: decoded, or (decode_in: gpu) encoded images this replica's batch decodes. `rows` picks some of the
        decoded images (a shadow run compares only the sampled ones).
        """
        assert self._batch is not None and self.cfg is not None, "reconfigure runs before any request"
        io = self.model.io
        items = split(pixels, rows, time.perf_counter(), self.cfg.max_batch_size, io)
        if spans.ENABLED:  # each item carries its request's span into the batch (batch_trace)
            trace = spans.current()
            for it in items:
                it.trace = trace
        done = await asyncio.gather(*(self._batch(it) for it in items))
        logits, errors, positions, preprocess_ms = join(pixels, done, rows)
        best = [top_k(row, top) for row in io.probabilities(logits)] if logits is not None else []
        return Scores(
            top=best,
            preprocess_ms=preprocess_ms,
            queue_ms=max((d.queue_ms for d in done), default=0.0),
            inference_ms=sum(d.inference_ms for d in done),
            batch_size=max((d.batch_size for d in done), default=0),
            variant=self.variant,
            provider=self.model.engine.active_provider,
            errors=errors,
            positions=positions,
            logits=logits if full else None,
        )

    async def _run_batch(self, items: list[Item]) -> list[Done]:
        version = self.versions.serving
        assert version is not None
        version.enter()  # the batch keeps this version's engine open until it is done, even if a release switches
        try:
            return await self._run_on(version.engine, items, version.files.model.sha256)
        finally:
            version.leave()

    async def _run_on(self, model: VariantEngine, items: list[Item], sha256: str | None = None) -> list[Done]:
        arrived = time.perf_counter()
        decoder = self.decoder
        with decoder.device_batch(items) as batch:  # decode_in: gpu, device mode: the batch's pixels stay on the device
            decoded = await decoder.decode(items, model.io, self._executor, batch)  # the whole batch in one call
            started = time.perf_counter()
            x, picks = decoder.engine_input(items, decoded, batch, model.io.transform.shape)
            # Engines release the GIL; running them off the event loop keeps requests flowing into the queue. With CUDA
            # graphs the engine's own slot threads run the batch: its graphs live on them.
            executor = model.engine.executor or self._executor
            n = len(x)
            loop = asyncio.get_running_loop()
            logits = await loop.run_in_executor(executor, model.infer, x) if n else np.zeros((0, len(model.io.labels)))
        ended = time.perf_counter()
        inference_ms = _ms(ended - started)
        if n:
            self.metrics.record_batch(self.variant, n, inference_ms)
        if spans.ENABLED:
            name = (self.args.model.name, sha256)
            batch_trace.record(items, self.variant, model.engine, name, (arrived, started, ended), n)
        out = []
        for it, pick, d in zip(items, picks, decoded, strict=True):
            queue_ms = _ms(arrived - it.arrived)
            if isinstance(d, ServiceError):
                out.append(Done(logits[:0], queue_ms, 0.0, n, error=d))
            else:
                out.append(Done(logits[pick], queue_ms, inference_ms, n, d))
        return out

    # -- what it says of itself --------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        cfg = self.cfg or ClassifierConfig()
        model = self.model
        return {
            **model.describe(),
            "model_version": self.versions.describe(),
            "batching": {
                "max_batch_size": cfg.max_batch_size,
                "batch_wait_timeout_s": cfg.batch_wait_timeout_s,
                "max_concurrent_batches": cfg.max_concurrent_batches,
            },
            "warmed_up_to": model.warmed_to,
            "gpu_decode": self.decoder.describe(),
            "profiling": model.profile.state() if model.profile is not None else None,
            "input": model.io.describe(self.args.model),
            "replica_id": self.replica_id,
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    def labels(self) -> list[str]:
        """One label per class (the declaration's file, ImageNet-1k's for 1000 classes, else class_<i>)."""
        return self.model.io.labels

    def ready(self) -> bool:
        return self.versions.serving is not None and self.model.ready(self.cfg)

    def check_health(self) -> None:
        if self.versions.serving is not None and self.model.opened is not None and not self.model.engine.alive:
            raise RuntimeError(f"Classifier_{self.variant}: the engine is gone")
