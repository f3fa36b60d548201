"""app.storage against real servers: moto's S3 (reached through AWS_ENDPOINT_URL_S3 and the standard AWS_* variables)
and an HTTPS server whose CA is trusted through SSL_CERT_FILE (tests.storage_servers). Fetches pinned and unpinned,
every failure as its one line, one download per node for several processes and threads, a download killed half-way,
and eviction around a file another process holds."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.storage import FetchError, ModelCache, ModelRef, open_output
from tests.storage_servers import (
    HTTPSServer,
    S3Server,
    closed_port,
    fetch_in_child,
    flock_waiters,
    hold_in_child,
    make_tls,
    poll_until,
)

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_bytes(size: int = 300_000) -> bytes:
    return os.urandom(size)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def https_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPSServer]:
    base = tmp_path_factory.mktemp("https")
    with HTTPSServer(base / "www", make_tls(base / "tls")) as server:
        yield server


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 server, and this test's environment pointing the AWS SDK at it (as a pod's would point at S3)."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def web(https_server: HTTPSServer, monkeypatch: pytest.MonkeyPatch) -> HTTPSServer:
    """The HTTPS server, its CA trusted through SSL_CERT_FILE for this test."""
    monkeypatch.setenv("SSL_CERT_FILE", str(https_server.tls.ca))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    return https_server


@pytest.fixture
def cache(tmp_path: Path) -> ModelCache:
    return ModelCache(tmp_path / "cache")


def cached_files(cache: ModelCache) -> list[str]:
    return sorted(p.name for p in cache.layout.files.iterdir())


def partial_files(cache: ModelCache) -> list[Path]:
    return [p for p in cache.layout.tmp.iterdir() if p.suffix == ".part"]


# --------------------------------------------------------------------------- S3


def test_a_pinned_s3_ref_is_downloaded_once_then_served_without_asking_the_store(
    s3: S3Server, cache: ModelCache
) -> None:
    data = model_bytes()
    uri = s3.put("models", "pinned/m.onnx", data)
    got = cache.fetch(ModelRef(uri, f"sha256:{digest(data)}"))
    assert (got.downloaded, got.sha256, got.size, got.uri) == (True, digest(data), len(data), uri)
    assert got.path.read_bytes() == data and got.seconds >= 0
    assert s3.count("GET", uri) == 1
    asked = s3.count("HEAD", uri)

    again = cache.fetch(ModelRef(uri, digest(data)))
    assert (again.downloaded, again.path) == (False, got.path)
    assert (s3.count("GET", uri), s3.count("HEAD", uri)) == (1, asked), "a pinned hit asks the store nothing"
    assert cached_files(cache) == [digest(data), f"{digest(data)}.json"] and partial_files(cache) == []


def test_an_unpinned_s3_ref_is_downloaded_again_only_when_the_object_changed(
    s3: S3Server, cache: ModelCache, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "app.storage.cache")
    first = model_bytes()
    uri = s3.put("models", "unpinned/m.onnx", first)
    got = cache.fetch(ModelRef(uri))
    assert (got.downloaded, got.sha256, got.path.read_bytes() == first) == (True, digest(first), True)

    again = cache.fetch(ModelRef(uri))  # same size and modification time: the cached copy
    assert (again.downloaded, again.sha256) == (False, digest(first))
    assert s3.count("GET", uri) == 1

    second = model_bytes(200_000)
    s3.put("models", "unpinned/m.onnx", second)
    changed = cache.fetch(ModelRef(uri))
    assert (changed.downloaded, changed.sha256) == (True, digest(second))
    assert changed.path.read_bytes() == second and got.path.read_bytes() == first, "content addressed: both kept"
    warnings = [r.getMessage() for r in caplog.records if "is not pinned" in r.getMessage()]
    assert warnings == [f"{uri} is not pinned: its bytes are not verified (give the ref a sha256)"]


def test_a_digest_mismatch_keeps_nothing_and_leaves_the_cached_version_alone(s3: S3Server, cache: ModelCache) -> None:
    old = model_bytes()
    uri = s3.put("models", "mismatch/m.onnx", old)
    kept = cache.fetch(ModelRef(uri, digest(old)))
    kept.release()
    new = model_bytes()
    s3.put("models", "mismatch/m.onnx", new)
    wanted = digest(b"what the release manifest says")
    with pytest.raises(FetchError) as e:
        cache.fetch(ModelRef(uri, wanted))
    assert str(e.value) == f"{uri}: sha256 mismatch: expected {wanted}, got {digest(new)} ({len(new):,} bytes)"
    assert "\n" not in str(e.value)
    assert cached_files(cache) == [digest(old), f"{digest(old)}.json"] and partial_files(cache) == []
    assert kept.path.read_bytes() == old
    assert not cache.fetch(ModelRef(uri, digest(old))).downloaded


@pytest.mark.parametrize("uri", ["s3://models/no/such/key.onnx", "s3://no-such-bucket/m.onnx"])
def test_a_missing_s3_object_is_not_found(s3: S3Server, cache: ModelCache, uri: str) -> None:
    s3.put("models", "present.onnx", b"x")
    with pytest.raises(FetchError) as e:
        cache.fetch(ModelRef(uri, digest(b"anything")))
    assert (e.value.uri, e.value.reason) == (uri, "not found")
    assert cached_files(cache) == [] and partial_files(cache) == []


def test_without_credentials_or_permission_s3_refuses_in_one_line(
    s3: S3Server, cache: ModelCache, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = model_bytes(1000)
    uri = s3.put("models", "private/m.onnx", data)
    key_id, secret = s3.user_without_policy(f"nobody-{os.getpid()}")
    with s3.enforcing_auth():
        # No credentials anywhere the SDK looks: it sends the request unsigned and moto answers 403.
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
        with pytest.raises(FetchError) as e:
            cache.fetch(ModelRef(uri, digest(data)))
        assert e.value.reason.startswith("no credentials: ") and str(e.value).startswith(f"{uri}: no credentials: ")

        # Signed, by a user whom no policy allows anything.
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        with pytest.raises(FetchError) as e:
            cache.fetch(ModelRef(uri, digest(data)))
        assert str(e.value) == f"{uri}: access denied"
    assert cached_files(cache) == [] and partial_files(cache) == []


def test_a_publisher_writes_through_the_same_clients(s3: S3Server, cache: ModelCache, tmp_path: Path) -> None:
    data = model_bytes(50_000)
    s3.put("models", "placeholder", b"")  # the bucket
    for uri in ("s3://models/published/m.onnx", (tmp_path / "out" / "dir" / "m.onnx").as_uri()):
        with open_output(uri) as out:
            out.write(data)
        got = cache.fetch(ModelRef(uri, digest(data)))
        assert got.path.read_bytes() == data
    with pytest.raises(ValueError, match="read-only"):
        open_output("https://example.com/m.onnx")


def test_several_processes_starting_at_once_download_once(s3: S3Server, tmp_path: Path) -> None:
    data = model_bytes(1_000_000)
    uri = s3.put("models", "concurrent/m.onnx", data)
    root = tmp_path / "cache"
    lock = ModelCache(root).layout.lock(digest(data))
    go = s3.hold(uri, after=100_000)  # the first download trickles mid-body until all the others wait for it
    results = SPAWN.Queue()
    children = [SPAWN.Process(target=fetch_in_child, args=(str(root), uri, digest(data), results)) for _ in range(4)]
    for child in children:
        child.start()
    try:
        poll_until(lambda: s3.count("GET", uri) == 1 and flock_waiters(lock) == 3, what="one download, three waiting")
    finally:
        go.set()
    outcomes = [results.get(timeout=60) for _ in children]
    for child in children:
        child.join(30)
    assert sorted(outcomes) == [(False, digest(data))] * 3 + [(True, digest(data))]
    assert s3.count("GET", uri) == 1, "one GET of the object for the whole node"
    assert ModelCache(root).fetch(ModelRef(uri, digest(data))).path.read_bytes() == data


def test_eviction_spares_a_file_another_process_holds_and_drops_the_oldest(s3: S3Server, tmp_path: Path) -> None:
    blobs = [model_bytes(100_000) for _ in range(4)]
    uris = [s3.put("models", f"evict/{i}.onnx", b) for i, b in enumerate(blobs)]
    a, b, c, d = (digest(x) for x in blobs)
    root = tmp_path / "cache"
    held, release = SPAWN.Event(), SPAWN.Event()
    holder = SPAWN.Process(target=hold_in_child, args=(str(root), uris[0], a, held, release))
    holder.start()
    try:
        assert held.wait(60)
        cache = ModelCache(root, max_bytes=250_000)
        cache.fetch(ModelRef(uris[1], b)).release()
        assert {e.sha256 for e in cache.entries()} == {a, b}
        cache.fetch(ModelRef(uris[2], c)).release()  # over the limit: a is the oldest but held, so b goes
        assert {e.sha256 for e in cache.entries()} == {a, c}
        with cache.fetch(ModelRef(uris[3], d)):  # c goes; the one just fetched never does
            assert {e.sha256: e.in_use for e in cache.entries()} == {a: True, d: True}
        cache.max_bytes = 0
        assert [e.sha256 for e in cache.evict()] == [d], "a is in use by the other process: kept, over the limit"
        release.set()
        holder.join(30)
        assert [e.sha256 for e in cache.evict()] == [a]
        assert cache.total_bytes() == 0
    finally:
        release.set()
        holder.join(30)


# --------------------------------------------------------------------------- HTTPS


def test_an_https_ref_is_fetched_when_its_ca_is_trusted_through_ssl_cert_file(
    web: HTTPSServer, cache: ModelCache
) -> None:
    data = model_bytes()
    url = web.put("https/m.onnx", data)
    got = cache.fetch(ModelRef(url, digest(data)))
    assert (got.downloaded, got.path.read_bytes() == data) == (True, True)
    unpinned = cache.fetch(ModelRef(url))  # ETag unchanged since: the cached copy
    assert (unpinned.sha256, web.count("GET", url)) == (digest(data), 2)
    assert not cache.fetch(ModelRef(url)).downloaded and web.count("GET", url) == 2


def test_an_https_server_whose_ca_is_not_trusted_is_refused(
    https_server: HTTPSServer, cache: ModelCache, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = https_server.put("untrusted/m.onnx", b"m")
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-bundle.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    with pytest.raises(FetchError) as e:
        cache.fetch(ModelRef(url, digest(b"m")))
    assert e.value.reason.startswith("unreachable: certificate verify failed: "), str(e.value)
    assert cached_files(cache) == [] and partial_files(cache) == []


def test_https_failures_are_one_line(web: HTTPSServer, cache: ModelCache) -> None:
    with pytest.raises(FetchError) as e:
        cache.fetch(ModelRef(f"{web.url}/no/such/m.onnx", digest(b"x")))
    assert e.value.reason == "not found"
    refused = f"https://127.0.0.1:{closed_port()}/m.onnx"
    with pytest.raises(FetchError) as e:
        cache.fetch(ModelRef(refused))
    assert e.value.reason.startswith("unreachable: cannot connect to 127.0.0.1:"), str(e.value)


def test_a_body_cut_short_is_truncated_and_leaves_nothing(web: HTTPSServer, cache: ModelCache) -> None:
    data = model_bytes(2_000_000)
    web.put("cut-me/m.onnx", data)
    url = f"{web.url}/cut/cut-me/m.onnx"  # the same file, its body stopped half-way
    with pytest.raises(FetchError) as e:
        cache.fetch(ModelRef(url, digest(data)))
    assert e.value.reason.startswith("truncated: ") and e.value.reason.endswith(" of 2,000,000 bytes"), str(e.value)
    assert cached_files(cache) == [] and partial_files(cache) == []


def test_a_download_killed_half_way_leaves_no_file_and_the_next_fetch_succeeds(
    web: HTTPSServer, tmp_path: Path
) -> None:
    data = model_bytes(1_000_000)
    url = web.put("killed/m.onnx", data)
    root = tmp_path / "cache"
    cache = ModelCache(root)
    go = web.hold(url, after=200_000)  # a fast first part, then a trickle until the test says
    results = SPAWN.Queue()  # kept referenced until the child has it
    child = SPAWN.Process(target=fetch_in_child, args=(str(root), url, digest(data), results))
    child.start()
    try:
        poll_until(lambda: any(p.stat().st_size > 0 for p in partial_files(cache)), what="a partial download")
        child.kill()
        child.join(30)
    finally:
        go.set()
    assert not (root / "sha256" / digest(data)).exists() and cached_files(cache) == []
    assert len(partial_files(cache)) == 1, "only the temporary file is left"

    got = cache.fetch(ModelRef(url, digest(data)))
    assert got.downloaded and got.path.read_bytes() == data
    assert partial_files(cache) == [], "the dead download's leftover is removed"


def test_two_threads_fetching_one_file_download_it_once(web: HTTPSServer, cache: ModelCache) -> None:
    data = model_bytes(1_000_000)
    url = web.put("threads/m.onnx", data)
    go = web.hold(url, after=100_000)
    outcomes: queue.Queue[Any] = queue.Queue()

    def fetch() -> None:
        try:
            outcomes.put(cache.fetch(ModelRef(url, digest(data))).downloaded)
        except Exception as e:
            outcomes.put(e)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        lock = cache.layout.lock(digest(data))
        poll_until(lambda: web.count("GET", url) == 1 and flock_waiters(lock) == 1, what="one download, one waiting")
    finally:
        go.set()
    for t in threads:
        t.join(60)
    assert sorted(outcomes.get(timeout=1) for _ in threads) == [False, True]
    assert web.count("GET", url) == 1


def test_a_cached_file_of_the_wrong_size_is_fetched_again(web: HTTPSServer, cache: ModelCache) -> None:
    data = model_bytes()
    url = web.put("damaged/m.onnx", data)
    got = cache.fetch(ModelRef(url, digest(data)))
    got.release()
    got.path.write_bytes(data[:1000])  # damaged on disk: the size no longer matches the record
    again = cache.fetch(ModelRef(url, digest(data)))
    assert again.downloaded and again.path.read_bytes() == data


def test_a_command_on_a_node_reads_remote_files_from_its_cache(s3: S3Server, tmp_path: Path) -> None:
    """`app.runtime.model_files.fetched_here` (the plan and build-engines commands, the batch driver's transform):
    every remote file of the args fetched once into the node's cache and named by its path there; local files as
    they were."""
    from app.config import AppArgs
    from app.runtime.model_files import fetched_here

    data, labels = b"an int8 model's bytes", b"cat\ndog\n"
    model_uri = s3.put("node-cmd", "m/v1/m-int8.onnx", data)
    labels_uri = s3.put("node-cmd", "m/v1/labels.txt", labels)
    local = tmp_path / "m-fp32.onnx"
    local.write_bytes(b"fp32")
    args = AppArgs.model_validate(
        {
            "model": {"name": "m", "labels_path": labels_uri},
            "variants": {
                "int8": {"model_path": model_uri, "sha256": hashlib.sha256(data).hexdigest(), "precision": "int8"},
                "fp32": {"model_path": str(local)},
            },
            "model_cache": {"dir": str(tmp_path / "cache")},
        }
    )
    assert [f for f, _ in args.model_files()] == ["variants.fp32.model_path"]  # the remote one has no path yet
    here = fetched_here(args)
    assert Path(here.variants["int8"].model_path).read_bytes() == data
    assert Path(here.variants["int8"].model_path).is_relative_to(tmp_path / "cache")
    assert Path(here.model.labels_path or "").read_bytes() == labels
    assert here.variants["fp32"].model_path == str(local)
    assert [f for f, _ in here.model_files()] == ["variants.fp32.model_path", "variants.int8.model_path"]
    assert fetched_here(here) is here  # nothing remote left: nothing to do
    fetched_here(args)
    assert s3.count("GET", model_uri) == 1  # the second command found it in the node's cache
