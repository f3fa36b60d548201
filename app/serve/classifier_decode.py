"""`decode_in: gpu` in a Classifier replica: the encoded images of its batches decoded there, where the GPU is.

A base of app/serve/classifier.py's Classifier. The Router sends `Encoded` (header-checked there); a request's images
ride the same dynamic batch as everyone else's, one `GpuPixels` call decodes the whole batch (app/runtime/gpu_pixels.py:
JPEGs by the GPU's decoders, the rest by the CPU path, per-image errors as the Preprocessor gives them), and the
engine runs on what decoded. An image not decoded by the caller's deadline is not started: the request fails with
inference_timeout (503), as a Preprocessor's would.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from app.errors import ServiceError
from app.imaging.decode_budget import slots_for
from app.imaging.payloads import Encoded, Pixels
from app.imaging.transform import Transform
from app.runtime.cuda_transform import DECODER_ENV, decoder_factory, open_gpu_pixels
from app.runtime.gpu_pixels import GpuPixels

if TYPE_CHECKING:
    from app.config import AppArgs, ClassifierConfig
    from app.model.model_io import ModelIO
    from app.serve.metrics import ClassifierMetrics

logger = logging.getLogger("ray.serve")


@dataclass
class Item:
    """One request's share of an engine batch: its pixels, or (decode_in: gpu) its encoded images."""

    pixels: np.ndarray | None
    arrived: float
    encoded: list[bytes] | None = None
    wall_deadline: float | None = None

    def __len__(self) -> int:
        return len(self.pixels) if self.pixels is not None else len(self.encoded or ())


@dataclass
class Done:
    """What one Item's share of an engine batch gave."""

    logits: np.ndarray
    queue_ms: float
    inference_ms: float
    batch_size: int
    decoded: Pixels | None = None  # decode_in: gpu: what the batch decoded of the item's images
    error: ServiceError | None = None  # the item's deadline passed before its decode


