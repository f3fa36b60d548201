"""The request pipeline (app/pipeline/) without Ray: coalescing, failover, admission, shadowing, the service.

Serve's handles are replaced by FakeBackend, which satisfies app/pipeline/ports.Backend with
asyncio futures; `ray.init` raises for the whole module (Ray Serve's own unit-test habit), so
nothing here can start a cluster by accident.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from app.config import RouterConfig
from app.errors import ServiceError
from app.imaging.payloads import Pixels, Scores
from app.imaging.transform import Transform
from app.pipeline.abstats import ABStats
from app.pipeline.admission import Admission, Limits
from app.pipeline.coalescer import Coalescer, Waiter
from app.pipeline.failover import Failover
from app.pipeline.group_run import Classify
from app.pipeline.ports import ReplicaLost
from app.pipeline.routing import Choice, WeightedSplit
from app.pipeline.service import Pipeline
from app.pipeline.shadow import Evidence, Shadow

SPLIT = WeightedSplit({"fp32": 1.0, "int8": 1.0})


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def refuse(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("unit tests of the pipeline must not start Ray")

    monkeypatch.setattr(ray, "init", refuse)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10.0))  # type: ignore[arg-type]


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll with a deadline (never a bare sleep as synchronisation)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not check():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


class FakeCall:
    """A downstream call: awaitable, cancellable, passable to another call (like a DeploymentResponse)."""

    def __init__(self, coro: Awaitable[Any]) -> None:
        self.future = asyncio.ensure_future(coro)
        self.cancelled = False

    def __await__(self) -> Any:
        return self.future.__await__()

    def cancel(self) -> None:
        self.cancelled = True
        self.future.cancel()


def top_of(image: bytes) -> list[tuple[int, float]]:
    """A deterministic 'classification': the class is the image's first byte."""
    return [(image[0], 0.9), (image[0] + 1, 0.05)]


class FakeBackend:
    """Preprocessor + Classifiers + ledger in one process. Knobs: hang / fail a variant, routable counts."""

    def __init__(self, variants: tuple[str, ...] = ("fp32", "int8")) -> None:
        self.gates: dict[str, asyncio.Event] = {}  # a variant whose gate is unset hangs until it is set
        self.failing: dict[str, int] = {}  # variant -> how many calls still fail with ReplicaLost
        self.routable_counts: dict[str, int | None] = dict.fromkeys(variants, 1)
        self.groups: list[int] = []  # images per Preprocessor call
        self.calls: list[FakeCall] = []
        self.classified: list[tuple[str, int]] = []  # (variant, rows) per Classifier call
        self.ledger: list[ABStats] = []
        self.ledger_down = False
        self.described: list[str] = []  # variants asked to describe themselves
        self.transforms: list[Transform] = []  # the transform each Preprocessor call was handed

    def preprocess(self, images: list[bytes], transform: Transform, wall_deadline: float) -> FakeCall:
        self.groups.append(len(images))
        self.transforms.append(transform)

        async def go() -> Pixels:
            bad = {i: ServiceError("undecodable_image", "bad") for i, b in enumerate(images) if b == b"bad"}
            ok = [i for i in range(len(images)) if i not in bad]
            return Pixels(np.array([[images[i][0]] for i in ok]), 1.0, bad, ok)

        call = FakeCall(go())
        self.calls.append(call)
        return call

    def classify(self, variant: str, pixels: Any, top_k: int, full: bool, rows: list[int] | None) -> FakeCall:
        async def go() -> Scores:
            px: Pixels = await pixels if isinstance(pixels, FakeCall) else pixels
            if variant in self.gates:
                await self.gates[variant].wait()
            if self.failing.get(variant, 0) > 0:
                self.failing[variant] -= 1
                raise ReplicaLost("RayActorError")
            arr = px.array if rows is None else px.array[rows]
            self.classified.append((variant, len(arr)))
            top = [self.top_for(variant, int(r[0])) for r in arr]
            logits = self.logits_for(variant, arr) if full else None
            positions = px.positions if rows is None else [px.positions[r] for r in rows]
            return Scores(top, px.preprocess_ms, 2.0, 3.0, len(arr), variant, "CPU", dict(px.errors), positions, logits)

        call = FakeCall(go())
        self.calls.append(call)
        return call

    def top_for(self, variant: str, value: int) -> list[tuple[int, float]]:
        return top_of(bytes([value % 250]))

    def logits_for(self, variant: str, rows: np.ndarray) -> np.ndarray:
        return np.asarray(rows, dtype=np.float32)

    def describe(self, variant: str) -> FakeCall:
        self.described.append(variant)

        async def go() -> dict[str, Any]:
            return {"input": {"size": [224, 224], "transform": Transform.square(224).to_dict()}}

        return FakeCall(go())

    def labels(self, variant: str) -> FakeCall:
        async def go() -> list[str]:
            return [f"class_{i}" for i in range(256)]

        return FakeCall(go())

    def ready(self, variant: str) -> FakeCall:
        async def go() -> bool:
            return variant not in self.gates

        return FakeCall(go())

    def ledger_add(self, delta: Any) -> FakeCall:
        async def go() -> None:
            if self.ledger_down:
                raise ReplicaLost("RayActorError")
            self.ledger.append(delta)

        return FakeCall(go())

    def ledger_summary(self) -> FakeCall:
        return self.describe("")

    def ledger_reset(self) -> FakeCall:
        return self.describe("")

    def ledger_model_stats(self) -> FakeCall:
        return self.describe("")

    def ledger_margins(self) -> FakeCall:
        async def go() -> dict[str, Any]:
            merged = ABStats()
            for delta in self.ledger:
                merged.merge(delta)
            return {k: m.to_dict() for k, m in merged.margins.items()}

        return FakeCall(go())

    def ledger_poll(self, config_id: str, weights: dict[str, float]) -> FakeCall:
        async def go() -> None:
            return None

        return FakeCall(go())

    def rollout(self, method: str, *args: Any) -> FakeCall:
        return self.describe("")

    async def result(self, call: Any) -> Any:
        return await call

    def routable(self, variant: str) -> int | None:
        return self.routable_counts.get(variant)

    async def running(self) -> dict[str, int] | None:
        return {v: n or 0 for v, n in self.routable_counts.items()}


