"""Hostile load: attack classes run against a live app while a probe sends normal images.

    python -m benchmarks.hostile_load --url http://127.0.0.1:8000 --attack all --duration 30 \\
        --clients 16 --connections 200

Each attack class runs for --duration seconds while four probe clients send sample JPEGs to /v1/classify: bombs
(the float32 TIFF and 16-bit PNG memory bombs of tests/hostile.py, to /v1/classify and as V2 BYTES inputs), gzip
(a ~10 KB gzip body inflating to 10 MiB of `{"inputs":[[],[],...]}`, to the V2 infer endpoint), slow (raw
connections trickling a body a byte a second, reconnecting whenever the server ends them), slowhead (the same with
a request head that never ends: its last header trickled a byte a second, slowloris). Around each phase it
samples the resident memory of the Serve processes under the raylet serving the URL's port (never another Ray on
this machine) and compares their pids before and after. A phase fails (the issue's "Done when") unless: probe
success >= 99% and p99 < 3 s; no replica replaced; the Preprocessor's peak RSS under its idle RSS plus
Limits.preprocessor_memory_bytes, every other replica's within 300 MB of its start; every attack answer a JSON
4xx or 503 (slow bodies and heads: closed by the server, or answered 400/408/413/503).
Writes benchmarks/results/hostile_load-<stamp>-<host>.json and .png; exits 1 if a phase failed. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import random
import re
import statistics
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
import httpx
import numpy as np

from app.config import Limits
from app.served_model import MODEL_NAME
from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.load import require_loopback, v2_request
from benchmarks.procs import Monitor, Proc, node_serving, process_label, serve_processes
from benchmarks.report import fmt, markdown_table, pyplot, save_figure, write_json
from benchmarks.stats import latency_summary

MB = 1024 * 1024
ATTACKS = ("bombs", "gzip", "slow", "slowhead")  # "all" runs them in this order (the slow ones hold connections)
TRICKLED = frozenset({"slow", "slowhead"})  # the attacks that hold connections open, trickling a byte at a time
CLASSIFY = "/v1/classify"
V2_INFER = f"/v2/models/{MODEL_NAME}/infer"
JPEG = {"Content-Type": "image/jpeg"}
SLOW_STATUSES = frozenset({400, 408, 413, 503})  # what a slow body's or slow head's connection may be answered with
_LIMITS = Limits()
v2_bytes_request = v2_request  # the V2 request of one BYTES image, by the name tests/test_hostile_http.py uses


@dataclass(frozen=True)
class AttackRequest:
    kind: str  # tiff_v1, png_v1, tiff_v2, png_v2, gzip_json, probe
    path: str
    body: bytes = field(repr=False)
    headers: dict[str, str]


@functools.cache
def bomb_images() -> dict[str, bytes]:
    """The two memory bombs of the hostile corpus: inside the pixel and body limits, over the decode budget."""
    from tests.hostile import png_16bit_rgba_bomb, tiff_float32_rgba_bomb

    return {"tiff": tiff_float32_rgba_bomb(), "png": png_16bit_rgba_bomb()}


def gzip_json_bomb(inflated_bytes: int) -> tuple[bytes, int]:
    """(a gzip body inflating to at most `inflated_bytes` of `{"inputs":[[],[],...]}`, its inflated size).

    Compressed in chunks (the text is never whole in memory); ~1000:1, so 10 MiB inflate from ~10 KB.
    """
    lists = max(1, (inflated_bytes - 12) // 3)  # 3 bytes a list ("[],"), plus '{"inputs":[' and ']}' less a ","
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: the gzip container
    out, step = [comp.compress(b'{"inputs":[')], 1 << 18
    for done in range(0, lists - 1, step):
        out.append(comp.compress(b"[]," * min(step, lists - 1 - done)))
    out += [comp.compress(b"[]]}"), comp.flush()]
    return b"".join(out), 12 + 3 * lists


def attack_requests(attack: str) -> list[AttackRequest]:
    """What the clients of `attack` (bombs or gzip) cycle through (client i starts at position i)."""
    if attack == "gzip":
        gzip_json = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        return [AttackRequest("gzip_json", V2_INFER, gzip_json_bomb(_LIMITS.max_body_bytes)[0], gzip_json)]
    images = bomb_images().items()
    v1 = [AttackRequest(f"{name}_v1", CLASSIFY, data, {"Content-Type": f"image/{name}"}) for name, data in images]
    return v1 + [AttackRequest(f"{name}_v2", V2_INFER, *v2_request(data)) for name, data in images]


@functools.cache
def probe_images() -> tuple[bytes, ...]:
    """Normal traffic: the bundled sample photographs that are JPEGs of at most 300 KB (small, cheap)."""
    from app.toolchain.samples import available_photos, sample_bytes

    return tuple(d for d in map(sample_bytes, available_photos()) if d[:2] == b"\xff\xd8" and len(d) <= 300_000)


def slow_request_head(host: str, port: int, content_length: int) -> bytes:
    return (
        f"POST {CLASSIFY} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: hostile-load-slow-body\r\n"
        f"Content-Type: image/jpeg\r\nContent-Length: {content_length}\r\n\r\n"
    ).encode()


def slow_head_start(host: str, port: int) -> bytes:
    """A request head that never ends: the rest of its last header comes a byte at a time (slowloris)."""
    return (
        f"POST {CLASSIFY} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: hostile-load-slow-head\r\n"
        "Content-Type: image/jpeg\r\nX-Trickle: "
    ).encode()


@dataclass
class Reply:
    """One HTTP exchange or slow-body connection: when it started (s, run clock), what it was, how long it took and
    what came back (status 0: no reply)."""

    t: float
    kind: str  # the request's; a trickled one's end: response | closed (EOF) | reset | connect_failed | open_at_end
    status: int
    latency_s: float  # a trickled request: how long the connection was held
    json_ok: bool = False  # a JSON body; for an error, in the service's error shape
    code: str = ""  # the error code (V1), a digit-free prefix of the message (V2), or the client exception
    sent: int = 0  # a trickled request: the bytes trickled


def read_error(status: int, content_type: str | None, body: bytes) -> tuple[bool, str]:
    """(is the body JSON in the service's shape, the error code, or a V2 message with its digits out)."""
    if not (content_type or "").lower().startswith("application/json"):
        return False, ""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):  # not JSON, not an object
        return False, ""
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        return True, err["code"]
    if isinstance(err, str):
        return True, re.sub(r"\d+", "N", err)[:60]
    return status == 200, ""


