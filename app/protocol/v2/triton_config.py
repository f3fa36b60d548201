"""Triton's model-configuration extension: `GET /v2/models/{name}/config` as a Triton model config would say it.

Triton's tools read it before they send anything: perf_analyzer takes `max_batch_size` (a request's batch
dimension), the inputs' `optional` flags and the scheduler (`dynamic_batching`) from here, and the tensor
shapes from the model metadata (`app.protocol.v2.model_metadata`). The fields are those of Triton's `ModelConfig`
message (model_config.proto) in its JSON form, so the same dict converts to the gRPC message as is.

Both inputs are `optional`: a request carries exactly one of them, which is how Triton says "either".
`image_bytes` is `dims [1]` reshaped to `[]`: Triton's way of saying a batched request is `[N]` or
`[N, 1]`, and this service takes both. `image`'s dims and the outputs' class count come from the model's
graph; the graph's own input (its name, data type, layout, dims) is in `parameters`, beside what the
service does between the two (`preprocess`, `prologue`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.protocol import v2

CONFIG_PLATFORM = "onnxruntime_onnx"  # what Triton's own config calls an ONNX Runtime model


def model_config(
    name: str,
    model_spec: Mapping[str, Any],
    num_classes: int | None,
    max_request_images: int,
    described: Mapping[str, Any],
) -> dict[str, Any]:
    """The Triton-style configuration of one V2 model.

    model_spec: a Classifier's `describe()["input"]`; described: that Classifier's whole `describe()` (its
    batching and execution provider); max_request_images: `Limits.max_batch_files`, the most images one
    request may carry, which is what Triton's `max_batch_size` bounds.
    """
    h, w, channels = v2.image_shape(model_spec)
    c = num_classes if num_classes and num_classes > 0 else -1
    batching = described.get("batching") or {}
    config: dict[str, Any] = {
        "name": name,
        "platform": CONFIG_PLATFORM,
        "backend": "onnxruntime",
        "max_batch_size": max_request_images,
        "input": [
            {
                "name": v2.IMAGE_BYTES_INPUT,
                "data_type": "TYPE_STRING",
                "dims": [1],
                "reshape": {"shape": []},
                "optional": True,
            },
            {
                "name": v2.IMAGE_INPUT,
                "data_type": "TYPE_UINT8",
                "format": "FORMAT_NHWC",
                "dims": [h, w, channels],
                "optional": True,
            },
        ],
        "output": [
            {"name": v2.LOGITS, "data_type": "TYPE_FP32", "dims": [c]},
            {"name": v2.PROBABILITIES, "data_type": "TYPE_FP32", "dims": [c]},
            {"name": v2.TOP_K, "data_type": "TYPE_STRING", "dims": [-1]},
        ],
        "parameters": {
            k: {"string_value": str(described[k])}
            for k in ("model", "variant", "precision", "execution_provider")
            if described.get(k) is not None
        }
        | _graph_parameters(model_spec),
    }
    if batching.get("max_batch_size"):
        config["dynamic_batching"] = {
            "preferred_batch_size": [int(batching["max_batch_size"])],
            "max_queue_delay_microseconds": int(float(batching.get("batch_wait_timeout_s") or 0) * 1e6),
        }
    return config


def _graph_parameters(model_spec: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The graph's own input and what lies between `image` and it, as Triton's string parameters."""
    graph = (model_spec.get("graph") or {}).get("input")
    if not isinstance(graph, Mapping):
        return {}
    dims = ",".join(str(d) for d in graph.get("shape", [])[1:])
    out = {"graph_input": f"{graph.get('name')} {graph.get('dtype')} {graph.get('layout')} [{dims}]"}
    transform = model_spec.get("transform")
    if isinstance(transform, Mapping):
        out["preprocess"] = ", ".join(f"{k}={v}" for k, v in transform.items())
    prologue = model_spec.get("prologue")
    if isinstance(prologue, Mapping):
        out["prologue"] = " > ".join(prologue.get("steps") or []) or "none"
    return {k: {"string_value": v} for k, v in out.items()}
