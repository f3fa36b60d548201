"""`python -m app.models publish`: the model files a Serve config names, into a store (S3, GCS, a directory) as one
immutable version, and the config that serves them from there.

What goes up: each variant's `model_path` and `fallback.model_path`, the declaration's `labels_path`, and the quality
reports beside each model file, under `<store>/<model name>/<version>/` with a `manifest.json` of every file's SHA-256,
size and role. The version is `--version`, else `sha256-` and 12 hex digits of the manifest's digest: the same bytes
give the same version, so publishing them again writes nothing.

A version is never overwritten: a config pins each file by URI and SHA-256, so a prefix that changed would fail the
replicas' digest check. The manifest is written last: a prefix that holds one is complete; one without (an interrupted
publish) is finished by the next, which hashes what is there and writes what differs. The store is reached through
`app.storage` (pyarrow's filesystems): credentials only from the standard places, never from a config or a flag.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from app.config import AppArgs
from app.config.app_file import AppFileError, read_app_args
from app.config.classifier import classifier_deployment_name
from app.served_model.source import is_remote

MANIFEST = "manifest.json"
PUBLISHED_BY = "app.models publish"
VERSION_NAME = re.compile(r"[A-Za-z0-9._-]+")
CHUNK = 1 << 20


class PublishError(Exception):
    """A publish that cannot go on: printed as one line, exit status 1."""


def one_line(e: BaseException) -> str:
    """An exception's message on one line (pyarrow's and pydantic's span several)."""
    return " ".join(str(e).split()) or type(e).__name__


def version_name(value: str) -> str:
    """`--version`: letters, digits, '.', '_' and '-', one path segment (not '.' or '..')."""
    if not VERSION_NAME.fullmatch(value) or value in (".", ".."):
        raise ValueError(f"--version {value!r}: letters, digits, '.', '_' and '-' only")
    return value


@dataclass
class LocalFile:
    """One file to publish: where it is here, what it is for, and its digest."""

    name: str
    path: Path
    field: str
    roles: list[str]
    sha256: str = ""
    size: int = 0

    @property
    def role(self) -> str:
        return ",".join(self.roles)


@dataclass
class Bundle:
    """What a config's application names, read from this machine: the files (by the name they get in the store),
    and which of them each variant, fallback and the labels are."""

    model: str
    files: dict[str, LocalFile] = field(default_factory=dict)
    variants: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)
    labels: str | None = None


@dataclass
class Published:
    """The outcome of a publish: where the version is, what was written, and the config blocks that serve it."""

    model: str
    version: str
    prefix: str
    uploaded: list[str]
    skipped: list[str]
    args: dict[str, Any]
    release: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "prefix": self.prefix,
            "uploaded": self.uploaded,
            "skipped": self.skipped,
            "args": self.args,
            "release": self.release,
        }


# --------------------------------------------------------------------------------------------- reading the config


def report_files(model_file: Path) -> list[Path]:
    """The quality reports beside a model file that exist: `<stem>.report.json` and `.report.md`, the names
    `app.toolchain.report.report_paths` gives them (not imported: that module loads ONNX Runtime)."""
    stem = model_file.with_suffix("")
    candidates = [stem.with_name(stem.name + ".report.json"), stem.with_name(stem.name + ".report.md")]
    return [p for p in candidates if p.is_file()]


