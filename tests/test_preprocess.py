"""app.preprocess: every format and oddity it must read, every bomb it must refuse, and the contract
that nothing but a uint8 (size, size, 3) array or an ImageInputError comes out, whatever the bytes."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from app import preprocess as pre
from app.errors import STATUS, ImageInputError
from app.preprocess import cv2, decode_image, preprocess, probe_dimensions
from tests.hostile import (
    bmp_header_only,
    cv_encode,
    exif_blob,
    gif_bomb,
    hostile_cases,
    jpeg_with_exif,
    jpeg_with_size,
    pattern_image,
    pil_encode,
    png_bomb,
    png_chunk,
    png_raw,
    png_with_chunk_length,
    tiff_raw,
    valid_images,
    webp_vp8l_size,
    webp_vp8x_canvas,
)

REPO = Path(__file__).resolve().parent.parent

RED, GREEN, BLUE, YELLOW = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)


def quadrants(height: int, width: int, colors: tuple = (RED, GREEN, BLUE, YELLOW)) -> np.ndarray:
    """An RGB image split in four flat quadrants: top-left, top-right, bottom-left, bottom-right."""
    img = np.zeros((height, width, 3), np.uint8)
    h2, w2 = height // 2, width // 2
    img[:h2, :w2], img[:h2, w2:], img[h2:, :w2], img[h2:, w2:] = colors
    return img


def rgb_to_bgr(img: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(img[..., ::-1])


def check(out: np.ndarray, size: int = 224) -> np.ndarray:
    """The output contract: uint8, C-contiguous, (size, size, 3)."""
    assert out.dtype == np.uint8
    assert out.shape == (size, size, 3)
    assert out.flags["C_CONTIGUOUS"]
    return out


def quadrant_means(img: np.ndarray) -> list[np.ndarray]:
    """Mean colour of the centre of each quadrant (TL, TR, BL, BR), away from the edges."""
    h, w = img.shape[:2]
    qh, qw = h // 4, w // 4
    centres = [(qh, qw), (qh, 3 * qw), (3 * qh, qw), (3 * qh, 3 * qw)]
    return [
        img[y - qh // 2 : y + qh // 2 + 1, x - qw // 2 : x + qw // 2 + 1].reshape(-1, 3).mean(0) for y, x in centres
    ]


def assert_quadrants(img: np.ndarray, expected: tuple, tol: float = 8.0) -> None:
    for got, want in zip(quadrant_means(img), expected, strict=True):
        assert np.abs(got - np.array(want)).max() <= tol, (got, want)


def refused(data: bytes, code: str, **kwargs: object) -> ImageInputError:
    with pytest.raises(ImageInputError) as info:
        preprocess(data, **kwargs)  # type: ignore[arg-type]
    assert info.value.code == code, info.value.message
    assert info.value.status == STATUS[code]
    return info.value


# --------------------------------------------------------------------------- formats that must work


def test_jpeg_baseline_keeps_colours_in_place_as_rgb() -> None:
    img = quadrants(120, 200)
    out = check(preprocess(cv_encode(".jpg", rgb_to_bgr(img), [cv2.IMWRITE_JPEG_QUALITY, 95])))
    assert_quadrants(out, (RED, GREEN, BLUE, YELLOW))


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".webp", ".tiff"])
def test_grayscale_becomes_three_equal_channels(ext: str) -> None:
    gray = np.tile(np.linspace(0, 255, 160).astype(np.uint8), (100, 1))
    out = check(preprocess(cv_encode(ext, gray)))
    assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 1], out[..., 2])
    assert out[:, 0, 0].mean() < 10 and out[:, -1, 0].mean() > 245  # the gradient runs left to right


def test_rgba_fully_transparent_is_white() -> None:
    out = check(preprocess(cv_encode(".png", np.zeros((50, 70, 4), np.uint8))))
    assert (out == 255).all()


def test_rgba_composited_on_white() -> None:
    bgra = np.zeros((64, 64, 4), np.uint8)
    bgra[:, :32] = (0, 0, 255, 255)  # opaque red on the left
    bgra[:, 32:] = (0, 0, 0, 128)  # half-transparent black on the right
    out = check(preprocess(cv_encode(".png", bgra), size=64), 64)
    assert (out[:, :30] == RED).all()
    assert np.abs(out[:, 34:].astype(int) - 127).max() <= 1  # 0 * 128/255 + 255 * 127/255


def test_gray_plus_alpha_png() -> None:
    out = check(preprocess(pil_encode(Image.new("LA", (20, 20), (0, 0)), "PNG"), size=20), 20)
    assert (out == 255).all()
    out = check(preprocess(pil_encode(Image.new("LA", (20, 20), (40, 255)), "PNG"), size=20), 20)
    assert (out == 40).all()


def test_palette_png_with_transparency() -> None:
    img = Image.new("RGBA", (40, 40), (0, 0, 0, 0))
    img.paste((0, 0, 255, 255), (0, 0, 20, 40))
    out = check(preprocess(pil_encode(img.convert("P"), "PNG", transparency=0), size=40), 40)
    assert (out[:, :18] == BLUE).all()
    assert (out[:, 22:] == 255).all()


@pytest.mark.parametrize("value", [0, 128, 129, 257 * 100, 40_000, 65_534, 65_535])
def test_16bit_gray_png_scaled_to_8_bits(value: int) -> None:
    out = check(preprocess(cv_encode(".png", np.full((30, 30), value, np.uint16))))
    assert (out == round(value / 257)).all()


def test_16bit_colour_png_scaled_per_channel() -> None:
    bgr16 = np.empty((30, 40, 3), np.uint16)
    bgr16[...] = (65_535, 0, 30_000)  # B, G, R
    out = check(preprocess(cv_encode(".png", bgr16)))
    assert (out == (round(30_000 / 257), 0, 255)).all()


def test_16bit_rgba_png() -> None:
    bgra16 = np.zeros((30, 30, 4), np.uint16)
    bgra16[:15] = (0, 0, 65_535, 65_535)  # opaque red
    bgra16[15:] = (0, 0, 65_535, 0)  # transparent
    out = check(preprocess(cv_encode(".png", bgra16), size=30), 30)
    assert (out[:14] == RED).all()
    assert (out[16:] == 255).all()


def test_cmyk_jpeg_colours() -> None:
    img = quadrants(80, 120)
    data = pil_encode(Image.fromarray(img).convert("CMYK"), "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    out = check(preprocess(data))
    assert_quadrants(out, (RED, GREEN, BLUE, YELLOW), tol=12)


def test_progressive_jpeg_matches_baseline() -> None:
    bgr = pattern_image(200, 300)
    progressive = cv_encode(".jpg", bgr, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert b"\xff\xc2" in progressive  # SOF2
    info = probe_dimensions(progressive)
    assert info is not None and (info.width, info.height) == (300, 200)
    out = check(preprocess(progressive))
    baseline = check(preprocess(cv_encode(".jpg", bgr)))
    assert np.abs(out.astype(int) - baseline).mean() < 1.0


def test_exif_orientation_6_rotates_the_jpeg() -> None:
    """Orientation 6: stored sideways, shown rotated 90 degrees clockwise. A 200x100 (WxH) image is
    upright as 100x200, and its top-left (red) quadrant ends up top-right."""
    data = jpeg_with_exif(rgb_to_bgr(quadrants(100, 200)), 6)
    upright = decode_image(data)
    assert upright.shape == (200, 100, 3)
    assert_quadrants(upright, (BLUE, RED, YELLOW, GREEN), tol=10)
    assert_quadrants(check(preprocess(data)), (BLUE, RED, YELLOW, GREEN), tol=10)


def _reference_upright(data: bytes) -> np.ndarray:
    """PIL's EXIF transpose: an independent implementation to check against."""
    return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_orientation_all_eight(fmt: str, orientation: int) -> None:
    """JPEG: OpenCV applies it. PNG, WebP: decoded with IMREAD_UNCHANGED, so preprocess applies it."""
    img = quadrants(60, 100)
    options = {"JPEG": {"quality": 95}, "PNG": {}, "WEBP": {"lossless": True}}[fmt]
    data = pil_encode(Image.fromarray(img), fmt, exif=exif_blob(orientation), **options)
    got = decode_image(data)
    want = _reference_upright(data)
    assert got.shape == want.shape
    assert np.abs(got.astype(int) - want).mean() < 2.0


