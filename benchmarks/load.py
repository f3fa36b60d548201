"""The HTTP load generator for the classify contract (v1 single and batch, V2 infer), loopback targets only.

One loop (`drive`), bounded in requests and in time, closed (C requests in flight, the next sent as soon as one
returns: `closed_step`) or open (Poisson arrivals sent on schedule whatever the responses are doing, latency from
the scheduled time: no coordinated omission; `open_run`). run.py's closed-loop steps run in wrk (`wrk_step`: a
fraction of this client's CPU), the same payloads sent by benchmarks/wrk.lua. Requests cycle through a fixed
corpus of JPEGs (benchmarks.corpus); warm-up requests are dropped. Used by run.py, soak.py and sweep.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import itertools
import json
import math
import os
import random
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from app.front.haproxy_config import Front
from app.protocol import v2
from app.served_model import MODEL_NAME
from benchmarks.corpus import SIZES, CorpusImage, build_corpus
from benchmarks.report import fmt
from benchmarks.stats import PERCENTILES, latency_summary, median

DEFAULT_URL = "http://127.0.0.1:8000/v1/classify"
BOUNDARY = "benchmark-boundary-7d3c1f0e9a"
WRK_LUA = Path(__file__).with_name("wrk.lua")
Payload = tuple[bytes, dict[str, str]]  # a request's body and headers (Content-Type; V2: the JSON header's length)
BATCH_SIZE, VARIANT = re.compile(rb'"batch_size":\s*(\d+)'), re.compile(rb'"variant":\s*"([^"]*)"')
MAX_INFLIGHT = 512  # the open loop's own bound: past it a due request is not sent but counted (client_overflow)


class NonLoopbackURL(ValueError):
    """The load generator only targets this machine."""


def require_loopback(url: str) -> str:
    """Return `url` if it is http(s) to a loopback address (an IP literal or 'localhost'), else raise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NonLoopbackURL(f"not an http(s) URL with a host: {url!r}")
    host = parts.hostname
    try:
        addresses = {ipaddress.ip_address(host)}
    except ValueError:
        if host.lower() != "localhost":  # never resolve other names: DNS may point anywhere
            raise NonLoopbackURL(f"refusing {host!r}: only loopback targets (127.0.0.0/8, ::1, localhost)") from None
        addresses = {ipaddress.ip_address(str(a[4][0]).split("%")[0]) for a in socket.getaddrinfo(host, parts.port)}
    if not addresses or not all(a.is_loopback for a in addresses):
        raise NonLoopbackURL(f"refusing {url!r}: {host} is not a loopback address")
    return url


def multipart_body(images: Iterable[CorpusImage], boundary: str = BOUNDARY) -> Payload:
    """The app's batch request: a multipart/form-data body with one `file` part per image, and its headers."""
    head = '--{}\r\nContent-Disposition: form-data; name="file"; filename="{}.jpg"\r\nContent-Type: {}\r\n\r\n'
    parts = b"".join(head.format(boundary, im.name, im.content_type).encode() + im.data + b"\r\n" for im in images)
    return parts + f"--{boundary}--\r\n".encode(), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def v2_request(images: bytes | Sequence[bytes], top_k: int = 5) -> Payload:
    """(body, headers) of a V2 binary inference request: `images` the elements of the BYTES input, shape [N, 1] (what
    a Triton model with dynamic batching takes; the app takes [N] too), top-k out."""
    images = [images] if isinstance(images, bytes) else list(images)
    size = sum(4 + len(im) for im in images)
    tensor = {"name": v2.IMAGE_BYTES_INPUT, "datatype": "BYTES", "shape": [len(images), 1]}
    tensor["parameters"] = {"binary_data_size": size}
    out = {"name": v2.TOP_K, "parameters": {"classification": top_k}}
    header = json.dumps({"inputs": [tensor], "outputs": [out]}, separators=(",", ":")).encode()
    headers = {"Content-Type": v2.BINARY_CONTENT_TYPE, v2.HEADER_LENGTH: str(len(header))}
    return header + b"".join(struct.pack("<I", len(im)) + im for im in images), headers