def collect(args: AppArgs) -> Bundle:
    """The files `args` names, all on this machine, with their digests. A remote one (s3://, gs://, https://) is
    already published; a missing one is an error naming its field."""
    bundle = Bundle(model=args.model.name)

    def add(field_name: str, uri: str, role: str) -> str:
        if is_remote(uri):
            raise PublishError(f"{field_name}: already published: {uri} (publish takes files on this machine)")
        path = args.resolved_path(uri)
        if not path.is_file():
            raise PublishError(f"{field_name}: not found: {path}")
        return _add_path(bundle, field_name, path, role)

    models = []
    for name, variant in sorted(args.variants.items()):
        bundle.variants[name] = add(f"variants.{name}.model_path", variant.model_path, f"variant:{name}")
        models.append(bundle.files[bundle.variants[name]])
    for name, variant in sorted(args.variants.items()):
        if variant.fallback is not None:
            where = f"variants.{name}.fallback.model_path"
            bundle.fallbacks[name] = add(where, variant.fallback.model_path, f"fallback:{name}")
            models.append(bundle.files[bundle.fallbacks[name]])
    if args.model.labels_path is not None:
        bundle.labels = add("model.labels_path", args.model.labels_path, "labels")
    for model in {m.name: m for m in models}.values():
        for report in report_files(model.path):
            _add_path(bundle, f"the report of {model.field}", report, f"report:{model.name}")
    for f in bundle.files.values():
        f.sha256, f.size = file_digest(f.path)
    return bundle


def _add_path(bundle: Bundle, field_name: str, path: Path, role: str) -> str:
    """Add `path` under its file name; the same file twice gets both roles, two files of one name are refused (a
    version holds one file per name)."""
    name = path.name
    if name == MANIFEST:
        raise PublishError(f"{field_name}: {path}: {MANIFEST} is the name of the version's manifest")
    known = bundle.files.get(name)
    if known is None:
        bundle.files[name] = LocalFile(name=name, path=path, field=field_name, roles=[role])
    elif known.path.resolve() != path.resolve():
        raise PublishError(
            f"{field_name}: {path} and {known.field}: {known.path} share the name {name}: a version holds one file "
            "per name; rename one"
        )
    elif role not in known.roles:
        known.roles.append(role)
    return name


def file_digest(path: Path) -> tuple[str, int]:
    """SHA-256 and size of a local file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


# --------------------------------------------------------------------------------------------- the manifest


def _files_entry(bundle: Bundle) -> dict[str, dict[str, Any]]:
    return {
        name: {"sha256": f.sha256, "bytes": f.size, "role": f.role}
        for name, f in sorted(bundle.files.items(), key=lambda kv: kv[0])
    }


def content_version(bundle: Bundle) -> str:
    """`sha256-<12 hex>`: the digest of the manifest's content (every file's name, digest, size and role; the model),
    so identical bytes give the same version wherever and whenever they are published."""
    content = {"model": bundle.model, "files": _files_entry(bundle), "published_by": PUBLISHED_BY}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"sha256-{digest[:12]}"


def manifest_bytes(bundle: Bundle, version: str) -> bytes:
    """The version's manifest.json: no timestamp or host in it, so a re-publish writes the very same bytes."""
    manifest = {
        "model": bundle.model,
        "version": version,
        "files": _files_entry(bundle),
        "published_by": PUBLISHED_BY,
    }
    return (json.dumps(manifest, indent=2) + "\n").encode()


# --------------------------------------------------------------------------------------------- the store


def _scheme(uri: str) -> str:
    head, sep, _ = uri.partition("://")
    return head.lower() if sep and head.isalnum() else ""


def display_base(to: str, path: str) -> str:
    """The store's base as a URI for a config: s3:// and gs:// as given; a directory (a path or file://, whose local
    `path` `app.storage.filesystem_for` gave) as file:///abs, percent-quoted as a file:// URI is read back."""
    if _scheme(to) in ("s3", "gs"):
        return to.rstrip("/")
    return "file://" + quote(os.path.abspath(path))


def _is_local(fs: Any) -> bool:
    """Whether `fs` is this machine's disk (where a move is a cheap rename), a sub-tree of it included."""
    from pyarrow import fs as pafs

    while isinstance(fs, pafs.SubTreeFileSystem):
        fs = fs.base_fs
    return isinstance(fs, pafs.LocalFileSystem)


def _listing(fs: Any, prefix: str) -> dict[str, Any]:
    """The objects directly under `prefix` by file name (one list request on an object store)."""
    from pyarrow import fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(prefix, allow_not_found=True, recursive=False))
    return {info.base_name: info for info in infos if info.type == pafs.FileType.File}


