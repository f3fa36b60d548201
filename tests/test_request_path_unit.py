"""benchmarks/request_path.py's merging and counting, on synthetic records (no Ray, no app started): the processes'
records merge in time order, coroutine resumptions and suspensions are not steps, hand-offs to tasks, threads and
other processes are, the quiet windows' flows are dropped as background, and only what every run took is kept."""

from __future__ import annotations

from typing import Any

from benchmarks.request_path import (
    FIELDS,
    Event,
    Step,
    background,
    clip,
    common,
    difference,
    drop_noise,
    figures,
    flows,
    merge,
    package,
    walk,
)

V1, SERVICE, FAILOVER = "app.http.v1", "app.pipeline.service", "app.pipeline.failover"
PRE, CLASSIFIER, ENGINE = "app.serve.preprocessor", "app.serve.classifier", "app.runtime.ort_engine"
METRICS, COALESCER = "app.serve.metrics", "app.pipeline.coalescer"


def ev(
    at: int,
    kind: str,
    module: str,
    func: str = "f",
    *,
    pid: int = 1,
    tid: int = 10,
    task: int | None = 100,
    fid: int = 0,
    caller: str | None = None,
    caller_fid: int | None = None,
    root: str = "app.http.v1:classify",
    origin: str | None = None,
) -> Event:
    return Event(at, pid, tid, task, kind, module, func, fid, caller, caller_fid, root, origin)


def record(e: Event) -> list[Any]:
    """An event as a process writes it (its pid is the dump's)."""
    return [getattr(e, name) for name in FIELDS]


def test_package_is_the_first_two_parts() -> None:
    assert package("app.protocol.v2.grpc") == "app.protocol"
    assert package("app.errors") == "app.errors"


def test_merge_orders_the_processes_records_by_time_and_keeps_each_process_order_on_ties() -> None:
    router = [ev(1, "call", V1, pid=7), ev(5, "call", SERVICE, pid=7, caller=V1), ev(5, "return", SERVICE, pid=7)]
    classifier = [ev(3, "call", CLASSIFIER, pid=9), ev(4, "return", CLASSIFIER, pid=9)]
    dumps = [
        {"pid": 7, "title": "ray::ServeReplica:classifier:Router", "records": [record(e) for e in router]},
        {"pid": 9, "title": "ray::ServeReplica:classifier:Classifier_fp32", "records": [record(e) for e in classifier]},
    ]
    merged = merge(dumps)
    assert [(e.pid, e.kind, e.module) for e in merged] == [
        (7, "call", V1),
        (9, "call", CLASSIFIER),
        (9, "return", CLASSIFIER),
        (7, "call", SERVICE),
        (7, "return", SERVICE),
    ]
    assert [e.module for e in clip(merged, 3, 4)] == [CLASSIFIER, CLASSIFIER]


def test_calls_and_returns_between_modules_are_steps_within_a_module_not() -> None:
    events = [
        ev(1, "call", V1, fid=1),
        ev(2, "call", V1, "helper", fid=2, caller=V1, caller_fid=1),  # same module: no step
        ev(3, "return", V1, "helper", fid=2, caller=V1, caller_fid=1),
        ev(4, "call", SERVICE, fid=3, caller=V1, caller_fid=1),
        ev(5, "call", METRICS, fid=4, caller=SERVICE, caller_fid=3),
        ev(6, "return", METRICS, fid=4, caller=SERVICE, caller_fid=3),
        ev(7, "return", SERVICE, fid=3, caller=V1, caller_fid=1),
        ev(8, "return", V1, fid=1),  # back into Serve: no app caller, no step
    ]
    assert walk(events, lambda pid: "Router") == [
        Step(V1, SERVICE, "call", "Router"),
        Step(SERVICE, METRICS, "call", "Router"),
        Step(METRICS, SERVICE, "return", "Router"),
        Step(SERVICE, V1, "return", "Router"),
    ]


