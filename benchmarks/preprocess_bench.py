"""Reduced-size JPEG decoding vs full decode + resize, on 1920x1080 JPEGs made from the sample photographs.

    python -m benchmarks.preprocess_bench

For each photograph: the time of `preprocess` with DCT-domain reduction (what the server does) and
without it (full decode, then INTER_AREA), medians over repeated runs with warm-up dropped, and the
FP32 model's top-1 on both results (they must agree). Writes benchmarks/results/preprocess-<date>-<host>.json.
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
from app.runtime import ModelRunner, RuntimeOptions
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
    runner = ModelRunner(default_files().fp32, RuntimeOptions(threads=1, prefer_gpu=False))
    rows = []
    for name in EVAL_PHOTOS:
        data = full_hd_jpeg(name)
        full, reduced = median_ms(data, False), median_ms(data, True)
        top_full = int(runner.logits(preprocess(data, reduced=False)[None]).argmax())
        top_reduced = int(runner.logits(preprocess(data, reduced=True)[None]).argmax())
        rows.append(
            {
                "photo": name,
                "bytes": len(data),
                "full_ms": full,
                "reduced_ms": reduced,
                "speedup": full / reduced,
                "top1_full": top_full,
                "top1_reduced": top_reduced,
            }
        )
        print(
            f"{name:14s} full {full:6.2f} ms  reduced {reduced:5.2f} ms  x{full / reduced:4.1f}  "
            f"top-1 {top_full} / {top_reduced}"
        )
    speedups = [r["speedup"] for r in rows]
    same = all(r["top1_full"] == r["top1_reduced"] for r in rows)
    print(f"median speed-up x{statistics.median(speedups):.2f}; same top-1 on all: {same}")
    out = Path("benchmarks/results") / f"preprocess-{stamp()}-{host_name()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"environment": env, "rows": rows, "median_speedup": statistics.median(speedups), "same_top1": same},
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
