"""Triton's perf_analyzer, unmodified, against this service over HTTP and gRPC with real JPEG bytes.

perf_analyzer reads the model's metadata and configuration (Triton's model-configuration extension), sends
`image_bytes` from an `--input-data` JSON file (the JPEG's binary tensor data, base64: `{"b64": ...}`), and reads
the statistics extension before and after each window to split the latency into queue and compute.

The binary: Triton's client wheels up to 2.41 ship it (later ones do not), so `setup()` takes it from the
tritonclient 2.41.1 wheel into .perf_analyzer/ (no install: the wheel's Python client would replace the newer one
the app uses). It links libcudart.so.12 even for HTTP/gRPC runs (pip: nvidia-cuda-runtime-cu12, installed into
.perf_analyzer/cudart, no GPU needed) and libb64.so.0d (apt: libb64-0d).

    python -m benchmarks.perf_analyzer --setup            # once
    python -m benchmarks.perf_analyzer --url 127.0.0.1    # against `make serve` (HTTP 8000, gRPC 9000)
"""

from __future__ import annotations

import argparse
import base64
import csv
import glob
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HOME = REPO / ".perf_analyzer"
BINARY = HOME / "bin" / "perf_analyzer"
WHEEL = "tritonclient==2.41.1"  # the last wheels with perf_analyzer inside
WHEEL_PATH = "tritonclient-2.41.1.data/data/bin/perf_analyzer"
CUDART = "nvidia-cuda-runtime-cu12"


def setup(home: Path = HOME) -> Path:
    """perf_analyzer and its CUDA runtime library under `home` (idempotent); the binary's path."""
    binary = home / "bin" / "perf_analyzer"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    if not binary.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([*pip, "download", "--no-deps", "--dest", tmp, WHEEL], check=True)
            (wheel,) = glob.glob(os.path.join(tmp, "tritonclient-*.whl"))
            binary.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheel) as z, z.open(WHEEL_PATH) as src, open(binary, "wb") as dst:
                shutil.copyfileobj(src, dst)
        binary.chmod(0o755)
    if not list((home / "cudart").glob("nvidia/cuda_runtime/lib/libcudart.so.12")):
        subprocess.run([*pip, "install", "--no-deps", "--target", str(home / "cudart"), CUDART], check=True)
    return binary


def environment(home: Path = HOME) -> dict[str, str]:
    lib = str(home / "cudart" / "nvidia" / "cuda_runtime" / "lib")
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [lib, os.environ.get("LD_LIBRARY_PATH")]))}


def why_not_runnable(binary: Path = BINARY, home: Path = HOME) -> str | None:
    """None when perf_analyzer starts here; else why not, in words (for a test's skip)."""
    if not binary.is_file():
        return f"{binary} is missing: run `python -m benchmarks.perf_analyzer --setup`"
    missing = [
        line.split()[0]
        for line in subprocess.run(
            ["ldd", str(binary)], capture_output=True, text=True, env=environment(home)
        ).stdout.splitlines()
        if "not found" in line
    ]
    if missing:
        return f"perf_analyzer cannot load {missing} (libb64.so.0d: `apt-get install libb64-0d`)"
    return None


def input_data(path: Path, images: list[bytes]) -> Path:
    """perf_analyzer's --input-data file: one step per image, each `image_bytes` as BYTES tensor data, base64."""
    steps = [{"image_bytes": {"b64": base64.b64encode(struct.pack("<I", len(b)) + b).decode()}} for b in images]
    path.write_text(json.dumps({"data": steps}))
    return path


