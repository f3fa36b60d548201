"""Image bytes -> the model's uint8 pixels [H, W, C]. Pure OpenCV and numpy; no Ray.

The server's Preprocessor and the INT8 calibration reader both call
`preprocess` with the model's declared transform (app/imaging/transform.py), so the
model is calibrated on exactly what it will be served.

The contract: for *any* input bytes, `preprocess` returns a uint8 array of
the transform's shape or raises `ImageInputError`. An exception of any other
type is a bug in this service (the HTTP layer answers it with 500
internal_error), never a verdict on the input, so only the failures that input
bytes can cause are translated here.

Defences, in order:
1. `probe_dimensions` reads the format and size from the header (PNG IHDR,
   JPEG SOFn incl. progressive, GIF screen descriptor, BMP info header, WebP
   VP8/VP8L/VP8X, TIFF IFD0) and the pixel limit is applied before the decoder
   runs, so a decompression bomb costs microseconds and allocates nothing.
   Bytes that are none of JPEG, PNG, GIF, BMP, WebP or TIFF are refused as
   undecodable without reaching a decoder (OpenCV would also try PNM, HDR,
   PFM, Sun raster, JPEG 2000, AVIF...: attack surface we do not need).
2. Structural checks a decoder needs but does not do safely itself (PNG chunk
   lengths: see `png_chunks_fit`).
3. OPENCV_IO_MAX_IMAGE_PIXELS: OpenCV's own header check, a second line in
   case the probe and the decoder ever disagree about a header.
4. The decoded shape is checked against the limit again.
5. A decode budget: from the header, `estimate_decode_bytes` works out what decoding and
   converting the image will cost in memory (the decoder's result, its own buffers, the copy
   OpenCV's Python binding makes, the conversion to uint8) and the image is refused before the
   decoder runs when that exceeds `max_decode_bytes` (413 decode_budget_exceeded). Pixels alone do
   not bound it: a 40 MP float32 RGBA TIFF is 16x the bytes of a 40 MP greyscale one.
6. Layouts OpenCV decodes wrongly are refused from the header (415 unsupported_image): TIFFs
   stored one colour plane at a time with samples wider than 8 bits, which OpenCV reads as if
   interleaved, filling the rest from uninitialised memory (different answers on identical requests).

Conversion to uint8 (16-bit, float, alpha) goes a band of rows at a time into one uint8 result,
so it costs the output plus a few MiB, not several full-size float copies.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from app.errors import ImageInputError
from app.imaging.opencv import DEFAULT_MAX_PIXELS, cv2
from app.imaging.transform import Transform

logger = logging.getLogger(__name__)


def _env_size(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


# What OpenCV will refuse on its own (loadsave.cpp, validateInputImageSize).
OPENCV_MAX_PIXELS = _env_size("OPENCV_IO_MAX_IMAGE_PIXELS", 1 << 30)
OPENCV_MAX_SIDE = min(_env_size("OPENCV_IO_MAX_IMAGE_WIDTH", 1 << 20), _env_size("OPENCV_IO_MAX_IMAGE_HEIGHT", 1 << 20))

BACKGROUND_RGB = (255, 255, 255)  # transparent pixels are composited onto white

# The decode budget's default (Limits.max_decode_bytes; see estimate_decode_bytes). Every 8-bit image
# up to 40 MP fits (worst: a 40 MP 8-bit RGBA image, ~320 MB with OpenCV's copies; a 40 MP GIF ~360 MB),
# so does a 40 MP 16-bit RGB one (~480 MB); a 40 MP 16-bit RGBA (~640 MB) or float32 RGBA (~1.3 GB) does not.
DEFAULT_MAX_DECODE_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class ImageInfo:
    format: str  # jpeg | png | gif | bmp | webp | tiff
    width: int
    height: int
    # Pixels the decoder allocates for a working buffer regardless of the image size:
    # a TIFF tile (TileWidth x TileLength). 0 if none.
    buffer_pixels: int = 0
    # What OpenCV's decoder returns for this header, for the decode budget: channels and bytes per
    # sample of its result (the worst plausible where the header does not say), and the bytes of the
    # decoder's own working buffers (a TIFF strip or tile, a buffered JPEG's DCT coefficients, a GIF
    # canvas). For a JPEG the result is the full-size one; a reduced decode scales it.
    channels: int = 4
    sample_bytes: int = 1
    decoder_bytes: int = 0
    # How to read the result: colour already multiplied by alpha (what libtiff's RGBA reader gives for
    # an 8-bit TIFF with alpha, and what an associated-alpha TIFF stores); grey stored as 0 = white (a
    # MinIsWhite TIFF wider than 8 bits, which OpenCV returns as stored).
    premultiplied: bool = False
    inverted: bool = False
    # Why OpenCV cannot be trusted with this layout; "" if it can. Refused with unsupported_image.
    unsupported: str = ""

    @property
    def pixels(self) -> int:
        """What the pixel limit is applied to: the image, or the decoder's buffer if larger."""
        return max(self.width * self.height, self.buffer_pixels)