def parse_http_reply(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, 0 if none, lower-cased headers, body) of a raw HTTP/1.x response, as far as `raw` goes."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/\d(?:\.\d)? (\d{3})", lines[0])
    fields = (line.partition(":") for line in lines[1:])
    return (int(m[1]) if m else 0), {k.strip().lower(): v.strip() for k, sep, v in fields if sep}, body


def is_proper_refusal(r: Reply) -> bool:
    return (400 <= r.status < 500 or r.status == 503) and r.json_ok


def status_counts(items: Sequence[Reply]) -> dict[str, int]:
    return dict(sorted(Counter(f"{r.status} {r.code}".strip() for r in items).items()))


def probe_summary(replies: Sequence[Reply]) -> dict[str, Any]:
    """Success rate and latency (ms, over every probe request, failed ones included) of normal traffic."""
    ok = sum(r.status == 200 for r in replies)
    return {
        "requests": len(replies),
        "ok": ok,
        "success_rate": ok / len(replies) if replies else None,
        **latency_summary([r.latency_s for r in replies]),
        "statuses": status_counts(replies),
    }


def attack_summary(replies: Sequence[Reply]) -> dict[str, Any]:
    """Counts by status and kind, and every answer that is not a JSON 4xx/503 (a violation)."""
    bad = [r for r in replies if not is_proper_refusal(r)]
    return {
        "requests": len(replies),
        "statuses": status_counts(replies),
        "by_kind": {k: status_counts([r for r in replies if r.kind == k]) for k in sorted({r.kind for r in replies})},
        "latency_ms": latency_summary([r.latency_s for r in replies]),
        "violations": len(bad),
        "violation_examples": [asdict(r) for r in bad[:5]],
    }


