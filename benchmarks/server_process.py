"""A server under test as a child process in its own session: started, polled until ready, stopped by pid (never
`ray stop`: that would also stop other people's Ray on this machine)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from benchmarks.procs import alive, family, listening_pids


class ServerStartError(RuntimeError):
    """The server exited, logged a deployment failure, or was not ready by its deadline."""


def free_port() -> int:
    """A TCP port nothing on 127.0.0.1 listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(url: str) -> bool:
    """Something accepts TCP connections at the URL's host and port."""
    parts = urlsplit(url)
    with contextlib.suppress(OSError), socket.create_connection((parts.hostname, parts.port or 80), timeout=0.5):
        return True
    return False


@dataclass
class ServerProcess:
    """One server command, its log file, and every process it has started (`family`: pid -> creation time)."""

    name: str
    cmd: list[str]
    log_path: Path
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment
    unset: Callable[[str], bool] | None = None  # which of this process's variables the server does not inherit
    fail_patterns: Sequence[str] = ()  # regular expressions; one in the log means startup failed
    proc: subprocess.Popen[bytes] | None = None
    family: dict[int, float] = field(default_factory=dict)

    def start(self) -> None:
        inherited = {k: v for k, v in os.environ.items() if self.unset is None or not self.unset(k)}
        env = {**inherited, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                self.cmd, cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(
        self, ready_url: str, timeout_s: float, probe: Callable[[httpx.Client], bool] | None = None
    ) -> float:
        """Poll `ready_url` (GET -> 200), then `probe`, until both pass; seconds taken. Raises ServerStartError."""
        assert self.proc is not None, "start() first"
        t0 = time.perf_counter()
        with httpx.Client(timeout=5.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise ServerStartError(f"{self.name} exited with status {self.proc.returncode}")
                log = self.log_path.read_text(errors="replace") if self.fail_patterns else ""
                if failed := [p for p in self.fail_patterns if re.search(p, log)]:
                    raise ServerStartError(f"{self.name} logged {failed[0]!r}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(ready_url).status_code == 200 and (probe is None or probe(client)):
                        return time.perf_counter() - t0
                if time.perf_counter() - t0 > timeout_s:
                    raise ServerStartError(f"{self.name} not ready at {ready_url} after {timeout_s:.0f} s")
                with contextlib.suppress(subprocess.TimeoutExpired):  # the pause between polls, cut short by an exit
                    self.proc.wait(timeout=0.25)

    def stop(self, grace_s: float = 30.0) -> dict[str, Any]:
        """SIGINT to the leader, then SIGTERM/SIGKILL to what is left of its processes. How it went."""
        assert self.proc is not None, "start() first"
        self.snapshot_family()
        how = "exited before stop"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=grace_s)
                how = "SIGINT"
            except subprocess.TimeoutExpired:
                how = "SIGINT timed out"
        leftovers: list[int] = []
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if not (left := alive(self.family)):
                break
            leftovers = sorted(left)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.perf_counter() + wait_s
            while alive(left) and time.perf_counter() < deadline:
                time.sleep(0.1)
            how += f", {sig.name} to {len(left)}"
        self.proc.wait(timeout=5)
        return {
            "stopped": how,
            "returncode": self.proc.returncode,
            "leftover_pids_signalled": leftovers,
            "still_alive": sorted(alive(self.family)),
        }

    def foreign_listeners(self, port: int) -> set[int]:
        """Listeners on `port` that this server did not start (there should be none)."""
        self.snapshot_family()
        return listening_pids(port) - set(self.family)

    def snapshot_family(self) -> None:
        """Remember every process the server has started so far (Ray daemons may leave its tree later)."""
        if self.proc is not None:
            self.family.update(family(self.proc.pid))
