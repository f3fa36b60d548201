"""ONNX Runtime profiling of a live Classifier for the next N batches only, then off by itself."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any

from app.runtime import EngineChoice, OrtEngine, RuntimeOptions, summarize_profile

logger = logging.getLogger("ray.serve")


class ProfilingTwin:
    """A profiling twin of the serving session takes the next N batches.

    ORT can only profile a session created with profiling on, so a twin of the serving session
    (same providers) takes the next N batches; at the end its trace is written, summarised into
    the log and kept (at most MAX_TRACES per directory), and the twin is dropped. OpenVINO has
    no such profiler: there, profiling is refused with a log line.
    """

    MAX_TRACES = 10

    def __init__(self, variant: str, model_path: str, opts: RuntimeOptions, choice: EngineChoice | None) -> None:
        self.variant, self.model_path, self.opts, self.choice = variant, model_path, opts, choice
        self.lock = threading.Lock()
        self.runner: OrtEngine | None = None
        self.left = 0
        self.last: dict[str, Any] | None = None
        self.refused: str | None = None

    def start(self, batches: int, directory: str, replica_id: str) -> None:
        if self.choice is None or self.choice.engine == "openvino":
            self.refused = "profile_batches needs an ONNX Runtime engine; this replica serves on OpenVINO"
            logger.warning("Classifier_%s: %s", self.variant, self.refused)
            return
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        prefix = str(out / f"{self.variant}-{replica_id}-{int(time.time())}")
        # A plain session: ORT profiles its kernels, and a CUDA graph's replay runs none of them one by one.
        opts = dataclasses.replace(self.opts, profile_prefix=prefix, cuda_graphs=None)
        runner = OrtEngine(self.model_path, opts, self.choice)
        with self.lock:
            self.runner, self.left = runner, batches
        logger.info("Classifier_%s profiling the next %d batches into %s", self.variant, batches, out)

    def take(self) -> OrtEngine | None:
        with self.lock:
            return self.runner if self.left > 0 else None

    def done_one(self) -> None:
        with self.lock:
            self.left -= 1
            if self.left > 0 or self.runner is None:
                return
            runner, self.runner = self.runner, None
        trace = runner.end_profiling()
        runner.close()
        if trace:
            summary = summarize_profile(trace)
            self.last = {"trace": trace, **summary}
            logger.info(
                "Classifier_%s profile %s: most expensive %s; most frequent %s",
                self.variant,
                trace,
                summary["most_expensive"],
                summary["most_frequent"],
            )
            traces = sorted(Path(trace).parent.glob(f"{self.variant}-*.json"), key=lambda p: p.stat().st_mtime)
            for old in traces[: -self.MAX_TRACES]:
                old.unlink(missing_ok=True)

    def state(self) -> dict[str, Any]:
        with self.lock:
            state = {"active": self.runner is not None, "batches_left": self.left, "last": self.last}
            return {**state, "refused": self.refused} if self.refused else state
