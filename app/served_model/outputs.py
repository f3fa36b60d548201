"""What the logits mean: probabilities and the best classes, written once for every caller."""

from __future__ import annotations

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of [N, classes] (or one row), numerically stable; `logits` is left untouched."""
    z = logits - logits.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def probabilities(scores: np.ndarray, output: str) -> np.ndarray:
    """A model's output rows as probabilities: softmax of `logits`, or `probabilities` rows as they are."""
    return softmax(scores) if output == "logits" else np.asarray(scores, dtype=np.float32)


def top_k(probs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most probable (class id, probability) of one row, best first."""
    k = min(k, probs.shape[-1])
    idx = np.argpartition(-probs, k - 1)[:k]
    idx = idx[np.argsort(-probs[idx])]
    return [(int(i), float(probs[i])) for i in idx]
