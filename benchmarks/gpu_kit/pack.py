"""The staged kit as xz streams (segments.py), their concatenation cut into parts, each small enough for one call.

xz, not the wheels as they come: a wheel is a zip of deflate-compressed members, and LZMA with a 64 MiB dictionary
(preset 9, extreme) over the unpacked shared libraries is much smaller (docs/engines.md has the figures). Each stream
is a tar of its files through one compressor; the streams are compressed in parallel (one process per core: the
build's time is most of it compressing) and concatenated in order; the parts are that concatenation cut at exact
byte offsets. The node unpacks a segment from the parts that hold its streams with nothing but its Python's lzma and
tarfile (run.sh), not the xz program, which it may lack. xz keeps a CRC64 of its data, so a damaged stream fails
while it unpacks; each part, each stream and the whole also have a SHA-256 in the manifest, checked on arrival and
before unpacking.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import tarfile
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.gpu_kit.segments import X86, Stream

XZ_PRESET = 9 | lzma.PRESET_EXTREME
PART = "part-{index:02d}-of-{count:02d}.bin"


class Parts(io.RawIOBase):
    """A write-only stream cut into files of at most `size` bytes in `folder`, hashing each part and the whole."""

    def __init__(self, folder: Path, size: int) -> None:
        super().__init__()
        if size <= 0:
            raise ValueError(f"part size must be positive, not {size}")
        self.folder, self.size, self.total = folder, size, 0
        self.whole = hashlib.sha256()
        self.done: list[tuple[Path, int, str]] = []  # the closed parts: temporary file, bytes, SHA-256
        self.current: Any = None

    def writable(self) -> bool:
        return True

    def _open(self) -> None:
        self.current = (self.folder / f".part-{len(self.done) + 1:04d}.tmp").open("wb")
        self.current_hash, self.current_bytes = hashlib.sha256(), 0

    def _close_part(self) -> None:
        if self.current is not None:
            self.current.close()
            self.done.append((Path(self.current.name), self.current_bytes, self.current_hash.hexdigest()))
            self.current = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = 0
        while written < len(view):
            if self.current is None:
                self._open()
            chunk = view[written : written + self.size - self.current_bytes]
            self.current.write(chunk)
            self.current_hash.update(chunk)
            self.whole.update(chunk)
            self.current_bytes += len(chunk)
            written += len(chunk)
            if self.current_bytes == self.size:
                self._close_part()
        self.total += written
        return written

    def finish(self) -> list[dict[str, Any]]:
        """Close the last part and give each its final name (part-NN-of-MM.bin), size and SHA-256."""
        self._close_part()
        out = []
        for i, (tmp, size, digest) in enumerate(self.done, 1):
            name = PART.format(index=i, count=len(self.done))
            tmp.rename(self.folder / name)
            out.append({"name": name, "bytes": size, "sha256": digest})
        return out


def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Members as root's on any node, whoever built the kit; modes and times as they were."""
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def file_bytes(root: Path, files: Iterable[str]) -> int:
    """The bytes of the regular files among `files` (relative to `root`)."""
    return sum((root / f).lstat().st_size for f in files if not (root / f).is_symlink())


def filters(kind: str, preset: int) -> list[dict[str, Any]]:
    """xz's filter chain for a stream of `kind` (segments.X86: the x86 branch filter, then LZMA2)."""
    lzma2 = {"id": lzma.FILTER_LZMA2, "preset": preset}
    return [{"id": lzma.FILTER_X86}, lzma2] if kind == X86 else [lzma2]


def compress(staging: Path, stream: Stream, dest: Path, preset: int) -> dict[str, Any]:
    """One stream: its files as a tar, through xz, into `dest`. Run in a worker process: one per core."""
    t0 = time.monotonic()
    with (
        dest.open("wb") as raw,
        lzma.LZMAFile(raw, "w", format=lzma.FORMAT_XZ, filters=filters(stream.kind, preset)) as xz,
    ):
        with tarfile.open(fileobj=xz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for f in stream.files:
                tar.add(staging / f, arcname=f, recursive=False, filter=owned_by_root)
        tar_bytes = xz.tell()
    size = dest.stat().st_size
    out = {"segment": stream.segment, "kind": stream.kind, "files": len(stream.files), "bytes": size}
    out |= {"tar_bytes": tar_bytes, "file_bytes": file_bytes(staging, stream.files)}
    return out | {
        "ratio": round(size / tar_bytes, 4) if tar_bytes else None,
        "compress_s": round(time.monotonic() - t0, 1),
    }


def archive(staging: Path, streams: list[Stream], out: Path, part_bytes: int, preset: int = XZ_PRESET,
            workers: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Every stream compressed (in parallel, one process per core), then their concatenation, in the streams'
    order, cut into parts of `part_bytes` (the last smaller) in `out`. Each stream's offset, size and SHA-256 in that
    concatenation; each part's size and SHA-256; the whole's SHA-256."""
    workers = max(1, min(len(streams), workers or os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix=".streams-", dir=out) as tmp:
        dests = [Path(tmp) / f"{i}.xz" for i in range(len(streams))]
        # the largest streams first, so the pool's last worker does not start the largest one last
        order = sorted(range(len(streams)), key=lambda i: -file_bytes(staging, streams[i].files))
        with ProcessPoolExecutor(workers) as pool:
            futures = {i: pool.submit(compress, staging, streams[i], dests[i], preset) for i in order}
            done = [futures[i].result() for i in range(len(streams))]
        parts, offset = Parts(out, part_bytes), 0
        for info, dest in zip(done, dests, strict=True):
            digest = hashlib.sha256()
            with dest.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
                    parts.write(chunk)
            info |= {"offset": offset, "sha256": digest.hexdigest()}
            offset += info["bytes"]
    tar_bytes = sum(s["tar_bytes"] for s in done)
    return {
        "sha256": parts.whole.hexdigest(),
        "bytes": parts.total,
        "tar_bytes": tar_bytes,
        "ratio": round(parts.total / tar_bytes, 4) if tar_bytes else None,
        "xz_preset": preset_name(preset),
        "streams": done,
        "parts": parts.finish(),
    }


def preset_name(preset: int) -> str:
    return f"{preset & ~lzma.PRESET_EXTREME}{'e' if preset & lzma.PRESET_EXTREME else ''}"


def parse_preset(text: str) -> int:
    """'9e' (9 | extreme) or a digit."""
    level = int(text.rstrip("e"))
    if not 0 <= level <= 9:
        raise ValueError(f"xz preset {text!r}: 0..9, optionally with e")
    return level | (lzma.PRESET_EXTREME if text.endswith("e") else 0)
