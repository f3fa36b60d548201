"""This repo's own import-linter contract type, named in pyproject.toml's [tool.importlinter] contract_types and run by
`lint-imports` (make lint): an external package's private API, imported by the named modules only.

import-linter's forbidden contracts take an external package only whole (`ray`, never `ray.serve._private`): grimp
records `from ray.serve._private.common import X` as an import of `ray`, with its line. This contract reads those
lines. Tooling, apart from the serving code: nothing in `app` imports it, and it needs import-linter (a test extra).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any, cast

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


def is_private(dotted: str, private_modules: list[str]) -> bool:
    """Whether a dotted name reaches a private part of its package: a component named with a leading underscore (not
    a dunder), or a module of `private_modules` (or something in it)."""
    parts = dotted.split(".")
    if any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts):
        return True
    return any(dotted == m or dotted.startswith(m + ".") for m in private_modules)


def private_names(statement: ast.stmt, package: str, private_modules: list[str]) -> list[str]:
    """What of `package`'s private API an import statement names: `import a._b` -> a._b; `from a._b import c` ->
    a._b.c; `from a.b import _c, d` -> a.b._c; `from a._b import *` -> a._b."""
    if isinstance(statement, ast.Import):
        names = [alias.name for alias in statement.names]
    elif isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
        module = statement.module
        names = [module if alias.name == "*" else f"{module}.{alias.name}" for alias in statement.names]
    else:
        return []
    return [n for n in names if n.split(".")[0] == package and is_private(n, private_modules)]


def source_file(module: str) -> Path | None:
    """The file of a module of a package found on sys.path (only the root package is looked up: nothing is run)."""
    root, *rest = module.split(".")
    spec = importlib.util.find_spec(root)
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations)), *rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def import_statement(importer: str, line_number: int, line_contents: str) -> ast.stmt | None:
    """The import statement grimp found at `line_number` of `importer`: its line, or, for one that spans lines
    (`from x import (`), the lines from there until it parses."""
    try:
        return ast.parse(line_contents.strip()).body[0]
    except SyntaxError:
        pass
    path = source_file(importer)
    if path is None:
        return None
    lines = path.read_text(encoding="utf-8").splitlines()[line_number - 1 :]
    for end in range(1, len(lines) + 1):
        try:
            return ast.parse("\n".join(lines[:end]).strip()).body[0]
        except SyntaxError:
            continue
    return None


class PrivateApiContract(Contract):
    """The private API of an external package (its `_`-named modules and names, and `private_modules`) is imported by
    `allowed_modules` only, of the `source_modules` (packages, with all they contain).

    Options:
        - source_modules:  the packages checked.
        - external_package: the package whose private API is held to `allowed_modules` (a root package, e.g. ray).
        - private_modules: modules of it that are private without a `_` in their name (optional).
        - allowed_modules: the modules that may import it (optional).
    """

    type_name = "private_api"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    external_package = fields.StringField()
    private_modules = fields.ListField(subfield=fields.StringField(), required=False, default=[])
    allowed_modules = fields.ListField(subfield=fields.ModuleField(), required=False, default=[])

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        options = cast(Any, self)  # the fields, parsed: import-linter sets them on the instance
        package: str = options.external_package
        private_modules: list[str] = list(options.private_modules)
        allowed = {m.name for m in options.allowed_modules}
        sources: set[str] = set()
        for module in options.source_modules:
            if module.name not in graph.modules:
                raise ValueError(f"Module '{module.name}' does not exist.")
            sources |= {module.name} | graph.find_descendants(module.name)
        found: list[dict[str, Any]] = []
        importers = graph.find_modules_that_directly_import(package) if package in graph.modules else set()
        for importer in sorted((importers & sources) - allowed):
            output.verbose_print(verbose, f"Reading {importer}'s imports of {package}...")
            for detail in graph.get_import_details(importer=importer, imported=package):
                line = detail["line_number"]
                statement = import_statement(importer, line, detail["line_contents"])
                if statement is None:  # reported: the contract does not pass what it has not read
                    names = [f"{package} (unread: {detail['line_contents']})"]
                else:
                    names = private_names(statement, package, private_modules)
                found += [{"importer": importer, "imported": name, "line_number": line} for name in names]
        return ContractCheck(kept=not found, metadata={"private_imports": found, "allowed": sorted(allowed)})

    def render_broken_contract(self, check: ContractCheck) -> None:
        allowed = ", ".join(check.metadata["allowed"]) or "no module"
        output.print_error(f"Only {allowed} may import the private API of {self.external_package}:")
        output.new_line()
        for found in check.metadata["private_imports"]:
            output.print_error(f"-   {found['importer']} -> {found['imported']} (l.{found['line_number']})", bold=False)
        output.new_line()
