"""A variant opened and gated as a Classifier replica opens and gates it (app/runtime/open_variant.py), the code the
Classifier and the batch scoring actors share: on ONNX Runtime's CPU EP with the real model files, no Ray. The GPU node
without TensorRT where the declared fallback serves is stood in as in tests/test_fallback_unit.py (`cuda_node`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.config import AppArgs
from app.config.speed_gate import SpeedGateVerdict
from app.runtime import open_variant as ov
from app.runtime import select
from app.runtime.fallback import Build
from app.runtime.open_variant import gate_failure, gate_variant, open_variant
from app.runtime.ort_engine import OrtEngine
from app.runtime.plan import EngineChoice, RuntimeOptions
from app.runtime.spec import ModelLoadError
from app.runtime.variants import fallback_options, runtime_options
from app.served_model import ModelFiles
from tests.conftest import local_config
from tests.test_fallback_unit import cuda_node, fp16_file  # noqa: F401 - fixtures


def app_args(model_files: ModelFiles, engine: str = "cpu", **changes: Any) -> AppArgs:
    """configs/local.yaml's args on the real model files, every variant on `engine`, with `changes`."""
    raw = local_config(model_files)["applications"][0]["args"]
    for v in raw["variants"].values():
        v["engine"] = engine
    return AppArgs.model_validate(raw | changes)


