"""The import rules of the serving code: deployments -> http -> pipeline -> the pure cores, one way.

The contracts are import-linter's (pyproject.toml [tool.importlinter], run by make lint; transitive imports count);
these tests run it on the tree and on copies with one forbidden import added. Serve's private API is checked here
(import-linter sees an external package only as its root).
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

APP = Path(__file__).resolve().parent.parent / "app"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter (`lint-imports`, as make lint runs it) on the `app` package under `root`, with the contracts of
    pyproject.toml there."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold() -> None:
    done = lint_imports(APP.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "edge"),
    [
        ("pipeline/admission.py", "import ray", "app.pipeline.admission -> ray"),
        ("pipeline/service.py", "from app.http import replies", "app.pipeline.service -> app.http.replies"),
        ("http/v1.py", "import onnxruntime", "app.http.v1 -> onnxruntime"),
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


def test_serve_private_api_is_touched_in_one_module_only() -> None:
    users = sorted(
        str(p.relative_to(APP))
        for p in APP.rglob("*.py")
        if "serve._private" in p.read_text()
        or "_get_serve_request_context" in p.read_text()
        or "_asyncio_router" in p.read_text()
        or "_deployment_config" in p.read_text()
        or "internal_kv" in p.read_text()
    )
    assert users == ["serve/serve_internals.py"]


def test_no_class_in_app_is_longer_than_250_lines_and_the_router_stays_thin() -> None:
    sizes = {}
    for path in APP.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                sizes[f"{path.relative_to(APP)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert {k: n for k, n in sizes.items() if n > 250} == {}
    assert sizes["serve/deployments.py:Router"] < 200
    assert len((APP / "serve" / "deployments.py").read_text().splitlines()) < 450
