"""What a Classifier replica says about itself: /v1/models' variant (describe), readiness, health, its metrics' engine
labels. A base of app/serve/classifier.py's Classifier (which sets every attribute named here)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray

from app.config import AppArgs, ClassifierConfig
from app.runtime import CUDA, TENSORRT, Opened

if TYPE_CHECKING:
    from app.model.model_io import ModelIO
    from app.runtime.startup import StartupReport
    from app.serve.metrics import ClassifierMetrics
    from app.serve.profiling_twin import ProfilingTwin


class ClassifierReport:
    variant: str
    args: AppArgs
    io: ModelIO
    opened: Opened | None
    cfg: ClassifierConfig | None
    report: StartupReport | None
    gpu: bool
    threads: int
    num_cpus: float
    replica_id: str
    metrics: ClassifierMetrics
    _warmed_to: int
    _profile: ProfilingTwin | None

    @property
    def engine(self) -> Any:
        assert self.opened is not None, "reconfigure opens the engine before any request"
        return self.opened.engine

    @property
    def serving_precision(self) -> str:
        """What really runs: the declared precision, or the declared fallback's."""
        serving = self.opened.serving if self.opened is not None else None
        return serving.precision if serving is not None else self.args.variants[self.variant].precision

    def describe(self) -> dict[str, Any]:
        cfg = self.cfg or ClassifierConfig()
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
            "batching": {
                "max_batch_size": cfg.max_batch_size,
                "batch_wait_timeout_s": cfg.batch_wait_timeout_s,
                "max_concurrent_batches": cfg.max_concurrent_batches,
            },
            "warmed_up_to": self._warmed_to,
            "gpu_decode": self.describe_decode(),
            "profiling": self._profile.state() if self._profile is not None else None,
            "input": self.io.describe(self.args.model),
            "replica_id": self.replica_id,
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    def describe_decode(self) -> dict[str, Any] | None:
        """decode_in: gpu: where this replica's images were decoded (app/serve/classifier_decode.py); else None."""
        return None

    def labels(self) -> list[str]:
        """One label per class (the declaration's file, ImageNet-1k's for 1000 classes, else class_<i>)."""
        return self.io.labels

    def ready(self) -> bool:
        return (
            self.opened is not None
            and self.engine.alive
            and self.cfg is not None
            and (not self.cfg.warmup or self._warmed_to > 0)
        )

    def check_health(self) -> None:
        if self.opened is not None and not self.engine.alive:
            raise RuntimeError(f"Classifier_{self.variant}: the engine is gone")

    def _report_provider(self) -> None:
        serving = self.opened.serving if self.opened is not None else None
        self.metrics.record_provider(
            self.variant, self.engine.active_provider, self.engine.requested_providers, self.serving_precision
        )
        self.metrics.record_fallback(self.variant, serving.describe() if serving is not None else None)
