"""benchmarks.hostile_load without Ray: what the attacks send, and the bookkeeping that judges a phase."""

from __future__ import annotations

import asyncio
import json
import os
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from app.config import Limits
from app.errors import ServiceError
from app.imaging.preprocess import check_header
from app.protocol import v2
from benchmarks import hostile_load as hl
from benchmarks.load import NonLoopbackURL
from benchmarks.procs import Monitor, Proc

LIMITS = Limits()


# --------------------------------------------------------------------------- payloads


def test_the_gzip_bomb_is_about_10_kb_and_inflates_to_just_within_the_body_limit() -> None:
    body, inflated = hl.gzip_json_bomb(LIMITS.max_body_bytes)
    assert 4_000 < len(body) < 16_000, len(body)
    text = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body)
    assert len(text) == inflated and LIMITS.max_body_bytes - 3 < inflated <= LIMITS.max_body_bytes
    assert text.startswith(b'{"inputs":[[],[],') and text.endswith(b"[],[]]}")
    assert len(text) / len(body) > 900  # the point of it: ~1000:1
    # The service's own inflater takes it whole (the worst case: parsing is what costs), one byte less would not.
    assert v2.decompress_body(body, "gzip", LIMITS.max_body_bytes) == text
    with pytest.raises(ServiceError) as e:
        v2.decompress_body(body, "gzip", inflated - 1)
    assert e.value.code == "payload_too_large"


@pytest.mark.parametrize("target", [15, 16, 1000, 4097])
def test_a_small_json_bomb_is_valid_json_of_empty_lists(target: int) -> None:
    body, inflated = hl.gzip_json_bomb(target)
    text = zlib.decompress(body, 16 + zlib.MAX_WBITS)
    doc = json.loads(text)
    assert len(text) == inflated == len(json.dumps(doc, separators=(",", ":"))) <= max(target, 15)  # 15: one list
    assert doc == {"inputs": [[]] * len(doc["inputs"])}
    assert inflated > target - 3 or len(doc["inputs"]) == 1


def test_the_memory_bombs_fit_every_limit_but_the_decode_budget() -> None:
    reqs = {r.kind: r for r in hl.attack_requests("bombs")}
    assert list(reqs) == ["tiff_v1", "png_v1", "tiff_v2", "png_v2"]
    images = hl.bomb_images()
    for name, data in images.items():
        assert len(data) < 1_000_000  # far under the body limit
        with pytest.raises(ServiceError) as e:
            check_header(data, LIMITS.max_pixels, 224, LIMITS.max_decode_bytes)
        assert e.value.code == "decode_budget_exceeded" and e.value.status == 413
        v1 = reqs[f"{name}_v1"]
        assert v1.path == "/v1/classify" and v1.body == data and dict(v1.headers)["Content-Type"] == f"image/{name}"
        # The V2 request is what a Triton client sends: the service's own parser finds the image in it.
        r2 = reqs[f"{name}_v2"]
        headers = dict(r2.headers)
        assert r2.path == "/v2/models/efficientnet_lite0/infer" and len(r2.body) < LIMITS.max_body_bytes
        req = v2.parse_infer_request(r2.body, v2.parse_header_length(headers[v2.HEADER_LENGTH]), LIMITS, (224, 224))
        assert req.images == [data] and req.input_name == "image_bytes"


def test_the_gzip_request_is_the_bomb_of_the_body_limit() -> None:
    (req,) = hl.attack_requests("gzip")
    assert req.path == "/v2/models/efficientnet_lite0/infer" and req.body == hl.gzip_json_bomb(LIMITS.max_body_bytes)[0]
    assert req.headers == {"Content-Type": "application/json", "Content-Encoding": "gzip"}


def test_probe_images_are_small_jpegs() -> None:
    images = hl.probe_images()
    assert images and all(i[:2] == b"\xff\xd8" and len(i) <= 300_000 for i in images)


def test_the_slow_request_head_declares_a_body_it_never_sends() -> None:
    head = hl.slow_request_head("127.0.0.1", 18300, 102_400).decode()
    assert head.startswith("POST /v1/classify HTTP/1.1\r\n") and head.endswith("\r\n\r\n")
    assert "Content-Length: 102400\r\n" in head and "Host: 127.0.0.1:18300\r\n" in head


