"""The clients of the object stores: which one serves a URI, and reading, statting and writing through it.

s3://, gs:// and local files go through pyarrow's filesystems (FileSystem.from_uri), https:// through fsspec's
HTTPFileSystem. Credentials and endpoints come only from where the SDKs themselves look (AWS_* variables such as
AWS_ENDPOINT_URL_S3, shared config files, workload identity, instance metadata, GOOGLE_APPLICATION_CREDENTIALS):
nothing here takes a key. HTTPS trusts the CAs of SSL_CERT_FILE / SSL_CERT_DIR or the system store, read when a client
is made (aiohttp's own default context is fixed when aiohttp is imported, so it would miss a later SSL_CERT_FILE).
"""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs

from app.storage.ref import scheme_of

__all__ = ["ObjectInfo", "Reader", "filesystem_for", "open_input", "open_output", "stat"]

# A stalled connection fails after this long without a byte; a large model may take far longer in all.
HTTP_CONNECT_TIMEOUT_S = 30.0
HTTP_READ_TIMEOUT_S = 120.0

_http_lock = threading.Lock()
_http_clients: dict[tuple[int, str | None, str | None], Any] = {}


@dataclass(frozen=True)
class ObjectInfo:
    """What the store says of an object before it is read: its size (None when it does not say) and a version that
    changes when the object is replaced (an ETag, Last-Modified or modification time; None when there is none)."""

    size: int | None
    version: str | None


class Reader(Protocol):
    """A stream of an object's bytes: read(n) returns at most n bytes, b"" at the end."""

    def read(self, n: int, /) -> bytes: ...


def _local_path(uri: str) -> str:
    if scheme_of(uri) == "file":
        return unquote(urlsplit(uri).path)
    return os.path.abspath(uri)


def _http_client() -> Any:
    """fsspec's HTTPFileSystem, one per process and CA configuration (it holds a pooled aiohttp session)."""
    import aiohttp
    from fsspec.implementations.http import HTTPFileSystem

    key = (os.getpid(), os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))  # a forked child: its own
    with _http_lock:
        fs = _http_clients.get(key)
        if fs is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=HTTP_CONNECT_TIMEOUT_S, sock_read=HTTP_READ_TIMEOUT_S
            )
            fs = HTTPFileSystem(
                skip_instance_cache=True,
                client_kwargs={"timeout": timeout, "trust_env": True},  # trust_env: HTTPS_PROXY / NO_PROXY
                ssl=ssl.create_default_context(),  # reads SSL_CERT_FILE / SSL_CERT_DIR now
            )
            _http_clients[key] = fs
        return fs


def filesystem_for(uri: str) -> tuple[Any, str]:
    """The filesystem client for a URI's scheme and the path within it: a pyarrow FileSystem for s3://, gs://,
    file:// and plain paths; fsspec's HTTPFileSystem (whose paths are the URLs themselves) for https://."""
    scheme = scheme_of(uri)
    if scheme == "https":
        return _http_client(), uri
    if scheme in ("s3", "gs"):
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path
    if scheme in ("", "file"):
        return pafs.LocalFileSystem(), _local_path(uri)
    raise ValueError(f"{uri}: no client for scheme {scheme!r} (s3://, gs://, https://, file:// or a plain path)")


def stat(uri: str) -> ObjectInfo:
    """The object's size and version, as the store reports them; FileNotFoundError when it has no such object."""
    fs, path = filesystem_for(uri)
    if isinstance(fs, pafs.FileSystem):
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(uri)
        if info.type != pafs.FileType.File:
            raise IsADirectoryError(uri)
        mtime_ns = info.mtime_ns
        return ObjectInfo(size=info.size, version=None if mtime_ns is None else f"mtime:{mtime_ns}")
    details = fs.info(path)
    version = details.get("ETag") or details.get("Last-Modified")
    return ObjectInfo(size=details.get("size"), version=None if version is None else str(version))


@contextmanager
def open_input(uri: str, size: int | None = None) -> Iterator[Reader]:
    """A sequential stream of the object's bytes, as stored (never decompressed, whatever its name says). `size`, from
    stat, spares the HTTP client a second request for it."""
    fs, path = filesystem_for(uri)
    if isinstance(fs, pafs.FileSystem):
        with fs.open_input_stream(path, compression=None) as stream:
            yield stream
    else:
        with fs.open(path, "rb", block_size=0, size=size or None) as stream:
            yield stream


def open_output(uri: str) -> Any:
    """A pyarrow output stream that writes the object at `uri` (s3://, gs://, file:// or a plain path), stored as given
    (never compressed); a local file's missing folders are made. An object store shows the object once the stream is
    closed; https:// is read-only."""
    if scheme_of(uri) == "https":
        raise ValueError(f"{uri}: https:// is read-only; publish to s3://, gs:// or a file")
    fs, path = filesystem_for(uri)
    if scheme_of(uri) in ("", "file"):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    return fs.open_output_stream(path, compression=None)