# --------------------------------------------------------------------------- header probes


def probe_dimensions(data: bytes) -> ImageInfo | None:
    """Read the format and size from the header alone, without decoding. None if unknown or unreadable.

    Never raises and never allocates more than a few bytes, whatever `data` holds.
    """
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        # OpenCV (and libpng) insist on IHDR as the first chunk.
        if len(data) < 24 or data[12:16] != b"IHDR":
            return None
        w, h = struct.unpack(">II", data[16:24])
        return _png_info(data, w, h)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        # The logical screen: OpenCV allocates the canvas at this size and asserts
        # that every frame fits inside it.
        if len(data) < 10:
            return None
        w, h = struct.unpack("<HH", data[6:10])
        # BGRA when a frame has transparency (else BGR), composed on a BGRA canvas from a
        # one-byte-per-pixel index buffer: measured 320 MB at its peak for a 40 MP GIF.
        return ImageInfo("gif", w, h, channels=4, decoder_bytes=5 * w * h)
    if data[:2] == b"BM":
        return _probe_bmp(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _probe_webp(data)
    if data[:3] == b"\xff\xd8\xff":
        return _probe_jpeg(data)
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return _probe_tiff(data)
    return None


_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 4, 6: 4}  # colour type -> OpenCV's IMREAD_UNCHANGED channels


def _png_info(data: bytes, w: int, h: int) -> ImageInfo:
    """OpenCV's IMREAD_UNCHANGED result: grey stays one channel (even with tRNS), grey+alpha becomes
    BGRA, RGB and palette become BGR, or BGRA when a tRNS chunk comes before the image data."""
    depth, colour = (data[24], data[25]) if len(data) >= 26 else (16, 6)  # a cut IHDR: the worst
    channels = _PNG_CHANNELS.get(colour, 4)
    if colour in (2, 3) and _png_has_trns(data):
        channels = 4
    return ImageInfo("png", w, h, channels=channels, sample_bytes=2 if depth > 8 else 1)


_PNG_MAX_CHUNKS_BEFORE_IDAT = 64  # real files have a handful (PLTE, tRNS, gAMA, iCCP, text...)


def _png_has_trns(data: bytes) -> bool:
    """Whether a tRNS chunk comes before the first IDAT; True if a short walk cannot tell (the dearer guess).

    Bounded tighter than `png_chunks_fit`: the Router probes every request's header on its event loop.
    """
    pos, n = 8, len(data)
    for _ in range(_PNG_MAX_CHUNKS_BEFORE_IDAT):
        if pos + 8 > n:
            return True
        kind = data[pos + 4 : pos + 8]
        if kind == b"tRNS":
            return True
        if kind in (b"IDAT", b"IEND"):
            return False
        pos += 12 + struct.unpack(">I", data[pos : pos + 4])[0]
    return True


def _probe_bmp(data: bytes) -> ImageInfo | None:
    # Decoded with IMREAD_COLOR: BGR whatever the bit count.
    if len(data) < 18:
        return None
    (header_size,) = struct.unpack("<I", data[14:18])
    if header_size == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        if len(data) < 22:
            return None
        w, h = struct.unpack("<HH", data[18:22])
        return ImageInfo("bmp", w, h, channels=3)
    if len(data) < 26:
        return None
    w, h = struct.unpack("<ii", data[18:26])  # negative height = top-down rows
    return ImageInfo("bmp", abs(w), abs(h), channels=3)


def _probe_webp(data: bytes) -> ImageInfo | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:  # lossy, no alpha
        w, h = struct.unpack("<HH", data[26:30])
        return ImageInfo("webp", w & 0x3FFF, h & 0x3FFF, channels=3)
    if chunk == b"VP8L" and len(data) >= 25:  # lossless
        b = data[21:25]
        w = 1 + (((b[1] & 0x3F) << 8) | b[0])
        h = 1 + (((b[3] & 0xF) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6))
        return ImageInfo("webp", w, h, channels=4 if b[3] & 0x10 else 3)  # the alpha_is_used bit
    if chunk == b"VP8X" and len(data) >= 30:  # extended (alpha, EXIF, animation): the canvas size
        w = 1 + int.from_bytes(data[24:27], "little")
        h = 1 + int.from_bytes(data[27:30], "little")
        # An animation is composed on a BGRA canvas; count one for any extended file.
        return ImageInfo("webp", w, h, channels=4 if data[20] & 0x10 else 3, decoder_bytes=4 * w * h)
    return None  # a WebP's first chunk is one of those three, or the file is broken


_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_JPEG_MAX_SEGMENTS = 1024  # real files have a few dozen before SOF (a split ICC profile: up to 255)
_JPEG_MAX_FILL = 1024  # 0xFF fill bytes before a marker: a few at most in real files
_NOT_FF = re.compile(rb"[^\xff]")


