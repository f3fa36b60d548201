"""Decode, colour-convert and resize on CPU: the Decoder, run by the Preprocessor deployment or by the Router.

Decoding is bounded per replica, whatever arrives: each image's decode cost is estimated from its
header (`estimate_decode_bytes`) and the decode runs on the replica's own threads under a
reservation of that cost (`DecodeBudget`): at most as many at once as the replica has CPUs (at
least one), their costs summing to at most `Limits.preprocessor_memory_bytes`. Requests beyond
that wait in the event loop, holding no memory but their bytes. An image over the per-image budget
(`Limits.max_decode_bytes`) is refused from its header (413) without waiting.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
from ray import serve

from app.config import Limits
from app.errors import ServiceError
from app.imaging.decode_budget import DecodeBudget, slots_for
from app.imaging.payloads import Pixels
from app.imaging.preprocess import check_header, preprocess
from app.imaging.transform import Transform
from app.serve.decode_trace import ImageFacts
from app.serve.serve_internals import replica_id
from app.serve.tracing import turn_on_here
from app.tracing import spans


def _assigned_cpus() -> float:
    """The CPUs Ray granted this replica (fractional), or 1 outside Ray (asking there would start Ray)."""
    if not ray.is_initialized():
        return 1.0
    try:
        return float(ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0))
    except Exception:  # not in a worker
        return 1.0


class Decoder:
    """Decode, colour-convert and resize on CPU under this process's DecodeBudget; uint8 out (4x fewer bytes
    than float32). Runs in the Preprocessor deployment, or in the Router itself (`AppArgs.decode_in`)."""

    def __init__(self, limits: Limits) -> None:
        self.max_pixels = limits.max_pixels
        self.max_decode_bytes = limits.max_decode_bytes
        self.slots = slots_for(_assigned_cpus())
        self.budget = DecodeBudget(limits.preprocessor_memory_bytes, self.slots)
        self.executor = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="decode")

    def describe(self) -> dict[str, Any]:
        return {
            "decode_slots": self.slots,
            "decode_memory_bytes": self.budget.max_bytes,
            "decode_bytes_in_flight": self.budget.in_flight_bytes,
            "decodes_waiting": self.budget.waiting,
        }

    async def many(self, images: list[bytes], size: Transform | int, deadline_s: float | None = None) -> Pixels:
        """The images of one request, or of a group the Router coalesced; a bad one fails only its position.

        `size`: the model's transform (its input size, resize, crop and channel order); an int squashes to that
        square in RGB.

        `deadline_s`: when the caller stops waiting, as wall-clock time (`time.time()`, seconds since
        the epoch; the Router's perf_counter deadlines mean nothing in another process). An image not
        started by then is not started: the call fails with inference_timeout (503). An image already
        decoding finishes (its thread cannot be stopped) and keeps its reservation until it does.
        Cancelled (Serve cancels the call when the client goes), it stops before the next image.

        Traced: one span for the call, its wait for decode slots included: `decode` for one image (its format,
        pixels and bytes), `preprocess` for several (the same per image as arrays in the images' order, with each
        image's ms and error code): a span per image would cost more to export than most images take to decode.
        """
        if not spans.ENABLED:
            return await self._many(images, size, deadline_s)
        facts = ImageFacts()
        name = "decode" if len(images) == 1 else "preprocess"
        with spans.span(name, {"app.images": len(images)}) as span:
            try:
                return await self._many(images, size, deadline_s, facts)
            finally:
                spans.annotate(facts.attributes(), span)
                if len(images) == 1 and facts.errors and facts.errors[0]:
                    spans.fail(span, facts.errors[0])

    async def _many(
        self, images: list[bytes], size: Transform | int, deadline_s: float | None, facts: ImageFacts | None = None
    ) -> Pixels:
        t0 = time.perf_counter()
        transform = Transform.square(size) if isinstance(size, int) else size
        rows, positions, errors = [], [], {}
        for i, data in enumerate(images):
            timeout = None if deadline_s is None else deadline_s - time.time()
            if timeout is not None and timeout <= 0:
                raise ServiceError("inference_timeout", f"the deadline passed before image {i} was decoded")
            started = time.perf_counter()
            try:
                rows.append(await self._decode(data, transform, timeout, facts))
                positions.append(i)
            except ServiceError as e:
                errors[i] = e
            except TimeoutError:
                if facts is not None:
                    facts.done(len(data), started, "inference_timeout")
                raise ServiceError(
                    "inference_timeout", f"the deadline passed while image {i} waited for a decode slot"
                ) from None
            if facts is not None:
                facts.done(len(data), started, errors[i].code if i in errors else "")
        array = np.stack(rows) if rows else np.zeros((0, *transform.shape), np.uint8)
        return Pixels(array, round((time.perf_counter() - t0) * 1000.0, 3), errors, positions)

    async def _decode(
        self, data: bytes, transform: Transform, timeout: float | None, facts: ImageFacts | None = None
    ) -> np.ndarray:
        """One image: the header checks here (a refusal waits for nothing), then the decode under its cost."""
        info, cost = check_header(data, self.max_pixels, transform.decode_target, self.max_decode_bytes)
        if facts is not None:
            facts.header(info.format, info.width * info.height)
        return await self.budget.run(
            cost,
            preprocess,
            data,
            transform,
            self.max_pixels,
            True,
            self.max_decode_bytes,
            info,  # the header read once: the decode does not probe it again
            timeout=timeout,
            executor=self.executor,
        )


@serve.deployment(name="Preprocessor", ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=32)
class Preprocessor(Decoder):
    """The Decoder as a deployment of its own: decode capacity that scales apart from the Router, and a native
    crash in a decoder (a hostile image) that costs one Preprocessor call, retried elsewhere, not an ingress."""

    def __init__(self, limits: dict[str, Any]) -> None:
        """`limits`: `Limits.model_dump()`."""
        super().__init__(Limits.model_validate(limits))
        turn_on_here()

    def describe(self) -> dict[str, Any]:
        return {"replica_id": replica_id(), "node_id": ray.get_runtime_context().get_node_id(), **super().describe()}
