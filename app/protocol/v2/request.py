"""A parsed inference request: the input it carries and the outputs its response must have. `parsing` builds
it from the request's JSON and binary tensor data; `encoding` answers it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.protocol.v2.names import LOGITS, PROBABILITIES, TOP_K


@dataclass(frozen=True)
class RequestedOutput:
    """One output the response must carry."""

    name: str
    binary: bool = False  # binary tensor data extension: raw bytes after the JSON header
    class_count: int = 0  # > 0: Triton classification, BYTES [N, class_count] "score:index:label"


@dataclass
class InferRequest:
    """A parsed, checked POST /v2/models/{name}/infer body."""

    id: str | None
    input_name: str  # IMAGE_BYTES_INPUT or IMAGE_INPUT
    outputs: tuple[RequestedOutput, ...]
    top_k: int  # k of the top_k output when it has no classification count
    images: list[bytes] | None = None  # image_bytes: encoded files, for Preprocessor.many
    pixels: np.ndarray | None = None  # image: uint8 [N, H, W, C] (read-only), for the Classifier as is
    parameters: dict[str, Any] = field(default_factory=dict)  # the request's own parameters, unchecked extras

    @property
    def batch_size(self) -> int:
        if self.images is not None:
            return len(self.images)
        assert self.pixels is not None
        return int(self.pixels.shape[0])

    @property
    def binary_outputs(self) -> set[str]:
        return {o.name for o in self.outputs if o.binary}

    def k_of(self, output: RequestedOutput) -> int:
        """How many classes a top-k style output carries (0: a full tensor)."""
        if output.class_count:
            return output.class_count
        return self.top_k if output.name == TOP_K else 0

    @property
    def needs_logits(self) -> bool:
        """The Classifier must return the logits rows (an output is logits, full or classified)."""
        return any(o.name == LOGITS for o in self.outputs)

    @property
    def needs_probabilities(self) -> bool:
        """The Classifier must return full probability rows (top-k lists are not enough)."""
        return any(o.name == PROBABILITIES and not o.class_count for o in self.outputs)

    @property
    def max_k(self) -> int:
        """The largest top-k of probabilities any output needs: ask the Classifier for this top_k."""
        ks = [self.k_of(o) for o in self.outputs if o.name != LOGITS]
        return max([k for k in ks if k] or [self.top_k])
