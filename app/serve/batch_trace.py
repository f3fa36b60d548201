"""A Classifier's engine batch in the traces of the requests it served.

Serve's `@serve.batch` runs a batch under its first request's context only. Here every request that had an Item in the
batch is tied to it: the batch is one span, a child of the first recorded request's span in this replica and linked to
every request's; every other request's wait in the batch queue is a span of its own trace, linked to the batch's (the
first request's trace has the batch itself). The batch's
attributes say what ran it: images and the rows the engine bound (padding included), the CUDA graph bucket replayed,
the engine and execution provider, the model and the digest of the file serving.

Recorded after the batch from the times the Classifier measures anyway (nothing is made current on the engine's
threads); only while tracing is on (`app.tracing.spans.ENABLED`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.serve.batch_decoder import Item
from app.tracing import spans


def record(
    items: Sequence[Item],
    variant: str,
    engine: Any,
    model: tuple[str, str | None],
    times: tuple[float, float, float],
    images: int,
) -> None:
    """`engine`: the version's (select.Engine); `model`: (name, sha256 of the file serving); `times`: perf_counter
    readings when the batch formed, when its engine run started (after a decode_in: gpu decode) and when it ended."""
    contexts = [it.trace for it in items]
    parent = spans.first_sampled(contexts)
    if parent is None:  # no request of the batch is recorded: nor is the batch
        return
    formed, started, ended = times
    bucket = engine.graph_bucket(images) if images else None
    attributes = {
        "app.variant": variant,
        "app.batch.images": images,
        "app.batch.requests": len(items),
        "app.batch.rows": bucket or (engine.rows_for(images) if images else 0),
        "app.batch.cuda_graph": bucket is not None,
        "app.engine": engine.name,
        "app.execution_provider": engine.active_provider,
        "app.model": model[0],
        "app.model.sha256": model[1],
        "app.batch.decode_ms": round((started - formed) * 1000.0, 3),
    }
    batch = spans.record("classifier batch", formed, ended, attributes, parent=parent, links=contexts)
    waiting = ((it.trace, it.arrived, {"app.images": len(it)}) for it in items)
    spans.waits("batch queue", waiting, formed, parent, batch)
