"""A Classifier replica's engine: its variant's model opened on the fastest correct engine of the node, warmed up,
measured and gated at start, opened again when a live change needs it, and what it says of itself.

The Classifier owns one; it runs the batches, this runs the engine (and, while a profile is asked for, its twin).
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

import numpy as np

from app.config import AppArgs, ClassifierConfig
from app.runtime import CUDA, TENSORRT, Engine, ModelLoadError, Opened, threads_for
from app.runtime.open_variant import gate_failure, gate_variant, open_variant
from app.runtime.startup import StartupReport, start_report
from app.serve.device_mode import OnDevice, engine_logits, host_pixels
from app.serve.metrics import ClassifierMetrics
from app.serve.profiling_twin import ProfilingTwin
from app.served_model.model_io import ModelIO, check_transform, model_io

logger = logging.getLogger("ray.serve")


class VariantEngine:
    def __init__(
        self,
        args: AppArgs,
        variant: str,
        transform: dict[str, Any] | None,
        gpu: bool,
        num_cpus: float,
        metrics: ClassifierMetrics,
    ) -> None:
        """transform: the model's, as the deploy read it and handed to the Router (None: not read there); this node's
        file must give the same, or every decode would be refused. The graph is checked against the declaration here,
        its normalisation folded in: a contradiction fails the replica naming the field (`serve status` shows it)."""
        self.args, self.variant, self.gpu, self.num_cpus, self.metrics = args, variant, gpu, num_cpus, metrics
        path = args.resolved_path(args.variants[variant].model_path)
        where = f"Classifier_{variant}: variants.{variant}.model_path"
        self.io: ModelIO = model_io(args.model, path, where)
        check_transform(transform, self.io.transform, where)
        self.requested_io = self.io  # self.io becomes the fallback's when the variant's declared fallback serves
        self.threads = args.intra_op_threads or threads_for(num_cpus)
        self.opened: Opened | None = None
        self.report: StartupReport | None = None
        self.warmed_to = 0
        self.profile: ProfilingTwin | None = None

    @property
    def engine(self) -> Engine:
        assert self.opened is not None, "reconfigure opens the engine before any request"
        return self.opened.engine

    @property
    def serving_precision(self) -> str:
        """What really runs: the declared precision, or the declared fallback's."""
        serving = self.opened.serving if self.opened is not None else None
        return serving.precision if serving is not None else self.args.variants[self.variant].precision

    def needs_reopen(self, cfg: ClassifierConfig, before: ClassifierConfig | None) -> bool:
        """Whether `cfg` needs the engine opened (again): at start, and for another max_concurrent_batches where the
        engine fixes it at open (OpenVINO compiles for its parallel calls; with CUDA graphs each batch slot is a
        session and a thread of its own). Plain ONNX Runtime serves any number."""
        if self.opened is None:
            return True
        changed = before is not None and cfg.max_concurrent_batches != before.max_concurrent_batches
        return self.engine.fixed_parallel and changed

    def open(self, cfg: ClassifierConfig) -> None:
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
        self.warmed_to = 0
        self.io = o.io
        chosen = next((c for c in opened.plan.candidates if c.engine == opened.engine.name), opened.plan.candidates[0])
        self.profile = ProfilingTwin(self.variant, str(self.io.served.path), opts, chosen)
        engine = self.engine
        self.report = None  # a reopened engine is measured again
        self.record_metrics()
        described = engine.describe()
        logger.info(
            "Classifier_%s loaded %s (%s) on %s (%s), %d threads x %d parallel batches; CUDA graphs: %s",
            self.variant,
            self.io.served.path,
            opts.precision,
            engine.name,
            described.get("nodes_per_provider") or engine.active_provider,
            opts.threads,
            opts.streams,
            (described.get("cuda_graphs") or {}).get("graph_batch_sizes", "off"),
        )

    def record_metrics(self) -> None:
        """This engine's gauges: what runs, the fallback in force, its start-up measurement (again after a refused
        release, whose engine recorded its own)."""
        if self.opened is None:
            return
        engine, serving = self.engine, self.opened.serving
        self.metrics.record_provider(
            self.variant, engine.active_provider, engine.requested_providers, self.serving_precision
        )
        self.metrics.record_fallback(self.variant, serving.describe() if serving is not None else None)
        if self.report is not None:
            self.metrics.record_start(self.variant, self.report)

    def warm_up(self, up_to: int) -> None:
        """Every batch size not yet run once, so no user request pays for first-run allocation."""
        if self.warmed_to >= up_to:
            return
        t0 = time.perf_counter()
        for n in range(up_to, self.warmed_to, -1):  # largest first: the arena grows once (docs/engines.md)
            self.engine.logits(self.engine.dummy_batch(n))
        self.warmed_to = up_to
        gc.collect()
        gc.freeze()  # the model and warm-up garbage are long-lived: keep them out of every GC pass
        logger.info("Classifier_%s warmed up batch sizes 1..%d in %.1fs", self.variant, up_to, time.perf_counter() - t0)

    def measure(self, cfg: ClassifierConfig) -> None:
        """This replica's own throughput, and the speed gate's verdict against the baseline variant."""
        assert self.opened is not None
        streams, max_batch = cfg.max_concurrent_batches, cfg.max_batch_size
        report = start_report(self.opened, max_batch, streams)
        report.gate = gate_variant(self.args, self.variant, self.engine, self.gpu, self.threads, streams, max_batch)
        self.metrics.record_start(self.variant, report)
        if (failure := gate_failure(report.gate)) is not None:
            raise RuntimeError(f"Classifier_{self.variant}: {failure}")
        self.report = report

    def start_profile(self, batches: int, directory: str, replica_id: str) -> None:
        assert self.profile is not None
        self.profile.start(batches, directory, replica_id)

    def infer(self, x: np.ndarray | OnDevice) -> np.ndarray:
        """One engine batch's logits (in the engine's executor: engines release the GIL); while a profile is asked
        for, its twin runs the batch instead."""
        profiler = self.profile.take() if self.profile is not None else None
        if profiler is not None:
            try:
                return profiler.logits(host_pixels(x))
            finally:
                self.profile.done_one()  # type: ignore[union-attr]
        return engine_logits(self.engine, x)

    def ready(self, cfg: ClassifierConfig | None) -> bool:
        return (
            self.opened is not None and self.engine.alive and cfg is not None and (not cfg.warmup or self.warmed_to > 0)
        )

    def describe(self) -> dict[str, Any]:
        """/v1/models' variant: the model, what runs it and why, its start-up measurements."""
        engine = self.engine.describe()
        plan = self.opened.plan if self.opened is not None else None
        serving = self.opened.serving if self.opened is not None else None
        return {
            "variant": self.variant,
            "model": self.args.model.name,
            "model_file": str(self.io.served.source),
            "precision": self.serving_precision,  # what runs: the fallback's when it serves
            "requested_precision": self.args.variants[self.variant].precision,
            "fallback": None if serving is None else {**serving.describe(), "model_file": str(self.io.served.source)},
            **engine,
            "on_gpu": engine["execution_provider"] in (CUDA, TENSORRT),
            "gpu_granted": self.gpu,
            "fell_back_to_cpu": bool(plan is not None and self.gpu and not plan.gpu),
            "plan_note": plan.note if plan is not None else "",
            **(self.report.describe() if self.report is not None else {}),
            "intra_op_threads": self.threads,
            "num_cpus": self.num_cpus,
        }
