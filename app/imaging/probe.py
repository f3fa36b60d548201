"""An image's format, size and decode layout, read from its header alone: `ImageInfo`, and the probes for JPEG, PNG,
GIF, BMP, WebP and TIFF (`probe_dimensions`), a PNG's chunk framing (`png_chunks_fit`), and the EXIF orientation
(an EXIF blob is a TIFF structure, read with the TIFF probe's IFD0 reader).

Pure Python (struct, re): no OpenCV, no numpy, no decoding; each walk over the header is bounded, so a crafted
header costs microseconds. The Router reads every request's header on its event loop (`app.http.inputs`,
through `check_header`), and `app.imaging.preprocess` reads it again before decoding.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

# The file names of the formats probed here (a directory of images: calibration sets, a cascade's captures).
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"})


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


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up, in integers (block and reduced-decode sizes)."""
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
            cols = ceil_div(ceil_div(ceil_div(w * hi, hmax), 8), hi) * hi
            rows = ceil_div(ceil_div(ceil_div(h * vi, vmax), 8), vi) * vi
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
        decoder = ceil_div(block_pixels * samples * bits, 8)
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


# --------------------------------------------------------------------------- EXIF orientation


def orientation_from_exif(blob: bytes) -> int:
    """The EXIF Orientation (1..8) of an EXIF blob (a TIFF structure, maybe behind "Exif\\0\\0"); 1 if none."""
    base = 6 if blob[:6] == b"Exif\x00\x00" else 0
    tags = _read_ifd0(blob, base, frozenset({_ORIENTATION}))
    value = (tags or {}).get(_ORIENTATION, 1)
    return value if 1 <= value <= 8 else 1
