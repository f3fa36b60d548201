"""No test bounds a duration or a throughput: on a shared 2-core runner every such bound is a flake.

A test asserts behaviour (an ordering, an event waited for with a deadline, a count of work done); speed is measured
by benchmarks/. This scans tests/*.py with the ast module (the files are parsed, not imported; no Ray) and fails on a
check that compares a timing with a number or with another timing.

What is a check: an `assert`'s condition, and the condition of an `if` whose body raises or calls pytest.fail. Only
the comparisons in the check's own position count: the condition itself, the operands of `and`/`or`/`not`, and the
element of an `all(...)`/`any(...)` generator. A comparison used as a value (`passed == (speedup >= 1.2)`: the
gate's verdict agrees with its figure) or passed to another call is not a bound on the run's speed.

What is a timing, judged by what gives the value:
- a name, attribute, call or string key whose words (split at `_`) include elapsed, duration(s), seconds/secs/sec,
  latency/latencies, took, speedup(s), throughput, rps/qps/fps, wall, time(s), delay(s), waited, percentile/quantile,
  a percentile (p50, p99, p999 ...) or rate(s) (not success_rate, error_rate ...: fractions); or whose last word is a
  unit of time: s, ms, us, ns (`recovery_s`, `img_per_s`, `p99_ms`, `rate.per_s()`, `elapsed.total_seconds()`);
- a field of a record of timings, but a count (`r["timings_ms"]["total"]`; not `...["batch_size"]`);
- a measured duration: a difference involving a clock reading, `time.monotonic()`/`perf_counter()`/`time()`/
  `loop.time()`/`*_ns()`, or a name assigned one (`time.perf_counter() - start`, `t1 - t0`);
- what carries one: arithmetic on it, max/min/sum/sorted/abs/round/... of it, an element of a list of them, a
  comprehension's element, `await`/`asyncio.run`/`gather` of it; a call to a function of the file that returns one;
- a name assigned (`=`, `+=`, `:=`, annotated, a `for`/comprehension/`with` target) from a timing;
- a count of things picked by a timing bound: `len([t for t in latencies if t > 1])`, or of a name assigned such a list.
Not a timing: `len(latencies)`, a call judged by its name alone (`helper(rate=3)`, `poisson_schedule(...)`).

Which comparisons fail:
- an ordering (<, <=, >, >=) with a timing on either side, unless the other side is the literal 0 (a sign check:
  "a figure was measured" holds on any machine), or both sides are figures of one record, neither a bound
  (`r["p50_ms"] <= r["p99_ms"]`, `t["total"] >= t["inference"]`: how the record is made; but not
  `r["p99_s"] < r["max_p99_s"]`, a bound by its name: max_/min_ first, or budget/limit/timeout/deadline/...);
- an ordering of a recorded clock reading against a shifted one (`t_done < t0 + 5`, or a name assigned such a sum):
  the same duration bound, written with timestamps;
- `==` against `pytest.approx(...)` with a measured (clock-derived) duration on the other side.

What passes: a bare clock reading compared with a deadline (`assert time.monotonic() < deadline`: a polling timeout,
"not yet past it", not a measured figure); two recorded clock readings compared (an ordering of events); equality
with a figure computed from fixed inputs (`latency_summary([...])["p50_ms"] == pytest.approx(20.0)`).

Blind spots: it goes by names and by clock calls it can see in the file. A timing under a name with none of those
words (`capacity = served / 5.0`, `o.t`), read from a clock it does not know, computed in another module
(`phase["failures"]` built from a p99 in benchmarks/), or hidden in a verdict (`assert result.passed` where passing
needs a speed) passes; so does a bound in a helper's `raise` outside an `if`, in unittest's assertLess, or a
comparison passed to another call (`assert check(elapsed < 1)`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent

TIMING_WORDS = frozenset(
    {
        "elapsed",
        "duration",
        "durations",
        "seconds",
        "secs",
        "sec",
        "latency",
        "latencies",
        "took",
        "speedup",
        "speedups",
        "throughput",
        "rps",
        "qps",
        "fps",
        "wall",
        "percentile",
        "quantile",
        "rate",
        "rates",
        "time",
        "times",
        "delay",
        "delays",
        "waited",
    }
)
FRACTIONS = frozenset({"success", "error", "failure", "hit", "miss", "sample", "drop", "loss", "escalation"})  # _rate
TIME_UNITS = frozenset({"s", "ms", "us", "ns"})
PERCENTILE = re.compile(r"p\d{2,3}")
CLOCKS = frozenset({"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns", "process_time"})
ORDERINGS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
COUNT_WORDS = frozenset({"size", "count", "n", "runs", "requests", "images", "batch", "batches", "calls", "samples"})
THRESHOLD_WORDS = frozenset({"budget", "limit", "timeout", "deadline", "threshold", "target", "goal"})
COUNTING = frozenset({"len", "sum"})  # a count of timings is no timing, unless they were picked by a bound
# Calls whose result is a timing when an argument is one; any other call's result is judged by its name alone.
AGGREGATES = frozenset(
    {
        *("max", "min", "sum", "abs", "round", "float", "int", "median", "mean", "fmean"),
        *("sorted", "reversed", "list", "tuple", "zip", "pairwise", "diff", "gather", "run", "wait_for", "result"),
    }
)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def timing_word(name: str) -> bool:
    words = [w for w in name.lower().split("_") if w]
    if len(words) > 1 and words[-1] in TIME_UNITS:  # `recovery_s`, `per_s`; not a plain `s`
        return True
    for i, w in enumerate(words):
        if w in ("rate", "rates") and i and words[i - 1] in FRACTIONS:
            continue  # success_rate: a fraction, not a speed
        if w in TIMING_WORDS or PERCENTILE.fullmatch(w):
            return True
    return False


def is_clock_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return name in CLOCKS and not node.args and not node.keywords


def call_name(node: ast.Call) -> str | None:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


@dataclass
class Names:
    """What the names of one scope (a function, or the module) were assigned."""

    stamps: set[str]  # a bare clock reading: t0 = time.monotonic()
    shifted: set[str]  # a clock reading plus or minus something: deadline = time.monotonic() + 30
    timings: set[str]  # a timing (a measured duration, or named like one)
    measured: set[str]  # of those, the ones computed from a clock
    filtered: set[str]  # a list picked by a timing bound: late = [t for t in latencies if t > 1]
    functions: set[str]  # the file's functions that return a timing

    def __init__(self) -> None:
        self.stamps, self.shifted, self.timings, self.measured = set(), set(), set(), set()
        self.filtered, self.functions = set(), set()


def _carriers(node: ast.AST) -> list[ast.AST]:
    """The sub-expressions whose value `node`'s value carries: both sides of arithmetic, a comprehension's element,
    an aggregate's arguments (max, sorted ...), an element of a list; not a record's field, not len(...)."""
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    if isinstance(node, ast.UnaryOp):
        return [node.operand]
    if isinstance(node, (ast.Await, ast.Starred)):
        return [node.value]
    if isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
        return [node.elt]
    if isinstance(node, ast.IfExp):
        return [node.body, node.orelse]
    if isinstance(node, (ast.Tuple, ast.List)):
        return list(node.elts)
    if isinstance(node, ast.Call) and call_name(node) in AGGREGATES:
        return list(node.args)
    if isinstance(node, ast.Subscript) and field(node) is None:
        return [node.value]  # an element of a list
    return []


def is_stamp(node: ast.AST, names: Names) -> bool:
    return is_clock_call(node) or (isinstance(node, ast.Name) and node.id in names.stamps)


def is_shifted(node: ast.AST, names: Names) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names.shifted
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        l_clock = is_stamp(node.left, names) or is_shifted(node.left, names)
        r_clock = is_stamp(node.right, names) or is_shifted(node.right, names)
        return l_clock != r_clock  # a clock reading moved by an amount (two readings apart are a duration)
    return False


def is_measured(node: ast.AST, names: Names) -> bool:
    """A duration computed from clock readings: a difference of two, or a name assigned one."""
    if isinstance(node, ast.Name):
        return node.id in names.measured
    clocked = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
    if clocked and any(is_stamp(s, names) or is_shifted(s, names) for s in (node.left, node.right)):
        return not is_shifted(node, names)
    return any(is_measured(c, names) for c in _carriers(node))


def is_timing(node: ast.AST, names: Names) -> bool:
    """By the name that gives the value: `x.latency`, `r["p99_ms"]`, `rate.per_s()`, `max(o.latency for o in out)`,
    `latencies[i]` are timings; `r["timings_ms"]["batch_size"]`, `len(latencies)`, `helper(rate=3)` are not."""
    if is_measured(node, names):
        return True
    if isinstance(node, ast.Name):
        return node.id in names.timings or timing_word(node.id)
    if isinstance(node, ast.Attribute):
        return timing_word(node.attr)
    key = field(node)
    if key is not None:  # r["p99_ms"]; and a field of a record of timings (r["timings_ms"]["total"]) but a count
        return timing_word(key) or (is_timing(node.value, names) and not count_word(key))
    if isinstance(node, ast.Call):
        name = call_name(node)
        if name is not None and (timing_word(name) or name in names.functions):
            return True
        if name in COUNTING and any(is_filtered(a, names) for a in node.args):
            return True  # how many were slower than a bound: the bound in disguise
    return any(is_timing(c, names) for c in _carriers(node))


def field(node: ast.AST) -> str | None:
    """The key of a record's field: `x["key"]`."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def _words(key: str) -> list[str]:
    words = [w for w in key.lower().split("_") if w]
    return words[:-1] if len(words) > 1 and words[-1] in TIME_UNITS else words


