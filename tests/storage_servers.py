"""Real servers for the object-storage tests: an S3 (moto's server) and an HTTPS file server with its own CA.

The code under test reaches them only as it would reach the real thing: S3 through the standard AWS_* variables
(AWS_ENDPOINT_URL_S3 and keys), HTTPS through a CA trusted via SSL_CERT_FILE. Both count the requests they answer and
can slow a GET to a trickle part-way through its body until the test lets it go (a download in flight for as long as
the test needs, without sleeps); the HTTPS server also serves any file cut off half-way (under /cut/). What the
tests' spawned processes run is here too (a child must be able to import what it runs).
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import os
import re
import socket
import ssl
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from app.storage import ModelCache, ModelRef

HOLD_LIMIT_S = 60.0  # a held response goes on by itself after this, so that a failed test never hangs a server


def poll_until(predicate: Callable[[], Any], timeout_s: float = 30.0, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy; fail at the deadline (no sleep stands in for an event)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}: last={last!r}")


def flock_waiters(path: Path) -> int:
    """How many flock requests wait on the lock file at `path` (the kernel's /proc/locks, `->` lines)."""
    try:
        inode = os.stat(path).st_ino
    except FileNotFoundError:
        return 0
    pattern = re.compile(rf"^\d+: +-> FLOCK .* [0-9a-f]+:[0-9a-f]+:{inode} ", re.M)  # nested: one more space each
    return len(pattern.findall(Path("/proc/locks").read_text()))


@dataclass
class Hold:
    """A GET to slow down: after `after` bytes of its body, a trickle (`step` bytes each `every` seconds, enough to
    keep a client's low-speed timeout at bay) until `go` is set, then the rest at once."""

    after: int
    go: threading.Event
    step: int = 1024
    every: float = 0.1

    def pieces(self, body: bytes) -> Iterator[bytes]:
        yield body[: self.after]
        sent = self.after
        deadline = time.monotonic() + HOLD_LIMIT_S
        while sent < len(body) and not self.go.wait(self.every) and time.monotonic() < deadline:
            yield body[sent : sent + self.step]
            sent += self.step
        yield body[sent:]


# --------------------------------------------------------------------------- S3: moto's server


class _Counting:
    """WSGI middleware around moto's app: counts (method, path) and holds the GETs it is told to."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: Counter[tuple[str, str]] = Counter()
        self.holds: dict[str, Hold] = {}
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        with self.lock:
            self.requests[(method, path)] += 1
            hold = self.holds.pop(path, None) if method == "GET" else None
        body = self.app(environ, start_response)
        return body if hold is None else _held(body, hold)


def _held(body: Iterable[bytes], hold: Hold) -> Iterator[bytes]:
    try:
        yield from hold.pieces(b"".join(body))
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()


class S3Server:
    """moto's S3 (and IAM) in a thread of this process, on a free port."""

    region = "us-east-1"

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        class Quiet(MotoRequestHandler):
            def log(self, *args: Any, **kwargs: Any) -> None:
                pass

        self.app = _Counting(DomainDispatcherApplication(create_backend_app))
        self.server = make_server("127.0.0.1", 0, self.app, threaded=True, request_handler=Quiet)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="moto-s3", daemon=True)

    def __enter__(self) -> S3Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.thread.join()
        self.server.server_close()

    def env(self) -> dict[str, str]:
        """The standard variables that point an AWS SDK (pyarrow's included) at this server, never at AWS."""
        return {
            "AWS_ENDPOINT_URL_S3": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, service: str = "s3") -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Store an object (making the bucket if needed); its s3:// URI."""
        s3 = self.client()
        if bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
            s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def count(self, method: str, uri: str) -> int:
        """How many `method` requests this server answered for the object of an s3:// URI (path-style)."""
        parts = urlsplit(uri)
        with self.app.lock:
            return self.app.requests[(method, f"/{parts.netloc}{parts.path}")]

    def hold(self, uri: str, after: int) -> threading.Event:
        """Slow the next GET of `uri` to a trickle after `after` bytes until the returned event is set."""
        parts = urlsplit(uri)
        go = threading.Event()
        with self.app.lock:
            self.app.holds[f"/{parts.netloc}{parts.path}"] = Hold(after, go)
        return go

    def _moto_api(self, path: str, body: bytes) -> None:
        request = urllib.request.Request(
            self.url + path, data=body, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()

    @contextmanager
    def enforcing_auth(self) -> Iterator[None]:
        """moto checks signatures and IAM policies in the block (it takes any request otherwise)."""
        self._moto_api("/moto-api/reset-auth", b"0")
        try:
            yield
        finally:
            self._moto_api("/moto-api/reset-auth", b"inf")

    def user_without_policy(self, name: str) -> tuple[str, str]:
        """An IAM user with keys and no permission at all: (access key id, secret)."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]


# --------------------------------------------------------------------------- HTTPS: a CA of its own


@dataclass(frozen=True)
class TLSFiles:
    ca: Path  # the CA's certificate (what SSL_CERT_FILE names)
    cert: Path  # the server's chain
    key: Path


def make_tls(directory: Path) -> TLSFiles:
    """A CA and a certificate it signs for localhost and 127.0.0.1 (EC keys: quick to make)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "storage tests CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    usage = {k: False for k in ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement")}
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
                **usage,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    files = TLSFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


