"""What decoding one image costs in memory, estimated from its header before any decoder runs
(`estimate_decode_bytes`), and the refusal of an image over the limit (`check_decode_budget`: 413
decode_budget_exceeded). The estimate follows the decode `app.imaging.preprocess` does: the JPEG
reduced decode it picks (`reduced_decode_flag`), OpenCV's copies, the conversion to uint8.

This is the limit on one image; `app.imaging.decode_budget` bounds what a replica's decodes hold at once,
in reservations of these estimates.
"""

from __future__ import annotations

from app.errors import ImageInputError
from app.imaging.convert import needs_conversion
from app.imaging.opencv import cv2
from app.imaging.probe import ImageInfo, ceil_div, probe_dimensions

# The decode budget's default (Limits.max_decode_bytes; see estimate_decode_bytes). Every 8-bit image
# up to 40 MP fits (worst: a 40 MP 8-bit RGBA image, ~320 MB with OpenCV's copies; a 40 MP GIF ~360 MB),
# so does a 40 MP 16-bit RGB one (~480 MB); a 40 MP 16-bit RGBA (~640 MB) or float32 RGBA (~1.3 GB) does not.
DEFAULT_MAX_DECODE_BYTES = 512 * 1024 * 1024

_REDUCED_FLAGS = ((8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4), (2, cv2.IMREAD_REDUCED_COLOR_2))


def reduced_decode_flag(width: int, height: int, target: int) -> int:
    """The JPEG decoder's DCT-domain downscale (1/2, 1/4, 1/8) that still leaves >= target pixels."""
    for factor, flag in _REDUCED_FLAGS:
        if min(width, height) >= target * factor:
            return flag
    return cv2.IMREAD_COLOR


_REDUCTION = {flag: factor for factor, flag in _REDUCED_FLAGS}
# What the band-wise conversion allocates besides its uint8 result: a few band-sized temporaries
# (measured 3.4 MB for a 40 MP float32 RGBA image, 5 MB for float64 RGB), with room to spare.
_CONVERSION_WORKSPACE = 16 << 20
# Every decode: the codecs' row buffers and state, the resize to the model's size, the output
# (measured peaks of the real path came within 1 MB over the rest of the estimate).
_DECODE_OVERHEAD = 4 << 20


def estimate_decode_bytes(image: bytes | ImageInfo | None, target: int | None = None) -> int:
    """Peak bytes that decoding `image` and converting it to uint8 BGR/grey costs; 0 if it has no readable header.

    From the header alone (`probe_dimensions`), as `preprocess(..., reduced=target is not None)`
    decodes it (a JPEG far larger than `target` is decoded reduced). Two phases, the larger counts:
      decode:  the result R (pixels x channels x bytes per sample), plus the larger of another R
               (OpenCV's Python binding copies every decoded image out of the Mat it decoded
               into, and rotations copy too) and the decoder's own buffers (`ImageInfo.decoder_bytes`);
      convert: R, plus the uint8 BGR or grey result and a band-sized workspace, when the result is
               not already uint8 BGR or grey. The resize to the model's size then costs ~nothing.
    plus 4 MiB for everything else. Peak RSS of the real code path, measured (estimate without the
    4 MiB in brackets), MB: 40 MP 8-bit RGB PNG 240 (240), 8-bit RGBA PNG 320 (320), single-strip
    8-bit RGB TIFF 280 (280), GIF 319 (360), lossless RGBA WebP 320 (320), 16-bit RGB PNG 480 (480),
    16-bit RGBA PNG 640 (640), float32 RGBA TIFF 1280 (1280); 12 MP JPEG reduced for 224 px 0.1 (1.1),
    the same progressive 36 (37), decoded in full 72 (72).
    """
    info = probe_dimensions(image) if isinstance(image, bytes | bytearray | memoryview) else image
    if info is None or not isinstance(info, ImageInfo):
        return 0
    w, h = info.width, info.height
    if info.format == "jpeg" and target:
        factor = _REDUCTION.get(reduced_decode_flag(w, h, target), 1)
        w, h = ceil_div(w, factor), ceil_div(h, factor)
    return peak_bytes(w * h, info.channels, info.sample_bytes, info.decoder_bytes, info.inverted)


def peak_bytes(pixels: int, channels: int, sample_bytes: int, decoder_bytes: int, inverted: bool) -> int:
    """Peak bytes of a decode whose result is `pixels` x `channels` samples of `sample_bytes` each, beside
    `decoder_bytes` of the decoder's own buffers, and of its conversion to uint8 (see `estimate_decode_bytes`)."""
    result = pixels * channels * sample_bytes
    decode_peak = result + max(result, decoder_bytes)
    if not needs_conversion(channels, sample_bytes == 1, inverted):
        return decode_peak + _DECODE_OVERHEAD
    converted = pixels * (1 if channels == 1 else 3)
    return max(decode_peak, result + converted + _CONVERSION_WORKSPACE) + _DECODE_OVERHEAD


def check_decode_budget(info: ImageInfo, target: int | None, max_decode_bytes: int) -> int:
    """The estimate for `info`, or ImageInputError decode_budget_exceeded (413) if it is over `max_decode_bytes`."""
    cost = estimate_decode_bytes(info, target)
    if cost > max_decode_bytes:
        raise ImageInputError(
            "decode_budget_exceeded",
            f"decoding this {info.width}x{info.height} {info.format} ({info.channels} x {8 * info.sample_bytes}-bit "
            f"samples per pixel) would take about {_mib(cost)}; the limit is {_mib(max_decode_bytes)}",
        )
    return cost


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"
