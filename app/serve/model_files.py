"""The files a Classifier replica opens, each fetched into the node's model cache and held while it serves.

A variant names its model (and its declared fallback, the speed gate's baseline, the labels) by a path or a URI with
an optional SHA-256 (`app.served_model.source`); its user_config may name another version of its model, which then
overrides the args'. `ModelFiles.local` fetches what one variant opens through the node's `ModelCache`
(`app.storage`: one download per node, a partial download never visible, the digest checked before anything opens
the file) and returns the args with those fields pointing at the local files, so the engine code opens paths as it
always has. The files stay held (so the cache never evicts a file a replica serves) until `LocalModel.release`.

A failure is one line naming the field, the URI and the reason: at start it fails the replica (`serve status`), in a
release the old version keeps serving and says why (`app.serve.model_release`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.config import AppArgs
from app.storage import CachedFile, FetchError, ModelCache, ModelRef


class ModelFileError(RuntimeError):
    """One line: the field, the URI and why it cannot be served."""


@dataclass(frozen=True)
class Source:
    """One field's file as it was fetched: what /v1/models says of the version a replica serves."""

    field: str
    uri: str
    sha256: str
    size: int
    downloaded: bool  # False: the node's cache (or a local file) had it
    fetch_s: float

    def describe(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "uri": self.uri,
            "sha256": self.sha256,
            "bytes": self.size,
            "downloaded": self.downloaded,
            "fetch_s": round(self.fetch_s, 3),
        }


@dataclass
class LocalModel:
    """A variant's args with its files on this node's disk, and the cache's holds on them."""

    args: AppArgs
    sources: list[Source]
    held: list[CachedFile] = field(default_factory=list)

    @property
    def model(self) -> Source:
        """The variant's own model file (its digest names the version)."""
        return self.sources[0]

    def release(self) -> None:
        for f in self.held:
            f.release()
        self.held.clear()

    def describe(self) -> dict[str, Any]:
        return {"version": self.model.sha256, "files": [s.describe() for s in self.sources]}


class ModelFiles:
    def __init__(self, cache: ModelCache) -> None:
        self.cache = cache

    @classmethod
    def for_node(cls, args: AppArgs) -> ModelFiles:
        c = args.model_cache
        return cls(ModelCache(c.resolved_dir(), c.max_bytes))

    def local(
        self, args: AppArgs, variant: str, model_path: str | None = None, sha256: str | None = None
    ) -> LocalModel:
        """`variant`'s files fetched (`model_path`/`sha256`: the user_config's version, overriding the args'), and
        the args with them as local paths. ModelFileError (one line) when one cannot be had."""
        v = args.variants[variant]
        uri, digest = (model_path, sha256) if model_path is not None else (v.model_path, v.sha256)
        wanted: list[tuple[str, str, str | None]] = [(f"variants.{variant}.model_path", uri, digest)]
        if v.fallback is not None:
            wanted.append((f"variants.{variant}.fallback.model_path", v.fallback.model_path, v.fallback.sha256))
        gate = args.speed_gate
        if gate is not None and gate.baseline != variant:
            b = args.variants[gate.baseline]
            wanted.append((f"variants.{gate.baseline}.model_path", b.model_path, b.sha256))
        if args.model.labels_path is not None:
            wanted.append(("model.labels_path", args.model.labels_path, args.model.labels_sha256))
        held: list[CachedFile] = []
        try:
            for name, u, d in wanted:
                held.append(self._fetch(name, u, d))
        except BaseException:
            for f in held:
                f.release()
            raise
        sources = [
            Source(name, f.uri, f.sha256, f.size, f.downloaded, f.seconds)
            for (name, _, _), f in zip(wanted, held, strict=True)
        ]
        paths = [str(f.path) for f in held]
        dumped = args.model_dump()
        dumped["variants"][variant]["model_path"], dumped["variants"][variant]["sha256"] = paths[0], sources[0].sha256
        i = 1
        if v.fallback is not None:
            dumped["variants"][variant]["fallback"]["model_path"] = paths[i]
            i += 1
        if gate is not None and gate.baseline != variant:
            dumped["variants"][gate.baseline]["model_path"] = paths[i]
            i += 1
        if args.model.labels_path is not None:
            dumped["model"]["labels_path"] = paths[i]
        return LocalModel(AppArgs.model_validate(dumped), sources, held)

    def _fetch(self, name: str, uri: str, sha256: str | None) -> CachedFile:
        try:
            return self.cache.fetch(ModelRef(uri, sha256))
        except FetchError as e:
            raise ModelFileError(f"{name}: {e}") from None

    def describe(self) -> dict[str, Any]:
        """The node's cache: what it holds (digest, size, URI, last used, in use) and its limit."""
        entries = self.cache.entries()
        return {
            "dir": str(self.cache.root),
            "max_bytes": self.cache.max_bytes,
            "bytes": sum(e.size for e in entries),
            "entries": [e.as_dict() for e in entries],
        }
