"""The grammar of the paths the service answers, and their matching: pure, no Starlette.

A path is literal (`/v1/classify`) or a template: `{name}` is one path segment (non-empty, no `/`), `[...]` an
optional part, as in the V2 model paths `/v2/models/{model}[/versions/{version}]/infer`. A parameter of an absent
optional part reads "". The route table (`app.http.routes`) declares every path in this grammar; `PathTable`
is the lookup the Ingress dispatches on and V2's path matching (`app.protocol.v2.names`) reads, and `expand`
gives the OpenAPI paths of a template.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
_PART = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}|\[|\]|[^{}\[\]]+")


@dataclass(frozen=True)
class _Param:
    name: str


@dataclass(frozen=True)
class _Optional:
    items: list[_Item]


_Item = str | _Param | _Optional  # a template, parsed: literal text, a parameter, an optional part


def _parse(template: str) -> list[_Item]:
    if not template.startswith("/"):
        raise ValueError(f"path {template!r}: must start with /")
    stack: list[list[_Item]] = [[]]
    pos = 0
    while pos < len(template):
        m = _PART.match(template, pos)
        if m is None:
            raise ValueError(f"path {template!r}: bad {template[pos]!r} at {pos}")
        pos = m.end()
        if m.group(1):
            stack[-1].append(_Param(m.group(1)))
        elif m.group() == "[":
            stack.append([])
        elif m.group() == "]":
            if len(stack) == 1:
                raise ValueError(f"path {template!r}: ] without [")
            inner = stack.pop()
            stack[-1].append(_Optional(inner))
        else:
            stack[-1].append(m.group())
    if len(stack) != 1:
        raise ValueError(f"path {template!r}: [ without ]")
    return stack[0]


def _regex(items: list[_Item]) -> str:
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(re.escape(item))
        elif isinstance(item, _Param):
            out.append(f"(?P<{item.name}>[^/]+)")
        else:
            out.append(f"(?:{_regex(item.items)})?")
    return "".join(out)


def _params(items: list[_Item]) -> list[str]:
    out: list[str] = []
    for item in items:
        if isinstance(item, _Param):
            out.append(item.name)
        elif isinstance(item, _Optional):
            out.extend(_params(item.items))
    return out


def _expand(items: list[_Item]) -> list[str]:
    """Every path the items spell, each optional part absent then present."""
    paths = [""]
    for item in items:
        if isinstance(item, str):
            tails = [item]
        elif isinstance(item, _Param):
            tails = ["{" + item.name + "}"]
        else:
            tails = ["", *_expand(item.items)]
        paths = [p + t for p in paths for t in tails]
    return paths


@dataclass(frozen=True)
class PathTemplate:
    """One path in the grammar above; `match` gives its parameters (absent optional ones "") or None."""

    template: str
    params: tuple[str, ...] = field(init=False)
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        items = _parse(self.template)
        params = _params(items)
        if len(set(params)) != len(params):
            raise ValueError(f"path {self.template!r}: a parameter named twice")
        object.__setattr__(self, "params", tuple(params))
        object.__setattr__(self, "_pattern", re.compile(_regex(items)))

    @property
    def literal(self) -> bool:
        return not self.params and "[" not in self.template

    def match(self, path: str) -> dict[str, str] | None:
        m = self._pattern.fullmatch(path)
        return None if m is None else {k: v or "" for k, v in m.groupdict().items()}

    def expand(self) -> list[str]:
        """The paths it stands for in OpenAPI's terms (`{name}`, no optional parts): one per optional part's
        absence or presence, shortest first."""
        return _expand(_parse(self.template))


class PathTable(Generic[T]):
    """(method, path or template, value) entries, looked up by path: a literal path exactly, else the templates in
    the order given, the first that matches. The entries that share that path are the resource; their methods are
    what it allows (a caller answers 405 for another, 404 when no path matches)."""

    def __init__(self, entries: Iterable[tuple[str, str, T]]) -> None:
        self.exact: dict[str, dict[str, T]] = {}
        templates: dict[str, tuple[PathTemplate, dict[str, T]]] = {}
        for method, path, value in entries:
            template = PathTemplate(path)
            methods = (
                self.exact.setdefault(path, {}) if template.literal else templates.setdefault(path, (template, {}))[1]
            )
            if method in methods:
                raise ValueError(f"{method} {path} is declared twice")
            methods[method] = value
        self.templates = list(templates.values())

    def resource(self, path: str) -> tuple[dict[str, T], dict[str, str]] | None:
        """The entries of the path that `path` matches, by method, and its parameters; None: no path matches."""
        if path in self.exact:
            return self.exact[path], {}
        for template, methods in self.templates:
            params = template.match(path)
            if params is not None:
                return methods, params
        return None
