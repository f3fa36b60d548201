"""The device mode of `decode_in: gpu` (the Classifier's BatchDecoder): a Classifier replica's batch decoded into ONE
pooled `DeviceBatch`, the engine's input buffer, which the engine reads in place
(`OrtEngine.run_device`), so that the model's pixels never cross to the host, only the logits do.

Chosen once per engine, at start: `open_device_batches` opens the pool only for an ONNX Runtime engine whose input
sits where the transform writes (the GPU, nvImageCodec; the CPU, the stand-in decoder), and `check_device_mode` keeps
it only if the warm-up's JPEGs give through it the host mode's logits. Otherwise `DeviceModeOff` says why, and the
replica serves in the host mode (the transform's pixels to the host, concatenated, copied up by the engine). Kept
apart from the BatchDecoder that uses it, so that what the mode is and how it is checked read in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.runtime import Engine
from app.runtime.cuda_transform import STANDIN
from app.runtime.device_batch import Copier, CudaCopier, DeviceBatch, DevicePool, HostCopier
from app.runtime.gpu_pixels import GpuPixels


@dataclass
class OnDevice:
    """An engine batch in a DeviceBatch: its first n rows (holes included)."""

    batch: DeviceBatch
    n: int

    def __len__(self) -> int:
        return self.n


class DeviceModeOff(Exception):
    """Why a replica decodes in the host mode."""


def host_pixels(x: np.ndarray | OnDevice) -> np.ndarray:
    """The engine batch as numpy (the device mode's rows copied to the host: for the profiling twin)."""
    return x.batch.host(x.n) if isinstance(x, OnDevice) else x


def engine_logits(engine: Engine, x: np.ndarray | OnDevice) -> np.ndarray:
    """The engine's logits for the batch, read in place when it is on the device and the engine can (ONNX Runtime)."""
    if not isinstance(x, OnDevice):
        return np.asarray(engine.logits(x))
    if engine.device_input() is None:
        return np.asarray(engine.logits(host_pixels(x)))
    return np.asarray(engine.run_device(x.batch, x.n, [engine.spec.output_names[0]])[0])


def open_device_batches(engine: Engine, gp: GpuPixels, decoder_kind: str, max_batch: int) -> DevicePool:
    """The device mode's pool for `engine`: one DeviceBatch per batch running at once, where the transform writes
    and the engine reads. DeviceModeOff says why not."""
    where = engine.device_input()
    if where is None:
        raise DeviceModeOff(
            f"the engine ({engine.name}) reads host arrays only (its input is {engine.spec.input_dtype}; a device "
            "batch needs ONNX Runtime with the model's uint8 pixels)"
        )
    kind, device_id = where
    if tuple(engine.spec.sample_shape()) != tuple(gp.shape):
        raise DeviceModeOff(f"the engine takes {engine.spec.sample_shape()} per image, the transform gives {gp.shape}")
    if not gp.writes_in_place:
        raise DeviceModeOff("the transform cannot write into a device batch")
    copier: Copier
    if decoder_kind == STANDIN:
        if kind != "cpu":
            raise DeviceModeOff("the stand-in decoder's transform writes host memory; the engine reads the GPU's")
        copier = HostCopier()
    else:
        transform_device = getattr(gp.transform, "device_id", None)
        if kind != "cuda" or transform_device != device_id:
            raise DeviceModeOff(f"the engine reads {kind}:{device_id}, the transform writes cuda:{transform_device}")
        copier = CudaCopier(int(getattr(gp.transform, "stream", 0)))
    shape = tuple(gp.shape)
    return DevicePool(lambda rows: DeviceBatch(rows, shape, kind, device_id, copier), engine.rows_for, max_batch)


# The warm-up's logits through the device mode against the host mode's, relative to the largest: the same JPEGs, the
# same decoder and transform, the same session and padded shape, so only a kernel's run-to-run rounding may differ
# (graphs.CHECK_RTOL's reasoning); a row read from the wrong place is off by the logits' own size.
DEVICE_CHECK_RTOL = 1e-2


def check_device_mode(gp: GpuPixels, engine: Engine, pool: DevicePool, jpegs: list[bytes]) -> None:
    """The JPEGs decoded both ways: the device mode's logits must be the host mode's (DeviceModeOff if not)."""
    (host,), _ = gp([jpegs])
    want = engine_logits(engine, host.array)
    with pool.take(len(jpegs)) as batch:
        (rows,), _ = gp.into([jpegs], batch)
        got = engine_logits(engine, OnDevice(batch, batch.used))[rows.rows]
    if rows.positions != host.positions or got.shape != want.shape:
        raise DeviceModeOff(
            f"the warm-up decoded rows {rows.positions} in the device mode, {host.positions} in the host's"
        )
    gap = float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0))
    if not np.isfinite(gap) or gap > DEVICE_CHECK_RTOL * max(1.0, float(np.max(np.abs(want), initial=0.0))):
        raise DeviceModeOff(
            f"the warm-up's logits through the device batch differ from the host mode's (max gap {gap:.3g})"
        )


__all__ = [
    "DeviceModeOff",
    "OnDevice",
    "check_device_mode",
    "engine_logits",
    "host_pixels",
    "open_device_batches",
]
