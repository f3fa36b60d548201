"""ModelCache: a node's model files, fetched once from object storage and kept by content (SHA-256).

However many replicas of however many processes start at once, one downloads and the others wait for it and then find
the file (a lock per digest, app.storage.locks). A pinned ref found in the cache costs no request to the store; an
unpinned one is asked for its size and version (ETag, Last-Modified or mtime) and downloaded again unless both are as
when it was last downloaded. Local files are read in place and hashed once per (size, mtime, ctime, inode). A file in
use by any process is held (a shared lock) and never evicted; the cache is trimmed, least recently used first, to its
byte limit after each download.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from app.storage import eviction
from app.storage.digest import sha256_file
from app.storage.eviction import CacheEntry
from app.storage.failures import FetchError, reason
from app.storage.layout import IndexEntry, Layout, Record
from app.storage.locks import FileLock, acquire
from app.storage.ref import ModelRef
from app.storage.transfer import download, stat_or_fail

__all__ = ["CacheEntry", "CachedFile", "FetchError", "ModelCache"]

log = logging.getLogger(__name__)


@dataclass
class CachedFile:
    """A fetched model file: `path` to open, and its digest. A remote ref's file is held (not evictable) until
    release(), the end of a `with` block, or the process's exit; a local ref's `path` is the file itself."""

    path: Path
    sha256: str
    size: int
    uri: str
    downloaded: bool
    seconds: float
    _hold: FileLock | None = field(default=None, repr=False, compare=False)

    def release(self) -> None:
        if self._hold is not None:
            self._hold.release()

    def __enter__(self) -> CachedFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _version(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


class ModelCache:
    """The cache under `root`, shared by every process of the node that names the same root; `max_bytes` bounds it
    (None: unbounded)."""

    def __init__(self, root: Path | str, max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes: expected a size >= 0 or None, got {max_bytes}")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.layout = Layout(self.root)
        self._warned: set[str] = set()
        self._warned_lock = threading.Lock()

    def fetch(self, ref: ModelRef) -> CachedFile:
        """The ref's file, verified: from the cache, downloaded into it, or (a local ref) in place. FetchError, one
        line, when it cannot be had."""
        started = time.monotonic()
        if not ref.remote:
            return self._local(ref, started)
        if ref.sha256 is None:
            return self._unpinned(ref.uri, started)
        return self._pinned(ref.uri, ref.sha256, started)

    def _pinned(self, uri: str, digest: str, started: float) -> CachedFile:
        hold = acquire(self.layout.use(digest), shared=True)
        try:
            with acquire(self.layout.lock(digest)):
                record = self.layout.present(digest)
                downloaded = record is None
                if record is None:
                    record = self._download(uri, digest, digest)
                else:
                    self._touch(record, uri)
        except BaseException:
            hold.release()
            raise
        return self._done(record, uri, downloaded, started, hold)

    def _unpinned(self, uri: str, started: float) -> CachedFile:
        self._warn_unpinned(uri)
        info = stat_or_fail(uri)
        key = Layout.uri_key(uri)
        with acquire(self.layout.lock(key)):
            known = self.layout.indexed(uri)
            if known and info.version is not None and (known.size, known.version) == (info.size, info.version):
                hold = acquire(self.layout.use(known.sha256), shared=True)
                try:
                    with acquire(self.layout.lock(known.sha256)):
                        record = self.layout.present(known.sha256)
                        if record is not None:
                            self._touch(record, uri)
                except BaseException:
                    hold.release()
                    raise
                if record is not None:
                    return self._done(record, uri, False, started, hold)
                hold.release()
            self.layout.clean_temp(held=key)
            got = download(uri, info, self.layout.new_temp(key), expected=None)
            hold = acquire(self.layout.use(got.sha256), shared=True)
            try:
                with acquire(self.layout.lock(got.sha256)):
                    record = self.layout.present(got.sha256)
                    if record is None:
                        record = Record(got.sha256, got.size, [uri], time.time())
                        self.layout.install(got.tmp, record)
                    else:  # the same bytes are cached already (another URI, or a pinned ref of them)
                        got.tmp.unlink(missing_ok=True)
                        self._touch(record, uri)
                self.layout.remember(IndexEntry(uri, got.sha256, got.size, info.version))
            except BaseException:
                got.tmp.unlink(missing_ok=True)
                hold.release()
                raise
        return self._done(record, uri, True, started, hold)

    def _download(self, uri: str, key: str, expected: str) -> Record:
        """Download into place under the download lock of `key` (held by the caller)."""
        info = stat_or_fail(uri)
        self.layout.clean_temp(held=key)
        if self.max_bytes is not None and info.size:  # room first: the volume under the cache may be no larger
            eviction.evict(self.layout, self.max_bytes, None, room=info.size)
        got = download(uri, info, self.layout.new_temp(key), expected)
        record = Record(got.sha256, got.size, [uri], time.time())
        try:
            self.layout.install(got.tmp, record)
        except OSError as e:
            got.tmp.unlink(missing_ok=True)
            raise FetchError(uri, f"cache write failed: {reason(e)}") from e
        return record

    def _done(self, record: Record, uri: str, downloaded: bool, started: float, hold: FileLock) -> CachedFile:
        seconds = time.monotonic() - started
        if downloaded:
            log.info("%s: downloaded %s bytes, sha256 %s, in %.2f s", uri, f"{record.size:,}", record.sha256, seconds)
            self._evict(keep=record.sha256)
        path = self.layout.data(record.sha256)
        return CachedFile(path, record.sha256, record.size, uri, downloaded, seconds, hold)

    def _touch(self, record: Record, uri: str) -> None:
        """The record's last use, best effort: a cache that cannot be written still serves what it holds."""
        record.used_from(uri)
        try:
            self.layout.save(record)
        except OSError as e:
            log.warning("model cache %s: could not record the use of %s: %s", self.layout.root, record.sha256, e)

    def _warn_unpinned(self, uri: str) -> None:
        with self._warned_lock:
            if uri in self._warned:
                return
            self._warned.add(uri)
        log.warning("%s is not pinned: its bytes are not verified (give the ref a sha256)", uri)

    def _local(self, ref: ModelRef, started: float) -> CachedFile:
        path = ref.local_path()
        try:
            st = os.stat(path)
        except OSError as e:
            raise FetchError(ref.uri, reason(e)) from e
        if not stat.S_ISREG(st.st_mode):
            raise FetchError(ref.uri, "not a file")
        digest, size = self._local_digest(ref.uri, path, st)
        if ref.sha256 is not None and digest != ref.sha256:
            raise FetchError(ref.uri, f"sha256 mismatch: expected {ref.sha256}, got {digest} ({size:,} bytes)")
        return CachedFile(path, digest, size, ref.uri, False, time.monotonic() - started)

    def _local_digest(self, uri: str, path: Path, st: os.stat_result) -> tuple[str, int]:
        """A local file's digest: remembered per (size, mtime, ctime, inode), else computed (again, if the file changed
        while it was read)."""
        key = "file://" + os.path.abspath(path)
        known = self.layout.indexed(key)
        if known is not None and (known.size, known.version) == (st.st_size, _version(st)):
            return known.sha256, known.size
        for _ in range(3):
            try:
                digest = sha256_file(path)
                after = os.stat(path)
            except OSError as e:
                raise FetchError(uri, reason(e)) from e
            if (after.st_size, _version(after)) == (st.st_size, _version(st)):
                self.layout.remember(IndexEntry(key, digest, st.st_size, _version(st)))
                return digest, st.st_size
            st = after
        raise FetchError(uri, "changed while it was read")

    def entries(self) -> list[CacheEntry]:
        """The cached files, most recently used first."""
        return eviction.entries(self.layout)

    def total_bytes(self) -> int:
        """The bytes of the cached files (records and partial downloads aside)."""
        return eviction.total_bytes(self.layout)

    def evict(self) -> list[CacheEntry]:
        """Remove files no process holds, least recently used first, until the cache is within max_bytes; what was
        removed. Leftovers of dead downloads and the lock files of absent files go too."""
        self.layout.clean_temp()
        removed = self._evict(keep=None)
        self.layout.clean_locks()
        return removed

    def _evict(self, keep: str | None) -> list[CacheEntry]:
        return [] if self.max_bytes is None else eviction.evict(self.layout, self.max_bytes, keep)