def test_exif_orientation_applied_with_reduced_jpeg_decode() -> None:
    data = jpeg_with_exif(rgb_to_bgr(quadrants(1080, 1920)), 6)
    upright = decode_image(data, target=224)
    assert upright.shape == (480, 270, 3)  # IMREAD_REDUCED_COLOR_4, then rotated
    assert_quadrants(upright, (BLUE, RED, YELLOW, GREEN), tol=10)


def test_exif_orientation_of_tiff_applied_by_libtiff() -> None:
    img = quadrants(60, 100)
    data = pil_encode(Image.fromarray(img), "TIFF", exif=exif_blob(6))
    got = decode_image(data)
    assert got.shape == (100, 60, 3)
    assert np.array_equal(got, _reference_upright(data))


def test_invalid_or_looping_exif_is_ignored() -> None:
    images = valid_images()
    out = check(preprocess(images["jpeg_exif_self_looping_ifd"]))
    assert out.std() > 10  # a real picture, not a blank
    assert pre._orientation_from_exif(b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\xff\xff") == 1
    assert pre._orientation_from_exif(exif_blob(9)) == 1
    assert pre._orientation_from_exif(b"") == 1


@pytest.mark.parametrize("bits", [8, 24, 32])
def test_bmp(bits: int) -> None:
    img = quadrants(64, 96)
    if bits == 8:  # a grayscale palette
        img = np.repeat(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)[..., None], 3, axis=2)
    expected = tuple(tuple(int(v) for v in img[y, x]) for y, x in ((0, 0), (0, -1), (-1, 0), (-1, -1)))
    bgr = rgb_to_bgr(img)
    if bits == 8:
        bgr = bgr[..., 0].copy()
    if bits == 32:  # the fourth byte is usually unused (0) in 32-bit BMPs: it must not be read as alpha
        bgr = np.dstack([bgr, np.zeros(bgr.shape[:2], np.uint8)])
    data = cv_encode(".bmp", bgr)
    assert struct.unpack("<H", data[28:30])[0] == bits
    assert_quadrants(check(preprocess(data)), expected, tol=0)