@functools.lru_cache(maxsize=4)  # the same bodies whatever the target and variant: built once per process
def build_payloads(corpus: tuple[CorpusImage, ...], per_request: int, protocol: str = "v1") -> tuple[Payload, ...]:
    """One payload per corpus image (the i-th takes images i, i+1, ... cyclically), encoded once up front."""
    if per_request < 1:
        raise ValueError(f"cannot send {per_request} images per {protocol} request")
    payloads = []
    for i in range(len(corpus)):
        ims = [corpus[(i + j) % len(corpus)] for j in range(per_request)]
        if protocol == "v2":
            payloads.append(v2_request([im.data for im in ims]))
        elif per_request == 1:
            payloads.append((ims[0].data, {"Content-Type": ims[0].content_type}))
        else:
            payloads.append(multipart_body(ims))
    return tuple(payloads)


@dataclass(frozen=True)
class Workload:
    """What each request of a run looks like."""

    url: str = DEFAULT_URL  # /v1/classify; the batch and V2 endpoints are beside it
    variant: str | None = None  # v1: sent as X-Model-Variant when set; v2: the model name's suffix
    images_per_request: int = 1  # more than one: POST /v1/classify/batch
    timeout_s: float = 30.0
    sizes: tuple[tuple[int, int], ...] = SIZES
    protocol: str = "v1"  # or "v2": POST /v2/models/<model>/infer, the images as one BYTES input
    client: str | None = None  # sent as the admission front's client header (Front.client_header) when set
    extra: tuple[tuple[str, str], ...] = ()  # more headers on every request (a caller's traceparent)

    @property
    def target(self) -> str:
        path = urlsplit(self.url).path.rstrip("/")
        if self.protocol == "v2":
            path = f"/v2/models/{v2.model_name_for(MODEL_NAME, self.variant)}/infer"
        elif self.images_per_request > 1:
            path += "/batch"
        return urlsplit(self.url)._replace(path=path).geturl()

    def headers(self) -> dict[str, str]:
        out = {"X-Model-Variant": self.variant} if self.variant and self.protocol == "v1" else {}
        return out | ({Front.client_header: self.client} if self.client else {}) | dict(self.extra)

    def payloads(self) -> tuple[Payload, ...]:
        return build_payloads(build_corpus(self.sizes), self.images_per_request, self.protocol)


@dataclass
class Sample:
    """One request: when it was due (s, on the step's clock), how long it took, and what came back."""

    due: float
    latency_s: float
    status: int | str
    variant: str | None = None
    batch_sizes: list[int] = field(default_factory=list)


def read_reply(status: int, headers: Any, body: bytes) -> tuple[str | None, list[int]]:
    """The variant that served a reply (header first, then body) and the model batch sizes it reports, found as
    benchmarks/wrk.lua finds them (no JSON parsing on the client's loop)."""
    found = VARIANT.search(body) if status == 200 else None
    variant = headers.get("X-Model-Variant") or (found[1].decode() if found else None)
    return variant, [int(n) for n in BATCH_SIZE.findall(body)] if status == 200 else []


async def drive(
    workload: Workload, slots: int, schedule: list[float] | None = None, until_s: float = math.inf, cap: int = -1
) -> tuple[list[Sample], float]:
    """The load loop. `schedule` None, closed: a request as soon as one of `slots` frees, until `until_s` s or
    `cap` requests. Else open: a request at each offset (s) of `schedule`, or, when every slot is taken, none
    (a `client_overflow` error: the client's own bound, never silent). The samples, and when (s) the last was sent."""
    samples, last_launch, payloads, free = list[Sample](), 0.0, workload.payloads(), asyncio.Semaphore(slots)
    clock0, timeout = time.perf_counter(), aiohttp.ClientTimeout(total=workload.timeout_s)

    async def one(session: aiohttp.ClientSession, payload: Payload, due: float) -> None:
        """POST one payload; latency runs from `due` (an absolute perf_counter time) to the last byte read."""
        status: int | str
        variant, sizes, (body, headers) = None, list[int](), payload
        try:
            async with session.post(workload.target, data=body, headers={**headers, **workload.headers()}) as r:
                status, (variant, sizes) = r.status, read_reply(r.status, r.headers, await r.read())
        except asyncio.TimeoutError:
            status = "timeout"
        except aiohttp.ClientError as e:
            status = type(e).__name__
        finally:
            free.release()
        samples.append(Sample(due - clock0, time.perf_counter() - due, status, variant, sizes))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=slots), timeout=timeout) as session:
        tasks = []
        for i, offset in enumerate(itertools.repeat(None) if schedule is None else schedule):
            if offset is None:
                await free.acquire()
                if time.perf_counter() - clock0 >= until_s or i == cap:
                    break
            else:
                await asyncio.sleep(clock0 + offset - time.perf_counter())  # the schedule, not a wait for anything
                if free.locked():
                    samples.append(Sample(offset, 0.0, "client_overflow"))
                    continue
                await free.acquire()
            due = clock0 + offset if offset is not None else time.perf_counter()
            last_launch = due - clock0
            tasks.append(asyncio.create_task(one(session, payloads[i % len(payloads)], due)))
        await asyncio.gather(*tasks)
    return samples, last_launch


