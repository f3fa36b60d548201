"""Triton's statistics extension, pure and mergeable: per V2 model, what its requests cost inside the service.

Each Router records its own requests and ships the counts with its A/B deltas to the ledger about once a
second (`app.pipeline.shadow.Evidence`), so the ledger's totals are the whole service's. The ledger keeps them
apart from the A/B evidence: `/v1/ab/reset` does not reset them (Triton's counters only grow).

How this service's timings map onto Triton's durations (all cumulative nanoseconds, one count per request):

    success / fail    the whole request in the Router, body read to reply encoded
    queue             waiting for admission and in the Classifier's batch queue
    compute_input     decoding and resizing the images (the Preprocessor)
    compute_infer     the engine's run on the batch the request rode in
    compute_output    encoding the reply (softmax, top-k strings, the wire format)

`inference_count` counts images, `execution_count` requests: Serve batches across Routers inside each
Classifier replica, where a Router cannot count executions, so a request counts as one execution.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += max(0, ns)

    def merge(self, other: Duration) -> None:
        self.count += other.count
        self.ns += other.ns


@dataclass
class ModelStats:
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0  # ms since the epoch of the last successful request (Triton: last_inference)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)

    def merge(self, other: ModelStats) -> None:
        self.inference_count += other.inference_count
        self.execution_count += other.execution_count
        self.last_inference_ms = max(self.last_inference_ms, other.last_inference_ms)
        for name in DURATIONS:
            getattr(self, name).merge(getattr(other, name))

    def triton(self, name: str, version: str) -> dict[str, Any]:
        """One entry of Triton's `model_stats` list (JSON form, as `GET /v2/models/stats` returns it)."""
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                **{d: {"count": getattr(self, d).count, "ns": getattr(self, d).ns} for d in DURATIONS},
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "batch_stats": [],
        }


@dataclass
class ModelStatsTable:
    """V2 model name -> its statistics. Mergeable like `ABStats`: the ledger's sum is the service's."""

    models: dict[str, ModelStats] = field(default_factory=dict)

    def success(
        self,
        model: str,
        images: int,
        now_ms: int,
        *,
        total_s: float,
        queue_s: float,
        input_s: float,
        infer_s: float,
        output_s: float,
    ) -> None:
        m = self.models.setdefault(model, ModelStats())
        m.inference_count += images
        m.execution_count += 1
        m.last_inference_ms = max(m.last_inference_ms, now_ms)
        m.success.add(_ns(total_s))
        m.queue.add(_ns(queue_s))
        m.compute_input.add(_ns(input_s))
        m.compute_infer.add(_ns(infer_s))
        m.compute_output.add(_ns(output_s))

    def failure(self, model: str, total_s: float) -> None:
        self.models.setdefault(model, ModelStats()).fail.add(_ns(total_s))

    def merge(self, other: ModelStatsTable) -> None:
        for name, m in other.models.items():
            self.models.setdefault(name, ModelStats()).merge(m)

    def empty(self) -> bool:
        return not self.models

    def triton(self, names: list[str], version: str) -> dict[str, Any]:
        """`{"model_stats": [...]}` for the given model names (a model never asked has zero counts)."""
        return {"model_stats": [self.models.get(n, ModelStats()).triton(n, version) for n in names]}


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


assert {f.name for f in fields(ModelStats)} >= set(DURATIONS)
