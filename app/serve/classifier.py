"""The Classifier deployment: one model variant on the fastest correct engine of its node, batched."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
from ray import serve

from app.config import AppArgs, ClassifierConfig
from app.errors import ServiceError
from app.imaging.payloads import Encoded, Pixels, Scores
from app.model.model_io import ModelIO, check_transform, model_io
from app.runtime import ModelLoadError, Opened, threads_for, top_k
from app.runtime.open_variant import gate_failure, gate_variant, open_variant
from app.runtime.startup import StartupReport, start_report
from app.serve.classifier_decode import Done, GpuDecoding, Item
from app.serve.classifier_report import ClassifierReport
from app.serve.device_mode import OnDevice, engine_logits, host_pixels
from app.serve.metrics import ClassifierMetrics
from app.serve.profiling_twin import ProfilingTwin
from app.serve.serve_internals import max_ongoing_requests, replica_id

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
class Classifier(GpuDecoding, ClassifierReport):
    """One model variant behind dynamic batching; the engine is chosen, checked and measured at start.

    The engine is opened by the first `reconfigure` (Serve runs it before the replica takes traffic):
    how many batches run in parallel is a live user_config setting, and OpenVINO compiles for it.
    """

    def __init__(self, variant: str, args: dict[str, Any], transform: dict[str, Any] | None = None) -> None:
        """transform: the model's, as the deploy read it from its copy of the files and handed to the Router (None:
        not read there); this node's file must give the same, or every decode would be refused."""
        self.variant = variant
        self.args = AppArgs.model_validate(args)
        path = self.args.resolved_path(self.args.variants[variant].model_path)
        # The graph as declared (args.model): checked against the declaration, its normalisation folded in. Raised
        # here, a contradiction fails the replica naming the field (`serve status` shows it).
        where = f"Classifier_{variant}: variants.{variant}.model_path"
        self.io: ModelIO = model_io(self.args.model, path, where)
        check_transform(transform, self.io.transform, where)
        self.requested_io = self.io  # self.io becomes the fallback's when the variant's declared fallback serves
        resources = ray.get_runtime_context().get_assigned_resources()
        self.num_cpus = float(resources.get("CPU", 1.0))
        self.gpu = bool(ray.get_gpu_ids())
        self.threads = self.args.intra_op_threads or threads_for(self.num_cpus)
        self.replica_id = replica_id()
        self.opened: Opened | None = None
        self.report: StartupReport | None = None
        self.cfg: ClassifierConfig | None = None
        self._batch: Callable[[Item], Awaitable[Done]] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._warmed_to = 0
        self._profile: ProfilingTwin | None = None
        self.metrics = ClassifierMetrics(self.args.model.name)
        self._check_gpu_decode()

    # -- configuration (live) ------------------------------------------------------

    def reconfigure(self, config: dict[str, Any]) -> None:
        cfg = self._checked(ClassifierConfig.model_validate(config or {}))
        opening = self.opened is None or self._needs_reopen(cfg)
        if opening:
            self._open(cfg)
        self._set_batching(cfg)
        self._open_gpu_decode(cfg)
        if cfg.warmup and self._warmed_to < cfg.max_batch_size:
            self._warm_up(cfg.max_batch_size)
        if opening:  # a reopened engine may be another one (auto chooses again): its own figures, not the last's
            self._measure(cfg)
            _flush_log()
        if cfg.profile_batches != (self.cfg.profile_batches if self.cfg else 0) and cfg.profile_batches > 0:
            assert self._profile is not None
            self._profile.start(cfg.profile_batches, cfg.profile_dir, self.replica_id)
        self.cfg = cfg
        logger.info(
            "Classifier_%s batching: max_batch_size=%d batch_wait_timeout_s=%s max_concurrent_batches=%d",
            self.variant,
            cfg.max_batch_size,
            cfg.batch_wait_timeout_s,
            cfg.max_concurrent_batches,
        )

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

    def _needs_reopen(self, cfg: ClassifierConfig) -> bool:
        """OpenVINO is compiled for a number of parallel calls, and with CUDA graphs each batch slot is a session and a
        thread of its own: both open again for another max_concurrent_batches. Plain ONNX Runtime serves any number."""
        return (
            bool(getattr(self.engine, "fixed_parallel", False))
            and self.cfg is not None
            and (cfg.max_concurrent_batches != self.cfg.max_concurrent_batches)
        )

    def _open(self, cfg: ClassifierConfig) -> None:
        streams, max_batch = cfg.max_concurrent_batches, cfg.max_batch_size
        try:
            o = open_variant(
                self.args, self.variant, self.gpu, self.threads, streams, max_batch, requested=self.requested_io
            )
        except ModelLoadError as e:
            # Raised at start, this fails the replica; `serve status` shows the message.
            raise RuntimeError(f"Classifier_{self.variant}: {e}") from e
        opened, opts = o.opened, o.opts  # the fallback's options when it serves (select.open_engine logged why)
        old, self.opened = self.opened, opened
        if old is not None:
            old.engine.close()  # released once the batches running on it are done (OrtEngine.close)
        self._warmed_to = 0
        self.io = o.io
        chosen = next((c for c in opened.plan.candidates if c.engine == opened.engine.name), opened.plan.candidates[0])
        self._profile = ProfilingTwin(self.variant, str(self.io.served.path), opts, chosen)
        self._report_provider()
        described = self.engine.describe()
        logger.info(
            "Classifier_%s loaded %s (%s) on %s (%s), %d threads x %d parallel batches; CUDA graphs: %s",
            self.variant,
            self.io.served.path,
            opts.precision,
            self.engine.name,
            described.get("nodes_per_provider") or self.engine.active_provider,
            opts.threads,
            opts.streams,
            (described.get("cuda_graphs") or {}).get("graph_batch_sizes", "off"),
        )

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

    def _warm_up(self, up_to: int) -> None:
        """Every batch size once, so no user request pays for first-run allocation."""
        t0 = time.perf_counter()
        for n in range(up_to, self._warmed_to, -1):  # largest first: the arena grows once (docs/engines.md)
            self.engine.logits(self.engine.dummy_batch(n))
        self._warmed_to = up_to
        gc.collect()
        gc.freeze()  # the model and warm-up garbage are long-lived: keep them out of every GC pass
        logger.info("Classifier_%s warmed up batch sizes 1..%d in %.1fs", self.variant, up_to, time.perf_counter() - t0)

    def _measure(self, cfg: ClassifierConfig) -> None:
        """This replica's own throughput, and the speed gate's verdict against the baseline variant."""
        assert self.opened is not None
        streams, max_batch = cfg.max_concurrent_batches, cfg.max_batch_size
        report = start_report(self.opened, max_batch, streams)
        report.gate = gate_variant(self.args, self.variant, self.engine, self.gpu, self.threads, streams, max_batch)
        self.metrics.record_start(self.variant, report)
        if (failure := gate_failure(report.gate)) is not None:
            raise RuntimeError(f"Classifier_{self.variant}: {failure}")
        self.report = report

    # -- requests ---------------------------------------------------------------------

    async def __call__(
        self, pixels: Pixels | Encoded, top: int, full: bool = False, rows: list[int] | None = None
    ) -> Scores:
        """Top-k per image; with `full`, the whole logits rows too (for the V2 protocol's outputs).

        `pixels`: decoded, or (decode_in: gpu) encoded images this replica's batch decodes. `rows` picks some of the
        decoded images (a shadow run compares only the sampled ones).
        """
        assert self._batch is not None and self.cfg is not None, "reconfigure runs before any request"
        items = self._items(pixels, rows, time.perf_counter(), self.cfg.max_batch_size)
        done = await asyncio.gather(*(self._batch(it) for it in items))
        logits, errors, positions, preprocess_ms = self._answer(pixels, done, rows)
        best = [top_k(row, top) for row in self.io.probabilities(logits)] if logits is not None else []
        return Scores(
            top=best,
            preprocess_ms=preprocess_ms,
            queue_ms=max((d.queue_ms for d in done), default=0.0),
            inference_ms=sum(d.inference_ms for d in done),
            batch_size=max((d.batch_size for d in done), default=0),
            variant=self.variant,
            provider=self.engine.active_provider,
            errors=errors,
            positions=positions,
            logits=logits if full else None,
        )

    async def _run_batch(self, items: list[Item]) -> list[Done]:
        arrived = time.perf_counter()
        with self._device_batch(items) as batch:  # decode_in: gpu, device mode: the batch's pixels stay on the device
            decoded = await self._decode_batch(items, self._executor, batch)  # the whole batch in one call
            started = time.perf_counter()
            x, picks = self._engine_input(items, decoded, batch)
            # Engines release the GIL; running them off the event loop keeps requests flowing into the queue. With CUDA
            # graphs the engine's own slot threads run the batch: its graphs live on them (app/runtime/graphs.py).
            executor = getattr(self.engine, "executor", None) or self._executor
            loop = asyncio.get_running_loop()
            n = len(x)
            logits = await loop.run_in_executor(executor, self._infer, x) if n else np.zeros((0, len(self.io.labels)))
        inference_ms = _ms(time.perf_counter() - started)
        if n:
            self.metrics.record_batch(self.variant, n, inference_ms)
        out = []
        for it, pick, d in zip(items, picks, decoded, strict=True):
            queue_ms = _ms(arrived - it.arrived)
            if isinstance(d, ServiceError):
                out.append(Done(logits[:0], queue_ms, 0.0, n, error=d))
            else:
                out.append(Done(logits[pick], queue_ms, inference_ms, n, d))
        return out

    def _infer(self, x: np.ndarray | OnDevice) -> np.ndarray:
        profiler = self._profile.take() if self._profile is not None else None
        if profiler is not None:
            try:
                return profiler.logits(host_pixels(x))
            finally:
                self._profile.done_one()  # type: ignore[union-attr]
        return engine_logits(self.engine, x)
