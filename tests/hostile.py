"""A generated corpus of hostile and odd request bodies for the single-image classify endpoint.

`hostile_cases()` returns HostileCase(name, body, content_type, expected_status,
expected_code, kind, layer, note). Everything is generated here (nothing is
checked in); the pure unit test (tests/test_hostile_corpus_unit.py) runs the
cases the image decoder decides, the HTTP tests POST all of them.

kind: how the HTTP test sends it.
  "raw"        body = the image bytes under test, POSTed as the request body with
               `content_type` (the case is about those bytes).
  "raw_body"   POSTed the same way, but the case is about the request, not image
               content: body size, media type.
  "multipart"  body = a complete multipart/form-data body; `content_type` carries
               its boundary (or deliberately does not).
  An empty `content_type` means: send no Content-Type header at all.

layer: which part of the service gives the verdict.
  "router"      the HTTP layer, before any image byte is interpreted: body size
                (payload_too_large), media type (unsupported_media_type), multipart
                framing (bad_multipart, missing_file, too_many_files).
  "preprocess"  `app.imaging.preprocess.preprocess` on the image bytes: empty_body,
                undecodable_image, too_many_pixels, decode_budget_exceeded (413: within
                the pixel and body limits, but decoding would take more memory than the
                decode budget), unsupported_image (415: a layout OpenCV misreads), or 200.
                The Router's header check (`probe_dimensions`) refuses empty bodies and
                pixel bombs before a replica decodes anything, with the same code; the
                verdict does not depend on which of the two says it first.

Decisions this corpus pins down:
- The Content-Type is not trusted for the format. Any image/* or
  application/octet-stream body is sniffed by its magic bytes, so a PNG sent as
  image/jpeg is decoded as a PNG (200). Rejecting it would add no safety (the
  decoder is chosen by the bytes either way) and would break clients that label
  everything image/jpeg. A non-image media type (text/plain, application/json,
  none) is refused (415) before the body is looked at, even if it holds a JPEG.
- image/* is not a promise of support: SVG, HTML or PDF bytes labelled image/* are
  400 undecodable_image. Only JPEG, PNG, GIF, BMP, WebP and TIFF are decoded (not
  SVG, nor the PNM/HDR/JPEG 2000/AVIF files OpenCV could read).
- Truncated JPEGs are 400: OpenCV 5's decoder fails on a JPEG cut short anywhere
  (even just the EOI marker missing) rather than returning a grey-padded image.
  A JPEG whose entropy data is damaged but whose framing is intact still decodes (200).
- A multipart preamble (bytes before the first boundary, RFC 2046) is ignored, however
  large, as long as the whole body is within the body limit.

Status codes and codes come from app.errors.STATUS; a 200 case has expected_code "".
"""

from __future__ import annotations

import io
import random
import struct
import zlib
from dataclasses import dataclass
from functools import cache
from typing import Literal

import numpy as np
from PIL import Image

from app.errors import STATUS
from app.imaging.preprocess import cv2  # OpenCV as app.imaging.preprocess loads it: after setting its pixel guard

Kind = Literal["raw", "multipart", "raw_body"]
Layer = Literal["router", "preprocess"]

DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024  # RouterConfig.max_body_bytes default
BOUNDARY = "hostile-boundary-7d3f"


@dataclass(frozen=True)
class HostileCase:
    name: str
    body: bytes
    content_type: str
    expected_status: int
    expected_code: str  # "" when expected_status is 200
    kind: Kind
    layer: Layer = "preprocess"
    note: str = ""

    def __repr__(self) -> str:  # keep pytest ids and failure output readable (bodies can be 11 MiB)
        return f"HostileCase({self.name!r}, {len(self.body)} bytes, {self.content_type!r}, {self.expected_status})"


# --------------------------------------------------------------------------- image builders


def pattern_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A BGR uint8 image with structure (gradients + a few blocks), so codecs behave as on photos."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    img = np.stack([np.broadcast_to(x, (height, width)), np.broadcast_to(y, (height, width)), (x + y) / 2], axis=-1)
    img = img + rng.integers(-6, 7, img.shape, dtype=np.int16)
    return np.clip(img, 0, 255).astype(np.uint8)


def cv_encode(ext: str, img: np.ndarray, params: list[int] | None = None) -> bytes:
    ok, buf = cv2.imencode(ext, img, params or [])
    if not ok:
        raise RuntimeError(f"cv2.imencode({ext}) failed")
    return buf.tobytes()