def count_word(key: str) -> bool:
    """A count among timings: `batch_size`, `runs`, `n`, `images`, ..."""
    words = _words(key)
    return bool(words) and words[-1] in COUNT_WORDS


def threshold_word(key: str) -> bool:
    """A bound rather than a figure: `max_p99_s`, `min_speedup`, `budget_s`, `timeout_s`, ..."""
    words = _words(key)
    return any(w in THRESHOLD_WORDS for w in words) or (len(words) > 1 and words[0] in ("min", "max"))


def same_record(a: ast.AST, b: ast.AST) -> bool:
    """Two figures of one record, neither a bound: `r["p50_ms"] <= r["p99_ms"]`, `t["total"] >= t["inference"]`. A
    statistic's ordering or a total's parts: how the record is made, whatever the machine's speed."""
    ka, kb = field(a), field(b)
    if ka is None or kb is None or threshold_word(ka) or threshold_word(kb):
        return False
    return ast.dump(a.value) == ast.dump(b.value)


def is_filtered(node: ast.AST, names: Names) -> bool:
    """A comprehension with a condition that bounds a timing, or a name assigned one."""
    if isinstance(node, ast.Name):
        return node.id in names.filtered
    if isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)):
        conditions = [c for g in node.generators for i in g.ifs for c in checked_comparisons(i)]
        return any(bound(c, names) for c in conditions)
    return False