def slow_summary(outcomes: Sequence[Reply]) -> dict[str, Any]:
    """What became of the trickling connections: who ended them, how, after how long."""
    answered = [o for o in outcomes if o.kind == "response"]
    ended_by_server = [o.latency_s for o in outcomes if o.kind in ("response", "closed", "reset")]
    bad = [o for o in answered if o.status not in SLOW_STATUSES]
    return {
        "attempts": len(outcomes),
        "opened": sum(o.kind != "connect_failed" for o in outcomes),
        "how": dict(sorted(Counter(o.kind for o in outcomes).items())),
        "statuses": status_counts(answered),
        "non_json_responses": sum(not o.json_ok for o in answered),
        "held_by_server_s": {
            "median": statistics.median(ended_by_server) if ended_by_server else None,
            "max": max(ended_by_server, default=None),
        },
        "bytes_sent": sum(o.sent for o in outcomes),
        "violations": len(bad),
        "violation_examples": [asdict(o) for o in bad[:5]],
    }


def replicas_replaced(before: dict[str, Proc], after: dict[str, Proc]) -> dict[str, list[str]]:
    b = {(k, p.started) for k, p in before.items() if p.replica}
    a = {(k, p.started) for k, p in after.items() if p.replica}
    return {"gone": sorted(k for k, _ in b - a), "new": sorted(k for k, _ in a - b)}


def decode_allowance_mb(decoder: str, preprocessor_memory_mb: float, other_growth_mb: float) -> float:
    """What a decoding replica may add over its idle RSS: the decode ceiling, and a decoding Router (decode_in:
    router) other_growth_mb more for what it holds besides (bodies, the pipeline)."""
    return preprocessor_memory_mb + (other_growth_mb if decoder != "Preprocessor" else 0.0)