def _read(fs: Any, path: str) -> bytes:
    with fs.open_input_stream(path, compression=None) as f:
        return bytes(f.read())


def _object_sha256(fs: Any, path: str) -> str:
    h = hashlib.sha256()
    with fs.open_input_stream(path, compression=None) as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        yield from iter(lambda: f.read(CHUNK), b"")


def _write(fs: Any, dest: str, chunks: Iterable[bytes], local: bool) -> str:
    """Write `dest` and return the SHA-256 of what was written. On a local filesystem through a temporary name and a
    move, so the file appears whole or not at all; on an object store directly (a PUT, or a multipart upload,
    appears only once complete). A failed write is removed where it can be."""
    target = f"{dest}.{uuid.uuid4().hex[:12]}.partial" if local else dest
    h = hashlib.sha256()
    try:
        with fs.open_output_stream(target, compression=None) as out:
            for chunk in chunks:
                h.update(chunk)
                out.write(chunk)
        if local:
            fs.move(target, dest)
    except BaseException:
        with suppress(Exception):
            fs.delete_file(target)
        raise
    return h.hexdigest()


def publish(bundle: Bundle, to: str, version: str | None) -> Published:
    """Upload `bundle` under `<to>/<model>/<version>/`, skipping what is already there with the same bytes, the
    manifest last; refuse a prefix whose manifest is another version's."""
    from app.storage import ModelRef, filesystem_for

    if _scheme(to) not in ("s3", "gs", "file", ""):
        raise PublishError(f"--to {to}: publish to s3://, gs://, file:// or a directory (https:// is read-only)")
    if not to.strip():
        raise PublishError("--to: empty; a store's base URI or a directory")
    version = version or content_version(bundle)
    manifest = manifest_bytes(bundle, version)
    try:
        if _scheme(to) == "file":
            ModelRef(to)  # file://host/... names another machine's files: refused, not read as /...
        fs, base = filesystem_for(to)
        prefix_uri = f"{display_base(to, base)}/{bundle.model}/{version}"
    except (ValueError, OSError, ImportError) as e:
        raise PublishError(f"--to {to}: {one_line(e)}") from None
    prefix = f"{str(base).rstrip('/')}/{bundle.model}/{version}"
    local = _is_local(fs)
    uploaded: list[str] = []
    skipped: list[str] = []
    current = ""
    try:
        current = prefix_uri
        there = _listing(fs, prefix)
        existing = None
        if MANIFEST in there:
            current = f"{prefix_uri}/{MANIFEST}"
            existing = _read(fs, f"{prefix}/{MANIFEST}")
            if existing != manifest:
                raise PublishError(
                    f"{prefix_uri} holds another version: a published version is never overwritten; publish under "
                    "a new --version"
                )
        if local:
            fs.create_dir(prefix, recursive=True)
        for name, f in sorted(bundle.files.items()):
            current = f"{prefix_uri}/{name}"
            dest = f"{prefix}/{name}"
            info = there.get(name)
            # Under a complete version's manifest (identical to ours) a file of the right size is the one it lists;
            # without one (an interrupted publish) the object's bytes are hashed.
            if (
                info is not None
                and info.size == f.size
                and (existing is not None or _object_sha256(fs, dest) == f.sha256)
            ):
                skipped.append(name)
                continue
            if _write(fs, dest, _chunks(f.path), local) != f.sha256:
                with suppress(Exception):
                    fs.delete_file(dest)
                raise PublishError(f"{f.field}: {f.path} changed while it was being published; publish again")
            uploaded.append(name)
        current = f"{prefix_uri}/{MANIFEST}"
        if existing is None:
            _write(fs, f"{prefix}/{MANIFEST}", [manifest], local)
            uploaded.append(MANIFEST)
        else:
            skipped.append(MANIFEST)
    except OSError as e:
        raise PublishError(f"{current}: {one_line(e)}") from None
    return Published(
        model=bundle.model,
        version=version,
        prefix=prefix_uri + "/",
        uploaded=uploaded,
        skipped=skipped,
        args=args_block(bundle, prefix_uri),
        release=release_block(bundle, prefix_uri),
    )