def _targets(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _walk(scope: ast.AST, enter_functions: bool) -> list[ast.AST]:
    out, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        n = todo.pop()
        out.append(n)
        if enter_functions or not isinstance(n, FUNCTIONS):
            todo.extend(ast.iter_child_nodes(n))
    return out


def assigned_names(scope: ast.AST, functions: set[str] | frozenset[str] = frozenset()) -> Names:
    """Classify what each name in `scope` was assigned, to a fixed point (a name can be assigned from another).

    A function's names include its nested functions' (closures share them); the module's exclude every function's."""
    pairs: list[tuple[list[str], ast.AST]] = []
    for n in _walk(scope, enter_functions=not isinstance(scope, ast.Module)):
        if isinstance(n, ast.Assign):
            pairs += [(_targets(t), n.value) for t in n.targets]
        elif (isinstance(n, (ast.AugAssign, ast.AnnAssign)) and n.value is not None) or isinstance(n, ast.NamedExpr):
            pairs.append((_targets(n.target), n.value))
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
            pairs.append((_targets(n.target), n.iter))
        elif isinstance(n, (ast.With, ast.AsyncWith)):
            pairs += [(_targets(i.optional_vars), i.context_expr) for i in n.items if i.optional_vars is not None]
    names = Names()
    names.functions |= functions
    for _ in range(10):  # to a fixed point: a name may be assigned from another, and a later assignment changes it
        new = Names()
        new.functions = names.functions
        for targets, value in pairs:
            for kind, test in (
                ("stamps", is_stamp),
                ("shifted", is_shifted),
                ("measured", is_measured),
                ("timings", is_timing),
                ("filtered", is_filtered),
            ):
                if test(value, names):
                    getattr(new, kind).update(targets)
        if vars(new) == vars(names):
            break
        names = new
    return names


def checked_comparisons(test: ast.AST) -> list[ast.Compare]:
    """The comparisons in the position of the check itself (see the module's docstring)."""
    if isinstance(test, ast.Compare):
        return [test]
    if isinstance(test, ast.BoolOp):
        return [c for v in test.values for c in checked_comparisons(v)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return checked_comparisons(test.operand)
    if isinstance(test, ast.Call) and call_name(test) in ("all", "any") and len(test.args) == 1:
        arg = test.args[0]
        if isinstance(arg, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
            return checked_comparisons(arg.elt)
    return []


def is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == 0


def is_approx(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and call_name(node) == "approx"


def bound(compare: ast.Compare, names: Names) -> str | None:
    """Why this comparison bounds a timing, or None."""
    operands = [compare.left, *compare.comparators]
    for op, a, b in zip(compare.ops, operands, operands[1:], strict=False):
        if isinstance(op, ORDERINGS):
            if is_clock_call(a) or is_clock_call(b):
                continue  # now against a deadline: a polling timeout
            if same_record(a, b):
                continue
            if (is_timing(a, names) and not is_zero(b)) or (is_timing(b, names) and not is_zero(a)):
                return "a timing ordered against a number or another timing"
            if (is_stamp(a, names) and not is_clock_call(a) and is_shifted(b, names)) or (
                is_stamp(b, names) and not is_clock_call(b) and is_shifted(a, names)
            ):
                return "a recorded clock reading ordered against a shifted one (a duration bound)"
        elif isinstance(op, ast.Eq) and (
            (is_approx(b) and is_measured(a, names)) or (is_approx(a) and is_measured(b, names))
        ):
            return "a measured duration equal to pytest.approx(...)"
    return None


def raises(body: list[ast.stmt]) -> bool:
    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Raise):
                return True
            if isinstance(n, ast.Call) and call_name(n) == "fail":
                return True
    return False


def checks(scope: ast.AST) -> list[ast.expr]:
    """The conditions checked in `scope` (not entering nested functions: they are scopes of their own)."""
    out: list[ast.expr] = []
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        n = todo.pop()
        if isinstance(n, FUNCTIONS):
            continue
        if isinstance(n, ast.Assert) or (isinstance(n, ast.If) and raises(n.body)):
            out.append(n.test)
        todo.extend(ast.iter_child_nodes(n))
    return out


def returns(scope: ast.AST) -> list[ast.expr]:
    return [n.value for n in _walk(scope, enter_functions=False) if isinstance(n, ast.Return) and n.value is not None]


def timed_assertions(source: str, filename: str = "<source>") -> list[str]:
    """Each check in `source` that bounds a timing: 'file:line: why: the check'."""
    tree = ast.parse(source, filename)
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    module_names = assigned_names(tree)
    timed_functions: set[str] = set()

    def names_of(scope: ast.AST) -> Names:
        names = assigned_names(scope, timed_functions)
        for kind in ("stamps", "shifted", "timings", "measured"):  # a function sees the module's names too
            getattr(names, kind).update(getattr(module_names, kind))
        return names

    for _ in range(3):  # a function returning what another timed function returns
        for f in functions:
            if any(is_timing(r, names_of(f)) for r in returns(f)):
                timed_functions.add(f.name)
    found = []
    for scope in [tree, *functions]:
        names = names_of(scope)
        for test in checks(scope):
            for compare in checked_comparisons(test):
                why = bound(compare, names)
                if why:
                    found.append(f"{filename}:{compare.lineno}: {why}: {ast.unparse(compare)}")
    return sorted(set(found))


def test_no_test_bounds_a_duration_or_a_throughput() -> None:
    found = []
    for path in sorted(TESTS.glob("*.py")):
        found += timed_assertions(path.read_text(), str(path.relative_to(TESTS.parent)))
    assert not found, "timed assertions (assert an ordering, an awaited event or a count instead):\n" + "\n".join(found)


PLANTED = """
import time
import pytest

def test_planted(out, r, gate, first, last, latencies, refused):
    t0 = time.perf_counter()
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.01
    assert time.monotonic() - t0 < 2
    took = time.monotonic() - t0
    assert 0.5 < took < 5
    assert rate > 5
    assert r["latency_ms"]["p99"] < 1000
    assert r.json()["timings_ms"]["total"] < 1000
    assert last["speedup"] < first["speedup"]
    assert max(o.latency for o in out) < 15
    assert refused.elapsed.total_seconds() >= 0.9
    late = [t for t in latencies if t > 1.0]
    assert len(late) <= 3
    done_at = time.monotonic()
    assert done_at < t0 + 5
    assert elapsed == pytest.approx(1.0, abs=0.2)
    if elapsed > 8:
        pytest.fail("too slow")

def timed():
    t0 = time.perf_counter()
    return time.perf_counter() - t0

def test_a_timed_helper():
    assert timed() < 1
    times = sorted(timed() for _ in range(5))
    assert times[0] < 0.04
"""

FINE = """
import time
import pytest

def test_fine(out, r, s, gate, latencies, summary):
    deadline = time.monotonic() + 30
    assert time.monotonic() < deadline, "a polling timeout"
    t1, t2 = time.monotonic(), time.monotonic()
    assert t1 <= t2  # two events in order
    assert rate > 0 and r["p50_ms"] > 0  # measured at all
    assert s["p50_ms"] == pytest.approx(20.0)  # a figure of fixed inputs
    assert r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]  # one record's statistics
    assert len(latencies) == 40 and len(latencies) >= 4
    assert gate["passed"] == (gate["speedup"] >= 1.2)  # the verdict agrees with the figure
    assert r.json()["timings_ms"]["batch_size"] >= 3  # a count among timings
    assert summary["success_rate"] >= 0.99  # a fraction
    assert all(o.status == 200 for o in out)
"""


def test_the_checker_fails_on_a_planted_bound() -> None:
    assert timed_assertions("def test_x(elapsed):\n    assert elapsed < 0.01\n") == [
        "<source>:2: a timing ordered against a number or another timing: elapsed < 0.01"
    ]


def test_the_checker_finds_every_planted_bound_and_nothing_else() -> None:
    lines = [int(f.split(":")[1]) for f in timed_assertions(PLANTED)]
    planted = [i for i, line in enumerate(PLANTED.splitlines(), 1) if line.lstrip().startswith(("assert", "if "))]
    assert sorted(set(lines)) == planted, timed_assertions(PLANTED)
    assert timed_assertions(FINE) == []