def _step(
    wl: Workload, span: float, done: int, errors: Counter[str], variants: Counter[str], sizes: list[int], **more: Any
) -> dict[str, Any]:
    """A step as run.py, soak.py and sweep.py read it: what was sent, the throughput (`done` successes over `span`
    s), the errors by status, the variants that served, the median batch size and `more` (mode, concurrency or rate,
    requests, ok, latency_ms)."""
    rps = done / span if span > 0 else None
    per_s = None if rps is None else rps * wl.images_per_request
    step = {"url": wl.target, "variant": wl.variant, "images_per_request": wl.images_per_request, **more}
    step |= {"window_s": round(span, 3), "throughput_rps": rps, "images_per_s": per_s}
    step |= {"errors": dict(sorted(errors.items())), "variants": dict(sorted(variants.items()))}
    return step | {"median_batch_size": median(sizes)}


def summarize(wl: Workload, samples: Sequence[Sample], window: tuple[float, float], **head: Any) -> dict[str, Any]:
    """Figures of the requests due inside the measurement window (warm-up excluded); throughput counts the
    successes that ended inside it, latency the successes."""
    start, end = window
    measured = [s for s in samples if start <= s.due <= end]
    ok = [s for s in measured if s.status == 200]
    done = sum(1 for s in samples if s.status == 200 and start <= s.due + s.latency_s <= end)
    errors = Counter(str(s.status) for s in measured if s.status != 200)
    variants, sizes = Counter(s.variant or "unknown" for s in ok), [b for s in ok for b in s.batch_sizes]
    head |= {"requests": len(measured), "ok": len(ok), "latency_ms": latency_summary([s.latency_s for s in ok])}
    return _step(wl, end - start, done, errors, variants, sizes, **head)


async def closed_step(
    wl: Workload, concurrency: int, duration_s: float, warmup_s: float = 1.0, max_requests: int | None = None
) -> dict[str, Any]:
    """`concurrency` requests in flight, the next sent as soon as one returns, until time or the cap runs out."""
    require_loopback(wl.url)
    cap = -1 if max_requests is None else max_requests
    samples, last = await drive(wl, concurrency, until_s=warmup_s + duration_s, cap=cap)
    # The window closes at the deadline, or at the last launch if the cap ran out first (all of it if in warm-up).
    end = last if len(samples) == cap else warmup_s + duration_s
    window = (warmup_s, end) if end > warmup_s else (0.0, max(last, 1e-9))
    return _print_step(summarize(wl, samples, window, mode="closed", concurrency=concurrency))


