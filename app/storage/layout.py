"""The cache's files on disk: content addressed, written so that no reader ever sees half of one.

    sha256/<hex>         a model file, named by its digest
    sha256/<hex>.json    its record: size, the URIs it came from, when it was last used
    locks/<key>.lock     held while one process downloads <key> (a digest, or uri-<hash> for an unpinned ref)
    locks/<hex>.use      held shared by every process using <hex>; eviction needs it exclusively
    index/<hash>.json    a URI's last known digest and version (unpinned refs; local files' digests)
    tmp/<key>.*.part     downloads in progress, on the same filesystem as sha256/ so that the rename is atomic

A file counts as cached only when its record exists and its size matches; anything else is fetched again.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.storage.locks import try_acquire

__all__ = ["IndexEntry", "Layout", "Record"]

MAX_URIS = 8  # URIs remembered per file (the last one is the latest)
STALE_RECORD_S = 3600.0  # a record's temporary file older than this was left by a crash


@dataclass
class Record:
    """A cached file's record (sha256/<hex>.json)."""

    sha256: str
    size: int
    uris: list[str] = field(default_factory=list)
    last_used: float = 0.0

    def used_from(self, uri: str) -> None:
        self.uris = [*[u for u in self.uris if u != uri][-(MAX_URIS - 1) :], uri]
        self.last_used = time.time()


@dataclass(frozen=True)
class IndexEntry:
    """What a URI held when last read: its digest, size, and the store's version of it (ETag, mtime...)."""

    uri: str
    sha256: str
    size: int
    version: str | None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Layout:
    """Paths under a cache root, and the atomic reads and writes of its records."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files, self.locks, self.tmp, self.index = (root / d for d in ("sha256", "locks", "tmp", "index"))
        for d in (self.files, self.locks, self.tmp, self.index):
            d.mkdir(parents=True, exist_ok=True)

    def data(self, digest: str) -> Path:
        return self.files / digest

    def record_path(self, digest: str) -> Path:
        return self.files / f"{digest}.json"

    def lock(self, key: str) -> Path:
        return self.locks / f"{key}.lock"

    def use(self, digest: str) -> Path:
        return self.locks / f"{digest}.use"

    @staticmethod
    def uri_key(uri: str) -> str:
        return "uri-" + hashlib.sha256(uri.encode()).hexdigest()[:40]

    def write_json(self, path: Path, data: dict[str, Any], durable: bool = False) -> None:
        """Replace `path` with `data` in one step (a reader sees the old record or the new, never a mix)."""
        tmp = self.tmp / f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.json"
        try:
            with open(tmp, "w") as f:
                json.dump(data, f, sort_keys=True)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def record(self, digest: str) -> Record | None:
        data = _read_json(self.record_path(digest))
        try:
            return None if data is None else Record(**data)
        except TypeError:
            return None

    def present(self, digest: str) -> Record | None:
        """The record of a cached file whose size matches it; None when absent, unrecorded or the wrong size."""
        record = self.record(digest)
        if record is None or record.sha256 != digest:
            return None
        try:
            size = self.data(digest).stat().st_size
        except OSError:
            return None
        return record if size == record.size else None

    def save(self, record: Record) -> None:
        self.write_json(self.record_path(record.sha256), asdict(record))

    def install(self, tmp: Path, record: Record) -> None:
        """Move a verified download into place: synced file, atomic rename, synced directory, then its record."""
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.data(record.sha256))
        fsync_dir(self.files)
        self.write_json(self.record_path(record.sha256), asdict(record), durable=True)

    def new_temp(self, key: str) -> Path:
        return self.tmp / f"{key}.{os.getpid()}.{secrets.token_hex(6)}.part"

    def digests(self) -> list[str]:
        """The digests with a file or a record in the cache."""
        names = {p.name.removesuffix(".json") for p in self.files.iterdir()}
        return sorted(n for n in names if len(n) == 64)

    def remove(self, digest: str) -> None:
        self.data(digest).unlink(missing_ok=True)
        self.record_path(digest).unlink(missing_ok=True)
        fsync_dir(self.files)

    def indexed(self, uri: str) -> IndexEntry | None:
        data = _read_json(self.index / f"{self.uri_key(uri)}.json")
        try:
            entry = None if data is None else IndexEntry(**data)
        except TypeError:
            return None
        return entry if entry is not None and entry.uri == uri else None

    def remember(self, entry: IndexEntry) -> None:
        self.write_json(self.index / f"{self.uri_key(entry.uri)}.json", asdict(entry))

    def clean_locks(self) -> list[Path]:
        """Remove the lock files no one holds of files not in the cache (failed or evicted fetches leave them)."""
        removed = []
        for path in self.locks.iterdir():
            key = path.name.rsplit(".", 1)[0]
            if self.data(key).exists():
                continue
            lock = try_acquire(path)
            if lock is not None:
                lock.remove()
                removed.append(path)
        return removed

    def clean_temp(self, held: str | None = None) -> list[Path]:
        """Remove what dead downloads left: a partial file whose download lock no one holds (its writer holds that
        lock from before it creates the file until it is renamed or removed, and a killed writer's lock is dropped),
        and any of the key whose lock the caller holds, `held`."""
        removed = []
        for path in self.tmp.iterdir():
            if path.suffix == ".part":
                key = path.name.split(".", 1)[0]
                lock = None if key == held else try_acquire(self.lock(key))
                if lock is None and key != held:
                    continue  # being written
                path.unlink(missing_ok=True)
                if lock is not None:
                    lock.release()
            else:  # a record being written: gone in a moment, unless a crash left it
                try:
                    if path.stat().st_mtime > time.time() - STALE_RECORD_S:
                        continue
                except FileNotFoundError:
                    continue
                path.unlink(missing_ok=True)
            removed.append(path)
        return removed
