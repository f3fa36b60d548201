"""A cascade's calibration capture: the images on which `first` and `then` disagree, kept on disk, bounded.

Opt-in per cascade (`capture.enabled`). One directory per cascade (`<dir>/<first>-to-<then>`), one image
file per disagreement as it was received (`<ms>-<sha256[:16]>.<format>`) and a `.json` beside it (both
answers' top-1, first's margin), so the directory is what `python -m app.models quantize
--calibration-dir` reads. Bounded in images, bytes and age, per cascade and Router replica: the oldest
go first, and an image older than `retention_s` is deleted (on the next write, or the sweep about once a
minute). Writes run on one thread of their own, never on the event loop; beyond MAX_PENDING waiting
writes a disagreement is dropped (and counted), so a burst cannot grow the Router's memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.config import CaptureArgs
from app.imaging.probe import IMAGE_SUFFIXES, probe_dimensions

logger = logging.getLogger("ray.serve")
MAX_PENDING = 8  # writes waiting for the capture thread (each holds its image); beyond, dropped
SWEEP_EVERY_S = 60.0
SUFFIX = {"jpeg": ".jpg", "png": ".png", "gif": ".gif", "bmp": ".bmp", "webp": ".webp", "tiff": ".tif"}


def directory_name(cascade: str) -> str:
    """int8>fp32 -> int8-to-fp32 (no '>' in a path)."""
    return cascade.replace(">", "-to-")


@dataclass
class _Kept:
    at: float  # when written (wall clock)
    path: Path
    size: int  # image and sidecar


@dataclass
class Shelf:
    """One cascade's directory and what is in it."""

    args: CaptureArgs
    root: Path
    kept: list[_Kept] = field(default_factory=list)  # oldest first
    size: int = 0  # bytes of `kept`, kept as they come and go (no sum over thousands of files under the lock)
    digests: set[str] = field(default_factory=set)
    written: int = 0
    dropped: int = 0  # the writer was behind (MAX_PENDING)
    duplicates: int = 0
    unknown_format: int = 0
    errors: int = 0

    def scan(self) -> list[_Kept]:
        """What an earlier replica left here (I/O: off the lock)."""
        self.root.mkdir(parents=True, exist_ok=True)
        found = []
        for path in self.root.iterdir():
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                side = path.with_suffix(".json")
                size = path.stat().st_size + (side.stat().st_size if side.exists() else 0)
                found.append(_Kept(path.stat().st_mtime, path, size))
        return found

    def adopt(self, found: list[_Kept], now: float) -> list[_Kept]:
        """Under the lock: the files found count toward the caps; what must go."""
        self.kept = sorted([*found, *self.kept], key=lambda k: k.at)
        self.size += sum(k.size for k in found)
        self.digests |= {k.path.stem.split("-")[-1] for k in found}
        return self.trim(now)

    def keep(self, k: _Kept, now: float) -> list[_Kept]:
        """Under the lock: a file written; what must go for the caps."""
        self.kept.append(k)
        self.size += k.size
        self.written += 1
        return self.trim(now)

    def file(self, image: bytes, digest: str, meta: dict[str, Any], now: float) -> _Kept | None:
        """Write the image and its sidecar (I/O: off the lock); None for a format with no file suffix."""
        info = probe_dimensions(image)
        suffix = SUFFIX.get(info.format) if info is not None else None
        if suffix is None:
            return None
        path = self.root / f"{int(now * 1000)}-{digest}{suffix}"
        side = json.dumps({**meta, "captured_at": round(now, 3)}).encode()
        path.write_bytes(image)
        path.with_suffix(".json").write_bytes(side)
        return _Kept(now, path, len(image) + len(side))

    def trim(self, now: float) -> list[_Kept]:
        """Under the lock: the oldest out until the caps hold, and anything past retention; the files to delete."""
        a, gone = self.args, []
        while self.kept and (
            len(self.kept) > a.max_images or self.size > a.max_bytes or now - self.kept[0].at > a.retention_s
        ):
            k = self.kept.pop(0)
            self.size -= k.size
            self.digests.discard(k.path.stem.split("-")[-1])
            gone.append(k)
        return gone

    def describe(self) -> dict[str, Any]:
        return {
            "dir": str(self.root),
            "images": len(self.kept),
            "bytes": self.size,
            "max_images": self.args.max_images,
            "max_bytes": self.args.max_bytes,
            "retention_s": self.args.retention_s,
            "written": self.written,
            "dropped": self.dropped,
            "duplicates": self.duplicates,
            "unknown_format": self.unknown_format,
            "errors": self.errors,
        }


class CaptureStore:
    """Every capturing cascade's shelf, and the one thread that writes them."""

    def __init__(self, captures: dict[str, CaptureArgs]) -> None:
        self.shelves = {name: Shelf(a, Path(a.dir).absolute() / directory_name(name)) for name, a in captures.items()}
        self._lock = threading.Lock()  # the shelves' state: written on the thread, read by describe()
        self._pending = 0
        self._last_sweep = time.monotonic()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture")
        for shelf in self.shelves.values():
            self._writer.submit(self._guarded, self._load, shelf)

    @staticmethod
    def _guarded(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            logger.exception("calibration capture: %s failed", getattr(fn, "__name__", fn))

    def _load(self, shelf: Shelf) -> None:
        found = shelf.scan()
        with self._lock:
            gone = shelf.adopt(found, time.time())
        _delete(gone)

    def add(self, cascade: str, image: bytes, meta: dict[str, Any]) -> None:
        """Keep `image` (a disagreement of `cascade`'s two variants), unless the writer is behind (or it is kept
        already: the writer checks). Called on the event loop: it only counts and queues (the lock is never held
        across I/O or hashing)."""
        shelf = self.shelves.get(cascade)
        if shelf is None or len(image) > shelf.args.max_bytes:
            return
        with self._lock:
            if self._pending >= MAX_PENDING:
                shelf.dropped += 1
                return
            self._pending += 1
        self._writer.submit(self._write, shelf, image, meta)

    def _write(self, shelf: Shelf, image: bytes, meta: dict[str, Any]) -> None:
        digest = hashlib.sha256(image).hexdigest()[:16]  # here, not on the event loop: an image is up to 10 MiB
        with self._lock:
            if digest in shelf.digests:
                shelf.duplicates += 1
                self._pending -= 1
                return
            shelf.digests.add(digest)
        now = time.time()
        try:
            kept = shelf.file(image, digest, meta, now)
        except Exception:
            logger.exception("calibration capture: writing an image failed")
            kept, failed = None, True
        else:
            failed = False
        with self._lock:
            self._pending -= 1
            if kept is None:
                shelf.digests.discard(digest)
                shelf.errors += int(failed)
                shelf.unknown_format += int(not failed)
                return
            gone = shelf.keep(kept, now)
        _delete(gone)

    def maybe_sweep(self) -> None:
        """About once a minute: past-retention images out, even with no new disagreement."""
        if time.monotonic() - self._last_sweep < SWEEP_EVERY_S:
            return
        self._last_sweep = time.monotonic()
        self._writer.submit(self._guarded, self.sweep)

    def sweep(self) -> None:
        for shelf in self.shelves.values():
            with self._lock:
                gone = shelf.trim(time.time())
            _delete(gone)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait for the writes submitted so far (tests, shutdown)."""
        self._writer.submit(lambda: None).result(timeout=timeout_s)

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {name: shelf.describe() for name, shelf in sorted(self.shelves.items())}


def _delete(gone: list[_Kept]) -> None:
    for k in gone:
        for p in (k.path, k.path.with_suffix(".json")):
            p.unlink(missing_ok=True)
