"""benchmarks/cascade.py on the real models, shrunk to one variation per photograph: the curve's two ends are
INT8 alone and FP32 alone, and the measured throughputs are there. No Ray."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import cascade


@pytest.fixture(scope="module")
def result(model_files: Any) -> dict[str, Any]:
    return cascade.run(1, model_files.fp32.parent)


def test_the_curve_runs_from_int8_alone_to_fp32_alone(result: dict[str, Any]) -> None:
    first, last = result["curve"][0], result["curve"][-1]
    assert first["threshold"] == 0.0 and first["escalation"] == 0.0
    assert first["agreement"] == pytest.approx(result["agreement_int8_alone"])
    assert last["threshold"] == 1.0 and last["escalation"] == 1.0 and last["agreement"] == 1.0
    assert [p["escalation"] for p in result["curve"]] == sorted(p["escalation"] for p in result["curve"])
    # Each point's throughput is FP32 alone's per-image cost over the cascade's: decode, INT8 on every image, FP32
    # on the escalated share (at the last point, both models on every image). The figures themselves are measured,
    # so their sizes are the benchmark's business (python -m benchmarks.cascade), not this test's.
    cost = result["cost_ms_per_image"]
    for p in result["curve"]:
        cascade_ms = cost["decode"] + cost["int8"] + p["escalation"] * cost["fp32"]
        assert p["speedup"] == pytest.approx((cost["decode"] + cost["fp32"]) / cascade_ms, rel=1e-2), (p, cost)


def test_too_little_evidence_keeps_the_default_and_every_figure_is_measured(result: dict[str, Any]) -> None:
    assert result["images"] == len(result["photos"]) >= 1
    assert not result["fit"]["fitted"] and result["at_auto"]["threshold"] == result["fit"]["threshold"]
    measured = {m["what"]: m for m in result["measured"]}
    assert measured["fp32 alone"]["vs_fp32"] == 1.0
    assert all(m["img_per_s"] > 0 for m in measured.values())
    assert "cascade at 0.00" in measured and "cascade at 1.00" in measured
    assert "| threshold |" in cascade.to_markdown(result)