class Metrics:
    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.deltas: list[float] = []

    def shadow_outcome(self, pair: str, outcome: str, n: int = 1) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n

    def shadow_delta(self, pair: str, abs_dp: float) -> None:
        self.deltas.append(abs_dp)

    def cascade_images(self, cascade: str, outcome: str, n: int) -> None:
        self.outcomes[f"{cascade}:{outcome}"] = self.outcomes.get(f"{cascade}:{outcome}", 0) + n


def pipeline(backend: FakeBackend, **cfg: Any) -> Pipeline:
    settings = RouterConfig.model_validate({"weights": {"fp32": 1, "int8": 1}, **cfg})
    p = Pipeline(backend, ["fp32", "int8"], Metrics(), rng=random.Random(0))
    p.configure(settings, WeightedSplit(settings.weights))
    return p


# --------------------------------------------------------------------------- coalescer


class Runner:
    """A group runner that records groups and can be held."""

    def __init__(self) -> None:
        self.groups: list[list[Any]] = []
        self.release = asyncio.Event()
        self.fail: BaseException | None = None

    async def __call__(self, key: Any, group: list[Waiter]) -> list[Any]:
        self.groups.append([img for w in group for img in w.images])
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [f"answer:{w.images[0]}" for w in group]


def test_requests_arriving_while_a_group_is_out_leave_together_each_with_its_own_answer() -> None:
    async def go() -> None:
        runner = Runner()
        c: Coalescer[str] = Coalescer(runner, lambda: (1, 16))
        first = asyncio.ensure_future(c.submit("fp32", ["a"]))
        await until(lambda: len(runner.groups) == 1)
        rest = [asyncio.ensure_future(c.submit("fp32", [x])) for x in "bcd"]
        await until(lambda: c.waiting("fp32") == 3)
        runner.release.set()
        answers = await asyncio.gather(first, *rest)
        assert runner.groups == [["a"], ["b", "c", "d"]]
        assert answers == ["answer:a", "answer:b", "answer:c", "answer:d"]

    run(go())


