"""`python -m app.batch score` against the single-process `report` path, on this machine.

    python -m benchmarks.batch_score [--compare 4000] [--rounds 5] [--small 2000] [--large 20000]
        [--speed-only | --memory-only]

On one corpus of JPEGs (the sample photographs re-encoded, linked over and over; decoding and inference cost the same
for every copy), with FP32 on ONNX Runtime's CPU EP in both paths (configs/local.yaml, engine cpu):

1. img/s of the single-process path `python -m app.models report --eval-dir` takes (read, `Preparation.pixels`, the
   CPU engine in batches of 32, one process) and of `score` on a Ray started here (`ray.init()`; its start not
   timed, the Dataset's and the actors' start timed), on the same `--compare` images, `--rounds` times alternated;
   the medians, their ratio, and `score`'s CPU-ms per image by stage (decode tasks, the scoring actors); and the
   same ratio from each path's first results on (its start left out: `score`'s is Ray Data's and the actors').
2. The same images on two Ray nodes started on this machine (`ray.cluster_utils.Cluster`): how many images each node
   decoded and scored.
3. Peak memory of `python -m app.batch score` run as a user runs it (its own process and `ray.init()`), scoring
   `--small` and then `--large` images: what it holds of the machine (its processes' own pages plus the object store's
   pages), summed PSS and RSS, and PSS by kind of process, sampled every second. Streaming holds a bounded number of
   blocks, not the collection.

Writes benchmarks/results/<stamp>-<host>-batch-score.{json,md,png}.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray
import yaml
from ray.cluster_utils import Cluster

from app.batch.output import read_output
from app.batch.pipeline import Job, score
from app.batch.sizing import size_pool
from app.batch.sources import list_images
from app.config import AppArgs
from app.imaging.opencv import cv2
from app.runtime import RuntimeOptions, cpu_engine
from app.served_model import default_files
from app.served_model.graph import read_graph
from app.served_model.model_io import Preparation
from app.served_model.prologue import served_model
from app.toolchain.samples import available_photos, sample_bytes
from benchmarks.environment import REPO, RESULTS_DIR, host_name, print_environment, stamp
from benchmarks.procs import family
from benchmarks.report import markdown_table, pyplot, save_figure, write_report

BATCH = 32


def corpus(root: Path, n: int) -> Path:
    """`n` JPEGs under `root` (1,000 a folder): the sample photographs re-encoded at quality 90, hard-linked."""
    sources = []
    for name in available_photos():
        img = cv2.imdecode(np.frombuffer(sample_bytes(name), np.uint8), cv2.IMREAD_COLOR)
        if img is not None and img.ndim == 3:
            path = root / f"source-{name}.jpg"
            path.write_bytes(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes())
            sources.append(path)
    out = root / f"images-{n}"
    for i in range(n):
        target = out / f"{i // 1000:04d}" / f"{i:06d}.jpg"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(sources[i % len(sources)], target)
    return out


def config(cpu_engine_only: bool = True) -> tuple[dict[str, Any], AppArgs]:
    cfg = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    args = cfg["applications"][0]["args"]
    files = default_files(REPO / "models")
    args["variants"]["fp32"]["model_path"], args["variants"]["int8"]["model_path"] = str(files.fp32), str(files.int8)
    args["model"]["labels_path"] = str(files.labels)
    if cpu_engine_only:
        for v in args["variants"].values():
            v["engine"] = "cpu"
    return cfg, AppArgs.model_validate(copy.deepcopy(args))


def single_process(images: list[str], args: AppArgs) -> dict[str, Any]:
    """The report's path: one process, read and prepare with the Preprocessor's function, the CPU engine in batches."""
    started = time.perf_counter()
    cpu0 = time.process_time()
    fp32 = args.resolved_path(args.variants["fp32"].model_path)
    prepare = Preparation(args.model, read_graph(fp32))
    engine = cpu_engine(
        str(served_model(fp32, args.model.preprocess).path), RuntimeOptions(threads=os.cpu_count() or 1)
    )
    decode_s = infer_s = 0.0
    first = None
    for i in range(0, len(images), BATCH):
        t0 = time.perf_counter()
        x = prepare.pixels([Path(p).read_bytes() for p in images[i : i + BATCH]])
        t1 = time.perf_counter()
        engine.logits(x)
        decode_s, infer_s = decode_s + t1 - t0, infer_s + time.perf_counter() - t1
        first = first or time.perf_counter() - started
    seconds = time.perf_counter() - started
    return {
        "images": len(images),
        "seconds": round(seconds, 3),
        "images_per_s": round(len(images) / seconds, 2),
        "first_rows_s": round(first or 0.0, 3),
        "images_per_s_after_first": after_first(len(images), seconds, first or 0.0),
        "cpu_ms_per_image": round((time.process_time() - cpu0) * 1000 / len(images), 3),
        "wall_ms_per_image": {
            "decode": round(decode_s * 1000 / len(images), 3),
            "infer": round(infer_s * 1000 / len(images), 3),
        },
    }


def after_first(images: int, seconds: float, first_s: float) -> float:
    """img/s from the first results on: the start (the engine's; for `score` also Ray Data's and the actors') left
    out, in both paths alike (the first batch's images counted, a bias of 32 images of 4,000 to each)."""
    return round(images / (seconds - first_s), 2) if seconds > first_s else 0.0


def process_kind(pid: int, argv: list[str], driver: int) -> str:
    """Which part of the run a process is: the driver, the scoring actors, the decode workers, Ray Data's own actors,
    or Ray's daemons (GCS, raylet with the object store, dashboard and its agents)."""
    title = argv[0] if argv else ""
    if pid == driver:
        return "driver"
    if "Scorer" in title:
        return "scoring actors"
    if title.startswith(("ray::_", "ray::ActorLocationTracker")):
        return "Ray Data's actors"
    if title.startswith("ray::") and not title.startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent")):
        return "decode workers"
    return "Ray daemons"


def rollup(pid: int) -> dict[str, float]:
    """The process's RSS and PSS (MiB), and its PSS of anonymous, file-backed and shared-memory (the object store's)
    pages."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem"):
                out[key] = int(rest.split()[0]) / 1024
    return out


def shmem_mib() -> float:
    """The machine's shared-memory pages (MiB): where Ray's object store keeps its objects (a tmpfs file)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) / 1024
    return 0.0


class MemorySampler:
    """The memory of process `root` (a run's driver) and everything it started (Ray's GCS, raylet, workers), every
    second: summed RSS and PSS; and what the run holds of the machine, `in_use`: the processes' own pages (PSS of
    anonymous and file-backed pages) plus the object store's pages (the machine's shared memory above what it was
    before the run). PSS alone misses object-store pages no process maps any more, and splits the ones several map;
    RSS counts the shared ones in every process that touched them. Not more often than every second: reading the
    page tables of ~25 processes (several map the object store 7 GB wide) takes a visible share of 2 cores."""

    def __init__(self, root: int, every_s: float = 1.0) -> None:
        self.root, self.every_s = root, every_s
        self.shmem_before = shmem_mib()
        self.samples: list[tuple[float, float, float, float]] = []  # (perf_counter, RSS, PSS, in use), MiB
        self.kinds: list[dict[str, float]] = []  # PSS MiB by kind, one per sample
        self._stop = threading.Event()

    def _sample(self) -> None:
        rss = pss = own = 0.0
        kinds: dict[str, float] = {}
        for pid in family(self.root):
            with contextlib.suppress(psutil.Error, OSError):
                r = rollup(pid)
                rss, pss = rss + r["Rss"], pss + r["Pss"]
                own += r.get("Pss_Anon", 0.0) + r.get("Pss_File", 0.0)
                kind = process_kind(pid, psutil.Process(pid).cmdline(), self.root)
                kinds[kind] = kinds.get(kind, 0.0) + r["Pss"]
        store = max(0.0, shmem_mib() - self.shmem_before)
        self.samples.append((time.perf_counter(), rss, pss, own + store))
        self.kinds.append(dict(kinds) | {"object store pages": store})

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    @contextlib.contextmanager
    def sampling(self) -> Iterator[MemorySampler]:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()

    def peaks(self) -> dict[str, Any]:
        at = max(range(len(self.samples)), key=lambda i: self.samples[i][3])
        names = sorted({k for sample in self.kinds for k in sample})
        return {
            "peak_in_use_mib": round(self.samples[at][3], 1),
            "peak_pss_mib": round(max(s[2] for s in self.samples), 1),
            "peak_rss_mib": round(max(s[1] for s in self.samples), 1),
            "pss_at_peak_by_kind_mib": {k: round(self.kinds[at].get(k, 0.0), 1) for k in names},
            "peak_pss_by_kind_mib": {k: round(max(s.get(k, 0.0) for s in self.kinds), 1) for k in names},
        }


def score_command(images: Path, out: Path, config_path: Path) -> dict[str, Any]:
    """`python -m app.batch score` as a user runs it (its own `ray.init()`), its memory sampled from outside; the
    peaks, and the summary it printed."""
    argv = [sys.executable, "-m", "app.batch", "score", str(config_path), "--input", str(images), "--output", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, start_new_session=True, text=True)
    sampler = MemorySampler(proc.pid)
    with sampler.sampling():
        stdout, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}")
    summary = json.loads(stdout[stdout.index("\n{") + 1 :] if not stdout.startswith("{") else stdout)
    t0 = sampler.samples[0][0]
    return {
        **sampler.peaks(),
        "images_per_s": summary["images_per_s"],
        "seconds": summary["seconds"],
        "series": [(round(t - t0, 2), round(r, 1), round(q, 1), round(u, 1)) for t, r, q, u in sampler.samples],
    }


