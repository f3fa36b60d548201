"""File locks (flock) that coordinate every process and thread of a node on one cache.

flock locks an open file description, so two threads of one process that each open the lock file exclude each other
as two processes do, and the kernel drops a killed process's locks: a crash never leaves the cache locked. A lock file
may be removed by whoever holds it exclusively (eviction does), so a lock taken is kept only if the path still names
the locked file; otherwise it is taken again on the new one.
"""

from __future__ import annotations

import fcntl
import os
import weakref
from pathlib import Path
from types import TracebackType

__all__ = ["FileLock", "acquire", "try_acquire"]


class FileLock:
    """A held flock on a lock file, given up by release() (idempotent), on leaving a `with` block, or when collected."""

    def __init__(self, path: Path, fd: int, shared: bool) -> None:
        self.path = path
        self.shared = shared
        self._fd = fd
        self._close = weakref.finalize(self, os.close, fd)

    @property
    def held(self) -> bool:
        return self._close.alive

    def release(self) -> None:
        self._close()  # closing the descriptor drops the lock; a second call does nothing

    def remove(self) -> None:
        """Unlink the lock file while holding it exclusively, then release it: a waiter on the old file retries."""
        if self.shared:
            raise RuntimeError(f"{self.path}: only an exclusive holder may remove a lock file")
        self.path.unlink(missing_ok=True)
        self.release()

    def __enter__(self) -> FileLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _lock(path: Path, shared: bool, blocking: bool) -> FileLock | None:
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return FileLock(path, fd, shared)
        os.close(fd)  # removed (or replaced) while we waited: lock the file the path names now


def acquire(path: Path, shared: bool = False) -> FileLock:
    """Take the lock, waiting for it: exclusive, or shared with other shared holders."""
    lock = _lock(path, shared, blocking=True)
    assert lock is not None
    return lock


def try_acquire(path: Path, shared: bool = False) -> FileLock | None:
    """Take the lock if no one holds it in a conflicting mode; None otherwise (no waiting)."""
    return _lock(path, shared, blocking=False)
