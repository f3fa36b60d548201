"""Hostile load: attack classes run against a live app while a probe sends normal images.

    python -m benchmarks.hostile_load --url http://127.0.0.1:8000 --attack all --duration 30 \\
        --clients 16 --connections 200

Each attack class runs for --duration seconds while --probe-clients clients send normal JPEG sample
photographs to /v1/classify (each at most one request per --probe-interval seconds), recording status
and latency:

- bombs: --clients clients, each POSTing back to back the float32 RGBA TIFF bomb and the 16-bit RGBA PNG
  bomb (tests/hostile.py: 40 MP each, ~0.6 / ~0.3 MB, 1.3 GB / 640 MB once decoded) to /v1/classify, and
  the same two images as the BYTES input of a V2 (Open Inference Protocol) binary request;
- gzip: --clients clients POSTing to /v2/models/<model>/infer with `Content-Encoding: gzip` a ~10 KB body
  that inflates to --gzip-inflated bytes (default: the 10 MiB body limit) of `{"inputs":[[],[],...]}`;
- slow: --connections raw TCP connections, each sending a valid request line and headers with a
  Content-Length of --slow-length bytes, then the body at one byte per --slow-interval seconds;
  reconnecting whenever the server answers or closes.

Around each phase it samples every Serve process's resident memory (from /proc, found under the raylet that
serves the URL's port, so another Ray on this machine is never measured) and compares the replicas (pid and
start time, plus the replica ids in GET /v1/models) before and after. What each phase must show (the issue's
"Done when"; `phase_failures`): probe success >= 99% and p99 < 3 s; no replica killed or replaced; the
Preprocessor's peak RSS under its idle RSS plus Limits.preprocessor_memory_bytes, every other replica's peak
within --other-growth MB of where the phase started; every attack response a JSON 4xx or 503 (slow-body
connections: closed by the server, or answered 400/408/413/503; recorded either way).

Prints a table, writes benchmarks/results/hostile_load-<stamp>-<host>.json and .png, and exits 1 if any phase
failed. Loopback targets only; bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import random
import re
import statistics
import struct
import sys
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from app.config import Limits
from app.models import MODEL_NAME
from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import NonLoopbackURL, require_loopback
from benchmarks.report import markdown_table, pyplot, write_json
from benchmarks.soak import REPLICA_TITLE, node_serving, proc_table, process_label, raylet_above
from benchmarks.stats import latency_summary, percentile

MB = 1024 * 1024
ATTACKS = ("bombs", "gzip", "slow")  # "all" runs them in this order (slow last: it holds connections)
CLASSIFY = "/v1/classify"
V2_INFER = f"/v2/models/{MODEL_NAME}/infer"
SLOW_STATUSES = frozenset({400, 408, 413, 503})  # what a slow-body connection may be answered with
_LIMITS = Limits()


# --------------------------------------------------------------------------- what each attack sends


@dataclass(frozen=True)
class AttackRequest:
    kind: str  # tiff_v1, png_v1, tiff_v2, png_v2, gzip_json
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]

    def __repr__(self) -> str:  # bodies are large
        return f"AttackRequest({self.kind!r}, {self.path!r}, {len(self.body)} bytes)"


@functools.cache
def bomb_images() -> dict[str, bytes]:
    """The two memory bombs of the hostile corpus: inside the pixel and body limits, over the decode budget."""
    from tests.hostile import png_16bit_rgba_bomb, tiff_float32_rgba_bomb  # the corpus's own builders

    return {"tiff": tiff_float32_rgba_bomb(), "png": png_16bit_rgba_bomb()}


def v2_bytes_request(image: bytes) -> tuple[bytes, dict[str, str]]:
    """A V2 binary inference request carrying `image` as the one element of the BYTES input `image_bytes`."""
    from app import v2

    header = json.dumps(
        {
            "inputs": [
                {
                    "name": v2.IMAGE_BYTES_INPUT,
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": 4 + len(image)},
                }
            ],
            "outputs": [{"name": v2.TOP_K, "parameters": {"classification": 1}}],
        },
        separators=(",", ":"),
    ).encode()
    body = header + struct.pack("<I", len(image)) + image
    return body, {"Content-Type": v2.BINARY_CONTENT_TYPE, v2.HEADER_LENGTH: str(len(header))}


JSON_BOMB_PREFIX, JSON_BOMB_SUFFIX = b'{"inputs":[', b"]}"


def json_bomb_size(lists: int) -> int:
    """Bytes of `{"inputs":[[],[],...]}` holding `lists` empty lists."""
    return len(JSON_BOMB_PREFIX) + 3 * lists - 1 + len(JSON_BOMB_SUFFIX)


def gzip_json_bomb(inflated_bytes: int) -> tuple[bytes, int]:
    """A gzip body inflating to at most `inflated_bytes` of `{"inputs":[[],[],...]}`; (body, inflated size).

    Built with zlib in chunks (never the whole text in memory); ~1000:1, so 10 MiB inflate from ~10 KB.
    """
    lists = max(1, (inflated_bytes - len(JSON_BOMB_PREFIX) - len(JSON_BOMB_SUFFIX) + 1) // 3)
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: the gzip container
    out = [comp.compress(JSON_BOMB_PREFIX)]
    step = 1 << 18
    chunk = b"[]," * step
    remaining = lists - 1
    while remaining:
        n = min(remaining, step)
        out.append(comp.compress(chunk[: 3 * n]))
        remaining -= n
    out += [comp.compress(b"[]" + JSON_BOMB_SUFFIX), comp.flush()]
    return b"".join(out), json_bomb_size(lists)


def attack_requests(attack: str, v2_bombs: bool = True, gzip_inflated_bytes: int | None = None) -> list[AttackRequest]:
    """What the clients of `attack` cycle through (client i starts at position i)."""
    if attack == "bombs":
        images = bomb_images()
        reqs = [
            AttackRequest(f"{name}_v1", CLASSIFY, data, (("Content-Type", f"image/{name}"),))
            for name, data in images.items()
        ]
        if v2_bombs:
            for name, data in images.items():
                body, headers = v2_bytes_request(data)
                reqs.append(AttackRequest(f"{name}_v2", V2_INFER, body, tuple(headers.items())))
        return reqs
    if attack == "gzip":
        body, _ = gzip_json_bomb(gzip_inflated_bytes or _LIMITS.max_body_bytes)
        headers = (("Content-Type", "application/json"), ("Content-Encoding", "gzip"))
        return [AttackRequest("gzip_json", V2_INFER, body, headers)]
    raise ValueError(f"attack {attack!r} sends no HTTP requests (one of bombs, gzip)")


@functools.cache
def probe_images() -> tuple[bytes, ...]:
    """Normal traffic: the bundled sample photographs that are JPEGs of at most 300 KB (small, cheap)."""
    from app.models.samples import available_photos, sample_bytes

    out: list[bytes] = []
    for name in available_photos():
        data = sample_bytes(name)
        if data[:2] == b"\xff\xd8" and len(data) <= 300_000:
            out.append(data)
    if not out:
        raise RuntimeError("no JPEG sample photograph found (scikit-image / matplotlib sample data)")
    return tuple(out)


# --------------------------------------------------------------------------- records and their summaries


@dataclass
class Reply:
    """One HTTP exchange: when it started (s, run clock), what it was, and what came back (status 0: no reply)."""

    t: float
    kind: str
    status: int
    latency_s: float
    json_ok: bool = False  # a JSON body; for an error, in the service's error shape
    code: str = ""  # the error code (V1), a digit-free prefix of the message (V2), or the client exception
    retry_after: str | None = None


@dataclass
class SlowOutcome:
    """One slow-body connection, from connect to its end."""

    t: float  # connected (s, run clock)
    held_s: float
    sent: int  # body bytes trickled
    how: str  # response | closed (EOF, no response) | reset | connect_failed | open_at_end (we closed it)
    status: int | None = None
    json_ok: bool = False
    code: str = ""


def error_label(message: str) -> str:
    """A V2 error message (`{"error": "..."}`) made groupable: digits out, first 60 characters."""
    return re.sub(r"\d+", "N", message)[:60]


def read_error(status: int, content_type: str | None, body: bytes) -> tuple[bool, str]:
    """(is the body JSON in the service's shape, the error code or label) of one response."""
    if not (content_type or "").lower().startswith("application/json"):
        return False, ""
    try:
        doc = json.loads(body)
    except ValueError:
        return False, ""
    if not isinstance(doc, dict):
        return False, ""
    err = doc.get("error")
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        return True, err["code"]
    if isinstance(err, str):
        return True, error_label(err)
    return status == 200, ""


def is_proper_refusal(r: Reply) -> bool:
    """What every answer to an attack request must be: a JSON 4xx, or a JSON 503."""
    return (400 <= r.status < 500 or r.status == 503) and r.json_ok


def status_counts(items: Sequence[Reply | SlowOutcome]) -> dict[str, int]:
    """{"413 decode_budget_exceeded": n, ...}; status 0 is a request that got no reply."""
    return dict(sorted(Counter(f"{r.status} {r.code}".strip() for r in items).items()))


def probe_summary(replies: Sequence[Reply]) -> dict[str, Any]:
    """Success rate and latency (seconds, over every probe request, failed ones included) of normal traffic."""
    lat = [r.latency_s for r in replies]
    ok = sum(r.status == 200 for r in replies)
    return {
        "requests": len(replies),
        "ok": ok,
        "success_rate": ok / len(replies) if replies else None,
        "p50_s": percentile(lat, 50),
        "p99_s": percentile(lat, 99),
        "max_s": max(lat) if lat else None,
        "statuses": status_counts(replies),
    }


def attack_summary(replies: Sequence[Reply], duration_s: float) -> dict[str, Any]:
    """Counts by status and kind, and every answer that is not a JSON 4xx/503 (a violation)."""
    bad = [r for r in replies if not is_proper_refusal(r)]
    kinds = sorted({r.kind for r in replies})
    return {
        "requests": len(replies),
        "rps": len(replies) / duration_s if duration_s > 0 else None,
        "statuses": status_counts(replies),
        "by_kind": {k: status_counts([r for r in replies if r.kind == k]) for k in kinds},
        "latency_ms": latency_summary([r.latency_s for r in replies]),
        "violations": len(bad),
        "violation_examples": [asdict(r) for r in bad[:5]],
    }


def slow_summary(outcomes: Sequence[SlowOutcome], connections: int) -> dict[str, Any]:
    """What became of the slow-body connections: who ended them, how, after how long."""
    answered = [o for o in outcomes if o.how == "response"]
    ended_by_server = [o.held_s for o in outcomes if o.how in ("response", "closed", "reset")]
    bad = [o for o in answered if o.status not in SLOW_STATUSES]
    return {
        "connections": connections,
        "attempts": len(outcomes),
        "opened": sum(o.how != "connect_failed" for o in outcomes),
        "how": dict(sorted(Counter(o.how for o in outcomes).items())),
        "responses": status_counts(answered),
        "non_json_responses": sum(not o.json_ok for o in answered),
        "held_by_server_s": {
            "median": statistics.median(ended_by_server) if ended_by_server else None,
            "max": max(ended_by_server) if ended_by_server else None,
        },
        "open_at_end": sum(o.how == "open_at_end" for o in outcomes),
        "bytes_sent": sum(o.sent for o in outcomes),
        "violations": len(bad),
        "violation_examples": [asdict(o) for o in bad[:5]],
    }


# --------------------------------------------------------------------------- Serve's processes and their memory


@dataclass(frozen=True)
class ServeProc:
    key: str  # "Preprocessor[1234]": a replaced replica is a new key
    label: str
    pid: int
    start: int  # start time (clock ticks since boot): a reused pid is another process
    replica: bool


def _start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def read_memory(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of a live process in MB; None if it is gone. VmHWM: the peak RSS since it started."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    rss = hwm = None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    return None if rss is None else (rss, hwm if hwm is not None else rss)


def serve_processes(raylet_pid: int) -> dict[str, ServeProc]:
    """The Serve processes (replicas, controller, proxy, HAProxy) under one raylet.

    A replica is a Ray worker, a child of the raylet; a process a replica forks keeps its title until it
    execs, and is left out.
    """
    table = proc_table()
    out = {}
    for pid, p in table.items():
        label = process_label(p.argv)
        if label is None or raylet_above(pid, table) != raylet_pid:
            continue
        replica = bool(p.argv) and p.argv[0].startswith(REPLICA_TITLE)
        start = _start_time(pid)
        if start is None or (replica and p.ppid != raylet_pid):
            continue
        key = f"{label}[{pid}]"
        out[key] = ServeProc(key, label, pid, start, replica)
    return dict(sorted(out.items()))


def replicas_replaced(before: dict[str, ServeProc], after: dict[str, ServeProc]) -> dict[str, list[str]]:
    """Replica processes that went away, and new ones, between two snapshots (by pid and start time)."""
    b = {(p.key, p.start) for p in before.values() if p.replica}
    a = {(p.key, p.start) for p in after.values() if p.replica}
    return {"gone": sorted(k for k, _ in b - a), "new": sorted(k for k, _ in a - b)}


def memory_verdict(
    procs: dict[str, dict[str, Any]], preprocessor_memory_mb: float, other_growth_mb: float
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per process {label, replica, idle_mb, start_mb, peak_mb, ...}: the limit that applies and what broke it.

    Preprocessor replicas: peak <= idle + preprocessor_memory_mb (the decode ceiling on top of the replica's
    own baseline, measured idle before the first attack). Every other replica: peak - start_mb (where this
    phase started) <= other_growth_mb. Other Serve processes are reported, not judged.
    """
    rows, failures = {}, []
    for key, m in procs.items():
        row = dict(m)
        peak = m.get("peak_mb")
        if m["label"] == "Preprocessor" and m.get("idle_mb") is not None:
            row["limit_mb"] = round(m["idle_mb"] + preprocessor_memory_mb, 1)
            row["within"] = peak is None or peak <= row["limit_mb"]
            if not row["within"]:
                failures.append(
                    f"{key}: peak RSS {peak:.0f} MB over idle {m['idle_mb']:.0f} + {preprocessor_memory_mb:.0f}"
                )
        elif m.get("replica") and m.get("start_mb") is not None:
            row["limit_mb"] = round(m["start_mb"] + other_growth_mb, 1)
            row["growth_mb"] = None if peak is None else round(peak - m["start_mb"], 1)
            row["within"] = peak is None or peak <= row["limit_mb"]
            if not row["within"]:
                failures.append(f"{key}: grew {row['growth_mb']:.0f} MB during the phase (limit {other_growth_mb:.0f})")
        rows[key] = row
    return rows, failures


class Monitor:
    """RSS of a fixed set of processes every `every_s` seconds (only their /proc/<pid>/status is read)."""

    def __init__(self, procs: dict[str, ServeProc], clock0: float) -> None:
        self.procs, self.clock0 = procs, clock0
        self.series: dict[str, list[tuple[float, float]]] = {k: [] for k in procs}
        self.hwm: dict[str, float] = {}
        self.gone: set[str] = set()

    def sample(self) -> None:
        t = round(time.perf_counter() - self.clock0, 3)
        for key, p in self.procs.items():
            mem = read_memory(p.pid)
            if mem is None:
                self.gone.add(key)
                continue
            self.series[key].append((t, round(mem[0], 1)))
            self.hwm[key] = mem[1]

    async def run(self, stop: asyncio.Event, every_s: float) -> None:
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
        self.sample()

    def peak(self, key: str) -> float | None:
        pts = self.series.get(key) or []
        return max(v for _, v in pts) if pts else None


# --------------------------------------------------------------------------- traffic


def _client(limit: int, timeout_s: float) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, limit_per_host=limit),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    )


async def post(
    session: aiohttp.ClientSession,
    url: str,
    kind: str,
    body: bytes,
    headers: dict[str, str],
    clock0: float,
) -> Reply:
    start = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            raw = await resp.read()
            json_ok, code = read_error(resp.status, resp.headers.get("Content-Type"), raw)
            return Reply(
                start - clock0,
                kind,
                resp.status,
                time.perf_counter() - start,
                json_ok,
                code,
                resp.headers.get("Retry-After"),
            )
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return Reply(start - clock0, kind, 0, time.perf_counter() - start, False, type(e).__name__)


async def probe(
    base: str, clients: int, interval_s: float, stop_at: float, clock0: float, out: list[Reply], timeout_s: float
) -> None:
    """Normal traffic: `clients` workers, each sending a JPEG to /v1/classify at most every `interval_s`."""
    images = probe_images()

    async def worker(session: aiohttp.ClientSession, i: int) -> None:
        k = i
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            out.append(await post(session, base + CLASSIFY, "probe", images[k % len(images)], _JPEG, clock0))
            k += 1
            pause = min(interval_s - (time.perf_counter() - t), stop_at - time.perf_counter())
            if pause > 0:
                await asyncio.sleep(pause)  # pacing: the probe must not become load itself

    async with _client(clients, timeout_s) as session:
        await asyncio.gather(*(worker(session, i) for i in range(clients)))


_JPEG = {"Content-Type": "image/jpeg"}


async def http_attack(
    base: str,
    requests: Sequence[AttackRequest],
    clients: int,
    stop_at: float,
    clock0: float,
    out: list[Reply],
    timeout_s: float,
) -> None:
    """`clients` workers, each POSTing the attack's requests in turn, back to back, until `stop_at`."""

    async def worker(session: aiohttp.ClientSession, i: int) -> None:
        k = i
        while time.perf_counter() < stop_at:
            req = requests[k % len(requests)]
            out.append(await post(session, base + req.path, req.kind, req.body, dict(req.headers), clock0))
            k += 1

    async with _client(clients, timeout_s) as session:
        await asyncio.gather(*(worker(session, i) for i in range(clients)))


def parse_http_reply(raw: bytes) -> tuple[int | None, dict[str, str], bytes]:
    """(status, lower-cased headers, body) of a raw HTTP/1.x response, as far as `raw` goes."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/\d(?:\.\d)? (\d{3})", lines[0]) if lines else None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return (int(m.group(1)) if m else None), headers, body


async def _read_reply(reader: asyncio.StreamReader, limit: int = 65536, rest_s: float = 2.0) -> bytes:
    """Wait for the server's first byte (b"" on a close without a reply), then read its reply to EOF (bounded)."""
    data = await reader.read(limit)
    if not data:
        return b""
    deadline = time.perf_counter() + rest_s
    while len(data) < limit:
        _, headers, body = parse_http_reply(data)
        length = headers.get("content-length")
        if b"\r\n\r\n" in data and length is not None and length.isdigit() and len(body) >= int(length):
            break
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        try:
            more = await asyncio.wait_for(reader.read(limit - len(data)), left)
        except (asyncio.TimeoutError, ConnectionError):
            break
        if not more:
            break
        data += more
    return data


def slow_request_head(host: str, port: int, content_length: int, path: str = CLASSIFY) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: hostile-load-slow-body\r\n"
        f"Content-Type: image/jpeg\r\nContent-Length: {content_length}\r\n\r\n"
    ).encode()


async def slow_connection(
    host: str,
    port: int,
    content_length: int,
    interval_s: float,
    stop_at: float,
    clock0: float,
    out: list[SlowOutcome],
    rng: random.Random,
) -> None:
    """One slot of the slow-body attack: connect, send the head, trickle the body; reconnect when ended."""
    body = probe_images()[0]
    head = slow_request_head(host, port, content_length)
    while time.perf_counter() < stop_at:
        opened = time.perf_counter()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
        except (OSError, asyncio.TimeoutError):
            out.append(SlowOutcome(opened - clock0, 0.0, 0, "connect_failed"))
            await asyncio.sleep(0.5)
            continue
        sent, how = 0, "open_at_end"
        reading = asyncio.create_task(_read_reply(reader))
        try:
            writer.write(head)
            while sent < content_length:
                left = stop_at - time.perf_counter()
                if left <= 0:
                    break
                # jittered, so 200 connections do not write in lockstep
                await asyncio.wait({reading}, timeout=min(left, interval_s * rng.uniform(0.8, 1.2)))
                if reading.done() or time.perf_counter() >= stop_at:
                    break
                writer.write(body[sent % len(body) : sent % len(body) + 1])
                await asyncio.wait_for(writer.drain(), 5.0)
                sent += 1
        except (ConnectionError, asyncio.TimeoutError):
            how = "reset"
        outcome = SlowOutcome(opened - clock0, time.perf_counter() - opened, sent, how)
        if reading.done() and not reading.cancelled():
            try:
                raw = reading.result()
            except (ConnectionError, OSError):
                raw, outcome.how = b"", "reset"
            if raw:
                status, headers, reply = parse_http_reply(raw)
                outcome.how, outcome.status = "response", status
                outcome.json_ok, outcome.code = read_error(status or 0, headers.get("content-type"), reply)
            elif outcome.how != "reset":
                outcome.how = "closed"
        else:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await reading
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 2.0)
        out.append(outcome)
        if outcome.how == "open_at_end":
            return
        await asyncio.sleep(0.2 + rng.random() * 0.3)  # the server ended it: come back, as an attacker would


async def slow_attack(
    host: str,
    port: int,
    connections: int,
    content_length: int,
    interval_s: float,
    stop_at: float,
    clock0: float,
    out: list[SlowOutcome],
    seed: int = 0,
) -> None:
    rng = random.Random(seed)

    async def slot(i: int) -> None:
        await asyncio.sleep(i * 0.005)  # 200 connects spread over a second, not one SYN burst
        await slow_connection(host, port, content_length, interval_s, stop_at, clock0, out, rng)

    await asyncio.gather(*(slot(i) for i in range(connections)))


# --------------------------------------------------------------------------- a phase


@dataclass(frozen=True)
class Thresholds:
    """The issue's "Done when", per attack class."""

    min_success: float = 0.99
    max_p99_s: float = 3.0
    preprocessor_memory_mb: float = _LIMITS.preprocessor_memory_bytes / MB
    other_growth_mb: float = 300.0


@dataclass(frozen=True)
class Settings:
    duration_s: float = 30.0
    clients: int = 16
    connections: int = 200
    probe_clients: int = 3
    probe_interval_s: float = 0.1
    slow_content_length: int = 100 * 1024
    slow_interval_s: float = 1.0
    gzip_inflated_bytes: int = _LIMITS.max_body_bytes
    v2_bombs: bool = True
    settle_s: float = 2.0
    sample_every_s: float = 0.25
    timeout_s: float = 30.0
    ready_timeout_s: float = 30.0
    warmup_requests: int = 6
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass
class Target:
    """The app under attack: its base URL and, when found, the raylet whose Serve processes serve it."""

    base: str
    raylet_pid: int | None = None
    idle_mb: dict[str, float] = field(default_factory=dict)
    clock0: float = field(default_factory=time.perf_counter)
    notes: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return urlsplit(self.base).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        return urlsplit(self.base).port or 80


def base_url(url: str) -> str:
    """scheme://host:port of any URL of the app (a /v1/classify URL works too); loopback only."""
    parts = urlsplit(require_loopback(url))
    return f"{parts.scheme}://{parts.netloc}"


def app_replica_ids(base: str, timeout_s: float = 10.0) -> dict[str, str] | None:
    """Router and Classifier replica ids from GET /v1/models (None when it does not answer)."""
    import httpx

    try:
        models = httpx.get(base + "/v1/models", timeout=timeout_s).json()
        return {"Router": models["router_replica_id"], **{k: v["replica_id"] for k, v in models["variants"].items()}}
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def wait_ready(base: str, timeout_s: float) -> float | None:
    """Seconds until GET /readyz answers 200, None if it did not within `timeout_s`."""
    import httpx

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/readyz", timeout=5).status_code == 200:
                return time.perf_counter() - t0
        time.sleep(0.25)
    return None


def attach(url: str, raylet_pid: int | None = None, idle_samples: int = 4, every_s: float = 0.25) -> Target:
    """The app at `url`, its Serve processes' idle RSS measured (median of a few samples).

    The processes are those under `raylet_pid`, by default the raylet above whatever listens on the URL's port
    (HAProxy or Serve's proxy), so another Ray instance on this machine is never measured.
    """
    target = Target(base_url(url))
    if raylet_pid is None:
        node = node_serving(target.port)
        raylet_pid = node.raylet_pid if node is not None else None
    if raylet_pid is None:
        target.notes.append(f"no Ray node listens on port {target.port} here: memory and replicas not watched")
        return target
    target.raylet_pid = raylet_pid
    mon = Monitor(serve_processes(raylet_pid), target.clock0)
    for i in range(idle_samples):
        if i:
            time.sleep(every_s)
        mon.sample()
    target.idle_mb = {k: statistics.median(v for _, v in pts) for k, pts in mon.series.items() if pts}
    return target


async def _traffic(target: Target, attack: str, s: Settings, mon: Monitor | None) -> dict[str, Any]:
    clock0 = target.clock0
    start = time.perf_counter()
    stop_at = start + s.duration_s
    probes: list[Reply] = []
    replies: list[Reply] = []
    slow: list[SlowOutcome] = []
    stop = asyncio.Event()
    watcher = asyncio.create_task(mon.run(stop, s.sample_every_s)) if mon is not None else None
    if attack == "slow":
        load: Any = slow_attack(
            target.host, target.port, s.connections, s.slow_content_length, s.slow_interval_s, stop_at, clock0, slow
        )
    else:
        reqs = attack_requests(attack, s.v2_bombs, s.gzip_inflated_bytes)
        load = http_attack(target.base, reqs, s.clients, stop_at, clock0, replies, s.timeout_s)
    await asyncio.gather(
        probe(target.base, s.probe_clients, s.probe_interval_s, stop_at, clock0, probes, s.timeout_s), load
    )
    wall = time.perf_counter() - start
    stop.set()
    if watcher is not None:
        await watcher
    return {"probe": probes, "replies": replies, "slow": slow, "wall_s": wall, "t_start": start - clock0}


def phase_failures(phase: dict[str, Any], th: Thresholds) -> list[str]:
    """Everything in one phase's result that breaks the issue's "Done when"."""
    out = []
    p = phase["probe"]
    if not p["requests"]:
        out.append("probe: no requests completed")
    else:
        if p["success_rate"] < th.min_success:
            out.append(f"probe: success {p['success_rate']:.1%} < {th.min_success:.0%} ({p['statuses']})")
        if p["p99_s"] >= th.max_p99_s:
            out.append(f"probe: p99 {p['p99_s']:.2f} s >= {th.max_p99_s:g} s")
    a = phase["attack_summary"]
    if phase["attack"] == "slow":
        if not a["opened"]:
            out.append("slow: no connection was opened")
        if a["violations"]:
            out.append(f"slow: answered with {a['responses']} (allowed: close, or {sorted(SLOW_STATUSES)})")
    else:
        if not a["requests"]:
            out.append(f"{phase['attack']}: no attack request completed")
        if a["violations"]:
            out.append(f"{phase['attack']}: {a['violations']} answers not a JSON 4xx/503: {a['statuses']}")
    rep = phase["replicas"]
    if rep.get("gone") or rep.get("new"):
        out.append(f"replicas replaced: gone {rep.get('gone')}, new {rep.get('new')}")
    if rep.get("ids_before") is not None and rep.get("ids_after") != rep.get("ids_before"):
        out.append(f"replica ids changed: {rep.get('ids_before')} -> {rep.get('ids_after')}")
    out += phase.get("memory_failures", [])
    if phase.get("ready_after_s") is None:
        out.append("not ready after the phase")
    return out


def run_phase(target: Target, attack: str, s: Settings) -> dict[str, Any]:
    """One attack class for s.duration_s with the probe running; the figures and the failures."""
    if attack not in ATTACKS:
        raise ValueError(f"unknown attack {attack!r}; one of {ATTACKS}")
    procs = serve_processes(target.raylet_pid) if target.raylet_pid is not None else {}
    ids_before = app_replica_ids(target.base)
    mon = Monitor(procs, target.clock0) if procs else None
    if mon is not None:
        mon.sample()
    start_mb = {k: pts[-1][1] for k, pts in (mon.series.items() if mon else []) if pts}
    hwm_before = dict(mon.hwm) if mon else {}
    traffic = asyncio.run(_traffic(target, attack, s, mon))
    ready = wait_ready(target.base, s.ready_timeout_s)
    time.sleep(s.settle_s)  # let closed connections and cancelled work reach the server
    if mon is not None:
        mon.sample()
    after = serve_processes(target.raylet_pid) if target.raylet_pid is not None else {}
    replaced = replicas_replaced(procs, after) if procs else {}
    replaced["gone"] = sorted({*replaced.get("gone", []), *(k for k in (mon.gone if mon else ()) if procs[k].replica)})
    memory: dict[str, dict[str, Any]] = {}
    for key, p in procs.items():
        peak = mon.peak(key) if mon else None
        hwm0, hwm1 = hwm_before.get(key), (mon.hwm.get(key) if mon else None)
        if hwm0 is not None and hwm1 is not None and hwm1 > hwm0:
            peak = max(peak or 0.0, hwm1)  # a spike between samples: the kernel's high-water mark rose
        pts = mon.series.get(key) if mon else None
        memory[key] = {
            "label": p.label,
            "replica": p.replica,
            "idle_mb": target.idle_mb.get(key),
            "start_mb": start_mb.get(key),
            "peak_mb": None if peak is None else round(peak, 1),
            "end_mb": pts[-1][1] if pts else None,
            "hwm_rose": hwm0 is not None and hwm1 is not None and hwm1 > hwm0,
        }
    th = s.thresholds
    memory, mem_failures = memory_verdict(memory, th.preprocessor_memory_mb, th.other_growth_mb)
    wall = traffic["wall_s"]
    phase: dict[str, Any] = {
        "attack": attack,
        "duration_s": s.duration_s,
        "wall_s": round(wall, 2),
        "t_start": round(traffic["t_start"], 3),
        "clients": s.connections if attack == "slow" else s.clients,
        "probe": probe_summary(traffic["probe"]),
        "attack_summary": (
            slow_summary(traffic["slow"], s.connections)
            if attack == "slow"
            else attack_summary(traffic["replies"], wall)
        ),
        "memory": memory,
        "memory_failures": mem_failures,
        "replicas": {**replaced, "ids_before": ids_before, "ids_after": app_replica_ids(target.base)},
        "ready_after_s": None if ready is None else round(ready, 2),
        "series": {
            "probe": [(round(r.t, 3), round(r.latency_s, 4), r.status) for r in traffic["probe"]],
            "attack": [(round(r.t, 3), round(r.latency_s, 4), r.status) for r in traffic["replies"]]
            + [(round(o.t + o.held_s, 3), round(o.held_s, 3), o.status or 0) for o in traffic["slow"]],
            "rss_mb": {k: v for k, v in (mon.series.items() if mon else [])},
        },
    }
    if attack == "gzip":
        phase["gzip_body_bytes"] = len(attack_requests("gzip", gzip_inflated_bytes=s.gzip_inflated_bytes)[0].body)
        phase["gzip_inflated_bytes"] = gzip_json_bomb(s.gzip_inflated_bytes)[1]
    phase["failures"] = phase_failures(phase, th)
    return phase


def warm_up(base: str, requests: int, timeout_s: float = 30.0) -> list[int]:
    """A few normal requests first: first-request costs (handles, first batches) are not an attack's doing."""
    import httpx

    statuses = []
    with httpx.Client(timeout=timeout_s) as client:
        for i in range(requests):
            image = probe_images()[i % len(probe_images())]
            with contextlib.suppress(httpx.HTTPError):
                statuses.append(client.post(base + CLASSIFY, content=image, headers=_JPEG).status_code)
    return statuses


def run_attacks(url: str, attacks: Sequence[str], s: Settings, progress: bool = True) -> dict[str, Any]:
    """Warm the app at `url` up, measure it idle, then each attack class in turn."""
    warmed = warm_up(base_url(url), s.warmup_requests)
    target = attach(url)
    target.notes.append(f"warm-up answers: {dict(Counter(warmed))}")
    phases = []
    for attack in attacks:
        if progress:
            print(f"-- {attack}: {s.duration_s:g} s ...", file=sys.stderr, flush=True)
        phases.append(run_phase(target, attack, s))
        if progress:
            print(phase_line(phases[-1]), file=sys.stderr, flush=True)
    return {
        "url": target.base,
        "settings": asdict(s),
        "raylet_pid": target.raylet_pid,
        "idle_mb": target.idle_mb,
        "notes": target.notes,
        "phases": phases,
        "failures": {p["attack"]: p["failures"] for p in phases},
    }


# --------------------------------------------------------------------------- output


def _mb(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def phase_line(phase: dict[str, Any]) -> str:
    p = phase["probe"]
    rate = "n/a" if p["success_rate"] is None else f"{p['success_rate']:.1%}"
    p99 = "n/a" if p["p99_s"] is None else f"{p['p99_s']:.2f} s"
    verdict = "ok" if not phase["failures"] else "FAILED: " + "; ".join(phase["failures"])
    return f"   probe {p['ok']}/{p['requests']} ({rate}), p99 {p99}; {verdict}"


def _attack_cell(phase: dict[str, Any]) -> str:
    a = phase["attack_summary"]
    if phase["attack"] == "slow":
        return f"{a['attempts']} conns: {a['how']}; replies {a['responses'] or '-'}"
    return f"{a['requests']} req: {a['statuses']}"


def summary_table(result: dict[str, Any]) -> str:
    rows = []
    for ph in result["phases"]:
        p = ph["probe"]
        mem = ph["memory"]
        pre = [m for m in mem.values() if m["label"] == "Preprocessor"]
        others = [(k, m.get("growth_mb")) for k, m in mem.items() if m["replica"] and m["label"] != "Preprocessor"]
        worst = max(others, key=lambda kv: kv[1] if kv[1] is not None else -1e9, default=(None, None))
        rep = ph["replicas"]
        rows.append(
            [
                ph["attack"],
                ph["clients"],
                _attack_cell(ph),
                ph["attack_summary"]["violations"],
                f"{p['ok']}/{p['requests']}",
                None if p["success_rate"] is None else 100 * p["success_rate"],
                None if p["p50_s"] is None else 1000 * p["p50_s"],
                None if p["p99_s"] is None else 1000 * p["p99_s"],
                ", ".join(f"{_mb(m['peak_mb'])}/{_mb(m.get('limit_mb'))}" for m in pre) or "n/a",
                "n/a" if worst[0] is None else f"{worst[1]} ({worst[0].split('[')[0]})",
                len(rep.get("gone", [])) + len(rep.get("new", [])),
                "ok" if not ph["failures"] else "FAILED",
            ]
        )
    headers = (
        "attack",
        "clients",
        "attack answers",
        "violations",
        "probe ok",
        "probe ok %",
        "probe p50 ms",
        "probe p99 ms",
        "Preprocessor peak/limit MB",
        "max other growth MB",
        "replicas replaced",
        "verdict",
    )
    return markdown_table(headers, rows)


def memory_table(result: dict[str, Any]) -> str:
    keys = sorted({k for ph in result["phases"] for k in ph["memory"]})
    headers = ["process", "idle MB", *(f"{ph['attack']} start/peak MB" for ph in result["phases"])]
    rows = []
    for k in keys:
        row: list[Any] = [k, result["idle_mb"].get(k)]
        for ph in result["phases"]:
            m = ph["memory"].get(k)
            row.append(f"{_mb(m['start_mb'])}/{_mb(m['peak_mb'])}" if m else "-")
        rows.append(row)
    return markdown_table(headers, rows, digits=0)


def plot(result: dict[str, Any], out: Path) -> Path:
    """Probe latency, attack answers and every Serve process's RSS on one time axis, phases shaded."""
    plt = pyplot()
    fig, (ax_lat, ax_att, ax_mem) = plt.subplots(3, 1, figsize=(11, 9.5), sharex=True)
    colours = {"bombs": "#fde0dd", "gzip": "#e0ecf4", "slow": "#e5f5e0"}
    for ph in result["phases"]:
        t0 = ph["t_start"]
        for ax in (ax_lat, ax_att, ax_mem):
            ax.axvspan(t0, t0 + ph["wall_s"], color=colours.get(ph["attack"], "#eeeeee"), alpha=0.6, lw=0)
        ax_lat.text(t0, 1.02, ph["attack"], transform=ax_lat.get_xaxis_transform(), fontsize=8)
        pts = ph["series"]["probe"]
        ok = [(t + lat, lat) for t, lat, st in pts if st == 200]
        bad = [(t + lat, lat) for t, lat, st in pts if st != 200]
        ax_lat.scatter([x for x, _ in ok], [y for _, y in ok], s=4, c="tab:green")
        ax_lat.scatter([x for x, _ in bad], [y for _, y in bad], s=10, c="tab:red", marker="x")
        by: dict[int, list[float]] = {}
        for t, lat, st in ph["series"]["attack"]:  # when each answer came (slow: when the connection ended)
            by.setdefault(st, []).append(t + lat if ph["attack"] != "slow" else t)
        for st, ts in sorted(by.items()):
            edges = np.arange(math.floor(min(ts)), math.ceil(max(ts)) + 1.0)
            if len(edges) < 2:
                edges = np.array([math.floor(min(ts)), math.floor(min(ts)) + 1.0])
            counts, _ = np.histogram(ts, edges)
            label = f"{ph['attack']}: {st or 'no answer'}"
            ax_att.step(edges[:-1], counts, where="post", lw=1, label=label)
    th = result["settings"]["thresholds"]
    ax_lat.axhline(th["max_p99_s"], color="tab:red", ls="--", lw=0.8, label=f"p99 limit {th['max_p99_s']:g} s")
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("probe latency (s)\ngreen 200, red other")
    ax_lat.legend(fontsize=7, loc="upper right")
    ax_att.set_ylabel("attack answers per second\nby status (slow: ends)")
    ax_att.legend(fontsize=7, ncol=4, loc="upper left")
    series: dict[str, list[tuple[float, float]]] = {}
    for ph in result["phases"]:
        for key, pts in ph["series"]["rss_mb"].items():
            series.setdefault(key, []).extend(pts)
    for key, pts in sorted(series.items()):
        if pts and max(v for _, v in pts) > 50:
            ax_mem.plot([t for t, _ in pts], [v for _, v in pts], lw=1, label=key)
    for key, idle in result["idle_mb"].items():
        if key.startswith("Preprocessor["):
            ax_mem.axhline(idle + th["preprocessor_memory_mb"], color="k", ls=":", lw=0.8, label=f"{key} ceiling")
    ax_mem.set_ylabel("RSS (MB)")
    ax_mem.set_xlabel("seconds since the run started")
    ax_mem.legend(fontsize=6, ncol=3, loc="upper left")
    fig.suptitle(f"hostile load on {result['url']}", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def parse_attacks(text: str) -> list[str]:
    """--attack: bombs, gzip, slow, a comma list of them, or all (that order)."""
    names = [a.strip() for a in text.split(",") if a.strip()]
    if names == ["all"]:
        return list(ATTACKS)
    unknown = [a for a in names if a not in ATTACKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown attack(s) {unknown or text!r}; use {', '.join(ATTACKS)} or all")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the app (loopback only)")
    parser.add_argument("--attack", type=parse_attacks, default=list(ATTACKS), help="bombs|slow|gzip|all or a list")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per attack class")
    parser.add_argument("--clients", type=int, default=16, help="attacking clients (bombs, gzip)")
    parser.add_argument("--connections", type=int, default=200, help="slow-body connections")
    parser.add_argument("--probe-clients", type=int, default=3)
    parser.add_argument("--probe-interval", type=float, default=0.1, help="s between one probe client's requests")
    parser.add_argument("--slow-length", type=int, default=100 * 1024, help="declared Content-Length")
    parser.add_argument("--slow-interval", type=float, default=1.0, help="s per trickled body byte")
    parser.add_argument("--gzip-inflated", type=int, default=_LIMITS.max_body_bytes, help="bytes the gzip inflates to")
    parser.add_argument("--no-v2-bombs", action="store_true", help="bombs only as /v1/classify bodies")
    parser.add_argument(
        "--preprocessor-memory-mb",
        type=float,
        default=Thresholds.preprocessor_memory_mb,
        help="the app's Limits.preprocessor_memory_bytes in MB (ceiling above the Preprocessor's idle RSS)",
    )
    parser.add_argument("--other-growth", type=float, default=300.0, help="MB any other replica may grow by")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (the PNG goes beside it)")
    args = parser.parse_args(argv)
    try:
        require_loopback(args.url)
    except NonLoopbackURL as e:
        parser.exit(2, f"error: {e}\n")
    env = print_environment()
    settings = Settings(
        duration_s=args.duration,
        clients=args.clients,
        connections=args.connections,
        probe_clients=args.probe_clients,
        probe_interval_s=args.probe_interval,
        slow_content_length=args.slow_length,
        slow_interval_s=args.slow_interval,
        gzip_inflated_bytes=args.gzip_inflated,
        v2_bombs=not args.no_v2_bombs,
        thresholds=Thresholds(preprocessor_memory_mb=args.preprocessor_memory_mb, other_growth_mb=args.other_growth),
    )
    result = run_attacks(args.url, args.attack, settings)
    result["environment"] = env
    result["argv"] = sys.argv[1:] if argv is None else argv
    out = args.out or RESULTS_DIR / f"hostile_load-{stamp()}-{host_name()}.json"
    write_json(out, result)
    png = plot(result, out.with_suffix(".png"))
    for note in result["notes"]:
        print(f"note: {note}")
    print(summary_table(result))
    print(memory_table(result))
    for attack, failures in result["failures"].items():
        for f in failures:
            print(f"FAILED {attack}: {f}")
    print(f"wrote {out} and {png}")
    return 1 if any(result["failures"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
