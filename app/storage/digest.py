"""SHA-256 digests: how a pin is written and how a file's digest is computed.

A pin is 64 lowercase hex digits; an optional `sha256:` prefix (as OCI and many manifests write it) is accepted on
input and dropped. Files are hashed in bounded chunks, so a model of any size costs constant memory.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

HEX = re.compile(r"[0-9a-f]{64}")
PREFIX = "sha256:"
CHUNK = 1 << 20


def parse_sha256(text: str | None) -> str | None:
    """The digest of a pin in its normal form (lowercase hex, no prefix); None stays None (an unpinned ref)."""
    if text is None:
        return None
    value = text.strip()
    if value[: len(PREFIX)].lower() == PREFIX:
        value = value[len(PREFIX) :]
    value = value.lower()
    if not HEX.fullmatch(value):
        raise ValueError(f"sha256: expected 64 hex digits (optionally prefixed 'sha256:'), got {text!r}")
    return value


def sha256_file(path: Path | str) -> str:
    """The SHA-256 of a file's bytes, as 64 lowercase hex digits, read in chunks."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()
