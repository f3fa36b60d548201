"""Files the API refuses, for app/batch's tests (tests/test_batch_unit.py, tests/test_batch_cluster.py)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from app.toolchain.samples import sample_bytes


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares `width` x `height` and holds no pixels: a decompression bomb's header."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk


def bad_files(root: Path) -> dict[str, str]:
    """Files the API refuses, written under `root`: name -> the error code `/v1/classify` answers for it."""
    rocket = sample_bytes("rocket")
    chelsea = bytearray(sample_bytes("chelsea"))
    chelsea[8:16] = b"\xff" * 8  # the IHDR chunk's length: the PNG's structure broken
    files = {
        "truncated.jpg": (rocket[: len(rocket) // 3], "undecodable_image"),
        "corrupt.png": (bytes(chelsea), "undecodable_image"),
        "oversized.png": (png_header(50_000, 50_000), "too_many_pixels"),
        "notes.jpg": (b"a text file, not an image\n", "undecodable_image"),
        "empty.png": (b"", "empty_body"),
    }
    for name, (data, _) in files.items():
        (root / name).write_bytes(data)
    return {name: code for name, (_, code) in files.items()}
