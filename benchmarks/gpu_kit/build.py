"""Building a kit: the site, the project, the models and wrk staged in one folder, split into segments and streams,
compressed, cut into parts sized to the calls that will carry them, each part in a call folder with run.sh and
manifest.json, and the plan of those calls (the layout: benchmarks/gpu_kit/__init__.py)."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from benchmarks.gpu_kit import contents, pack, plan, prune, segments, wheels
from benchmarks.gpu_kit.closure import said
from benchmarks.gpu_kit.wheels import CACHE, KitError

RUN_SH = Path(__file__).with_name("run.sh")
MAX_PART_MIB = 60  # a call to the node carries 64 MiB with the checkout
CALL = "call-{index}"  # a call folder under the kit's folder


NODE_EXTRAS = wheels.NODE_EXTRAS  # (in Options, `wheels` is a field's name)


@dataclass
class Options:
    out: Path
    python_version: str
    part_bytes: int | None  # the largest part; None: the room beside the checkout (plan.room)
    node_has: dict[str, str | None]
    models: Path
    wheels: Path | None = None  # a folder of wheels instead of the package index
    cache: Path = CACHE
    refresh: bool = False  # ask the package index again
    preset: int = pack.XZ_PRESET
    wrk: Path | None = None
    extras: tuple[str, ...] = NODE_EXTRAS  # the project's optional extras carried too
    cpu_int8: bool = False  # also the CPU INT8 build, which only a CPU dry run serves
    checkout: Path | None = None  # the checkout the calls travel from (default: the git work tree holding `out`)
    workers: int | None = None  # compressing processes (default: one per core)
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
    pruned = prune.prune(staging / "site", python_version=o.python_version)
    o.timings["unpack_s"] = time.monotonic() - t0
    project = contents.project_files(o.repo)
    for rel in project.files:
        dest = staging / "project" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(o.repo / rel, dest, follow_symlinks=False)
    models = contents.model_files(o.models, o.cpu_int8)
    (staging / "models").mkdir()
    for f in models:
        shutil.copy2(f, staging / "models" / f.name)
    wrk = contents.stage_wrk(o.wrk, staging)
    engines = segments.engine_requirements(reqs)
    kit = {
        "build_id": build_id,
        "python_version": o.python_version,
        "requirements": reqs,
        "engine_requirements": engines,
    }
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
    }


def clear(out: Path) -> None:
    """Remove what an earlier build left in `out` (its call folders, parts, manifest, plan and run.sh), nothing else."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("part-*-of-*.bin"), *out.glob(".part-*.tmp"), out / "manifest.json", out / "run.sh",
                out / "plan.txt", out / "plan.json"]:  # fmt: skip
        old.unlink(missing_ok=True)
    for folder in out.glob("call-*"):
        if folder.is_dir():
            shutil.rmtree(folder)


def where(o: Options) -> tuple[Path, str, str | None]:
    """The checkout the calls travel from, the kit's folder as they name it, and a warning when the folder is not
    where a call can carry it (inside that checkout and ignored by git)."""
    tree = contents.work_tree(o.out)
    checkout = o.checkout or tree or o.repo
    if tree is not None and tree.resolve() == checkout.resolve():
        if not contents.ignored(checkout, o.out):
            raise KitError(
                f"{o.out} is inside {checkout} and git does not ignore it: every call would carry the whole kit; "
                "build into an ignored folder (.gpukit/ is one) or add it to .git/info/exclude"
            )
        return checkout, str(o.out.resolve().relative_to(checkout.resolve())), None
    return (
        checkout,
        str(o.out),
        f"{o.out} is not inside {checkout}: copy it into an ignored folder there before the calls",
    )


