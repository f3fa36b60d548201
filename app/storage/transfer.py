"""One download: an object streamed into a temporary file of the cache, hashed on the way, checked before it is kept.

The bytes read must be as many as the store reported (fewer: the object was cut short) and, for a pinned ref, hash to
the pin; the temporary file is synced and handed back for app.storage.layout to rename into place, or removed on any
failure, so that a partial or wrong file is never left where a reader could take it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from app.storage.failures import FetchError, first_line, reason
from app.storage.stores import ObjectInfo, Reader, open_input, stat

__all__ = ["Download", "download", "stat_or_fail"]

CHUNK = 8 << 20  # per read: pyarrow's S3 client makes one ranged GET per read


@dataclass(frozen=True)
class Download:
    """A verified download, in its temporary file."""

    tmp: Path
    sha256: str
    size: int


def stat_or_fail(uri: str) -> ObjectInfo:
    """The store's size and version of the object, or FetchError."""
    try:
        return stat(uri)
    except Exception as e:
        raise FetchError(uri, reason(e)) from e


def _cut(uri: str, got: int, size: int | None, error: Exception) -> FetchError:
    """The failure of a read once the object was open: a cut transfer, unless the store refused outright."""
    why = reason(error)
    if why.startswith(("not found", "access denied", "no credentials")):
        return FetchError(uri, why)
    if size is not None:
        return FetchError(uri, f"truncated: {got:,} of {size:,} bytes")
    return FetchError(uri, f"truncated after {got:,} bytes ({why})")


def _copy(uri: str, src: Reader, out: BinaryIO, size: int | None) -> tuple[str, int]:
    hasher, got = hashlib.sha256(), 0
    while True:
        try:
            chunk = src.read(CHUNK)
        except Exception as e:
            raise _cut(uri, got, size, e) from e
        if not chunk:
            return hasher.hexdigest(), got
        hasher.update(chunk)
        try:
            out.write(chunk)
            out.flush()
        except OSError as e:
            raise FetchError(uri, f"cache write failed: {first_line(str(e))}") from e
        got += len(chunk)


def download(uri: str, info: ObjectInfo, tmp: Path, expected: str | None) -> Download:
    """Stream `uri` into `tmp` (a new file), check its size against `info` and its digest against `expected`, sync it.
    On any failure `tmp` is removed and FetchError raised."""
    try:
        out = open(tmp, "xb")  # noqa: SIM115 (closed by the `with` below)
    except OSError as e:
        raise FetchError(uri, f"cache write failed: {first_line(str(e))}") from e
    try:
        with out, contextlib.ExitStack() as stack:
            try:
                src = stack.enter_context(open_input(uri, info.size))
            except Exception as e:
                raise FetchError(uri, reason(e)) from e
            digest, got = _copy(uri, src, out, info.size)
            os.fsync(out.fileno())
        if info.size is not None and got < info.size:
            raise FetchError(uri, f"truncated: {got:,} of {info.size:,} bytes")
        if info.size is not None and got > info.size:
            raise FetchError(uri, f"size mismatch: the store reported {info.size:,} bytes, read {got:,}")
        if expected is not None and digest != expected:
            raise FetchError(uri, f"sha256 mismatch: expected {expected}, got {digest} ({got:,} bytes)")
        return Download(tmp, digest, got)
    except FetchError:
        tmp.unlink(missing_ok=True)
        raise
    except Exception as e:  # closing the stream, or the temporary file itself
        tmp.unlink(missing_ok=True)
        raise FetchError(uri, reason(e)) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