def test_coroutine_suspensions_and_resumptions_are_not_steps() -> None:
    events = [
        ev(1, "call", V1, fid=1),
        ev(2, "call", SERVICE, fid=2, caller=V1, caller_fid=1),
        ev(3, "yield", SERVICE, fid=2, caller=V1, caller_fid=1),  # awaiting I/O: the chain suspends, innermost first
        ev(4, "yield", V1, fid=1),
        ev(5, "resume", V1, fid=1),  # the same flow again: no other flow ran in between
        ev(6, "resume", SERVICE, fid=2, caller=V1, caller_fid=1),
        ev(7, "yield", SERVICE, fid=2, caller=V1, caller_fid=1),
        ev(8, "yield", V1, fid=1),
        ev(9, "resume", V1, fid=1),
        ev(10, "resume", SERVICE, fid=2, caller=V1, caller_fid=1),
        ev(11, "return", SERVICE, fid=2, caller=V1, caller_fid=1),
    ]
    assert [s.kind for s in walk(events)] == ["call", "return"]


def test_process_hops_there_and_back_continue_where_control_was() -> None:
    router = {"pid": 1, "tid": 10, "task": 100}
    events = [
        ev(1, "call", V1, fid=1, **router),
        ev(2, "call", FAILOVER, fid=2, caller=V1, caller_fid=1, **router),
        ev(3, "yield", FAILOVER, fid=2, caller=V1, caller_fid=1, **router),  # control was in failover ...
        ev(4, "yield", V1, fid=1, **router),  # ... not in v1, the outermost frame, which suspends last
        ev(5, "call", PRE, fid=3, pid=2, tid=20, task=200, root="app.serve.preprocessor:many"),
        ev(6, "return", PRE, fid=3, pid=2, tid=20, task=200, root="app.serve.preprocessor:many"),
        ev(7, "resume", V1, fid=1, **router),  # the chain resumes outermost first: control is back in failover
        ev(8, "resume", FAILOVER, fid=2, caller=V1, caller_fid=1, **router),
        ev(9, "return", FAILOVER, fid=2, caller=V1, caller_fid=1, **router),
    ]
    roles = {1: "Router", 2: "Preprocessor"}
    steps = walk(events, roles.__getitem__)
    assert steps == [
        Step(V1, FAILOVER, "call", "Router"),
        Step(FAILOVER, PRE, "process", "Preprocessor"),
        Step(PRE, FAILOVER, "process", "Router"),
        Step(FAILOVER, V1, "return", "Router"),
    ]
    assert figures(steps, (e.module for e in events))["process_hops"] == 2


def test_a_task_starts_from_where_its_coroutine_was_made_a_thread_job_from_where_control_was() -> None:
    events = [
        ev(1, "call", SERVICE, fid=1),
        ev(2, "call", COALESCER, "submit", fid=2, caller=SERVICE, caller_fid=1),
        ev(3, "return", COALESCER, "submit", fid=2, caller=SERVICE, caller_fid=1),
        ev(4, "yield", SERVICE, fid=1),
        # a task the coalescer made (cr_origin): a hand-off from the coalescer, though the service ran last
        ev(5, "call", FAILOVER, "_wait", fid=3, task=101, origin=f"{COALESCER}:_run_group"),
        ev(6, "yield", FAILOVER, "_wait", fid=3, task=101),
        # a thread pool's job in the Classifier: no app frame below it, no coroutine: from the last flow's place
        ev(7, "call", CLASSIFIER, "__call__", fid=4, pid=3, tid=30, task=300),
        ev(8, "yield", CLASSIFIER, "__call__", fid=4, pid=3, tid=30, task=300),
        ev(9, "call", ENGINE, "run", fid=5, pid=3, tid=31, task=None),
        ev(10, "return", ENGINE, "run", fid=5, pid=3, tid=31, task=None),
        ev(11, "resume", CLASSIFIER, "__call__", fid=4, pid=3, tid=30, task=300),
        ev(12, "return", CLASSIFIER, "__call__", fid=4, pid=3, tid=30, task=300),
    ]
    assert [(s.src, s.dst, s.kind) for s in walk(events)] == [
        (SERVICE, COALESCER, "call"),
        (COALESCER, SERVICE, "return"),
        (COALESCER, FAILOVER, "task"),
        (FAILOVER, CLASSIFIER, "process"),
        (CLASSIFIER, ENGINE, "thread"),
        (ENGINE, CLASSIFIER, "thread"),
    ]


