"""python -m benchmarks.gpu_decode [--cpu-dry-run] [--batch N] [--seconds S] [--out DIR]

`decode_in: gpu`'s decode, measured with the app's own code on one node: the table issue 43 asks for.

Per JPEG size of the corpus (benchmarks/corpus.py: five photographs at 640x480 and 1920x1080, quality 90):
- the CPU path: `preprocess` (reduced decode, declared transform) in this process, CPU-ms per image;
- the GPU path: the Classifier's `GpuPixels` (app/runtime/gpu_pixels.py) as a replica builds it
  (`open_gpu_pixels`: nvImageCodec's hardware decoder, then hybrid; the transform graph on the CUDA EP on the
  decoder's stream), batches of `--batch` images: img/s, CPU-ms per image of this process, where each image was
  decoded;
- agreement: each image's pixels from the GPU path against the CPU path's on the same full decode
  (`preprocess(..., reduced=False)`): the mean absolute difference per image. An unordered decode and transform shows
  here (the first GPU node measured 69 grey levels without ordering, 0.0 with it).

`--cpu-dry-run`: the host stand-in for nvImageCodec and the transform graph on the CPU EP (APP_GPU_DECODER=standin):
the flow and the agreement check run anywhere, the speeds are this CPU's. Writes
benchmarks/results/<stamp>-<host>-gpu-decode{,-dryrun}.{json,md,png}. Exit 0: measured; 1: the GPU path could not be
built or disagreed (mean absolute difference above MAX_MEAN_DIFF on any image); 2: no images.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from app.config import Limits
from app.imaging.preprocess import preprocess
from app.imaging.transform import Transform
from app.runtime.cuda_transform import STANDIN, decoder_factory, open_gpu_pixels
from app.runtime.gpu_pixels import GpuPixels
from app.served_model import builtin_transform
from benchmarks.corpus import build_corpus
from benchmarks.environment import RESULTS_DIR, host_name, stamp
from benchmarks.report import markdown_table, pyplot, save_figure, write_report

SIZES = ((640, 480), (1920, 1080))
MAX_MEAN_DIFF = 1.0  # grey levels per pixel, per image: tests/test_transform_graph_unit.py's bound


def cpu_ms() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1000.0


def timed(fn: Any, seconds: float, images_per_call: int) -> dict[str, float]:
    """Calls `fn` for about `seconds` (at least 3 calls, the first not counted): img/s and CPU-ms per image."""
    fn()
    calls, t0, c0 = 0, time.perf_counter(), cpu_ms()
    while calls < 3 or time.perf_counter() - t0 < seconds:
        fn()
        calls += 1
    wall, cpu = time.perf_counter() - t0, cpu_ms() - c0
    n = calls * images_per_call
    return {"images_per_s": round(n / wall, 1), "cpu_ms_per_image": round(cpu / n, 3), "images": n}


def measure_size(
    gpu: GpuPixels, transform: Transform, images: list[bytes], batch: int, seconds: float
) -> dict[str, Any]:
    batch_images = [images[i % len(images)] for i in range(batch)]
    cpu = timed(lambda: [preprocess(d, transform) for d in images], seconds, len(images))
    before = Counter(gpu.counts())
    on_gpu = timed(lambda: gpu([batch_images]), seconds, batch)
    where = {k: v for k, v in (Counter(gpu.counts()) - before).items() if v}
    (pixels,), _ = gpu([images])
    full = [preprocess(d, transform, reduced=False) for d in images]
    diffs = [
        float(np.abs(p.astype(np.int16) - f.astype(np.int16)).mean()) for p, f in zip(pixels.array, full, strict=True)
    ]
    return {
        "cpu_path": cpu,
        "gpu_path": on_gpu,
        "decoded": where,
        "mean_abs_diff": [round(d, 3) for d in diffs],
        "errors": {str(i): e.code for i, e in pixels.errors.items()},
    }


def to_markdown(result: dict[str, Any], png: str) -> str:
    rows = []
    for size, r in result["sizes"].items():
        rows.append([
            size, r["cpu_path"]["cpu_ms_per_image"], r["cpu_path"]["images_per_s"], r["gpu_path"]["images_per_s"],
            r["gpu_path"]["cpu_ms_per_image"], ", ".join(f"{k} {v}" for k, v in r["decoded"].items()),
            max(r["mean_abs_diff"], default=0.0),
        ])  # fmt: skip
    mode = "CPU dry run (host stand-in, CPU EP)" if result["dry_run"] else "GPU node"
    headers = ["JPEG", "CPU path ms/img", "CPU path img/s (1 core)", f"GPU path img/s (batch {result['batch']})",
               "GPU path CPU-ms/img", "decoded by", "max mean |GPU - CPU full decode|"]  # fmt: skip
    return "\n".join([
        f"# decode_in: gpu, decode only ({mode}, {result['stamp']})", "",
        f"`{result['command']}`; decoder: {result['decoder']}", "", markdown_table(headers, rows, digits=3), "",
        f"Verdict: {result['verdict']}", "", f"![img/s per path]({png})", "",
    ])  # fmt: skip


def plot(result: dict[str, Any], png: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    sizes = list(result["sizes"])
    x = np.arange(len(sizes))
    ax.bar(x - 0.2, [result["sizes"][s]["cpu_path"]["images_per_s"] for s in sizes], 0.4, label="CPU path, 1 core")
    ax.bar(x + 0.2, [result["sizes"][s]["gpu_path"]["images_per_s"] for s in sizes], 0.4, label="GPU path")
    ax.set_xticks(x, sizes)
    ax.set_ylabel("images/s")
    ax.set_title(f"{'CPU dry run' if result['dry_run'] else 'GPU node'}: decode + transform, {result['stamp']}")
    ax.legend()
    return save_figure(fig, png)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_decode", description=__doc__.split("\n\n")[1])
    p.add_argument("--cpu-dry-run", action="store_true", help="the host stand-in and the CPU EP: the flow anywhere")
    p.add_argument("--batch", type=int, help="images per GpuPixels call, a Classifier's batch (64; dry run 4)")
    p.add_argument("--seconds", type=float, help="measured seconds per path and size (3; dry run 0: 3 calls)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    a = p.parse_args(argv)
    a.batch = a.batch or (4 if a.cpu_dry_run else 64)  # the CPU EP's cubic Resize: ~0.1 s per 640x480 image here
    a.seconds = a.seconds if a.seconds is not None else (0.0 if a.cpu_dry_run else 3.0)
    transform = builtin_transform()
    corpus = build_corpus(SIZES)
    if not corpus:
        print("error: no sample photographs", file=sys.stderr)
        return 2
    kind, factory = decoder_factory({"APP_GPU_DECODER": STANDIN} if a.cpu_dry_run else {})
    result: dict[str, Any] = {"stamp": stamp(), "dry_run": a.cpu_dry_run, "decoder": kind, "batch": a.batch}
    result["command"] = "python -m benchmarks.gpu_decode " + " ".join(argv if argv is not None else sys.argv[1:])
    try:  # the Classifier's own construction: the factory's decoder and transform, the limits, a CPU-path thread
        gpu = open_gpu_pixels(transform, Limits(), 1.0, a.batch, 0, ThreadPoolExecutor(1), factory=factory)
    except Exception as e:  # no nvImageCodec, no CUDA: said, exit 1
        print(f"error: the GPU path cannot be built here: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    result["sizes"] = {
        f"{w}x{h}": measure_size(gpu, transform, [im.data for im in corpus if (im.width, im.height) == (w, h)],
                                 a.batch, a.seconds)
        for w, h in SIZES
    }  # fmt: skip
    worst = max(d for r in result["sizes"].values() for d in r["mean_abs_diff"])
    ok = worst <= MAX_MEAN_DIFF and not any(r["errors"] for r in result["sizes"].values())
    result["verdict"] = (
        f"{'agrees' if ok else 'DISAGREES'}: largest per-image mean |GPU path - CPU path on the full decode| "
        f"{worst:.3f} (at most {MAX_MEAN_DIFF})"
    )
    stem_name = f"{result['stamp']}-{host_name()}-gpu-decode{'-dryrun' if a.cpu_dry_run else ''}"
    a.out.mkdir(parents=True, exist_ok=True)
    plot(result, a.out / f"{stem_name}.png")
    markdown = to_markdown(result, f"{stem_name}.png")
    print(write_report(a.out / stem_name, result, markdown))
    print(markdown)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
