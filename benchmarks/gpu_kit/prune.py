"""Files of the carried site that no step loads, left out only where that is proven here, at every build.

Two kinds are left out by their names alone, each with its reason in the manifest: extension modules built for
another CPython than the node's (name.cpython-3XY[t]-...so: an interpreter imports only its own tag's; nvImageCodec's
wheel ships seven of them, 5 MB each), and UNUSED (py-spy's binary, the dashboard's on-demand profiler).

The candidates are named (CANDIDATES), never guessed. onnxruntime/capi/libonnxruntime.so.<version> is ONNX
Runtime's C API library, for C and C++ programs: the Python binding (onnxruntime_pybind11_state.*.so) has the
runtime linked in, NEEDs no libonnxruntime.so, and names it nowhere; the provider libraries do not NEED it either
(they reach the runtime through libonnxruntime_providers_shared.so). A candidate goes only when, in the built site,
(1) no ELF file NEEDs its SONAME or its file name (readelf -d), and (2) no other file but the .dist-info metadata
contains its name up to ".so" (a dlopen or ctypes.CDLL by name, of any version, would have to spell it). Otherwise
it stays, with the reason.

ray/jars/ (ray_dist.jar, 34 MB, a zip already: xz cannot shrink it) holds the classes of Ray's Java workers. A JVM
loads them, never Python (it is on no sys.path, so not even zipimport). Ray starts a JVM only for a Java worker, and
start_raylet (ray/_private/services.py) gives the raylet a Java worker command only when `java` is on PATH and the
jars folder exists; without the folder it sets `ray_java_installed = False` and starts none. The folder goes when
services.py still decides so (that line is in it), and stays otherwise.
"""

from __future__ import annotations

import mmap
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

CANDIDATES = ("onnxruntime/capi/libonnxruntime.so.*",)  # globs under the site
# Files no step runs, each with its reason: py-spy is the dashboard's on-demand profiler (Ray runs it only when a user
# asks the dashboard for a stack or a flame graph, and says so when it is missing); 7.8 MB of Rust.
UNUSED = {"bin/py-spy": "the dashboard's on-demand profiler: no step of the kit asks the dashboard to profile"}
# An extension module for one CPython: name.cpython-<major><minor>[t]-<platform>.so (PEP 3149; t: free-threaded)
ABI_TAGGED = re.compile(r"\.cpython-(\d)(\d+)(t?)-[a-z0-9_]+-linux-gnu\.so$")
JARS, JARS_GUARD = "ray/jars", ("ray/_private/services.py", "ray_java_installed = False")

Dynamic = Callable[[Path], tuple[str | None, tuple[str, ...]]]  # a file -> (SONAME, NEEDED)


def is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def readelf_dynamic(path: Path) -> tuple[str | None, tuple[str, ...]]:
    """SONAME and NEEDED entries of an ELF file's dynamic section (readelf -d)."""
    text = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    soname = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", text)
    return (soname[1] if soname else None), tuple(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", text))


def contains(path: Path, needle: bytes) -> bool:
    if path.stat().st_size == 0:
        return False
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return m.find(needle) >= 0


def meta(path: Path) -> bool:
    """A file of a .dist-info folder: metadata (RECORD lists every file), nothing Python or the loader reads."""
    return any(part.endswith(".dist-info") for part in path.parts)


def why_kept(lib: Path, site: Path, dynamic: Dynamic = readelf_dynamic) -> str | None:
    """None when nothing in `site` can load `lib`, else the first evidence that something may."""
    soname, _ = dynamic(lib)
    names = {lib.name} | ({soname} if soname else set())
    stem = lib.name.split(".so")[0] + ".so"  # "libonnxruntime.so": how any version of it would be named
    for f in sorted(p for p in site.rglob("*") if p.is_file() and not p.is_symlink() and p != lib and not meta(p)):
        if is_elf(f) and (needs := names & set(dynamic(f)[1])):
            return f"{f.relative_to(site)} NEEDs {', '.join(sorted(needs))}"
        if contains(f, stem.encode()):
            return f"{f.relative_to(site)} names {stem}"
    return None


def prune_jars(site: Path) -> list[dict[str, Any]]:
    """Ray's Java worker jars out, when Ray still starts no Java worker without them (the module docstring)."""
    jars = site / JARS
    if not jars.is_dir():
        return []
    entry: dict[str, Any] = {"file": f"{JARS}/", "bytes": sum(f.stat().st_size for f in jars.rglob("*") if f.is_file())}
    guard = site / JARS_GUARD[0]
    if guard.is_file() and JARS_GUARD[1] in guard.read_text():
        shutil.rmtree(jars)
        entry["removed"] = f"only a JVM loads them; without them {JARS_GUARD[0]} starts no Java worker"
    else:
        entry["kept"] = f"{JARS_GUARD[0]} no longer says {JARS_GUARD[1]!r}: Ray may need them"
    return [entry]


def prune_other_pythons(site: Path, python_version: str) -> list[dict[str, Any]]:
    """Extension modules built for another CPython than the node's: its interpreter imports only those of its own
    tag (importlib.machinery.EXTENSION_SUFFIXES: cpython-312-x86_64-linux-gnu, abi3, plain .so), never another
    version's nor the free-threaded build's. nvImageCodec's wheel ships its module for CPython 3.9 to 3.14t, 5 MB
    each."""
    major, minor = python_version.split(".")[:2]
    out = []
    for lib in sorted(site.rglob("*.so")):
        tag = ABI_TAGGED.search(lib.name)
        if tag and (tag[1], tag[2], tag[3]) != (major, minor, "") and not lib.is_symlink():
            why = f"an extension module for CPython {tag[1]}.{tag[2]}{tag[3]}, not the node's {major}.{minor}"
            out.append({"file": str(lib.relative_to(site)), "bytes": lib.stat().st_size, "removed": why})
            lib.unlink()
    return out


def prune_unused(site: Path, unused: dict[str, str] = UNUSED) -> list[dict[str, Any]]:
    out = []
    for rel, why in unused.items():
        if (site / rel).is_file():
            out.append({"file": rel, "bytes": (site / rel).stat().st_size, "removed": why})
            (site / rel).unlink()
    return out


def prune(
    site: Path, candidates: tuple[str, ...] = CANDIDATES, dynamic: Dynamic | None = None, python_version: str = "3.12"
) -> list[dict[str, Any]]:
    """Remove each proven-unused candidate from `site`; what was removed and what was kept, with the reason."""
    out = [*prune_jars(site), *prune_other_pythons(site, python_version), *prune_unused(site)]
    if dynamic is None and shutil.which("readelf") is None:
        return [*out, *({"file": c, "kept": "readelf not found here: nothing proven"} for c in candidates)]
    for pattern in candidates:
        for lib in sorted(site.glob(pattern)):
            reason = why_kept(lib, site, dynamic or readelf_dynamic)
            entry: dict[str, Any] = {"file": str(lib.relative_to(site)), "bytes": lib.stat().st_size}
            if reason is None:
                lib.unlink()
                entry["removed"] = "no ELF file of the site NEEDs it and no file names it"
            else:
                entry["kept"] = reason
            out.append(entry)
    return out
