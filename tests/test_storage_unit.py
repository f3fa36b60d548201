"""app.storage without servers: refs and pins, the cache's layout, local refs, eviction order, in-use holds through
flock (held by another process too), stale temporary files, and the one-line reasons of client errors."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import pickle
import threading
from pathlib import Path

import pytest

from app.storage import CachedFile, FetchError, ModelCache, ModelRef, filesystem_for, parse_sha256, sha256_file
from app.storage.failures import reason
from app.storage.layout import Layout, Record
from app.storage.locks import acquire, try_acquire
from tests.storage_servers import flock_waiters, hold_lock_in_child, poll_until

SPAWN = multiprocessing.get_context("spawn")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- refs and pins


def test_a_pin_is_normalised_and_validated() -> None:
    d = digest(b"x")
    assert parse_sha256(d) == d
    assert parse_sha256(f"sha256:{d.upper()}") == d
    assert parse_sha256(f"  SHA256:{d}  ") == d
    assert parse_sha256(None) is None
    for bad in ("", "abc", d[:-1], d + "0", "md5:" + d, d[:-1] + "g"):
        with pytest.raises(ValueError, match=r"^sha256: expected 64 hex digits"):
            parse_sha256(bad)
    assert ModelRef("s3://b/k", f"sha256:{d}").sha256 == d
    with pytest.raises(ValueError, match="sha256: expected 64 hex digits"):
        ModelRef("s3://b/k", "nope")


def test_a_ref_says_whether_it_is_remote_and_where_a_local_one_is() -> None:
    for uri in ("s3://bucket/v3/m.onnx", "gs://bucket/m.onnx", "https://models.example.com/m.onnx"):
        ref = ModelRef(uri)
        assert ref.remote
        with pytest.raises(ValueError, match="remote"):
            ref.local_path()
    assert not ModelRef("file:///srv/models/m%20v3.onnx").remote
    assert ModelRef("file:///srv/models/m%20v3.onnx").local_path() == Path("/srv/models/m v3.onnx")
    assert ModelRef("file://localhost/srv/m.onnx").local_path() == Path("/srv/m.onnx")
    assert ModelRef("models/m.onnx").local_path() == Path("models/m.onnx")
    assert ModelRef("/abs/m.onnx").local_path() == Path("/abs/m.onnx")


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("http://host/m.onnx", "unsupported scheme 'http'"),
        ("ftp://host/m.onnx", "unsupported scheme"),
        ("s3://bucket", "expected s3://bucket/path"),
        ("s3://bucket/", "expected s3://bucket/path"),
        ("https:///m.onnx", "expected https://host/path"),
        ("file://otherhost/m.onnx", "this node's files"),
        ("", "non-empty"),
        (" s3://b/k", "surrounding spaces"),
    ],
)
def test_a_malformed_ref_is_refused(uri: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelRef(uri)


def test_filesystem_for_names_the_client_and_the_path() -> None:
    import pyarrow.fs as pafs
    from fsspec.implementations.http import HTTPFileSystem

    fs, path = filesystem_for("file:///srv/m%20v3.onnx")
    assert isinstance(fs, pafs.LocalFileSystem) and path == "/srv/m v3.onnx"
    fs, path = filesystem_for("relative/m.onnx")
    assert isinstance(fs, pafs.LocalFileSystem) and path == os.path.abspath("relative/m.onnx")
    fs, path = filesystem_for("https://example.com/m.onnx")
    assert isinstance(fs, HTTPFileSystem) and path == "https://example.com/m.onnx"
    with pytest.raises(ValueError, match="no client"):
        filesystem_for("ftp://example.com/m.onnx")


def test_sha256_file_reads_in_chunks(tmp_path: Path) -> None:
    data = os.urandom((1 << 20) * 2 + 123)
    (tmp_path / "m").write_bytes(data)
    assert sha256_file(tmp_path / "m") == digest(data)


# --------------------------------------------------------------------------- local refs


def test_a_local_file_is_used_in_place_and_hashed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.storage.cache as cache_module

    data = os.urandom(1000)
    model = tmp_path / "m.onnx"
    model.write_bytes(data)
    cache = ModelCache(tmp_path / "cache")
    hashed: list[Path] = []

    def counted(path: Path) -> str:
        hashed.append(Path(path))
        return sha256_file(path)

    monkeypatch.setattr(cache_module, "sha256_file", counted)

    for ref in (ModelRef(str(model)), ModelRef(model.as_uri(), digest(data)), ModelRef(str(model), digest(data))):
        got = cache.fetch(ref)
        assert (got.path, got.sha256, got.size, got.downloaded) == (ref.local_path(), digest(data), 1000, False)
        got.release()
    assert hashed == [model], "remembered by (size, mtime, ctime, inode): hashed once"
    assert list((tmp_path / "cache" / "sha256").iterdir()) == [], "a local file is not copied"

    changed = os.urandom(1000)  # same size, new bytes
    model.write_bytes(changed)
    assert cache.fetch(ModelRef(str(model))).sha256 == digest(changed)
    assert len(hashed) == 2


def test_a_local_file_that_differs_from_its_pin_or_is_missing_fails(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"abc" * 1000)
    cache = ModelCache(tmp_path / "cache")
    with pytest.raises(FetchError) as e:
        cache.fetch(ModelRef(str(model), "0" * 64))
    assert str(e.value) == f"{model}: sha256 mismatch: expected {'0' * 64}, got {digest(b'abc' * 1000)} (3,000 bytes)"
    with pytest.raises(FetchError) as e:
        cache.fetch(ModelRef((tmp_path / "nope.onnx").as_uri()))
    assert (e.value.uri, e.value.reason) == ((tmp_path / "nope.onnx").as_uri(), "not found")
    with pytest.raises(FetchError, match="not a file"):
        cache.fetch(ModelRef(str(tmp_path)))


# --------------------------------------------------------------------------- layout, eviction, holds


def put_entry(layout: Layout, data: bytes, uri: str, last_used: float) -> str:
    """A cached file as a download leaves it (through the same install step)."""
    d = digest(data)
    tmp = layout.new_temp(d)
    tmp.write_bytes(data)
    layout.install(tmp, Record(d, len(data), [uri], last_used))
    return d


def test_the_layout_is_content_addressed_and_a_wrong_size_is_a_miss(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path)
    d = put_entry(cache.layout, b"x" * 100, "s3://b/m", 1.0)
    assert (tmp_path / "sha256" / d).read_bytes() == b"x" * 100
    assert (tmp_path / "sha256" / f"{d}.json").is_file()
    assert not list((tmp_path / "tmp").iterdir())
    [entry] = cache.entries()
    assert entry.as_dict() == {"sha256": d, "size": 100, "uri": "s3://b/m", "last_used": 1.0, "in_use": False}

    (tmp_path / "sha256" / d).write_bytes(b"x" * 99)  # a damaged copy: treated as absent, fetched again
    assert cache.layout.present(d) is None and cache.entries() == []
    (tmp_path / "sha256" / d).write_bytes(b"x" * 100)
    (tmp_path / "sha256" / f"{d}.json").unlink()  # a rename whose record a crash lost: absent too
    assert cache.layout.present(d) is None and cache.entries() == []


def test_eviction_removes_the_least_recently_used_first_and_never_a_held_file(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, max_bytes=250)
    a, b, c, d = (put_entry(cache.layout, bytes([i]) * 100, f"s3://b/{i}", float(i)) for i in range(4))
    assert cache.total_bytes() == 400
    assert [e.sha256 for e in cache.entries()] == [d, c, b, a], "newest first"

    with acquire(cache.layout.use(a), shared=True):  # the oldest, in use by this process
        assert [e.sha256 for e in cache.entries() if e.in_use] == [a]
        removed = cache.evict()
        assert [e.sha256 for e in removed] == [b, c], "oldest first, the held one skipped"
        assert {e.sha256 for e in cache.entries()} == {a, d} and cache.total_bytes() == 200

        cache.max_bytes = 0
        assert [e.sha256 for e in cache.evict()] == [d]
        assert [e.sha256 for e in cache.entries()] == [a], "everything left is in use: over the limit, kept"
    assert [e.sha256 for e in cache.evict()] == [a]
    assert cache.total_bytes() == 0 and cache.entries() == []
    assert list((tmp_path / "locks").iterdir()) == [], "the lock files of evicted files go too"


def test_room_for_a_download_is_made_before_it_starts(tmp_path: Path) -> None:
    """The volume under the cache may be no larger than its limit: a download first evicts what it will need."""
    from app.storage import eviction

    cache = ModelCache(tmp_path, max_bytes=250)
    a, b = (put_entry(cache.layout, bytes([i]) * 100, f"s3://b/{i}", float(i)) for i in range(2))
    assert eviction.evict(cache.layout, 250, None, room=50) == []  # 200 + 50 fit
    assert [e.sha256 for e in eviction.evict(cache.layout, 250, None, room=100)] == [a]  # 300 do not: the oldest goes
    assert [e.sha256 for e in cache.entries()] == [b]


def test_a_hold_by_another_process_is_seen_and_dies_with_it(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, max_bytes=0)
    d = put_entry(cache.layout, b"m" * 10, "s3://b/m", 1.0)
    held, release = SPAWN.Event(), SPAWN.Event()  # `release` is never set: the child is killed waiting on it
    child = SPAWN.Process(target=hold_lock_in_child, args=(str(cache.layout.use(d)), True, held, release))
    child.start()
    try:
        assert held.wait(30)
        assert [e.in_use for e in cache.entries()] == [True]
        assert cache.evict() == [] and cache.layout.present(d) is not None
    finally:
        child.kill()  # a crash: the kernel drops its lock
        child.join(30)
    assert [e.in_use for e in cache.entries()] == [False]
    assert [e.sha256 for e in cache.evict()] == [d]


def test_a_cached_file_release_is_idempotent_and_a_context_manager(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path)
    d = put_entry(cache.layout, b"m", "s3://b/m", 1.0)
    got = cache.fetch(ModelRef("s3://b/m", d))  # pinned and cached: no store is asked
    assert not got.downloaded and got.path == tmp_path / "sha256" / d
    assert cache.entries()[0].in_use and cache.entries()[0].last_used > 1.0
    got.release()
    got.release()
    assert not cache.entries()[0].in_use
    with cache.fetch(ModelRef("s3://other/copy", d)) as again:
        assert isinstance(again, CachedFile) and cache.entries()[0].in_use
        assert cache.entries()[0].uri == "s3://other/copy", "the latest URI it was fetched as"
    assert not cache.entries()[0].in_use


def test_a_lock_file_removed_while_waited_on_is_taken_afresh(tmp_path: Path) -> None:
    path = tmp_path / "k.lock"
    first = acquire(path)
    got: list[int] = []

    def wait_for_it() -> None:
        with acquire(path) as lock:
            got.append(os.fstat(lock._fd).st_ino)

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    poll_until(lambda: flock_waiters(path) == 1, what="the thread waiting on the lock")
    first.remove()  # as eviction does: unlink, then release
    waiter.join(30)
    assert got == [path.stat().st_ino], "the waiter holds the lock the path names now, not the removed one"
    assert try_acquire(path) is not None


def test_stale_partial_downloads_are_removed_unless_their_download_lock_is_held(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path)
    layout = cache.layout
    dead, alive = layout.new_temp("a" * 64), layout.new_temp("b" * 64)
    dead.write_bytes(b"partial")
    alive.write_bytes(b"partial")
    with acquire(layout.lock("b" * 64)):  # a download in progress (another thread's descriptor: it conflicts)
        assert layout.clean_temp() == [dead]
    assert alive.exists() and not dead.exists()
    cache.evict()
    assert list(layout.tmp.iterdir()) == []


# --------------------------------------------------------------------------- errors


def test_a_fetch_error_is_one_line_and_survives_pickling() -> None:
    e = FetchError("s3://models/v3/m.onnx", "not found")
    assert str(e) == "s3://models/v3/m.onnx: not found"
    again = pickle.loads(pickle.dumps(e))
    assert (type(again), again.uri, again.reason, str(again)) == (FetchError, e.uri, e.reason, str(e))


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (FileNotFoundError("[Errno 2] Path does not exist 'models/v3/nope'. Detail: [errno 2]"), "not found"),
        (
            OSError(
                "When reading information for key 'v3/m.onnx' in bucket 'models': AWS Error NETWORK_CONNECTION during"
                " HeadObject operation: curlCode: 7, Could not connect to server; Details: Failed to connect\nmore"
            ),
            "unreachable: Could not connect to server",
        ),
        (
            OSError("AWS Error INVALID_ACCESS_KEY_ID during GetObject operation: x"),
            "access denied: invalid access key id",
        ),
        (OSError("AWS Error NO_SUCH_BUCKET during HeadObject operation"), "not found"),
        (OSError("google::cloud::Status(PERMISSION_DENIED: caller lacks storage.objects.get)"), "access denied"),
        (OSError("google::cloud::Status(UNAUTHENTICATED: no token)"), "no credentials: not authenticated"),
        (OSError("google::cloud::Status(UNAVAILABLE: connect failed)"), "unreachable: unavailable"),
        (PermissionError(13, "Permission denied"), "access denied"),
        (ValueError("line one\nline two"), "ValueError: line one"),
        (RuntimeError("x" * 500), "RuntimeError: " + "x" * 159 + "…"),
    ],
)
def test_client_errors_become_short_reasons(error: Exception, expected: str) -> None:
    assert reason(error) == expected


def test_access_denied_without_any_credential_source_says_no_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    denied = OSError("When getting information for key 'k' in bucket 'b': AWS Error ACCESS_DENIED during HeadObject")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert reason(denied).startswith("no credentials: ")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")  # instance metadata may have given some: no telling
    assert reason(denied) == "access denied"
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA...")
    assert reason(denied) == "access denied"


def test_an_unpinned_remote_ref_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = ModelCache(tmp_path)
    caplog.set_level(logging.WARNING, "app.storage.cache")
    for _ in range(2):
        cache._warn_unpinned("s3://b/m")
    assert [r.getMessage() for r in caplog.records].count(
        "s3://b/m is not pinned: its bytes are not verified (give the ref a sha256)"
    ) == 1


def test_storage_imports_nothing_else_of_the_app_nor_ray() -> None:
    import ast

    root = Path(__file__).resolve().parent.parent / "app" / "storage"
    imported = set()
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    assert {m for m in imported if m.split(".")[0] in ("app", "ray") and not m.startswith("app.storage")} == set()