class _FileHandler(http.server.BaseHTTPRequestHandler):
    """GET and HEAD of the server's directory, with Content-Length, ETag, Last-Modified and single Ranges; under
    /cut/ a file's body stops half-way and the connection closes."""

    protocol_version = "HTTP/1.1"
    server: _TLSServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        owner = self.server.owner
        path = urlsplit(self.path).path
        cut = path.startswith("/cut/")
        name = path.removeprefix("/cut") if cut else path
        with owner.lock:
            owner.requests[(self.command, path)] += 1
            hold = owner.holds.pop(path, None) if body else None
        file = owner.root / unquote(name).lstrip("/")
        if not file.is_file():
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data, st = file.read_bytes(), file.stat()
        start, end = 0, len(data)
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match:
            start, end = int(match[1]), min(len(data), int(match[2]) + 1 if match[2] else len(data))
        self.send_response(206 if match else 200)
        self.send_header("Content-Length", str(end - start))
        if match:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{st.st_mtime_ns:x}-{st.st_size:x}"')
        self.send_header("Last-Modified", formatdate(st.st_mtime, usegmt=True))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if not body:
            return
        payload = data[start:end]
        try:
            if cut:
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            for piece in hold.pieces(payload) if hold is not None else [payload]:
                self.wfile.write(piece)
                self.wfile.flush()
        except (ConnectionError, ssl.SSLError, OSError):
            self.close_connection = True  # the client went (killed, or gave up): nothing to answer


class _TLSServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: HTTPSServer, context: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), _FileHandler)
        self.owner, self.context = owner, context

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            tls = self.context.wrap_socket(request, server_side=True)  # the handshake, in this request's thread
        except (ssl.SSLError, OSError):
            return  # a client that does not trust us hangs up during the handshake
        try:
            _FileHandler(tls, client_address, self)
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        finally:
            tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class HTTPSServer:
    """Serves the files of `root` over HTTPS (a certificate from `tls`), in a thread of this process."""

    def __init__(self, root: Path, tls: TLSFiles) -> None:
        self.root, self.tls = root, tls
        self.requests: Counter[tuple[str, str]] = Counter()
        self.holds: dict[str, Hold] = {}
        self.lock = threading.Lock()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert, tls.key)
        self.server = _TLSServer(self, context)
        self.url = f"https://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="https-files", daemon=True)

    def __enter__(self) -> HTTPSServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            for hold in self.holds.values():
                hold.go.set()
        self.server.shutdown()
        self.thread.join()
        self.server.server_close()

    def put(self, name: str, data: bytes) -> str:
        """Serve `data` as `name`; its https:// URL."""
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return f"{self.url}/{name}"

    def count(self, method: str, url: str) -> int:
        with self.lock:
            return self.requests[(method, urlsplit(url).path)]

    def hold(self, url: str, after: int) -> threading.Event:
        """Slow the next GET of `url` to a trickle after `after` bytes until the returned event is set."""
        go = threading.Event()
        with self.lock:
            self.holds[urlsplit(url).path] = Hold(after, go)
        return go


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --------------------------------------------------------------------------- what spawned processes run


def fetch_in_child(root: str, uri: str, sha256: str | None, results: Any) -> None:
    """Fetch a ref into the cache at `root` and report (downloaded, sha256) or ("error", message)."""
    try:
        got = ModelCache(root).fetch(ModelRef(uri, sha256))
        results.put((got.downloaded, got.sha256))
    except Exception as e:
        results.put(("error", str(e)))


def hold_in_child(root: str, uri: str, sha256: str | None, held: Any, release: Any) -> None:
    """Fetch a ref, say so through `held`, and keep the file in use until `release` is set."""
    with ModelCache(root).fetch(ModelRef(uri, sha256)):
        held.set()
        release.wait(HOLD_LIMIT_S)


def hold_lock_in_child(path: str, shared: bool, held: Any, release: Any) -> None:
    """Hold a flock on `path` (as a process using a cached file does) until `release` is set."""
    from app.storage.locks import acquire

    with acquire(Path(path), shared=shared):
        held.set()
        release.wait(HOLD_LIMIT_S)
