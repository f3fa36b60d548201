"""python -m benchmarks.gpu_kit build DIR [...]: the kit for a GPU node without network (benchmarks/gpu_kit)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.gpu_kit import aside, build, contents, pack, plan, wheels
from benchmarks.gpu_kit.build import MAX_PART_MIB, Options, log, mib
from benchmarks.gpu_kit.wheels import KitError


def part_bytes(a: argparse.Namespace) -> int | None:
    if a.part_kib is None and a.part_mib is None:
        return None
    size = int(a.part_kib * 2**10) if a.part_kib is not None else int(a.part_mib * 2**20)
    if not 0 < size <= MAX_PART_MIB * 2**20:
        raise KitError(f"a part must be over 0 and at most {MAX_PART_MIB} MiB (one call to the node carries 64 MiB)")
    return size


def replan(folder: Path) -> int:
    """`plan DIR`: the built kit's calls against the checkout as it is now: 1 when a call no longer fits."""
    saved = json.loads((folder / "plan.json").read_text())
    now = contents.travelling_bytes(Path(saved["checkout_path"]))
    calls = saved["calls"]
    sizes = [sum(f.stat().st_size for f in (folder / f"call-{c['call']}").iterdir()) for c in calls]
    parts = [{"name": c["part"], "bytes": c["part_bytes"]} for c in calls]
    manifest = json.loads((folder / "manifest.json").read_text())
    folder_name = calls[0]["carry"].rsplit("/", 1)[0] if calls else str(folder)
    made = plan.make(parts, manifest["archive"]["streams"], now, folder_name, sizes)
    for line in plan.render(made):
        print(line)
    over = [c["call"] for c in made["calls"] if c["total_bytes"] > plan.CALL_BYTES]
    if over:
        grew = mib(now["bytes"] - saved["checkout"]["bytes"])
        print(
            f"calls {over} carry over {mib(plan.CALL_BYTES)} now: the checkout grew by {grew} since the build "
            "(benchmarks/results/ back? `aside` again); or build again",
            file=sys.stderr,
        )
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    from benchmarks import gpu_kit

    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kit", description=gpu_kit.__doc__, formatter_class=raw)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the call folders (run.sh, manifest.json, a part), plan.txt into DIR")
    b.add_argument("dir", type=Path)
    b.add_argument("--python-version", default="3.12", help="the node's CPython, MAJOR.MINOR (default 3.12)")
    size = b.add_mutually_exclusive_group()
    size.add_argument("--part-mib", type=float, help=f"largest part, MiB (default: what one call can carry beside the "
                      f"checkout, measured now; max {MAX_PART_MIB})")  # fmt: skip
    size.add_argument("--part-kib", type=float, help="largest part in KiB instead (tests)")
    b.add_argument("--checkout", type=Path, help="the checkout the calls travel from (default: the git work tree "
                   "holding DIR, else this project's)")  # fmt: skip
    b.add_argument("--cpu-int8", action="store_true", help="also carry the CPU INT8 build (only CPU dry runs serve it)")
    b.add_argument("--workers", type=int, help="compressing processes (default: one per core)")
    b.add_argument(
        "--node-has",
        type=lambda s: s.split(","),
        help="NAME or NAME==VERSION,...: the distributions the node has, left out of the kit (default: the GPU image's "
        "packages, benchmarks/gpu_kit/wheels.py DEFAULT_NODE_HAS). With a version it must meet every requirement on "
        "it; without one it serves only requirements that name no version, and is carried where one does",
    )
    b.add_argument("--models", type=Path, default=Path("models"), help="the built models (default ./models)")
    b.add_argument("--wheels", type=Path, help="take the wheels from this folder: nothing is asked or downloaded")
    b.add_argument("--cache", type=Path, default=wheels.CACHE, help=f"resolutions and wheels (default {wheels.CACHE})")
    b.add_argument("--refresh", action="store_true", help="ask the package index again instead of the cached answer")
    b.add_argument("--xz-preset", type=pack.parse_preset, default=pack.XZ_PRESET, help="xz preset (default 9e)")
    b.add_argument("--wrk", type=Path, help="the wrk binary (default: wrk on PATH)")
    b.add_argument(
        "--extras",
        type=lambda s: tuple(e for e in s.split(",") if e),
        default=wheels.NODE_EXTRAS,
        help=f"the project's optional extras the node needs, comma-separated (default {','.join(wheels.NODE_EXTRAS)}: "
        "nvImageCodec for decode_in: gpu; '' for none)",
    )
    replanned = sub.add_parser("plan", help="the built kit's calls against the checkout as it is now")
    replanned.add_argument("dir", type=Path)
    sub.add_parser("aside", help="benchmarks/results/ out of what the calls carry (git's index; the files stay)")
    sub.add_parser("back", help="benchmarks/results/ back in git's index as HEAD has it")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.command == "plan":
        return replan(a.dir)
    if a.command in ("aside", "back"):
        try:
            print((aside.aside if a.command == "aside" else aside.back)())
        except KitError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    try:
        o = Options(
            out=a.dir.absolute(),
            python_version=a.python_version,
            part_bytes=part_bytes(a),
            node_has=wheels.parse_node_has(a.node_has if a.node_has is not None else wheels.DEFAULT_NODE_HAS),
            models=a.models.absolute(),
            wheels=a.wheels.absolute() if a.wheels else None,
            cache=a.cache,
            refresh=a.refresh,
            preset=a.xz_preset,
            wrk=a.wrk,
            extras=a.extras,
            cpu_int8=a.cpu_int8,
            checkout=a.checkout.absolute() if a.checkout else None,
            workers=a.workers,
        )
        m = build.build(o)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    arch, made = m["archive"], m["plan"]
    for seg, info in m["segments"].items():
        log(f"segment {seg}: {info['files']} files, {mib(info['bytes'])} compressed, in {', '.join(info['parts'])}")
    log(f"{len(m['parts'])} parts, {mib(arch['bytes'])} from {mib(arch['tar_bytes'])} (xz {arch['ratio']:.3f}), "
        f"{len(m['contents']['site']['packages'])} distributions carried; {made['timings_s']}")  # fmt: skip
    node = [f"{name}=={v['version']}" if v["version"] else name for name, v in m["left_to_node"].items()]
    log(f"left to the node: {', '.join(node)}")
    if m["shadowing"]:
        log(f"carried though the node has them (a requirement names versions): {', '.join(m['shadowing'])}")
    if made["warning"]:
        log(made["warning"])
    for line in plan.render(made):
        print(line)
    print(
        f"(also in {o.out / 'plan.txt'}; `python -m benchmarks.gpu_kit plan {a.dir}` checks it again before the calls)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
