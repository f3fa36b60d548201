"""Building a kit: the site, the project, the models and wrk staged in one folder, archived into parts, described by
manifest.json, with run.sh beside them (the layout: benchmarks/gpu_kit/__init__.py)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.gpu_kit import contents, pack, prune, wheels
from benchmarks.gpu_kit.closure import said
from benchmarks.gpu_kit.wheels import CACHE, KitError

RUN_SH = Path(__file__).with_name("run.sh")
GROUPS = ["kit.json", "project", "models", "bin", "libexec", "lib", "site"]  # the archive's top level, in order
MAX_PART_MIB = 60  # a call to the node carries 64 MiB with the checkout; the issue allows parts up to 60


NODE_EXTRAS = wheels.NODE_EXTRAS  # (in Options, `wheels` is a field's name)


@dataclass
class Options:
    out: Path
    python_version: str
    part_bytes: int
    node_has: dict[str, str | None]
    models: Path
    wheels: Path | None = None  # a folder of wheels instead of the package index
    cache: Path = CACHE
    refresh: bool = False  # ask the package index again
    preset: int = pack.XZ_PRESET
    wrk: Path | None = None
    extras: tuple[str, ...] = NODE_EXTRAS  # the project's optional extras carried too
    repo: Path = contents.REPO
    timings: dict[str, float] = field(default_factory=dict)


def log(text: str) -> None:
    print(f"{datetime.now():%H:%M:%S} gpu_kit: {text}", flush=True)


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def choose(o: Options, reqs: list[str]) -> tuple[list[wheels.Dist], wheels.Choice]:
    """The distributions the kit carries, with their wheels here (downloaded into the cache when needed)."""
    t0 = time.monotonic()
    if o.wheels:
        offered = wheels.offered_by_folder(o.wheels, o.python_version)
    else:
        offered = wheels.offered_by_index(reqs, o.python_version, o.cache / "resolved", o.refresh)
    choice = wheels.carried(reqs, offered, o.node_has, o.python_version)
    if choice.walk.problems:
        hint = "add its wheel to --wheels, or name it in --node-has with its version" if o.wheels else "see --node-has"
        raise KitError(f"{'; '.join(choice.walk.problems)} ({hint})")
    dists = [offered[name] for name in choice.carried]
    o.timings["resolve_s"] = time.monotonic() - t0
    if not o.wheels:
        t0 = time.monotonic()
        dists = wheels.fetch(dists, o.python_version, o.cache)
        o.timings["download_s"] = time.monotonic() - t0
    return dists, choice


def stage(o: Options, staging: Path, reqs: list[str], dists: list[wheels.Dist], build_id: str) -> dict[str, Any]:
    """Everything the archive holds, under `staging`; what went in."""
    t0 = time.monotonic()
    wheels.install(dists, staging / "site", o.python_version)
    wheels.unshadow_nvidia(staging / "site")
    pruned = prune.prune(staging / "site")
    o.timings["unpack_s"] = time.monotonic() - t0
    project = contents.project_files(o.repo)
    for rel in project.files:
        dest = staging / "project" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(o.repo / rel, dest, follow_symlinks=False)
    models = contents.model_files(o.models)
    (staging / "models").mkdir()
    for f in models:
        shutil.copy2(f, staging / "models" / f.name)
    wrk = contents.stage_wrk(o.wrk, staging)
    files = sum(1 for p in staging.rglob("*") if p.is_file() or p.is_symlink()) + 1  # kit.json too
    kit = {"build_id": build_id, "python_version": o.python_version, "requirements": reqs, "files": files}
    (staging / "kit.json").write_text(json.dumps(kit, indent=1) + "\n")
    packages = [
        {
            "name": d.name,
            "version": d.version,
            "wheel": d.wheel,
            "wheel_bytes": d.path.stat().st_size if d.path else None,
            "installed_bytes": wheels.installed_bytes(staging / "site", d.name),
        }
        for d in dists
    ]
    return {
        "site": {"packages": packages, "pruned": pruned},
        "project": {"commit": project.commit, "files": len(project.files), "untracked": project.untracked},
        "models": [{"name": f.name, "bytes": f.stat().st_size} for f in models],
        "wrk": wrk,
        "files": files,
    }


def clear(out: Path) -> None:
    """Remove what an earlier build left in `out` (its parts, manifest and run.sh), nothing else."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("part-*-of-*.bin"), *out.glob(".part-*.tmp"), out / "manifest.json", out / "run.sh"]:
        old.unlink(missing_ok=True)


def build(o: Options) -> dict[str, Any]:
    """The whole kit in o.out; the manifest, also written there."""
    t_start = time.monotonic()
    reqs = wheels.project_requirements(o.repo / "pyproject.toml", o.extras)
    contents.model_files(o.models)  # a missing model stops the build before anything is downloaded
    dists, choice = choose(o, reqs)
    log(f"carrying {len(dists)} distributions ({len(choice.shadowing)} of them shadowing the node's); "
        f"{len(choice.left_to_node)} more are the node's own")  # fmt: skip
    build_id = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="app-gpu-kit-staging-") as tmp:
        inside = stage(o, Path(tmp), reqs, dists, build_id)
        clear(o.out)
        t0 = time.monotonic()
        log(f"compressing (xz preset {pack.preset_name(o.preset)}) into parts of at most {mib(o.part_bytes)}")
        archive = pack.archive(Path(tmp), GROUPS, o.out, o.part_bytes, o.preset)
        o.timings["compress_s"] = time.monotonic() - t0
    shutil.copy2(RUN_SH, o.out / "run.sh")
    (o.out / "run.sh").chmod(0o755)
    o.timings["total_s"] = time.monotonic() - t_start
    manifest = {
        "kit": "app-gpu-kit",
        "build_id": build_id,
        "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "built_on": socket.gethostname(),
        "python_version": o.python_version,
        "platforms": list(wheels.PLATFORMS),
        "parts": archive.pop("parts"),
        "archive": archive,
        "contents": inside,
        "requirements": reqs,
        "left_out": wheels.LEFT_OUT,
        "left_to_node": {
            name: {"version": o.node_has[name], "required_as": said(choice.walk.demands[name])}
            for name in choice.left_to_node
        },
        "shadowing": {name: said(choice.walk.demands[name]) for name in choice.shadowing},
        "wheel_bytes": sum(p["wheel_bytes"] or 0 for p in inside["site"]["packages"]),
        "timings_s": {k: round(v, 1) for k, v in o.timings.items()},
    }
    tmp_manifest = o.out / "manifest.json.tmp"
    tmp_manifest.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp_manifest, o.out / "manifest.json")
    return manifest