def _probe_jpeg(data: bytes) -> ImageInfo | None:
    """Walk the marker segments to the first SOFn, the way libjpeg's next_marker does.

    Stray bytes before a marker and 0xFF fill bytes are skipped (libjpeg warns and
    goes on); EOI, SOS or a second SOI before any SOFn means there is no frame header.
    The walk is bounded (segments, fill-byte run) so a crafted header costs microseconds.
    Past the SOFn it goes on to the first SOS: whether the first scan holds every component
    tells whether libjpeg buffers the whole image's DCT coefficients (see `_jpeg_info`).
    """
    n, i = len(data), 2
    frame: tuple[int, int] | None = None  # (SOFn offset, SOFn marker)
    for _ in range(_JPEG_MAX_SEGMENTS):
        i = data.find(b"\xff", i)
        if i < 0:
            break
        m = _NOT_FF.search(data, i, i + _JPEG_MAX_FILL)  # a run of fill bytes ends at the marker code
        if m is None:
            break
        j = m.start()
        marker = data[j]
        if marker == 0x00 or marker == 0x01 or 0xD0 <= marker <= 0xD7:  # stuffed zero, TEM, RSTn
            i = j + 1
            continue
        if frame is not None and marker == 0xDA:  # the first scan, after the frame header
            return _jpeg_info(data, *frame, first_scan=j)
        if marker in (0xD8, 0xD9, 0xDA):  # SOI, EOI, SOS before a frame header
            break
        if j + 3 > n:
            break
        (length,) = struct.unpack(">H", data[j + 1 : j + 3])
        if marker in _JPEG_SOF and frame is None:
            if j + 8 > n:
                return None
            frame = (j, marker)
        if length < 2:
            break
        i = j + 1 + length
    return _jpeg_info(data, *frame, first_scan=None) if frame is not None else None


_JPEG_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _jpeg_info(data: bytes, sof: int, marker: int, first_scan: int | None) -> ImageInfo:
    """The frame header at data[sof] (its 0xFF..marker code), for the decode budget.

    IMREAD_COLOR gives BGR (8-bit; 16-bit counted for a 12/16-bit frame), through a 4-channel
    buffer for CMYK. libjpeg holds every block's DCT coefficients (2 bytes each) for a progressive
    file or a sequential one in several scans, even for a reduced decode: 36 MB for a 12 MP 4:2:0
    progressive JPEG whose reduced output is 0.6 MB. A single interleaved scan needs only row buffers.
    """
    precision = data[sof + 3] if sof + 3 < len(data) else 16
    h, w = struct.unpack(">HH", data[sof + 4 : sof + 8])
    nf = data[sof + 8] if sof + 8 < len(data) else 4
    factors = [(b >> 4, b & 0xF) for b in data[sof + 10 : sof + 9 + 3 * nf : 3]]
    if len(factors) != nf or not factors or not all(hv[0] and hv[1] for hv in factors):
        factors = [(1, 1)] * max(nf, 4)  # unreadable: count every component at full resolution
    buffered = True
    if marker not in _JPEG_PROGRESSIVE and first_scan is not None and first_scan + 4 < len(data):
        buffered = data[first_scan + 3] < nf  # Ns: components in the first scan
    coefficients = 0
    if buffered:
        hmax, vmax = max(f[0] for f in factors), max(f[1] for f in factors)
        for hi, vi in factors:  # 8x8 blocks per component, in whole MCUs, 64 coefficients of 2 bytes
            cols = _ceil_div(_ceil_div(_ceil_div(w * hi, hmax), 8), hi) * hi
            rows = _ceil_div(_ceil_div(_ceil_div(h * vi, vmax), 8), vi) * vi
            coefficients += cols * rows * 64 * 2
    return ImageInfo(
        "jpeg",
        w,
        h,
        channels=4 if nf == 4 else 3,
        sample_bytes=2 if precision > 8 else 1,
        decoder_bytes=coefficients,
    )


# TIFF tags read from IFD0.
_IMAGE_WIDTH, _IMAGE_LENGTH, _ORIENTATION, _TILE_WIDTH, _TILE_LENGTH = 256, 257, 274, 322, 323
_BITS_PER_SAMPLE, _PHOTOMETRIC, _SAMPLES_PER_PIXEL, _ROWS_PER_STRIP = 258, 262, 277, 278
_PLANAR_CONFIG, _EXTRA_SAMPLES, _SAMPLE_FORMAT = 284, 338, 339
_TIFF_LAYOUT_TAGS = frozenset(
    {
        _BITS_PER_SAMPLE,
        _PHOTOMETRIC,
        _SAMPLES_PER_PIXEL,
        _ROWS_PER_STRIP,
        _PLANAR_CONFIG,
        _EXTRA_SAMPLES,
        _SAMPLE_FORMAT,
    }
)
_TIFF_MAX_ENTRIES = 4096
_TIFF_MAX_SAMPLES = 16  # values of a per-sample tag we read; OpenCV decodes at most 4 samples
_TIFF_BYTE, _TIFF_SHORT, _TIFF_LONG = 1, 3, 4
_TIFF_FORMATS = {_TIFF_BYTE: "B", _TIFF_SHORT: "H", _TIFF_LONG: "I"}


