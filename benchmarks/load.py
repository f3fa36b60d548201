"""An asyncio HTTP load generator for the classify contract, loopback targets only.

Two modes, both bounded in requests and in time so a run always ends by itself:

- closed loop: a sweep over concurrency levels; at each level C workers send back to back (a new
  request as soon as the previous one returns) for warm-up + duration seconds or a request cap;
- open loop: Poisson arrivals at a fixed rate, each request launched on schedule whatever the
  responses are doing; latency is counted from the scheduled time, so a slow server cannot hide
  its queueing (no coordinated omission).

Requests cycle through a fixed corpus of JPEGs (benchmarks.corpus). Warm-up requests are dropped.

    python -m benchmarks.load --url http://127.0.0.1:8000/v1/classify --concurrency 1,4,16 --duration 5
    python -m benchmarks.load --mode open --rate 20 --duration 10 --variant int8
    python -m benchmarks.load --images-per-request 16 --concurrency 8      # POST /v1/classify/batch
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import random
import resource
import socket
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from tqdm import tqdm

from benchmarks import multipart
from benchmarks.corpus import SIZES, CorpusImage, build_corpus, parse_sizes
from benchmarks.environment import RESULTS_DIR, host_name, load_average, print_environment, stamp
from benchmarks.report import steps_table, write_json
from benchmarks.stats import latency_summary, median

DEFAULT_URL = "http://127.0.0.1:8000/v1/classify"
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)


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
        addresses = {ipaddress.ip_address(a[4][0].split("%")[0]) for a in socket.getaddrinfo(host, parts.port)}
    if not addresses or not all(a.is_loopback for a in addresses):
        raise NonLoopbackURL(f"refusing {url!r}: {host} is not a loopback address")
    return url


def batch_url(url: str) -> str:
    """The multi-image endpoint beside a /v1/classify URL."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    return parts._replace(path=path if path.endswith("/batch") else path + "/batch").geturl()


@dataclass(frozen=True)
class Payload:
    body: bytes
    content_type: str
    images: int


def build_payloads(
    corpus: Sequence[CorpusImage], images_per_request: int, multipart_single: bool = False
) -> list[Payload]:
    """One payload per corpus image (the i-th takes images i, i+1, ... cyclically), encoded once up front."""
    if images_per_request < 1:
        raise ValueError(f"images_per_request must be at least 1, got {images_per_request}")
    payloads = []
    for i in range(len(corpus)):
        ims = [corpus[(i + j) % len(corpus)] for j in range(images_per_request)]
        if images_per_request == 1 and not multipart_single:
            payloads.append(Payload(ims[0].data, ims[0].content_type, 1))
        else:
            body, ctype = multipart.encode([(f"{im.name}.jpg", im.data, im.content_type) for im in ims])
            payloads.append(Payload(body, ctype, len(ims)))
    return payloads


@dataclass(frozen=True)
class Workload:
    """What each request of a run looks like."""

    url: str = DEFAULT_URL
    variant: str | None = None  # sent as X-Model-Variant when set
    images_per_request: int = 1
    multipart_single: bool = False
    timeout_s: float = 30.0
    sizes: tuple[tuple[int, int], ...] = SIZES

    @property
    def target(self) -> str:
        return batch_url(self.url) if self.images_per_request > 1 else self.url

    def headers(self) -> dict[str, str]:
        return {"X-Model-Variant": self.variant} if self.variant else {}

    def payloads(self) -> list[Payload]:
        return build_payloads(build_corpus(self.sizes), self.images_per_request, self.multipart_single)


@dataclass
class Sample:
    """One request: when it was due (s, on the step's clock), how long it took, and what came back."""

    due: float
    latency_s: float
    status: int | str
    images: int
    variant: str | None = None
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def end(self) -> float:
        return self.due + self.latency_s


