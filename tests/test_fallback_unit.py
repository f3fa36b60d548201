"""A variant's declared fallback (app/runtime/fallback.py): planned, opened and reported in place of an INT8 build
that needs TensorRT where TensorRT is not. No Ray.

This machine has onnxruntime-gpu's providers built in but neither a CUDA device nor TensorRT's libraries: the CUDA
EP's usability is stood in for (`usable_providers`), and so is the engine a CUDA device would build (`build`, an
ONNX Runtime CPU EP session on the same file). TensorRT's absence is this machine's own: its libraries really are
missing, so the reason the fallback reports is the one a stock Ray GPU image would give.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from app.config import AppArgs
from app.runtime import select
from app.runtime.cli import main as plan_main
from app.runtime.fallback import Build, NeedsTensorRT, tensorrt_absence, tensorrt_failed
from app.runtime.ort_engine import OrtEngine
from app.runtime.plan import CPU, CUDA, TENSORRT, EngineChoice, RuntimeOptions, cpu_choice
from app.runtime.spec import ModelLoadError
from app.runtime.variants import fallback_options
from app.served_model import BUILTIN_MODEL, ModelFiles
from tests.conftest import REPO


@pytest.fixture
def fp16_file(model_files: ModelFiles) -> Path:
    """The FP16 build of the FP32 model (what `make models` writes), built here when missing."""
    if not model_files.fp16.is_file():
        from app.toolchain.fp16 import convert

        convert(model_files.fp32, model_files.fp16)
    return model_files.fp16


@pytest.fixture
def cuda_node(monkeypatch: pytest.MonkeyPatch) -> list[EngineChoice]:
    """A GPU node without TensorRT, stood in: the CUDA EP usable, every engine built on the CPU EP. Returns the
    choices the server asked to build."""
    asked: list[EngineChoice] = []
    monkeypatch.setattr(select, "usable_providers", lambda: [CUDA, CPU])

    def build(path: str, opts: RuntimeOptions, choice: EngineChoice) -> OrtEngine:
        asked.append(choice)
        return OrtEngine(path, opts, cpu_choice())

    monkeypatch.setattr(select, "build", build)
    return asked


def gpu_opts(precision: str) -> RuntimeOptions:
    return RuntimeOptions(prefer_gpu=True, precision=precision)


# --------------------------------------------------------------------------- opening an engine


def test_int8_without_tensorrt_serves_its_fallback_and_says_why(
    model_files: ModelFiles, fp16_file: Path, cuda_node: list[EngineChoice], caplog: pytest.LogCaptureFixture
) -> None:
    fallback = Build(str(fp16_file), gpu_opts("fp16"))
    opened = select.open_engine("int8", str(model_files.int8), gpu_opts("int8"), 8, fallback)
    serving = opened.serving
    assert serving is not None and serving.requested_precision == "int8" and serving.precision == "fp16"
    assert serving.path == str(fp16_file) and serving.requested_path == str(model_files.int8)
    # This machine's real reason: the TensorRT EP is built in, its libraries are not here.
    assert serving.reason.startswith("TensorRT not loadable: ") and "libnvinfer.so.10" in serving.reason
    assert [c.engine for c in cuda_node] == ["cuda"] and opened.plan.candidates[0].engine == "cuda"
    assert opened.engine.path == fp16_file  # the FP16 build is what runs
    assert "Classifier_int8: int8 requested, fp16 serving: TensorRT not loadable: " in caplog.text
    assert "libnvinfer.so.10" in caplog.text
    x = opened.engine.dummy_batch(2)
    reference = OrtEngine(str(model_files.fp32), RuntimeOptions(prefer_gpu=False), cpu_choice()).logits(x)
    assert np.array_equal(opened.engine.logits(x).argmax(1), reference.argmax(1))


def test_without_a_fallback_the_refusal_stays_with_its_reason(
    model_files: ModelFiles, cuda_node: list[EngineChoice]
) -> None:
    with pytest.raises(NeedsTensorRT) as refused:
        select.open_engine("int8", str(model_files.int8), gpu_opts("int8"), 8)
    assert "no INT8 kernels" in str(refused.value) and "fallback" in str(refused.value)
    assert refused.value.reason.startswith("TensorRT not loadable") and cuda_node == []


def test_fp32_never_falls_back(model_files: ModelFiles, fp16_file: Path, cuda_node: list[EngineChoice]) -> None:
    fallback = Build(str(fp16_file), gpu_opts("fp16"))
    opened = select.open_engine("fp32", str(model_files.fp32), gpu_opts("fp32"), 8, fallback)
    assert opened.serving is None and opened.engine.path == model_files.fp32


def test_a_fallback_that_cannot_open_either_names_both(
    model_files: ModelFiles, cuda_node: list[EngineChoice], tmp_path: Path
) -> None:
    fallback = Build(str(tmp_path / "missing-fp16.onnx"), gpu_opts("fp16"))
    with pytest.raises(ModelLoadError) as failed:
        select.open_engine("int8", str(model_files.int8), gpu_opts("int8"), 8, fallback)
    message = str(failed.value)
    assert "no INT8 kernels" in message and "declares fallback fp16" in message and "model file not found" in message


def test_tensorrt_that_fails_to_build_falls_back_naming_the_failure(
    model_files: ModelFiles, fp16_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorRT loads here (stood in) but its build fails: the INT8 variant, planned again without it, falls back."""
    monkeypatch.setattr(select, "usable_providers", lambda: [TENSORRT, CUDA, CPU])
    monkeypatch.setattr(select, "tensorrt_for", lambda path, opts, key=None: select.Provider(TENSORRT, {}))

    def build(path: str, opts: RuntimeOptions, choice: EngineChoice) -> OrtEngine:
        if choice.engine == "tensorrt":
            raise ModelLoadError("TensorRT EP failed to create engine from network for fused node: Conv_0")
        return OrtEngine(path, opts, cpu_choice())

    monkeypatch.setattr(select, "build", build)
    fallback = Build(str(fp16_file), gpu_opts("fp16"))
    opened = select.open_engine("int8", str(model_files.int8), gpu_opts("int8"), 8, fallback)
    assert opened.serving is not None
    failed = "TensorRT failed: TensorRT EP failed to create engine from network for fused node: Conv_0"
    assert opened.serving.reason == failed


