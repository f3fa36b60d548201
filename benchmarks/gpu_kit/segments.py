"""Which staged file goes into which segment of the kit, and in which compressed stream.

A segment is what one phase of the run on the node needs, unpacked on its own as soon as its parts are stored:

    engines   kit.json, the project, the models, and the distributions gpu_check and gpu_decode import (ONNX Runtime,
              pydantic, nvImageCodec, and what they require that the node lacks): the engines can be measured
              while the rest of the kit is still on its way
    serving   the rest: Ray with Serve and everything it requires, and wrk with its libraries

The engines segment comes first in the byte sequence the parts are cut from, so the call that stores its last part
can already run gpu_check: evidence, even if the machine is lost before the last part arrives.

Which distributions the engine steps need is declared (ENGINE_REQUIREMENTS) and walked through what the kit carries;
tests/test_gpu_kit_unit.py checks the declaration against what `import benchmarks.gpu_check, benchmarks.gpu_decode`
really imports. A distribution's files are those its RECORD lists (the wheel's own inventory; `../../bin/x` is the
site's bin/x); a file no engine distribution claims goes with the serving segment.

Each segment is two xz streams: its ELF files through xz's x86 branch filter first (it turns relative call
addresses into absolute ones, which repeat: 8% smaller for Ray's binaries, no gain on the CUDA provider library's
already-compressed GPU code), and its other files through LZMA2 alone (the filter would only disturb text and
weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks.gpu_kit.closure import Found, target_environment, walk
from benchmarks.gpu_kit.wheels import Dist

ENGINES, SERVING = "engines", "serving"
SEGMENTS = (ENGINES, SERVING)
# The project's requirements (by name) the engine steps import: onnxruntime (gpu_check, gpu_decode), pydantic
# (app.config, through app.runtime), nvImageCodec (gpu_decode's GPU path); numpy, onnx and OpenCV are the node's own.
ENGINE_REQUIREMENTS = (
    "onnxruntime-gpu",
    "pydantic",
    "nvidia-nvimgcodec-cu13",
    "numpy",
    "onnx",
    "opencv-python-headless",
)
# Top-level entries of the staging folder and their segment; site/ is split by distribution.
TOP = {"kit.json": ENGINES, "project": ENGINES, "models": ENGINES, "bin": SERVING, "libexec": SERVING, "lib": SERVING}
X86, PLAIN = "x86", "plain"


@dataclass(frozen=True)
class Stream:
    """One xz stream of the archive: a segment's files of one kind, in tar order."""

    segment: str
    kind: str  # X86 (ELF files, with the x86 branch filter) or PLAIN
    files: tuple[str, ...]  # relative to the staging folder


def engine_requirements(reqs: list[str]) -> list[str]:
    """The lines of `reqs` that ENGINE_REQUIREMENTS names: what the engines phase checks on the node."""
    wanted = {canonicalize_name(n) for n in ENGINE_REQUIREMENTS}
    return [r for r in reqs if canonicalize_name(Requirement(r).name) in wanted]


def engine_distributions(reqs: list[str], carried: dict[str, Dist], python_version: str) -> list[str]:
    """The carried distributions (canonical names) the engine steps need: ENGINE_REQUIREMENTS' lines of `reqs`,
    walked through `carried` (what the node has ends the walk)."""
    roots = engine_requirements(reqs)

    def lookup(name: str) -> Found | None:
        d = carried.get(name)
        return Found(d.name, d.version, d.requires) if d else Found(name, None, (), walk_on=False)

    done = walk(roots, lookup, target_environment(python_version))
    return [n for n in done.found if n in carried]


def record_files(site: Path, info: Path) -> set[str]:
    """The files a distribution's RECORD lists, relative to `site` (`../../bin/x`, a console script: bin/x)."""
    out = {f"{info.relative_to(site)}"}
    record = info / "RECORD"
    for line in record.read_text().splitlines() if record.is_file() else []:
        path = line.rsplit(",", 2)[0]
        if path.startswith("../../bin/"):
            path = "bin/" + path.removeprefix("../../bin/")
        if path and not path.startswith("../"):
            out.add(path)
    return out


def dist_infos(site: Path) -> dict[str, Path]:
    """Canonical name -> its .dist-info folder in `site`."""
    out = {}
    for info in site.glob("*.dist-info"):
        name = info.name.removesuffix(".dist-info").rsplit("-", 1)[0]
        out[canonicalize_name(name)] = info
    return out


def is_elf(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def files_under(root: Path, rel: str) -> list[str]:
    """The files and symbolic links at or under root/rel, relative to root, sorted."""
    path = root / rel
    if path.is_symlink() or path.is_file():
        return [rel]
    return sorted(str(p.relative_to(root)) for p in path.rglob("*") if p.is_symlink() or p.is_file())


def split(staging: Path, engine_dists: list[str]) -> dict[str, list[str]]:
    """Segment -> its files (relative to `staging`): the top-level entries by TOP, site/ by distribution."""
    site = staging / "site"
    infos = dist_infos(site) if site.is_dir() else {}
    engine_files: set[str] = set()
    for name in engine_dists:
        if name in infos:
            engine_files |= {f"site/{f}" for f in record_files(site, infos[name])}
    out: dict[str, list[str]] = {s: [] for s in SEGMENTS}
    for top in sorted(p.name for p in staging.iterdir()):
        for f in files_under(staging, top):
            segment = TOP.get(top) if top != "site" else (ENGINES if f in engine_files else SERVING)
            if segment is None:
                raise ValueError(f"{top}: no segment is declared for it (segments.TOP)")
            out[segment].append(f)
    return out


def streams(staging: Path, segments: dict[str, list[str]]) -> list[Stream]:
    """Each segment's ELF files, then its other files, as streams in the archive's order (engines first); an empty
    stream is left out."""
    out = []
    for segment in SEGMENTS:
        files = segments.get(segment, [])
        elf = [f for f in files if is_elf(staging / f)]
        taken = set(elf)
        rest = [f for f in files if f not in taken]
        out += [Stream(segment, kind, tuple(fs)) for kind, fs in ((X86, elf), (PLAIN, rest)) if fs]
    return out
