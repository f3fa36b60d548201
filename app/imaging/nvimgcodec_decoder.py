"""nvImageCodec as the `DeviceDecoder` of `app.imaging.gpu_decode`: hardware JPEG decoder first, then hybrid CUDA.

Needs a CUDA device and the `nvidia-nvimgcodec-cu12` (or -cu13) wheel, which provides `nvidia.nvimgcodec`; imported
when a decoder is built, so this module imports anywhere. Nothing here runs in CI (see tests/test_gpu_decode_unit.py).

The API calls, as NVIDIA/nvImageCodec (v0.7.0 .. v0.8.0 and main, 2026-04) defines them:
  nvimgcodec.Decoder(device_id=, max_num_cpu_threads=, backends=, options=)      python/decoder.cpp (the py::init)
      max_num_cpu_threads: the threads of its default executor; 0 would mean every core of the node, so the
      replica's CPUs (`slots_for`, `app.imaging.decode_budget`) are passed instead.
  nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY | HYBRID_CPU_GPU)        python/backend.cpp, backend_kind.cpp
      HW_GPU_ONLY is nvjpeg_hw_decoder (extensions/nvjpeg/hw_decoder.cpp), HYBRID_CPU_GPU nvjpeg_cuda_decoder
      (extensions/nvjpeg/cuda_decoder.cpp): two decoders, one backend each, so each image's backend is known (an
      nvimgcodec.Image does not say which decoder made it, python/image.cpp).
  nvimgcodec.DecodeParams(apply_exif_orientation=True, color_spec=ColorSpec.SRGB, allow_any_depth=False)
                                                                    python/decode_params.cpp, python/color_spec.cpp
  nvimgcodec.CodeStream(bytes)                                                    python/code_stream.cpp
  Decoder.decode(srcs, params=, cuda_stream=) -> list of Image, None where an image could not be decoded
                                                                                  python/decoder.cpp
Options (the `options` string, parsed by each decoder's parseOptions):
  nvjpeg_hw_decoder:preallocate_width_hint=W, :preallocate_height_hint=H, :preallocate_batch_size=N
      extensions/nvjpeg/hw_decoder.cpp: nvjpegDecodeBatchedPreAllocate(N, W, H, CSS_444, RGBI) when the decoder is
      built, i.e. at warm-up. The hybrid decoder has no such hint usable from Python (its device_memory_padding needs
      a custom allocator, extensions/nvjpeg/cuda_decoder.cpp), so `max_pixels` (W x H) also bounds what it grows to:
      larger JPEGs go to the CPU path (gpu_decode.cpu_reason).
  :fancy_upsampling=1  extensions/nvjpeg/nvjpeg_utils.cpp: chroma upsampled as libjpeg does (OpenCV's CPU path, and
      the INT8 calibration); the Python binding's default is 0.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from app.imaging.decode_budget import slots_for
from app.imaging.gpu_decode import DeviceBackend

PACKAGE = "nvidia-nvimgcodec-cu12"


class NvImageCodecDecoder:
    """JPEGs decoded on GPU `device_id`: a batch through the hardware decoder, what it declines through the hybrid
    CUDA decoder. Images are nvimgcodec.Image (device memory, uint8 RGB HWC; __cuda_array_interface__, __dlpack__)."""

    def __init__(
        self,
        num_cpus: float,
        device_id: int = 0,
        max_batch: int = 32,
        max_width: int = 4096,
        max_height: int = 4096,
        cuda_stream: int = 0,
    ) -> None:
        try:
            from nvidia import nvimgcodec
        except ImportError as e:
            raise RuntimeError(
                f"decode_in: gpu needs NVIDIA nvImageCodec (the Python module nvidia.nvimgcodec): "
                f"pip install {PACKAGE} (or nvidia-nvimgcodec-cu13 for CUDA 13), on a node with a CUDA GPU ({e})"
            ) from e
        self._nv: Any = nvimgcodec
        self._lock = threading.Lock()
        self._stream = cuda_stream
        self._max_pixels = max_width * max_height
        threads = slots_for(num_cpus)
        hints = " ".join(
            f"nvjpeg_hw_decoder:{k}={v}"
            for k, v in (
                ("preallocate_width_hint", max_width),
                ("preallocate_height_hint", max_height),
                ("preallocate_batch_size", max_batch),
            )
        )
        kinds: tuple[tuple[DeviceBackend, Any, str], ...] = (
            ("hardware", nvimgcodec.BackendKind.HW_GPU_ONLY, hints),
            ("hybrid", nvimgcodec.BackendKind.HYBRID_CPU_GPU, ""),
        )
        self._decoders: list[tuple[DeviceBackend, Any]] = []
        for name, kind, options in kinds:  # one backend each: an Image does not say which decoder made it
            decoder = nvimgcodec.Decoder(
                device_id=device_id,
                max_num_cpu_threads=threads,
                backends=[nvimgcodec.Backend(kind)],
                options=f":fancy_upsampling=1 {options}".strip(),
            )
            self._decoders.append((name, decoder))
        self._params = nvimgcodec.DecodeParams(
            apply_exif_orientation=True, color_spec=nvimgcodec.ColorSpec.SRGB, allow_any_depth=False
        )

    @property
    def max_pixels(self) -> int:
        return self._max_pixels

    def decode(self, images: Sequence[bytes]) -> list[tuple[Any, DeviceBackend] | None]:
        """One batch at a time: a Classifier runs max_concurrent_batches batches in threads, and nvImageCodec's
        documentation promises no thread safety for one Decoder's calls (the hardware decoder is one engine anyway)."""
        with self._lock:
            return self._decode(images)

    def _decode(self, images: Sequence[bytes]) -> list[tuple[Any, DeviceBackend] | None]:
        out: list[tuple[Any, DeviceBackend] | None] = [None] * len(images)
        streams = [self._nv.CodeStream(bytes(data)) for data in images]
        todo = list(range(len(images)))
        for name, decoder in self._decoders:  # hardware, then hybrid for what it left
            if not todo:
                break
            decoded = decoder.decode([streams[i] for i in todo], params=self._params, cuda_stream=self._stream)
            for i, image in zip(todo, decoded, strict=True):
                if image is not None:
                    out[i] = (image, name)
            todo = [i for i in todo if out[i] is None]
        return out


__all__ = ["PACKAGE", "NvImageCodecDecoder"]
