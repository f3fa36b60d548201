"""A Classifier replica's batch decoder: what the engine's batch is made of, host pixels as they came, or (`decode_in:
gpu`) the encoded images of the batch decoded here, where the GPU is.

With `decode_in: gpu` the Router sends `Encoded` (header-checked there); a request's images ride the same dynamic batch
as everyone else's, one `GpuPixels` call decodes the whole batch (JPEGs by the GPU's decoders, the rest by the CPU
path, per-image errors as the Preprocessor gives them), and the engine runs on what decoded. An image not decoded by
the caller's deadline is not started: the request fails with inference_timeout (503), as a Preprocessor's would.

The device mode (chosen at start, per engine): the batch's images are decoded into ONE pooled `DeviceBatch`, which the
engine reads in place; where it cannot be had, or the warm-up's JPEGs do not give the host mode's logits through it,
the replica serves in the host mode and says why: `describe()["device_batch"]` and the start-up log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.config import AppArgs, ClassifierConfig, Limits
from app.errors import ServiceError
from app.imaging.decode_budget import slots_for
from app.imaging.payloads import Encoded, Pixels
from app.imaging.transform import Transform
from app.runtime import Engine
from app.runtime.cuda_transform import DECODER_ENV, decoder_factory, open_gpu_pixels
from app.runtime.device_batch import DeviceBatch, DevicePool
from app.runtime.gpu_pixels import DeviceRows, GpuPixels
from app.runtime.graphs import context_broken
from app.serve.device_mode import DeviceModeOff, OnDevice, check_device_mode, open_device_batches
from app.serve.metrics import ClassifierMetrics
from app.served_model.model_io import ModelIO

logger = logging.getLogger("ray.serve")


@dataclass
class Item:
    """One request's share of an engine batch: its pixels, or (decode_in: gpu) its encoded images."""

    pixels: np.ndarray | None
    arrived: float
    encoded: list[bytes] | None = None
    wall_deadline: float | None = None
    trace: Any = None  # traced: the request's context (`app.serve.batch_trace` links the batch to it)

    def __len__(self) -> int:
        return len(self.pixels) if self.pixels is not None else len(self.encoded or ())


@dataclass
class Done:
    """What one Item's share of an engine batch gave."""

    logits: np.ndarray
    queue_ms: float
    inference_ms: float
    batch_size: int
    decoded: Pixels | DeviceRows | None = None  # decode_in: gpu: what the batch decoded of the item's images
    error: ServiceError | None = None  # the item's deadline passed before its decode