def test_at_most_max_groups_are_in_flight_per_key_and_other_keys_do_not_wait() -> None:
    async def go() -> None:
        runner = Runner()
        c: Coalescer[str] = Coalescer(runner, lambda: (2, 16))
        tasks = [asyncio.ensure_future(c.submit("fp32", [i])) for i in range(5)]
        await until(lambda: len(runner.groups) == 2)
        assert c.in_flight["fp32"] == 2 and c.waiting("fp32") == 3
        other = asyncio.ensure_future(c.submit("int8", ["x"]))
        await until(lambda: len(runner.groups) == 3)  # another variant is not held by fp32's groups
        runner.release.set()
        await asyncio.gather(*tasks, other)
        assert sorted(map(len, runner.groups)) == [1, 1, 1, 3]
        assert c.in_flight["fp32"] == 0

    run(go())


def test_a_group_holds_at_most_max_images_and_a_larger_request_goes_alone() -> None:
    async def go() -> None:
        runner = Runner()
        c: Coalescer[str] = Coalescer(runner, lambda: (1, 4))
        first = asyncio.ensure_future(c.submit("k", ["a"]))
        await until(lambda: len(runner.groups) == 1)
        tasks = [asyncio.ensure_future(c.submit("k", imgs)) for imgs in (["b", "c"], ["d", "e"], ["f"], list("ghijkl"))]
        await until(lambda: c.waiting("k") == 4)
        runner.release.set()
        await asyncio.gather(first, *tasks)
        assert runner.groups == [["a"], ["b", "c", "d", "e"], ["f"], list("ghijkl")]

    run(go())


def test_a_cancelled_waiter_is_not_sent_and_a_group_of_only_cancelled_ones_is_never_run() -> None:
    async def go() -> None:
        runner = Runner()
        c: Coalescer[str] = Coalescer(runner, lambda: (1, 16))
        first = asyncio.ensure_future(c.submit("k", ["a"]))
        await until(lambda: len(runner.groups) == 1)
        gone, stays = asyncio.ensure_future(c.submit("k", ["b"])), asyncio.ensure_future(c.submit("k", ["c"]))
        await until(lambda: c.waiting("k") == 2)
        gone.cancel()
        runner.release.set()
        assert await stays == "answer:c"
        await first
        assert runner.groups == [["a"], ["c"]]
        runner.release.clear()
        held = asyncio.ensure_future(c.submit("k", ["d"]))
        await until(lambda: len(runner.groups) == 3)
        lonely = asyncio.ensure_future(c.submit("k", ["e"]))
        await until(lambda: c.waiting("k") == 1)
        lonely.cancel()
        runner.release.set()
        await held
        await until(lambda: c.in_flight["k"] == 0)
        assert len(runner.groups) == 3  # "e" alone was cancelled: its group never ran

    run(go())


def test_a_failed_group_fails_each_of_its_waiters() -> None:
    async def go() -> None:
        runner = Runner()
        runner.fail = ServiceError("inference_timeout", "late")
        runner.release.set()
        c: Coalescer[str] = Coalescer(runner, lambda: (1, 16))
        results = await asyncio.gather(*(c.submit("k", [x]) for x in "ab"), return_exceptions=True)
        assert all(isinstance(r, ServiceError) and r.code == "inference_timeout" for r in results)

    run(go())


# --------------------------------------------------------------------------- failover


def attempt_on(backend: FakeBackend, fo: Failover) -> Classify:
    """The attempt ready pixels make: one Classifier call on the variant, abandoned when the variant fails."""
    return Classify(backend, fo, Pixels(np.array([[7]]), 0.0, {}, [0]), 5, False)


def deadline_in(s: float) -> float:
    return asyncio.get_running_loop().time() + s


def test_a_replica_failure_is_retried_on_the_other_variant_and_the_failed_one_is_avoided_next() -> None:
    async def go() -> None:
        backend = FakeBackend()
        backend.failing["fp32"] = 1
        fo = Failover(backend, ["fp32", "int8"])
        with _perf_is_loop_time():
            scores, variant = await fo.run(
                Choice("fp32", "weighted"), SPLIT, True, deadline_in(5), attempt_on(backend, fo)
            )
            assert variant == "int8" and scores.variant == "int8"
            _, variant = await fo.run(Choice("fp32", "weighted"), SPLIT, True, deadline_in(5), attempt_on(backend, fo))
        assert variant == "int8"  # fp32 is held down after its failure: no second wait on it
        assert [v for v, _ in backend.classified] == ["int8", "int8"]

    run(go())


