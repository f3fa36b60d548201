"""`score`'s Parquet writer (app/batch/output.py), pure: no Ray."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.batch.output import PartWriter, file_batches, read_output

SCHEMA = pa.schema([("path", pa.string()), ("n", pa.int64())])


def rows(start: int, count: int) -> pa.Table:
    return pa.table({"path": [f"p{i}" for i in range(start, start + count)], "n": list(range(start, start + count))})


def test_rows_are_written_in_groups_into_files_of_bounded_size_in_their_order(tmp_path: Path) -> None:
    out = tmp_path / "scores"  # made by the writer
    with PartWriter(str(out), SCHEMA, group_rows=10, file_rows=25) as w:
        for start in range(0, 61, 7):  # blocks of 7 rows, the last of 5: 61 rows
            w.write(rows(start, min(7, 61 - start)))
    assert w.rows == 61
    assert [Path(f).name for f in w.files] == [f"{w.run}-{i:05d}.parquet" for i in range(3)]
    sizes = [pq.ParquetFile(f).metadata.num_rows for f in w.files]
    assert sizes == [25, 25, 11]
    # Row groups hold what was buffered when it reached group_rows (14 rows of two blocks, ...), split at file ends.
    assert all(pq.ParquetFile(f).metadata.num_row_groups >= 1 for f in w.files)
    table = read_output(str(out), ["n"])
    assert sorted(table.column("n").to_pylist()) == list(range(61))
    assert sum(b.num_rows for b in file_batches(w.fs, w.files, ["path"])) == 61


def test_a_second_run_adds_its_files_beside_the_first_and_reads_back_only_its_own(tmp_path: Path) -> None:
    with PartWriter(str(tmp_path), SCHEMA) as first:
        first.write(rows(0, 3))
    with PartWriter(str(tmp_path), SCHEMA) as second:
        second.write(rows(100, 2))
    assert first.run != second.run and len(list(tmp_path.iterdir())) == 2
    assert read_output(str(tmp_path), ["n"]).num_rows == 5
    assert [b.num_rows for b in file_batches(second.fs, second.files, ["n"])] == [2]


def test_a_failed_run_leaves_readable_files_and_writes_nothing_after_the_failure(tmp_path: Path) -> None:
    def blocks() -> Iterator[pa.Table]:
        yield rows(0, 4)
        yield rows(4, 4)
        raise RuntimeError("an actor died")

    with pytest.raises(RuntimeError, match="actor died"), PartWriter(str(tmp_path), SCHEMA, group_rows=4) as w:
        w.write_all(blocks())
    assert pq.read_table(w.files[0]).column("n").to_pylist() == list(range(8))


def test_a_block_not_of_the_schema_is_refused_before_a_file_is_opened(tmp_path: Path) -> None:
    w = PartWriter(str(tmp_path), SCHEMA, group_rows=1)
    with pytest.raises(ValueError, match="field names"):
        w.write(pa.table({"other": [1]}))
    assert w.files == [] and list(tmp_path.iterdir()) == []