class BatchDecoder:
    """Host pixels pass through; with `decoder_kind` set (decode_in: gpu) the batch's encoded images are decoded."""

    def __init__(self, variant: str, metrics: ClassifierMetrics, decoder_kind: str = "", num_cpus: float = 1.0) -> None:
        self.variant, self.metrics, self.decoder_kind, self.num_cpus = variant, metrics, decoder_kind, num_cpus
        self.gpu_pixels: GpuPixels | None = None  # decode_in: gpu, opened at the first reconfigure
        self.device_pool: DevicePool | None = None  # the device mode's buffers (None: the host mode)
        self.device_off = "not chosen yet"
        self._device_for: Engine | None = None  # the engine the device mode was decided for

    @classmethod
    def for_replica(
        cls, args: AppArgs, variant: str, gpu: bool, num_cpus: float, metrics: ClassifierMetrics
    ) -> BatchDecoder:
        """At start: decode_in: gpu needs a GPU here (or the host stand-in, APP_GPU_DECODER=standin: tests only)."""
        if args.decode_in != "gpu":
            return cls(variant, metrics)
        kind, _ = decoder_factory()
        if kind != "standin" and not gpu:
            raise RuntimeError(
                f"Classifier_{variant}: args.decode_in is gpu, but this replica was granted no GPU "
                f"(ray_actor_options.num_gpus): its batches decode JPEGs on the GPU; on a CPU node use decode_in: "
                f"preprocessor or router ({DECODER_ENV}={kind})"
            )
        return cls(variant, metrics, kind, num_cpus)

    def open(self, cfg: ClassifierConfig, io: ModelIO, engine: Engine, limits: Limits) -> None:
        """decode_in: gpu, once at the first reconfigure: the decoder (its GPU memory preallocated for a full batch),
        the transform on the GPU, the CPU path's threads (the replica's CPUs); then one batch decoded, before any
        request. For each engine opened (the first, and one a live change opened again): the device mode or the host
        mode, checked."""
        if not self.decoder_kind:
            return
        if self.gpu_pixels is None:
            transform = io.transform
            executor = ThreadPoolExecutor(slots_for(self.num_cpus), thread_name_prefix="cpu-decode")
            started = time.perf_counter()
            self.gpu_pixels = open_gpu_pixels(transform, limits, self.num_cpus, cfg.max_batch_size, 0, executor)
            self.gpu_pixels([[_warm_jpeg(transform)] * min(cfg.max_batch_size, 4)])
            logger.info(
                "Classifier_%s decodes its batches (decode_in: gpu, decoder %s), ready in %.1fs",
                self.variant,
                self.decoder_kind,
                time.perf_counter() - started,
            )
        if self._device_for is not engine:  # at start, and for an engine opened again
            self._device_for = engine
            self._choose_device_mode(engine, io.transform, cfg.max_batch_size)
            self.gpu_pixels.reset_counts()  # /v1/models counts what requests brought

    def _choose_device_mode(self, engine: Engine, transform: Transform, max_batch: int) -> None:
        """The device mode if this engine can read a DeviceBatch and the warm-up's JPEGs give through it what they give
        in the host mode; else the host mode, saying why."""
        assert self.gpu_pixels is not None
        try:
            pool = open_device_batches(engine, self.gpu_pixels, self.decoder_kind, max_batch)
            check_device_mode(self.gpu_pixels, engine, pool, warm_jpegs(transform, min(max_batch, 4)))
        except Exception as e:  # DeviceModeOff, or anything the check met: never worse than the host mode
            if context_broken(e):  # the host mode cannot serve either
                raise RuntimeError(f"Classifier_{self.variant}: the device mode's check broke the CUDA context") from e
            why = str(e) if isinstance(e, DeviceModeOff) else f"the start-up check failed: {type(e).__name__}: {e}"
            self.device_pool, self.device_off = None, why.strip().splitlines()[0][:300]
            logger.warning(
                "Classifier_%s: the model's pixels go through host memory (decode_in: gpu, host mode): %s",
                self.variant,
                self.device_off,
            )
            return
        self.device_pool, self.device_off = pool, ""
        logger.info("Classifier_%s: decoded batches feed the engine on the device (device mode)", self.variant)

    @contextlib.contextmanager
    def device_batch(self, items: list[Item]) -> Iterator[DeviceBatch | None]:
        """The device mode: a pooled DeviceBatch for the batch, given back when it is done (an exception included);
        None in the host mode, or for a batch with no encoded item."""
        pool = self.device_pool
        if pool is None or all(it.encoded is None for it in items):
            yield None
            return
        with pool.take(sum(len(it) for it in items)) as batch:
            yield batch

    async def decode(
        self, items: list[Item], io: ModelIO, executor: Executor | None, batch: DeviceBatch | None = None
    ) -> list[Pixels | DeviceRows | ServiceError | None]:
        """Per item: its decoded Pixels (or, into `batch`, its DeviceRows), its ServiceError (the deadline passed), or
        None (it came as pixels). One decode call for every encoded item of the batch, in `executor`."""
        if all(it.encoded is None for it in items):
            return [None] * len(items)
        return await asyncio.get_running_loop().run_in_executor(executor, self.decode_now, items, io, batch)

    def decode_now(
        self, items: list[Item], io: ModelIO, batch: DeviceBatch | None = None
    ) -> list[Pixels | DeviceRows | ServiceError | None]:
        """`decode` in the calling thread."""
        out: list[Pixels | DeviceRows | ServiceError | None] = [None] * len(items)
        now = time.time()
        todo = []
        for i, it in enumerate(items):
            if it.encoded is None:
                continue
            if it.wall_deadline is not None and now >= it.wall_deadline:
                out[i] = ServiceError("inference_timeout", "the deadline passed before the images were decoded")
            else:
                todo.append(i)
        if todo and batch is not None:
            assert self.gpu_pixels is not None, "decode_in: gpu opens the decoder at start"
            rows, counts = self.gpu_pixels.into([items[i].encoded or [] for i in todo], batch)
            self.metrics.record_decode(self.variant, counts)
            for i, r in zip(todo, rows, strict=True):
                out[i] = r
        elif todo:
            assert self.gpu_pixels is not None, "decode_in: gpu opens the decoder at start"
            decoded, counts = self.gpu_pixels([items[i].encoded or [] for i in todo])
            self.metrics.record_decode(self.variant, counts)
            for i, pixels in zip(todo, decoded, strict=True):
                out[i] = Pixels(io.checked(pixels.array), pixels.preprocess_ms, pixels.errors, pixels.positions)
        return out

    @staticmethod
    def engine_input(
        items: list[Item],
        decoded: list[Pixels | DeviceRows | ServiceError | None],
        batch: DeviceBatch | None,
        shape: tuple[int, ...],
    ) -> tuple[np.ndarray | OnDevice, list[slice | list[int]]]:
        """The engine's batch (host pixels concatenated, or the DeviceBatch's rows) and each item's rows of it."""
        picks: list[slice | list[int]] = []
        if batch is None:
            arrays = [_rows(it, d, shape) for it, d in zip(items, decoded, strict=True)]
            row = 0
            for array in arrays:
                picks.append(slice(row, row + len(array)))
                row += len(array)
            return (arrays[0] if len(arrays) == 1 else np.concatenate(arrays)), picks
        for it, d in zip(items, decoded, strict=True):
            if it.pixels is not None:  # host pixels in a device batch (not sent with decode_in: gpu today): copied up
                rows = [batch.claim() for _ in range(len(it.pixels))]
                for r, pixels in zip(rows, it.pixels, strict=True):
                    batch.upload(r, pixels)
                picks.append(rows)
            else:
                picks.append(d.rows if isinstance(d, DeviceRows) else [])
        return OnDevice(batch, batch.used), picks

    def describe(self) -> dict[str, Any] | None:
        """decode_in: gpu: where this replica's images were decoded; else None."""
        if self.gpu_pixels is None:
            return None
        device = {"active": self.device_pool is not None} | ({"off": self.device_off} if self.device_off else {})
        return {
            "where": "gpu",
            "decoder": self.decoder_kind,
            "images": self.gpu_pixels.counts(),
            "device_batch": device,
        }