def test_a_call_waiting_on_a_variant_that_lost_its_replicas_is_abandoned_at_once_and_served_elsewhere() -> None:
    async def go() -> None:
        backend = FakeBackend()
        backend.gates["fp32"] = asyncio.Event()  # fp32 never answers
        fo = Failover(backend, ["fp32", "int8"])
        with _perf_is_loop_time():
            task = asyncio.ensure_future(
                fo.run(Choice("fp32", "weighted"), SPLIT, True, deadline_in(60), attempt_on(backend, fo))
            )
            await until(lambda: len(backend.calls) == 1)
            backend.routable_counts["fp32"] = 0  # Serve's handle dropped fp32's last replica
            # fp32 never answers and the request's deadline is 60 s away: an answer at all, within run()'s polling
            # timeout (a sixth of that deadline), is the call abandoned once fp32 had no replica left.
            _, variant = await task
        assert variant == "int8"
        assert backend.calls[0].cancelled and not backend.gates["fp32"].is_set()

    run(go())


def test_a_failure_seen_by_one_request_wakes_the_others_waiting_on_that_variant() -> None:
    async def go() -> None:
        backend = FakeBackend()
        backend.gates["fp32"] = asyncio.Event()
        fo = Failover(backend, ["fp32", "int8"])
        with _perf_is_loop_time():
            task = asyncio.ensure_future(
                fo.run(Choice("fp32", "weighted"), SPLIT, True, deadline_in(60), attempt_on(backend, fo))
            )
            await until(lambda: len(backend.calls) == 1)
            fo.mark_failed("fp32")  # another request saw fp32's replica die
            _, variant = await task
        assert variant == "int8"

    run(go())


def test_the_deadline_gives_503_and_cancels_the_call_and_its_upstream() -> None:
    async def go() -> None:
        backend = FakeBackend()
        hung = FakeCall(asyncio.Event().wait())
        upstream = FakeCall(asyncio.Event().wait())
        fo = Failover(backend, ["fp32"])
        with pytest.raises(ServiceError) as e:
            await fo.call(hung, 0.05, upstream)
        assert e.value.code == "inference_timeout" and e.value.status == 503
        assert hung.cancelled and upstream.cancelled

    run(go())


def test_a_forced_variant_is_retried_on_itself_only_and_then_fails_with_its_name() -> None:
    async def go() -> None:
        backend = FakeBackend()
        backend.failing["int8"] = 2
        fo = Failover(backend, ["fp32", "int8"])
        with _perf_is_loop_time(), pytest.raises(ServiceError) as e:
            await fo.run(Choice("int8", "override"), SPLIT, True, deadline_in(5), attempt_on(backend, fo))
        assert e.value.code == "replica_failed" and e.value.variant == "int8"
        assert backend.classified == []  # fp32 was never asked

    run(go())


def test_a_service_error_from_the_chain_names_its_variant() -> None:
    async def go() -> None:
        fo = Failover(FakeBackend(), ["fp32", "int8"])

        class Refused:
            async def on(self, variant: str, deadline: float, abort: asyncio.Event | None) -> None:
                raise ServiceError("overloaded", "full")

        with pytest.raises(ServiceError) as e:
            await fo.run(Choice("int8", "weighted"), SPLIT, True, deadline_in(5), Refused())
        assert e.value.variant == "int8"

    run(go())


class _perf_is_loop_time:
    """Failover compares deadlines with time.perf_counter; the tests above build them from the loop's clock."""

    def __enter__(self) -> None:
        import time

        self.mp = pytest.MonkeyPatch()
        self.mp.setattr(time, "perf_counter", lambda: asyncio.get_event_loop().time())

    def __exit__(self, *exc: object) -> None:
        self.mp.undo()


# --------------------------------------------------------------------------- admission


def test_admission_refuses_past_the_limit_at_once_and_frees_slots_on_exit_and_cancel() -> None:
    async def go() -> None:
        adm = Admission()
        held = asyncio.Event()

        async def hold() -> None:
            async with adm.admitted(Limits(2)):
                await held.wait()

        tasks = [asyncio.ensure_future(hold()) for _ in range(2)]
        await until(lambda: adm.in_flight == 2)
        with pytest.raises(ServiceError) as e:
            async with adm.admitted(Limits(2)):
                pass
        assert e.value.code == "overloaded" and e.value.status == 503 and "Retry-After" in e.value.headers()
        tasks[0].cancel()
        await until(lambda: adm.in_flight == 1)
        assert adm.cancelled == 1
        held.set()
        await tasks[1]
        assert adm.in_flight == 0

    run(go())


