"""HeldGauges: state gauges re-set on a timer so Ray's agent never lets their series lapse (no Ray started)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from app.serve.metrics import HeldGauges
from tests.conftest import wait_until


class RecordingGauge:
    def __init__(self) -> None:
        self.sets: list[tuple[float, dict[str, str]]] = []
        self.lock = threading.Lock()

    def set(self, value: float, tags: dict[str, str]) -> None:
        with self.lock:
            self.sets.append((value, dict(tags)))


def held() -> HeldGauges:
    return HeldGauges(period_s=3600)  # no timer refresh during the test unless asked


def test_replace_sets_now_and_refresh_resets_every_series() -> None:
    g = RecordingGauge()
    h = held()
    h.replace(g, [({"batch": "1"}, 10.0), ({"batch": "16"}, 40.0)])  # type: ignore[arg-type]
    assert g.sets == [(10.0, {"batch": "1"}), (40.0, {"batch": "16"})]
    g.sets.clear()
    h.refresh()
    assert sorted(g.sets, key=lambda s: s[1]["batch"]) == [(10.0, {"batch": "1"}), (40.0, {"batch": "16"})]


def test_replace_drops_the_gauges_old_series_and_keeps_other_gauges() -> None:
    measured, provider = RecordingGauge(), RecordingGauge()
    h = held()
    h.replace(measured, [({"engine": "openvino"}, 30.0)])  # type: ignore[arg-type]
    h.replace(provider, [({"provider": "CPUExecutionProvider"}, 1.0)])  # type: ignore[arg-type]
    h.replace(measured, [({"engine": "onnxruntime"}, 35.0)])  # type: ignore[arg-type]
    measured.sets.clear()
    provider.sets.clear()
    h.refresh()
    assert measured.sets == [(35.0, {"engine": "onnxruntime"})]
    assert provider.sets == [(1.0, {"provider": "CPUExecutionProvider"})]


def test_the_timer_refreshes_without_being_asked() -> None:
    g = RecordingGauge()
    h = HeldGauges(period_s=0.05)
    h.replace(g, [({"v": "fp32"}, 1.0)])  # type: ignore[arg-type]
    wait_until(lambda: len(g.sets) >= 3, 10, 0.02, "two timer refreshes")
    assert all(s == (1.0, {"v": "fp32"}) for s in g.sets)


def test_default_period_is_a_third_of_rays_report_interval(monkeypatch: Any) -> None:
    monkeypatch.setenv("RAY_metrics_report_interval_ms", "6000")
    assert HeldGauges().period_s == 2.0
    monkeypatch.setenv("RAY_metrics_report_interval_ms", "100")  # Ray floors the interval at 1 s
    assert HeldGauges().period_s == pytest.approx(1 / 3, abs=1e-9)
