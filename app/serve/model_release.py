"""The model version a Classifier replica serves, and a release in place: a new version named in its user_config is
fetched, checked, opened, warmed and gated beside the one serving, then switched to between two batches; the old
one's engine closes once the batches that took it are done, and its files go back to the cache.

Serve applies a user_config change to the running replica (`reconfigure`, a plain method Serve runs in a thread of
the replica), with no restart and no second replica: the replica keeps serving on its event loop while the new
version is prepared. A version that cannot serve (its file cannot be had, it fails the declaration or the speed gate,
or it takes other inputs than the one serving: the Router and the Preprocessors decode for those) leaves the old one
serving, and `describe` says why; a replica that starts while its user_config names such a version serves the args'
version and says the same. A version refused once is not tried again until the user_config names another.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from app.config import AppArgs, ClassifierConfig
from app.runtime.model_files import LocalModel, ModelFiles
from app.serve.metrics import ClassifierMetrics
from app.serve.variant_engine import VariantEngine
from app.served_model.model_io import transform_said

logger = logging.getLogger("ray.serve")


@dataclass
class Version:
    """One version of the variant's model on this replica: its files, its engine, and the batches running on it."""

    files: LocalModel
    engine: VariantEngine
    named: dict[str, str | None]  # the user_config's fields it was prepared from (empty: the args')
    running: int = 0
    retiring: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self) -> None:
        """A batch takes this version (before its first await): it stays open until the batch leaves."""
        with self.lock:
            self.running += 1

    def leave(self) -> None:
        with self.lock:
            self.running -= 1
            last = self.retiring and self.running == 0
        if last:
            self.close()

    def retire(self) -> None:
        """No new batch takes it; it closes when the last one that did leaves (now, if none runs)."""
        with self.lock:
            self.retiring = True
            idle = self.running == 0
        if idle:
            self.close()

    def close(self) -> None:
        if self.engine.opened is not None:
            self.engine.engine.close()
        self.files.release()


def differing_inputs(old: VariantEngine, new: VariantEngine) -> str | None:
    """Why `new` cannot replace `old` under the same Router (None: it can): the images are decoded and transformed
    for the serving version's input, and its labels are what the Router answers with."""
    if new.io.transform != old.io.transform:
        return f"it takes {transform_said(new.io.transform)}, the serving version {transform_said(old.io.transform)}"
    if len(new.io.labels) != len(old.io.labels):
        return f"it has {len(new.io.labels)} classes, the serving version {len(old.io.labels)}"
    return None