def with_fallback(model_files: ModelFiles, fp16: Path) -> AppArgs:
    """The INT8 variant declaring its FP16 fallback, on a node that uses its GPU when granted one (prod.yaml's)."""
    args = app_args(model_files, engine="auto", device="auto").model_dump(mode="json")
    args["variants"]["int8"]["fallback"] = {"precision": "fp16", "model_path": str(fp16)}
    return AppArgs.model_validate(args)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every engine select.build makes (stood in or not), to see which were closed."""
    engines: list[Any] = []
    real = select.build

    def build(path: str, opts: RuntimeOptions, choice: EngineChoice) -> Any:
        engines.append(real(path, opts, choice))
        return engines[-1]

    monkeypatch.setattr(select, "build", build)
    return engines


# --------------------------------------------------------------------------- opening


def test_a_variant_opens_on_its_own_file_with_the_replicas_options(model_files: ModelFiles) -> None:
    args = app_args(model_files)
    o = open_variant(args, "int8", gpu=False, threads=1, streams=1, max_batch=2)
    try:
        assert o.opened.engine.name == "cpu" and o.opened.serving is None and o.fallback is None
        assert o.io.served.source == model_files.int8 and o.opened.engine.path == o.io.served.path
        assert o.opts == runtime_options(args, "int8", False, 1, 1)
        logits = o.opened.engine.logits(o.io.checked(o.opened.engine.dummy_batch(2)))
        assert logits.shape == (2, len(o.io.labels)) and np.isfinite(logits).all()
    finally:
        o.opened.engine.close()


def test_the_declared_files_io_is_taken_as_given_or_read_naming_the_opener(
    model_files: ModelFiles, tmp_path: Path
) -> None:
    args = app_args(model_files)
    o = open_variant(args, "fp32", False, 1, 1, 2)
    again = open_variant(args, "fp32", False, 1, 1, 2, requested=o.io)  # the Classifier's: read in its constructor
    assert again.io is o.io
    for opened in (o, again):
        opened.opened.engine.close()
    gone = app_args(model_files).model_dump(mode="json")
    gone["variants"]["int8"]["model_path"] = str(tmp_path / "gone-int8.onnx")
    missing = AppArgs.model_validate(gone)
    with pytest.raises(ValueError, match=r"^Classifier_int8: variants\.int8\.model_path: model file not found: "):
        open_variant(missing, "int8", False, 1, 1, 2)
    with pytest.raises(ValueError, match=r"^batch int8: variants\.int8\.model_path: model file not found: "):
        open_variant(missing, "int8", False, 1, 1, 2, name="batch int8")


def test_where_the_int8_build_needs_tensorrt_the_declared_fallback_serves(
    model_files: ModelFiles,
    fp16_file: Path,  # noqa: F811
    cuda_node: list[EngineChoice],  # noqa: F811
) -> None:
    args = with_fallback(model_files, fp16_file)
    o = open_variant(args, "int8", gpu=True, threads=1, streams=1, max_batch=2)
    try:
        serving = o.opened.serving
        assert serving is not None and serving.requested_precision == "int8" and serving.precision == "fp16"
        declared = fallback_options(args, "int8", True, 1, 1)
        assert declared is not None and o.opts == declared[1] and o.opts.precision == "fp16"
        assert o.io.served.source == fp16_file and o.opened.engine.path == o.io.served.path  # the fallback's I/O
        assert o.fallback == Build(str(o.io.served.path), o.opts)
    finally:
        o.opened.engine.close()


def test_a_fallback_that_fails_the_declaration_is_refused_only_where_it_would_serve(
    model_files: ModelFiles,
    fp16_file: Path,  # noqa: F811
    cuda_node: list[EngineChoice],  # noqa: F811
    built: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read = ov.model_io

    def refusing(model: Any, path: Path, where: str) -> Any:  # the FP16 file stands for one of another model
        if Path(path) == fp16_file:
            raise ValueError(f"{where}: the graph has 10 classes, the declaration 1000")
        return read(model, path, where)

    monkeypatch.setattr(ov, "model_io", refusing)
    args = with_fallback(model_files, fp16_file)
    on_cpu = open_variant(args, "int8", gpu=False, threads=1, streams=1, max_batch=2)  # INT8 serves: never needed
    assert on_cpu.opened.serving is None and on_cpu.io.served.source == model_files.int8
    declared = fallback_options(args, "int8", False, 1, 1)
    assert declared is not None and on_cpu.fallback == Build(str(fp16_file), declared[1])
    on_cpu.opened.engine.close()
    built.clear()
    with pytest.raises(ModelLoadError) as refused:
        open_variant(args, "int8", gpu=True, threads=1, streams=1, max_batch=2)
    message = str(refused.value)
    assert message.startswith("Classifier_int8: int8 requested, fp16 serving: TensorRT not loadable: ")
    assert message.endswith(", but Classifier_int8: variants.int8.fallback.model_path: the graph has 10 classes, the "
                            "declaration 1000")  # fmt: skip
    assert [e.path for e in built] == [fp16_file] and not built[0].alive  # the fallback's engine opened, then closed


def test_an_engine_that_fails_after_its_open_is_closed(
    model_files: ModelFiles, built: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def prepare(self: OrtEngine, max_batch: int) -> None:
        raise RuntimeError("CUDA graph capture failed")

    monkeypatch.setattr(OrtEngine, "prepare", prepare)
    with pytest.raises(RuntimeError, match="CUDA graph capture failed"):
        open_variant(app_args(model_files), "fp32", False, 1, 1, 2)
    assert len(built) == 1 and not built[0].alive


# --------------------------------------------------------------------------- the speed gate


def test_no_verdict_for_the_baseline_nor_without_a_gate(model_files: ModelFiles) -> None:
    args = app_args(model_files)
    o = open_variant(args, "fp32", False, 1, 1, 2)
    try:
        assert gate_variant(args, "fp32", o.opened.engine, False, 1, 1, 2) is None  # fp32 is the baseline
        ungated = args.model_copy(update={"speed_gate": None})
        assert gate_variant(ungated, "int8", o.opened.engine, False, 1, 1, 2) is None
    finally:
        o.opened.engine.close()


def test_the_gate_times_the_variant_beside_its_baseline_on_this_node(model_files: ModelFiles) -> None:
    """Gates any measurement passes (a speed-up above ~0) and none does (1e9x): verdicts that hold on any machine."""
    o = open_variant(app_args(model_files), "int8", False, 1, 1, 2)
    try:
        for min_speedup, action, passed in ((1e-9, "fail", True), (1e9, "warn", False), (1e9, "fail", False)):
            gate = {"baseline": "fp32", "min_speedup": min_speedup, "action": action}
            verdict = gate_variant(app_args(model_files, speed_gate=gate), "int8", o.opened.engine, False, 1, 1, 2)
            assert verdict is not None and verdict.passed is passed and verdict.action == action
            assert (verdict.variant, verdict.baseline, verdict.batch) == ("int8", "fp32", 2)
            assert verdict.variant_img_per_s > 0 and verdict.baseline_img_per_s > 0
            failing = action == "fail" and not passed
            assert gate_failure(verdict) == (f"{verdict.message} (speed_gate.action: fail)" if failing else None)
    finally:
        o.opened.engine.close()


def test_only_a_failed_gate_with_action_fail_is_a_failure() -> None:
    def verdict(passed: bool, action: Any) -> SpeedGateVerdict:
        return SpeedGateVerdict(
            variant="int8", baseline="fp32", batch=8, variant_img_per_s=1.0, baseline_img_per_s=1.0, speedup=1.0,
            min_speedup=1.2, action=action, passed=passed, message="speed gate: ...",
        )  # fmt: skip

    assert gate_failure(None) is None
    assert gate_failure(verdict(True, "fail")) is None and gate_failure(verdict(False, "warn")) is None
    assert gate_failure(verdict(False, "fail")) == "speed gate: ... (speed_gate.action: fail)"