class GpuDecoding:
    variant: str
    args: AppArgs
    io: ModelIO
    gpu: bool
    num_cpus: float
    metrics: ClassifierMetrics
    gpu_pixels: GpuPixels | None
    decoder_kind: str

    def _check_gpu_decode(self) -> None:
        """At start: decode_in: gpu needs a GPU here (or the host stand-in, APP_GPU_DECODER=standin: tests only)."""
        self.gpu_pixels, self.decoder_kind = None, ""
        if self.args.decode_in != "gpu":
            return
        kind, _ = decoder_factory()
        if kind != "standin" and not self.gpu:
            raise RuntimeError(
                f"Classifier_{self.variant}: args.decode_in is gpu, but this replica was granted no GPU "
                f"(ray_actor_options.num_gpus): its batches decode JPEGs on the GPU; on a CPU node use decode_in: "
                f"preprocessor or router ({DECODER_ENV}={kind})"
            )
        self.decoder_kind = kind

    def _open_gpu_decode(self, cfg: ClassifierConfig) -> None:
        """Once, at the first reconfigure: the decoder (its GPU memory preallocated for a full batch), the transform
        on the GPU, the CPU path's threads (the replica's CPUs); then one batch decoded, before any request."""
        if not self.decoder_kind or self.gpu_pixels is not None:
            return
        transform = self.io.transform
        executor = ThreadPoolExecutor(slots_for(self.num_cpus), thread_name_prefix="cpu-decode")
        started = time.perf_counter()
        self.gpu_pixels = open_gpu_pixels(transform, self.args.limits, self.num_cpus, cfg.max_batch_size, 0, executor)
        self.gpu_pixels([[_warm_jpeg(transform)] * min(cfg.max_batch_size, 4)])
        self.gpu_pixels.reset_counts()
        logger.info(
            "Classifier_%s decodes its batches (decode_in: gpu, decoder %s), ready in %.1fs",
            self.variant,
            self.decoder_kind,
            time.perf_counter() - started,
        )

    def _decode_items(self, items: list[Item]) -> list[Pixels | ServiceError | None]:
        """Per item: its decoded Pixels, its ServiceError (the deadline passed), or None (it came as pixels). In the
        batch's thread; one decode call for every encoded item of the batch."""
        out: list[Pixels | ServiceError | None] = [None] * len(items)
        now = time.time()
        todo = []
        for i, it in enumerate(items):
            if it.encoded is None:
                continue
            if it.wall_deadline is not None and now >= it.wall_deadline:
                out[i] = ServiceError("inference_timeout", "the deadline passed before the images were decoded")
            else:
                todo.append(i)
        if todo:
            assert self.gpu_pixels is not None, "decode_in: gpu opens the decoder at start"
            decoded, counts = self.gpu_pixels([items[i].encoded or [] for i in todo])
            self.metrics.record_decode(self.variant, counts)
            for i, pixels in zip(todo, decoded, strict=True):
                out[i] = Pixels(self.io.checked(pixels.array), pixels.preprocess_ms, pixels.errors, pixels.positions)
        return out

    def _items(self, pixels: Pixels | Encoded, rows: list[int] | None, arrived: float, step: int) -> list[Item]:
        """One request's images in engine batches of at most `step`: pixels (`rows` of them), or encoded."""
        if isinstance(pixels, Encoded):
            return [Item(None, arrived, c, pixels.wall_deadline) for c in encoded_chunks(pixels, step)]
        array = self.io.checked(pixels.array)
        array = array[rows] if rows is not None else array
        return [Item(array[i : i + step], arrived) for i in range(0, len(array), step)]

    @staticmethod
    def _answer(
        pixels: Pixels | Encoded, done: list[Done], rows: list[int] | None
    ) -> tuple[np.ndarray | None, dict[int, ServiceError], list[int], float]:
        """The request's logits (`rows` of the decoded images, when encoded), errors by position, the positions of
        the logits' rows, and its decode time."""
        for d in done:
            if d.error is not None:
                raise d.error
        logits = done[0].logits if len(done) == 1 else np.concatenate([d.logits for d in done]) if done else None
        if not isinstance(pixels, Encoded):
            return logits, pixels.errors, pixels.positions, pixels.preprocess_ms
        errors, positions, preprocess_ms = merge_decoded([d.decoded for d in done if d.decoded is not None])
        if rows is not None and logits is not None:
            logits = logits[rows]
        return logits, errors, positions, preprocess_ms

    async def _decode_batch(self, items: list[Item], executor: Executor | None) -> list[Pixels | ServiceError | None]:
        if all(it.encoded is None for it in items):
            return [None] * len(items)
        return await asyncio.get_running_loop().run_in_executor(executor, self._decode_items, items)

    def describe_decode(self) -> dict[str, Any] | None:
        if self.gpu_pixels is None:
            return None
        return {"where": "gpu", "decoder": self.decoder_kind, "images": self.gpu_pixels.counts()}


def encoded_chunks(encoded: Encoded, step: int) -> list[list[bytes]]:
    return [encoded.images[i : i + step] for i in range(0, len(encoded.images), step)]


def merge_decoded(chunks: list[Pixels]) -> tuple[dict[int, ServiceError], list[int], float]:
    """The chunks of one request, decoded in (possibly) several batches: its errors and row positions in request
    order, and the longest decode."""
    errors: dict[int, ServiceError] = {}
    positions: list[int] = []
    offset = 0
    for pixels, size in ((c, len(c.positions) + len(c.errors)) for c in chunks):
        errors |= {offset + i: e for i, e in pixels.errors.items()}
        positions += [offset + p for p in pixels.positions]
        offset += size
    return errors, positions, max((c.preprocess_ms for c in chunks), default=0.0)


def _warm_jpeg(t: Transform) -> bytes:
    """A JPEG of the model's input size: the warm-up's batch."""
    from app.imaging.opencv import cv2

    image = np.full((max(t.height, 16), max(t.width, 16), 3), 128, np.uint8)
    ok, data = cv2.imencode(".jpg", image)
    assert ok
    return bytes(data)


__all__ = ["Done", "GpuDecoding", "Item", "encoded_chunks", "merge_decoded"]
