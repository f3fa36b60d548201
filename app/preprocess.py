"""Image bytes -> uint8 RGB [size, size, 3]. Pure OpenCV and numpy; no Ray.

The server's Preprocessor and the INT8 calibration reader both call
`preprocess`, so the model is calibrated on exactly what it will be served.

The contract: for *any* input bytes, `preprocess` returns a uint8 array of
shape (size, size, 3) or raises `ImageInputError`. An exception of any other
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

# OpenCV's own pixel guard, a second line behind `probe_dimensions`. OpenCV reads it
# in a static initializer when its library loads, i.e. at the first `import cv2`
# anywhere in the process: this module must be imported before anything imports cv2,
# or the guard stays at OpenCV's default (2**30). `opencv_pixel_guard_active` checks.
DEFAULT_MAX_PIXELS = 40_000_000
os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(DEFAULT_MAX_PIXELS))

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from app.errors import ImageInputError  # noqa: E402

logger = logging.getLogger(__name__)

# Keep OpenCV from spawning its own thread pool inside a replica that owns a fraction of a core.
cv2.setNumThreads(1)

# OpenCV logs every undecodable input at ERROR level ("imdecode_(''): can't read header",
# TIFF_Error ...): one or more stderr lines per bad request. Only FATAL is left on, unless
# the operator chose a level with OPENCV_LOG_LEVEL (e.g. DEBUG, to look at a bad input).
# libjpeg's "Corrupt JPEG data: ..." and libpng's "libpng error: ..." are printed by
# those libraries straight to fd 2, past OpenCV's logger; no OpenCV setting reaches them.
if "OPENCV_LOG_LEVEL" not in os.environ:
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_FATAL)


def _env_size(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


# What OpenCV will refuse on its own (loadsave.cpp, validateInputImageSize).
OPENCV_MAX_PIXELS = _env_size("OPENCV_IO_MAX_IMAGE_PIXELS", 1 << 30)
OPENCV_MAX_SIDE = min(_env_size("OPENCV_IO_MAX_IMAGE_WIDTH", 1 << 20), _env_size("OPENCV_IO_MAX_IMAGE_HEIGHT", 1 << 20))

BACKGROUND_RGB = (255, 255, 255)  # transparent pixels are composited onto white


@dataclass(frozen=True)
class ImageInfo:
    format: str  # jpeg | png | gif | bmp | webp | tiff
    width: int
    height: int
    # Pixels the decoder allocates for a working buffer regardless of the image size:
    # a TIFF tile (TileWidth x TileLength). 0 if none.
    buffer_pixels: int = 0

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
        return ImageInfo("png", w, h)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        # The logical screen: OpenCV allocates the canvas at this size and asserts
        # that every frame fits inside it.
        if len(data) < 10:
            return None
        w, h = struct.unpack("<HH", data[6:10])
        return ImageInfo("gif", w, h)
    if data[:2] == b"BM":
        return _probe_bmp(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _probe_webp(data)
    if data[:3] == b"\xff\xd8\xff":
        return _probe_jpeg(data)
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return _probe_tiff(data)
    return None


def _probe_bmp(data: bytes) -> ImageInfo | None:
    if len(data) < 18:
        return None
    (header_size,) = struct.unpack("<I", data[14:18])
    if header_size == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        if len(data) < 22:
            return None
        w, h = struct.unpack("<HH", data[18:22])
        return ImageInfo("bmp", w, h)
    if len(data) < 26:
        return None
    w, h = struct.unpack("<ii", data[18:26])  # negative height = top-down rows
    return ImageInfo("bmp", abs(w), abs(h))


def _probe_webp(data: bytes) -> ImageInfo | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:  # lossy
        w, h = struct.unpack("<HH", data[26:30])
        return ImageInfo("webp", w & 0x3FFF, h & 0x3FFF)
    if chunk == b"VP8L" and len(data) >= 25:  # lossless
        b = data[21:25]
        w = 1 + (((b[1] & 0x3F) << 8) | b[0])
        h = 1 + (((b[3] & 0xF) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6))
        return ImageInfo("webp", w, h)
    if chunk == b"VP8X" and len(data) >= 30:  # extended (alpha, EXIF, animation): the canvas size
        w = 1 + int.from_bytes(data[24:27], "little")
        h = 1 + int.from_bytes(data[27:30], "little")
        return ImageInfo("webp", w, h)
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
    """
    n, i = len(data), 2
    for _ in range(_JPEG_MAX_SEGMENTS):
        i = data.find(b"\xff", i)
        if i < 0:
            return None
        m = _NOT_FF.search(data, i, i + _JPEG_MAX_FILL)  # a run of fill bytes ends at the marker code
        if m is None:
            return None
        j = m.start()
        marker = data[j]
        if marker == 0x00 or marker == 0x01 or 0xD0 <= marker <= 0xD7:  # stuffed zero, TEM, RSTn
            i = j + 1
            continue
        if marker in (0xD8, 0xD9, 0xDA):  # SOI, EOI, SOS before a frame header
            return None
        if j + 3 > n:
            return None
        (length,) = struct.unpack(">H", data[j + 1 : j + 3])
        if marker in _JPEG_SOF:
            if j + 8 > n:
                return None
            h, w = struct.unpack(">HH", data[j + 4 : j + 8])
            return ImageInfo("jpeg", w, h)
        if length < 2:
            return None
        i = j + 1 + length
    return None


