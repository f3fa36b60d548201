"""What an image costs in CPU: the work alone (decode + inference, measured in this process) and a server's whole
serving path (every process of the target, read from the kernel around a load step).

The work alone is the floor every server pays: `floor()` decodes the benchmark corpus with the app's own
`preprocess` and runs the FP32 model on ONNX Runtime's CPU EP, one intra-op thread, no spinning, at batch 1 and
at batch 16, timing this process's CPU. The machine's ceiling is measured, not derived: one process per usable
core decoding and inferring batches of 16 at once (cores that share caches or a physical core run slower together
than one alone). A target's CPU per image minus the floor is what its serving path adds: HTTP,
parsing, queues, copies, handles, metrics; the figure that decides how many CPU cores a GPU needs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import psutil

from app.imaging.preprocess import preprocess
from app.runtime import OrtEngine, RuntimeOptions, onnxruntime_engine
from app.served_model import builtin_transform, default_files
from benchmarks.corpus import build_corpus
from benchmarks.environment import usable_cores

SERVED = builtin_transform()  # the built-in model's declared transform: what the app's decode does

BATCHES = (1, 16)


def cpu_ms(fn: Callable[[], Any], at_least_s: float = 1.0) -> float:
    """CPU ms of this process per call of fn: calls repeated until `at_least_s` of CPU (3 at least), one dropped."""
    fn()
    calls, t0 = 0, time.process_time()
    while (spent := time.process_time() - t0) < at_least_s or calls < 3:
        fn()
        calls += 1
    return spent * 1000 / calls


def _work_parts() -> tuple[list[bytes], OrtEngine]:
    """The corpus's encoded images, and the FP32 model on ORT's CPU EP with one thread (as a Classifier's batch)."""
    corpus = [im.data for im in build_corpus()]
    return corpus, onnxruntime_engine(default_files().fp32, RuntimeOptions(threads=1, prefer_gpu=False))


def _work(batch: int, start_at: float, seconds: float) -> int:
    """Decode + FP32 inference in batches of `batch`, from `start_at` (time.time) for `seconds`: images done."""
    corpus, engine = _work_parts()
    engine.logits(np.stack([preprocess(data, SERVED) for data in corpus[:batch]]))  # warm
    done, i = 0, 0
    while (now := time.time()) < start_at + seconds:
        engine.logits(np.stack([preprocess(corpus[(i + j) % len(corpus)], SERVED) for j in range(batch)]))
        i += batch
        done += batch if now >= start_at else 0
    return done


def ceiling(seconds: float = 4.0, batch: int = 16) -> float:
    """Images/s of the work alone with every usable core busy: one process per core, each decoding and inferring
    batches of `batch` (one thread, as the app's Classifier), over the same window."""
    cores = usable_cores()
    with ProcessPoolExecutor(cores, mp_context=multiprocessing.get_context("spawn")) as pool:
        start_at = time.time() + 15.0  # every process loaded and warm by then
        done = sum(pool.map(_work, [batch] * cores, [start_at] * cores, [seconds] * cores))
    return done / seconds


def floor(at_least_s: float = 1.0, ceiling_s: float = 4.0) -> dict[str, Any]:
    """CPU ms per image of the decode and of FP32 inference (batch 1 and 16), and the machine's ceiling."""
    corpus, engine = _work_parts()
    decode_ms = cpu_ms(lambda: [preprocess(data, SERVED) for data in corpus], at_least_s) / len(corpus)
    pixels = np.stack([preprocess(data, SERVED) for data in corpus[: max(BATCHES)]])
    infer_ms = {n: cpu_ms(lambda n=n: engine.logits(pixels[:n]), at_least_s) / n for n in BATCHES}
    per_image = decode_ms + infer_ms[16]
    cores = usable_cores()
    return {
        "decode_ms": round(decode_ms, 3),
        "infer_ms": {f"batch_{n}": round(ms, 3) for n, ms in infer_ms.items()},
        "work_ms_per_image": round(per_image, 3),
        "cores": cores,
        "ideal_images_per_s": round(cores * 1000 / per_image, 1),
        "ceiling_images_per_s": round(ceiling(ceiling_s), 1),
        "how": "this process's CPU time: the app's preprocess over the corpus; FP32 on the ORT CPU EP, 1 thread; "
        "the ceiling: one such process per core at once, batches of 16",
    }


def process_cpu_s(p: psutil.Process) -> float:
    """User + system CPU seconds of one process so far, its reaped children's included (psutil.Error if gone)."""
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def tree_cpu_s(pids: Iterable[int]) -> float:
    """process_cpu_s of these processes, summed (those gone count nothing)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += process_cpu_s(psutil.Process(pid))
    return total


def per_image(step: dict[str, Any], work_ms: float | None) -> dict[str, Any]:
    """A step's server CPU ms per image served, what the serving path adds over the work alone, and the load
    generator's CPU ms per image."""
    images = (step.get("images_per_s") or 0) * step.get("window_s", 0)
    if not images or step.get("server_cpu_s") is None:
        return {}
    ms, client = step["server_cpu_s"] * 1000 / images, step.get("client_cpu_s")
    return {
        "cpu_ms_per_image": round(ms, 2),
        "path_ms_per_image": None if work_ms is None else round(ms - work_ms, 2),
        "client_ms_per_image": None if client is None else round(client * 1000 / images, 2),
    }