# --------------------------------------------------------------------------- shadow


def scores(variant: str, n: int) -> Scores:
    return Scores([top_of(bytes([i])) for i in range(n)], 0, 0, 0, n, variant, "CPU", {}, list(range(n)))


def test_shadows_are_shed_first_beyond_max_in_flight_and_counted_as_dropped() -> None:
    async def go() -> None:
        backend = FakeBackend()
        backend.gates["int8"] = asyncio.Event()  # the shadow variant is slow
        metrics = Metrics()
        evidence = Evidence(backend)
        shadow = Shadow(backend, ["fp32", "int8"], evidence, metrics, random.Random(0))
        px = Pixels(np.array([[0], [1]]), 0, {}, [0, 1])
        assert shadow.maybe(scores("fp32", 2), px, 1.0, max_in_flight=1) == [0, 1]
        assert len(shadow.running) == 1
        shadow.maybe(scores("fp32", 2), px, 1.0, max_in_flight=1)
        assert metrics.outcomes == {"dropped": 2}
        backend.gates["int8"].set()
        await until(lambda: not shadow.running)
        assert metrics.outcomes == {"dropped": 2, "agree": 2}
        pair = evidence.stats.summary()
        assert pair  # the agreement and the drops are in the evidence that goes to the ledger

    run(go())


def test_only_the_sampled_rows_are_rerun_and_disagreement_is_recorded() -> None:
    async def go() -> None:
        backend = FakeBackend()
        metrics = Metrics()
        shadow = Shadow(backend, ["fp32", "int8"], Evidence(backend), metrics, random.Random(1))
        primary = scores("fp32", 50)
        primary.top[0] = [(999, 0.5)]  # the shadow will say otherwise for this row, if sampled
        px = Pixels(np.array([[i] for i in range(50)]), 0, {}, list(range(50)))
        rows = shadow.maybe(primary, px, 0.3, max_in_flight=4)
        await until(lambda: not shadow.running)
        assert 0 < len(rows) < 50 and backend.classified == [("int8", len(rows))]
        assert sum(metrics.outcomes.values()) == len(rows)
        assert metrics.outcomes.get("disagree", 0) == (1 if 0 in rows else 0)
        assert shadow.maybe(primary, px, 0.0, 4) == []

    run(go())


def test_a_rollouts_pair_is_shadowed_on_each_other_and_other_variants_as_before() -> None:
    async def go() -> None:
        backend = FakeBackend()
        shadow = Shadow(backend, ["fp32", "int8", "mobilenet"], Evidence(backend), Metrics(), random.Random(0))
        px = Pixels(np.array([[0]]), 0, {}, [0])
        assert [shadow.partner(v) for v in ("fp32", "int8", "mobilenet")] == ["int8", "fp32", "fp32"]
        shadow.pair = ("mobilenet", "fp32")  # a rollout of mobilenet against fp32
        assert [shadow.partner(v) for v in ("fp32", "int8", "mobilenet")] == ["mobilenet", "fp32", "fp32"]
        shadow.maybe(scores("fp32", 1), px, 1.0, max_in_flight=4)
        await until(lambda: not shadow.running)
        assert backend.classified == [("mobilenet", 1)]

    run(go())


def test_evidence_flushes_its_delta_to_the_ledger_and_survives_a_ledger_outage() -> None:
    async def go() -> None:
        backend = FakeBackend()
        ev = Evidence(backend)
        ev.stats.record_request("fp32", 12.0, ok=True)
        await ev.flush()
        assert len(backend.ledger) == 1 and ev.stats.empty()
        ev.stats.record_request("fp32", 12.0, ok=True)
        backend.ledger_down = True
        await ev.flush()  # logged and dropped: serving goes on
        assert ev.stats.empty() and len(backend.ledger) == 1

    run(go())


# --------------------------------------------------------------------------- the service