def _ifd0_entries(data: bytes, base: int) -> tuple[str, range] | None:
    """Byte order and the offsets of IFD0's 12-byte entries, of the TIFF structure at data[base:]."""
    magic = data[base : base + 4]
    if magic == b"II*\x00":
        order = "<"
    elif magic == b"MM\x00*":
        order = ">"
    else:
        return None  # BigTIFF ("II+\0") included: not accepted
    if len(data) < base + 8:
        return None
    (offset,) = struct.unpack(order + "I", data[base + 4 : base + 8])
    pos = base + offset
    if offset < 8 or pos + 2 > len(data):
        return None
    (count,) = struct.unpack(order + "H", data[pos : pos + 2])
    pos += 2
    if count == 0 or count > _TIFF_MAX_ENTRIES or pos + 12 * count > len(data):
        return None
    return order, range(pos, pos + 12 * count, 12)


def _entry_values(data: bytes, base: int, order: str, k: int, max_count: int) -> tuple[int, ...] | None:
    """The BYTE/SHORT/LONG values of the entry at data[k], in line or at its offset; None if unreadable."""
    _, typ, n = struct.unpack(order + "HHI", data[k : k + 8])
    fmt = _TIFF_FORMATS.get(typ)
    if fmt is None or n == 0 or n > max_count:
        return None
    size = struct.calcsize(fmt) * n
    if size <= 4:  # in the value field, left-justified in either byte order
        field = data[k + 8 : k + 8 + size]
    else:
        start = base + struct.unpack(order + "I", data[k + 8 : k + 12])[0]
        field = data[start : start + size]
        if len(field) != size:
            return None
    return struct.unpack(order + fmt * n, field)


def _read_ifd0(data: bytes, base: int, tags: frozenset[int]) -> dict[int, int] | None:
    """Single-valued SHORT/LONG `tags` of IFD0 of the TIFF structure at data[base:].

    Used for TIFF files and for EXIF blobs (which are TIFF structures). None if the
    structure is unreadable or one of `tags` has a type or count we do not read.
    A tag listed twice keeps its largest value (the pessimistic reading for sizes).
    """
    ifd = _ifd0_entries(data, base)
    if ifd is None:
        return None
    order, entries = ifd
    found: dict[int, int] = {}
    for k in entries:
        tag, typ = struct.unpack(order + "HH", data[k : k + 4])
        if tag not in tags:
            continue
        values = _entry_values(data, base, order, k, 1) if typ in (_TIFF_SHORT, _TIFF_LONG) else None
        if values is None:
            return None
        found[tag] = max(values[0], found.get(tag, 0))
    return found


def _read_ifd0_values(data: bytes, base: int, tags: frozenset[int]) -> dict[int, tuple[int, ...] | None]:
    """All values of `tags` in IFD0 (per-sample tags have several): None for a tag we cannot read.

    A tag listed twice gets the values of both (the readers below take the pessimistic one).
    """
    ifd = _ifd0_entries(data, base)
    if ifd is None:
        return dict.fromkeys(tags)
    order, entries = ifd
    found: dict[int, tuple[int, ...] | None] = {}
    for k in entries:
        (tag,) = struct.unpack(order + "H", data[k : k + 2])
        if tag in tags:
            values = _entry_values(data, base, order, k, _TIFF_MAX_SAMPLES)
            before = found.get(tag, ())
            found[tag] = None if values is None or before is None else before + values
    return found


def _probe_tiff(data: bytes) -> ImageInfo | None:
    tags = _read_ifd0(data, 0, frozenset({_IMAGE_WIDTH, _IMAGE_LENGTH, _TILE_WIDTH, _TILE_LENGTH}))
    if tags is None or _IMAGE_WIDTH not in tags or _IMAGE_LENGTH not in tags:
        return None
    w, h = tags[_IMAGE_WIDTH], tags[_IMAGE_LENGTH]
    # OpenCV allocates a whole tile as its working buffer, sized from the tile tags and not
    # clipped to the image: a 16x16 TIFF with 15008x15008 tiles costs ~1 GB before failing.
    # (RowsPerStrip needs no such check: libtiff clamps it to the image height.)
    tiled = bool({_TILE_WIDTH, _TILE_LENGTH} & tags.keys())
    buffer = tags.get(_TILE_WIDTH, w) * tags.get(_TILE_LENGTH, h) if tiled else 0
    layout = _read_ifd0_values(data, 0, _TIFF_LAYOUT_TAGS)
    if tiled:
        block = (tags.get(_TILE_WIDTH, w), tags.get(_TILE_LENGTH, h))
    else:
        rows = layout.get(_ROWS_PER_STRIP, (h,))
        block = (w, h if rows is None else min(max(rows), h) or h)
    return _tiff_info(w, h, buffer, block, layout)


