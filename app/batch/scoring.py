"""The variants' engines in a Ray Data actor: each opened and gated as a Classifier replica of one parallel batch opens
and gates its own (`app.runtime.open_variant`: the declaration checked against the graph, `runtime_options` and the
declared fallback, `open_engine`, the engine prepared for the batch size; then the speed gate), so a node runs here
what it would serve: TensorRT or CUDA where the actor was granted a GPU, OpenVINO or ONNX Runtime's CPU EP on a CPU.
One output row per image and variant."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from app.config import AppArgs
from app.runtime import Engine, ModelLoadError, threads_for, top_k
from app.runtime.model_files import ModelFiles
from app.runtime.open_variant import gate_failure, gate_variant, open_variant
from app.runtime.select import model_sha256
from app.served_model.model_io import ModelIO

# The Parquet file's columns, in order (docs/batch.md describes each).
SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("variant", pa.string()),
        ("class_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.string())),
        ("scores", pa.list_(pa.float32())),
        ("model_sha256", pa.string()),
        ("declaration", pa.string()),
        ("engine", pa.string()),
        ("decode_node", pa.string()),
        ("score_node", pa.string()),
        ("error_code", pa.string()),
        ("error_message", pa.string()),
        ("decode_cpu_ms", pa.float64()),
        ("infer_cpu_ms", pa.float64()),
        ("speed_gate", pa.string()),
    ]
)


@dataclass
class Served:
    """One variant as this actor runs it: its engine, the I/O of the file that serves (the fallback's where it
    serves), and what every row of it says about the model and the speed gate."""

    variant: str
    engine: Engine
    io: ModelIO
    sha256: str
    engine_name: str
    speed_gate: str | None = None  # the gate's verdict (None: no gate applies to the variant)


def serve_variant(args: AppArgs, variant: str, gpu: bool, threads: int, batch_size: int) -> Served:
    """`variant`'s engine as a Classifier replica of one parallel batch would open it here, and its speed gate's
    verdict, judged as that replica judges it: RuntimeError naming the variant when no engine opens, or when the
    gate has `action: fail` and fails."""
    name = f"batch {variant}"
    try:
        o = open_variant(args, variant, gpu, threads, 1, batch_size, name=name)
    except ModelLoadError as e:
        raise RuntimeError(f"{name}: {e}") from e
    engine = o.opened.engine
    try:  # the verdict logged as a replica logs it (run_speed_gate, on the "ray.serve" logger: the actor's log)
        verdict = gate_variant(args, variant, engine, gpu, threads, 1, batch_size)
        if (failure := gate_failure(verdict)) is not None:
            raise RuntimeError(f"{name}: {failure}")
    except BaseException:
        engine.close()
        raise
    sha256 = model_sha256(str(o.io.served.source), 0)
    return Served(variant, engine, o.io, sha256, engine.name, verdict.message if verdict is not None else None)


class Scorer:
    """A Ray Data callable class: decoded batches in, one row per image and variant out (SCHEMA)."""

    def __init__(
        self, args: dict[str, Any], variants: list[str], top: int, batch_size: int, threads: int, declaration: str
    ) -> None:
        """`args` with absolute paths (Job.portable_args); `declaration`: args.model as the config says it, JSON. Remote
        files are fetched into this node's model cache and held while the actor scores."""
        declared = AppArgs.model_validate(args)
        self.files = ModelFiles.for_node(declared).local_all(declared, variants)
        self.args = self.files.args
        gpu = bool(ray.get_gpu_ids())
        assigned = float(ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0))
        threads = threads or self.args.intra_op_threads or threads_for(assigned)
        self.top = top
        self.node = ray.get_runtime_context().get_node_id()
        self.declaration = declaration
        self.served = [serve_variant(self.args, v, gpu, threads, batch_size) for v in variants]

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        codes = [str(c) for c in batch["error_code"]]
        good = [i for i, c in enumerate(codes) if not c]
        columns: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
        # The decoded images, once for every variant (the whole batch as given, a view, when none failed).
        pixels = batch["pixels"] if len(good) == len(codes) else batch["pixels"][good]
        for s in self.served:
            started = time.process_time()
            best = self._top(s, pixels) if good else []
            share = (time.process_time() - started) * 1000.0 / max(1, len(good))
            found = dict(zip(good, best, strict=True))
            for i, path in enumerate(batch["path"]):
                picked = found.get(i)
                columns["path"].append(str(path))
                columns["variant"].append(s.variant)
                columns["class_ids"].append([c for c, _ in picked] if picked is not None else None)
                columns["labels"].append([s.io.labels[c] for c, _ in picked] if picked is not None else None)
                columns["scores"].append([p for _, p in picked] if picked is not None else None)
                columns["model_sha256"].append(s.sha256)
                columns["declaration"].append(self.declaration)
                columns["engine"].append(s.engine_name)
                columns["decode_node"].append(str(batch["decode_node"][i]))
                columns["score_node"].append(self.node)
                columns["error_code"].append(codes[i] or None)
                columns["error_message"].append(str(batch["error_message"][i]) or None)
                columns["decode_cpu_ms"].append(float(batch["decode_cpu_ms"][i]))
                columns["infer_cpu_ms"].append(share if picked is not None else 0.0)
                columns["speed_gate"].append(s.speed_gate)
        return pa.Table.from_pydict(columns, schema=SCHEMA)

    def _top(self, s: Served, pixels: np.ndarray) -> list[list[tuple[int, float]]]:
        array = s.io.checked(np.ascontiguousarray(pixels, dtype=np.uint8))
        return [top_k(row, self.top) for row in s.io.probabilities(s.engine.logits(array))]
