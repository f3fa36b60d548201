"""What the cache holds, and trimming it to its byte limit: least recently used first, never a file in use.

A file is in use while any process holds a shared lock on its use-lock (app.storage.locks): eviction takes that lock
exclusively without waiting, and the download lock too, so that it never removes a file being opened, fetched or used,
and a crashed user's hold goes with it. Broken entries (a file without its record, or of the wrong size) go first.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass
from typing import Any

from app.storage.layout import Layout
from app.storage.locks import try_acquire

__all__ = ["CacheEntry", "entries", "evict", "in_use", "total_bytes"]

log = logging.getLogger("app.storage.cache")  # the cache's one logger: its operators look for one name


@dataclass(frozen=True)
class CacheEntry:
    """A file in the cache: its digest, size, the URI it was last fetched as, when, and whether any process holds it."""

    sha256: str
    size: int
    uri: str
    last_used: float
    in_use: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def in_use(layout: Layout, digest: str) -> bool:
    """Whether any process (this one included) holds the file."""
    lock = try_acquire(layout.use(digest))
    if lock is None:
        return True
    lock.release()
    return False


def entries(layout: Layout) -> list[CacheEntry]:
    """The cached files, most recently used first."""
    found = []
    for digest in layout.digests():
        record = layout.present(digest)
        if record is not None:
            uri = record.uris[-1] if record.uris else ""
            found.append(CacheEntry(digest, record.size, uri, record.last_used, in_use(layout, digest)))
    return sorted(found, key=lambda e: e.last_used, reverse=True)


def total_bytes(layout: Layout) -> int:
    """The bytes of the cached files (records and partial downloads aside)."""
    total = 0
    for digest in layout.digests():
        with contextlib.suppress(FileNotFoundError):
            total += layout.data(digest).stat().st_size
    return total


def evict(layout: Layout, max_bytes: int, keep: str | None, room: int = 0) -> list[CacheEntry]:
    """Remove files no one holds until the cache is within `max_bytes` (with `room` bytes free: a download about to
    start), never `keep`; what was removed. If what is left is in use, the cache stays over its limit, and says so."""
    max_bytes = max(0, max_bytes - room)
    total = total_bytes(layout)
    if total <= max_bytes:
        return []
    candidates = []
    for digest in layout.digests():
        if digest == keep:
            continue
        record = layout.record(digest)
        try:
            size = layout.data(digest).stat().st_size
        except FileNotFoundError:
            size = 0
        uri = record.uris[-1] if record and record.uris else ""
        entry = CacheEntry(digest, size, uri, record.last_used if record else 0.0, False)
        candidates.append((layout.present(digest) is not None, entry.last_used, entry))  # broken first, then oldest
    removed = []
    for _, _, entry in sorted(candidates, key=lambda c: c[:2]):
        if total <= max_bytes:
            break
        if remove(layout, entry.sha256):
            total -= entry.size
            removed.append(entry)
    if total > max_bytes:
        over = (layout.root, f"{total:,}", f"{max_bytes:,}")
        log.warning("model cache %s: %s bytes, over its limit of %s: the rest is in use", *over)
    return removed


def remove(layout: Layout, digest: str) -> bool:
    """Remove a file no one downloads nor holds, and its lock files; False if someone does."""
    lock = try_acquire(layout.lock(digest))
    if lock is None:
        return False
    try:
        use = try_acquire(layout.use(digest))
        if use is None:
            return False
        try:
            layout.remove(digest)
        finally:
            use.remove()
        lock.remove()
        return True
    finally:
        lock.release()