def median_by_rate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of the median img/s (the lower middle one of an even number)."""
    ordered = sorted(runs, key=lambda x: x["images_per_s"])
    return ordered[(len(ordered) - 1) // 2]


def run_score(images: Path, out: Path, cfg: dict[str, Any], args: AppArgs) -> dict[str, Any]:
    listed = list_images(str(images))
    nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    job = Job(args, ["fp32"], size_pool(nodes, cfg, args, ["fp32"]), 5)
    summary = score(listed, job, str(out))
    summary["images_per_s_after_first"] = after_first(
        summary["images"], summary["seconds"], summary["first_rows_s"] or 0.0
    )
    rows = read_output(str(out), ["decode_node", "score_node"]).to_pydict()
    summary["decoded_on"] = dict(Counter(rows["decode_node"]))
    summary["scored_on"] = dict(Counter(rows["score_node"]))
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compare", type=int, default=4000, help="images for the img/s comparison and the two-node run")
    p.add_argument("--rounds", type=int, default=5, help="single process, then score: this many times, alternated")
    p.add_argument("--small", type=int, default=2000, help="images of the first memory run")
    p.add_argument("--large", type=int, default=20000, help="images of the second memory run")
    p.add_argument("--memory-only", action="store_true", help="only the memory runs (3.)")
    p.add_argument("--speed-only", action="store_true", help="only the img/s runs (1. and 2.)")
    ns = p.parse_args(argv)
    env = print_environment()
    cfg, args = config()
    result: dict[str, Any] = {"environment": env, "config": "configs/local.yaml, variant fp32, engine cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        big = corpus(root, ns.compare if ns.speed_only else max(ns.compare, ns.small, ns.large))
        all_images = list_images(str(big)).paths
        compare = root / "compare"
        for i, path in enumerate(all_images[: ns.compare]):
            (compare / Path(path).parent.name).mkdir(parents=True, exist_ok=True)
            os.link(path, compare / Path(path).parent.name / f"{i:06d}.jpg")

        if not ns.memory_only:
            rounds = []
            for r in range(ns.rounds):  # alternated: a slow spell of this shared machine falls on both paths
                single = single_process(list_images(str(compare)).paths, args)
                ray.init(num_cpus=psutil.cpu_count(), log_to_driver=False)
                one = run_score(compare, root / f"out-one-{r}", cfg, args)
                ray.shutdown()
                ratio = round(one["images_per_s"] / single["images_per_s"], 3)
                print(f"round {r + 1}: single process {single}\n  score, one node {one}\n  ratio {ratio}", flush=True)
                rounds.append({"single_process": single, "score_one_node": one, "ratio": ratio})
            result["rounds"] = [
                {"single": x["single_process"]["images_per_s"], "score": x["score_one_node"]["images_per_s"]}
                | {"ratio": x["ratio"]}
                | {
                    "single_after_first": x["single_process"]["images_per_s_after_first"],
                    "score_after_first": x["score_one_node"]["images_per_s_after_first"],
                    "score_first_rows_s": x["score_one_node"]["first_rows_s"],
                }
                for x in rounds
            ]
            result["single_process"] = median_by_rate([x["single_process"] for x in rounds])
            result["score_one_node"] = median_by_rate([x["score_one_node"] for x in rounds])
            result["ratio_score_to_single"] = round(
                result["score_one_node"]["images_per_s"] / result["single_process"]["images_per_s"], 3
            )
            # The same from the first results on (each path's start left out): the medians of each path's rates.
            singles = sorted(x["single_after_first"] for x in result["rounds"])
            scores = sorted(x["score_after_first"] for x in result["rounds"])
            middle = (len(singles) - 1) // 2
            result["ratio_after_first"] = round(scores[middle] / singles[middle], 3)

            c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
            c.add_node(num_cpus=1)
            ray.init(address=c.address, log_to_driver=False)
            two = run_score(compare, root / "out-two", cfg, args)
            ray.shutdown()
            c.shutdown()
            print(f"score, two nodes: {two}", flush=True)
            result["score_two_nodes"] = two

        memory = {}
        config_path = root / "config.yaml"
        config_path.write_text(yaml.safe_dump(cfg))
        for n in () if ns.speed_only else (ns.small, ns.large):
            subset = root / f"subset-{n}"
            for i, path in enumerate(all_images[:n]):
                (subset / Path(path).parent.name).mkdir(parents=True, exist_ok=True)
                os.link(path, subset / Path(path).parent.name / f"{i:06d}.jpg")
            memory[str(n)] = score_command(subset, root / f"out-{n}", config_path)
            print(f"memory, {n} images: { ({k: v for k, v in memory[str(n)].items() if k != 'series'}) }", flush=True)
        result["memory"] = memory
    stem = RESULTS_DIR / f"{stamp()}-{host_name()}-batch-score"
    plot(result, Path(f"{stem}.png"))
    print(write_report(stem, result, to_markdown(result)))
    return 0


def to_markdown(r: dict[str, Any]) -> str:
    kinds = sorted({k for m in r["memory"].values() for k in m["pss_at_peak_by_kind_mib"]})
    lines = [f"# python -m app.batch score ({r['config']})", "", *speed_markdown(r)]
    if not r["memory"]:
        return "\n".join(lines) + "\n"
    lines += [
        markdown_table(
            ["images", "peak in use MiB", "peak PSS MiB (sum)", "peak RSS MiB (sum)", "img/s"],
            [
                [n, m["peak_in_use_mib"], m["peak_pss_mib"], m["peak_rss_mib"], m["images_per_s"]]
                for n, m in r["memory"].items()
            ],
            1,
        ),
        "",
        "PSS by kind of process, and the object store's pages, at each run's peak (MiB):",
        "",
        markdown_table(
            ["images", *kinds],
            [[n, *(m["pss_at_peak_by_kind_mib"].get(k, 0.0) for k in kinds)] for n, m in r["memory"].items()],
            1,
        ),
    ]
    return "\n".join(lines) + "\n"


def speed_markdown(r: dict[str, Any]) -> list[str]:
    """The img/s comparison and the two-node run (none after --memory-only)."""
    if "single_process" not in r:
        return []
    s, one, two = r["single_process"], r["score_one_node"], r["score_two_nodes"]
    per_round = ", ".join("{ratio:.3f}x ({score} / {single} img/s)".format(**x) for x in r["rounds"])
    rows = [["single process (report's path)", s["images"], s["images_per_s"], "-", "-"]]
    for name, x in (("score, one Ray node", one), ("score, two Ray nodes", two)):
        cpu = x["cpu_ms_per_image"]
        rows.append([name, x["images"], x["images_per_s"], cpu["decode"], cpu["infer_fp32"]])
    return [
        markdown_table(["path", "images", "img/s", "decode CPU-ms/img", "infer CPU-ms/img"], rows, 2),
        "",
        f"score / single process (medians of {len(r['rounds'])} alternated rounds): {r['ratio_score_to_single']:.3f}x; "
        f"per round: {per_round}",
        "",
        f"From the first results on (each path's start left out; `score`'s first rows after "
        f"{', '.join(str(x['score_first_rows_s']) for x in r['rounds'])} s): "
        f"{r['ratio_after_first']:.3f}x ({', '.join(str(x['score_after_first']) for x in r['rounds'])} / "
        f"{', '.join(str(x['single_after_first']) for x in r['rounds'])} img/s)",
        "",
        f"Two nodes: decoded {two['decoded_on']}, scored {two['scored_on']}",
        "",
    ]


def plot(r: dict[str, Any], out: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    if "single_process" in r:
        names = ["single process", "score, 1 node", "score, 2 nodes"]
        runs = (r["single_process"], r["score_one_node"], r["score_two_nodes"])
        left.bar(names, [x["images_per_s"] for x in runs], color=["#888888", "#1f77b4", "#2ca02c"])
        left.set_ylabel("images/s")
        left.set_title("img/s, FP32 on the CPU EP")
    for n, m in r["memory"].items():
        t = [s[0] for s in m["series"]]
        right.plot(t, [s[3] for s in m["series"]], label=f"{n} images (in use)")
    right.set_xlabel("s")
    right.set_ylabel("MiB in use: processes + object store")
    right.set_title("memory while scoring")
    if r["memory"]:
        right.legend()
    save_figure(fig, out)


if __name__ == "__main__":
    raise SystemExit(main())