def read_reply(status: int, headers: Any, body: bytes) -> tuple[str | None, list[int]]:
    """The variant that served a reply (header first, then body) and the model batch sizes it reports."""
    variant = headers.get("X-Model-Variant")
    if status != 200:
        return variant, []
    try:
        doc = json.loads(body)
    except ValueError:
        return variant, []
    if not isinstance(doc, dict):
        return variant, []
    entries = doc.get("results") if isinstance(doc.get("results"), list) else [doc]
    sizes = []
    for entry in entries:
        size = (entry.get("timings_ms") or {}).get("batch_size") if isinstance(entry, dict) else None
        if isinstance(size, int | float):
            sizes.append(int(size))
    return variant or doc.get("variant"), sizes


async def send(
    session: aiohttp.ClientSession, workload: Workload, payload: Payload, due: float, clock0: float
) -> Sample:
    """POST one payload; latency runs from `due` (an absolute perf_counter time) to the last byte read."""
    headers = {"Content-Type": payload.content_type, **workload.headers()}
    try:
        async with session.post(workload.target, data=payload.body, headers=headers) as resp:
            body = await resp.read()
            status: int | str = resp.status
            variant, sizes = read_reply(resp.status, resp.headers, body)
    except asyncio.TimeoutError:
        status, variant, sizes = "timeout", None, []
    except aiohttp.ClientError as e:
        status, variant, sizes = type(e).__name__, None, []
    return Sample(due - clock0, time.perf_counter() - due, status, payload.images, variant, sizes)


def _session(workload: Workload, connections: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=workload.timeout_s))


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def summarize(samples: Sequence[Sample], window: tuple[float, float], dropped: int) -> dict[str, Any]:
    """Per-step figures from the requests due inside the measurement window (warm-up already excluded)."""
    start, end = window
    measured = [s for s in samples if start <= s.due <= end]
    ok = [s for s in measured if s.ok]
    span = end - start
    done_in_window = [s for s in samples if s.ok and start <= s.end <= end]
    rps = len(done_in_window) / span if span > 0 else None
    ips = sum(s.images for s in done_in_window) / span if span > 0 else None
    batch_sizes = [b for s in ok for b in s.batch_sizes]
    return {
        "window_s": round(span, 3),
        "requests": len(measured),
        "ok": len(ok),
        "warmup_dropped": dropped,
        "throughput_rps": rps,
        "images_per_s": ips,
        "latency_ms": latency_summary([s.latency_s for s in ok]),
        "errors": dict(sorted(Counter(str(s.status) for s in measured if not s.ok).items())),
        # How fast refusals come back (an overloaded service should shed in well under a second).
        "error_latency_ms": {
            status: latency_summary([s.latency_s for s in measured if str(s.status) == status])
            for status in sorted({str(s.status) for s in measured if not s.ok and isinstance(s.status, int)})
        },
        "variants": dict(sorted(Counter(s.variant or "unknown" for s in ok).items())),
        "median_batch_size": median(batch_sizes),
    }


class _Progress:
    """A time bar per step (steps are time-bound) with the running request and error counts."""

    def __init__(self, desc: str, seconds: float, enabled: bool) -> None:
        self.t0, self.total, self.requests, self.errors = time.perf_counter(), seconds, 0, 0
        self.bar = tqdm(
            total=round(seconds, 1),
            desc=desc,
            leave=False,
            disable=not enabled,
            mininterval=0.5,
            file=sys.stderr,
            bar_format="{desc}: {bar} {n:.0f}/{total:.0f}s{postfix}",
        )

    def done(self, sample: Sample) -> None:
        self.requests += 1
        self.errors += not sample.ok
        self.bar.set_postfix_str(f"{self.requests} req, {self.errors} errors", refresh=False)
        elapsed = min(time.perf_counter() - self.t0, self.total)
        self.bar.update(max(0.0, elapsed - self.bar.n))

    def close(self) -> None:
        self.bar.close()


