"""The model version a Classifier replica serves, and a release in place: a new version named in its user_config is
fetched, checked, opened, warmed and gated beside the one serving, then switched to between two batches; the old
one's engine closes once its running batches are done and its files go back to the cache.

Serve applies a user_config change to the running replica (`reconfigure`), with no restart and no second replica:
the replica keeps serving while the new version is prepared in a thread. A version that cannot serve (its file
cannot be had, it fails the declaration or the speed gate, or it takes other inputs than the one serving: the
Router and the Preprocessors decode for those) leaves the old one serving, and `describe` says why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from app.config import AppArgs, ClassifierConfig
from app.runtime.model_files import LocalModel, ModelFiles
from app.serve.metrics import ClassifierMetrics
from app.serve.variant_engine import VariantEngine
from app.served_model.model_io import transform_said

logger = logging.getLogger("ray.serve")


@dataclass
class Version:
    """One version of the variant's model on this replica: its files and its engine."""

    files: LocalModel
    engine: VariantEngine

    def close(self) -> None:
        """The engine closes once the batches running on it are done; the files go back to the cache."""
        if self.engine.opened is not None:
            self.engine.engine.close()
        self.files.release()


def wanted(args: AppArgs, variant: str, cfg: ClassifierConfig) -> tuple[str, str | None]:
    """The version `cfg` names: its model_path and sha256, else the args'."""
    if cfg.model_path is not None:
        return cfg.model_path, cfg.sha256
    v = args.variants[variant]
    return v.model_path, v.sha256


def differing_inputs(old: VariantEngine, new: VariantEngine) -> str | None:
    """Why `new` cannot replace `old` under the same Router (None: it can): the images are decoded and transformed
    for the serving version's input, and its labels are what the Router answers with."""
    if new.io.transform != old.io.transform:
        return f"it takes {transform_said(new.io.transform)}, the serving version {transform_said(old.io.transform)}"
    if len(new.io.labels) != len(old.io.labels):
        return f"it has {len(new.io.labels)} classes, the serving version {len(old.io.labels)}"
    return None


class Releases:
    """The version serving, the one being prepared, and how the last release went."""

    def __init__(
        self,
        args: AppArgs,
        variant: str,
        transform: dict[str, Any] | None,
        gpu: bool,
        num_cpus: float,
        metrics: ClassifierMetrics,
    ) -> None:
        self.args, self.variant, self.transform = args, variant, transform
        self.gpu, self.num_cpus, self.metrics = gpu, num_cpus, metrics
        self.files = ModelFiles.for_node(args)
        self.serving: Version | None = None
        self.state: dict[str, Any] = {"state": "starting"}

    def prepare(self, cfg: ClassifierConfig, *, measured: bool) -> Version:
        """The version `cfg` names, fetched and opened (and, `measured`, warmed up and measured: a release); raises
        with one line naming the field, the URI and the reason."""
        uri, sha256 = wanted(self.args, self.variant, cfg)
        files = self.files.local(self.args, self.variant, uri, sha256)
        try:
            engine = VariantEngine(files.args, self.variant, self.transform, self.gpu, self.num_cpus, self.metrics)
            engine.open(cfg)
            if measured:
                if cfg.warmup:
                    engine.warm_up(cfg.max_batch_size)
                engine.measure(cfg)
        except BaseException:
            files.release()
            raise
        return Version(files, engine)

    def start(self, cfg: ClassifierConfig) -> VariantEngine:
        """The first version, at the replica's start (a failure fails the replica: `serve status` shows it)."""
        self.serving = self.prepare(cfg, measured=False)
        self._serving_now(time.perf_counter())
        return self.serving.engine

    def changed(self, cfg: ClassifierConfig) -> bool:
        assert self.serving is not None
        uri, sha256 = wanted(self.args, self.variant, cfg)
        files = self.serving.files
        return uri != files.model.uri or (sha256 is not None and sha256 != files.model.sha256)

    async def release(self, cfg: ClassifierConfig) -> Version | None:
        """Prepares the version `cfg` names in a thread while the serving one answers; returns it, ready to switch
        to (the caller switches between two batches, then closes the old one), or None when it cannot serve (logged,
        counted, and said in `describe`)."""
        assert self.serving is not None
        t0 = time.perf_counter()
        uri, sha256 = wanted(self.args, self.variant, cfg)
        self.state = {"state": "releasing", "target": {"uri": uri, "sha256": sha256}, **self._serving_said()}
        logger.info("Classifier_%s: releasing %s (sha256 %s) beside the serving version", self.variant, uri, sha256)
        try:
            new = await asyncio.to_thread(self.prepare, cfg, measured=True)
        except Exception as e:
            self._failed(uri, sha256, str(e), t0)
            return None
        reason = differing_inputs(self.serving.engine, new.engine)
        if reason is not None:
            new.close()
            self._failed(uri, sha256, f"variants.{self.variant}.model_path: {uri}: {reason}", t0)
            return None
        return new

    def switched(self, new: Version, t0: float) -> None:
        old, self.serving = self.serving, new
        if old is not None:
            old.close()
        self._serving_now(t0)
        self.metrics.record_release(self.variant, "switched")
        logger.info(
            "Classifier_%s: now serving %s (sha256 %s), switched in %.1fs",
            self.variant,
            new.files.model.uri,
            new.files.model.sha256,
            time.perf_counter() - t0,
        )

    def _failed(self, uri: str, sha256: str | None, why: str, t0: float) -> None:
        line = why.splitlines()[-1] if why else "failed"
        self.state = {
            "state": "failed",
            "target": {"uri": uri, "sha256": sha256},
            "error": line,
            "seconds": round(time.perf_counter() - t0, 3),
            **self._serving_said(),
        }
        self.metrics.record_release(self.variant, "failed")
        logger.error("Classifier_%s: release of %s refused, the serving version stays: %s", self.variant, uri, line)

    def _serving_now(self, t0: float) -> None:
        assert self.serving is not None
        self.state = {"state": "serving", **self._serving_said()}
        self.metrics.record_version(self.variant, self.serving.files.model.sha256, self.serving.files.model.uri)
        self.metrics.record_cache(self.files.describe())

    def _serving_said(self) -> dict[str, Any]:
        return {"serving": self.serving.files.describe() if self.serving is not None else None}

    def describe(self) -> dict[str, Any]:
        """/v1/models' model version of this replica: what serves, the last release's outcome, the node's cache."""
        return {**self.state, "cache": self.files.describe()}
