"""The files a Classifier replica (a batch scorer, a command on a node) opens, each fetched into the node's model
cache and held while it serves.

A variant names its model (and its declared fallback, the speed gate's baseline, the labels) by a path or a URI with
an optional SHA-256 (`app.served_model.source`); its user_config may name another version of its model, which then
overrides the args'. `ModelFiles.local` fetches what one variant opens (`local_all`: several) through the node's
`ModelCache` (`app.storage`: one download per node, a partial download never visible, the digest checked before
anything opens the file) and returns the args with those fields pointing at the local files, so the engine code opens
paths as it always has. The files stay held (so the cache never evicts a file a replica serves) until
`LocalModel.release`.

A failure is one line naming the field, the URI and the reason: at start it fails the replica (`serve status`), in a
release the old version keeps serving and says why (`app.serve.model_release`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from app.config import AppArgs
from app.served_model.source import is_remote
from app.storage import CachedFile, FetchError, ModelCache, ModelRef

logger = logging.getLogger("ray.serve")


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

    def local(self, args: AppArgs, variant: str, version: dict[str, str | None] | None = None) -> LocalModel:
        """`variant`'s files fetched (`version`: a user_config's `model_path`, `sha256`, `fallback_model_path`,
        `fallback_sha256`, overriding the args'), and the args with them as local paths. ModelFileError (one line)
        when one cannot be had, or when the version pairs a new model with the args' old fallback."""
        if version and version.get("model_path") is not None:
            args = with_version(args, variant, version)
        return self.local_all(args, [variant])

    def local_all(self, args: AppArgs, variants: list[str]) -> LocalModel:
        """What `variants` open, each file fetched once: their files (the first variant's first: `LocalModel.model`),
        their declared fallbacks, the speed gate's baseline, the labels; the args with every one of them local."""
        wanted: dict[str, tuple[str, str | None]] = {}
        for name in variants:
            v = args.variants[name]
            wanted[f"variants.{name}.model_path"] = (v.model_path, v.sha256)
        for name in variants:
            fb = args.variants[name].fallback
            if fb is not None:
                wanted[f"variants.{name}.fallback.model_path"] = (fb.model_path, fb.sha256)
        gate = args.speed_gate
        if gate is not None and any(gate.baseline != name for name in variants):
            b = args.variants[gate.baseline]
            wanted.setdefault(f"variants.{gate.baseline}.model_path", (b.model_path, b.sha256))
        if args.model.labels_path is not None:
            wanted["model.labels_path"] = (args.model.labels_path, args.model.labels_sha256)
        held: list[CachedFile] = []
        got: dict[str, CachedFile] = {}
        try:
            for name, (uri, digest) in wanted.items():
                try:
                    got[name] = self._fetch(name, uri, digest)
                except ModelFileError as e:
                    if ".fallback." not in name:
                        raise
                    # A declared fallback serves only where the variant's own build is refused: its file is needed
                    # there alone, where opening it says what is wrong (as a missing local fallback always has).
                    logger.warning("%s (needed only where the fallback serves)", e)
                    continue
                held.append(got[name])
        except BaseException:
            for f in held:
                f.release()
            raise
        sources = [Source(n, f.uri, f.sha256, f.size, f.downloaded, f.seconds) for n, f in got.items()]
        dumped = args.model_dump()
        for name, (uri, _) in wanted.items():
            fetched = got.get(name)
            if name == "model.labels_path":
                dumped["model"]["labels_path"] = str(fetched.path) if fetched else uri
                continue
            variant = name.split(".")[1]
            entry = dumped["variants"][variant]
            if ".fallback." in name:
                entry = entry["fallback"]
            if fetched is not None:
                entry["model_path"], entry["sha256"] = str(fetched.path), fetched.sha256
            elif is_remote(uri):  # not fetched: a path that is not there, so that only a use of it fails
                entry["model_path"] = str(self.cache.root / "unfetched" / uri.rsplit("/", 1)[-1])
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


def fetched_here(args: AppArgs) -> AppArgs:
    """`args` with every remote file fetched into this node's cache and named by its path there, for a command that
    reads the files as a replica of this node would (`python -m app.runtime plan`, `build-engines`); `args` as they
    are when every file is local. The files stay in the cache, unheld."""
    if not any(is_remote(uri) for _, uri, _ in args.model_sources()):
        return args
    local = ModelFiles.for_node(args).local_all(args, list(args.variants))
    local.release()
    return local.args


def with_version(args: AppArgs, variant: str, version: dict[str, str | None]) -> AppArgs:
    """`args` with `variant`'s model (and its declared fallback) those of `version` (a user_config's)."""
    dumped = args.model_dump()
    entry = dumped["variants"][variant]
    entry |= {"model_path": version["model_path"], "sha256": version.get("sha256")}
    fallback = version.get("fallback_model_path")
    if entry.get("fallback") is not None:
        if fallback is None:
            raise ModelFileError(
                f"Classifier_{variant}: user_config.model_path names a new version, and args declare a fallback "
                f"(variants.{variant}.fallback): give the same version's fallback_model_path (and fallback_sha256) too"
            )
        entry["fallback"] |= {"model_path": fallback, "sha256": version.get("fallback_sha256")}
    elif fallback is not None:
        raise ModelFileError(f"Classifier_{variant}: user_config.fallback_model_path, but args declare no fallback")
    return AppArgs.model_validate(dumped)