# TIFF tags read from IFD0.
_IMAGE_WIDTH, _IMAGE_LENGTH, _ORIENTATION, _TILE_WIDTH, _TILE_LENGTH = 256, 257, 274, 322, 323
_TIFF_MAX_ENTRIES = 4096
_TIFF_SHORT, _TIFF_LONG = 3, 4


def _read_ifd0(data: bytes, base: int, tags: frozenset[int]) -> dict[int, int] | None:
    """Single-valued SHORT/LONG `tags` of IFD0 of the TIFF structure at data[base:].

    Used for TIFF files and for EXIF blobs (which are TIFF structures). None if the
    structure is unreadable or one of `tags` has a type or count we do not read.
    A tag listed twice keeps its largest value (the pessimistic reading for sizes).
    """
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
    found: dict[int, int] = {}
    for k in range(pos, pos + 12 * count, 12):
        tag, typ, n = struct.unpack(order + "HHI", data[k : k + 8])
        if tag not in tags:
            continue
        if n != 1 or typ not in (_TIFF_SHORT, _TIFF_LONG):
            return None
        # A SHORT sits in the first two bytes of the value field, in either byte order.
        field = data[k + 8 : k + 10] if typ == _TIFF_SHORT else data[k + 8 : k + 12]
        (value,) = struct.unpack(order + ("H" if typ == _TIFF_SHORT else "I"), field)
        found[tag] = max(value, found.get(tag, 0))
    return found


def _probe_tiff(data: bytes) -> ImageInfo | None:
    tags = _read_ifd0(data, 0, frozenset({_IMAGE_WIDTH, _IMAGE_LENGTH, _TILE_WIDTH, _TILE_LENGTH}))
    if tags is None or _IMAGE_WIDTH not in tags or _IMAGE_LENGTH not in tags:
        return None
    w, h = tags[_IMAGE_WIDTH], tags[_IMAGE_LENGTH]
    # OpenCV allocates a whole tile as its working buffer, sized from the tile tags and not
    # clipped to the image: a 16x16 TIFF with 15008x15008 tiles costs ~1 GB before failing.
    # (RowsPerStrip needs no such check: libtiff clamps it to the image height.)
    buffer = tags.get(_TILE_WIDTH, w) * tags.get(_TILE_LENGTH, h) if {_TILE_WIDTH, _TILE_LENGTH} & tags.keys() else 0
    return ImageInfo("tiff", w, h, buffer)


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


def _to_uint8(img: np.ndarray) -> np.ndarray:
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


def _composite(bgra: np.ndarray) -> np.ndarray:
    """uint8 BGRA -> BGR over BACKGROUND_RGB, in uint8 with OpenCV's SIMD ops, in place where it can."""
    alpha = cv2.extractChannel(bgra, 3)
    bgr = cv2.cvtColor(bgra, cv2.COLOR_BGRA2BGR)
    if cv2.minMaxLoc(alpha)[0] == 255:
        return bgr
    a3 = cv2.cvtColor(alpha, cv2.COLOR_GRAY2BGR)
    del alpha
    cv2.multiply(bgr, a3, dst=bgr, scale=1.0 / 255.0)  # colour x alpha
    cv2.bitwise_not(a3, dst=a3)  # 255 - alpha
    if BACKGROUND_RGB != (255, 255, 255):  # background x (1 - alpha); for white that is 255 - alpha itself
        a3 = cv2.multiply(a3, np.full_like(a3, BACKGROUND_RGB[::-1]), scale=1.0 / 255.0)
    cv2.add(bgr, a3, dst=bgr)
    return bgr