# --------------------------------------------------------------------------- reading answers


@pytest.mark.parametrize(
    ("status", "ctype", "body", "expected"),
    [
        (
            413,
            "application/json",
            b'{"error": {"code": "decode_budget_exceeded", "message": "m"}}',
            (True, "decode_budget_exceeded"),
        ),
        (
            413,
            "application/json",
            b'{"error": "the body of 123 bytes exceeds 10485760"}',
            (True, "the body of N bytes exceeds N"),
        ),
        (500, "text/html", b"<html>500</html>", (False, "")),
        (400, "application/json", b"{not json", (False, "")),
        (400, "application/json", b"[1, 2]", (False, "")),
        (400, "application/json", b'{"detail": "x"}', (False, "")),
        (200, "application/json; charset=utf-8", b'{"predictions": []}', (True, "")),
        (413, None, b"", (False, "")),
    ],
)
def test_read_error(status: int, ctype: str | None, body: bytes, expected: tuple[bool, str]) -> None:
    assert hl.read_error(status, ctype, body) == expected


@pytest.mark.parametrize(
    ("status", "json_ok", "proper"),
    [
        (413, True, True),
        (400, True, True),
        (503, True, True),
        (408, True, True),
        (500, True, False),
        (413, False, False),
        (503, False, False),
        (0, False, False),
        (200, True, False),
        (502, True, False),
    ],
)
def test_a_proper_refusal_is_a_json_4xx_or_503(status: int, json_ok: bool, proper: bool) -> None:
    assert hl.is_proper_refusal(hl.Reply(0.0, "x", status, 0.1, json_ok)) is proper


def test_parse_http_reply() -> None:
    raw = b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    assert hl.parse_http_reply(raw) == (408, {"content-type": "application/json", "content-length": "2"}, b"{}")
    assert hl.parse_http_reply(b"HTTP/1.0 400 Bad")[0] == 400
    assert hl.parse_http_reply(b"garbage\r\n\r\nx") == (0, {}, b"x")
    assert hl.parse_http_reply(b"") == (0, {}, b"")


# --------------------------------------------------------------------------- summaries


def _reply(status: int, latency: float, kind: str = "probe", code: str = "", json_ok: bool = True) -> hl.Reply:
    return hl.Reply(0.0, kind, status, latency, json_ok, code)


def test_probe_summary_counts_every_request_in_success_and_latency() -> None:
    replies = [_reply(200, 0.01 * (i + 1)) for i in range(198)] + [_reply(503, 0.005, code="overloaded")] * 2
    s = hl.probe_summary(replies)
    assert s["requests"] == 200 and s["ok"] == 198 and s["success_rate"] == pytest.approx(0.99)
    assert s["statuses"] == {"200": 198, "503 overloaded": 2}
    lat = sorted(r.latency_s for r in replies)
    assert s["p99_ms"] == pytest.approx(1000 * (lat[197] + 0.01 * (lat[198] - lat[197])), rel=1e-6)  # numpy's rule
    assert s["max_ms"] == pytest.approx(1980)
    empty = hl.probe_summary([])
    assert empty["requests"] == 0 and empty["success_rate"] is None and empty["p99_ms"] is None


def test_attack_summary_flags_every_answer_that_is_not_a_json_refusal() -> None:
    replies = [
        _reply(413, 0.01, "tiff_v1", "decode_budget_exceeded"),
        _reply(413, 0.01, "png_v2", "decode_budget_exceeded"),
        _reply(503, 0.01, "png_v1", "overloaded"),
        _reply(500, 0.01, "tiff_v1", "", json_ok=False),
        _reply(0, 30.0, "png_v1", "ServerDisconnectedError", json_ok=False),
    ]
    s = hl.attack_summary(replies)
    assert s["requests"] == 5 and s["violations"] == 2
    assert s["by_kind"]["tiff_v1"] == {"413 decode_budget_exceeded": 1, "500": 1}
    assert {e["status"] for e in s["violation_examples"]} == {500, 0}


