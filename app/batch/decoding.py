"""Image files -> the model's pixels, in Ray Data's CPU tasks, with the serving path's own code: the Preprocessor's
`preprocess`, whose first step is the Router's header pre-check (`check_header`), under the config's Limits. A file that
cannot be used is a row with the error code `/v1/classify` answers for it (`app.errors`), never a failed task.

No Ray here: `decode_batch` is a plain function over a batch of paths (Ray Data calls it in its tasks)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from app.batch.sources import filesystem
from app.config import Limits
from app.errors import ServiceError
from app.imaging.preprocess import preprocess
from app.imaging.transform import Transform


def read_file(uri: str, max_bytes: int) -> bytes:
    """The file's bytes; payload_too_large beyond `max_bytes` (the API's body limit: such a body never reaches a
    decoder), missing_file when it cannot be opened."""
    try:
        fs, path = filesystem(uri)
        size = fs.get_file_info(path).size
        if size is not None and size > max_bytes:
            raise ServiceError("payload_too_large", f"the file is {size} bytes; the limit is {max_bytes}")
        with fs.open_input_stream(path) as f:
            return bytes(f.read())
    except OSError as e:
        raise ServiceError("missing_file", f"cannot read {uri}: {e}") from None


def decode_one(data: bytes, transform: Transform, limits: Limits) -> np.ndarray:
    """One image as the service decodes it: `preprocess` with the same limits, whose own first step is the header
    check (`check_header`, with the same pixel limit, decode target and budget the Router's pre-check uses)."""
    return preprocess(data, transform, limits.max_pixels, True, limits.max_decode_bytes)


def decode_batch(batch: dict[str, np.ndarray], transform: dict[str, Any], limits: dict[str, Any]) -> dict[str, Any]:
    """{"path"} -> {"path", "pixels" uint8 [N, H, W, C] (zeros where an image failed), "error_code", "error_message"
    ("" where none), "decode_cpu_ms"}: the CPU time each image took here."""
    t, lim = Transform.from_dict(transform), Limits.model_validate(limits)
    paths = [str(p) for p in batch["path"]]
    pixels = np.zeros((len(paths), *t.shape), np.uint8)
    codes, messages, cpu_ms = [""] * len(paths), [""] * len(paths), np.zeros(len(paths), np.float64)
    for i, uri in enumerate(paths):
        started = time.thread_time()
        try:
            pixels[i] = decode_one(read_file(uri, lim.max_body_bytes), t, lim)
        except ServiceError as e:
            codes[i], messages[i] = e.code, e.message
        cpu_ms[i] = (time.thread_time() - started) * 1000.0
    return {
        "path": np.array(paths, dtype=object),
        "pixels": pixels,
        "error_code": np.array(codes, dtype=object),
        "error_message": np.array(messages, dtype=object),
        "decode_cpu_ms": cpu_ms,
    }
