"""One archive of the staged kit, xz-compressed and cut into parts, each small enough for one call to the node.

xz, not the wheels as they come: a wheel is a zip of deflate-compressed members, and LZMA with a 64 MiB dictionary
(preset 9, extreme) over the unpacked shared libraries is several times smaller (docs/engines.md has the figures).
One tar stream through one compressor, cut at exact byte offsets: the parts concatenated are the .tar.xz, so the node
needs only cat, its Python's lzma and tar. Python's lzma, not the xz program: the node may lack xz-utils. xz keeps a
CRC64 of its data, so a damaged archive fails while it unpacks; each part and the whole also have a SHA-256 in the
manifest, checked on arrival and before unpacking.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import tarfile
from pathlib import Path
from typing import Any

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


def file_bytes(path: Path) -> int:
    """The bytes of the regular files at or under `path`."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def archive(staging: Path, groups: list[str], out: Path, part_bytes: int, preset: int = XZ_PRESET) -> dict[str, Any]:
    """tar of `groups` (top-level entries of `staging`, in this order) through xz into parts in `out`. Per group its
    files' bytes and, approximately (the compressor's output while the group went in: it lags its input), after."""
    parts, sizes = Parts(out, part_bytes), {}
    with lzma.LZMAFile(parts, "w", preset=preset) as xz:  # type: ignore[arg-type]  # a raw binary stream
        with tarfile.open(fileobj=xz, mode="w|") as tar:
            for group in groups:
                before_xz = parts.total
                tar.add(staging / group, arcname=group, filter=owned_by_root)
                sizes[group] = {"bytes": file_bytes(staging / group), "xz_bytes_approx": parts.total - before_xz}
        uncompressed = xz.tell()  # the tar's end blocks included
    listed = parts.finish()
    return {
        "sha256": parts.whole.hexdigest(),
        "bytes": parts.total,
        "tar_bytes": uncompressed,
        "ratio": round(parts.total / uncompressed, 4) if uncompressed else None,
        "xz_preset": preset_name(preset),
        "groups": sizes,
        "parts": listed,
    }


def preset_name(preset: int) -> str:
    return f"{preset & ~lzma.PRESET_EXTREME}{'e' if preset & lzma.PRESET_EXTREME else ''}"


def parse_preset(text: str) -> int:
    """'9e' (9 | extreme) or a digit."""
    level = int(text.rstrip("e"))
    if not 0 <= level <= 9:
        raise ValueError(f"xz preset {text!r}: 0..9, optionally with e")
    return level | (lzma.PRESET_EXTREME if text.endswith("e") else 0)
