"""The soak's dashboard against the real `prometheus` binary (Debian's package; .ci/run installs it): a tiny
exporter serves Ray-named series in Prometheus text format, Prometheus scrapes it, and every panel of app.ops.panels
is queried through the HTTP API as the soak does. No Ray."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.ops.panels import PANELS
from benchmarks.dashboard import Prometheus, fetch, render

APP = 'application="classifier"'
MODEL = APP + ',model="efficientnet_lite0"'  # the app's own metrics carry the declared model's name


def exposition(n: int) -> str:
    """The n-th scrape: each scrape adds 10 requests (and 1 refusal), 10 latencies (2 <= 10 ms, 8 in (10, 100]),
    10 batches (5 of 1, 2 of 2, 3 of 4 images) and 10 shadow comparisons (9 agree)."""
    lines = [
        f'ray_app_requests_total{{{MODEL},variant="int8",status="200"}} {10 * n}',
        f'ray_app_requests_total{{{MODEL},variant="int8",status="503"}} {n}',
        f'ray_app_errors_total{{{MODEL},code="overloaded"}} {n}',
        f'ray_app_batch_images_total{{{MODEL},variant="int8"}} {18 * n}',
        f'ray_app_batches_total{{{MODEL},variant="int8"}} {10 * n}',
        f'ray_app_batch_size_count{{{MODEL},variant="int8"}} {10 * n}',
        f'ray_app_shadow_total{{{MODEL},pair="fp32|int8",outcome="agree"}} {9 * n}',
        f'ray_app_shadow_total{{{MODEL},pair="fp32|int8",outcome="disagree"}} {n}',
        f'ray_serve_deployment_replica_healthy{{{APP},deployment="Router"}} 1',
        f"ray_app_rollout_candidate_weight{{{APP}}} 50",
        f'ray_app_rollout_agreement_bound{{{APP},end="lower"}} 0.96',
        f'ray_app_rollout_agreement_bound{{{APP},end="upper"}} 0.99',
        f"ray_app_rollout_state{{{APP}}} 1",
        f'ray_serve_autoscaling_target_replicas{{{APP},deployment="Router"}} 2',
        'ray_component_rss_mb{Component="ray::ServeReplica:classifier:Router",ip="127.0.0.1"} 200',
    ]
    for le, c in (("10", 2), ("100", 10), ("+Inf", 10)):
        lines.append(f'ray_app_stage_latency_ms_bucket{{{MODEL},stage="total",variant="int8",le="{le}"}} {c * n}')
    for le, c in (("1", 5), ("2", 7), ("4", 10), ("+Inf", 10)):
        lines.append(f'ray_app_batch_size_bucket{{{MODEL},variant="int8",le="{le}"}} {c * n}')
    return "\n".join(lines) + "\n"


@contextmanager
def exporter() -> Iterator[int]:
    scrapes = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            scrapes[0] += 1
            body = exposition(scrapes[0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_every_panel_is_drawn_from_a_real_prometheus(tmp_path: Path) -> None:
    start = time.time() - 1
    with exporter() as port, Prometheus([f"127.0.0.1:{port}"], every_s=0.5) as prom:
        assert prom.wait_scrapes(3, timeout_s=20) >= 3
        panels = fetch(prom, start, time.time(), 0.5)
    assert not list(prom.dir.parent.glob(prom.dir.name))  # its config and data are gone
    assert prom.server.proc is not None and prom.server.proc.poll() is not None
    assert [p["title"] for p in panels] == [p.title for p in PANELS]
    assert [p["title"] for p in panels if not p["series"]] == []
    last = {p["title"]: {s["name"]: s["points"][-1] for s in p["series"]} for p in panels}
    # rate() over [1m] of a series seconds old is small (Prometheus divides by the window), but not zero
    requests = last["Requests/s by variant and status"]
    assert requests["int8 200"][1] > 0 and requests["int8 503"][1] == pytest.approx(requests["int8 200"][1] / 10)
    assert set(last["Errors/s: non-2xx by variant; error codes"]) == {"int8 503", "code overloaded"}
    # rank 5 of 10 in (10, 100] holding ranks 3..10: 10 + 90 * 3/8; rank 9.9: 10 + 90 * 7.9/8
    assert last["Latency p50 per stage and variant"]["int8 total"][1] == pytest.approx(43.75)
    assert last["Latency p99 per stage and variant"]["int8 total"][1] == pytest.approx(98.875)
    batch = last["Batch size per variant: mean, p50, p99"]
    assert batch["int8 mean"][1] == pytest.approx(1.8) and batch["int8 p50"][1] == pytest.approx(1.0)
    share = next(p for p in panels if p["share"])["series"]
    assert [s["name"] for s in share] == ["int8"]
    assert [le for le, _ in share[0]["points"]] == [1, 2, 4, float("inf")]
    assert [v for _, v in share[0]["points"]] == pytest.approx([0.5, 0.2, 0.3, 0.0])
    assert last["Shadow agreement rate (top-1)"]["fp32|int8"][1] == pytest.approx(0.9)
    assert last["Replicas per deployment (healthy; autoscaling target dashed)"]["Router target"][1] == 2
    rollout = last["Rollout: candidate weight and agreement bounds (%)"]
    assert rollout["candidate weight"][1] == 50 and rollout["agreement lower bound"][1] == pytest.approx(96)
    assert last["Serve replica memory (RSS per deployment and node)"]["Router 127.0.0.1"][1] == 200
    out = render([panels[0], next(p for p in panels if p["share"])], tmp_path / "panels.png", "test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
