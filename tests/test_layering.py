"""The import rules of the serving code: deployments -> http -> pipeline -> the pure cores, one way.

The contracts are import-linter's (pyproject.toml [tool.importlinter], run by make lint; transitive imports count),
one of them this repo's own type (app/ops/import_contracts.py: Ray's private API imported by app.serve.serve_internals
only); these tests run it on the tree and on copies with one forbidden import added. What import-linter does not see,
Ray's private API used by attribute and in tests/ and benchmarks/, is checked here by walking the sources.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.ops.import_contracts import is_private, private_names

APP = Path(__file__).resolve().parent.parent / "app"
ROOT = APP.parent
# The one module that may use Ray's private API, anywhere (app/, tests/, benchmarks/).
SERVE_INTERNALS = "app/serve/serve_internals.py"
RAY_PRIVATE_MODULES = ["ray.experimental.internal_kv"]  # as pyproject.toml's private_api contract
# Ray's private members the walk cannot tie to Ray by itself (reached through a fixture's client, a handle passed in):
# those this repo has used, or would first reach for.
RAY_PRIVATE_ATTRIBUTES = frozenset(
    {
        "_init",
        "_connect",
        "_get_global_client",
        "_private",
        "_controller",
        "_router",
        "_asyncio_router",
        "_request_router",
        "_deployment_config",
        "_get_serve_request_context",
        "_generate_config_file_internal",
    }
)


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter (`lint-imports`, as make lint runs it) on the `app` package under `root`, with the contracts of
    pyproject.toml there."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold() -> None:
    done = lint_imports(APP.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "9 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "edge"),
    [
        ("pipeline/admission.py", "import ray", "app.pipeline.admission -> ray"),
        ("pipeline/service.py", "from app.http import replies", "app.pipeline.service -> app.http.replies"),
        ("http/v1.py", "import onnxruntime", "app.http.v1 -> onnxruntime"),
        ("http/v1.py", "import ray", "app.http.v1 -> ray"),
        ("imaging/probe.py", "import torch", "app.imaging.probe -> torch"),  # torch is benchmarks/' only
        # The lowest layer: config holds settings only; the model contract knows no offline tool; http reaches the
        # Router's metrics through its own port (app/http/ports.py); no package imports the command-line tools.
        ("config/args.py", "from app.runtime import plan", "app.config.args -> app.runtime.plan"),
        ("config/front.py", "import app.front.haproxy_config", "app.config.front -> app.front.haproxy_config"),
        (
            "served_model/declaration.py",
            "from app.toolchain import build",
            "app.served_model.declaration -> app.toolchain.build",
        ),
        ("pipeline/capture.py", "from app.toolchain import calibration", "app.pipeline.capture -> app.toolchain"),
        ("http/replies.py", "from app.serve import metrics", "app.http.replies -> app.serve.metrics"),
        ("runtime/select.py", "import app.ops.capacity", "app.runtime.select -> app.ops.capacity"),
        # The Router loads no engine (ONNX Runtime would come with app.runtime's __init__).
        ("http/v2_dataplane.py", "from app.runtime import measure", "app.http.v2_dataplane -> app.runtime"),
        # Cycles the layers cannot see (siblings of one layer, modules of one package): acyclic_siblings.
        ("pipeline/admission.py", "import app.rollout.evidence", ".rollout -> .pipeline"),
        ("http/v1.py", "import app.http.assembly", ".v1 -> .assembly"),
        # Ray's private API outside app.serve.serve_internals: the private_api contract, naming what is imported.
        ("pipeline/admission.py", "from ray._private import worker", "app.pipeline.admission -> ray._private.worker"),
        ("serve/classifier.py", "import ray.serve._private.api", "app.serve.classifier -> ray.serve._private.api"),
        ("serve/classifier.py", "from ray.experimental import internal_kv", "-> ray.experimental.internal_kv"),
        ("serve/handles.py", "from ray.serve.context import (\n    _connect,\n)", "-> ray.serve.context._connect"),
    ],
)
def test_a_broken_contract_fails_the_lint(tmp_path: Path, module: str, line: str, edge: str) -> None:
    """A copy of app/ with one forbidden import added: lint-imports exits non-zero, a contract broken, the import
    named."""
    shutil.copytree(APP, tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(APP.parent / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "app" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0, done.stdout
    assert re.search(r"Contracts: \d kept, [1-4] broken", done.stdout) and edge in done.stdout, done.stdout


def test_the_private_api_contract_passes_serve_internals_and_the_public_api() -> None:
    """What the private_api contract reports of a statement, and what it lets through."""

    def names(line: str) -> list[str]:
        return private_names(ast.parse(line).body[0], "ray", RAY_PRIVATE_MODULES)

    assert names("from ray.serve._private.common import A, B") == [
        "ray.serve._private.common.A",
        "ray.serve._private.common.B",
    ]
    assert names("from ray.serve._private.constants import *") == ["ray.serve._private.constants"]
    assert names("import ray.experimental.internal_kv as kv, ray.serve") == ["ray.experimental.internal_kv"]
    for public in (
        "import ray",
        "from ray import serve",
        "from ray.serve.handle import DeploymentHandle",
        "import numpy._x",
    ):
        assert names(public) == []
    assert not is_private("ray.serve.__init__", []) and is_private("ray.util._x", [])


def _root_name(node: ast.AST) -> str | None:
    """The name an expression starts from: `a` of `a.b().c[0].d`."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript | ast.Await | ast.Starred):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound_names(target: ast.AST | None) -> set[str]:
    """The names an assignment target binds: `a`, `a, (b, *c)`; not `self.a` nor `d[k]` (those bind no name)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    if isinstance(target, ast.Tuple | ast.List):
        return set().union(*(_bound_names(e) for e in target.elts))
    return set()


def _private_attribute(name: str) -> bool:
    return is_private(name, []) or name in {m.rsplit(".", 1)[1] for m in RAY_PRIVATE_MODULES}


def ray_private_uses(source: str) -> list[str]:
    """Each use of Ray's private API in a module's source, as "line N: what": an import of a private module or name (as
    the private_api contract reads imports); an attribute with a leading underscore (or `internal_kv`) of anything
    reached from Ray (a name imported from ray, or assigned from such a name's expression, anywhere in the module);
    any of RAY_PRIVATE_ATTRIBUTES, whatever it is read from; and getattr/hasattr/setattr/delattr of either."""
    tree = ast.parse(source)
    uses: list[str] = []
    from_ray: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            uses += [f"line {node.lineno}: import {name}" for name in private_names(node, "ray", RAY_PRIVATE_MODULES)]
        if isinstance(node, ast.Import):
            from_ray |= {a.asname or "ray" for a in node.names if a.name.split(".")[0] == "ray"}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "ray":
            from_ray |= {a.asname or a.name for a in node.names}
    bound = -1
    while bound != len(from_ray):  # names assigned from Ray's, until no more are
        bound = len(from_ray)
        for node in ast.walk(tree):
            pairs: list[tuple[ast.AST | None, ast.AST | None]] = []
            if isinstance(node, ast.Assign):
                pairs = [(t, node.value) for t in node.targets]
            elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
                pairs = [(node.target, node.value)]
            elif isinstance(node, ast.withitem):
                pairs = [(node.optional_vars, node.context_expr)]
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                pairs = [(node.target, node.iter)]
            for target, value in pairs:
                if value is not None and _root_name(value) in from_ray:
                    from_ray |= _bound_names(target)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private_attribute(node.attr):
            if node.attr in RAY_PRIVATE_ATTRIBUTES or _root_name(node.value) in from_ray:
                uses.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
            obj, attr = node.args[0], node.args[1]
            if node.func.id in {"getattr", "hasattr", "setattr", "delattr"} and isinstance(attr, ast.Constant):
                name = attr.value
                traced = isinstance(name, str) and (name in RAY_PRIVATE_ATTRIBUTES or _root_name(obj) in from_ray)
                if traced and _private_attribute(name):
                    uses.append(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(set(uses), key=lambda u: (int(u.split(":")[0].split()[1]), u))


def ray_private_uses_under(root: Path) -> dict[str, list[str]]:
    """ray_private_uses of every module of app/, tests/ and benchmarks/ under `root`, but serve_internals."""
    found = {}
    for top in ("app", "tests", "benchmarks"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel != SERVE_INTERNALS and (uses := ray_private_uses(path.read_text(encoding="utf-8"))):
                found[rel] = uses
    return found


def test_ray_private_api_is_used_in_serve_internals_only() -> None:
    """app/ (attribute access too, which import-linter does not see), tests/ and benchmarks/: Ray's private API only
    through app.serve.serve_internals; and the walk finds that module's own uses (it is not blind to them)."""
    assert ray_private_uses_under(ROOT) == {}
    mine = "\n".join(ray_private_uses((ROOT / SERVE_INTERNALS).read_text(encoding="utf-8")))
    for use in (
        "ray.serve._private.common",
        "_deployment_config",
        "_get_serve_request_context",
        "internal_kv",
        "_init",
    ):
        assert use in mine, mine


@pytest.mark.parametrize(
    ("source", "use"),
    [
        ("from ray.serve._private import api as serve_api", "import ray.serve._private.api"),
        ("import ray._private.worker", "import ray._private.worker"),
        ("from ray.serve.context import _connect", "import ray.serve.context._connect"),
        ("from ray.experimental import internal_kv", "import ray.experimental.internal_kv"),
        ("import ray\nray.experimental.internal_kv._internal_kv_put(b'k', b'v')", "ray.experimental.internal_kv"),
        ("from ray import serve\nserve.context._get_global_client()", "serve.context._get_global_client"),
        ("import ray.serve as s\ns.get_replica_context()._deployment_config", "s.get_replica_context()._deployment"),
        # Names assigned from Ray's, traced: an underscore attribute of what they hold is Ray's.
        ("from ray import serve\nh = serve.get_deployment_handle('R')\nh._handle_id", "h._handle_id"),
        ("from ray import serve\nfor d in serve.status().applications.values():\n    d._x", "d._x"),
        ("from ray import serve\nif (c := serve.get_replica_context()):\n    c._rank", "c._rank"),
        ("def f(handle):\n    handle._init()", "handle._init"),  # not traced to Ray: a name of RAY_PRIVATE_ATTRIBUTES
        ("def f(client):\n    client._controller.check_alive", "client._controller"),
        ("from ray import serve\ngetattr(serve.get_replica_context(), '_rank', None)", "getattr(serve.get_replica_c"),
        ("def f(handle):\n    getattr(handle, '_router', None)", "getattr(handle, '_router', None)"),
    ],
)
def test_the_walk_finds_a_planted_private_ray_use(source: str, use: str) -> None:
    uses = ray_private_uses(source)
    assert any(use in u for u in uses), uses


@pytest.mark.parametrize(
    "source",
    [
        "from ray import serve\nserve.start(proxy_location='HeadOnly')\nserve.status().applications",
        "from app.serve.serve_internals import serve_client\nserve_client().deploy_apps(schema)",
        "from app.imaging import convert\nconvert._to_uint8(image)",  # this repo's own privates: not Ray's
        "from urllib.parse import urlsplit\nurlsplit(url)._replace(path='/')",
        "import ray\nray.init(_metrics_export_port=8080)",  # ray.init's documented (unstable) options: its public API
        "'ray.serve._private' in text  # a string, a comment: not a use",
    ],
)
def test_the_walk_lets_the_public_api_and_the_repos_own_privates_through(source: str) -> None:
    assert ray_private_uses(source) == []


def test_the_walk_finds_a_private_ray_use_planted_in_a_copy_of_the_tests(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    planted = (ROOT / "tests" / "conftest.py").read_text(encoding="utf-8") + "\nfrom ray.serve._private import api\n"
    (tmp_path / "tests" / "conftest.py").write_text(planted, encoding="utf-8")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bench.py").write_text("from ray import serve\nserve.context._connect()\n")
    found = ray_private_uses_under(tmp_path)
    assert set(found) == {"tests/conftest.py", "benchmarks/bench.py"}, found
    assert found["tests/conftest.py"] == [f"line {len(planted.splitlines())}: import ray.serve._private.api"]


def test_no_class_in_app_is_longer_than_250_lines_and_the_router_stays_thin() -> None:
    sizes = {}
    for path in APP.rglob("*.py"):
        if path.read_text().startswith("# Generated by python -m app.ops.proto_gen"):  # protoc's, not ours
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                sizes[f"{path.relative_to(APP)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert {k: n for k, n in sizes.items() if n > 250} == {}
    assert sizes["serve/deployments.py:Router"] < 200
    assert len((APP / "serve" / "deployments.py").read_text().splitlines()) < 450