def test_slow_summary_says_who_ended_each_connection() -> None:
    outcomes = [
        hl.Reply(0.0, "response", 408, 10.2, True, "body_timeout", sent=10),
        hl.Reply(0.1, "closed", 0, 10.0, sent=10),
        hl.Reply(0.2, "connect_failed", 0, 0.0),
        hl.Reply(0.3, "open_at_end", 0, 8.0, sent=8),
        hl.Reply(0.4, "response", 500, 3.0, sent=3),
    ]
    s = hl.slow_summary(outcomes)
    assert s["attempts"] == 5 and s["opened"] == 4 and s["bytes_sent"] == 31
    assert s["how"] == {"closed": 1, "connect_failed": 1, "open_at_end": 1, "response": 2}
    assert s["statuses"] == {"408 body_timeout": 1, "500": 1} and s["non_json_responses"] == 1
    assert s["held_by_server_s"] == {"median": 10.0, "max": 10.2}
    assert s["violations"] == 1 and s["violation_examples"][0]["status"] == 500


def test_memory_verdict_preprocessor_ceiling_over_idle_and_growth_of_the_others() -> None:
    def m(label: str, idle: float, start: float, peak: float, replica: bool = True) -> dict[str, Any]:
        return {"label": label, "replica": replica, "idle_mb": idle, "start_mb": start, "peak_mb": peak}

    procs = {
        "Preprocessor[1]": m("Preprocessor", 400.0, 420.0, 1400.0),
        "Preprocessor[2]": m("Preprocessor", 400.0, 420.0, 1500.0),
        "Router[3]": m("Router", 300.0, 350.0, 640.0),
        "Classifier_int8[4]": m("Classifier_int8", 500.0, 500.0, 501.0),
        "haproxy[5]": m("haproxy", 10.0, 10.0, 900.0, replica=False),
    }
    rows, failures = hl.memory_verdict(procs, preprocessor_memory_mb=1024, other_growth_mb=280)
    assert rows["Preprocessor[1]"]["within"] and rows["Preprocessor[1]"]["limit_mb"] == 1424.0  # over idle
    assert not rows["Preprocessor[2]"]["within"]
    assert not rows["Router[3]"]["within"] and rows["Router[3]"]["growth_mb"] == 290.0
    assert rows["Classifier_int8[4]"]["within"]
    assert "within" not in rows["haproxy[5]"]  # reported, not judged
    assert len(failures) == 2 and failures[0].startswith("Preprocessor[2]") and failures[1].startswith("Router[3]")

    # A Router that decodes (decode_in: router): the decode ceiling over its idle RSS, and the others' growth.
    rows, failures = hl.memory_verdict(procs, preprocessor_memory_mb=1024, other_growth_mb=280, decoder="Router")
    assert rows["Router[3]"]["within"] and rows["Router[3]"]["limit_mb"] == 300.0 + 1024 + 280
    assert not rows["Preprocessor[1]"]["within"] and rows["Preprocessor[1]"]["limit_mb"] == 420.0 + 280
    assert {f.split(":")[0] for f in failures} == {"Preprocessor[1]", "Preprocessor[2]"}


def test_a_replaced_replica_is_a_new_pid_or_start_time() -> None:
    def proc(pid: int, title: str, started: float) -> Proc:
        return Proc(pid, 1, (title,), None, started)

    router, pre = "ray::ServeReplica:classifier:Router", "ray::ServeReplica:classifier:Preprocessor"
    same = {"Router[10]": proc(10, router, 100), "Preprocessor[11]": proc(11, pre, 100)}
    same["ServeController[12]"] = proc(12, "ray::ServeController", 100)
    assert hl.replicas_replaced(same, dict(same)) == {"gone": [], "new": []}
    reused = proc(10, router, 999)  # the same pid, another process
    after = {"Router[10]": reused, "Preprocessor[13]": proc(13, pre, 200)}  # the controller's going is no replica's
    gone, new = ["Preprocessor[11]", "Router[10]"], ["Preprocessor[13]", "Router[10]"]
    assert hl.replicas_replaced(same, after) == {"gone": gone, "new": new}


def _phase(**over: Any) -> dict[str, Any]:
    phase: dict[str, Any] = {
        "attack": "bombs",
        "probe": hl.probe_summary([_reply(200, 0.1)] * 100),
        "attack_summary": hl.attack_summary([_reply(413, 0.01, "tiff_v1", "decode_budget_exceeded")] * 50),
        "replicas": {"gone": [], "new": []},
        "memory_failures": [],
    }
    phase.update(over)
    return phase