def test_bmp_top_down_and_os2_header_probe() -> None:
    top_down = bytearray(cv_encode(".bmp", rgb_to_bgr(quadrants(20, 30))))
    struct.pack_into("<i", top_down, 22, -20)
    info = probe_dimensions(bytes(top_down))
    assert info is not None and (info.width, info.height) == (30, 20)
    out = check(preprocess(bytes(top_down)))
    assert_quadrants(out, (BLUE, YELLOW, RED, GREEN), tol=0)  # rows stored top-down now: flipped
    core = b"BM" + struct.pack("<IHHI", 26 + 12, 0, 0, 26) + struct.pack("<IHHHH", 12, 4, 3, 1, 24) + bytes(12)
    info = probe_dimensions(core)
    assert info is not None and (info.format, info.width, info.height) == ("bmp", 4, 3)


@pytest.mark.parametrize("kind", ["lossy", "lossless"])
def test_webp(kind: str) -> None:
    img = quadrants(80, 120)
    quality = 101 if kind == "lossless" else 90
    data = cv_encode(".webp", rgb_to_bgr(img), [cv2.IMWRITE_WEBP_QUALITY, quality])
    assert data[12:16] == (b"VP8L" if kind == "lossless" else b"VP8 ")
    info = probe_dimensions(data)
    assert info is not None and (info.width, info.height) == (120, 80)
    assert_quadrants(check(preprocess(data)), (RED, GREEN, BLUE, YELLOW), tol=0 if kind == "lossless" else 12)


def test_webp_with_alpha() -> None:
    rgba = np.zeros((40, 60, 4), np.uint8)
    rgba[:, :30] = (0, 0, 255, 255)
    data = pil_encode(Image.fromarray(rgba), "WEBP", quality=90)
    assert data[12:16] == b"VP8X"
    info = probe_dimensions(data)
    assert info is not None and (info.width, info.height) == (60, 40)
    out = check(preprocess(data, size=60), 60)
    assert np.abs(out[:, :26].astype(int) - BLUE).max() <= 12
    assert (out[:, 34:] >= 250).all()


@pytest.mark.parametrize("compression", [None, "tiff_deflate", "tiff_lzw"])
def test_tiff(compression: str | None) -> None:
    img = quadrants(80, 120)
    data = pil_encode(Image.fromarray(img), "TIFF", compression=compression)
    info = probe_dimensions(data)
    assert info is not None and (info.format, info.width, info.height) == ("tiff", 120, 80)
    assert_quadrants(check(preprocess(data)), (RED, GREEN, BLUE, YELLOW), tol=0)


