"""The kit's steps on the node, each called by run.sh with the node's Python, from the assembled project:

    python -m benchmarks.gpu_kit.node libdirs --exclude SITE   # LD_LIBRARY_PATH for the CUDA 13 / cuDNN 9 libraries
    python -m benchmarks.gpu_kit.node scripts SITE              # the site's console scripts run with this Python
    python -m benchmarks.gpu_kit.node nvidia SITE               # the kit's nvidia/ and the node's one package
    python -m benchmarks.gpu_kit.node check ROOT --phase P     # a phase's requirements met by what Python imports now
    python -m benchmarks.gpu_kit.node env                       # the environment the checks then run in

Only the standard library, and `packaging` for `check`: this runs before anything else of the project is known to
import there. The CUDA libraries come from the node Python's own `nvidia` pip packages (torch's), found where they
are rather than at paths written down here: the first GPU contact found them by name
(../shared/gpu-2026-12-04/libs.sh); here every nvidia/**/lib folder of the Python's site folders is asked for them.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import site
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

# What ONNX Runtime's CUDA provider and cuDNN load (app/runtime/ort_engine.py PROVIDER_LIBRARIES) and what those
# load in turn (cuDNN 9's engines: cuFFT, nvJitLink), at the majors of the node's torch 2.11+cu130.
# nvImageCodec's JPEG decoders (decode_in: gpu) load libnvjpeg: on the first GPU node it was the system CUDA's, in
# /usr/local/cuda-13.0/targets/x86_64-linux/lib (../shared/gpu-2026-12-04/README.md), searched after the sites.
CUDA_LIBRARIES = (
    "libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libcudnn.so.9", "libcufft.so.12",
    "libnvJitLink.so.13", "libnvjpeg.so.13",
)  # fmt: skip
SYSTEM_CUDA = "/usr/local/cuda*/targets/x86_64-linux/lib"
EXIT_UNMET = 3  # run.sh's exit status when a requirement is not met


def python_sites(exclude: Iterable[Path] = ()) -> list[Path]:
    """This Python's site folders and the other folders on its path, those in `exclude` left out."""
    skip = {p.resolve() for p in exclude}
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    candidates = [*site.getsitepackages(), *([user] if user else []), *sys.path]
    dirs = (Path(p).resolve() for p in candidates if p and Path(p).is_dir())
    return [p for p in dict.fromkeys(dirs) if p not in skip]


def library_dirs(sites: Iterable[Path], libraries: Iterable[str] = CUDA_LIBRARIES) -> tuple[list[Path], list[str]]:
    """The nvidia/**/lib folders of `sites`, then the system CUDA's (SYSTEM_CUDA), that hold `libraries` (the first
    found for each), and those not found."""
    wanted, found = list(libraries), {}
    system = sorted(Path(p) for p in glob.glob(SYSTEM_CUDA))
    for lib_dirs in [*(sorted(p for p in (root / "nvidia").glob("**/lib") if p.is_dir()) for root in sites), system]:
        for lib_dir in lib_dirs:
            for lib in wanted:
                if lib not in found and (lib_dir / lib).exists():
                    found[lib] = lib_dir
    return list(dict.fromkeys(found[lib] for lib in wanted if lib in found)), [x for x in wanted if x not in found]


# The kit's nvidia/__init__.py where the node's `nvidia` is a regular package: one `nvidia` with both folders on its
# __path__ (pkgutil.extend_path), so nvidia.nvimgcodec (the kit's) and the node's nvidia.* both import.
EXTEND_PATH = (
    "# the GPU kit's (benchmarks/gpu_kit/node.py join_nvidia): the node's nvidia packages stay importable\n"
    "from pkgutil import extend_path\n\n__path__ = extend_path(__path__, __name__)\n"
)


def join_nvidia(kit_site: Path, sites: list[Path]) -> str:
    """Make the kit's nvidia/ (nvImageCodec) and the node's nvidia/ (its CUDA libraries' packages) one package,
    whichever way the node's is laid out: where it is a namespace package (no __init__.py, as the first GPU node's
    pip packages), the kit's joins it as a namespace portion (no __init__.py either; build removed nvImageCodec's);
    where it is a regular package, a regular package found later on sys.path would hide a namespace portion found
    first, so the kit's gets an __init__.py that extends its __path__ to the node's (EXTEND_PATH). What it did."""
    kit = kit_site / "nvidia"
    if not kit.is_dir():
        return "no nvidia package in the kit's site"
    regular = [s / "nvidia" / "__init__.py" for s in sites if (s / "nvidia" / "__init__.py").is_file()]
    regular = [r for r in regular if r.parent.resolve() != kit.resolve()]
    if regular:
        (kit / "__init__.py").write_text(EXTEND_PATH)
        return f"the node's nvidia is a regular package ({regular[0]}): the kit's extends its __path__ to it"
    (kit / "__init__.py").unlink(missing_ok=True)
    return "the node's nvidia is a namespace package (or absent): the kit's joins it as a portion"


