"""python -m benchmarks.gpu_kit build DIR [...]: the kit for a GPU node without network (benchmarks/gpu_kit)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.gpu_kit import build, pack, wheels
from benchmarks.gpu_kit.build import MAX_PART_MIB, Options, log, mib
from benchmarks.gpu_kit.wheels import KitError


def part_bytes(a: argparse.Namespace) -> int:
    size = int(a.part_kib * 2**10) if a.part_kib is not None else int(a.part_mib * 2**20)
    if not 0 < size <= MAX_PART_MIB * 2**20:
        raise KitError(f"a part must be over 0 and at most {MAX_PART_MIB} MiB (one call to the node carries 64 MiB)")
    return size


def parser() -> argparse.ArgumentParser:
    from benchmarks import gpu_kit

    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kit", description=gpu_kit.__doc__, formatter_class=raw)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write run.sh, manifest.json and the parts into DIR")
    b.add_argument("dir", type=Path)
    b.add_argument("--python-version", default="3.12", help="the node's CPython, MAJOR.MINOR (default 3.12)")
    size = b.add_mutually_exclusive_group()
    size.add_argument("--part-mib", type=float, default=48.0, help=f"largest part, MiB (48; max {MAX_PART_MIB})")
    size.add_argument("--part-kib", type=float, help="largest part in KiB instead (tests)")
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
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
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
        )
        m = build.build(o)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    arch = m["archive"]
    for part in m["parts"]:
        log(f"{part['name']}  {part['bytes']:>11,} bytes  sha256 {part['sha256'][:16]}...")
    site = arch["groups"]["site"]
    log(
        f"{len(m['parts'])} parts, {mib(arch['bytes'])} from {mib(arch['tar_bytes'])} (xz {arch['ratio']:.3f}); the "
        f"site {mib(site['bytes'])} -> ~{mib(site['xz_bytes_approx'])}, its {len(m['contents']['site']['packages'])} "
        f"wheels {mib(m['wheel_bytes'])}; {m['timings_s']}"
    )
    node = [f"{name}=={v['version']}" if v["version"] else name for name, v in m["left_to_node"].items()]
    log(f"left to the node: {', '.join(node)}")
    if m["shadowing"]:
        log(f"carried though the node has them (a requirement names versions): {', '.join(m['shadowing'])}")
    log(f"per part: bash run.sh receive FOLDER; then: bash run.sh run   ({o.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
