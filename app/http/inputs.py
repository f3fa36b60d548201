"""Reading a request's images and parameters: media types, multipart `file` parts, `top_k`, the header pre-check.

A v1 request enters here before its body (`v1_head`: what the head says) and after it, to take the images out
(`v1_images`) and, once a variant is chosen, to check each image's header (`check_images`); V2 for the header check.
Pure: no Ray, no Starlette. The benchmark peers use these too, so every server in a comparison answers the same
request the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from app.config import Limits
from app.errors import ServiceError
from app.http.multipart import parse_multipart
from app.imaging.preprocess import check_header
from app.request.guards import parse_top_k

MULTIPART = "multipart/form-data"
IMAGE_TYPES_EXTRA = frozenset({"application/octet-stream"})


def request_id(serve_request_id: str | None, headers: Mapping[str, str]) -> str:
    """Serve's own request id (it also returns it as X-Request-Id and logs it), else the client's, else a new one."""
    return serve_request_id or headers.get("x-request-id") or uuid.uuid4().hex


def media_type(content_type: str | None) -> str:
    """`image/jpeg; q=1` -> `image/jpeg` (lower case); "" when absent."""
    return (content_type or "").split(";")[0].strip().lower()


def is_image_type(media: str) -> bool:
    return media.startswith("image/") or media in IMAGE_TYPES_EXTRA


def top_k(raw: str | None, limits: Limits) -> int:
    """`?top_k=`: absent -> the configured default; 1..max_top_k ASCII digits, else 422."""
    return parse_top_k(raw, limits.default_top_k, limits.max_top_k)


def check_single_media(content_type: str | None) -> bool:
    """/v1/classify takes image/*, application/octet-stream or multipart; True when multipart (415 otherwise)."""
    media = media_type(content_type)
    if media != MULTIPART and not is_image_type(media):
        raise ServiceError(
            "unsupported_media_type",
            f"Content-Type {media or '(none)'!r} is not an image; send image/* or multipart/form-data",
        )
    return media == MULTIPART


def check_batch_media(content_type: str | None) -> None:
    """/v1/classify/batch takes multipart/form-data only (415 otherwise)."""
    if media_type(content_type) != MULTIPART:
        raise ServiceError("unsupported_media_type", "send multipart/form-data with one or more `file` parts")


def multipart_images(body: bytes, content_type: str, max_files: int) -> list[bytes]:
    """The `file` parts of a multipart body (<= max_files, each image/* or untyped)."""
    parts = [p for p in parse_multipart(body, content_type, max_parts=max_files + 8) if p.name == "file"]
    if not parts:
        raise ServiceError("missing_file", "the multipart body has no part named `file`")
    if len(parts) > max_files:
        raise ServiceError("too_many_files", f"{len(parts)} files in one request; the limit is {max_files}")
    for p in parts:
        if p.content_type and not is_image_type(media_type(p.content_type)):
            raise ServiceError("unsupported_media_type", f"part Content-Type {p.content_type!r} is not an image")
    return [p.data for p in parts]


def single_image(body: bytes, content_type: str | None) -> bytes:
    """The one image of a /v1/classify request: the raw body, or its multipart `file` part."""
    if check_single_media(content_type):
        return multipart_images(body, content_type or "", 1)[0]
    return body


def image_pixels(data: bytes, limits: Limits, size: int | None) -> int:
    """Refuse what the header alone condemns, before any replica decodes anything; the image's pixel count.

    `app.imaging.preprocess.check_header`, the Preprocessor's own first step: empty or unrecognised bytes,
    pixel bombs, decode-budget bombs (Limits.max_decode_bytes), TIFFs OpenCV decodes wrongly.
    `size`: the model's input size (a JPEG far larger is decoded reduced, which costs less); None
    while it is not known yet: the estimate is then a full decode's, never lower. Microseconds.
    """
    info, _ = check_header(data, limits.max_pixels, size, limits.max_decode_bytes)
    return info.pixels


def check_images(images: list[bytes], limits: Limits, size: int | None) -> tuple[dict[int, ServiceError], list[int]]:
    """The header pre-check on each image: (refusals by position, pixel counts of those that passed)."""
    errors: dict[int, ServiceError] = {}
    pixels: list[int] = []
    for i, data in enumerate(images):
        try:
            pixels.append(image_pixels(data, limits, size))
        except ServiceError as e:
            errors[i] = e
    return errors, pixels


@dataclass(frozen=True)
class V1Head:
    """A v1 request's head, checked: its id, `top_k`, its Content-Type, and whether it is a batch."""

    request_id: str
    top_k: int
    content_type: str | None
    batch: bool


def v1_head(
    batch: bool, headers: Mapping[str, str], raw_top_k: str | None, serve_request_id: str | None, limits: Limits
) -> V1Head:
    """/v1/classify[/batch]'s head, before its body is read: `top_k` (422) and the media type (415)."""
    content_type = headers.get("content-type")
    k = top_k(raw_top_k, limits)
    if batch:
        check_batch_media(content_type)
    else:
        check_single_media(content_type)
    return V1Head(request_id(serve_request_id, headers), k, content_type, batch)


def v1_images(body: bytes, head: V1Head, limits: Limits) -> list[bytes]:
    """The admitted body's images: a batch's `file` parts, or the one image."""
    if head.batch:
        return multipart_images(body, head.content_type or "", limits.max_batch_files)
    return [single_image(body, head.content_type)]
