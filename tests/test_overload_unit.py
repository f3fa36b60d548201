"""benchmarks/overload.py's arithmetic without a server: the probe's summary, CPU per refusal, the table."""

from __future__ import annotations

from typing import Any

from benchmarks.overload import cost_per_refusal, probe_summary, rows


def step(c: int, ok: int, refused_per_s: float, cpu_s: float, window_s: float = 10.0) -> dict[str, Any]:
    lat = {"p50_ms": 100.0, "p99_ms": 900.0}
    return {
        "workload": "storm", "concurrency": c, "ok": ok, "goodput_rps": ok / window_s, "window_s": window_s,
        "refused_per_s": refused_per_s, "server_cpu_s": cpu_s, "errors": {"503": int(refused_per_s * window_s)},
        "latency_ms": lat, "probe": probe_summary([]), "rss_mib": 900.0,
    }  # fmt: skip


def test_probe_summary_splits_accepted_from_refused_and_counts_refusals_that_break_the_contract() -> None:
    samples = [
        {"status": 200, "json": True, "retry_after": False, "latency_s": 0.5},
        {"status": 200, "json": True, "retry_after": False, "latency_s": 1.5},
        {"status": 503, "json": True, "retry_after": True, "latency_s": 0.01},
        {"status": 503, "json": False, "retry_after": False, "latency_s": 0.02},  # e.g. a proxy's HTML page
        {"status": "ServerDisconnectedError", "latency_s": 3.0},
    ]
    s = probe_summary(samples)
    assert s["sent"] == 5 and s["statuses"] == {"200": 2, "503": 2, "ServerDisconnectedError": 1}
    assert s["accepted_ms"]["p50_ms"] == 1000.0 and s["refused_ms"]["max_ms"] == 20.0
    assert s["refusals_not_json_503_with_retry_after"] == 1


def test_cpu_per_refusal_charges_successes_at_the_first_steps_cost() -> None:
    steps = [step(32, 800, 0, 16.0), step(512, 150, 800, 17.0)]  # 20 ms per success at c=32
    cost_per_refusal(steps)
    assert "cpu_ms_per_refusal" not in steps[0]  # no refusals to charge
    assert steps[1]["cpu_ms_per_refusal"] == (17.0 - 150 * 0.02) * 1000 / 8000  # 1.75 ms


def test_cpu_per_refusal_counts_the_ingress_not_the_classifiers() -> None:
    # The Classifier's CPU per image falls with bigger batches under load: left in, it would hide (or fake)
    # the cost of refusals. Only the processes a refusal passes through are charged.
    steps = [step(32, 800, 0, 16.0), step(1024, 800, 100, 15.0)]
    steps[0]["cpu_by_process_s"] = {"haproxy": 0.2, "HAProxyManager": 0.2, "Router": 3.6, "Classifier_fp32": 12.0}
    steps[1]["cpu_by_process_s"] = {"haproxy": 0.4, "HAProxyManager": 0.2, "Router": 3.6, "Classifier_fp32": 10.8}
    cost_per_refusal(steps)
    # (4.2 - 800 x 4.0 / 800) s over 1,000 refusals; the whole server would give (15 - 800 x 0.02) s: -1 ms
    assert steps[1]["cpu_ms_per_refusal"] == 0.2


def test_rows_name_each_load_and_leave_out_503s_from_other_errors() -> None:
    st = step(512, 150, 800, 17.0)
    st["errors"] = {"503": 8000, "timeout": 3}
    open_step = {**step(0, 500, 0, 0), "workload": "open", "load_x": 4, "errors": {}}
    table = rows([{"key": "app", "steps": [st, open_step]}])
    assert table[0][:5] == ["app", "c=512", 15.0, 800, {"timeout": 3}]
    assert table[1][1] == "4x open" and table[1][4] == "-"