def test_reasons_in_one_line() -> None:
    assert tensorrt_absence([CUDA, CPU], listed=True) == f"{TENSORRT} not among the providers given (--available)"
    assert tensorrt_absence([TENSORRT, CUDA]) == "TensorRT is usable here"
    assert tensorrt_failed(RuntimeError("first line\nsecond")) == "TensorRT failed: first line"


# --------------------------------------------------------------------------- the config


def _prod_args() -> dict[str, Any]:
    cfg = yaml.safe_load((REPO / "configs" / "prod.yaml").read_text())
    return copy.deepcopy(cfg["applications"][0]["args"])


def test_prod_declares_fp16_as_the_int8_fallback() -> None:
    args = AppArgs.model_validate(_prod_args())
    fb = args.variants["int8"].fallback
    assert fb is not None and fb.precision == "fp16" and fb.model_path.endswith("efficientnet_lite0-fp16.onnx")
    path, opts = fallback_options(args, "int8", gpu=True, threads=1, streams=2) or (None, None)
    assert path == Path(fb.model_path) and opts is not None and opts.precision == "fp16" and opts.prefer_gpu
    assert fallback_options(args, "fp32", gpu=True, threads=1, streams=2) is None


def test_a_fallback_is_for_int8_variants_only() -> None:
    raw = {"model": BUILTIN_MODEL, "variants": {"fp32": {"model_path": "m.onnx"}}}
    raw["variants"]["fp32"]["fallback"] = {"precision": "fp16", "model_path": "f.onnx"}
    with pytest.raises(ValueError, match="fallback: only an int8 variant falls back"):
        AppArgs.model_validate(raw)
    raw["variants"] = {"int8": {"model_path": "m.onnx", "precision": "int8"}}
    raw["variants"]["int8"]["fallback"] = {"precision": "int8", "model_path": "f.onnx"}
    with pytest.raises(ValueError, match="precision"):
        AppArgs.model_validate(raw)


# --------------------------------------------------------------------------- python -m app.runtime plan


