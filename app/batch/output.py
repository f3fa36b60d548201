"""`score`'s Parquet under --output, written by the driver as the scored blocks stream in, and read back.

The rows are small (~1 KB an image and variant, most of it the declaration; an actor's scored batch of 32 images is ~32
KB, which Ray passes inline, not through the shared object store), so one writer on the driver keeps up with any pool:
writing costs ~1.4 CPU-us a row here (docs/batch.md "Output"). Ray Data's `write_parquet` would instead run a write task
per file, and on a busy node such a task borrows the decode worker, the next decode task starts a new worker process
(~100 MiB, a second of imports), and Ray stops the borrowed one once it idles: a process started for every file
(docs/batch.md "Measured"). Files are named `<run>-<part>.parquet` (the run: a fresh id), so a second run into the same
directory adds its files beside the first's, as `write_parquet`'s default mode does."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from types import TracebackType

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from app.batch.sources import filesystem

# Rows per row group (the writer's buffer: ~2 MB) and per file (a few hundred MB uncompressed at most).
GROUP_ROWS = 2048
FILE_ROWS = 262_144


class PartWriter:
    """Tables in, Parquet files of at most `file_rows` rows out, in row groups of at least `group_rows` (the last may
    be smaller); nothing is buffered beyond one row group."""

    def __init__(
        self, output: str, schema: pa.Schema, group_rows: int = GROUP_ROWS, file_rows: int = FILE_ROWS
    ) -> None:
        self.fs, self.root = filesystem(output)
        self.fs.create_dir(self.root, recursive=True)
        self.schema, self.group_rows, self.file_rows = schema, group_rows, file_rows
        self.run = uuid.uuid4().hex[:12]
        self.files: list[str] = []
        self.rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._in_file = 0

    def write(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= self.group_rows:
            self._flush()

    def write_all(self, tables: Iterable[pa.Table]) -> PartWriter:
        for t in tables:
            self.write(t)
        return self

    def _flush(self) -> None:
        if not self._pending_rows:
            return
        table = pa.concat_tables(self._pending).cast(self.schema)
        self._pending, self._pending_rows = [], 0
        start = 0
        while start < table.num_rows:
            if self._writer is None:
                path = f"{self.root.rstrip('/')}/{self.run}-{len(self.files):05d}.parquet"
                self._writer = pq.ParquetWriter(path, self.schema, filesystem=self.fs)
                self.files.append(path)
                self._in_file = 0
            take = min(table.num_rows - start, self.file_rows - self._in_file)
            self._writer.write_table(table.slice(start, take))
            start, self._in_file, self.rows = start + take, self._in_file + take, self.rows + take
            if self._in_file >= self.file_rows:
                self._close_file()

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        self._flush()
        self._close_file()

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:  # a failed job: the file being written is closed (readable, its rows so far), nothing more flushed
            self._close_file()


def read_output(output: str, columns: list[str]) -> pa.Table:
    """The Parquet under `output` (every run's files), those columns."""
    fs, path = filesystem(output)
    return pq.read_table(path, filesystem=fs, columns=columns)


def file_batches(fs: pa_fs.FileSystem, files: list[str], columns: list[str]) -> Iterable[pa.RecordBatch]:
    """`files` on `fs` (a PartWriter's), a record batch at a time (memory does not grow with them)."""
    return pads.dataset(files, filesystem=fs, format="parquet").to_batches(columns=columns)
