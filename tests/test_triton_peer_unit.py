"""benchmarks/baselines/triton_peer.py's pure helpers, without PyTriton (the peer itself runs in .venv-triton)."""

from __future__ import annotations

import sys
from importlib import metadata

from benchmarks.baselines import triton_peer


def test_the_module_imports_without_pytriton() -> None:
    assert "pytriton" not in sys.modules


def test_the_labels_file_goes_on_the_top_k_output_only() -> None:
    config = {"input": [{"name": "image_bytes"}], "output": [{"name": "top_k"}, {"name": "other"}]}
    out = triton_peer.with_labels(config)["output"]
    assert out == [{"name": "top_k", "label_filename": triton_peer.LABELS_FILE}, {"name": "other"}]


def test_pins_follow_this_venv_and_fall_back_to_the_bare_name() -> None:
    assert triton_peer.pinned("numpy") == f"numpy=={metadata.version('numpy')}"
    assert triton_peer.pinned("onnxruntime", "no-such-dist-x", "numpy") == f"onnxruntime=={metadata.version('numpy')}"
    assert triton_peer.pinned("no-such-dist-x") == "no-such-dist-x"