def test_concurrent_requests_share_one_chain_trip_and_each_gets_its_own_images_answers() -> None:
    async def go() -> None:
        backend = FakeBackend()
        p = pipeline(backend, max_groups_in_flight=1, coalesce_max=16)
        backend.gates["fp32"] = asyncio.Event()
        choice = Choice("fp32", "weighted")
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(p.classify(choice, [b"\x01"], 5, loop.time()))
        await until(lambda: len(backend.groups) == 1)
        later = [
            asyncio.ensure_future(p.classify(choice, imgs, 5, loop.time()))
            for imgs in ([b"\x02"], [b"\x03", b"bad", b"\x04"], [b"\x05"])
        ]
        await until(lambda: p.coalescer.waiting(("fp32", False, False)) == 3)
        backend.gates["fp32"].set()
        outs = await asyncio.gather(first, *later)
        assert backend.groups == [1, 5]  # one Preprocessor call for the three that waited
        assert outs[1].top[0][0][0] == 2
        assert {k: v[0][0] for k, v in outs[2].top.items()} == {0: 3, 2: 4}
        assert outs[2].errors[1].code == "undecodable_image"
        assert outs[3].top[0][0][0] == 5 and not outs[3].errors
        assert all(o.variant == "fp32" and not o.failed_over for o in outs)

    with _perf_is_loop_time():
        run(go())


def test_full_outputs_come_back_sliced_per_request_and_pixels_skip_the_preprocessor() -> None:
    async def go() -> None:
        backend = FakeBackend()
        p = pipeline(backend)
        now = asyncio.get_running_loop().time()
        out = await p.classify(Choice("int8", "model"), [b"\x09", b"\x0a"], 5, now, full=True)
        assert out.logits is not None and out.logits[:, 0].tolist() == [9.0, 10.0]
        assert out.routing == "model"
        px = Pixels(np.array([[3], [4]]), 0.0, {}, [0, 1])
        out = await p.classify_pixels(Choice("fp32", "weighted"), px, 5, now)
        assert sorted(out.top) == [0, 1] and backend.groups == [2]  # no second Preprocessor call

    with _perf_is_loop_time():
        run(go())


def test_the_transform_given_at_construction_goes_down_with_each_decode_without_asking_a_classifier() -> None:
    """The model's transform reaches the decode by construction (build_app reads it from the model's files): no
    describe() round trip to a Classifier, and the header check knows the decode target before the first request.
    Without one (no model file on the deploying node) the first request asks a Classifier, once."""
    given = Transform(240, 240, 3, 256, "cubic", "RGB")

    async def go() -> None:
        backend = FakeBackend()
        p = Pipeline(backend, ["fp32", "int8"], Metrics(), rng=random.Random(0), transform=given)
        settings = RouterConfig.model_validate({"weights": {"fp32": 1, "int8": 1}})
        p.configure(settings, WeightedSplit(settings.weights))
        assert p.specs.known_target("int8") == given.decode_target
        now = asyncio.get_running_loop().time()
        await p.classify(Choice("int8", "model"), [b"\x09"], 5, now)
        await p.classify(Choice("fp32", "model"), [b"\x0a"], 5, now)
        assert backend.transforms == [given, given] and backend.described == []

        asked = FakeBackend()
        q = pipeline(asked)
        assert q.specs.known_target("int8") is None  # not known until a Classifier said
        await q.classify(Choice("int8", "model"), [b"\x09"], 5, now)
        await q.classify(Choice("int8", "model"), [b"\x0a"], 5, now)
        assert asked.described == ["int8"] and asked.transforms == [Transform.square(224)] * 2

    with _perf_is_loop_time():
        run(go())


def test_the_pipeline_fails_over_and_says_so() -> None:
    async def go() -> None:
        backend = FakeBackend()
        backend.failing["fp32"] = 1
        p = pipeline(backend)
        out = await p.classify(Choice("fp32", "weighted"), [b"\x01"], 5, asyncio.get_running_loop().time())
        assert out.variant == "int8" and out.failed_over

    with _perf_is_loop_time():
        run(go())


def test_ready_reports_each_variant() -> None:
    async def go() -> None:
        backend = FakeBackend()
        backend.gates["int8"] = asyncio.Event()
        assert await pipeline(backend).specs.ready(["fp32", "int8"]) == {"fp32": True, "int8": False}

    run(go())