class Releases:
    """The version serving, how the last release went, and the version last refused."""

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
        self.asked: dict[str, str | None] = {}  # the version the user_config names now
        self.refused: dict[str, str | None] | None = None
        self.state: dict[str, Any] = {"state": "starting"}

    def prepare(self, cfg: ClassifierConfig, version: dict[str, str | None], *, release: bool) -> Version:
        """`version` fetched and opened (`release`: also warmed up and measured, checked against the serving one's
        inputs, not the deploy's); raises with one line naming the field, the URI and the reason."""
        files = self.files.local(self.args, self.variant, version)
        engine: VariantEngine | None = None
        try:
            transform = None if release else self.transform
            engine = VariantEngine(files.args, self.variant, transform, self.gpu, self.num_cpus, self.metrics)
            engine.open(cfg)
            if release:
                assert self.serving is not None
                if (reason := differing_inputs(self.serving.engine, engine)) is not None:
                    uri = files.model.uri
                    raise ValueError(f"variants.{self.variant}.model_path: {uri}: {reason}")
                if cfg.warmup:
                    engine.warm_up(cfg.max_batch_size)
                engine.measure(cfg)
        except BaseException:
            if engine is not None and engine.opened is not None:
                engine.engine.close()
            files.release()
            raise
        return Version(files, engine, version)

    def start(self, cfg: ClassifierConfig) -> VariantEngine:
        """The first version, at the replica's start: the one the user_config names, else (or if that one cannot
        serve) the args'. A failure of the args' version fails the replica (`serve status` shows it)."""
        t0 = time.perf_counter()
        self.asked = cfg.version()
        failed: str | None = None
        if self.asked:
            try:
                self.serving = self.prepare(cfg, self.asked, release=False)
            except Exception as e:
                failed = _line(e)
                logger.error(
                    "Classifier_%s: the user_config's version cannot serve, the args' does: %s", self.variant, failed
                )
        if self.serving is None:
            self.serving = self.prepare(cfg, {}, release=False)
        self._serving_now()
        if failed is not None:
            self._failed(self.asked, failed, t0)
        return self.serving.engine

    def wanted(self, cfg: ClassifierConfig) -> dict[str, str | None] | None:
        """The version `cfg` asks for when it is a change to make (None: the serving one, or the one refused last)."""
        version = cfg.version()
        if self.serving is not None and version == self.serving.named and version != self.asked:
            self.asked, self.refused = version, None  # back to the version serving (a refused one reverted)
            self._serving_now()
            return None
        if version == self.asked or version == self.refused:
            return None
        return version

    def refuse_malformed(self, version: dict[str, Any], error: str) -> None:
        """A user_config whose version fields do not validate: refused as a release would be."""
        self._failed(
            {k: v for k, v in version.items() if v is not None},
            f"user_config: {_line(ValueError(error))}",
            time.perf_counter(),
        )

    def release(self, cfg: ClassifierConfig, version: dict[str, str | None]) -> Version | None:
        """Prepares `version` (in Serve's thread for reconfigure, while the event loop serves): ready to switch to,
        or None when it cannot serve (logged, counted, and said in `describe`; the serving version's metrics stand)."""
        assert self.serving is not None
        t0 = time.perf_counter()
        self.asked = version
        self.state = {"state": "releasing", "target": _target(self.args, self.variant, version), **self._said()}
        logger.info("Classifier_%s: releasing %s beside the serving version", self.variant, self.state["target"])
        try:
            new = self.prepare(cfg, version, release=True)
        except Exception as e:
            self._failed(version, _line(e), t0)
            self.serving.engine.record_metrics()  # the refused engine recorded its own
            return None
        self.refused = None
        return new

    def switched(self, new: Version, t0: float) -> None:
        """`new` serves from the next batch on; the old version closes once its batches are done."""
        old, self.serving = self.serving, new
        if old is not None:
            old.retire()
        self._serving_now()
        self.metrics.record_release(self.variant, "switched")
        model = new.files.model
        logger.info(
            "Classifier_%s: now serving %s (sha256 %s), switched in %.1fs",
            self.variant,
            model.uri,
            model.sha256,
            time.perf_counter() - t0,
        )

    def _failed(self, version: dict[str, str | None], line: str, t0: float) -> None:
        self.refused = version
        self.state = {
            "state": "failed",
            "target": _target(self.args, self.variant, version),
            "error": line,
            "seconds": round(time.perf_counter() - t0, 3),
            **self._said(),
        }
        self.metrics.record_release(self.variant, "failed")
        logger.error("Classifier_%s: version refused, the serving version stays: %s", self.variant, line)

    def _serving_now(self) -> None:
        assert self.serving is not None
        self.state = {"state": "serving", **self._said()}
        model = self.serving.files.model
        self.metrics.record_version(self.variant, model.sha256, model.uri)
        self.metrics.record_cache(self.files.describe())

    def _said(self) -> dict[str, Any]:
        return {"serving": self.serving.files.describe() if self.serving is not None else None}

    def describe(self) -> dict[str, Any]:
        """/v1/models' model version of this replica: what serves, the last release's outcome, the node's cache."""
        return {**self.state, "cache": self.files.describe()}


def _target(args: AppArgs, variant: str, version: dict[str, str | None]) -> dict[str, str | None]:
    if version.get("model_path") is None:
        v = args.variants[variant]
        return {"uri": v.model_path, "sha256": v.sha256}
    return {"uri": version["model_path"], "sha256": version.get("sha256")}


def _line(e: BaseException) -> str:
    """The first line of what went wrong (pydantic's and ours lead with the field; later lines are hints)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
