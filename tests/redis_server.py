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

from tests.conftest import free_port, wait_until


@dataclass(frozen=True)
class Redis:
    address: str  # host:port, as RAY_REDIS_ADDRESS takes it
    password: str
    pid: int

    def ask(self, *commands: str) -> list[bytes]:
        """AUTH, then `commands`, over the wire protocol: the first line of each reply, AUTH's first (one-line
        replies only: status, error and integer)."""
        host, port = self.address.split(":")
        wanted = len(commands) + 1
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.sendall("".join(f"{c}\r\n" for c in (f"AUTH {self.password}", *commands)).encode())
            got = b""
            while got.count(b"\r\n") < wanted:
                if not (chunk := s.recv(256)):
                    break
                got += chunk
        return got.split(b"\r\n")[:wanted]

    def ping(self) -> bool:
        """True once the server accepts the password and answers PING."""
        return self.ask("PING") == [b"+OK", b"+PONG"]

    def keys(self) -> int:
        """How many keys the server holds (DBSIZE)."""
        return int(self.ask("DBSIZE")[1].lstrip(b":"))


@contextmanager
def redis_server(workdir: Path) -> Iterator[Redis]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("`redis-server` not found: install Debian's redis-server (apt-get install redis-server)")
    port, password = free_port(), secrets.token_hex(16)
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
