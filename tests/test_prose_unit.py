"""Prose that does not rot: app/'s docstrings and comments name modules (`app.imaging.probe`), classes and functions,
never files (`app/imaging/probe.py`), and every module named in them exists, so a move or a rename fails here instead
of leaving a stale pointer (the third floor moved and renamed dozens of modules). The one file path left is a folder
of generated files. Module docstrings over LONG_DOCSTRING lines may only become fewer."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"
PATH = re.compile(r"\bapp/[\w/]+(?:\.py)?")
ON_THE_REQUEST_PATH = ("http", "pipeline", "serve")
LEFT_ELSEWHERE = 1  # app/protocol/v2/pb/, the generated messages' folder, named as the folder it is
LONG_DOCSTRING = 15  # lines: a module's docstring says what and why; the rest is docs/'s
LONG_LEFT = 28  # module docstrings longer than that when this test was written: only ever fewer


def prose(source: str) -> list[str]:
    """The docstrings and comments of a module's source."""
    texts = [c.string for c in tokenize.generate_tokens(io.StringIO(source).readline) if c.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                texts.append(doc)
    return texts


def paths_in(path: Path) -> list[str]:
    return [m for text in prose(path.read_text()) for m in PATH.findall(text)]


def modules() -> list[Path]:
    return [p for p in sorted(APP.rglob("*.py")) if "pb" not in p.relative_to(APP).parts]


def test_the_modules_a_request_goes_through_name_no_file_in_their_prose() -> None:
    found = {
        str(p.relative_to(APP.parent)): paths_in(p)
        for p in modules()
        if p.relative_to(APP).parts[0] in ON_THE_REQUEST_PATH and paths_in(p)
    }
    assert found == {}


def test_file_paths_in_prose_elsewhere_only_become_fewer() -> None:
    count = sum(len(paths_in(p)) for p in modules() if p.relative_to(APP).parts[0] not in ON_THE_REQUEST_PATH)
    assert count <= LEFT_ELSEWHERE


def test_long_module_docstrings_only_become_fewer() -> None:
    long = [
        p
        for p in modules()
        if (ast.get_docstring(ast.parse(p.read_text()), clean=False) or "").count("\n") >= LONG_DOCSTRING
    ]
    assert len(long) <= LONG_LEFT, [str(p.relative_to(APP.parent)) for p in long]


NAME = re.compile(r"\bapp(?:\.\w+)+")


def defined(module: Path) -> set[str]:
    """The names a module defines or imports at its top level."""
    names: set[str] = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def resolves(dotted: str, root: Path) -> bool:
    """`app.x.y` names a module or package under `root`, or a top-level name of one (`app.errors.STATUS`)."""
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        base = root.joinpath(*parts[:i])
        file = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if file.is_file():
            rest = parts[i:]
            if len(rest) == 2:  # a class's member: `app.imaging.transform.Transform.to_dict`
                return rest[1] in members(file, rest[0])
            return not rest or (len(rest) == 1 and rest[0] in defined(file))
    return False


def members(module: Path, cls: str) -> set[str]:
    """The names a top-level class of the module defines in its body."""
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {
                n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            } | {
                t.id
                for n in node.body
                if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Name)
            }
    return set()


def test_every_module_named_in_prose_exists() -> None:
    """A module's name in prose is checked, so that a move or a rename fails here instead of leaving it stale."""
    stale = {
        f"{p.relative_to(APP.parent)}: {name}"
        for p in modules()
        for text in prose(p.read_text())
        for name in NAME.findall(text)
        if not resolves(name, APP.parent)
    }
    assert sorted(stale) == []


def test_the_walk_reads_docstrings_and_comments_not_code() -> None:
    source = '"""Module (app/x.py)."""\n# see app/y.py\nX = "app/z.py"\n\n\ndef f():\n    """(app/w/)"""\n'
    assert sorted(m for t in prose(source) for m in PATH.findall(t)) == ["app/w/", "app/x.py", "app/y.py"]
    root = APP.parent
    assert resolves("app.errors", root) and resolves("app.errors.STATUS", root) and resolves("app.http", root)
    assert resolves("app.imaging.transform.Transform.to_dict", root)
    assert not resolves("app.nowhere", root) and not resolves("app.errors.NOTHING", root)
    assert not resolves("app.imaging.transform.Transform.nothing", root)
