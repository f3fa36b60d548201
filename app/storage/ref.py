"""ModelRef: where a model file lives and, when pinned, which bytes it must be.

A URI names the store: `s3://bucket/key`, `gs://bucket/key` and `https://host/path` are remote (fetched into the node's
cache by app.storage.cache); `file:///abs/path` and a plain path are local (read where they are). The pin is the
file's SHA-256: with it a cached copy is trusted by name and a changed object is refused; without it the store's word
is taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from app.storage.digest import parse_sha256

__all__ = ["REMOTE_SCHEMES", "ModelRef", "parse_sha256", "scheme_of"]

REMOTE_SCHEMES = ("s3", "gs", "https")


def scheme_of(uri: str) -> str:
    """The scheme of `scheme://...`, lower case; empty for a plain path (a Windows drive letter is not a scheme)."""
    head, sep, _ = uri.partition("://")
    return head.lower() if sep and head.isalnum() and len(head) > 1 else ""


@dataclass(frozen=True)
class ModelRef:
    """A model file's URI and, optionally, its SHA-256 pin (normalised: 64 lowercase hex digits, no prefix)."""

    uri: str
    sha256: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha256", parse_sha256(self.sha256))
        if not self.uri or self.uri != self.uri.strip():
            raise ValueError(f"model URI: expected a non-empty URI without surrounding spaces, got {self.uri!r}")
        scheme = self.scheme
        if scheme in REMOTE_SCHEMES:
            parts = urlsplit(self.uri)
            if not parts.netloc or parts.path in ("", "/"):
                raise ValueError(f"{self.uri}: expected {scheme}://{'host' if scheme == 'https' else 'bucket'}/path")
        elif scheme == "file":
            host = urlsplit(self.uri).netloc
            if host not in ("", "localhost"):
                raise ValueError(f"{self.uri}: a file:// URI names this node's files (file:///abs/path)")
        elif scheme:
            allowed = ", ".join(f"{s}://" for s in (*REMOTE_SCHEMES, "file"))
            raise ValueError(f"{self.uri}: unsupported scheme {scheme!r} (expected {allowed} or a plain path)")

    @property
    def scheme(self) -> str:
        """The URI's scheme, lower case; empty for a plain path."""
        return scheme_of(self.uri)

    @property
    def remote(self) -> bool:
        """Whether the file is fetched from a store (s3, gs, https) rather than read in place."""
        return self.scheme in REMOTE_SCHEMES

    def local_path(self) -> Path:
        """The path of a local ref (file:// or a plain path); ValueError for a remote one."""
        if self.remote:
            raise ValueError(f"{self.uri}: a remote ref has no local path (fetch it through app.storage.cache)")
        if self.scheme == "file":
            return Path(unquote(urlsplit(self.uri).path))
        return Path(self.uri)