_PHOTOMETRIC_MINISWHITE, _PHOTOMETRIC_PALETTE, _PHOTOMETRIC_LOGLUV = 0, 3, 32844


def _tiff_info(
    w: int, h: int, buffer: int, block: tuple[int, int], layout: dict[int, tuple[int, ...] | None]
) -> ImageInfo:
    """What OpenCV's TIFF decoder (grfmt_tiff.cpp, OpenCV 5) makes of IFD0's sample layout.

    Samples of up to 8 bits go through libtiff's RGBA reader: 8-bit BGR(A) or grey, through a
    4-byte-per-pixel buffer the size of a strip or tile, with colour multiplied by alpha. Wider
    samples are copied from a raw strip or tile buffer into a 16/32/64-bit result, alpha as
    stored. A tag we cannot read counts as its worst (64-bit samples, 4 of them, planes apart).
    """

    def first(tag: int, default: int, worst: int) -> int:
        values = layout.get(tag, (default,))
        return worst if values is None else values[0]

    bits_values = layout.get(_BITS_PER_SAMPLE, (1,))  # TIFF's default: bilevel
    bits = 64 if bits_values is None else max(bits_values)
    samples = first(_SAMPLES_PER_PIXEL, 1, 4)
    photometric = first(_PHOTOMETRIC, 2, 2)
    planes = layout.get(_PLANAR_CONFIG, (1,))
    planar = planes is None or 2 in planes
    extra = first(_EXTRA_SAMPLES, 0, 0)
    grey = photometric in (0, 1)
    if photometric == _PHOTOMETRIC_LOGLUV and samples == 3:
        bits = 32
    elif bits > 8 and (photometric > 2 or samples not in (1, 3, 4)):
        bits = 8  # OpenCV reads these through the RGBA reader too
    channels = max(1, min(samples, 4))
    block_pixels = block[0] * block[1]
    if bits <= 8:
        channels = 3 if photometric == _PHOTOMETRIC_PALETTE else 1 if grey else channels
        sample_bytes, decoder = 1, block_pixels * 4
    else:
        sample_bytes = 2 if bits <= 16 else 4 if bits <= 32 else 8
        channels = 1 if grey and bits <= 16 else channels
        decoder = _ceil_div(block_pixels * samples * bits, 8)
        if bits < 16:  # 10/12/14-bit samples are unpacked into a second buffer
            decoder += block_pixels * samples * 2
    unsupported = ""
    stored_bits = 64 if bits_values is None else max(bits_values)
    if planar and samples > 1 and stored_bits > 8:
        # OpenCV reads plane 0's strips as if they held every sample and takes the rest of its
        # buffer uninitialised: wrong, and different on every decode (measured for 10 to 64 bits,
        # stripped and tiled, any compression). Samples of 8 bits or less go through libtiff's
        # RGBA reader, which handles separate planes (measured exact).
        unsupported = (
            f"a TIFF stored one colour plane at a time (PlanarConfiguration 2) with "
            f"{stored_bits if bits_values is not None else 'unreadable'}-bit samples is not supported "
            "(OpenCV misreads it); store the samples interleaved (PlanarConfiguration 1) or as 8-bit"
        )
    return ImageInfo(
        "tiff",
        w,
        h,
        buffer,
        channels=channels,
        sample_bytes=sample_bytes,
        decoder_bytes=decoder,
        premultiplied=channels == 4 and (extra == 1 or (extra == 2 and bits <= 8)),
        inverted=photometric == _PHOTOMETRIC_MINISWHITE and bits > 8 and channels == 1,
        unsupported=unsupported,
    )


_PNG_MAX_CHUNKS = 65_536  # a 10 MiB PNG in libpng's 8 KiB IDATs has ~1300


def png_chunks_fit(data: bytes) -> bool:
    """Whether every PNG chunk up to IEND lies inside `data`.

    OpenCV 5's PNG reader allocates each chunk's *declared* length before reading it,
    so an 11 KB file whose IDAT claims 4 GB costs 4 GB of RAM and seconds of CPU before it
    fails. A PNG with no IEND is refused by OpenCV anyway, so nothing readable is lost.
    """
    pos, n = 8, len(data)
    for _ in range(_PNG_MAX_CHUNKS):
        if pos + 12 > n:
            return False
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        end = pos + 12 + length
        if end > n:
            return False
        if data[pos + 4 : pos + 8] == b"IEND":
            return True
        pos = end
    return False


# --------------------------------------------------------------------------- orientation


def _orientation_from_exif(blob: bytes) -> int:
    """The EXIF Orientation (1..8) of an EXIF blob (a TIFF structure, maybe behind "Exif\\0\\0"); 1 if none."""
    base = 6 if blob[:6] == b"Exif\x00\x00" else 0
    tags = _read_ifd0(blob, base, frozenset({_ORIENTATION}))
    value = (tags or {}).get(_ORIENTATION, 1)
    return value if 1 <= value <= 8 else 1