def segment_parts(parts: list[dict[str, Any]], streams: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Segment -> the parts that hold its bytes."""
    out: dict[str, list[str]] = {}
    for s in streams:
        start, end, offset = s["offset"], s["offset"] + s["bytes"], 0
        for part in parts:
            if offset < end and start < offset + part["bytes"]:
                names = out.setdefault(s["segment"], [])
                if part["name"] not in names:
                    names.append(part["name"])
            offset += part["bytes"]
    return out


def lay_out(o: Options, parts: list[dict[str, Any]], manifest: dict[str, Any]) -> list[int]:
    """Each part into its call folder with run.sh and manifest.json (also at the top of `out`); each folder's bytes."""
    text = json.dumps(manifest, indent=1) + "\n"
    (o.out / "manifest.json").write_text(text)
    shutil.copy2(RUN_SH, o.out / "run.sh")
    sizes = []
    for i, part in enumerate(parts, 1):
        folder = o.out / CALL.format(index=i)
        folder.mkdir()
        (o.out / part["name"]).rename(folder / part["name"])
        (folder / "manifest.json").write_text(text)
        shutil.copy2(RUN_SH, folder / "run.sh")
        (folder / "run.sh").chmod(0o755)
        sizes.append(sum(f.stat().st_size for f in folder.iterdir()))
        if sizes[-1] - part["bytes"] > plan.FOLDER_RESERVE:
            raise KitError(f"{folder}: run.sh and manifest.json take {sizes[-1] - part['bytes']:,} bytes, more than "
                           f"the {plan.FOLDER_RESERVE:,} reserved for them (plan.FOLDER_RESERVE)")  # fmt: skip
    return sizes


def build(o: Options) -> dict[str, Any]:
    """The whole kit in o.out; the manifest (also written there), its plan under "plan"."""
    t_start = time.monotonic()
    reqs = wheels.project_requirements(o.repo / "pyproject.toml", o.extras)
    contents.model_files(o.models, o.cpu_int8)  # a missing model stops the build before anything is downloaded
    checkout, folder, warning = where(o)
    travelling = contents.travelling_bytes(checkout)
    room = plan.room(travelling["bytes"])
    part_bytes = min(room, o.part_bytes or room)
    if part_bytes <= 0:
        raise KitError(f"the checkout {checkout} carries {plan.mib(travelling['bytes'])}: no room for a part in a call")
    dists, choice = choose(o, reqs)
    log(f"carrying {len(dists)} distributions ({len(choice.shadowing)} of them shadowing the node's); "
        f"{len(choice.left_to_node)} more are the node's own")  # fmt: skip
    build_id = uuid.uuid4().hex
    engine_dists = segments.engine_distributions(reqs, {canonicalize_name(d.name): d for d in dists}, o.python_version)
    with tempfile.TemporaryDirectory(prefix="app-gpu-kit-staging-") as tmp:
        staging = Path(tmp)
        inside = stage(o, staging, reqs, dists, build_id)
        split = segments.split(staging, engine_dists)
        streams = segments.streams(staging, split)
        clear(o.out)
        t0 = time.monotonic()
        log(f"compressing {len(streams)} streams (xz preset {pack.preset_name(o.preset)}) into parts of at most "
            f"{plan.mib(part_bytes)} (the room beside the checkout's {plan.mib(travelling['bytes'])})")  # fmt: skip
        archive = pack.archive(staging, streams, o.out, part_bytes, o.preset, o.workers)
        o.timings["compress_s"] = time.monotonic() - t0
    parts = archive.pop("parts")
    seg_parts = segment_parts(parts, archive["streams"])
    serving_dists = [n for n in map(canonicalize_name, (d.name for d in dists)) if n not in engine_dists]
    manifest = {
        "kit": "app-gpu-kit",
        "build_id": build_id,
        "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "built_on": socket.gethostname(),
        "python_version": o.python_version,
        "platforms": list(wheels.PLATFORMS),
        "parts": parts,
        "segments": {
            seg: {
                "parts": seg_parts.get(seg, []),
                "files": len(split[seg]),
                "bytes": sum(s["bytes"] for s in archive["streams"] if s["segment"] == seg),
                "distributions": engine_dists if seg == segments.ENGINES else serving_dists,
            }
            for seg in segments.SEGMENTS
        },
        "archive": archive,
        "contents": inside,
        "requirements": reqs,
        "left_out": wheels.LEFT_OUT,
        "extras_left_out": wheels.EXTRAS_LEFT_OUT,
        "left_to_node": {
            name: {"version": o.node_has[name], "required_as": said(choice.walk.demands[name])}
            for name in choice.left_to_node
        },
        "shadowing": {name: said(choice.walk.demands[name]) for name in choice.shadowing},
        "wheel_bytes": sum(p["wheel_bytes"] or 0 for p in inside["site"]["packages"]),
    }
    folder_bytes = lay_out(o, parts, manifest)
    o.timings["total_s"] = time.monotonic() - t_start
    made = plan.make(parts, archive["streams"], travelling, folder, folder_bytes)
    made |= {
        "checkout_path": str(checkout),
        "warning": warning,
        "timings_s": {k: round(v, 1) for k, v in o.timings.items()},
    }
    (o.out / "plan.json").write_text(json.dumps(made, indent=1) + "\n")
    (o.out / "plan.txt").write_text("\n".join([*([warning] if warning else []), *plan.render(made)]) + "\n")
    return manifest | {"plan": made}
