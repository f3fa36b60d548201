"""The CPU engines side by side: OpenVINO against ONNX Runtime's CPU EP, on FP32 and both INT8 artifacts.

    python -m benchmarks.engine_bench                  # batch 1 and 16, 2 parallel one-thread calls
    python -m benchmarks.engine_bench --batches 1,8,16 --parallel 1 --threads 2

Each model runs on both engines as a Classifier replica would (app.runtime: one thread per call,
`--parallel` calls at once, OpenVINO compiled with one stream per parallel call), timed in
alternating rounds (app.runtime.measure) so a noisy neighbour slows both alike. The top-1 of each
(model, engine) on the sample photographs is recorded beside its speed, and compared with FP32 on
ONNX Runtime: a faster engine that gives other answers is no use.
Writes benchmarks/results/engine_bench-<date>-<host>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.environment import RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.report import markdown_table, pyplot, write_json

ENGINES = ("cpu", "openvino")


def photographs() -> tuple[list[str], np.ndarray]:
    from app.models.samples import available_photos, sample_bytes
    from app.preprocess import preprocess

    names = sorted(available_photos())
    return names, np.stack([preprocess(sample_bytes(n), size=224) for n in names])


def models() -> dict[str, Path]:
    from app.models import default_files

    files = default_files()
    return {"fp32": files.fp32, "int8 (CPU, U8S8)": files.int8, "int8 (TensorRT, S8S8)": files.int8_trt}


def bench_model(path: Path, batches: list[int], threads: int, parallel: int) -> dict[str, Any]:
    from app.runtime import RuntimeOptions, measure_alternating, open_engine

    def opened(engine: str) -> Any:
        opts = RuntimeOptions(threads=threads, streams=parallel, prefer_gpu=False, engine=engine)
        return open_engine("bench", str(path), opts).engine

    engines = {e: opened(e) for e in ENGINES}
    names, photos = photographs()
    out: dict[str, Any] = {"file": path.name, "engines": {}}
    for name, engine in engines.items():
        top1 = engine.logits(photos).argmax(1)
        out["engines"][name] = {"top1": dict(zip(names, map(int, top1), strict=True)), "batches": {}}
    for batch in batches:
        x = next(iter(engines.values())).dummy_batch(batch)
        measured = measure_alternating({n: e.logits for n, e in engines.items()}, x, parallel=parallel, rounds=7)
        for name, t in measured.items():
            out["engines"][name]["batches"][str(batch)] = t.describe()
    for engine in engines.values():
        engine.close()
    return out


def agreement(top1: dict[str, int], reference: dict[str, int]) -> str:
    return f"{sum(top1[k] == reference[k] for k in reference)}/{len(reference)}"


def rows(result: dict[str, Any]) -> list[list[Any]]:
    """Per model and batch: both engines' img/s, their ratio, and each one's top-1 agreement with FP32 on ORT."""
    reference = result["models"]["fp32"]["engines"]["cpu"]["top1"]
    table = []
    for model, r in result["models"].items():
        cpu, ov = r["engines"]["cpu"], r["engines"]["openvino"]
        for batch in result["batches"]:
            a, b = ov["batches"][str(batch)]["img_per_s"], cpu["batches"][str(batch)]["img_per_s"]
            same = f"{agreement(cpu['top1'], reference)} / {agreement(ov['top1'], reference)}"
            table.append([model, batch, b, a, f"{a / b:.2f}x", same])
    return table


HEADERS = ["model", "batch", "ORT CPU EP img/s", "OpenVINO img/s", "OpenVINO / ORT", "top-1 = FP32's: ORT / OpenVINO"]


def plot(result: dict[str, Any], png: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels, width = list(result["models"]), 0.38
    for i, engine in enumerate(ENGINES):
        batch = str(max(result["batches"]))
        values = [result["models"][m]["engines"][engine]["batches"][batch]["img_per_s"] for m in labels]
        ax.bar([j + i * width for j in range(len(labels))], values, width, label=f"{engine} (batch {batch})")
    ax.set_xticks([j + width / 2 for j in range(len(labels))], labels)
    ax.set_ylabel("images/s")
    ax.set_title(f"CPU engines, {result['parallel']} parallel call(s) x {result['threads']} thread(s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engine_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,16", help="comma-separated batch sizes (default 1,16)")
    p.add_argument("--threads", type=int, default=1, help="threads per call (default 1, as local.yaml's replicas)")
    p.add_argument("--parallel", type=int, default=2, help="calls at once (default 2: max_concurrent_batches)")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    print_environment()
    present = {name: path for name, path in models().items() if path.is_file()}
    if not present:
        print("no models: run `make models` first", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"batches": batches, "threads": args.threads, "parallel": args.parallel, "models": {}}
    for name, path in present.items():
        print(f"{name}: {path.name}", file=sys.stderr, flush=True)
        result["models"][name] = bench_model(path, batches, args.threads, args.parallel)
    stem = args.out_dir / f"engine_bench-{stamp()}-{host_name()}"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(stem.with_suffix(".json"), result)
    table = markdown_table(HEADERS, rows(result))
    stem.with_suffix(".md").write_text(table + "\n")
    plot(result, stem.with_suffix(".png"))
    print(table)
    print(f"wrote {stem}.json, .md and .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