# EXIF orientation -> the transform that shows the image upright (as OpenCV's own
# ApplyExifOrientation does it: transpose for the four 90-degree cases, then a flip).
_ORIENT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda m: cv2.flip(m, 1),
    3: lambda m: cv2.flip(m, -1),
    4: lambda m: cv2.flip(m, 0),
    5: lambda m: cv2.transpose(m),
    6: lambda m: cv2.flip(cv2.transpose(m), 1),
    7: lambda m: cv2.flip(cv2.transpose(m), -1),
    8: lambda m: cv2.flip(cv2.transpose(m), 0),
}


def apply_orientation(img: np.ndarray, orientation: int) -> np.ndarray:
    """Turn an image stored with EXIF `orientation` (1..8) upright."""
    transform = _ORIENT.get(orientation)
    return transform(img) if transform else img


def _exif_orientation(types: Sequence[int], blobs: Sequence[np.ndarray]) -> int:
    for kind, blob in zip(np.ravel(np.asarray(types, dtype=np.int64)), blobs, strict=False):
        if int(kind) == cv2.IMAGE_METADATA_EXIF:
            return _orientation_from_exif(np.asarray(blob, np.uint8).tobytes())
    return 1


# --------------------------------------------------------------------------- decoding

_REDUCED_FLAGS = ((8, cv2.IMREAD_REDUCED_COLOR_8), (4, cv2.IMREAD_REDUCED_COLOR_4), (2, cv2.IMREAD_REDUCED_COLOR_2))


def reduced_decode_flag(width: int, height: int, target: int) -> int:
    """The JPEG decoder's DCT-domain downscale (1/2, 1/4, 1/8) that still leaves >= target pixels."""
    for factor, flag in _REDUCED_FLAGS:
        if min(width, height) >= target * factor:
            return flag
    return cv2.IMREAD_COLOR


def _decode(buf: np.ndarray, info: ImageInfo, target: int | None) -> np.ndarray | None:
    """OpenCV's decode with the flag each format needs. BGR(A) or gray, any depth; None on failure.

    JPEG: IMREAD_COLOR / IMREAD_REDUCED_COLOR_n. OpenCV 5 applies the EXIF orientation
      for every flag except IMREAD_UNCHANGED, converts CMYK/YCCK and grayscale to BGR,
      and decodes progressive files. A JPEG cut short anywhere (no EOI) fails in OpenCV
      5's decoder instead of coming back grey-padded, so truncated JPEGs are 400s; we do
      not try to rescue them. Damaged entropy data with intact framing still decodes
      (libjpeg patches it and prints a "Corrupt JPEG data" warning): accepted, as a browser would.
    PNG, WebP: IMREAD_UNCHANGED keeps alpha and 16 bits, but then OpenCV does not apply
      the EXIF orientation, so it is read from the EXIF blob and applied here.
    GIF: IMREAD_UNCHANGED gives the first frame as BGRA (transparent index -> alpha 0).
    TIFF: IMREAD_UNCHANGED; libtiff's reader already applies the Orientation tag.
    BMP: IMREAD_COLOR. The fourth byte of a 32-bit BMP is usually unused (0): taking it
      for alpha would turn most 32-bit BMPs white.
    """
    if info.format == "jpeg":
        flag = reduced_decode_flag(info.width, info.height, target) if target else cv2.IMREAD_COLOR
        return cv2.imdecode(buf, flag)
    if info.format == "bmp":
        return cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if info.format in ("png", "webp") and hasattr(cv2, "imdecodeWithMetadata"):  # OpenCV >= 4.12
        img, types, blobs = cv2.imdecodeWithMetadata(buf, cv2.IMREAD_UNCHANGED)
        if img is None or img.size == 0:
            return None
        return apply_orientation(img, _exif_orientation(types, blobs))
    return cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)


# --------------------------------------------------------------------------- the decode budget

_REDUCTION = {flag: factor for factor, flag in _REDUCED_FLAGS}
# Conversion works on bands of about this many samples: a float64 temporary of a band is 2 MiB.
_BAND_SAMPLES = 1 << 18
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
        w, h = _ceil_div(w, factor), _ceil_div(h, factor)
    return _cost(w * h, info.channels, info.sample_bytes, info.decoder_bytes, info.inverted)


def _cost(pixels: int, channels: int, sample_bytes: int, decoder_bytes: int, inverted: bool) -> int:
    result = pixels * channels * sample_bytes
    decode_peak = result + max(result, decoder_bytes)
    if not _needs_conversion(channels, sample_bytes == 1, inverted):
        return decode_peak + _DECODE_OVERHEAD
    converted = pixels * (1 if channels == 1 else 3)
    return max(decode_peak, result + converted + _CONVERSION_WORKSPACE) + _DECODE_OVERHEAD


def _needs_conversion(channels: int, uint8: bool, inverted: bool) -> bool:
    return not (uint8 and channels in (1, 3) and not inverted)


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