def poisson_schedule(rate: float, duration_s: float, max_requests: int, seed: int = 0) -> list[float]:
    """Arrival offsets (s) of a Poisson process at `rate`/s: exponential gaps, at most max_requests, < duration_s."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    gaps = random.Random(seed)
    arrivals = itertools.accumulate(gaps.expovariate(rate) for _ in range(max_requests))
    return list(itertools.takewhile(lambda t: t < duration_s, arrivals))


async def open_run(
    wl: Workload, rate: float, duration_s: float = 10.0, warmup_s: float = 2.0, max_requests: int = 10_000
) -> dict[str, Any]:
    """Requests on a Poisson schedule whatever the server is doing (at most MAX_INFLIGHT at once); the ones the
    client could not send are counted."""
    require_loopback(wl.url)
    schedule = poisson_schedule(rate, warmup_s + duration_s, max_requests)
    samples, _ = await drive(wl, MAX_INFLIGHT, schedule)
    # The window is the schedule's measured part; it ends early if the request cap cut the schedule short.
    end = min(warmup_s + duration_s, schedule[-1] if len(schedule) == max_requests else math.inf)
    if not any(s.due >= warmup_s for s in samples):  # the cap ran out during warm-up
        warmup_s, end = 0.0, max((s.due for s in samples), default=0.0) + 1e-9
    return _print_step(summarize(wl, samples, (warmup_s, end), mode="open", rate=rate))


def wrk_step(
    wl: Workload, concurrency: int, duration_s: float, warmup_s: float = 1.0, cpu: Callable[[], float] | None = None
) -> dict[str, Any]:
    """A closed-loop step in wrk: whole seconds (a run for the warm-up, one for the measured window), no request
    cap, latency over every response (errors too). `cpu`: the server's CPU seconds so far, read around the measured
    run (server_cpu_s), beside wrk's own (client_cpu_s)."""
    parts, payloads = urlsplit(require_loopback(wl.target)), wl.payloads()
    with tempfile.TemporaryDirectory(prefix="wrk-") as tmp:
        for i, (body, headers) in enumerate(payloads, 1):  # raw HTTP requests, which wrk.lua sends in turn
            fields = {"Host": parts.netloc, "Content-Length": len(body), **headers, **wl.headers()}
            lines = f"POST {parts.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
            Path(tmp, f"{i}.http").write_bytes(lines.encode() + b"\r\n" + body)

        def wrk(seconds: float) -> dict[str, Any]:
            whole_s = [f"-d{max(1, round(seconds))}s", f"--timeout={max(1, round(wl.timeout_s))}s"]  # wrk's units
            cmd = ["wrk", f"-c{concurrency}", f"-t{min(concurrency, 2)}", *whole_s, "-s", str(WRK_LUA), wl.target]
            out = subprocess.run([*cmd, "--", tmp, str(len(payloads))], capture_output=True, text=True)
            if out.returncode:  # e.g. nothing listens there any more
                raise ConnectionError(f"wrk: {out.stderr.strip() or out.stdout.strip()}")
            return dict(json.loads(out.stdout.splitlines()[-1]))  # the last line: wrk.lua's done()

        warm = wrk(warmup_s) if warmup_s > 0 else {"requests": 0}
        # A server that cannot cancel (a blocked event loop, a batch queue) still serves the requests of clients
        # that left (the warm-up's, the last step's): one request answered after them drains that backlog first.
        drain = urllib.request.Request(wl.target, payloads[0][0], {**payloads[0][1], **wl.headers()})
        with contextlib.suppress(OSError):
            urllib.request.urlopen(drain, timeout=wl.timeout_s).read()
        server0, client0 = cpu() if cpu else None, os.times()
        got = wrk(duration_s)
        client1, server1 = os.times(), cpu() if cpu else None
    statuses, lat = Counter(got["statuses"]), got["latency_us"]
    ok = statuses.pop("200", 0)
    errors = statuses + Counter(got["socket"])  # connect, read, write, timeout: the ones that happened
    sizes = [int(size) for size, n in got["batch_sizes"].items() for _ in range(n)]
    latency = {f"{q}_ms": lat[q] / 1000 if ok else None for q in [*(f"p{p}" for p in PERCENTILES), "max"]}
    head = {"mode": "closed", "concurrency": concurrency, "client": "wrk", "requests": got["requests"], "ok": ok}
    head["warmup_requests"] = warm["requests"]  # sent before the window (and one drain request): not measured
    head["client_cpu_s"] = round(sum(client1[2:4]) - sum(client0[2:4]), 3)
    head["server_cpu_s"] = None if server0 is None or server1 is None else round(server1 - server0, 3)
    step = _step(wl, got["duration_us"] / 1e6, ok, errors, Counter(got["variants"]), sizes, latency_ms=latency, **head)
    return _print_step(step)


def _print_step(step: dict[str, Any]) -> dict[str, Any]:
    """One line per step on stderr while a run goes on (the tables come at the end)."""
    load = f"c={step['concurrency']}" if step["mode"] == "closed" else f"{step['rate']:g}/s"
    figures = {k: step[k] for k in ("throughput_rps", "images_per_s", "requests", "errors", "variants")}
    figures |= {k: step["latency_ms"][k] for k in ("p50_ms", "p99_ms")} | {"batch": step["median_batch_size"]}
    print(f"  {load:>8}  " + "  ".join(f"{k}={fmt(v)}" for k, v in figures.items()), file=sys.stderr)
    return step
