"""What travels between deployments: the Preprocessor's pixels and the Classifier's scores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.errors import ServiceError


@dataclass
class Pixels:
    """What the Preprocessor hands the Classifier: uint8 [N, H, W, C] as the model declares, and where its time went."""

    array: np.ndarray
    preprocess_ms: float
    errors: dict[int, ServiceError]  # per-image failures of a multi-image request, by position
    positions: list[int]  # positions of array rows in the original request


@dataclass
class Scores:
    """The Classifier's answer for one request: top-k per image and the batch it rode in."""

    top: list[list[tuple[int, float]]]  # per row: (class_id, probability), best first
    preprocess_ms: float
    queue_ms: float
    inference_ms: float
    batch_size: int
    variant: str
    provider: str
    errors: dict[int, ServiceError]
    positions: list[int]
    logits: np.ndarray | None = None  # [N, classes] when the caller asked for full outputs (V2 protocol)


@dataclass
class Encoded:
    """What the Router hands a Classifier with `decode_in: gpu`: the encoded images of a request (or of a group the
    Router coalesced), header-checked at the Router, decoded in the Classifier's batch (`app.runtime.gpu_pixels`).

    `wall_deadline`: when the caller stops waiting, as `time.time()`; an image not decoded by then is not started."""

    images: list[bytes]
    wall_deadline: float | None = None
