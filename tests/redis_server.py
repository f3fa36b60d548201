"""A real `redis-server` (Debian's package; .ci/run installs it) on a free loopback port, with a password and no
persistence, for the cluster whose GCS keeps its tables in it (GCS fault tolerance)."""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import wait_until


@dataclass(frozen=True)
class Redis:
    address: str  # host:port, as RAY_REDIS_ADDRESS takes it
    password: str
    pid: int

    def ping(self) -> bool:
        """AUTH + PING over the wire protocol: True once the server answers both."""
        host, port = self.address.split(":")
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
            got = b""
            while b"PONG" not in got and len(got) < 256:
                if not (chunk := s.recv(256)):
                    break
                got += chunk
        return got.startswith(b"+OK") and b"+PONG" in got

    def keys(self) -> int:
        """How many keys the server holds (DBSIZE)."""
        host, port = self.address.split(":")
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.sendall(f"AUTH {self.password}\r\nDBSIZE\r\n".encode())
            got = b""
            while got.count(b"\r\n") < 2:
                if not (chunk := s.recv(256)):
                    break
                got += chunk
        return int(got.split(b"\r\n")[1].lstrip(b":"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def redis_server(workdir: Path) -> Iterator[Redis]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("`redis-server` not found: install Debian's redis-server (apt-get install redis-server)")
    port, password = _free_port(), secrets.token_hex(16)
    workdir.mkdir(parents=True, exist_ok=True)
    args = ["--port", str(port), "--bind", "127.0.0.1", "--requirepass", password, "--dir", str(workdir)]
    args += ["--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", str(workdir / "redis.log")]
    proc = subprocess.Popen([binary, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    redis = Redis(f"127.0.0.1:{port}", password, proc.pid)
    try:
        wait_until(lambda: proc.poll() is None and redis.ping(), 20, 0.1, f"redis-server on {port}")
        yield redis
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
