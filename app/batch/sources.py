"""Where the images are: a directory tree (recursive, image suffixes only) or a Parquet/CSV file with a `path` column,
on any filesystem pyarrow reaches (local paths, s3://, gs://, hdfs://, ...). Only the paths are listed here; the bytes
are read in the decode tasks (`app.batch.decoding`)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from app.imaging.probe import IMAGE_SUFFIXES

LIST_SUFFIXES = (".parquet", ".csv")


@dataclass(frozen=True)
class Listed:
    """The images of an input: their URIs (as the decode tasks open them) and each one's class folder (None: the
    image sits at the top of the tree, or the input is a list)."""

    paths: list[str]
    folders: list[str | None]

    def table(self) -> pa.Table:
        return pa.table({"path": pa.array(self.paths, pa.string())})


def _uri(fs: pa_fs.FileSystem, path: str, scheme: str) -> str:
    return path if isinstance(fs, pa_fs.LocalFileSystem) or not scheme else f"{scheme}://{path}"


def filesystem(uri: str) -> tuple[pa_fs.FileSystem, str]:
    """The filesystem of `uri` and the path on it; a plain path is a local one (relative: to the working directory)."""
    if "://" in uri:
        return pa_fs.FileSystem.from_uri(uri)
    return pa_fs.LocalFileSystem(), str(Path(uri).absolute())


def list_images(uri: str) -> Listed:
    """The images under `uri` (a directory, recursively, sorted) or named by the `path` column of a Parquet or CSV
    file; relative paths in a list are taken from the list's own directory. FileNotFoundError when there is none."""
    fs, root = filesystem(uri)
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    info = fs.get_file_info(root)
    if info.type == pa_fs.FileType.Directory:
        return _tree(fs, root, scheme, uri)
    if info.type == pa_fs.FileType.File and root.lower().endswith(LIST_SUFFIXES):
        return _listed(fs, root, scheme)
    if info.type == pa_fs.FileType.NotFound:
        raise FileNotFoundError(f"{uri}: no such directory or file")
    raise FileNotFoundError(f"{uri}: neither a directory nor a list of paths ({', '.join(LIST_SUFFIXES)})")


def _tree(fs: pa_fs.FileSystem, root: str, scheme: str, uri: str) -> Listed:
    found = fs.get_file_info(pa_fs.FileSelector(root, recursive=True))
    files = sorted(
        f.path
        for f in found
        if f.type == pa_fs.FileType.File and posixpath.splitext(f.path)[1].lower() in IMAGE_SUFFIXES
    )
    if not files:
        raise FileNotFoundError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) under {uri}")
    base = root.rstrip("/") + "/"
    folders = []
    for path in files:
        parts = path[len(base) :].split("/") if path.startswith(base) else [path]
        folders.append(parts[0] if len(parts) > 1 else None)
    return Listed([_uri(fs, p, scheme) for p in files], folders)


def _listed(fs: pa_fs.FileSystem, path: str, scheme: str) -> Listed:
    with fs.open_input_file(path) as f:
        table = pq.read_table(f) if path.lower().endswith(".parquet") else pa_csv.read_csv(f)
    if "path" not in table.column_names:
        raise ValueError(f"{path}: no `path` column (has {', '.join(table.column_names)})")
    here = posixpath.dirname(path)
    paths = []
    for p in table.column("path").to_pylist():
        if p is None or not str(p).strip():
            continue
        p = str(p)
        absolute = "://" in p or p.startswith("/") or (len(p) > 1 and p[1] == ":")
        paths.append(p if absolute else _uri(fs, posixpath.join(here, p), scheme))
    if not paths:
        raise FileNotFoundError(f"{path}: its `path` column names no file")
    return Listed(paths, [None] * len(paths))
