"""A strict, bounded multipart/form-data parser for image uploads. Pure; no Ray.

Written for this one job instead of a general form parser: it works on the
body in memory (no temporary files), copies each part's data once, looks for a
part's headers in its first MAX_HEADER_BYTES only, refuses malformed framing
with a clear error, and never reads more parts than the caller allows. It runs
on the Router's event loop: bytes.find and the copies hold the GIL (a thread
would free nothing), and a 10 MiB body of 64 parts takes a few milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.errors import ServiceError

MAX_HEADER_BYTES = 8192


@dataclass(frozen=True)
class Part:
    name: str | None
    filename: str | None
    content_type: str | None
    data: bytes


def boundary_of(content_type: str) -> bytes:
    for param in content_type.split(";")[1:]:
        key, _, value = param.strip().partition("=")
        if key.strip().lower() == "boundary":
            value = value.strip().strip('"')
            if 0 < len(value) <= 200:
                return value.encode("latin-1")
    raise ServiceError("bad_multipart", "multipart/form-data without a valid boundary parameter")


def _disposition(value: str) -> tuple[str | None, str | None]:
    name = filename = None
    for param in value.split(";")[1:]:
        key, _, val = param.strip().partition("=")
        val = val.strip().strip('"')
        if key.strip().lower() == "name":
            name = val
        elif key.strip().lower() == "filename":
            filename = val
    return name, filename


def _parse_part(body: bytes, start: int, end: int) -> Part:
    """The part in body[start:end]: its headers, then its data, copied once (the data is most of the body)."""
    sep = body.find(b"\r\n\r\n", start, min(end, start + MAX_HEADER_BYTES + 4))
    if sep < 0:
        raise ServiceError("bad_multipart", "a multipart part has no header/body separator")
    name = filename = ctype = None
    for line in body[start:sep].decode("latin-1").split("\r\n"):
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "content-disposition":
            name, filename = _disposition(value)
        elif key == "content-type":
            ctype = value.strip().lower()
    return Part(name, filename, ctype, body[sep + 4 : end])


def parse_multipart(body: bytes, content_type: str, max_parts: int) -> list[Part]:
    """All parts of a multipart body, in order. At most `max_parts` parts are accepted."""
    delimiter = b"--" + boundary_of(content_type)
    start = body.find(delimiter)
    if start < 0:
        raise ServiceError("bad_multipart", "the multipart boundary never appears in the body")
    parts: list[Part] = []
    pos = start + len(delimiter)
    while True:
        if body[pos : pos + 2] == b"--":
            return parts  # the closing delimiter
        if body[pos : pos + 2] != b"\r\n":
            raise ServiceError("bad_multipart", "malformed multipart delimiter line")
        end = body.find(b"\r\n" + delimiter, pos + 2)
        if end < 0:
            raise ServiceError("bad_multipart", "multipart body ends without a closing boundary")
        if len(parts) >= max_parts:
            raise ServiceError("too_many_files", f"more than {max_parts} parts in one multipart request")
        parts.append(_parse_part(body, pos + 2, end))
        pos = end + 2 + len(delimiter)
