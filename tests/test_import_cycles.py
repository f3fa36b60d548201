"""No import cycle between app/'s modules, type-only imports included.

import-linter (make lint) checks cycles between packages and between the modules of one package, and leaves out
imports under `if TYPE_CHECKING:` (they do not run). A reader follows those too: this walks every module of app/
with the ast module (parsed, not imported; no Ray), takes every `import` and `from ... import` wherever it stands,
and fails on any strongly connected set of more than one module. An import names the module it loads: `from app.x
import y` is an edge to `app.x.y` when that is a module, else to `app.x`; the parent packages Python initialises on
the way are not edges (every module would then close a circle with its package's __init__).
"""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py")) if "pb" not in p.relative_to(root).parts}


def resolve(name: str, known: set[str]) -> str | None:
    """The module of `known` an import of `name` loads: itself, or its nearest enclosing module."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    found: set[str] = set()
    here = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for n in names:
            target = resolve(n, known)
            if target and target != module:
                found.add(target)
    return found


def graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    known = set(mods)
    return {m: imports(m, p.read_text(), p.name == "__init__.py", known) for m, p in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_apps_modules() -> None:
    found = cycles(graph(APP))
    assert found == [], "import cycles (type-only imports count):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_walk_finds_a_planted_cycle_through_a_type_only_import(tmp_path: Path) -> None:
    root = tmp_path / "app"
    (root / "a").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a" / "__init__.py").write_text("from app.a.one import One\n")
    (root / "a" / "one.py").write_text("from app.a import two\n")
    (root / "a" / "two.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .one import One\n"
    )
    (root / "b.py").write_text("import app.a.one\n")
    edges = graph(root)
    assert edges["app.a"] == {"app.a.one"} and edges["app.a.one"] == {"app.a.two"}
    assert edges["app.a.two"] == {"app.a.one"} and edges["app.b"] == {"app.a.one"}
    assert cycles(edges) == [["app.a.one", "app.a.two"]]
    (root / "a" / "two.py").write_text("X = 1\n")
    assert cycles(graph(root)) == []