def pil_encode(img: Image.Image, fmt: str, **kwargs: object) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **kwargs)
    return out.getvalue()


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_raw(width: int, height: int, idat: bytes, *, color_type: int = 0, bit_depth: int = 8) -> bytes:
    """A PNG from its parts: a valid IHDR for any size, then `idat` (already zlib-compressed)."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def png_bomb(width: int = 60_000, height: int = 60_000) -> bytes:
    """Valid IHDR + a small zlib stream of zeros (1 MB of filter-0 scanline bytes in ~1 KB)."""
    return png_raw(width, height, zlib.compress(b"\x00" * 1_000_000, 9))


def jpeg_with_size(width: int, height: int, *, progressive: bool = False) -> bytes:
    """A real JPEG (tables, scan) whose SOF0/SOF2 header is rewritten to claim width x height."""
    data = bytearray(cv_encode(".jpg", pattern_image(16, 16), [cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)]))
    sof = data.find(b"\xff\xc2" if progressive else b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def gif_bomb(width: int = 65_535, height: int = 65_535) -> bytes:
    """A GIF whose screen and single frame claim width x height, with a few bytes of LZW data."""
    screen = struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"  # 2-colour table
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x4c\x01\x00"
    return b"GIF89a" + screen + frame + b"\x3b"


def bmp_header_only(width: int, height: int, bpp: int = 24) -> bytes:
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, bpp, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + 40 + 64, 0, 0, 14 + 40) + info + b"\x00" * 64


def webp_vp8x_canvas(width: int, height: int) -> bytes:
    """A VP8X WebP claiming a width x height canvas, followed by a tiny (1x1) lossless bitstream."""
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little")
    vp8x += (height - 1).to_bytes(3, "little")
    tiny = cv_encode(".webp", np.zeros((1, 1, 3), np.uint8), [cv2.IMWRITE_WEBP_QUALITY, 101])[12:]
    payload = b"WEBP" + vp8x + tiny
    return b"RIFF" + struct.pack("<I", len(payload)) + payload


def webp_vp8l_size(width: int, height: int) -> bytes:
    """A lossless WebP header claiming width x height (14-bit fields), with a truncated bitstream."""
    bits = (width - 1) | ((height - 1) << 14)  # + alpha_is_used 0, version 0
    chunk = b"\x2f" + struct.pack("<I", bits) + b"\x00" * 16
    payload = b"WEBP" + b"VP8L" + struct.pack("<I", len(chunk)) + chunk
    return b"RIFF" + struct.pack("<I", len(payload)) + payload


def tiff_raw(
    width: int, height: int, pixels: bytes, *, tile: tuple[int, int] | None = None, bigtiff_magic: bool = False
) -> bytes:
    """A minimal little-endian 8-bit grayscale TIFF; stripped (one strip) or with one tile."""
    entries = [(256, 4, width), (257, 4, height), (258, 3, 8), (259, 3, 1), (262, 3, 1), (277, 3, 1)]
    data_offset = 8 + 2 + 12 * (len(entries) + 4) + 4
    if tile is None:
        entries += [(273, 4, data_offset), (278, 4, height), (279, 4, len(pixels)), (284, 3, 1)]
    else:
        entries += [(322, 4, tile[0]), (323, 4, tile[1]), (324, 4, data_offset), (325, 4, len(pixels))]
    entries.sort()
    out = (b"II+\x00" if bigtiff_magic else b"II*\x00") + struct.pack("<IH", 8, len(entries))
    for tag, typ, value in entries:
        field = struct.pack("<HH", value, 0) if typ == 3 else struct.pack("<I", value)
        out += struct.pack("<HHI", tag, typ, 1) + field
    return out + b"\x00\x00\x00\x00" + pixels


def zlib_zeros(n: int, chunk: int = 1 << 20) -> bytes:
    """A zlib stream that inflates to `n` zero bytes, built in milliseconds whatever `n` is.

    Each full-flushed block of `chunk` zeros compresses to the same ~1 KB (a full flush resets
    the compressor's window), so the stream is the first block, that block repeated, the tail,
    and the Adler-32 of n zeros ((n mod 65521) << 16 | 1): ~1000:1, like zlib.compress(bytes(n), 9).
    """
    k, rem = divmod(n, chunk)
    if k < 2:
        return zlib.compress(bytes(n), 9)
    c = zlib.compressobj(9)
    first = c.compress(bytes(chunk)) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(bytes(chunk)) + c.flush(zlib.Z_FULL_FLUSH)
    tail = c.compress(bytes(rem)) + c.flush()
    return first + block * (k - 1) + tail[:-4] + struct.pack(">I", ((n % 65521) << 16) | 1)


# TIFF field type -> (struct format of one value, how many of `values` make one): BYTE, SHORT, LONG, RATIONAL
_TIFF_TYPES = {1: ("B", 1), 3: ("H", 1), 4: ("I", 1), 5: ("I", 2)}


def tiff_image(
    width: int,
    height: int,
    strips: list[bytes],
    *,
    samples: int = 1,
    bits: int = 8,
    sample_format: int = 1,
    planar: int = 1,
    photometric: int | None = None,
    compression: int = 1,
    rows_per_strip: int | None = None,
    extra_samples: int | None = None,
    order: str = "<",
    tags: dict[int, tuple[int, list[int]]] | None = None,
) -> bytes:
    """A TIFF (IFD0 only) with any sample layout, from its already-encoded strips.

    `strips` are listed plane by plane when `planar` is 2 (PlanarConfiguration: separate).
    BitsPerSample and SampleFormat are written once per sample, as real writers do (out of
    line when they do not fit the 4-byte value field). Identical strips are stored once and
    shared. `tags` adds or replaces entries: tag -> (TIFF type, values; two per RATIONAL).
    """
    if photometric is None:
        photometric = 2 if samples >= 3 else 1
    entries: dict[int, tuple[int, list[int]]] = {
        256: (4, [width]),
        257: (4, [height]),
        258: (3, [bits] * samples),
        259: (3, [compression]),
        262: (3, [photometric]),
        273: (4, [0] * len(strips)),  # StripOffsets: filled in below
        277: (3, [samples]),
        278: (4, [rows_per_strip or height]),
        279: (4, [len(s) for s in strips]),
        284: (3, [planar]),
        339: (3, [sample_format] * samples),
    }
    if extra_samples is not None:
        entries[338] = (3, [extra_samples])
    entries.update(tags or {})
    ifd_size = 2 + 12 * len(entries) + 4
    pos = 8 + ifd_size
    out_of_line: dict[int, int] = {}
    for tag, (typ, values) in sorted(entries.items()):
        size = struct.calcsize(_TIFF_TYPES[typ][0]) * len(values)
        if size > 4:
            out_of_line[tag] = pos
            pos += size + (size & 1)
    blobs: dict[bytes, int] = {}
    for s in strips:
        if s not in blobs:
            blobs[s] = pos
            pos += len(s)
    entries[273] = (4, [blobs[s] for s in strips])
    ifd = struct.pack(order + "H", len(entries))
    extra = b""
    for tag, (typ, values) in sorted(entries.items()):
        fmt, per = _TIFF_TYPES[typ]
        packed = struct.pack(order + fmt * len(values), *values)
        count = len(values) // per
        if tag in out_of_line:
            ifd += struct.pack(order + "HHII", tag, typ, count, out_of_line[tag])
            extra += packed + b"\x00" * (len(packed) & 1)
        else:
            ifd += struct.pack(order + "HHI", tag, typ, count) + packed.ljust(4, b"\x00")
    magic = b"II*\x00" if order == "<" else b"MM\x00*"
    return magic + struct.pack(order + "I", 8) + ifd + b"\x00\x00\x00\x00" + extra + b"".join(blobs)


def tiff_float32_rgba_bomb(side: int = 6324) -> bytes:
    """The finding: a float32 RGBA TIFF of side x side zeros in one deflate strip (6324: 40 MP, ~0.6 MB).

    Under the pixel and body limits; OpenCV decodes it into 640 MB plus a 640 MB strip buffer.
    """
    return tiff_image(
        side,
        side,
        [zlib_zeros(side * side * 16)],
        samples=4,
        bits=32,
        sample_format=3,
        compression=8,
        extra_samples=2,
    )


def png_16bit_rgba_bomb(width: int = 8000, height: int = 5000) -> bytes:
    """The finding: a 16-bit RGBA PNG of zeros (8000x5000: 40 MP, ~0.3 MB), 320 MB once decoded."""
    return png_raw(width, height, zlib_zeros(height * (1 + width * 8)), color_type=6, bit_depth=16)


def tiff_from_array(
    img: np.ndarray, *, planar: int = 1, rows_per_strip: int | None = None, compression: int = 1
) -> bytes:
    """`img` (H x W or H x W x C in RGB(A) order; any of uint8/16/32, int8/16/32, float32/64) as a TIFF.

    planar 1: samples interleaved (RGBRGB...); planar 2: stored one colour plane at a time.
    compression 1: none, 8: deflate.
    """
    img = img if img.ndim == 3 else img[..., None]
    height, width, samples = img.shape
    rps = rows_per_strip or height
    little = img.astype(img.dtype.newbyteorder("<"), copy=False)
    planes = [little[..., c] for c in range(samples)] if planar == 2 else [little]
    strips = []
    for plane in planes:
        for y in range(0, height, rps):
            raw = np.ascontiguousarray(plane[y : y + rps]).tobytes()
            strips.append(zlib.compress(raw) if compression == 8 else raw)
    kind = img.dtype.kind
    return tiff_image(
        width,
        height,
        strips,
        samples=samples,
        bits=img.dtype.itemsize * 8,
        sample_format=3 if kind == "f" else 2 if kind == "i" else 1,
        planar=planar,
        compression=compression,
        rows_per_strip=rps,
        extra_samples=2 if samples in (2, 4) else None,
    )


def exif_blob(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def jpeg_with_exif(img_bgr: np.ndarray, orientation: int) -> bytes:
    return pil_encode(Image.fromarray(img_bgr[..., ::-1]), "JPEG", quality=95, exif=exif_blob(orientation))


def jpeg_with_looping_exif(img_bgr: np.ndarray) -> bytes:
    """A JPEG whose APP1 EXIF has IFD0 pointing back at itself as the next IFD, and an orientation of 9."""
    ifd = struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, 9, 0) + struct.pack(">I", 8)
    app1_body = b"Exif\x00\x00" + b"MM\x00*" + struct.pack(">I", 8) + ifd
    jpeg = cv_encode(".jpg", img_bgr)
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(app1_body) + 2) + app1_body + jpeg[2:]


def png_with_ztxt_bomb(img_bgr: np.ndarray) -> bytes:
    """A valid PNG carrying a zTXt chunk that inflates to 16 MB (libpng caps what it inflates at 8 MB)."""
    png = cv_encode(".png", img_bgr)
    bomb = png_chunk(b"zTXt", b"Comment\x00\x00" + zlib.compress(b"\x00" * 16_000_000, 9))
    return png[:33] + bomb + png[33:]


def png_with_chunk_length(png: bytes, chunk_index: int, length: int) -> bytes:
    """`png` with the length field of its chunk number `chunk_index` (0 = IHDR) replaced."""
    pos = 8
    for _ in range(chunk_index):
        pos += 12 + struct.unpack(">I", png[pos : pos + 4])[0]
    return png[:pos] + struct.pack(">I", length) + png[pos + 4 :]


def multipart(parts: list[tuple[str, str | None, str | None, bytes]], boundary: str = BOUNDARY) -> bytes:
    """A multipart/form-data body from (name, filename, content_type, data) parts."""
    out = b""
    for name, filename, ctype, data in parts:
        out += f"--{boundary}\r\n".encode()
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"Content-Disposition: {disposition}\r\n".encode()
        if ctype:
            out += f"Content-Type: {ctype}\r\n".encode()
        out += b"\r\n" + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


MULTIPART_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


# --------------------------------------------------------------------------- valid images


@cache
def _valid_images() -> tuple[tuple[str, bytes, str], ...]:
    """(name, bytes, content type) of odd-but-valid images that must classify (200)."""
    base = pattern_image(120, 160)
    rgb = Image.fromarray(base[..., ::-1])
    rgba = np.dstack([base, np.linspace(0, 255, 160, dtype=np.uint8)[None, :].repeat(120, 0)])
    rgba16 = rgba.astype(np.uint16) * 257
    frames = [Image.new("RGB", (64, 48), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    transparent = Image.new("RGBA", (64, 48), (0, 0, 0, 0))
    transparent.paste((0, 128, 255, 255), (16, 12, 48, 36))
    jpg = cv_encode(".jpg", base)
    images = [
        ("jpeg_baseline", jpg, "image/jpeg"),
        ("jpeg_grayscale", cv_encode(".jpg", cv2.cvtColor(base, cv2.COLOR_BGR2GRAY)), "image/jpeg"),
        ("jpeg_progressive", cv_encode(".jpg", base, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]), "image/jpeg"),
        ("jpeg_cmyk", pil_encode(rgb.convert("CMYK"), "JPEG", quality=90), "image/jpeg"),
        ("jpeg_exif_orientation_6", jpeg_with_exif(base, 6), "image/jpeg"),
        ("jpeg_exif_orientation_3", jpeg_with_exif(base, 3), "image/jpeg"),
        ("jpeg_exif_self_looping_ifd", jpeg_with_looping_exif(base), "image/jpeg"),
        ("jpeg_trailing_garbage", jpg + b"\x00garbage after EOI" * 50, "image/jpeg"),
        ("jpeg_full_hd", cv_encode(".jpg", pattern_image(1080, 1920)), "image/jpeg"),
        ("jpeg_1x1", cv_encode(".jpg", base[:1, :1]), "image/jpeg"),
        ("jpeg_4000x1", cv_encode(".jpg", pattern_image(1, 4000)), "image/jpeg"),
        ("png_rgb", cv_encode(".png", base), "image/png"),
        ("png_grayscale", cv_encode(".png", cv2.cvtColor(base, cv2.COLOR_BGR2GRAY)), "image/png"),
        ("png_rgba", cv_encode(".png", rgba), "image/png"),
        ("png_fully_transparent", cv_encode(".png", np.zeros((32, 32, 4), np.uint8)), "image/png"),
        (
            "png_16bit_gray",
            cv_encode(".png", cv2.cvtColor(base, cv2.COLOR_BGR2GRAY).astype(np.uint16) * 257),
            "image/png",
        ),
        ("png_16bit_rgb", cv_encode(".png", base.astype(np.uint16) * 257), "image/png"),
        ("png_16bit_rgba", cv_encode(".png", rgba16), "image/png"),
        ("png_palette_trns", pil_encode(transparent.convert("P"), "PNG", transparency=0), "image/png"),
        ("png_exif_orientation_8", pil_encode(rgb, "PNG", exif=exif_blob(8)), "image/png"),
        ("png_1x1", cv_encode(".png", base[:1, :1]), "image/png"),
        ("png_1x4000", cv_encode(".png", pattern_image(4000, 1)), "image/png"),
        ("png_ztxt_bomb_chunk", png_with_ztxt_bomb(base), "image/png"),
        ("bmp_24bit", cv_encode(".bmp", base), "image/bmp"),
        ("bmp_8bit_gray", cv_encode(".bmp", cv2.cvtColor(base, cv2.COLOR_BGR2GRAY)), "image/bmp"),
        ("bmp_32bit", cv_encode(".bmp", rgba), "image/bmp"),
        ("webp_lossy", cv_encode(".webp", base, [cv2.IMWRITE_WEBP_QUALITY, 80]), "image/webp"),
        ("webp_lossless", cv_encode(".webp", base, [cv2.IMWRITE_WEBP_QUALITY, 101]), "image/webp"),
        ("webp_alpha", pil_encode(Image.fromarray(rgba[..., [2, 1, 0, 3]]), "WEBP", quality=80), "image/webp"),
        ("tiff_deflate", pil_encode(rgb, "TIFF", compression="tiff_deflate"), "image/tiff"),
        ("tiff_16bit_gray", cv_encode(".tiff", base[..., 0].astype(np.uint16) * 257), "image/tiff"),
        ("tiff_16bit_rgb_interleaved", tiff_from_array(base[..., ::-1].astype(np.uint16) * 257), "image/tiff"),
        ("tiff_8bit_rgb_planar", tiff_from_array(np.ascontiguousarray(base[..., ::-1]), planar=2), "image/tiff"),
        ("tiff_8bit_rgba_unassociated", tiff_from_array(rgba[..., [2, 1, 0, 3]], compression=8), "image/tiff"),
        ("gif_static", pil_encode(rgb.quantize(64), "GIF"), "image/gif"),
        (
            "gif_animated",
            pil_encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=80),
            "image/gif",
        ),
        ("gif_transparent", pil_encode(transparent, "GIF"), "image/gif"),
    ]
    return tuple(images)


def valid_images() -> dict[str, bytes]:
    """Odd-but-valid images by name (also the seeds of the mutation fuzzing)."""
    return {name: data for name, data, _ in _valid_images()}


# --------------------------------------------------------------------------- the corpus


def _ok(name: str, body: bytes, content_type: str, note: str = "") -> HostileCase:
    return HostileCase(name, body, content_type, 200, "", "raw", "preprocess", note)


def _bad(name: str, body: bytes, content_type: str, code: str, note: str = "") -> HostileCase:
    return HostileCase(name, body, content_type, STATUS[code], code, "raw", "preprocess", note)


def _router(name: str, body: bytes, content_type: str, code: str, kind: Kind, note: str = "") -> HostileCase:
    return HostileCase(name, body, content_type, STATUS[code] if code else 200, code, kind, "router", note)


@cache
def _cases() -> tuple[HostileCase, ...]:
    base = pattern_image(64, 96, seed=1)
    jpg = cv_encode(".jpg", base)
    png = cv_encode(".png", base)
    gif = pil_encode(Image.fromarray(base[..., ::-1]).quantize(32), "GIF")
    sof = jpg.find(b"\xff\xc0")
    sos = jpg.find(b"\xff\xda")
    rnd = random.Random(1234)
    zero_dim_jpeg = bytearray(jpg)
    struct.pack_into(">HH", zero_dim_jpeg, sof + 5, 0, 96)
    bad_crc_png = bytearray(png)
    bad_crc_png[29] ^= 0xFF  # IHDR CRC
    zero_width_png = png_raw(0, 10, zlib.compress(b"\x00" * 10))
    ihdr_not_first = png[:8] + png_chunk(b"tEXt", b"a\x00b") + png[8:]

    cases: list[HostileCase] = [_ok(name, data, ctype) for name, data, ctype in _valid_images()]
    cases += [
        # -- the Content-Type is a hint, the bytes decide (see the module docstring)
        _ok("png_sent_as_image_jpeg", png, "image/jpeg", "lying Content-Type: sniffed as PNG"),
        _ok("jpeg_sent_as_image_png", jpg, "image/png", "lying Content-Type: sniffed as JPEG"),
        _ok("jpeg_sent_as_octet_stream", jpg, "application/octet-stream"),
        _ok("jpeg_content_type_with_params", jpg, "image/jpeg; charset=binary; q=0.9"),
        _ok("gif_sent_as_image_webp", gif, "image/webp", "lying Content-Type"),
        # -- empty / not an image at all
        _bad("empty_body", b"", "image/jpeg", "empty_body"),
        _bad("random_bytes", rnd.randbytes(4096), "image/jpeg", "undecodable_image"),
        _bad("zero_bytes", b"\x00" * 4096, "image/png", "undecodable_image"),
        _bad(
            "html_as_image",
            b"<!DOCTYPE html><html><body><img src=x onerror=alert(1)></body></html>",
            "image/png",
            "undecodable_image",
        ),
        _bad(
            "svg_as_image",
            b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
            b'<rect width="10" height="10" fill="red"/></svg>',
            "image/svg+xml",
            "undecodable_image",
            "SVG is not supported (no rasteriser in the service)",
        ),
        _bad("pdf_as_image", b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n", "image/jpeg", "undecodable_image"),
        _bad(
            "pnm_not_accepted",
            b"P6\n4 4\n255\n" + bytes(48),
            "image/x-portable-pixmap",
            "undecodable_image",
            "OpenCV could decode PNM; the service accepts JPEG/PNG/GIF/BMP/WebP/TIFF only",
        ),
        _bad("png_signature_then_jpeg", png[:8] + jpg, "image/png", "undecodable_image", "polyglot: no IHDR"),
        # -- truncated and corrupt headers
        _bad("jpeg_soi_only", b"\xff\xd8\xff", "image/jpeg", "undecodable_image"),
        _bad("jpeg_truncated_in_header", jpg[: sof - 10], "image/jpeg", "undecodable_image", "cut before SOF"),
        _bad("jpeg_truncated_after_sof", jpg[: sos - 4], "image/jpeg", "undecodable_image", "cut before SOS"),
        _bad(
            "jpeg_truncated_mid_scan",
            jpg[: (sos + len(jpg)) // 2],
            "image/jpeg",
            "undecodable_image",
            "OpenCV 5 fails truncated JPEGs instead of grey-padding them",
        ),
        _bad("jpeg_missing_eoi", jpg[:-2], "image/jpeg", "undecodable_image"),
        _bad("jpeg_zero_height_sof", bytes(zero_dim_jpeg), "image/jpeg", "undecodable_image"),
        _bad("jpeg_bogus_segment_length", jpg[:4] + b"\x00\x01" + jpg[6:], "image/jpeg", "undecodable_image"),
        _bad("png_truncated", png[: len(png) // 2], "image/png", "undecodable_image"),
        _bad("png_ihdr_crc_error", bytes(bad_crc_png), "image/png", "undecodable_image"),
        _bad("png_zero_width", zero_width_png, "image/png", "undecodable_image"),
        _bad("png_ihdr_not_first", ihdr_not_first, "image/png", "undecodable_image"),
        _bad(
            "png_idat_claims_4_gib",
            png_with_chunk_length(png, 1, 0xF000_0000),
            "image/png",
            "undecodable_image",
            "OpenCV 5 would allocate the declared chunk length (~4 GB) before failing",
        ),
        _bad(
            "png_ancillary_chunk_claims_2_gib",
            png_with_chunk_length(png[:33] + png_chunk(b"tEXt", b"a\x00b") + png[33:], 1, 0x7FFF_FFF0),
            "image/png",
            "undecodable_image",
        ),
        _bad("gif_truncated", gif[: len(gif) // 2], "image/gif", "undecodable_image"),
        _bad("gif_header_only", b"GIF89a\x10\x00\x10\x00", "image/gif", "undecodable_image"),
        _bad(
            "webp_unknown_first_chunk", b"RIFF\x20\x00\x00\x00WEBPJUNK" + bytes(24), "image/webp", "undecodable_image"
        ),
        _bad("tiff_ifd_offset_past_end", b"II*\x00\xff\xff\x00\x00" + bytes(32), "image/tiff", "undecodable_image"),
        _bad("bigtiff_not_accepted", tiff_raw(4, 4, bytes(16), bigtiff_magic=True), "image/tiff", "undecodable_image"),
        # -- decompression bombs: refused from the header, before any decoder allocates
        _bad("png_bomb_60000x60000", png_bomb(), "image/png", "too_many_pixels"),
        _bad("png_just_over_limit", png_bomb(8000, 5001), "image/png", "too_many_pixels", "40,008,000 px"),
        _bad("jpeg_claims_65500x65500", jpeg_with_size(65_500, 65_500), "image/jpeg", "too_many_pixels"),
        _bad(
            "jpeg_progressive_claims_60000x60000",
            jpeg_with_size(60_000, 60_000, progressive=True),
            "image/jpeg",
            "too_many_pixels",
            "SOF2",
        ),
        _bad("gif_bomb_65535x65535", gif_bomb(), "image/gif", "too_many_pixels"),
        _bad("bmp_claims_50000x50000", bmp_header_only(50_000, -50_000), "image/bmp", "too_many_pixels"),
        _bad("webp_vp8x_canvas_16384x16384", webp_vp8x_canvas(16_384, 16_384), "image/webp", "too_many_pixels"),
        _bad("webp_vp8l_16384x16384", webp_vp8l_size(16_384, 16_384), "image/webp", "too_many_pixels"),
        _bad("tiff_bomb_100000x100000", tiff_raw(100_000, 100_000, bytes(64)), "image/tiff", "too_many_pixels"),
        _bad(
            "tiff_tile_bomb",
            tiff_raw(16, 16, bytes(256), tile=(15_008, 15_008)),
            "image/tiff",
            "too_many_pixels",
            "a 16x16 image whose single 15008x15008 tile OpenCV would allocate (~0.9 GB)",
        ),
        # -- memory bombs inside the pixel and body limits: refused by the decode budget, from the header
        _bad(
            "tiff_float32_rgba_bomb_6324x6324",
            tiff_float32_rgba_bomb(),
            "image/tiff",
            "decode_budget_exceeded",
            "40 MP of float32 RGBA zeros in ~0.6 MB: 1.28 GB to decode (2.5 GB with the old float conversion)",
        ),
        _bad(
            "png_16bit_rgba_bomb_8000x5000",
            png_16bit_rgba_bomb(),
            "image/png",
            "decode_budget_exceeded",
            "40 MP of 16-bit RGBA zeros in ~0.3 MB: 640 MB to decode",
        ),
        # -- layouts OpenCV decodes wrongly (from uninitialised memory): refused from the header
        _bad(
            "tiff_16bit_rgb_planar",
            tiff_from_array(base[..., ::-1].astype(np.uint16) * 257, planar=2),
            "image/tiff",
            "unsupported_image",
            "PlanarConfiguration 2 with 16-bit samples: OpenCV's answer changed from one decode to the next",
        ),
        # -- the HTTP layer: size and media type, before the bytes are looked at
        _router(
            "body_11_mib",
            jpg + b"\x00" * (11 * 1024 * 1024 - len(jpg)),
            "image/jpeg",
            "payload_too_large",
            "raw_body",
            "over the default 10 MiB body limit",
        ),
        _router("text_plain_with_a_jpeg", jpg, "text/plain", "unsupported_media_type", "raw_body"),
        _router("application_json", b'{"image": "aGVsbG8="}', "application/json", "unsupported_media_type", "raw_body"),
        _router("no_content_type", jpg, "", "unsupported_media_type", "raw_body", "send without a Content-Type"),
        # -- multipart framing
        _router("multipart_ok", multipart([("file", "a.jpg", "image/jpeg", jpg)]), MULTIPART_TYPE, "", "multipart"),
        _router(
            "multipart_part_lies_png_as_jpeg",
            multipart([("file", "a.jpg", "image/jpeg", png)]),
            MULTIPART_TYPE,
            "",
            "multipart",
        ),
        _router(
            "multipart_huge_preamble",
            b"x" * (1024 * 1024) + b"\r\n" + multipart([("file", "a.png", None, png)]),
            MULTIPART_TYPE,
            "",
            "multipart",
            "1 MiB preamble before the first boundary is ignored",
        ),
        _router(
            "multipart_preamble_over_body_limit",
            b"x" * (11 * 1024 * 1024) + b"\r\n" + multipart([("file", "a.png", None, png)]),
            MULTIPART_TYPE,
            "payload_too_large",
            "multipart",
        ),
        _router(
            "multipart_without_file_part",
            multipart([("image", "a.jpg", "image/jpeg", jpg)]),
            MULTIPART_TYPE,
            "missing_file",
            "multipart",
        ),
        _router("multipart_no_parts", f"--{BOUNDARY}--\r\n".encode(), MULTIPART_TYPE, "missing_file", "multipart"),
        _router(
            "multipart_two_files",
            multipart([("file", "a.jpg", None, jpg), ("file", "b.png", None, png)]),
            MULTIPART_TYPE,
            "too_many_files",
            "multipart",
            "the single-image endpoint takes one file",
        ),
        _router(
            "multipart_no_boundary_param",
            multipart([("file", "a.jpg", None, jpg)]),
            "multipart/form-data",
            "bad_multipart",
            "multipart",
        ),
        _router(
            "multipart_boundary_absent_from_body",
            multipart([("file", "a.jpg", None, jpg)], "other-boundary"),
            MULTIPART_TYPE,
            "bad_multipart",
            "multipart",
        ),
        _router(
            "multipart_garbage_after_delimiter",
            f"--{BOUNDARY}garbage\r\n".encode() + multipart([("file", "a.jpg", None, jpg)])[len(BOUNDARY) + 4 :],
            MULTIPART_TYPE,
            "bad_multipart",
            "multipart",
        ),
        _router(
            "multipart_unterminated",
            multipart([("file", "a.jpg", None, jpg)])[: -len(BOUNDARY) - 8],
            MULTIPART_TYPE,
            "bad_multipart",
            "multipart",
            "no closing boundary",
        ),
        _router(
            "multipart_part_without_blank_line",
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"\r\n--{BOUNDARY}--\r\n'.encode(),
            MULTIPART_TYPE,
            "bad_multipart",
            "multipart",
        ),
        _router(
            "multipart_part_text_plain",
            multipart([("file", "a.txt", "text/plain", jpg)]),
            MULTIPART_TYPE,
            "unsupported_media_type",
            "multipart",
        ),
        _router(
            "multipart_empty_file_part",
            multipart([("file", "a.jpg", "image/jpeg", b"")]),
            MULTIPART_TYPE,
            "empty_body",
            "multipart",
        ),
        _router(
            "multipart_png_bomb",
            multipart([("file", "b.png", "image/png", png_bomb())]),
            MULTIPART_TYPE,
            "too_many_pixels",
            "multipart",
        ),
    ]
    return tuple(cases)


def hostile_cases() -> list[HostileCase]:
    """The whole corpus (generated once per process, ~0.2 s)."""
    return list(_cases())