def split(pixels: Pixels | Encoded, rows: list[int] | None, arrived: float, step: int, io: ModelIO) -> list[Item]:
    """One request's images in engine batches of at most `step`: pixels (`rows` of them), or encoded."""
    if isinstance(pixels, Encoded):
        return [Item(None, arrived, c, pixels.wall_deadline) for c in encoded_chunks(pixels, step)]
    array = io.checked(pixels.array)
    array = array[rows] if rows is not None else array
    return [Item(array[i : i + step], arrived) for i in range(0, len(array), step)]


def join(
    pixels: Pixels | Encoded, done: list[Done], rows: list[int] | None
) -> tuple[np.ndarray | None, dict[int, ServiceError], list[int], float]:
    """The request's logits (`rows` of the decoded images, when encoded), errors by position, the positions of the
    logits' rows, and its decode time."""
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


def _rows(item: Item, decoded: Pixels | DeviceRows | ServiceError | None, shape: tuple[int, ...]) -> np.ndarray:
    """The host mode: the item's rows of the engine's batch, its pixels or what its images decoded to (none if they
    did not)."""
    if item.pixels is not None:
        return item.pixels
    if isinstance(decoded, Pixels):
        return decoded.array
    return np.zeros((0, *shape), np.uint8)


def encoded_chunks(encoded: Encoded, step: int) -> list[list[bytes]]:
    return [encoded.images[i : i + step] for i in range(0, len(encoded.images), step)]


def merge_decoded(chunks: Sequence[Pixels | DeviceRows]) -> tuple[dict[int, ServiceError], list[int], float]:
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
    return _jpeg(np.full(_warm_shape(t), 128, np.uint8))


def warm_jpegs(t: Transform, n: int) -> list[bytes]:
    """n different JPEGs of the model's input size (noise, one seed each): rows that a mix-up would tell apart."""
    return [_jpeg(np.random.default_rng(s).integers(0, 256, _warm_shape(t), np.uint8)) for s in range(max(n, 1))]


def _warm_shape(t: Transform) -> tuple[int, int, int]:
    return max(t.height, 16), max(t.width, 16), 3


def _jpeg(image: np.ndarray) -> bytes:
    from app.imaging.opencv import cv2

    ok, data = cv2.imencode(".jpg", image)
    assert ok
    return bytes(data)


__all__ = [
    "BatchDecoder",
    "Done",
    "Item",
    "encoded_chunks",
    "join",
    "merge_decoded",
    "split",
    "warm_jpegs",
]