def test_a_service_error_keeps_its_variant_across_pickling_and_ray_wrapping() -> None:
    import pickle

    from app.errors import ImageInputError, find_service_error

    err = pickle.loads(pickle.dumps(ServiceError("replica_failed", "gone", "int8")))
    assert (err.code, err.message, err.variant) == ("replica_failed", "gone", "int8")
    wrapped = RuntimeError("RayTaskError")
    wrapped.__cause__ = ImageInputError("empty_body", "nothing", "fp32")
    found = find_service_error(wrapped)
    assert found is not None and found.variant == "fp32" and found.status == 400


def test_a_group_whose_every_request_went_away_is_cancelled_with_its_downstream_calls() -> None:
    async def go() -> None:
        backend = FakeBackend()
        backend.gates["fp32"] = asyncio.Event()  # never answers
        p = pipeline(backend)
        task = asyncio.ensure_future(p.classify(Choice("fp32", "weighted"), [b"\x01"], 5, time_now()))
        await until(lambda: len(backend.calls) == 2)  # the Preprocessor call and the Classifier call
        task.cancel()
        await until(lambda: all(c.future.done() for c in backend.calls))
        assert backend.calls[1].cancelled
        await until(lambda: p.coalescer.in_flight[("fp32", False, False)] == 0)

    with _perf_is_loop_time():
        run(go())


def test_each_request_keeps_its_own_deadline_inside_a_shared_group() -> None:
    async def go() -> None:
        backend = FakeBackend()
        p = pipeline(backend, inference_timeout_s=1.0, max_groups_in_flight=1)
        backend.gates["fp32"] = asyncio.Event()
        choice = Choice("fp32", "weighted")
        first = asyncio.ensure_future(p.classify(choice, [b"\x01"], 5, time_now()))
        await until(lambda: len(backend.groups) == 1)
        old = asyncio.ensure_future(p.classify(choice, [b"\x02"], 5, time_now() - 0.7))  # 0.3 s left
        fresh = asyncio.ensure_future(p.classify(choice, [b"\x03"], 5, time_now()))
        await until(lambda: p.coalescer.waiting(("fp32", False, False)) == 2)
        with pytest.raises(ServiceError) as e:
            await old
        assert e.value.code == "inference_timeout" and e.value.variant == "fp32"
        assert not fresh.done()
        backend.gates["fp32"].set()
        assert (await fresh).top[0][0][0] == 3
        await first

    with _perf_is_loop_time():
        run(go())


def test_group_work_does_not_run_in_the_context_of_the_request_that_started_it() -> None:
    import contextvars

    request_var: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")

    async def go() -> None:
        seen: list[str] = []

        async def runner(key: Any, group: list[Waiter]) -> list[Any]:
            seen.append(request_var.get())
            return [None for _ in group]

        c: Coalescer[str] = Coalescer(runner, lambda: (1, 16))
        request_var.set("request-1")
        await c.submit("k", ["a"])
        assert seen == ["none"]  # Serve would otherwise cancel the whole group with request-1

    run(go())


def test_a_runner_that_answers_short_fails_the_rest_instead_of_leaving_them_hanging() -> None:
    async def go() -> None:
        release = asyncio.Event()

        async def runner(key: Any, group: list[Waiter]) -> list[Any]:
            await release.wait()
            return ["only one"]

        c: Coalescer[str] = Coalescer(runner, lambda: (1, 16))
        first = asyncio.ensure_future(c.submit("k", ["a"]))
        await until(lambda: c.in_flight["k"] == 1)
        pair = [asyncio.ensure_future(c.submit("k", [x])) for x in "bc"]
        await until(lambda: c.waiting("k") == 2)
        release.set()
        assert await first == "only one"
        results = await asyncio.gather(*pair, return_exceptions=True)
        assert results[0] == "only one" and isinstance(results[1], ServiceError)

    run(go())


def test_a_lost_replica_on_a_control_call_is_a_503_not_a_500() -> None:
    async def go() -> None:
        backend = FakeBackend()
        p = pipeline(backend)

        async def lost() -> None:
            raise ReplicaLost("RayActorError", unavailable=True)

        with pytest.raises(ServiceError) as e:
            await p.specs.ask(FakeCall(lost()), 1.0)
        assert e.value.code == "variant_unavailable" and e.value.status == 503

    run(go())


def time_now() -> float:
    return asyncio.get_running_loop().time()
