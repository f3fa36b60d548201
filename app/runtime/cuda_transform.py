"""`decode_in: gpu` on a GPU node: nvImageCodec's images through the transform graph on ORT's CUDA EP, one stream.

The decoded image never goes to host memory: its device pointer (`__cuda_array_interface__`, uint8 RGB HWC,
contiguous) is bound as the transform graph's input (IOBinding.bind_input on 'cuda'). The model's pixels (uint8
224x224x3 for the built-in model) are written by `into` straight into the engine's input buffer on the device (a row
of `app.runtime.device_batch`'s DeviceBatch: the device mode), or, in the host mode (`__call__`: a replica whose
engine cannot read that buffer), copied back to host memory for the engine's batch. The two libraries' GPU work is
ordered by ONE CUDA stream: nvImageCodec decodes on it (`cuda_stream=`) and the transform session computes on it
(the CUDA EP's `user_compute_stream`, onnxruntime PR #19229), so the graph cannot read a half-written image.
Measured on an H200 without that ordering (../shared/gpu-2026-12-04/probe4.log): a 640x480 image read half-written,
mean absolute difference 69 from the CPU decode; with a device-wide synchronisation after the decode, 0.0.
tests/test_gpu_pixels_unit.py checks that both get the same, non-zero stream (ONNX Runtime takes stream 0 as "none"
and would use its own).

`open_gpu_pixels` builds the Classifier's GpuPixels: nvImageCodec + this on a GPU node; with APP_GPU_DECODER=standin
in the replica's environment, the host stand-in (`app.imaging.standin_decoder`) + the transform graph on the CPU EP:
the same batch logic, fallbacks and errors on a machine without a CUDA device (the tests' way; never for serving).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np

from app.config import Limits
from app.imaging.gpu_decode import BatchDecode, DeviceDecoder
from app.imaging.nvimgcodec_decoder import PACKAGE
from app.imaging.transform import Transform
from app.runtime.device_batch import load_cudart
from app.runtime.gpu_pixels import GpuPixels, ImageTransform
from app.runtime.plan import CUDA, PlanError
from app.runtime.transform_graph import INPUT, OUTPUT, GraphTransform

DECODER_ENV = "APP_GPU_DECODER"
STANDIN = "standin"
CUDA_STREAM_NON_BLOCKING = 0x01  # cudaStreamNonBlocking: no implicit ordering with the legacy default stream


def new_stream() -> int:
    """A CUDA stream of its own (cudaStreamCreateWithFlags through the CUDA runtime ONNX Runtime's CUDA EP loaded)."""
    cudart = load_cudart()
    stream = ctypes.c_void_p()
    rc = cudart.cudaStreamCreateWithFlags(ctypes.byref(stream), ctypes.c_uint(CUDA_STREAM_NON_BLOCKING))
    if rc != 0 or not stream.value:
        raise RuntimeError(f"cudaStreamCreateWithFlags failed (cudaError {rc})")
    return int(stream.value)


def cuda_provider(device_id: int, stream: int) -> tuple[str, dict[str, str]]:
    """The CUDA EP on `stream`; TF32 off (the transform's area MatMuls would round differently, transform_graph.py)."""
    if stream == 0:
        raise ValueError("the transform must run on the decoder's own stream; 0 means ONNX Runtime's own")
    return ("CUDAExecutionProvider", {"device_id": str(device_id), "user_compute_stream": str(stream), "use_tf32": "0"})


class CudaImageTransform:
    """The transform graph on the CUDA EP, its input an nvImageCodec image bound by device pointer."""

    def __init__(self, t: Transform, device_id: int, stream: int) -> None:
        self.device_id = device_id
        self.stream = stream
        self.graph = GraphTransform(t, [cuda_provider(device_id, stream)])

    def _bound(self, image: Any) -> Any:
        """An IOBinding with `image`'s device memory bound as the graph's input (checked: contiguous uint8 RGB)."""
        cai = image.__cuda_array_interface__
        shape = tuple(int(s) for s in cai["shape"])
        if cai.get("typestr") != "|u1" or len(shape) != 3 or shape[2] != 3:
            raise ValueError(f"expected a uint8 RGB [H, W, 3] device image, got {cai.get('typestr')} {shape}")
        if cai.get("strides") not in (None, (shape[1] * 3, 3, 1)):
            raise ValueError(f"expected a contiguous device image, got strides {cai.get('strides')}")
        binding = self.graph.session.io_binding()
        binding.bind_input(INPUT, "cuda", self.device_id, np.uint8, list(shape), int(cai["data"][0]))
        return binding

    def __call__(self, image: Any) -> np.ndarray:
        """The model's pixels on the host (the host mode: GpuPixels.__call__)."""
        binding = self._bound(image)
        binding.bind_output(OUTPUT, "cpu")
        self.graph.session.run_with_iobinding(binding)
        out: np.ndarray = binding.copy_outputs_to_cpu()[0]
        return out

    def into(self, image: Any, ptr: int) -> None:
        """The model's pixels written to device memory at `ptr` (a DeviceBatch's row, uint8 [1, h, w, C]), never to
        the host. Complete when this returns: ORT synchronises the EP's compute stream (here the decoder's) at the
        end of every Run unless the run option disable_synchronize_execution_providers is "1" (its default "0",
        onnxruntime_run_options_config_keys.h: "it omit[s] triggering cudaStreamSynchronize on the compute stream").
        NOT YET RUN ON A GPU: the same binding on "cpu" (GraphTransform.into) is what CI runs."""
        binding = self._bound(image)
        binding.bind_output(OUTPUT, "cuda", self.device_id, np.uint8, [1, *self.graph.transform.shape], ptr)
        self.graph.session.run_with_iobinding(binding)


def _nvimgcodec(
    t: Transform, num_cpus: float, max_batch: int, device_id: int
) -> tuple[DeviceDecoder[Any], ImageTransform]:
    from app.imaging.nvimgcodec_decoder import NvImageCodecDecoder  # imports nvImageCodec only when built

    transform = CudaImageTransform(t, device_id, new_stream())
    decoder = NvImageCodecDecoder(num_cpus, device_id, max_batch, cuda_stream=transform.stream)
    return decoder, transform


def _standin(
    t: Transform, num_cpus: float, max_batch: int, device_id: int
) -> tuple[DeviceDecoder[Any], ImageTransform]:
    from app.imaging.standin_decoder import HostJpegDecoder

    return HostJpegDecoder(), GraphTransform(t)


Factory = Callable[[Transform, float, int, int], tuple[DeviceDecoder[Any], ImageTransform]]


def decoder_factory(environ: dict[str, str] | None = None) -> tuple[str, Factory]:
    """("nvimgcodec" | "standin", how to build it), from APP_GPU_DECODER (unset: nvImageCodec)."""
    chosen = (environ if environ is not None else os.environ).get(DECODER_ENV, "")
    if chosen in ("", "nvimgcodec"):
        return "nvimgcodec", _nvimgcodec
    if chosen == STANDIN:
        return STANDIN, _standin
    raise ValueError(f"{DECODER_ENV}={chosen!r}: nvimgcodec (the default) or {STANDIN}")


def nvimgcodec_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ModuleNotFoundError:  # no nvidia namespace at all
        return False


def plan_decode(decode_in: str, gpu: bool, available: list[str], nvimgcodec: bool | None) -> dict[str, str]:
    """Where a config's images are decoded on a node offering `available` to a replica granted a GPU (`gpu`) or not;
    `nvimgcodec`: whether nvImageCodec is installed (None: not known, the providers were listed by hand). Raises
    PlanError where `decode_in: gpu` cannot run there, saying why."""
    if decode_in != "gpu":
        return {"where": decode_in}
    if not gpu:
        raise PlanError(
            "decode_in: gpu: a Classifier replica without a GPU cannot decode on one (plan with --gpu for a GPU node; "
            "on CPU nodes use decode_in: preprocessor or router)"
        )
    if CUDA not in available:
        raise PlanError(
            f"decode_in: gpu: the declared transform runs on the CUDA EP, which is not usable here (available: "
            f"{', '.join(available) or 'none'})"
        )
    if nvimgcodec is False:
        raise PlanError(f"decode_in: gpu needs NVIDIA nvImageCodec on each GPU node: pip install {PACKAGE}")
    return {
        "where": "gpu",
        "decoder": "nvImageCodec: the hardware JPEG decoder, then the hybrid CUDA decoder; every other image, and "
        "what both decline, by the CPU path in the same batch",
        "transform": "the declared transform as an ONNX graph on the CUDA EP, on the decoder's CUDA stream",
    }


def open_gpu_pixels(
    t: Transform,
    limits: Limits,
    num_cpus: float,
    max_batch: int,
    device_id: int = 0,
    executor: Executor | None = None,
    factory: Factory | None = None,
) -> GpuPixels:
    """The Classifier's GPU decode: built at start, its decoder's memory preallocated for `max_batch` images."""
    if factory is None:
        _, factory = decoder_factory()
    decoder, transform = factory(t, num_cpus, max_batch, device_id)
    batch = BatchDecode(decoder, t, limits.max_pixels, limits.max_decode_bytes, True, executor)
    return GpuPixels(batch, transform)


__all__ = [
    "DECODER_ENV",
    "STANDIN",
    "CudaImageTransform",
    "cuda_provider",
    "decoder_factory",
    "new_stream",
    "open_gpu_pixels",
]