def test_phase_failures_is_the_done_when_list() -> None:
    th = hl.Settings()
    assert hl.phase_failures(_phase(), th) == []
    slow_probe = hl.probe_summary([_reply(200, 0.1)] * 98 + [_reply(200, 4.0)] * 2)
    failing = hl.probe_summary([_reply(200, 0.1)] * 98 + [_reply(503, 0.01, code="overloaded")] * 2)
    assert [f.split(":")[0] for f in hl.phase_failures(_phase(probe=slow_probe), th)] == ["probe"]
    assert "p99 4.00 s" in hl.phase_failures(_phase(probe=slow_probe), th)[0]
    assert "success 98.0%" in hl.phase_failures(_phase(probe=failing), th)[0]
    assert hl.phase_failures(_phase(probe=hl.probe_summary([])), th) == ["probe: no requests completed"]
    bad_attack = hl.attack_summary([_reply(500, 0.01, "tiff_v1", json_ok=False)])
    assert hl.phase_failures(_phase(attack_summary=bad_attack), th)[0].startswith("bombs: 1 answers not a JSON 4xx")
    assert hl.phase_failures(_phase(attack_summary=hl.attack_summary([])), th)[0].startswith("bombs: no attack")
    moved = {"gone": ["Router[1]"], "new": ["Router[2]"]}
    assert hl.phase_failures(_phase(replicas=moved), th) == ["replicas replaced: gone ['Router[1]'], new ['Router[2]']"]
    assert hl.phase_failures(_phase(memory_failures=["x"]), th) == ["x"]
    slow = hl.slow_summary([hl.Reply(0, "response", 500, 1.0)])
    assert hl.phase_failures(_phase(attack="slow", attack_summary=slow), th)[0].startswith("slow: 1 answers not an end")
    assert hl.phase_failures(_phase(attack="slow", attack_summary=hl.slow_summary([])), th) == [
        "slow: no connection was opened"
    ]
    closed = hl.slow_summary([hl.Reply(0, "closed", 0, 1.0)])
    assert hl.phase_failures(_phase(attack="slow", attack_summary=closed), th) == []


def test_cli_arguments() -> None:
    with pytest.raises(SystemExit):
        hl.main(["--attack", "bombs,teardrop"])
    assert hl.base_url("http://127.0.0.1:8000/v1/classify") == "http://127.0.0.1:8000"
    with pytest.raises(NonLoopbackURL):
        hl.base_url("http://10.0.0.1:8000")
    with pytest.raises(SystemExit):
        hl.main(["--url", "http://192.0.2.1:8000"])


def test_the_monitor_samples_rss_and_peak_rss_and_notices_a_process_gone() -> None:
    me = Proc(os.getpid(), 1, ("me",), None)
    gone = Proc(2**22 + 12345, 1, ("gone",), None)  # above pid_max's default: no such process
    mon = Monitor(time.perf_counter(), fixed={"me[1]": me, "gone[2]": gone})
    mon.sample()
    assert 10 < (mon.peak("me[1]") or 0) <= mon.hwm["me[1]"][1] + 0.005  # the series is rounded to 0.01 MB
    assert mon.series["gone[2]"] == [] and mon.peak("gone[2]") is None and mon.start("me[1]") == mon.peak("me[1]")
    mon.hwm["me[1]"] = (100.0, 5000.0)  # the high-water mark rose between samples: a spike they missed
    assert mon.peak("me[1]") == 5000.0


def test_the_monitor_samples_on_a_grid_while_a_block_runs_and_once_after() -> None:
    mon = Monitor(time.perf_counter(), fixed={"me[1]": Proc(os.getpid(), 1, ("me",), None)})
    events: list[str] = []  # the samples and the block's end, in the order they happened
    take = mon.sample

    def sample() -> None:
        take()
        events.append("sample")

    mon.sample = sample  # type: ignore[method-assign]

    async def block() -> None:
        async with mon.sampling(0.01):

            async def sampled_thrice() -> None:  # polled: the grid goes on sampling while the block runs
                while events.count("sample") < 3:
                    await asyncio.sleep(0.005)

            await asyncio.wait_for(sampled_thrice(), 10)
            events.append("block ended")

    asyncio.run(block())
    assert events.index("block ended") >= 3 and events[-1] == "sample", events  # and once after the block
    times = [t for t, _ in mon.series["me[1]"]]
    assert len(times) == events.count("sample") and times == sorted(times), (times, events)
    nothing = Monitor(time.perf_counter())  # no raylet: nothing to watch
    nothing.sample()
    assert nothing.series == {}