# --------------------------------------------------------------------------------------------- what to paste


def args_block(bundle: Bundle, prefix_uri: str) -> dict[str, Any]:
    """The keys of the application's args that change: each file's URI and digest (the rest stays as it is)."""
    files = bundle.files
    out: dict[str, Any] = {}
    if bundle.labels is not None:
        labels = files[bundle.labels]
        out["model"] = {"labels_path": f"{prefix_uri}/{labels.name}", "labels_sha256": labels.sha256}
    variants: dict[str, Any] = {}
    for name, file_name in bundle.variants.items():
        f = files[file_name]
        entry: dict[str, Any] = {"model_path": f"{prefix_uri}/{f.name}", "sha256": f.sha256}
        if name in bundle.fallbacks:
            fb = files[bundle.fallbacks[name]]
            entry["fallback"] = {"model_path": f"{prefix_uri}/{fb.name}", "sha256": fb.sha256}
        variants[name] = entry
    out["variants"] = variants
    return out


def release_block(bundle: Bundle, prefix_uri: str) -> dict[str, Any]:
    """Each variant's Classifier user_config pointing at its published file: a release in place, no restart."""
    deployments = []
    for name, file_name in bundle.variants.items():
        f = bundle.files[file_name]
        user_config = {"model_path": f"{prefix_uri}/{f.name}", "sha256": f.sha256}
        if name in bundle.fallbacks:  # the variant's declared fallback, of the same version
            fb = bundle.files[bundle.fallbacks[name]]
            user_config |= {"fallback_model_path": f"{prefix_uri}/{fb.name}", "fallback_sha256": fb.sha256}
        deployments.append({"name": classifier_deployment_name(name), "user_config": user_config})
    return {"deployments": deployments}


def render(pub: Published, bundle: Bundle, config: Path, app: str | None) -> str:
    """The human form: what was uploaded or already there (as YAML comments), then the two config blocks as two YAML
    documents, so the whole output parses as YAML (`yaml.safe_load_all`)."""
    import yaml

    lines = [f"# {pub.model} {pub.version} -> {pub.prefix}"]
    for names, verb in ((pub.uploaded, "uploaded     "), (pub.skipped, "already there")):
        for name in names:
            f = bundle.files.get(name)
            manifest = "(the manifest, written last)" if names is pub.uploaded else "(the manifest)"
            what = f"({f.role}, {f.size:,} bytes)" if f is not None else manifest
            lines.append(f"# {verb}  {name} {what}")
    lines.append(f"# {len(pub.uploaded)} uploaded, {len(pub.skipped)} already there")
    where = f"applications[{app or 0}].args" if not app or app.isdigit() else f"the application {app!r}'s args"
    lines += [
        "#",
        f"# 1. Serve it from the store: merge into {where} of {config} (a redeploy: replicas restart on it)",
        yaml.safe_dump(pub.args, sort_keys=False).rstrip("\n"),
        "---",
        "# 2. Or a release in place: merge into each Classifier deployment's user_config (replicas fetch, check and",
        "#    switch to it live; a failure leaves the old file serving)",
        yaml.safe_dump(pub.release, sort_keys=False).rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"


def run(config: Path, to: str, version: str | None, app: str | None, as_json: bool) -> str:
    """The whole command: read the config, collect and hash its files, publish, and the output to print."""
    try:
        args = read_app_args(config, app)
    except AppFileError as e:
        raise PublishError(str(e)) from None
    bundle = collect(args)
    pub = publish(bundle, to, version)
    if as_json:
        return json.dumps(pub.to_json(), indent=2) + "\n"
    return render(pub, bundle, config, app)
