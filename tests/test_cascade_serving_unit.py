"""Serving a cascade (app/pipeline/cascade_stage.py) without Ray: the escalation rule on real pipeline groups, the
merged answers, a `then` that cannot answer, the evidence the shadows collect for `margin: auto`, the fit, and
the calibration capture (app/pipeline/capture.py) on a real directory.

The Classifiers are FakeBackend's (tests/test_pipeline_unit.py). An image is one byte v: INT8 answers it with
top-1 margin v/200, and with a wrong class when v is odd; FP32 always answers class v.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from app.config import AppArgs, CaptureArgs, CascadeArgs, RouterConfig
from app.errors import ServiceError
from app.imaging.payloads import Pixels
from app.imaging.transform import Transform
from app.pipeline.abstats import ABStats
from app.pipeline.capture import CaptureStore, directory_name
from app.pipeline.cascade_rule import MarginEvidence
from app.pipeline.cascade_stage import Cascades
from app.pipeline.group_run import Outcome
from app.pipeline.routing import Choice, WeightedSplit
from app.pipeline.service import Pipeline
from app.rollout.spec import RolloutSpec
from app.toolchain.calibration import list_images
from tests.test_pipeline_unit import FakeBackend, FakeCall, Metrics, no_ray, run, until  # noqa: F401 (no_ray: autouse)

CASCADE = "int8>fp32"


class CascadeBackend(FakeBackend):
    def top_for(self, variant: str, value: int) -> list[tuple[int, float]]:
        if variant == "fp32":
            return [(value, 0.9), (value + 1, 0.05), (value + 2, 0.01), (value + 3, 0.01), (value + 4, 0.01)]
        m = value / 200
        cls = value if value % 2 == 0 else 999
        return [(cls, 0.5 + m / 2), (1000 + value, 0.5 - m / 2), (1, 0.0), (2, 0.0), (3, 0.0)]

    def logits_for(self, variant: str, rows: np.ndarray) -> np.ndarray:
        sign = 1.0 if variant == "fp32" else -1.0
        return sign * np.asarray(rows, dtype=np.float32)


def int8_margin(value: int) -> float:
    return 0.5 + value / 400 - (0.5 - value / 400)


def cascade_pipeline(
    backend: FakeBackend,
    margin: float | str = 0.3,
    shadow: float = 0.0,
    groups: int = 2,
    capture: CaptureStore | None = None,
    pair: tuple[str, str] | None = None,
    **cascade: Any,
) -> Pipeline:
    settings = RouterConfig.model_validate(
        {
            "weights": {"fp32": 1, "int8": 1, CASCADE: 1},
            "shadow_fraction": shadow,
            "max_shadow_in_flight": 64,
            "max_groups_in_flight": groups,
        }
    )
    args = {CASCADE: CascadeArgs(first="int8", then="fp32", margin=margin, **cascade)}  # type: ignore[arg-type]
    p = Pipeline(backend, ["fp32", "int8"], Metrics(), rng=random.Random(0), cascades=args, capture=capture)
    p.configure(settings, WeightedSplit(settings.weights), pair)
    return p


def classify(p: Pipeline, values: list[int], variant: str = CASCADE, full: bool = False) -> Outcome:
    images = [bytes([v]) for v in values]
    outcome: Outcome = run(p.classify(Choice(variant, "override"), images, 5, time.perf_counter(), full))
    return outcome


def classify_with_shadows(p: Pipeline, values: list[int], variant: str = CASCADE) -> Outcome:
    """classify(), then wait for the shadows it started, in the same event loop: asyncio.run cancels the tasks
    left when its coroutine returns, so waiting in a second asyncio.run found them cancelled, not done (on Python
    3.12 every time; 3.11 happened to run them before classify() returned)."""

    async def go() -> Outcome:
        images = [bytes([v]) for v in values]
        outcome: Outcome = await p.classify(Choice(variant, "override"), images, 5, time.perf_counter(), False)
        await until(lambda: not p.shadow.running)
        return outcome

    result: Outcome = run(go())
    return result


VALUES = [0, 10, 30, 59, 60, 61, 100, 150, 199]  # margins 0 .. 0.995; odd ones: INT8 wrong


# --------------------------------------------------------------------------- the rule on real groups


def test_margin_0_escalates_nothing_answers_are_int8s() -> None:
    backend = CascadeBackend()
    o = classify(cascade_pipeline(backend, margin=0.0), VALUES)
    assert [o.top[i][0][0] for i in range(len(VALUES))] == [backend.top_for("int8", v)[0][0] for v in VALUES]
    assert [v for v, _ in backend.classified] == ["int8"]  # FP32 never called
    assert o.variant == CASCADE and not o.failed_over
    assert all(o.cascade_reply(i)["escalated"] is False for i in range(len(VALUES)))  # type: ignore[index]


def test_margin_1_escalates_everything_answers_are_fp32s() -> None:
    backend = CascadeBackend()
    o = classify(cascade_pipeline(backend, margin=1.0), [*VALUES, 200])  # 200: INT8 sure (margin 1.0) and still sent
    assert [o.top[i] for i in range(len(VALUES) + 1)] == [backend.top_for("fp32", v) for v in [*VALUES, 200]]
    assert backend.classified == [("int8", len(VALUES) + 1), ("fp32", len(VALUES) + 1)]  # one call per stage
    assert all(o.cascade_reply(i)["escalated"] for i in range(len(VALUES) + 1))  # type: ignore[index]


def test_only_images_below_the_threshold_go_on_as_one_group_of_concurrent_requests() -> None:
    backend = CascadeBackend()
    p = cascade_pipeline(backend, margin=0.3, groups=1)
    backend.gates["int8"] = asyncio.Event()  # hold the first group so the others coalesce behind it

    async def go() -> list[Outcome]:
        now = time.perf_counter()
        first = asyncio.ensure_future(p.classify(Choice(CASCADE, "override"), [bytes([7])], 5, now))
        await until(lambda: len(backend.groups) == 1)
        rest = [asyncio.ensure_future(p.classify(Choice(CASCADE, "override"), [bytes([v])], 5, now)) for v in VALUES]
        await until(lambda: p.coalescer.waiting((CASCADE, True, False)) == len(VALUES))
        backend.gates["int8"].set()
        return [await first, *[await r for r in rest]]

    outcomes = run(go())
    escalated = [v for v in VALUES if int8_margin(v) < 0.3]
    assert escalated == [0, 10, 30, 59]
    # The second group: one INT8 call for all nine, one FP32 call for the four below 0.3.
    assert backend.classified[-2:] == [("int8", len(VALUES)), ("fp32", len(escalated))]
    for v, o in zip(VALUES, outcomes[1:], strict=True):
        reply = o.cascade_reply(0)
        assert reply is not None and reply["escalated"] == (v in escalated)
        assert reply["margin"] == pytest.approx(int8_margin(v)) and reply["threshold"] == 0.3
        assert o.top[0][0][0] == (v if v in escalated else backend.top_for("int8", v)[0][0])
        assert "escalation" in o.timings()
    m = p.cascader.metrics
    assert isinstance(m, Metrics)
    assert m.outcomes[f"{CASCADE}:escalated"] == 1 + 4 and m.outcomes[f"{CASCADE}:kept"] == 5


def test_v2_logits_of_escalated_rows_are_thens() -> None:
    backend = CascadeBackend()
    o = classify(cascade_pipeline(backend, margin=0.3), [10, 100], full=True)
    assert o.logits is not None
    assert o.logits[:, 0].tolist() == [10.0, -100.0]  # FP32's (+) for the escalated, INT8's (-) for the kept


def test_ready_pixels_ride_the_cascade_too() -> None:
    backend = CascadeBackend()
    p = cascade_pipeline(backend, margin=0.3)
    px = Pixels(np.array([[10], [100]], dtype=np.uint8), 0.0, {}, [0, 1])
    o = run(p.classify_pixels(Choice(CASCADE, "override"), px, 5, time.perf_counter()))
    assert [o.top[0][0][0], o.top[1][0][0]] == [10, 100]
    assert [r["escalated"] for r in (o.cascade_reply(0), o.cascade_reply(1))] == [True, False]  # type: ignore[index]
    assert backend.classified == [("int8", 2), ("fp32", 1)]


def test_a_then_that_cannot_answer_leaves_firsts_answer_and_says_so() -> None:
    backend = CascadeBackend()
    backend.failing["fp32"] = 5
    o = classify(cascade_pipeline(backend, margin=0.3), [10, 100])
    assert o.errors == {} and o.variant == CASCADE
    assert o.top[0] == backend.top_for("int8", 10)
    low, high = o.cascade_reply(0), o.cascade_reply(1)
    assert low is not None and low["escalated"] is False and low["escalation_failed"] == "replica_failed"
    assert high is not None and "escalation_failed" not in high
    m = o.cascade
    assert m is not None and m.failed == "replica_failed"


def test_a_down_first_fails_over_to_another_variant_without_a_cascade() -> None:
    backend = CascadeBackend()
    backend.failing["int8"] = 5
    p = cascade_pipeline(backend, margin=0.3)
    weighted: Outcome = run(p.classify(Choice(CASCADE, "weighted"), [bytes([10])], 5, time.perf_counter()))
    assert weighted.failed_over and weighted.variant == "fp32" and weighted.cascade is None
    assert weighted.cascade_reply(0) is None


def test_a_slow_then_costs_the_escalation_not_the_request() -> None:
    backend = CascadeBackend()
    backend.gates["fp32"] = asyncio.Event()  # FP32 never answers
    p = cascade_pipeline(backend, margin=0.3)
    p.configure(p.settings.model_copy(update={"inference_timeout_s": 0.6}), p.split)  # type: ignore[union-attr]
    o = classify(p, [10, 100])
    assert o.errors == {} and o.top[0] == backend.top_for("int8", 10)
    assert o.cascade is not None and o.cascade.failed == "inference_timeout"
    assert o.cascade_reply(0)["escalation_failed"] == "inference_timeout"  # type: ignore[index]


class BrokenThen(CascadeBackend):
    def top_for(self, variant: str, value: int) -> list[tuple[int, float]]:
        if variant == "fp32":
            raise RuntimeError("the engine fell over")  # not a ServiceError, not a lost replica
        return super().top_for(variant, value)


def test_any_failure_of_then_leaves_firsts_answers() -> None:
    o = classify(cascade_pipeline(BrokenThen(), margin=0.3), [10, 100])
    assert o.errors == {} and o.cascade is not None and o.cascade.failed == "replica_failed"


def test_a_failing_first_is_the_cascades_failure_in_the_ab_evidence() -> None:
    backend = CascadeBackend()
    backend.failing["int8"] = 5
    with pytest.raises(ServiceError) as e:
        classify(cascade_pipeline(backend, margin=0.3), [10])  # forced by override: no failover
    assert e.value.variant == CASCADE


class OtherSize(CascadeBackend):
    def describe(self, variant: str) -> Any:
        async def go() -> dict[str, Any]:
            size = 260 if variant == "fp32" else 224
            return {"input": {"size": [size, size], "transform": Transform.square(size).to_dict()}}

        return FakeCall(go())


def test_a_then_of_another_input_size_is_never_called_and_says_why() -> None:
    backend = OtherSize()
    p = cascade_pipeline(backend, margin=0.3)
    o = classify(p, [10, 100])
    assert backend.classified == [("int8", 2)] and o.cascade is not None and o.cascade.failed == "variant_unavailable"
    assert "260" in p.cascades.describe()[CASCADE]["problem"]


# --------------------------------------------------------------------------- evidence for `auto`


def test_shadows_of_a_cascade_count_every_sampled_image_by_margin_with_escalated_ones_free() -> None:
    backend = CascadeBackend()
    p = cascade_pipeline(backend, margin=0.3, shadow=1.0)
    o = classify_with_shadows(p, VALUES)
    ev = p.evidence.stats.margins[CASCADE]
    assert ev.n == len(VALUES)
    assert sum(ev.disagree) == sum(1 for v in VALUES if v % 2)  # INT8 is wrong on the odd ones
    # Shadow calls: FP32 only for the five kept (the four escalated have FP32's answer already).
    assert backend.classified == [("int8", 9), ("fp32", 4), ("fp32", 5)]
    pair = p.evidence.stats.pairs["fp32|int8>fp32"]
    assert pair.shadowed == len(VALUES) and pair.top1_agree == len(VALUES) - 2  # 61 and 199: kept, and wrong
    assert o.variant == CASCADE


@pytest.mark.parametrize("answered_by", ["int8", "fp32"])
def test_shadows_between_the_two_variants_count_too(answered_by: str) -> None:
    backend = CascadeBackend()
    p = cascade_pipeline(backend, margin=0.3, shadow=1.0)
    classify_with_shadows(p, VALUES, variant=answered_by)
    ev = p.evidence.stats.margins[CASCADE]
    assert ev.n == len(VALUES) and sum(ev.disagree) == 3


def test_cascades_sharing_a_pair_count_each_comparison_once() -> None:
    backend = CascadeBackend()
    settings = RouterConfig.model_validate({"weights": {"fp32": 1, "int8": 1}, "shadow_fraction": 1.0})
    args = {
        n: CascadeArgs(first="int8", then="fp32", margin=m) for n, m in ((CASCADE, "auto"), (f"{CASCADE}-all", 1.0))
    }
    p = Pipeline(backend, ["fp32", "int8"], Metrics(), rng=random.Random(0), cascades=args)
    p.configure(settings, WeightedSplit(settings.weights))
    classify_with_shadows(p, VALUES, variant="int8")
    assert p.evidence.stats.margins[CASCADE].n == len(VALUES)


def test_a_variant_shadowed_on_a_cascade_runs_it() -> None:
    backend = CascadeBackend()
    p = cascade_pipeline(backend, margin=0.3, shadow=1.0, pair=(CASCADE, "fp32"))  # a rollout of the cascade vs FP32
    classify_with_shadows(p, VALUES, variant="fp32")
    # FP32 answered: the shadow runs INT8 only; the rows it would escalate agree with FP32 by construction.
    assert backend.classified == [("fp32", 9), ("int8", 9)]
    pair = p.evidence.stats.pairs["fp32|int8>fp32"]
    assert pair.shadowed == 9 and pair.top1_agree == 7
    assert p.evidence.stats.margins[CASCADE].n == 9


def test_auto_refits_from_the_ledgers_evidence_and_keeps_its_default_until_min_samples() -> None:
    cascades = Cascades({CASCADE: CascadeArgs(first="int8", then="fp32", margin="auto", min_samples=100)})
    state = cascades.get(CASCADE)
    assert state is not None and state.threshold == 0.5 and state.fit is not None and not state.fit.fitted
    ev = MarginEvidence()
    for i in range(99):  # disagreements only below 0.2: the smallest threshold reaching 0.995 is 0.20
        ev.add(i / 100, agreed=i >= 20 or i % 2 == 0)
    assert not cascades.refit({CASCADE: ev}) and state.threshold == 0.5  # 99 < 100: the default stands
    ev.add(0.995, True)
    assert cascades.refit({CASCADE: ev})
    assert state.threshold == pytest.approx(0.2) and state.fit is not None and state.fit.fitted
    summary = state.describe(with_curve=True)
    assert summary["evidence"] == {"comparisons": 100, "disagreements": 10}
    assert len(summary["curve"]) == 101
    assert cascades.refit({}) and state.threshold == 0.5  # a ledger reset: back to the default


def test_pipeline_refit_end_to_end_through_the_fake_ledger() -> None:
    backend = CascadeBackend()
    p = cascade_pipeline(backend, margin="auto", shadow=1.0, min_samples=9)
    classify_with_shadows(p, [*VALUES[:-1], 198], variant="int8")  # INT8 wrong at margins 0.295 and 0.305 only
    run(p.evidence.flush())

    async def ledger() -> Any:
        return await backend.ledger_margins()

    raw = run(ledger())
    assert p.cascades.refit({k: MarginEvidence.from_dict(v) for k, v in raw.items()})
    # Disagreements at margins 0.295, 0.305 (59, 61): 0.995 agreement needs both escalated.
    state = p.cascades.get(CASCADE)
    assert state is not None and state.threshold == pytest.approx(0.31)


def test_abstats_carry_margins_through_merge() -> None:
    a, b = ABStats(), ABStats()
    a.record_margin("int8", "fp32", 0.1, False)
    b.record_margin("int8", "fp32", 0.9, True)
    assert not a.empty()
    a.merge(b)
    assert a.margins[CASCADE].n == 2 and sum(a.margins[CASCADE].disagree) == 1


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "cascades, fragment",
    [
        ({"int8>fp16": {"first": "int8", "then": "fp16"}}, "not among the variants"),
        ({"int8>int8": {"first": "int8", "then": "int8"}}, "both 'int8'"),
        ({"int8 then fp32": {"first": "int8", "then": "fp32"}}, "cascade name"),
        ({"fp32>int8": {"first": "int8", "then": "fp32"}}, "cascade name"),
        ({"int8>fp32>int8": {"first": "int8", "then": "fp32"}}, "cascade name"),
        ({"int8>fp32": {"first": "int8", "then": "fp32", "margin": 1.5}}, "margin must be in [0, 1]"),
        ({"int8>fp32": {"first": "int8", "then": "fp32", "margin": "fit"}}, "margin"),
        ({"int8>fp32": {"first": "int8", "then": "fp32", "capture": {"enabled": True, "max_images": 0}}}, "max_images"),
    ],
)
def test_bad_cascades_are_refused_at_deploy(cascades: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match="cascade") as e:
        AppArgs.model_validate({"cascades": cascades})
    assert fragment in str(e.value)


def test_a_cascade_is_routable_by_weight_and_can_be_rolled_out() -> None:
    args = AppArgs.model_validate({"cascades": {CASCADE: {"first": "int8", "then": "fp32"}}})
    assert args.routable == ["fp32", "int8", CASCADE]
    assert RolloutSpec(candidate=CASCADE, baseline="fp32", steps=[50, 100]).candidate == CASCADE


# --------------------------------------------------------------------------- the calibration capture


def jpeg(seed: int) -> bytes:
    import cv2

    rng = np.random.default_rng(seed)
    ok, buf = cv2.imencode(".jpg", rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))
    assert ok
    return bytes(buf.tobytes())


def test_capture_keeps_disagreements_within_count_and_bytes_and_quantize_reads_the_directory(tmp_path: Path) -> None:
    images = [jpeg(i) for i in range(6)]
    cap = CaptureArgs(enabled=True, dir=str(tmp_path), max_images=4, max_bytes=10**6)
    store = CaptureStore({CASCADE: cap})
    for img in [*images, images[-1]]:  # the last twice: kept once
        store.add(CASCADE, img, {"first_top1": [1, 0.3], "then_top1": [2, 0.8]})
        store.flush()
    store.add(CASCADE, b"not an image", {})
    store.flush()
    root = tmp_path / directory_name(CASCADE)
    kept = sorted(p for p in root.iterdir() if p.suffix == ".jpg")
    assert len(kept) == 4 and {p.read_bytes() for p in kept} == set(images[2:])  # the oldest two went
    assert json.loads(kept[0].with_suffix(".json").read_text())["then_top1"] == [2, 0.8]
    state = store.describe()[CASCADE]
    assert (state["images"], state["written"], state["duplicates"], state["unknown_format"]) == (4, 6, 1, 1)
    assert list_images(root)[None] == kept  # what `python -m app.models quantize --calibration-dir` reads
    # Bytes: a cap of two images' worth keeps two.
    small = CaptureStore(
        {CASCADE: CaptureArgs(enabled=True, dir=str(tmp_path / "b"), max_bytes=2 * len(images[0]) + 400)}
    )
    for img in images:
        small.add(CASCADE, img, {})
        small.flush()
    assert small.describe()[CASCADE]["images"] == 2
    assert small.describe()[CASCADE]["bytes"] <= 2 * len(images[0]) + 400


def test_capture_retention_and_a_restart_counting_what_is_there(tmp_path: Path) -> None:
    cap = CaptureArgs(enabled=True, dir=str(tmp_path), retention_s=3600)
    store = CaptureStore({CASCADE: cap})
    store.add(CASCADE, jpeg(1), {})
    store.flush()
    root = tmp_path / directory_name(CASCADE)
    (old,) = [p for p in root.iterdir() if p.suffix == ".jpg"]
    again = CaptureStore({CASCADE: cap})  # a new replica: counts what the last one left
    again.flush()
    assert again.describe()[CASCADE]["images"] == 1
    again.add(CASCADE, old.read_bytes(), {})  # the same image: a duplicate
    again.flush()
    assert again.describe()[CASCADE]["duplicates"] == 1
    again.shelves[CASCADE].kept[0].at -= 7200  # two hours old
    again.sweep()
    assert again.describe()[CASCADE]["images"] == 0 and not old.exists()


class PhotoBackend(CascadeBackend):
    """Real JPEG files, each standing for the value `values` gives it."""

    values: dict[bytes, int] = {}

    def preprocess(self, images: list[bytes], transform: Transform, wall_deadline: float) -> Any:
        return super().preprocess([bytes([self.values[i]]) for i in images], transform, wall_deadline)


def test_escalated_disagreements_reach_the_capture_with_their_encoded_bytes(tmp_path: Path) -> None:
    backend = PhotoBackend()
    store = CaptureStore({CASCADE: CaptureArgs(enabled=True, dir=str(tmp_path))})
    p = cascade_pipeline(backend, margin=0.4, capture=store)
    odd, even = jpeg(61), jpeg(60)
    backend.values = {odd: 61, even: 60}
    run(p.classify(Choice(CASCADE, "override"), [odd, even], 5, time.perf_counter()))
    store.flush()
    state = store.describe()[CASCADE]
    assert state["written"] == 1  # only 61: escalated (0.305 < 0.4) and INT8 was wrong
    (kept,) = [q for q in (tmp_path / directory_name(CASCADE)).iterdir() if q.suffix == ".jpg"]
    assert kept.read_bytes() == odd