def test_tiff_16bit_and_big_endian() -> None:
    data = cv_encode(".tiff", np.full((10, 12), 40_000, np.uint16))
    info = probe_dimensions(data)
    assert info is not None and (info.width, info.height) == (12, 10)
    assert (check(preprocess(data)) == round(40_000 / 257)).all()
    mm = _tiff_big_endian(5, 7)  # "MM", SHORT sizes
    info = probe_dimensions(mm)
    assert info is not None and (info.width, info.height) == (5, 7)
    assert (check(preprocess(mm)) == 0).all()


def _tiff_big_endian(width: int, height: int) -> bytes:
    entries = [
        (256, 3, width),
        (257, 3, height),
        (258, 3, 8),
        (259, 3, 1),
        (262, 3, 1),
        (273, 4, 0),
        (277, 3, 1),
        (278, 3, height),
        (279, 4, width * height),
    ]
    data_offset = 8 + 2 + 12 * len(entries) + 4
    out = b"MM\x00*" + struct.pack(">IH", 8, len(entries))
    for tag, typ, value in entries:
        value = data_offset if tag == 273 else value
        field = struct.pack(">HH", value, 0) if typ == 3 else struct.pack(">I", value)
        out += struct.pack(">HHI", tag, typ, 1) + field
    return out + b"\x00\x00\x00\x00" + bytes(width * height)


def test_gif_static() -> None:
    img = quadrants(48, 64)
    out = check(preprocess(pil_encode(Image.fromarray(img), "GIF")))
    assert_quadrants(out, (RED, GREEN, BLUE, YELLOW), tol=0)


def test_gif_animated_gives_the_first_frame() -> None:
    frames = [Image.new("RGB", (40, 30), c) for c in (RED, GREEN, BLUE)]
    data = pil_encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert cv2.imdecodemulti(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)[0]  # really animated
    assert (check(preprocess(data)) == RED).all()


def test_gif_transparent_pixels_are_white() -> None:
    img = Image.new("RGBA", (40, 40), (0, 0, 0, 0))
    img.paste((0, 255, 0, 255), (0, 0, 20, 40))
    out = check(preprocess(pil_encode(img, "GIF"), size=40), 40)
    assert (out[:, :18] == GREEN).all()
    assert (out[:, 22:] == 255).all()


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".webp", ".tiff", ".gif"])
def test_one_by_one(ext: str) -> None:
    data = cv_encode(ext, np.array([[[30, 60, 200]]], np.uint8))  # BGR
    out = check(preprocess(data))
    tolerance = {".jpg": 12, ".webp": 12, ".gif": 40}.get(ext, 0)  # OpenCV's GIF writer uses a fixed palette
    assert np.abs(out.reshape(-1, 3) - (200, 60, 30)).max() <= tolerance


@pytest.mark.parametrize(("height", "width"), [(1, 4000), (4000, 1)])
@pytest.mark.parametrize("ext", [".jpg", ".png"])
def test_extreme_aspect_ratios(ext: str, height: int, width: int) -> None:
    ramp = np.linspace(0, 255, max(height, width)).astype(np.uint8).reshape(height, width)
    out = check(preprocess(cv_encode(ext, ramp)))
    profile = out[0, :, 0] if width > 1 else out[:, 0, 0]  # the ramp survives along its axis
    assert profile[0] < 20 and profile[-1] > 235
    assert np.all(np.diff(profile.astype(int)) >= -6)


