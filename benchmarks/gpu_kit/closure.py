"""Which distributions a set of requirements reaches, and which of those requirements are not met.

One walk serves both ends of the kit. On the building machine it picks what the kit carries: from the project's
requirements through every distribution the kit will carry, stopping at those the node already has (their own
requirements are the node image's business, met there already). On the node it checks what Python can import with
the kit's site first on the path: the same walk, stopping at distributions outside the kit's site. Stdlib and
`packaging` only: it runs on the node before anything else of the project is known to import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


@dataclass(frozen=True)
class Found:
    """What a lookup knows of one distribution."""

    name: str
    version: str | None  # None: the node has it, at a version not known where the walk runs
    requires: tuple[str, ...] = ()  # its Requires-Dist lines
    walk_on: bool = True  # follow its own requirements (the kit carries it)


@dataclass
class Walk:
    found: dict[str, Found] = field(default_factory=dict)  # canonical name -> what the lookup gave
    demands: dict[str, list[tuple[Requirement, str]]] = field(default_factory=dict)  # name -> (requirement, by whom)
    problems: list[str] = field(default_factory=list)  # one line per requirement not met


def target_environment(python_version: str) -> dict[str, str]:
    """The marker environment of CPython `python_version` on Linux x86_64: the node's, for a walk made elsewhere."""
    major, minor = python_version.split(".")[:2]
    full = python_version if python_version.count(".") >= 2 else f"{major}.{minor}.0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "python_version": f"{major}.{minor}",
        "sys_platform": "linux",
    }


def applies(marker: Marker | None, env: dict[str, str] | None, extras: Iterable[str]) -> bool:
    """Whether a requirement with `marker` applies for a distribution wanted with `extras` ("" for none)."""
    if marker is None:
        return True
    return any(marker.evaluate({**(env or {}), "extra": extra}) for extra in extras)


def walk(roots: Iterable[str], lookup: Callable[[str], Found | None], env: dict[str, str] | None = None) -> Walk:
    """Every distribution `roots` reach through `lookup`, breadth first; env None: the running interpreter's."""
    out = Walk()
    extras: dict[str, set[str]] = {}  # name -> extras asked for so far ("" always)
    taken: set[tuple[str, str]] = set()  # (name, requirement line) already queued
    queue = [(req, "the project") for req in map(Requirement, roots) if applies(req.marker, env, [""])]
    while queue:
        req, by = queue.pop(0)
        name = canonicalize_name(req.name)
        found = out.found.get(name) or lookup(name)
        out.demands.setdefault(name, []).append((req, by))
        if found is None:
            out.problems.append(f"{by} requires {req}: not installed")
            continue
        out.found[name] = found
        if found.version is not None and not req.specifier.contains(found.version, prereleases=True):
            out.problems.append(f"{by} requires {req}: found {found.name} {found.version}")
        wanted = extras.setdefault(name, {""})
        wanted.update(canonicalize_name(e) for e in req.extras)
        if not found.walk_on:
            continue
        for line in found.requires:
            sub = Requirement(line)
            if (name, line) not in taken and applies(sub.marker, env, sorted(wanted)):
                taken.add((name, line))
                queue.append((sub, f"{found.name} {found.version}"))
    return out


def said(demands: list[tuple[Requirement, str]]) -> list[str]:
    """Demands as lines: "REQ (from WHO)"."""
    return [f"{req} (from {by})" for req, by in demands]
