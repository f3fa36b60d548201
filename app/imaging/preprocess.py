"""Image bytes -> the model's uint8 pixels [H, W, C]. Pure OpenCV and numpy; no Ray.

Every decode of the service calls `preprocess` with the model's declared transform (the Preprocessor, the Router with
`decode_in: router`, batch scoring) and so does the INT8 calibration, so a model is calibrated on what it is served.
The contract: for any input bytes, a uint8 array of the transform's shape or `ImageInputError`; any other exception
is a bug in this service (a 500 internal_error), never a verdict on the input.

The defences, in order (the reliability page says what each refuses, measured): the header read for format and size
before any decoder runs (`check_header`: a bomb costs microseconds and allocates nothing); only JPEG, PNG, GIF, BMP,
WebP and TIFF reach a decoder; the structure decoders do not check safely (PNG chunk lengths); OpenCV's own pixel
limit as a second line; the decoded shape checked again; a decode budget estimated from the header
(`estimate_decode_bytes`: pixels alone do not bound the memory); layouts OpenCV decodes wrongly refused from the
header. The conversion to uint8 goes a band of rows at a time: the output plus a few MiB, not full-size float copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.errors import ImageInputError
from app.imaging.convert import apply_orientation, to_bgr_or_gray
from app.imaging.decode_cost import DEFAULT_MAX_DECODE_BYTES, check_decode_budget, peak_bytes, reduced_decode_flag
from app.imaging.opencv import DEFAULT_MAX_PIXELS, OPENCV_MAX_PIXELS, OPENCV_MAX_SIDE, cv2
from app.imaging.probe import ImageInfo, orientation_from_exif, png_chunks_fit, probe_dimensions
from app.imaging.transform import Transform

# --------------------------------------------------------------------------- decoding


def _exif_orientation(types: Sequence[int], blobs: Sequence[np.ndarray]) -> int:
    for kind, blob in zip(np.ravel(np.asarray(types, dtype=np.int64)), blobs, strict=False):
        if int(kind) == cv2.IMAGE_METADATA_EXIF:
            return orientation_from_exif(np.asarray(blob, np.uint8).tobytes())
    return 1


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
    data: bytes,
    max_pixels: int,
    target: int | None,
    max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES,
    info: ImageInfo | None = None,
) -> np.ndarray:
    """Checks, decode and conversion to uint8 gray HxW or BGR HxWx3. Raises ImageInputError only. `info`: the
    header as `check_header` read it, with these limits, in this process (None: read here)."""
    if data and not isinstance(data, bytes):
        data = bytes(data)
    if info is None:
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
        if peak_bytes(img.shape[0] * img.shape[1], channels, img.itemsize, 0, info.inverted) > max_decode_bytes:
            raise ImageInputError(
                "decode_budget_exceeded", f"the decoded {info.format} image is larger than its header said"
            )
        return to_bgr_or_gray(img, info.premultiplied, info.inverted)
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
    info: ImageInfo | None = None,
) -> np.ndarray:
    """Encoded image bytes -> the model's pixels for one image: uint8 [H, W, C] as `size` says (a Transform: the
    model's resize, crop and channel order; an int: squashed to size x size RGB).

    `max_decode_bytes`: the decode budget (see `estimate_decode_bytes`); an image whose header
    says it would cost more is refused (413 decode_budget_exceeded) before the decoder runs.
    `info`: the header `check_header` already read with the same limits and target (a caller that checked it before
    reserving the decode's cost), so that it is read once; None: read here.
    """
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        size = Transform.square(size)
    img = _decode_checked(data, max_pixels, size.decode_target if reduced else None, max_decode_bytes, info)
    try:
        return size.apply(img)  # resized before the colour conversion: it then touches the output's pixels only
    except MemoryError:
        raise ImageInputError("too_many_pixels", "not enough memory to resize this image") from None