def test_plan_names_the_fallback_where_tensorrt_is_not_offered(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_main(["plan", "configs/prod.yaml", "--gpu", "--available", f"{CUDA},{CPU}"]) == 0
    out = capsys.readouterr()
    plan = json.loads(out.out)["variants"]
    int8, fp32 = plan["int8"], plan["fp32"]
    assert int8["precision"] == "fp16" and int8["engine"] == "cuda"
    assert int8["model_path"].endswith("efficientnet_lite0-fp16.onnx")
    assert int8["fallback"]["requested_precision"] == "int8"
    assert int8["fallback"]["reason"] == f"{TENSORRT} not among the providers given (--available)"
    assert fp32["precision"] == "fp32" and "fallback" not in fp32 and int8["cuda_graphs"] == {"buckets": [1, 2, 4, 8]}
    assert "Classifier_int8: int8 requested, fp16 serving:" in out.err and "Classifier_fp32: fp32 on cuda" in out.err


def test_plan_with_tensorrt_runs_int8_on_it_and_needs_no_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_main(["plan", "configs/prod.yaml", "--gpu", "--available", f"{TENSORRT},{CUDA},{CPU}"]) == 0
    int8 = json.loads(capsys.readouterr().out)["variants"]["int8"]
    assert int8["engine"] == "tensorrt" and int8["precision"] == "int8" and "fallback" not in int8
    assert int8["providers"][0]["options"]["trt_int8_enable"] is True
    assert int8["cuda_graphs"] == {"buckets": [1, 2, 4, 8]}


def test_plan_without_a_declared_fallback_still_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = yaml.safe_load((REPO / "configs" / "prod.yaml").read_text())
    del cfg["applications"][0]["args"]["variants"]["int8"]["fallback"]
    path = tmp_path / "prod-no-fallback.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert plan_main(["plan", str(path), "--gpu", "--available", f"{CUDA},{CPU}"]) == 1
    err = capsys.readouterr().err
    assert "variants.int8" in err and "TensorRT" in err and "no INT8 kernels" in err


def test_an_fp16_build_asks_tensorrt_for_fp16_kernels(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = yaml.safe_load((REPO / "configs" / "prod.yaml").read_text())
    variants = cfg["applications"][0]["args"]["variants"]
    variants["fp16"] = {"model_path": "/home/ray/models/efficientnet_lite0-fp16.onnx", "precision": "fp16"}
    cfg["applications"][0]["deployments"].append({"name": "Classifier_fp16", "user_config": {"max_batch_size": 64}})
    path = tmp_path / "prod-fp16.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert plan_main(["plan", str(path), "--gpu", "--available", f"{TENSORRT},{CUDA},{CPU}"]) == 0
    fp16 = json.loads(capsys.readouterr().out)["variants"]["fp16"]
    assert fp16["providers"][0]["options"]["trt_fp16_enable"] is True
    assert "-fp16-" in fp16["providers"][0]["options"]["trt_engine_cache_path"]


def test_the_reporting_names_what_runs(caplog: pytest.LogCaptureFixture) -> None:
    """The describe() fields /v1/models shows are typed: a fallback in force validates against the protocol."""
    from app.protocol.v1 import FallbackInfo, VariantServing

    serving = select.Serving("int8", "/m/int8-trt.onnx", "fp16", "/m/fp16.onnx", "TensorRT not loadable: x.so")
    FallbackInfo.model_validate(serving.describe())
    VariantServing.model_validate(
        {"precision": "fp16", "requested_precision": "int8", "engine": "cuda", "execution_provider": CUDA}
        | {"fallback_reason": serving.reason}
    )
    with caplog.at_level(logging.WARNING):
        logging.getLogger("ray.serve").warning(serving.line("int8"))
    assert "int8 requested, fp16 serving: TensorRT not loadable: x.so" in caplog.text


# --------------------------------------------------------------------------- what a fallback never hides


def test_a_missing_int8_file_is_an_error_not_a_fallback(
    fp16_file: Path, cuda_node: list[EngineChoice], tmp_path: Path
) -> None:
    fallback = Build(str(fp16_file), gpu_opts("fp16"))
    with pytest.raises(ModelLoadError, match="model file not found") as raised:
        select.open_engine("int8", str(tmp_path / "gone-int8.onnx"), gpu_opts("int8"), 8, fallback)
    assert not isinstance(raised.value, NeedsTensorRT) and cuda_node == []


def test_engine_cuda_on_a_node_with_tensorrt_is_refused_not_fallen_back(model_files: ModelFiles) -> None:
    """`engine: cuda` for an INT8 build where TensorRT is there: the config contradicts itself; a fallback would hide
    it (and report "TensorRT is usable here" as its reason)."""
    from app.runtime.plan import PlanError, plan_engines

    opts = RuntimeOptions(prefer_gpu=True, precision="int8", engine="cuda")
    with pytest.raises(PlanError) as refused:
        plan_engines("int8", opts, [TENSORRT, CUDA, CPU], openvino=False, tensorrt=select.Provider(TENSORRT, {}))
    assert refused.value.needs_tensorrt is False
    with pytest.raises(PlanError) as absent:
        plan_engines("int8", RuntimeOptions(prefer_gpu=True, precision="int8", engine="tensorrt"), [CUDA, CPU], False)
    assert absent.value.needs_tensorrt is True  # engine: tensorrt where TensorRT is not: the fallback's case


@pytest.mark.parametrize(
    "failure",
    [
        select.CacheNotWritable("TensorRT engine cache /x is not writable (Read-only file system)"),
        ModelLoadError("cannot load model: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : out of memory"),
    ],
)
def test_a_failure_that_is_not_tensorrts_is_raised_as_it_is(
    model_files: ModelFiles, fp16_file: Path, monkeypatch: pytest.MonkeyPatch, failure: ModelLoadError
) -> None:
    monkeypatch.setattr(select, "usable_providers", lambda: [TENSORRT, CUDA, CPU])
    monkeypatch.setattr(select, "tensorrt_for", lambda path, opts, key=None: select.Provider(TENSORRT, {}))

    def build(path: str, opts: RuntimeOptions, choice: EngineChoice) -> OrtEngine:
        raise failure

    monkeypatch.setattr(select, "build", build)
    fallback = Build(str(fp16_file), gpu_opts("fp16"))
    with pytest.raises(ModelLoadError) as raised:
        select.open_engine("int8", str(model_files.int8), gpu_opts("int8"), 8, fallback)
    assert raised.value is failure
