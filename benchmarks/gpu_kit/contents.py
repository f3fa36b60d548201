"""What besides the Python site goes into the kit: the project, the model files, and wrk with its libraries.

The project is the working tree's files that git knows of or does not ignore (`git ls-files --cached --others
--exclude-standard`): the tracked files with their uncommitted changes, and the new files not committed yet (the
kit's own node-side code among them while it is being written), never .git, ignored build outputs, or
benchmarks/results/. The models are the files the GPU targets and configs/prod.yaml's variants read, with their
quality reports; the CPU INT8 build, which only a CPU dry run serves (in the TensorRT build's place), only with
--cpu-int8 (the tests' kits); a missing one stops the build. wrk is the load generator: its binary and the shared
libraries ldd resolves for it, but glibc's own (the node's glibc is newer than any here). Its libraries are the building
machine's (its OpenSSL and libgcc_s among them), so they are put where only wrk looks: bin/wrk sets LD_LIBRARY_PATH
for the real binary (libexec/wrk) alone. On the node's LD_LIBRARY_PATH they would shadow the node's own for every
process, Python's ssl module and the C++ extensions included.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu_kit.wheels import KitError

REPO = Path(__file__).resolve().parents[2]
NOT_CARRIED = ("benchmarks/results/",)  # result sets: the node writes its own
MODEL = "efficientnet_lite0"
# configs/prod.yaml's variants: fp32, int8-trt (TensorRT), fp16 (its fallback where TensorRT does not load); the CPU
# INT8 build, which only the CPU dry runs serve, in the TensorRT artifact's place (benchmarks/gpu_serve/shape.py
# repoint): with --cpu-int8 alone
FP32, INT8_TRT, FP16, INT8 = (f"{MODEL}-{kind}.onnx" for kind in ("fp32", "int8-trt", "fp16", "int8"))
MODEL_FILES = (FP32, INT8_TRT, FP16, f"{MODEL}-labels.txt")
DRY_RUN_MODEL_FILES = (INT8,)
# glibc's libraries: the node brings its own (2.39, newer than the building machine's); ld.so resolves them
GLIBC = re.compile(r"^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libutil|libanl|libmvec)\b")
WRK_WRAPPER = """#!/bin/sh
# wrk with the libraries it was built with (the kit's lib/), for it alone: benchmarks/gpu_kit/contents.py says why
kit=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$kit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$kit/libexec/wrk" "$@"
"""


@dataclass(frozen=True)
class Project:
    files: list[str]  # relative to the repository root
    untracked: list[str]  # of those, the files git does not track yet
    commit: str


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def project_files(repo: Path = REPO) -> Project:
    listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    untracked = set(git(repo, "ls-files", "-z", "--others", "--exclude-standard").split("\0"))
    present = (f for f in listed if f and ((repo / f).is_file() or (repo / f).is_symlink()))  # deleted: not there
    keep = sorted({f for f in present if not f.startswith(NOT_CARRIED)})
    return Project(keep, [f for f in keep if f in untracked], git(repo, "rev-parse", "HEAD").strip())


def model_files(models: Path, cpu_int8: bool = False) -> list[Path]:
    """The model files the kit carries (with `cpu_int8`, the dry runs' CPU INT8 build too) and each one's report
    beside it; a missing one: a KitError naming it."""
    names = (*MODEL_FILES, *(DRY_RUN_MODEL_FILES if cpu_int8 else ()))
    missing = [name for name in names if not (models / name).is_file()]
    if missing:
        raise KitError(f"{', '.join(str(models / m) for m in missing)} missing: run `make models`")
    reports = sorted(r for name in names for r in models.glob(f"{name.removesuffix('.onnx')}.report.*"))
    return [models / name for name in names] + reports


def work_tree(path: Path) -> Path | None:
    """The root of the git work tree holding `path` (it need not exist yet), or None."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    done = subprocess.run(["git", "-C", str(probe if probe.is_dir() else probe.parent), "rev-parse", "--show-toplevel"],
                          capture_output=True, text=True)  # fmt: skip
    return Path(done.stdout.strip()) if done.returncode == 0 else None


def ignored(repo: Path, folder: Path) -> bool:
    """Whether git ignores what is in `folder` in `repo` (so that a call carries it only when named). Asked of a file
    in it: a pattern for a folder (`/.gpukit/`) matches a path git cannot see is one until it exists."""
    probe = folder / "manifest.json"
    return subprocess.run(["git", "-C", str(repo), "check-ignore", "-q", str(probe)]).returncode == 0


def travelling_bytes(repo: Path) -> dict[str, int]:
    """What travels with every call from the checkout `repo`, as the device tool sends it: the files git tracks or
    does not ignore (those present), and shared/ where the checkout has one; in bytes, with benchmarks/results/
    (the result sets, most of it in this project) on its own line."""
    listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    sizes = {f: (repo / f).lstat().st_size for f in listed if f and os.path.lexists(repo / f)}
    shared = repo / "shared"
    if shared.is_dir():
        for p in shared.rglob("*"):
            rel = str(p.relative_to(repo))
            if rel not in sizes and (p.is_file() or p.is_symlink()):
                sizes[rel] = p.lstat().st_size
    return {"bytes": sum(sizes.values()), "files": len(sizes),
            "results_bytes": sum(v for f, v in sizes.items() if f.startswith(NOT_CARRIED))}  # fmt: skip


def shared_libraries(binary: Path) -> list[Path]:
    """The libraries ldd resolves for `binary`, glibc's left out; a library ldd cannot find stops the build."""
    out, libs = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout, []
    for line in out.splitlines():
        name = line.strip().split(" ", 1)[0]
        if GLIBC.match(Path(name).name):
            continue
        found = re.search(r"=> (\S+)", line)
        if not found or found[1] == "not":
            raise KitError(f"ldd cannot find {name} for {binary}")
        libs.append(Path(found[1]))
    return libs


def stage_wrk(wrk: Path | None, into: Path) -> dict[str, object]:
    """bin/wrk (the wrapper), libexec/wrk and lib/ under `into`; what went in."""
    found = wrk or (Path(w) if (w := shutil.which("wrk")) else None)
    if found is None or not found.is_file():
        raise KitError("wrk not found: apt-get install wrk (make system-deps), or pass --wrk PATH")
    for d in ("bin", "libexec", "lib"):
        (into / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(found.resolve(), into / "libexec" / "wrk")
    (into / "bin" / "wrk").write_text(WRK_WRAPPER)
    (into / "bin" / "wrk").chmod(0o755)
    libs = shared_libraries(found)
    for lib in libs:
        shutil.copy2(lib.resolve(), into / "lib" / lib.name)  # under the name the binary asks for
    return {"binary": str(found), "libraries": [lib.name for lib in libs]}