async def closed_step(
    workload: Workload,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 1.0,
    max_requests: int | None = None,
    progress: bool = True,
    payloads: Sequence[Payload] | None = None,
) -> dict[str, Any]:
    """C workers, each sending its next request as soon as the last returns, until time or the cap runs out."""
    payloads = payloads or workload.payloads()
    samples: list[Sample] = []
    launched = 0
    cpu0, clock0 = _cpu_seconds(), time.perf_counter()
    warm_end, stop_at = clock0 + warmup_s, clock0 + warmup_s + duration_s
    last_launch = clock0
    bar = _Progress(f"closed c={concurrency}", warmup_s + duration_s, progress)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal launched, last_launch
        while True:
            now = time.perf_counter()
            if now >= stop_at or (max_requests is not None and launched >= max_requests):
                return
            payload = payloads[launched % len(payloads)]
            launched += 1
            last_launch = now
            samples.append(await send(session, workload, payload, now, clock0))
            bar.done(samples[-1])

    async with _session(workload, concurrency) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    bar.close()
    # The window closes at the deadline, or at the last launch if the request cap ran out first.
    capped = max_requests is not None and launched >= max_requests
    window_end = last_launch if capped else stop_at
    if window_end <= warm_end:  # the cap ran out during warm-up: measure everything instead
        warm_end, window_end = clock0, max(last_launch, clock0 + 1e-9)
    window = (warm_end - clock0, window_end - clock0)
    dropped = sum(1 for s in samples if s.due < window[0])
    step = {"mode": "closed", "concurrency": concurrency, **_describe(workload)}
    step.update(summarize(samples, window, dropped))
    step.update(_client_load(cpu0, time.perf_counter() - clock0))
    return step