# --------------------------------------------------------------------------- conversion to uint8


def _to_uint8(img: np.ndarray) -> np.ndarray:
    """Any depth -> uint8, element by element (so a band of rows converts exactly as the whole would)."""
    if img.dtype == np.uint8:
        return img
    if img.dtype == np.uint16:
        return cv2.convertScaleAbs(img, alpha=1.0 / 257.0)  # round(v * 255 / 65535)
    if img.dtype == np.bool_:
        return img.astype(np.uint8) * np.uint8(255)
    if np.issubdtype(img.dtype, np.floating):  # float TIFF: 0..1 is black..white
        unit = np.clip(np.nan_to_num(img, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
        return np.rint(unit * 255.0).astype(np.uint8)
    info = np.iinfo(img.dtype)  # other integer TIFFs: the type's full range
    return ((img.astype(np.float64) - info.min) * (255.0 / (float(info.max) - info.min))).astype(np.uint8)


def _composite(bgra: np.ndarray, premultiplied: bool = False) -> np.ndarray:
    """uint8 BGRA -> BGR over BACKGROUND_RGB, in uint8 with OpenCV's SIMD ops, in place where it can.

    `premultiplied`: the colour is already colour x alpha (libtiff's RGBA reader, associated alpha).
    """
    alpha = cv2.extractChannel(bgra, 3)
    bgr = cv2.cvtColor(bgra, cv2.COLOR_BGRA2BGR)
    if cv2.minMaxLoc(alpha)[0] == 255:
        return bgr
    a3 = cv2.cvtColor(alpha, cv2.COLOR_GRAY2BGR)
    del alpha
    if not premultiplied:
        cv2.multiply(bgr, a3, dst=bgr, scale=1.0 / 255.0)  # colour x alpha
    cv2.bitwise_not(a3, dst=a3)  # 255 - alpha
    if BACKGROUND_RGB != (255, 255, 255):  # background x (1 - alpha); for white that is 255 - alpha itself
        a3 = cv2.multiply(a3, np.full_like(a3, BACKGROUND_RGB[::-1]), scale=1.0 / 255.0)
    cv2.add(bgr, a3, dst=bgr)
    return bgr


def _band_to_bgr_or_gray(band: np.ndarray, channels: int, premultiplied: bool) -> np.ndarray:
    """A band of rows of any OpenCV decode result (gray, gray+alpha, BGR, BGRA; any depth) -> uint8 gray or BGR."""
    band = _to_uint8(band)
    if channels == 1:
        return band.reshape(band.shape[:2])
    if channels == 2:  # gray + alpha
        gray, alpha = cv2.extractChannel(band, 0), cv2.extractChannel(band, 1)
        return _composite(cv2.merge([gray, gray, gray, alpha]), premultiplied)
    if channels == 3:
        return band
    return _composite(band, premultiplied)


def _to_bgr_or_gray(img: np.ndarray, premultiplied: bool = False, inverted: bool = False) -> np.ndarray:
    """Any OpenCV decode result (gray, gray+alpha, BGR, BGRA; any depth) -> uint8 gray or BGR.

    uint8 gray and BGR come back as they are. Anything else is converted a band of rows at a time
    into one uint8 result, so the cost is that result plus a few MiB of band temporaries, never a
    full-size float copy (a 40 MP float32 RGBA image used to take 1.9 GB on top of its 640 MB).
    Every step is per pixel, so the result is the same as converting the whole image at once.
    `inverted`: grey stored as 0 = white (MinIsWhite), turned the right way round.
    """
    channels = 1 if img.ndim == 2 else img.shape[2]
    if channels not in (1, 2, 3, 4):
        raise ImageInputError("undecodable_image", f"unsupported channel count {channels}")
    if not _needs_conversion(channels, img.dtype == np.uint8, inverted):
        return img.reshape(img.shape[:2]) if channels == 1 else img
    height, width = img.shape[:2]
    out = np.empty((height, width) if channels == 1 else (height, width, 3), np.uint8)
    rows = max(1, _BAND_SAMPLES // (width * channels))
    for y in range(0, height, rows):
        out[y : y + rows] = _band_to_bgr_or_gray(img[y : y + rows], channels, premultiplied)
    if inverted:
        cv2.bitwise_not(out, dst=out)
    return out


# --------------------------------------------------------------------------- checks, decode, convert


def check_header(
    data: bytes, max_pixels: int, target: int | None, max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES
) -> tuple[ImageInfo, int]:
    """The checks made from the header alone, in `preprocess`'s order; the header and the decode's estimated cost.

    Raises ImageInputError (empty_body, undecodable_image, too_many_pixels, unsupported_image,
    decode_budget_exceeded). Microseconds, no decoding: callers may run it on an event loop.
    """
    if not data:
        raise ImageInputError("empty_body", "the request carried no image bytes")
    info = probe_dimensions(data)
    if info is None:
        raise ImageInputError("undecodable_image", "not a recognised image format (JPEG, PNG, GIF, BMP, WebP, TIFF)")
    limit = min(max_pixels, OPENCV_MAX_PIXELS)  # beyond OpenCV's own limit it would refuse anyway
    if info.pixels > limit or max(info.width, info.height) > OPENCV_MAX_SIDE:
        what = f"{info.width}x{info.height}"
        if info.buffer_pixels > info.width * info.height:
            what += f" with {info.buffer_pixels}-pixel tiles"
        raise ImageInputError("too_many_pixels", f"image is {what}; the limit is {limit} pixels")
    if info.width == 0 or info.height == 0:
        raise ImageInputError("undecodable_image", f"{info.format} header declares a zero-sized image")
    if info.unsupported:
        raise ImageInputError("unsupported_image", info.unsupported)
    return info, check_decode_budget(info, target, max_decode_bytes)


def _decode_checked(
    data: bytes, max_pixels: int, target: int | None, max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES
) -> np.ndarray:
    """Checks, decode and conversion to uint8 gray HxW or BGR HxWx3. Raises ImageInputError only."""
    if data and not isinstance(data, bytes):
        data = bytes(data)
    info, _ = check_header(data, max_pixels, target, max_decode_bytes)
    limit = min(max_pixels, OPENCV_MAX_PIXELS)
    if info.format == "png" and not png_chunks_fit(data):
        raise ImageInputError("undecodable_image", "png chunk lengths run past the end of the data")
    try:
        img = _decode(np.frombuffer(data, np.uint8), info, target)
        if img is None or img.size == 0:
            raise ImageInputError("undecodable_image", f"the {info.format} data could not be decoded")
        if img.shape[0] * img.shape[1] > limit:
            raise ImageInputError("too_many_pixels", f"decoded image exceeds the {limit}-pixel limit")
        # The second line, should the header and the decoder disagree: the budget applied to what came
        # back (never more than the header's estimate when they agree), before converting it.
        channels = 1 if img.ndim == 2 else img.shape[2]
        if _cost(img.shape[0] * img.shape[1], channels, img.itemsize, 0, info.inverted) > max_decode_bytes:
            raise ImageInputError(
                "decode_budget_exceeded", f"the decoded {info.format} image is larger than its header said"
            )
        return _to_bgr_or_gray(img, info.premultiplied, info.inverted)
    except MemoryError:
        raise ImageInputError("too_many_pixels", "not enough memory to decode this image") from None
    except cv2.error as e:
        raise _from_cv2_error(e, info) from None


def _from_cv2_error(e: cv2.error, info: ImageInfo) -> ImageInputError:
    text = str(e)
    if "CV_IO_MAX_IMAGE" in text:  # OpenCV's own size guard (the second line)
        return ImageInputError("too_many_pixels", f"OpenCV refused the {info.format} image's size")
    if getattr(e, "code", None) == cv2.Error.StsNoMem:
        return ImageInputError("too_many_pixels", "not enough memory to decode this image")
    return ImageInputError("undecodable_image", f"the {info.format} data could not be decoded")


def preprocess(
    data: bytes,
    size: int | Transform = 224,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    reduced: bool = True,
    max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES,
) -> np.ndarray:
    """Encoded image bytes -> the model's pixels for one image: uint8 [H, W, C] as `size` says (a Transform: the
    model's resize, crop and channel order; an int: squashed to size x size RGB).

    `max_decode_bytes`: the decode budget (see `estimate_decode_bytes`); an image whose header
    says it would cost more is refused (413 decode_budget_exceeded) before the decoder runs.
    """
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        size = Transform.square(size)
    img = _decode_checked(data, max_pixels, size.decode_target if reduced else None, max_decode_bytes)
    try:
        return size.apply(img)  # resized before the colour conversion: it then touches the output's pixels only
    except MemoryError:
        raise ImageInputError("too_many_pixels", "not enough memory to resize this image") from None


@cache
def opencv_pixel_guard_active() -> bool:
    """Whether OpenCV itself refuses, from the header, an image just over OPENCV_MAX_PIXELS.

    False when cv2 was imported before this module set OPENCV_IO_MAX_IMAGE_PIXELS.
    Costs one header parse (a crafted PNG whose IHDR is over the limit).
    """
    width = min(1_000_000, OPENCV_MAX_SIDE)  # libpng's own width limit is 1e6
    height = OPENCV_MAX_PIXELS // width + 1
    if height > width:
        return False  # a limit this large cannot be probed with a PNG header
    probe = _png_header_only(width, height)
    try:
        cv2.imdecode(np.frombuffer(probe, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as e:
        return "CV_IO_MAX_IMAGE_PIXELS" in str(e)
    return False


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


if not opencv_pixel_guard_active():
    logger.warning(
        "OpenCV's OPENCV_IO_MAX_IMAGE_PIXELS guard is not in force (cv2 was imported before app.imaging.preprocess); "
        "the header probe still refuses images over the pixel limit"
    )
