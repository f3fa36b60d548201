"""multipart/form-data: the load generator's encoder and the baselines' parser.

The environment has no python-multipart (FastAPI's form parser), and a benchmark client should not spend
its CPU building the same bodies again and again, so both directions live here: small and exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BOUNDARY = "benchmark-boundary-7d3c1f0e9a"


class MultipartError(ValueError):
    """The body is not the multipart/form-data its Content-Type announced."""


@dataclass(frozen=True)
class Part:
    name: str
    filename: str | None
    content_type: str | None
    data: bytes


def encode(files: Sequence[tuple[str, bytes, str]], field: str = "file", boundary: str = BOUNDARY) -> tuple[bytes, str]:
    """[(filename, data, content_type), ...] -> (body, Content-Type header value), one `field` part each."""
    chunks = []
    for filename, data, content_type in files:
        chunks.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n".encode()
        )
        chunks.append(data)
        chunks.append(b"\r\n")
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


def boundary_of(content_type: str) -> str | None:
    """The boundary parameter of a multipart/form-data Content-Type, None if it is not one."""
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        return None
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.strip().lower() == "boundary" and value:
            return value.strip().strip('"')
    raise MultipartError("multipart/form-data without a boundary parameter")


def _disposition(value: str) -> dict[str, str]:
    out = {}
    for param in value.split(";")[1:]:
        key, _, val = param.strip().partition("=")
        out[key.strip().lower()] = val.strip().strip('"')
    return out


def parse(body: bytes, boundary: str) -> list[Part]:
    """Every part of a multipart/form-data body, in order."""
    # A delimiter is CRLF "--" boundary; the first one may open the body without the CRLF.
    sections = (b"\r\n" + body).split(b"\r\n--" + boundary.encode())
    if len(sections) < 3 or not sections[-1].startswith(b"--"):
        raise MultipartError("multipart body is truncated or uses another boundary")
    parts = []
    for section in sections[1:-1]:
        head, sep, data = section.partition(b"\r\n\r\n")
        if not sep:
            raise MultipartError("multipart section without a blank line after its headers")
        headers = {}
        for line in head.decode("latin-1").split("\r\n")[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        disposition = _disposition(headers.get("content-disposition", ""))
        parts.append(Part(disposition.get("name", ""), disposition.get("filename"), headers.get("content-type"), data))
    return parts


def files(body: bytes, content_type: str, field: str = "file") -> list[bytes]:
    """The data of every `field` part; [] when the body is not multipart at all."""
    boundary = boundary_of(content_type)
    if boundary is None:
        return []
    return [p.data for p in parse(body, boundary) if p.name == field]