def test_tables_and_picture(tmp_path: Path) -> None:
    phase = _phase()
    phase.update(
        clients=16,
        wall_s=8.0,
        t_start=1.0,
        memory={
            "Preprocessor[1]": {
                "label": "Preprocessor",
                "replica": True,
                "start_mb": 400.0,
                "peak_mb": 410.0,
                "limit_mb": 1424.0,
            },
            "Router[2]": {"label": "Router", "replica": True, "start_mb": 300.0, "peak_mb": 320.0, "growth_mb": 20.0},
            "ServeController[3]": {"label": "ServeController", "replica": False, "start_mb": 90.0, "peak_mb": 95.0},
        },
        series={
            "probe": [(1.5, 0.1, 200), (2.0, 3.5, 503)],
            "attack": [(1.2, 0.01, 413)],
            "rss_mb": {"Router[2]": [(1.0, 300.0), (9.0, 320.0)]},
        },
        failures=[],
    )
    result = {
        "url": "http://127.0.0.1:1",
        "idle_mb": {"Preprocessor[1]": 400.0, "Router[2]": 290.0},
        "settings": {"max_p99_s": 3.0, "preprocessor_memory_mb": 1024.0},
        "phases": [phase],
    }
    table = hl.summary_table(result)
    assert "| bombs | 16 | 50 req: {'413 decode_budget_exceeded': 50} | 100/100 | 100.0/100.0 |" in table
    assert "| 410/1424 | 0 | ok |" in table
    assert "| Router[2] | 290 | 300/320 |" in hl.memory_table(result)
    png = hl.plot(result, tmp_path / "x.png")
    assert png.stat().st_size > 10_000


# --------------------------------------------------------------------------- the slow-body client against a toy server


def _run_slow(handler: Any, seconds: float, connections: int = 2, head: bool = False) -> list[hl.Reply]:
    async def main() -> list[hl.Reply]:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        settings = hl.Settings(connections=connections, slow_content_length=1000, slow_interval_s=0.02)
        traffic = hl.Traffic(hl.Target(f"http://127.0.0.1:{port}"), settings, time.perf_counter() + seconds)
        async with server:
            await traffic.slow_attack(head)
        return traffic.replies

    return asyncio.run(main())


def test_slow_connections_record_answers_and_reconnect() -> None:
    async def answer_408(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(3)  # three trickled body bytes, then the server has had enough
        body = b'{"error": {"code": "body_timeout", "message": "too slow"}}'
        writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n")
        writer.write(b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    out = _run_slow(answer_408, 1.2)
    answered = [o for o in out if o.kind == "response"]
    assert len(answered) >= 4  # both slots came back after each answer
    assert all(o.status == 408 and o.json_ok and o.code == "body_timeout" and o.sent >= 3 for o in answered)
    assert hl.slow_summary(out)["violations"] == 0


def test_slow_connections_closed_without_an_answer_and_left_open_at_the_end() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    out = _run_slow(hang_up, 0.6)
    assert out and {o.kind for o in out} <= {"closed", "reset"} and all(o.status == 0 for o in out)

    async def patient(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(1024):
            pass
        writer.close()

    out = _run_slow(patient, 0.5, connections=3)
    assert [o.kind for o in out] == ["open_at_end"] * 3 and all(o.sent >= 10 for o in out)


def test_slow_heads_never_end_their_head() -> None:
    """The slowhead attack: a head whose last header grows a byte at a time, its blank line never sent."""
    got: list[bytes] = []

    async def answer_408(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.readuntil(b"X-Trickle: aaa"))  # the head so far, and three trickled bytes
        writer.write(b"HTTP/1.1 408 Request Time-out\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    out = _run_slow(answer_408, 1.0, head=True)
    answered = [o for o in out if o.kind == "response"]
    assert answered and all(o.status == 408 and o.sent >= 2 for o in answered)
    assert hl.slow_summary(out)["violations"] == 0
    assert all(g.startswith(b"POST /v1/classify HTTP/1.1\r\n") and b"\r\n\r\n" not in g for g in got)
