"""The import rules of the serving code: deployments -> http -> pipeline -> the pure cores, one way.

Read from the source (AST) and checked in a fresh interpreter, so a transitive import counts too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "app"


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def modules(folder: str) -> list[Path]:
    return sorted((APP / folder).glob("*.py"))


def banned(path: Path, prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in imports(path) if m.split(".")[0] in prefixes or m.startswith(prefixes))


@pytest.mark.parametrize("path", modules("pipeline"), ids=lambda p: p.name)
def test_the_pipeline_imports_neither_ray_nor_starlette_nor_the_layers_above(path: Path) -> None:
    assert banned(path, ("ray", "starlette", "app.http", "app.deployments", "app.handles")) == []


@pytest.mark.parametrize("path", modules("http"), ids=lambda p: p.name)
def test_http_does_not_import_the_deployments(path: Path) -> None:
    assert banned(path, ("app.deployments", "app.main")) == []


def test_request_reading_is_pure_so_the_peers_can_share_it() -> None:
    assert banned(APP / "http" / "reading.py", ("ray", "starlette")) == []


def test_no_transitive_import_of_ray_or_starlette_from_the_pipeline() -> None:
    code = (
        "import sys, app.pipeline.service, app.http.reading\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'starlette'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=APP.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_serve_private_api_is_touched_in_one_module_only() -> None:
    users = sorted(
        str(p.relative_to(APP))
        for p in APP.rglob("*.py")
        if "serve._private" in p.read_text()
        or "_get_serve_request_context" in p.read_text()
        or "_asyncio_router" in p.read_text()
        or "_deployment_config" in p.read_text()
    )
    assert users == ["serve_internals.py"]


def test_no_class_in_app_is_longer_than_250_lines_and_the_router_stays_thin() -> None:
    sizes = {}
    for path in APP.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                sizes[f"{path.relative_to(APP)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert {k: n for k, n in sizes.items() if n > 250} == {}
    assert sizes["deployments.py:Router"] < 200
    assert len((APP / "deployments.py").read_text().splitlines()) < 450
