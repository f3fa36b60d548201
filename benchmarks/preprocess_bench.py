"""Reduced-size JPEG decoding vs full decode + resize, on 1920x1080 JPEGs made from the sample photographs.

    python -m benchmarks.preprocess_bench

For each photograph: the median time of `preprocess` with DCT-domain reduction (what the server does) and
without it (full decode, then INTER_AREA), and the FP32 model's top-1 on both and on the photograph as shipped
(the reference), each with its margin over the runner-up: a flip inside a near-tie says less than one with a
wide margin. Writes benchmarks/results/preprocess-<date>-<host>.json.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from typing import Any

import numpy as np

from app.imaging.opencv import cv2  # the service's OpenCV settings (its pixel guard) before the library loads
from app.imaging.preprocess import preprocess
from app.runtime import cpu_engine, softmax, top_k
from app.served_model import builtin_transform, default_files
from app.toolchain.samples import EVAL_PHOTOS, sample_bytes
from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.model_bench import time_runs
from benchmarks.report import write_json

REPEATS = 30
SERVED = builtin_transform()  # the built-in model's declared transform
WAYS = {"source": False, "full": False, "reduced": True}  # how each JPEG is decoded (source: as shipped, <= 512 px)


def full_hd_jpeg(name: str) -> bytes:
    img = cv2.imdecode(np.frombuffer(sample_bytes(name), np.uint8), cv2.IMREAD_COLOR)
    assert img is not None
    big = cv2.resize(img, (1920, 1080), interpolation=cv2.INTER_CUBIC)
    return cv2.imencode(".jpg", big, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    env = print_environment()
    runner = cpu_engine(default_files().fp32)

    def top1(data: bytes, reduced: bool) -> tuple[int, float]:
        """Top-1 class and its margin over the runner-up (softmax probabilities)."""
        (first, p1), (_, p2) = top_k(softmax(runner.logits(preprocess(data, SERVED, reduced=reduced)[None])[0]), 2)
        return first, p1 - p2

    rows = []
    for name in EVAL_PHOTOS:
        data = full_hd_jpeg(name)
        row: dict[str, Any] = {"photo": name, "bytes": len(data)}
        for way in ("full", "reduced"):
            times = time_runs(functools.partial(preprocess, data, SERVED, reduced=WAYS[way]), 3, REPEATS, REPEATS, 0)
            row[f"{way}_ms"] = 1000 * statistics.median(times)
        row["speedup"] = row["full_ms"] / row["reduced_ms"]
        for way, reduced in WAYS.items():
            row[f"top1_{way}"], row[f"margin_{way}"] = top1(sample_bytes(name) if way == "source" else data, reduced)
        rows.append(row)
        tops = "  ".join(f"{w} {row[f'top1_{w}']} ({row[f'margin_{w}']:.3f})" for w in WAYS)
        speed = f"full {row['full_ms']:6.2f} ms  reduced {row['reduced_ms']:5.2f} ms  x{row['speedup']:4.1f}"
        print(f"{name:14s} {speed}  top-1 {tops}")
    summary = {
        "median_speedup": statistics.median(r["speedup"] for r in rows),
        "same_top1": all(r["top1_full"] == r["top1_reduced"] for r in rows),
        "reduced_matches_source": sum(r["top1_reduced"] == r["top1_source"] for r in rows),
        "full_matches_source": sum(r["top1_full"] == r["top1_source"] for r in rows),
        "photos": len(rows),
    }
    print(
        f"median speed-up x{summary['median_speedup']:.2f}; top-1 as on the source photograph: reduced "
        f"{summary['reduced_matches_source']}/{len(rows)}, full {summary['full_matches_source']}/{len(rows)}; "
        f"reduced = full on all: {summary['same_top1']}"
    )
    out = RESULTS_DIR / f"preprocess-{stamp()}-{host_name()}.json"
    print(f"wrote {write_json(out, {'environment': env, 'rows': rows, **summary})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