def fix_scripts(bin_dir: Path, python: str) -> list[str]:
    """Point the console scripts pip wrote (for the building machine's Python) at `python`; add app-haproxy, the
    project's own (pyproject.toml [project.scripts]), which the kit does not install."""
    changed = []
    for script in sorted(p for p in bin_dir.glob("*") if p.is_file()) if bin_dir.is_dir() else []:
        lines = script.read_bytes().split(b"\n")
        if lines[0].startswith(b"#!/bin/sh") and len(lines) > 2 and lines[1].startswith(b"'''exec'"):
            body = lines[3:]  # pip's header for a long interpreter path, 3 lines: sh re-executing Python
        elif lines[0].startswith(b"#!") and b"python" in lines[0]:
            body = lines[1:]
        else:
            continue
        script.write_bytes(b"\n".join([f"#!{python}".encode(), *body]))
        changed.append(script.name)
    bin_dir.mkdir(parents=True, exist_ok=True)
    haproxy = bin_dir / "app-haproxy"
    haproxy.write_text(f"#!{python}\nimport sys\n\nfrom app.front import main\n\nsys.exit(main())\n")
    haproxy.chmod(0o755)
    return changed


def unmet(root: Path, phase: str = "serve") -> tuple[list[str], dict[str, int]]:
    """The requirements of `phase` (kit.json's: the engines' alone, or all of them for serving; and on through the
    distributions the kit carries) not met by what Python imports now; how many distributions came from the kit's
    site and from the node's."""
    from benchmarks.gpu_kit.closure import Found, walk

    kit_site = (root / "site").resolve()

    def lookup(name: str) -> Found | None:
        try:
            d = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return None
        where = Path(str(d.locate_file(""))).resolve()
        return Found(d.metadata["Name"], d.version, tuple(d.requires or ()), where == kit_site)

    declared = json.loads((root / "kit.json").read_text())
    done = walk(declared["engine_requirements"] if phase == "engines" else declared["requirements"], lookup)
    kit = sum(f.walk_on for f in done.found.values())
    return done.problems, {"kit": kit, "node": len(done.found) - kit}


def describe() -> None:
    """Python, ONNX Runtime (version, where from, its providers, those whose libraries load), Ray, numpy."""
    print(f"python       {sys.version.split()[0]} ({sys.executable})")
    try:
        import onnxruntime as ort

        where = Path(ort.__file__).parent
        print(f"onnxruntime  {ort.__version__} ({where}); built with {ort.get_available_providers()}")
        from app.runtime.ort_engine import usable_providers

        print(f"             providers whose libraries load here: {usable_providers()}")
    except Exception as e:  # reported, not fatal: the checks say what they cannot run
        print(f"onnxruntime  cannot be used: {type(e).__name__}: {e}")
    for name, module in (("ray", "ray"), ("numpy", "numpy")):
        try:
            origin = getattr(importlib.util.find_spec(module), "origin", None)
            print(f"{name:<12} {metadata.version(name)} ({Path(origin).parent if origin else '?'})")
        except (metadata.PackageNotFoundError, ImportError) as e:
            print(f"{name:<12} missing: {e}")
    print(f"LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kit.node", description=__doc__)
    sub = p.add_subparsers(dest="step", required=True)
    libdirs = sub.add_parser("libdirs", help="print the library folders, ':'-joined; the missing ones on stderr")
    libdirs.add_argument("--exclude", type=Path, action="append", default=[])
    sub.add_parser("scripts").add_argument("site", type=Path)
    sub.add_parser("nvidia").add_argument("site", type=Path)
    check = sub.add_parser("check")
    check.add_argument("root", type=Path)
    check.add_argument("--phase", choices=("engines", "serve"), default="serve")
    sub.add_parser("env")
    a = p.parse_args(argv)
    if a.step == "libdirs":
        dirs, missing = library_dirs(python_sites(a.exclude))
        for lib in missing:
            print(f"not found under this Python's nvidia packages: {lib} (the CUDA targets will say what they lack)",
                  file=sys.stderr)  # fmt: skip
        print(":".join(map(str, dirs)))
    elif a.step == "scripts":
        fix_scripts(a.site / "bin", sys.executable)
    elif a.step == "nvidia":
        print(f"nvidia: {join_nvidia(a.site, python_sites([a.site]))}")
    elif a.step == "check":
        try:
            problems, counts = unmet(a.root, a.phase)
        except ImportError as e:  # packaging: neither the kit nor the node has it
            print(f"unmet: cannot check the requirements: {e}")
            return EXIT_UNMET
        for line in problems:
            print(f"unmet: {line}")
        if problems:
            return EXIT_UNMET
        print(f"every requirement met: {counts['kit']} distributions from the kit's site, {counts['node']} the node's")
    else:
        describe()
    return 0


if __name__ == "__main__":
    sys.exit(main())