def poisson_schedule(rate: float, duration_s: float, max_requests: int, seed: int = 0) -> list[float]:
    """Arrival offsets (s) of a Poisson process at `rate`/s: exponential gaps, at most max_requests, < duration_s."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    while len(out) < max_requests:
        t += rng.expovariate(rate)
        if t >= duration_s:
            break
        out.append(t)
    return out


async def open_step(
    workload: Workload,
    rate: float,
    duration_s: float,
    warmup_s: float = 1.0,
    max_requests: int = 10_000,
    max_inflight: int = 512,
    seed: int = 0,
    progress: bool = True,
    payloads: Sequence[Payload] | None = None,
) -> dict[str, Any]:
    """Launch requests on a Poisson schedule whatever the server is doing; count the ones it could not take."""
    payloads = payloads or workload.payloads()
    schedule = poisson_schedule(rate, warmup_s + duration_s, max_requests, seed)
    samples: list[Sample] = []
    overflow = 0
    tasks: set[asyncio.Task[None]] = set()
    bar = _Progress(f"open {rate:g}/s", warmup_s + duration_s, progress)
    cpu0, clock0 = _cpu_seconds(), time.perf_counter()

    async def one(session: aiohttp.ClientSession, payload: Payload, due: float) -> None:
        samples.append(await send(session, workload, payload, due, clock0))
        bar.done(samples[-1])

    async with _session(workload, max_inflight) as session:
        for i, offset in enumerate(schedule):
            delay = clock0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival schedule itself, not a wait for anything
            if len(tasks) >= max_inflight:  # the client's own bound; counted, never silent
                overflow += 1
                samples.append(Sample(offset, 0.0, "client_overflow", payloads[i % len(payloads)].images))
                continue
            task = asyncio.create_task(one(session, payloads[i % len(payloads)], clock0 + offset))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    bar.close()
    # The window is the schedule's measured part; it ends early if the request cap cut the schedule short.
    truncated = len(schedule) == max_requests and schedule
    window = (warmup_s, min(warmup_s + duration_s, schedule[-1]) if truncated else warmup_s + duration_s)
    if not any(s.due >= warmup_s for s in samples):  # the cap ran out during warm-up
        window = (0.0, max((s.due for s in samples), default=0.0) + 1e-9)
    dropped = sum(1 for s in samples if s.due < window[0])
    step = {"mode": "open", "rate": rate, **_describe(workload)}
    step.update(summarize(samples, window, dropped))
    span = window[1] - window[0]
    step["offered_rps"] = sum(1 for s in samples if window[0] <= s.due <= window[1]) / span if span > 0 else None
    step["client_overflow"] = overflow
    step.update(_client_load(cpu0, time.perf_counter() - clock0))
    return step


def _describe(workload: Workload) -> dict[str, Any]:
    return {"url": workload.target, "variant": workload.variant, "images_per_request": workload.images_per_request}


def _client_load(cpu0: float, wall_s: float) -> dict[str, Any]:
    cpu = _cpu_seconds() - cpu0
    return {
        "step_wall_s": round(wall_s, 3),
        "client_cpu_s": round(cpu, 3),
        "client_cpu_cores": round(cpu / wall_s, 3) if wall_s > 0 else None,
        "load_average_1m": (load_average() or [None])[0],
    }


async def closed_sweep(
    workload: Workload,
    concurrencies: Sequence[int] = CONCURRENCY,
    duration_s: float = 10.0,
    warmup_s: float = 2.0,
    max_requests: int | None = 20_000,
    progress: bool = True,
) -> list[dict[str, Any]]:
    require_loopback(workload.url)
    payloads = workload.payloads()
    steps = []
    for c in concurrencies:
        steps.append(await closed_step(workload, c, duration_s, warmup_s, max_requests, progress, payloads))
        if progress:
            _print_step(steps[-1])
    return steps


async def open_run(
    workload: Workload,
    rate: float,
    duration_s: float = 10.0,
    warmup_s: float = 2.0,
    max_requests: int = 10_000,
    max_inflight: int = 512,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    require_loopback(workload.url)
    step = await open_step(workload, rate, duration_s, warmup_s, max_requests, max_inflight, seed, progress)
    if progress:
        _print_step(step)
    return step


def _print_step(step: dict[str, Any]) -> None:
    lat = step["latency_ms"]
    load = f"c={step['concurrency']}" if step["mode"] == "closed" else f"{step['rate']:g}/s"

    def f(x: float | None, spec: str = ".1f") -> str:
        return "n/a" if x is None else format(x, spec)

    tqdm.write(
        f"  {load:>8}  {f(step['throughput_rps']):>7} req/s  {f(step['images_per_s']):>7} img/s  "
        f"p50 {f(lat['p50_ms'])}  p99 {f(lat['p99_ms'])} ms  n={step['requests']}  "
        f"errors={step['errors'] or 0}  variants={step['variants']}  batch~{step['median_batch_size']}",
        file=sys.stderr,
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=DEFAULT_URL, help="the /v1/classify URL (loopback only)")
    parser.add_argument("--mode", choices=["closed", "open"], default="closed")
    parser.add_argument("--concurrency", type=_ints, default=list(CONCURRENCY), help="closed loop: e.g. 1,2,4,8")
    parser.add_argument("--rate", type=float, default=10.0, help="open loop: mean arrivals per second")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per step")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds per step whose requests are dropped")
    parser.add_argument("--max-requests", type=int, default=20_000, help="cap per step (warm-up included)")
    parser.add_argument("--max-inflight", type=int, default=512, help="open loop: client-side bound")
    parser.add_argument("--variant", default=None, help="sent as X-Model-Variant (e.g. fp32, int8)")
    parser.add_argument("--images-per-request", type=int, default=1, help=">1 posts to /v1/classify/batch")
    parser.add_argument("--multipart", action="store_true", help="send single images as multipart `file`")
    parser.add_argument("--sizes", type=parse_sizes, default=SIZES, help="corpus sizes, e.g. 640x480,1920x1080")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON output (default benchmarks/results/load-...)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        require_loopback(args.url)
    except NonLoopbackURL as e:
        parser.exit(2, f"error: {e}\n")
    env = print_environment()
    workload = Workload(args.url, args.variant, args.images_per_request, args.multipart, args.timeout, args.sizes)
    progress = not args.no_progress
    if args.mode == "closed":
        coro: Any = closed_sweep(workload, args.concurrency, args.duration, args.warmup, args.max_requests, progress)
    else:
        coro = open_run(
            workload, args.rate, args.duration, args.warmup, args.max_requests, args.max_inflight, args.seed, progress
        )
    result = asyncio.run(coro)
    steps = result if isinstance(result, list) else [result]
    out = args.out or RESULTS_DIR / f"load-{stamp()}-{host_name()}.json"
    write_json(
        out, {"environment": env, "argv": sys.argv[1:] if argv is None else argv, "pid": os.getpid(), "steps": steps}
    )
    print(steps_table(steps))
    print(f"wrote {out}")
    return 1 if any(s["ok"] == 0 for s in steps) else 0


if __name__ == "__main__":
    sys.exit(main())