def _to_bgr_or_gray(img: np.ndarray) -> np.ndarray:
    """Any uint8 OpenCV decode result (gray, gray+alpha, BGR, BGRA) -> gray or BGR."""
    channels = 1 if img.ndim == 2 else img.shape[2]
    if channels == 1:
        return img.reshape(img.shape[:2])
    if channels == 2:  # gray + alpha
        gray, alpha = cv2.extractChannel(img, 0), cv2.extractChannel(img, 1)
        return _composite(cv2.merge([gray, gray, gray, alpha]))
    if channels == 3:
        return img
    if channels == 4:
        return _composite(img)
    raise ImageInputError("undecodable_image", f"unsupported channel count {channels}")


def _decode_checked(data: bytes, max_pixels: int, target: int | None) -> np.ndarray:
    """Checks, decode and conversion to uint8 gray HxW or BGR HxWx3. Raises ImageInputError only."""
    if not data:
        raise ImageInputError("empty_body", "the request carried no image bytes")
    if not isinstance(data, bytes):
        data = bytes(data)
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
    if info.format == "png" and not png_chunks_fit(data):
        raise ImageInputError("undecodable_image", "png chunk lengths run past the end of the data")
    try:
        img = _decode(np.frombuffer(data, np.uint8), info, target)
        if img is None or img.size == 0:
            raise ImageInputError("undecodable_image", f"the {info.format} data could not be decoded")
        if img.shape[0] * img.shape[1] > limit:
            raise ImageInputError("too_many_pixels", f"decoded image exceeds the {limit}-pixel limit")
        img = _to_uint8(img)  # rebinding frees a 16-bit original before the colour work starts
        return _to_bgr_or_gray(img)
    except MemoryError:
        raise ImageInputError("too_many_pixels", "not enough memory to decode this image") from None
    except cv2.error as e:
        raise _from_cv2_error(e, info) from None


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, target: int | None = None) -> np.ndarray:
    """Decode to uint8 RGB HxWx3, refusing bombs before the decoder allocates.

    JPEGs are decoded with EXIF orientation applied, reduced in the DCT domain
    when far larger than `target`; transparent pixels are composited onto
    BACKGROUND_RGB. Raises ImageInputError and nothing else for bad input.
    """
    img = _decode_checked(data, max_pixels, target)
    return cv2.cvtColor(img, cv2.COLOR_GRAY2RGB if img.ndim == 2 else cv2.COLOR_BGR2RGB)


def _from_cv2_error(e: cv2.error, info: ImageInfo) -> ImageInputError:
    text = str(e)
    if "CV_IO_MAX_IMAGE" in text:  # OpenCV's own size guard (the second line)
        return ImageInputError("too_many_pixels", f"OpenCV refused the {info.format} image's size")
    if getattr(e, "code", None) == cv2.Error.StsNoMem:
        return ImageInputError("too_many_pixels", "not enough memory to decode this image")
    return ImageInputError("undecodable_image", f"the {info.format} data could not be decoded")


def resize(img: np.ndarray, size: int) -> np.ndarray:
    """Squash to size x size with area interpolation (what the model was checked against)."""
    if img.shape[0] == size and img.shape[1] == size:
        return np.ascontiguousarray(img)
    interpolation = cv2.INTER_AREA if min(img.shape[:2]) >= size else cv2.INTER_LINEAR
    return cv2.resize(img, (size, size), interpolation=interpolation)


def preprocess(data: bytes, size: int = 224, max_pixels: int = DEFAULT_MAX_PIXELS, reduced: bool = True) -> np.ndarray:
    """Encoded image bytes -> uint8 RGB [size, size, 3], the model's input for one image."""
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    img = _decode_checked(data, max_pixels, size if reduced else None)
    try:
        small = resize(img, size)  # before the colour conversion: it then touches size*size pixels only
        return cv2.cvtColor(small, cv2.COLOR_GRAY2RGB if small.ndim == 2 else cv2.COLOR_BGR2RGB)
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
        "OpenCV's OPENCV_IO_MAX_IMAGE_PIXELS guard is not in force (cv2 was imported before app.preprocess); "
        "the header probe still refuses images over the pixel limit"
    )
