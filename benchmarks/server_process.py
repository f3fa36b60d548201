"""A server under test as a child process: started in its own session, polled until ready, stopped cleanly.

Stopping sends SIGINT to the leader first (uvicorn, `serve run` and benchmarks.baselines.serve_local shut
Serve and their private Ray instance down on Ctrl-C), then SIGTERM and SIGKILL to whatever is left of the
processes it started, by pid. Never `ray stop`: that would also stop other people's Ray on this machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import httpx


class ServerStartError(RuntimeError):
    """The server exited, logged a deployment failure, or was not ready by its deadline."""


def port_open(url: str, timeout_s: float = 0.5) -> bool:
    """Something accepts TCP connections at the URL's host and port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def listening_pids(port: int) -> set[int]:
    """Processes holding a TCP socket that listens on `port` (any address). Serve's proxies bind with
    SO_REUSEPORT, so a second server on the same port starts fine and silently takes half the connections:
    this is how a benchmark notices it is not alone."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    pids = set()
    if not inodes:
        return pids
    wanted = {f"socket:[{i}]" for i in inodes}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in wanted:
                    pids.add(int(entry))
                    break
            except OSError:
                continue
    return pids


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, session id, start time) of a live process, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[3]), int(fields[19])


def process_family(root: int) -> dict[int, int]:
    """{pid: start time} of `root`, its descendants, and every process still in its session."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            table[int(entry)] = st
    family = {pid for pid, (_, sid, _) in table.items() if sid == root}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _) in table.items():
            if ppid == parent and pid not in family:
                family.add(pid)
                frontier.append(pid)
    family.add(root)
    return {pid: table[pid][2] for pid in family if pid in table}


def _alive(family: dict[int, int]) -> dict[int, int]:
    """The members still running as the same process (a reused pid has another start time)."""
    return {pid: start for pid, start in family.items() if (st := _stat(pid)) is not None and st[2] == start}


def _pause(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """Wait up to `seconds` between polls, returning early if `proc` exits meanwhile."""
    if proc.poll() is not None:
        time.sleep(seconds)
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=seconds)


class ServerProcess:
    """One server command, its log file, and how long it took to become ready."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        log_path: Path,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        fail_patterns: Sequence[str] = (),  # regular expressions; one in the log means startup failed
    ) -> None:
        self.name, self.cmd, self.log_path, self.cwd = name, list(cmd), log_path, cwd
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self.fail_patterns = list(fail_patterns)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.family: dict[int, int] = {}

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.cmd, cwd=self.cwd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _failure_in_log(self) -> str | None:
        if not self.fail_patterns:
            return None
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return None
        return next((p for p in self.fail_patterns if re.search(p, text)), None)

    def wait_ready(
        self, ready_url: str, timeout_s: float, probe: Callable[[httpx.Client], bool] | None = None
    ) -> float:
        """Poll `ready_url` (GET -> 200), then `probe`, until both pass; seconds taken. Raises ServerStartError."""
        assert self.proc is not None, "start() first"
        t0 = time.perf_counter()
        deadline = t0 + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise ServerStartError(f"{self.name} exited with status {self.proc.returncode}")
                if (pattern := self._failure_in_log()) is not None:
                    raise ServerStartError(f"{self.name} logged {pattern!r}")
                try:
                    if client.get(ready_url).status_code == 200 and (probe is None or probe(client)):
                        return time.perf_counter() - t0
                except httpx.HTTPError:
                    pass
                if time.perf_counter() > deadline:
                    raise ServerStartError(f"{self.name} not ready at {ready_url} after {timeout_s:.0f} s")
                _pause(self.proc, 0.25)  # the pause between polls doubles as "did it die?"

    def stop(self, grace_s: float = 30.0) -> dict[str, Any]:
        """SIGINT to the leader, then SIGTERM/SIGKILL to what is left of its processes. How it went."""
        if self.proc is None:
            return {"stopped": "never started"}
        self.family.update(process_family(self.proc.pid))
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
            alive = _alive(self.family)
            if not alive:
                break
            leftovers = sorted(alive)
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.perf_counter() + wait_s
            while _alive(alive) and time.perf_counter() < deadline:
                _pause(self.proc, 0.1)
            how += f", {sig.name} to {len(alive)}"
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
        return {
            "stopped": how,
            "returncode": self.proc.returncode,
            "leftover_pids_signalled": leftovers,
            "still_alive": sorted(_alive(self.family)),
        }

    def foreign_listeners(self, port: int) -> set[int]:
        """Listeners on `port` that this server did not start (there should be none)."""
        self.snapshot_family()
        return listening_pids(port) - set(self.family)

    def snapshot_family(self) -> None:
        """Remember every process the server has started so far (Ray daemons may leave its tree later)."""
        if self.proc is not None:
            self.family.update(process_family(self.proc.pid))

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