def test_reduced_jpeg_decode_of_full_hd_is_close_to_full_decode() -> None:
    data = cv_encode(".jpg", pattern_image(1080, 1920, seed=3), [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert pre.reduced_decode_flag(1920, 1080, 224) == cv2.IMREAD_REDUCED_COLOR_4
    assert decode_image(data, target=224).shape == (270, 480, 3)
    reduced = check(preprocess(data, reduced=True))
    full = check(preprocess(data, reduced=False))
    assert np.abs(reduced.astype(int) - full).mean() < 2.0


def test_reduced_flag_choice() -> None:
    assert pre.reduced_decode_flag(224, 224, 224) == cv2.IMREAD_COLOR
    assert pre.reduced_decode_flag(500, 448, 224) == cv2.IMREAD_REDUCED_COLOR_2
    assert pre.reduced_decode_flag(4000, 3000, 224) == cv2.IMREAD_REDUCED_COLOR_8


def test_other_output_sizes() -> None:
    data = cv_encode(".png", rgb_to_bgr(quadrants(100, 100)))
    assert_quadrants(check(preprocess(data, size=32), 32), (RED, GREEN, BLUE, YELLOW), tol=0)
    assert_quadrants(check(preprocess(data, size=100), 100), (RED, GREEN, BLUE, YELLOW), tol=0)
    with pytest.raises(ValueError):
        preprocess(data, size=0)


def test_every_valid_corpus_image_classifies() -> None:
    for name, data in valid_images().items():
        out = check(preprocess(data))
        assert out.std() > 1 or name in ("png_fully_transparent", "gif_animated", "png_1x1", "jpeg_1x1"), name


# --------------------------------------------------------------------------- header probe


def test_probe_reads_every_format_without_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cv2, "imdecode", _no_decoding)
    img = rgb_to_bgr(quadrants(30, 50))
    cases = {
        "png": cv_encode(".png", img),
        "jpeg": cv_encode(".jpg", img),
        "gif": cv_encode(".gif", img),
        "bmp": cv_encode(".bmp", img),
        "webp": cv_encode(".webp", img),
        "tiff": cv_encode(".tiff", img),
    }
    for fmt, data in cases.items():
        info = probe_dimensions(data)
        assert info is not None and (info.format, info.width, info.height) == (fmt, 50, 30), (fmt, info)
    assert probe_dimensions(b"") is None
    assert probe_dimensions(b"P6\n1 1\n255\n\x00\x00\x00") is None  # PNM: OpenCV reads it, we do not


def test_probe_jpeg_skips_fill_bytes_and_garbage_like_libjpeg() -> None:
    jpg = cv_encode(".jpg", pattern_image(30, 50))
    app0_end = 4 + struct.unpack(">H", jpg[4:6])[0]
    padded = jpg[:app0_end] + b"\x00\x13" + b"\xff" * 5 + jpg[app0_end + 1 :]  # garbage, then fill bytes
    info = probe_dimensions(padded)
    assert info is not None and (info.width, info.height) == (50, 30)
    assert check(preprocess(padded)).std() > 1  # libjpeg accepts it too (with a warning)


def test_probe_jpeg_segment_walk_is_bounded() -> None:
    many = b"\xff\xd8" + b"\xff\xfe\x00\x02" * 3_000_000 + jpeg_with_size(10, 10)[2:]  # 12 MB of empty COMs
    start = time.perf_counter()
    assert probe_dimensions(many) is None
    assert time.perf_counter() - start < 0.1
    fill = b"\xff\xd8" + b"\xff" * 10_000_000
    start = time.perf_counter()
    assert probe_dimensions(fill) is None
    assert time.perf_counter() - start < 0.1


# --------------------------------------------------------------------------- bombs and limits


def _no_decoding(*args: object, **kwargs: object) -> None:
    raise AssertionError("the decoder must not run")


BOMBS = {
    "png_60000x60000": png_bomb(),
    "jpeg_65500x65500": jpeg_with_size(65_500, 65_500),
    "jpeg_progressive_60000x60000": jpeg_with_size(60_000, 60_000, progressive=True),
    "gif_65535x65535": gif_bomb(),
    "bmp_50000x50000": bmp_header_only(50_000, 50_000),
    "webp_vp8x_16384x16384": webp_vp8x_canvas(16_384, 16_384),
    "webp_vp8l_16384x16384": webp_vp8l_size(16_384, 16_384),
    "tiff_100000x100000": tiff_raw(100_000, 100_000, bytes(16)),
    "tiff_16x16_with_15008x15008_tiles": tiff_raw(16, 16, bytes(256), tile=(15_008, 15_008)),
    "png_2000000x1": png_raw(2_000_000, 1, zlib.compress(b"\x00" * 100)),  # 2 Mpx, but wider than OpenCV's 2**20
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bombs_refused_from_the_header(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cv2, "imdecode", _no_decoding)
    monkeypatch.setattr(cv2, "imdecodeWithMetadata", _no_decoding)
    start = time.perf_counter()
    refused(BOMBS[name], "too_many_pixels")
    assert time.perf_counter() - start < 0.01


@pytest.mark.parametrize(("chunk", "length"), [(1, 0xF000_0000), (1, 0x7FFF_FFFF), (2, 0x8000_0000), (1, 10**6)])
def test_png_chunk_length_past_the_end_is_refused_before_decoding(
    chunk: int, length: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenCV 5 allocates a PNG chunk's declared length up front: 11 KB claiming 4 GB cost 4 GB of RSS."""
    png = cv_encode(".png", pattern_image(64, 96))
    with_text = png[:33] + png_chunk(b"tEXt", b"k\x00v") + png[33:]  # so chunk 1 is ancillary, chunk 2 IDAT
    data = png_with_chunk_length(with_text if chunk == 2 else png, chunk, length)
    monkeypatch.setattr(cv2, "imdecode", _no_decoding)
    monkeypatch.setattr(cv2, "imdecodeWithMetadata", _no_decoding)
    assert not pre.png_chunks_fit(data)
    refused(data, "undecodable_image")


def test_png_chunk_walk() -> None:
    png = cv_encode(".png", pattern_image(64, 96))
    assert pre.png_chunks_fit(png)
    assert pre.png_chunks_fit(png + b"trailing bytes after IEND")
    assert not pre.png_chunks_fit(png[: png.rfind(b"IEND") - 4])  # no IEND: OpenCV refuses those too
    refused(png[: png.rfind(b"IEND") - 4], "undecodable_image")
    many = png[:33] + png_chunk(b"tEXt", b"") * 70_000 + png[33:]
    start = time.perf_counter()
    assert not pre.png_chunks_fit(many)  # bounded walk
    assert time.perf_counter() - start < 0.5


def test_pixel_limit_boundary() -> None:
    at_limit = png_raw(8_000, 5_000, b"")
    over = png_raw(8_000, 5_001, b"")
    refused(over, "too_many_pixels")
    refused(at_limit, "undecodable_image")  # passes the size checks, then has no image data
    refused(cv_encode(".png", np.zeros((10, 11), np.uint8)), "too_many_pixels", max_pixels=109)
    check(preprocess(cv_encode(".png", np.zeros((10, 11), np.uint8)), max_pixels=110))


def test_max_pixels_above_opencv_limit_is_capped_to_it() -> None:
    """OpenCV would refuse it anyway; it is refused from the header with the effective limit."""
    error = refused(png_raw(7_000, 7_000, b""), "too_many_pixels", max_pixels=10**12)
    assert str(pre.OPENCV_MAX_PIXELS) in error.message


_GUARD_SCRIPT = """
{first}
import numpy as np
from app import preprocess as pre
from app.errors import ImageInputError
from tests.hostile import png_bomb

cv2 = pre.cv2
bomb = png_bomb(8000, 5001)  # 40,008,000 pixels: just over OPENCV_IO_MAX_IMAGE_PIXELS
try:
    cv2.imdecode(np.frombuffer(bomb, np.uint8), cv2.IMREAD_UNCHANGED)
    raw = "decoder-ran"
except cv2.error as e:
    raw = "refused" if "CV_IO_MAX_IMAGE_PIXELS" in str(e) else "other"
pre.probe_dimensions = lambda data: pre.ImageInfo("png", 1, 1)  # the first line, fooled
try:
    pre.preprocess(bomb, max_pixels=10**12)
    fooled = "decoded"
except ImageInputError as e:
    fooled = e.code
print(raw, fooled, pre.opencv_pixel_guard_active())
"""


@pytest.mark.parametrize(
    ("first", "expected"),
    [("", "refused too_many_pixels True"), ("import cv2", "decoder-ran undecodable_image False")],
    ids=["app.preprocess-first", "cv2-first"],
)
def test_opencv_pixel_guard_is_the_second_line(first: str, expected: str) -> None:
    """OPENCV_IO_MAX_IMAGE_PIXELS refuses an over-limit image even when the header probe is fooled.
    OpenCV reads it once, when cv2 loads, so app.preprocess has to be imported first (it warns if not;
    the guard is then off and the fooled probe lets the decoder allocate the 40 Mpx image, which only
    fails on its missing data). Run in a fresh interpreter: the test session's import order is not ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCV_")}
    result = subprocess.run(
        [sys.executable, "-c", _GUARD_SCRIPT.format(first=first)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip().split("\n")[-1] == expected, result.stdout + result.stderr
    assert ("not in force" in result.stderr) == bool(first)


# --------------------------------------------------------------------------- refusals


def test_empty_body() -> None:
    refused(b"", "empty_body")


@pytest.mark.parametrize(
    "data",
    [
        b"\x00" * 1000,
        bytes(range(256)) * 4,
        b"<svg xmlns='http://www.w3.org/2000/svg'/>",
        b"%PDF-1.7\n",
        b"P6\n4 4\n255\n" + bytes(48),  # PNM: OpenCV could decode it, the service does not accept it
        b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 1 +X 1\n\x00\x00\x00\x00",  # HDR: float output, refused
        b"\xff\xd8\xff",
        b"GIF89a",
        b"\x89PNG\r\n\x1a\n",
        b"RIFF\x00\x00\x00\x00WEBP",
        b"II*\x00",
        b"BM",
    ],
    ids=[
        "zeros",
        "counting",
        "svg",
        "pdf",
        "pnm",
        "hdr",
        "jpeg-soi",
        "gif-magic",
        "png-magic",
        "webp-magic",
        "tiff-magic",
        "bmp-magic",
    ],
)
def test_not_an_image(data: bytes) -> None:
    refused(data, "undecodable_image")


def test_truncated_jpegs_are_refused() -> None:
    """OpenCV 5 fails a JPEG cut short anywhere (even only its EOI missing) instead of returning a
    grey-padded partial image, so every truncation is a 400. Cut inside the header: no SOF to probe."""
    for progressive in (False, True):
        jpg = cv_encode(".jpg", pattern_image(96, 128), [cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)])
        sos = jpg.find(b"\xff\xda")
        for cut in [
            3,
            20,
            jpg.find(b"\xff\xc2" if progressive else b"\xff\xc0") + 5,
            sos,
            sos + 20,
            len(jpg) // 2,
            len(jpg) - 100,
            len(jpg) - 2,
        ]:
            refused(jpg[:cut], "undecodable_image")
        check(preprocess(jpg))


def test_corrupt_entropy_data_still_decodes() -> None:
    """Intact framing, damaged scan: libjpeg patches it (a browser shows it too). Accepted."""
    jpg = bytearray(cv_encode(".jpg", pattern_image(96, 128)))
    sos = jpg.find(b"\xff\xda")
    for i in range(sos + 200, sos + 260, 3):
        jpg[i] = 0x55
    check(preprocess(bytes(jpg)))


@pytest.mark.parametrize("ext", [".png", ".gif", ".webp", ".bmp", ".tiff"])
def test_truncated_other_formats_are_refused(ext: str) -> None:
    data = cv_encode(ext, pattern_image(64, 96))
    for cut in (len(data) // 3, len(data) // 2, len(data) - 10):
        refused(data[:cut], "undecodable_image")


def test_zero_sized_headers() -> None:
    refused(png_raw(0, 10, zlib.compress(b"")), "undecodable_image")
    refused(jpeg_with_size(0, 10), "undecodable_image")
    refused(b"GIF89a\x00\x00\x05\x00" + bytes(20), "undecodable_image")
    refused(tiff_raw(0, 0, b""), "undecodable_image")


# --------------------------------------------------------------------------- the exception contract


def test_decoder_exceptions_are_translated(monkeypatch: pytest.MonkeyPatch) -> None:
    data = cv_encode(".jpg", pattern_image(20, 20))

    def raises(exc: BaseException) -> Callable[..., None]:
        def decode(*args: object, **kwargs: object) -> None:
            raise exc

        return decode

    monkeypatch.setattr(cv2, "imdecode", raises(MemoryError()))
    refused(data, "too_many_pixels")
    monkeypatch.setattr(cv2, "imdecode", raises(cv2.error("boom")))
    refused(data, "undecodable_image")
    monkeypatch.setattr(cv2, "imdecode", lambda buf, flag: np.zeros((4, 4, 5), np.uint8))
    refused(data, "undecodable_image")
    monkeypatch.setattr(cv2, "imdecode", lambda buf, flag: np.zeros((8000, 5001), np.uint8)[:0])
    refused(data, "undecodable_image")


def test_decoded_size_is_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    data = cv_encode(".jpg", pattern_image(20, 20))
    monkeypatch.setattr(cv2, "imdecode", lambda buf, flag: np.zeros((100, 100, 3), np.uint8))
    refused(data, "too_many_pixels", max_pixels=9_999)


@pytest.mark.parametrize(
    "array",
    [
        np.full((8, 8), 0.5, np.float32),
        np.full((8, 8, 3), np.nan, np.float64),
        np.full((8, 8), -7, np.int32),
        np.full((8, 8), 3, np.int8),
        np.ones((8, 8), np.bool_),
        np.full((8, 8, 2), 200, np.uint8),
        np.full((8, 8, 1), 9, np.uint16),
    ],
    ids=["float32", "nan", "int32", "int8", "bool", "gray+alpha", "one-channel-3d"],
)
def test_any_decoded_depth_becomes_uint8(array: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    """TIFF can carry float and signed samples; whatever OpenCV returns, uint8 comes out (never float)."""
    monkeypatch.setattr(cv2, "imdecode", lambda buf, flag: array)
    check(preprocess(cv_encode(".tiff", np.zeros((8, 8), np.uint8))))


def test_opencv_logging_is_quiet() -> None:
    if "OPENCV_LOG_LEVEL" not in os.environ:
        assert cv2.utils.logging.getLogLevel() == cv2.utils.logging.LOG_LEVEL_FATAL


def test_bad_inputs_leave_no_opencv_log_lines(tmp_path: Path) -> None:
    """OpenCV logs each failed decode at ERROR ("can't read header", TIFF_Error ...); silenced here.
    (libjpeg's and libpng's own stderr lines are not OpenCV's to silence; see app/preprocess.py.)"""
    bad = [c.body for c in hostile_cases() if c.layer == "preprocess" and c.expected_status == 400]
    corpus = tmp_path / "bad.bin"
    corpus.write_bytes(b"".join(struct.pack("<I", len(b)) + b for b in bad))
    script = (
        "import struct, sys\n"
        "from app.preprocess import preprocess\n"
        "from app.errors import ImageInputError\n"
        "blob, pos, n = open(sys.argv[1], 'rb').read(), 0, 0\n"
        "while pos < len(blob):\n"
        "    size = struct.unpack('<I', blob[pos:pos + 4])[0]\n"
        "    try:\n"
        "        preprocess(blob[pos + 4:pos + 4 + size])\n"
        "    except ImageInputError:\n"
        "        n += 1\n"
        "    pos += 4 + size\n"
        "print(n)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-c", script, str(corpus)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(bad)
    assert "[ERROR:" not in result.stderr and "[ WARN:" not in result.stderr, result.stderr


# --------------------------------------------------------------------------- properties

_SEEDS = [
    data for name, data in valid_images().items() if len(data) < 40_000 and name not in ("png_ztxt_bomb_chunk",)
] + [png_bomb(), gif_bomb(), jpeg_with_size(65_500, 65_500), tiff_raw(16, 16, bytes(256), tile=(15_008, 15_008))]


@st.composite
def mutated_images(draw: st.DrawFn) -> bytes:
    """A valid image (or bomb) with bytes flipped, cut, inserted or overwritten."""
    data = bytearray(draw(st.sampled_from(_SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "overwrite", "header"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=8))
            data[pos : pos + len(chunk)] = chunk
        else:  # the first 64 bytes hold every size field the probe reads (except a far TIFF IFD)
            if data:
                data[min(pos, 63) % len(data)] = draw(st.integers(0, 255))
    return bytes(data)


def _contract(data: bytes) -> None:
    try:
        out = preprocess(data)
    except ImageInputError as e:
        assert e.code in STATUS and e.status in (400, 413)
        return
    check(out)


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_any_bytes_give_an_image_or_image_input_error(data: bytes) -> None:
    _contract(data)
    probe_dimensions(data)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(
        [
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
            b"\xff\xd8\xff",
            b"GIF89a",
            b"BM",
            b"II*\x00",
            b"MM\x00*",
            b"RIFF\x00\x00\x00\x00WEBPVP8X",
            b"RIFF\x00\x00\x00\x00WEBPVP8L",
        ]
    ),
    st.binary(max_size=512),
)
def test_magic_then_any_bytes(magic: bytes, tail: bytes) -> None:
    """Random bytes behind each accepted signature: reaches every probe and decoder entry."""
    _contract(magic + tail)


@settings(max_examples=600, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_images())
def test_mutated_images_give_an_image_or_image_input_error(data: bytes) -> None:
    _contract(data)
