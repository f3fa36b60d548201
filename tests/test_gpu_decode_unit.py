"""`decode_in: gpu`'s batch logic (app/imaging/gpu_decode.py) with a stand-in for nvImageCodec: which images go to the
device, in how many calls, what falls back to the CPU path and what comes out of it. Pure: no Ray, no GPU.

The stand-in decodes with OpenCV into RGB numpy arrays; told to, it declines images (None), answers "hybrid" for some,
or raises for the whole call. nvImageCodec itself needs a CUDA device: app/imaging/nvimgcodec_decoder.py is only
imported here (and built without the package, to see its error).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from app.errors import ImageInputError
from app.imaging.gpu_decode import BatchDecode, DeviceBackend, cpu_reason
from app.imaging.opencv import cv2
from app.imaging.preprocess import check_header, preprocess
from app.imaging.transform import Transform
from tests.hostile import cv_encode, jpeg_with_size, pattern_image, pil_encode, png_bomb

T = Transform(32, 32, resize_shorter=36)
BASE = pattern_image(60, 80)
JPEG = cv_encode(".jpg", BASE)
JPEG_B = cv_encode(".jpg", pattern_image(50, 70, seed=1))
JPEG_GRAY = cv_encode(".jpg", cv2.cvtColor(BASE, cv2.COLOR_BGR2GRAY))
PNG = cv_encode(".png", BASE)
PROGRESSIVE = cv_encode(".jpg", BASE, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
CMYK = pil_encode(Image.fromarray(BASE[..., ::-1]).convert("CMYK"), "JPEG", quality=90)
BROKEN = JPEG[: len(JPEG) // 2]  # header and part of the scan: OpenCV's decoder fails on it
JPEG_BOMB = jpeg_with_size(60_000, 60_000)
PNG_BOMB = png_bomb()


class StandIn:
    """A DeviceDecoder: OpenCV into RGB; `decline`: None for these; `hybrid`: decoded "by the hybrid backend"."""

    def __init__(
        self,
        max_pixels: int = 10_000_000,
        decline: Sequence[bytes] = (),
        hybrid: Sequence[bytes] = (),
        error: Exception | None = None,
        length_off: int = 0,
    ) -> None:
        self._max_pixels = max_pixels
        self.decline, self.hybrid = set(decline), set(hybrid)
        self.error = error
        self.length_off = length_off
        self.calls: list[list[bytes]] = []

    @property
    def max_pixels(self) -> int:
        return self._max_pixels

    def decode(self, images: Sequence[bytes]) -> list[tuple[np.ndarray, DeviceBackend] | None]:
        self.calls.append(list(images))
        if self.error is not None:
            raise self.error
        out: list[tuple[np.ndarray, DeviceBackend] | None] = []
        for data in images:
            img = None if data in self.decline else cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
            backend: DeviceBackend = "hybrid" if data in self.hybrid else "hardware"
            out.append(None if img is None else (cv2.cvtColor(img, cv2.COLOR_BGR2RGB), backend))
        return out[: len(out) - self.length_off]


def counts(**nonzero: int) -> dict[str, int]:
    return {"hardware": 0, "hybrid": 0, "cpu": 0, "failed": 0, "fallback": 0, "device_errors": 0, **nonzero}


def cpu_error(data: bytes) -> ImageInputError:
    with pytest.raises(ImageInputError) as e:
        preprocess(data, T)
    return e.value


def test_the_probe_routes_what_the_hardware_declines_to_the_cpu() -> None:
    def reason(data: bytes) -> str:
        return cpu_reason(check_header(data, 40_000_000, None)[0], 10_000_000)

    assert reason(JPEG) == reason(JPEG_GRAY) == reason(BROKEN) == ""
    assert "png" in reason(PNG)
    assert "progressive" in reason(PROGRESSIVE)
    assert "CMYK" in reason(CMYK)
    assert "pixels" in cpu_reason(check_header(JPEG, 40_000_000, None)[0], 80 * 60 - 1)


def test_a_mixed_batch_sends_its_jpegs_in_one_device_call_and_the_rest_to_the_cpu_path() -> None:
    device = StandIn(hybrid=[JPEG_B])
    batch = [JPEG, PNG, PROGRESSIVE, CMYK, BROKEN, JPEG_B, JPEG_GRAY]
    result = BatchDecode(device, T)(batch)

    assert device.calls == [[JPEG, BROKEN, JPEG_B, JPEG_GRAY]]
    assert [d.where for d in result.images] == ["hardware", "cpu", "cpu", "cpu", "failed", "hybrid", "hardware"]
    assert result.counts == counts(hardware=2, hybrid=1, cpu=3, failed=1, fallback=1)
    for data, d in zip(batch, result.images, strict=True):
        if d.where == "cpu":  # the CPU path's own pixels
            assert d.pixels is not None and d.device is None
            np.testing.assert_array_equal(d.pixels, preprocess(data, T))
        elif d.where in ("hardware", "hybrid"):  # the device's image, untouched: full size RGB
            assert d.pixels is None and isinstance(d.device, np.ndarray)
            bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
            assert bgr is not None
            np.testing.assert_array_equal(d.device, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))


def test_a_declined_jpeg_gives_the_cpu_paths_pixels() -> None:
    device = StandIn(decline=[JPEG])
    result = BatchDecode(device, T)([JPEG, JPEG_B])
    assert device.calls == [[JPEG, JPEG_B]]
    assert [d.where for d in result.images] == ["cpu", "hardware"]
    assert result.images[0].pixels is not None
    np.testing.assert_array_equal(result.images[0].pixels, preprocess(JPEG, T))
    assert result.counts == counts(hardware=1, cpu=1, fallback=1)


def test_a_broken_jpeg_gets_the_cpu_paths_error() -> None:
    expected = cpu_error(BROKEN)
    result = BatchDecode(StandIn(), T)([BROKEN])
    (d,) = result.images
    assert d.where == "failed" and d.error is not None and d.pixels is None and d.device is None
    assert (d.error.code, d.error.status, type(d.error)) == (expected.code, expected.status, type(expected))
    assert d.error.code == "undecodable_image" and d.error.status == 400
    assert result.counts == counts(failed=1, fallback=1)


@pytest.mark.parametrize("error", [RuntimeError("CUDA error: an illegal memory access"), MemoryError()])
def test_an_exception_for_the_whole_call_falls_back_the_batch(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    device = StandIn(error=error)
    batch = [JPEG, PNG, BROKEN, JPEG_B]
    with caplog.at_level(logging.WARNING, logger="app.imaging.gpu_decode"):
        result = BatchDecode(device, T)(batch)
    assert device.calls == [[JPEG, BROKEN, JPEG_B]]
    assert [d.where for d in result.images] == ["cpu", "cpu", "failed", "cpu"]
    for data, d in zip(batch, result.images, strict=True):
        if d.pixels is not None:
            np.testing.assert_array_equal(d.pixels, preprocess(data, T))
    assert result.images[2].error is not None and result.images[2].error.code == cpu_error(BROKEN).code
    assert result.counts == counts(cpu=3, failed=1, fallback=3, device_errors=1)
    assert any("GPU decode of 3 JPEG(s) failed" in r.getMessage() and r.exc_info for r in caplog.records)


def test_an_answer_of_the_wrong_length_falls_back_the_batch() -> None:
    result = BatchDecode(StandIn(length_off=1), T)([JPEG, JPEG_B])
    assert [d.where for d in result.images] == ["cpu", "cpu"]
    assert result.counts == counts(cpu=2, fallback=2, device_errors=1)


def test_what_the_header_check_refuses_never_reaches_the_device() -> None:
    device = StandIn()
    result = BatchDecode(device, T)([JPEG_BOMB, PNG_BOMB, b"", b"not an image"])
    assert device.calls == []  # nothing for the device: no call at all
    for data, d in zip([JPEG_BOMB, PNG_BOMB, b"", b"not an image"], result.images, strict=True):
        expected = cpu_error(data)
        assert d.where == "failed" and d.error is not None
        assert (d.error.code, d.error.status) == (expected.code, expected.status)
    assert [d.error.code for d in result.images if d.error] == [
        "too_many_pixels",
        "too_many_pixels",
        "empty_body",
        "undecodable_image",
    ]
    assert result.counts == counts(failed=4)

    # and beside images the device takes, the bombs still stay off it
    result = BatchDecode(device, T)([JPEG_BOMB, JPEG, PNG_BOMB])
    assert device.calls == [[JPEG]]
    assert result.counts == counts(hardware=1, failed=2)


def test_the_decode_budget_applies_before_the_device() -> None:
    device = StandIn()
    budget = 1 << 20  # a full-HD JPEG decoded for 32 px is reduced (IMREAD_REDUCED_COLOR_8): ~4 MiB overhead > 1 MiB
    big = cv_encode(".jpg", pattern_image(1080, 1920))
    result = BatchDecode(device, T, max_decode_bytes=budget)([big])
    assert device.calls == []
    assert result.images[0].error is not None and result.images[0].error.code == "decode_budget_exceeded"


def test_a_jpeg_over_the_devices_preallocated_size_takes_the_cpu_path() -> None:
    device = StandIn(max_pixels=70 * 50)  # JPEG_B (70x50) fits, JPEG (80x60) does not
    result = BatchDecode(device, T)([JPEG, JPEG_B])
    assert device.calls == [[JPEG_B]]
    assert [d.where for d in result.images] == ["cpu", "hardware"]
    assert result.counts == counts(hardware=1, cpu=1)


def test_one_device_call_per_batch_and_totals_across_batches() -> None:
    device = StandIn(decline=[JPEG_GRAY])
    decode = BatchDecode(device, T)
    decode([JPEG, JPEG_B, JPEG_GRAY, PNG])
    decode([JPEG_B, PROGRESSIVE])
    decode([PNG])  # no JPEG for the device: no call
    assert device.calls == [[JPEG, JPEG_B, JPEG_GRAY], [JPEG_B]]
    assert dict(decode.totals) == counts(hardware=3, cpu=4, fallback=1)


def test_the_cpu_path_on_an_executor_gives_the_same_results() -> None:
    batch = [JPEG, PNG, PROGRESSIVE, CMYK, BROKEN, JPEG_B, JPEG_BOMB]
    inline = BatchDecode(StandIn(decline=[JPEG_B]), T)(batch)
    with ThreadPoolExecutor(2) as pool:
        pooled = BatchDecode(StandIn(decline=[JPEG_B]), T, executor=pool)(batch)
    assert pooled.counts == inline.counts == counts(hardware=1, cpu=4, failed=2, fallback=2)
    for a, b in zip(inline.images, pooled.images, strict=True):
        assert a.where == b.where
        assert (a.error.code if a.error else None) == (b.error.code if b.error else None)
        if a.pixels is not None:
            np.testing.assert_array_equal(a.pixels, b.pixels)


def test_the_nvimgcodec_adapter_imports_without_the_package_and_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.imaging import nvimgcodec_decoder

    monkeypatch.setitem(sys.modules, "nvidia", None)  # as where it is not installed, even on a GPU node
    monkeypatch.delitem(sys.modules, "nvidia.nvimgcodec", raising=False)
    with pytest.raises(RuntimeError, match=r"nvImageCodec.*nvidia\.nvimgcodec.*pip install nvidia-nvimgcodec-cu12"):
        nvimgcodec_decoder.NvImageCodecDecoder(num_cpus=2)