def memory_verdict(
    procs: dict[str, dict[str, Any]],
    preprocessor_memory_mb: float,
    other_growth_mb: float,
    decoder: str = "Preprocessor",
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per process {label, replica, idle_mb, start_mb, peak_mb, ...}: the limit that applies and what broke it.

    The replicas that decode (`decoder`: the Preprocessor, or the Router with `decode_in: router`): peak <= idle +
    preprocessor_memory_mb (the decode ceiling on top of the replica's own baseline, measured idle before the
    first attack), and a decoding Router other_growth_mb more for what it holds besides. Every other replica:
    peak - start_mb (where this phase started) <= other_growth_mb. Other Serve processes are reported, not judged.
    """
    rows, failures = {}, []
    for key, m in procs.items():
        pre, peak = m["label"] == decoder, m["peak_mb"]
        decoding = (m["idle_mb"], decode_allowance_mb(decoder, preprocessor_memory_mb, other_growth_mb))
        base, allowed = decoding if pre else (m["start_mb"], other_growth_mb)
        row = rows[key] = dict(m)
        if m["replica"] and base is not None:
            row["limit_mb"] = round(base + allowed, 1)
            row["growth_mb"] = None if peak is None else round(peak - base, 1)
            row["within"] = peak is None or peak <= row["limit_mb"]
            if not row["within"]:
                failures.append(f"{key}: peak RSS {peak:.0f} MB over its limit {row['limit_mb']:.0f} MB")
    return rows, failures


@dataclass(frozen=True)
class Settings:
    """How each phase is run, and the issue's "Done when" for it (the last four)."""

    duration_s: float = 30.0
    clients: int = 16
    connections: int = 200
    probe_clients: int = 4
    probe_interval_s: float = 0.1  # at most one request per probe client per interval: the probe is no load
    slow_content_length: int = 100 * 1024
    slow_interval_s: float = 1.0  # per trickled body byte
    settle_s: float = 2.0
    sample_every_s: float = 0.25
    timeout_s: float = 30.0
    warmup_requests: int = 6
    min_success: float = 0.99
    max_p99_s: float = 3.0
    preprocessor_memory_mb: float = _LIMITS.preprocessor_memory_bytes / MB  # over the decoder's idle RSS
    decoder: str = "Preprocessor"  # the deployment that decodes: decoder_of(url)
    other_growth_mb: float = 300.0  # over where any other replica's RSS stood when the phase started


@dataclass
class Target:
    """The app under attack: its base URL and, when found, the raylet whose Serve processes serve it."""

    base: str
    raylet_pid: int | None = None
    idle_mb: dict[str, float] = field(default_factory=dict)
    clock0: float = field(default_factory=time.perf_counter)
    notes: list[str] = field(default_factory=list)


def base_url(url: str) -> str:
    """scheme://host:port of any URL of the app (a /v1/classify URL works too); loopback only."""
    parts = urlsplit(require_loopback(url))
    return f"{parts.scheme}://{parts.netloc}"


def decoder_of(url: str) -> str:
    """The deployment that decodes images in the app at `url`, as its /v1/models says (AppArgs.decode_in)."""
    where = httpx.get(base_url(url) + "/v1/models", timeout=10).json().get("decode", {}).get("where")
    return "Router" if where == "router" else "Preprocessor"


def _decoder(result: dict[str, Any]) -> str:
    settings = result["settings"]
    return str((settings if isinstance(settings, dict) else asdict(settings)).get("decoder", "Preprocessor"))


def attach(url: str, raylet_pid: int | None = None) -> Target:
    """The app at `url`, its Serve processes' idle RSS measured (median of a few samples).

    The processes are those under `raylet_pid`, by default the raylet above whatever listens on the URL's port
    (HAProxy or Serve's proxy), so another Ray instance on this machine is never measured.
    """
    target, port = Target(base_url(url)), urlsplit(url).port or 80
    if raylet_pid is None and (node := node_serving(port)) is not None:
        raylet_pid = node.raylet_pid
    if raylet_pid is None:
        target.notes.append(f"no Ray node listens on port {port} here: memory and replicas not watched")
        return target
    target.raylet_pid = raylet_pid
    mon = Monitor(target.clock0, fixed=serve_processes(raylet_pid))
    for i in range(4):
        time.sleep(0.25 if i else 0)
        mon.sample()
    target.idle_mb = {k: statistics.median(v for _, v in pts) for k, pts in mon.series.items() if pts}
    return target


async def _read_reply(reader: asyncio.StreamReader) -> bytes:
    """The server's reply, b"" when it closes without one: the head, then the body it announces (2 s at most)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        return e.partial
    length = parse_http_reply(head)[1].get("content-length", "")
    rest = reader.readexactly(int(length)) if length.isdigit() else reader.read(65536)
    with contextlib.suppress(asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
        return head + await asyncio.wait_for(rest, 2.0)
    return head


@dataclass
class Traffic:
    """One phase's clients, each stopping at `stop_at` (perf_counter); times are kept from `target.clock0`."""

    target: Target
    s: Settings
    stop_at: float
    probe: list[Reply] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    async def run(self, attack: str, mon: Monitor) -> None:
        probe = [AttackRequest("probe", CLASSIFY, image, JPEG) for image in probe_images()]
        if attack in TRICKLED:
            load = self.slow_attack(head=attack == "slowhead")
        else:
            load = self.send(attack_requests(attack), self.s.clients, self.replies)
        async with mon.sampling(self.s.sample_every_s):
            await asyncio.gather(self.send(probe, self.s.probe_clients, self.probe, self.s.probe_interval_s), load)

    async def send(self, requests: Sequence[AttackRequest], clients: int, out: list[Reply], every_s: float = 0) -> None:
        """`clients` workers POSTing `requests` in turn, back to back or at most one per `every_s` each."""
        clock0 = self.target.clock0

        async def worker(session: aiohttp.ClientSession, k: int) -> None:
            while (start := time.perf_counter()) < self.stop_at:
                req = requests[k % len(requests)]
                try:
                    async with session.post(self.target.base + req.path, data=req.body, headers=req.headers) as r:
                        json_ok, code = read_error(r.status, r.headers.get("Content-Type"), await r.read())
                        status = r.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    status, json_ok, code = 0, False, type(e).__name__
                out.append(Reply(start - clock0, req.kind, status, time.perf_counter() - start, json_ok, code))
                k += 1
                if (pause := min(start + every_s, self.stop_at) - time.perf_counter()) > 0:
                    await asyncio.sleep(pause)

        connector = aiohttp.TCPConnector(limit=clients, limit_per_host=clients)
        timeout = aiohttp.ClientTimeout(total=self.s.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await asyncio.gather(*(worker(session, i) for i in range(clients)))

    async def slow_attack(self, head: bool = False) -> None:
        async def slot(i: int) -> None:
            await asyncio.sleep(i * 0.005)  # 200 connects spread over a second, not one SYN burst
            while time.perf_counter() < self.stop_at and await self.slow_connection(head):
                await asyncio.sleep(0.2 + self.rng.random() * 0.3)  # the server ended it: come back, as attackers do

        await asyncio.gather(*(slot(i) for i in range(self.s.connections)))

    async def slow_connection(self, head: bool = False) -> bool:
        """Connect, send the head and trickle the body (head: send most of a head, trickle the rest of it, which
        never ends); the outcome in self.replies. False when open at the end."""
        url, length, clock0 = urlsplit(self.target.base), self.s.slow_content_length, self.target.clock0
        host, port = url.hostname or "127.0.0.1", url.port or 80
        opened = time.perf_counter()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
        except (OSError, asyncio.TimeoutError):
            self.replies.append(Reply(opened - clock0, "connect_failed", 0, 0.0))
            return True
        body, sent, how, status, json_ok, code = probe_images()[0], 0, "open_at_end", 0, False, ""
        reading = asyncio.create_task(_read_reply(reader))
        try:
            writer.write(slow_head_start(host, port) if head else slow_request_head(host, port, length))
            while sent < length and (left := self.stop_at - time.perf_counter()) > 0:
                # jittered, so 200 connections do not write in lockstep
                await asyncio.wait({reading}, timeout=min(left, self.s.slow_interval_s * self.rng.uniform(0.8, 1.2)))
                if reading.done() or time.perf_counter() >= self.stop_at:
                    break
                writer.write(b"a" if head else body[sent % len(body) : sent % len(body) + 1])
                await asyncio.wait_for(writer.drain(), 5.0)
                sent += 1
        except (ConnectionError, asyncio.TimeoutError):
            how = "reset"
        held = time.perf_counter() - opened
        if not reading.done():
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await reading
        elif isinstance(reading.exception(), OSError):  # ConnectionError included
            how = "reset"
        elif raw := reading.result():
            status, headers, reply = parse_http_reply(raw)
            how, (json_ok, code) = "response", read_error(status, headers.get("content-type"), reply)
        elif how != "reset":
            how = "closed"
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 2.0)
        self.replies.append(Reply(opened - clock0, how, status, held, json_ok, code, sent))
        return how != "open_at_end"


def phase_failures(phase: dict[str, Any], th: Settings) -> list[str]:
    out = []
    p, a, rep, name = phase["probe"], phase["attack_summary"], phase["replicas"], phase["attack"]
    if not p["requests"]:
        out.append("probe: no requests completed")
    elif p["success_rate"] < th.min_success:
        out.append(f"probe: success {p['success_rate']:.1%} < {th.min_success:.0%} ({p['statuses']})")
    if p["requests"] and p["p99_ms"] >= th.max_p99_s * 1000:
        out.append(f"probe: p99 {p['p99_ms'] / 1000:.2f} s >= {th.max_p99_s:g} s")
    if not (a["opened"] if name in TRICKLED else a["requests"]):
        out.append(f"{name}: no connection was opened" if name in TRICKLED else f"{name}: no attack request completed")
    if a["violations"]:
        allowed = f"an end or a {sorted(SLOW_STATUSES)}" if name in TRICKLED else "a JSON 4xx/503"
        out.append(f"{name}: {a['violations']} answers not {allowed}: {a['statuses']}")
    if rep["gone"] or rep["new"]:
        out.append(f"replicas replaced: gone {rep['gone']}, new {rep['new']}")
    return out + phase["memory_failures"]


def run_phase(target: Target, attack: str, s: Settings) -> dict[str, Any]:
    """One attack class for s.duration_s with the probe running; the figures and the failures."""
    procs = serve_processes(target.raylet_pid)
    mon = Monitor(target.clock0, fixed=procs)
    mon.sample()
    traffic, t_start = Traffic(target, s, time.perf_counter() + s.duration_s), time.perf_counter()
    asyncio.run(traffic.run(attack, mon))
    wall = time.perf_counter() - t_start
    time.sleep(s.settle_s)  # let closed connections and cancelled work reach the server
    mon.sample()
    memory = {k: {"label": process_label(p.argv), "replica": p.replica} for k, p in procs.items()}
    for k, m in memory.items():
        m |= {"idle_mb": target.idle_mb.get(k), "start_mb": mon.start(k), "peak_mb": mon.peak(k)}
    answers = traffic.replies
    memory, mem_failures = memory_verdict(memory, s.preprocessor_memory_mb, s.other_growth_mb, s.decoder)
    phase: dict[str, Any] = {
        "attack": attack,
        "wall_s": round(wall, 2),
        "t_start": round(t_start - target.clock0, 3),
        "clients": s.connections if attack in TRICKLED else s.clients,
        "probe": probe_summary(traffic.probe),
        "attack_summary": slow_summary(answers) if attack in TRICKLED else attack_summary(answers),
        "memory": memory,
        "memory_failures": mem_failures,
        "replicas": replicas_replaced(procs, serve_processes(target.raylet_pid)),
        "series": {
            "probe": [(round(r.t, 3), round(r.latency_s, 4), r.status) for r in traffic.probe],
            "attack": [(round(r.t, 3), round(r.latency_s, 4), r.status) for r in answers],
            "rss_mb": mon.series,
        },
    }
    phase["failures"] = phase_failures(phase, s)
    return phase


def phase_line(phase: dict[str, Any]) -> str:
    p = phase["probe"]
    rate = "n/a" if p["success_rate"] is None else f"{p['success_rate']:.1%}"
    p99 = "n/a" if p["p99_ms"] is None else f"{p['p99_ms'] / 1000:.2f} s"
    verdict = "ok" if not phase["failures"] else "FAILED: " + "; ".join(phase["failures"])
    return f"   probe {p['ok']}/{p['requests']} ({rate}), p99 {p99}; {verdict}"


SUMMARY_HEADERS = "attack|clients|attack answers|probe ok|probe p50/p99 ms|decoder peak/limit MB|replaced|verdict"


def summary_table(result: dict[str, Any]) -> str:
    rows, decoder = [], _decoder(result)
    for ph in result["phases"]:
        p, a, rep, memory = ph["probe"], ph["attack_summary"], ph["replicas"], ph["memory"].values()
        sent = f"{a['attempts']} conns: {a['how']}; replies" if ph["attack"] in TRICKLED else f"{a['requests']} req:"
        probe = [f"{p['ok']}/{p['requests']}", f"{fmt(p['p50_ms'])}/{fmt(p['p99_ms'])}"]
        pre = [f"{fmt(m['peak_mb'], 0)}/{fmt(m.get('limit_mb'), 0)}" for m in memory if m["label"] == decoder]
        rows.append([ph["attack"], ph["clients"], f"{sent} {a['statuses'] or '-'}", *probe, ", ".join(pre) or "n/a"])
        rows[-1] += [len(rep["gone"]) + len(rep["new"]), "FAILED" if ph["failures"] else "ok"]
    return markdown_table(SUMMARY_HEADERS.split("|"), rows)


def memory_table(result: dict[str, Any]) -> str:
    phases = result["phases"]
    headers = ["process", "idle MB", *(f"{ph['attack']} start/peak MB" for ph in phases)]
    rows = []
    for k in sorted({k for ph in phases for k in ph["memory"]}):
        cells = [
            f"{fmt(m['start_mb'], 0)}/{fmt(m['peak_mb'], 0)}" if m else "-"
            for m in (p["memory"].get(k) for p in phases)
        ]
        rows.append([k, result["idle_mb"].get(k), *cells])
    return markdown_table(headers, rows, digits=0)


def plot(result: dict[str, Any], out: Path) -> Path:
    """Probe latency, attack answers per second and every Serve process's RSS on one time axis, phases shaded."""
    fig, (ax_lat, ax_att, ax_mem) = pyplot().subplots(3, 1, figsize=(11, 9.5), sharex=True)
    th = result["settings"]
    rss: dict[str, list[tuple[float, float]]] = {}
    colours = {"bombs": "#fde0dd", "gzip": "#e0ecf4", "slow": "#e5f5e0", "slowhead": "#fff7bc"}
    for ph in result["phases"]:
        t0 = ph["t_start"]
        for ax in (ax_lat, ax_att, ax_mem):
            ax.axvspan(t0, t0 + ph["wall_s"], color=colours[ph["attack"]], alpha=0.6, lw=0)
        ax_lat.text(t0, 1.02, ph["attack"], transform=ax_lat.get_xaxis_transform(), fontsize=8)
        for ok, style in ((True, {"s": 4, "c": "tab:green"}), (False, {"s": 10, "c": "tab:red", "marker": "x"})):
            pts = [(t + lat, lat) for t, lat, st in ph["series"]["probe"] if (st == 200) == ok]
            ax_lat.scatter([x for x, _ in pts], [y for _, y in pts], **style)
        by: dict[int, list[float]] = {}
        for t, lat, st in ph["series"]["attack"]:  # when each answer came (slow: when the connection ended)
            by.setdefault(st, []).append(t + lat)
        for st, ts in sorted(by.items()):
            counts, edges = np.histogram(ts, np.arange(np.floor(min(ts)), np.floor(max(ts)) + 2.0))
            ax_att.step(edges[:-1], counts, where="post", lw=1, label=f"{ph['attack']}: {st or 'no answer'}")
        for key, pts in ph["series"]["rss_mb"].items():
            rss.setdefault(key, []).extend(map(tuple, pts))
    for key, pts in sorted(rss.items()):
        if pts and max(v for _, v in pts) > 50:
            ax_mem.plot([t for t, _ in pts], [v for _, v in pts], lw=1, label=key)
    decoder = _decoder(result)
    for key, idle in result["idle_mb"].items():
        if key.startswith(decoder + "["):
            allowed = decode_allowance_mb(decoder, th["preprocessor_memory_mb"], th.get("other_growth_mb", 0.0))
            ax_mem.axhline(idle + allowed, color="k", ls=":", lw=0.8, label=f"{key} ceiling")
    ax_lat.axhline(th["max_p99_s"], color="tab:red", ls="--", lw=0.8, label=f"p99 limit {th['max_p99_s']:g} s")
    ax_lat.set(yscale="log", ylabel="probe latency (s)\ngreen 200, red other")
    ax_att.set_ylabel("attack answers per second\nby status (slow: ends)")
    ax_mem.set(ylabel="RSS (MB)", xlabel="seconds since the run started")
    for ax, size, ncol in ((ax_lat, 7, 1), (ax_att, 7, 4), (ax_mem, 6, 3)):
        ax.legend(fontsize=size, ncol=ncol, loc="upper left")
    fig.suptitle(f"hostile load on {result['url']}", fontsize=10)
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", type=base_url, default="http://127.0.0.1:8000", help="the app (loopback only)")
    parser.add_argument("--attack", choices=["all", *ATTACKS], default="all", help="one class, or all in turn")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per attack class")
    parser.add_argument("--clients", type=int, default=16, help="attacking clients (bombs, gzip)")
    parser.add_argument("--connections", type=int, default=200, help="slow-body (slow-head) connections")
    args = parser.parse_args(argv)
    env = print_environment()
    s = Settings(
        duration_s=args.duration, clients=args.clients, connections=args.connections, decoder=decoder_of(args.url)
    )
    for i in range(s.warmup_requests):  # first requests pay one-off costs (handles, first batches): not an attack's
        with contextlib.suppress(httpx.HTTPError):
            image = probe_images()[i % len(probe_images())]
            httpx.post(args.url + CLASSIFY, content=image, headers=JPEG, timeout=s.timeout_s)
    target = attach(args.url)
    phases = []
    for attack in ATTACKS if args.attack == "all" else [args.attack]:
        print(f"-- {attack}: {s.duration_s:g} s ...", file=sys.stderr, flush=True)
        phases.append(run_phase(target, attack, s))
        print(phase_line(phases[-1]), file=sys.stderr, flush=True)
    result: dict[str, Any] = {"url": target.base, "settings": asdict(s), "raylet_pid": target.raylet_pid}
    result |= {"idle_mb": target.idle_mb, "notes": target.notes, "phases": phases, "environment": env, "argv": argv}
    out = write_json(RESULTS_DIR / f"hostile_load-{stamp()}-{host_name()}.json", result)
    png = plot(result, out.with_suffix(".png"))
    print("".join(f"note: {note}\n" for note in target.notes) + summary_table(result) + memory_table(result))
    print("".join(f"FAILED {ph['attack']}: {f}\n" for ph in phases for f in ph["failures"]), end="")
    print(f"wrote {out} and {png}")
    return 1 if any(ph["failures"] for ph in phases) else 0


if __name__ == "__main__":
    sys.exit(main())