def run(
    url: str,
    model: str,
    protocol: str,
    data: Path,
    concurrency: int = 1,
    window_ms: int = 3000,
    timeout_s: float = 300,
    binary: Path = BINARY,
) -> dict[str, Any]:
    """One perf_analyzer run at one concurrency: its CSV row (client and server figures), and its text report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.csv"
        cmd = [
            str(binary),
            *("-m", model, "-u", url, "-i", protocol, "--input-data", str(data)),
            *("--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms)),
            *("--max-trials", "6", "--stability-percentage", "50", "-f", str(report), "--verbose-csv"),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=environment())
        if done.returncode != 0:
            raise RuntimeError(f"perf_analyzer exited {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        rows = list(csv.DictReader(io.StringIO(report.read_text())))
    return {"model": model, "protocol": protocol, "concurrency": concurrency, "csv": rows[0], "stdout": done.stdout}


def summary_keys() -> list[str]:
    return [
        "model",
        "protocol",
        "concurrency",
        "infer_per_s",
        "p50_ms",
        "p99_ms",
        "server_queue_ms",
        "server_compute_input_ms",
        "server_compute_infer_ms",
        "server_compute_output_ms",
    ]


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The figures the README compares: throughput, client latency (ms), and the server's own split (ms)."""
    row = result["csv"]

    def ms(key: str) -> float:
        return round(float(row.get(key) or 0) / 1000.0, 2)  # the CSV is in microseconds

    return {
        "model": result["model"],
        "protocol": result["protocol"],
        "concurrency": result["concurrency"],
        "infer_per_s": round(float(row["Inferences/Second"]), 1),
        "p50_ms": ms("p50 latency"),
        "p99_ms": ms("p99 latency"),
        "server_queue_ms": ms("Server Queue"),
        "server_compute_input_ms": ms("Server Compute Input"),
        "server_compute_infer_ms": ms("Server Compute Infer"),
        "server_compute_output_ms": ms("Server Compute Output"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true", help="fetch perf_analyzer and its CUDA runtime, then exit")
    parser.add_argument("--url", default="127.0.0.1", help="host; HTTP on --http-port, gRPC on --grpc-port")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=9000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--model", default="efficientnet_lite0", help="the app's model name (args.model.name)")
    args = parser.parse_args(argv)
    if args.setup:
        print(setup())
        return 0
    reason = why_not_runnable()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from app.protocol import v2
    from benchmarks.corpus import SIZES, build_corpus
    from benchmarks.environment import describe_environment, host_name, stamp
    from benchmarks.load import Workload, wrk_step
    from benchmarks.report import markdown_table, write_report

    corpus = build_corpus(SIZES)  # the images `make bench` sends, so both load generators send the same load
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data = input_data(Path(tmp) / "images.json", [im.data for im in corpus])
        for variant in (None, "fp32", "int8"):
            model = v2.model_name_for(args.model, variant)
            for c in args.concurrency:
                for protocol, port in (("http", args.http_port), ("grpc", args.grpc_port)):
                    r = summary(run(f"{args.url}:{port}", model, protocol, data, c))
                    print(r, flush=True)
                    results.append(r)
                wl = Workload(url=f"http://{args.url}:{args.http_port}/v1/classify", variant=variant, protocol="v2")
                step = wrk_step(wl, c, duration_s=5.0)
                results.append(
                    {
                        "model": model,
                        "protocol": "http (wrk, make bench's client)",
                        "concurrency": c,
                        "infer_per_s": round(step["throughput_rps"], 1),
                        "p50_ms": step["latency_ms"]["p50_ms"],
                        "p99_ms": step["latency_ms"]["p99_ms"],
                        "errors": sum(dict(step["errors"]).values()),
                    }
                )
    keys = [*summary_keys(), "errors"]
    md = markdown_table(keys, [[r.get(k, "") for k in keys] for r in results])
    stem = args.out / f"{stamp()}-{host_name()}-perf-analyzer"
    plot(results, stem.parent / f"{stem.name}.png")
    print(write_report(stem, {"environment": describe_environment(), "results": results}, md))
    return 0


COLOURS = {"http": "#4c72b0", "grpc": "#dd8452", "wrk": "#55a868"}


def _client(result: dict[str, Any]) -> str:
    return "wrk" if "wrk" in result["protocol"] else result["protocol"]


def plot(results: list[dict[str, Any]], out: Path) -> None:
    """Requests/s per model, client and concurrency: perf_analyzer over HTTP and gRPC, wrk over HTTP."""
    from benchmarks.report import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    short = {"efficientnet_lite0": "A/B", "efficientnet_lite0-fp32": "fp32", "efficientnet_lite0-int8": "int8"}
    labels = [f"{short.get(r['model'], r['model'])}\nc={r['concurrency']}" for r in results]
    ax.bar(range(len(results)), [r["infer_per_s"] for r in results], color=[COLOURS[_client(r)] for r in results])
    ax.set_xticks(range(len(results)), labels, fontsize=7)
    ax.set_ylabel("requests/s (1 image each)")
    ax.set_title("perf_analyzer over HTTP (blue) and gRPC (orange); make bench's wrk over HTTP (green)")
    save_figure(fig, out)


if __name__ == "__main__":
    raise SystemExit(main())