def test_flows_seen_in_a_quiet_window_are_background_unless_they_ran_more() -> None:
    def pusher(at: int, func: str, pid: int = 1) -> Event:
        return ev(at, "call", METRICS, func, pid=pid, task=7, root=f"{METRICS}:push_forever")

    quiet = [pusher(1, "push"), pusher(2, "snapshot"), ev(3, "call", FAILOVER, "_wait", task=8, origin="app.x:flush")]
    noise = background([quiet])
    assert noise[(f"{METRICS}:push_forever", None)] == {(METRICS, "push"), (METRICS, "snapshot")}
    request = [
        ev(10, "call", V1, task=1),
        ev(11, "call", SERVICE, task=1, caller=V1),
        pusher(12, "push"),  # the same background flow during the request: dropped
        ev(13, "call", FAILOVER, "_wait", task=2, origin=f"{COALESCER}:_run_group"),  # made elsewhere: the request's
        ev(14, "call", FAILOVER, "_wait", task=3, origin="app.x:flush"),  # made where the quiet one was: background
        ev(15, "call", METRICS, "push", pid=2, task=9, root=f"{METRICS}:push_forever"),  # same root ...
        ev(16, "call", METRICS, "observe_request", pid=2, task=9, root=f"{METRICS}:push_forever"),  # ... but more
    ]
    kept, dropped = drop_noise(request, noise)
    assert [(e.task, e.func) for e in kept] == [(1, "f"), (1, "f"), (2, "_wait"), (9, "push"), (9, "observe_request")]
    assert sorted((d["root"], d["origin"]) for d in dropped) == [
        ("app.http.v1:classify", "app.x:flush"),
        (f"{METRICS}:push_forever", None),
    ]
    assert set(flows(kept)) == {(1, 10, 1), (1, 10, 2), (2, 10, 9)}


def test_only_what_every_run_took_is_kept_as_often_as_the_run_that_took_it_least() -> None:
    a, b, c, noise = (
        Step(V1, SERVICE, "call"),
        Step(SERVICE, V1, "return"),
        Step(V1, METRICS, "call"),
        Step("x", "y", "call"),
    )
    runs = [[a, b, a, b, c, noise], [c, a, b, a, b], [a, b, c, a, b, a, b]]
    assert common(runs) == [a, b, a, b, c]
    assert common([]) == []


def test_figures_count_modules_packages_steps_and_hops_and_the_difference_of_two_paths() -> None:
    grpc = [Step("app.http.v2_grpc", SERVICE, "call"), Step(SERVICE, PRE, "process"), Step(PRE, SERVICE, "process")]
    v2 = [Step("app.http.v2_rest", "app.protocol.v2.parsing", "call"), Step("app.http.v2_rest", SERVICE, "call")]
    v2 += grpc[1:]
    f = figures(grpc, ["app.http.v2_grpc", "app.protocol.v2.grpc"])
    assert (f["modules"], f["packages"], f["steps"], f["process_hops"]) == (4, 4, 3, 2)
    assert f["package_list"] == ["app.http", "app.pipeline", "app.protocol", "app.serve"]
    assert f["steps_by_kind"] == {"call": 1, "process": 2}
    d = difference(grpc, v2)
    assert d["steps"] == -1
    assert d["only_in_first"] == [f"app.http.v2_grpc -> {SERVICE} (call) x1"]
    assert d["only_in_second"] == [
        "app.http.v2_rest -> app.protocol.v2.parsing (call) x1",
        f"app.http.v2_rest -> {SERVICE} (call) x1",
    ]


def test_a_step_reads_in_the_direction_control_went() -> None:
    assert str(Step(V1, SERVICE, "call", "Router")) == f"{V1} -> {SERVICE} [Router]"
    assert str(Step(SERVICE, V1, "return", "Router")) == f"{V1} <- {SERVICE} [Router]"
    assert str(Step(FAILOVER, PRE, "process", "Preprocessor")) == f"{FAILOVER} => {PRE} [Preprocessor, process]"
