"""Reduced-size JPEG decoding vs full decode + resize, on 1920x1080 JPEGs made from the sample photographs.

    python -m benchmarks.preprocess_bench

For each photograph: the time of `preprocess` with DCT-domain reduction (what the server does) and
without it (full decode, then INTER_AREA), medians over repeated runs with warm-up dropped, and the
FP32 model's top-1 on both results and on the photograph as shipped (the reference), with each top-1's
margin over the runner-up: a flip inside a near-tie says less than one with a wide margin.
Writes benchmarks/results/preprocess-<date>-<host>.json.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import cv2
import numpy as np

from app.models import default_files
from app.models.samples import EVAL_PHOTOS, sample_bytes
from app.preprocess import preprocess
from app.runtime import cpu_engine
from benchmarks.environment import describe_environment, format_environment, host_name, stamp

REPEATS = 30


def full_hd_jpeg(name: str) -> bytes:
    img = cv2.imdecode(np.frombuffer(sample_bytes(name), np.uint8), cv2.IMREAD_COLOR)
    big = cv2.resize(img, (1920, 1080), interpolation=cv2.INTER_CUBIC)
    ok, buf = cv2.imencode(".jpg", big, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return buf.tobytes()


def median_ms(data: bytes, reduced: bool) -> float:
    for _ in range(3):
        preprocess(data, reduced=reduced)
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        preprocess(data, reduced=reduced)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> int:
    env = describe_environment()
    print(format_environment(env))
    runner = cpu_engine(default_files().fp32)

    def top2(pixels: np.ndarray) -> tuple[int, float]:
        """Top-1 class and its margin over the runner-up (softmax probabilities)."""
        logits = runner.logits(pixels[None])[0].astype(np.float64)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        first, second = np.argsort(-p)[:2]
        return int(first), float(p[first] - p[second])

    rows = []
    for name in EVAL_PHOTOS:
        data = full_hd_jpeg(name)
        full, reduced = median_ms(data, False), median_ms(data, True)
        # The reference: the photograph as shipped (<= 512 px, so no reduction applies to it).
        top_source, margin_source = top2(preprocess(sample_bytes(name), reduced=False))
        top_full, margin_full = top2(preprocess(data, reduced=False))
        top_reduced, margin_reduced = top2(preprocess(data, reduced=True))
        rows.append(
            {
                "photo": name,
                "bytes": len(data),
                "full_ms": full,
                "reduced_ms": reduced,
                "speedup": full / reduced,
                "top1_source": top_source,
                "top1_full": top_full,
                "top1_reduced": top_reduced,
                "margin_source": margin_source,
                "margin_full": margin_full,
                "margin_reduced": margin_reduced,
            }
        )
        print(
            f"{name:14s} full {full:6.2f} ms  reduced {reduced:5.2f} ms  x{full / reduced:4.1f}  "
            f"top-1 source {top_source} ({margin_source:.3f})  full {top_full} ({margin_full:.3f})  "
            f"reduced {top_reduced} ({margin_reduced:.3f})"
        )
    speedups = [r["speedup"] for r in rows]
    summary = {
        "median_speedup": statistics.median(speedups),
        "same_top1": all(r["top1_full"] == r["top1_reduced"] for r in rows),
        "reduced_matches_source": sum(r["top1_reduced"] == r["top1_source"] for r in rows),
        "full_matches_source": sum(r["top1_full"] == r["top1_source"] for r in rows),
        "photos": len(rows),
    }
    print(
        f"median speed-up x{summary['median_speedup']:.2f}; top-1 as on the source photograph: "
        f"reduced {summary['reduced_matches_source']}/{len(rows)}, full {summary['full_matches_source']}/{len(rows)}; "
        f"reduced = full on all: {summary['same_top1']}"
    )
    out = Path("benchmarks/results") / f"preprocess-{stamp()}-{host_name()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"environment": env, "rows": rows, **summary}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
