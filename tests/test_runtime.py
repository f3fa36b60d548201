"""Engines: the plan (pure), the provider libraries, ONNX Runtime and OpenVINO on the real models, selection.

No GPU exists here: the GPU plans are checked as data (providers, options), which is what ONNX Runtime
receives; a real TensorRT or CUDA session cannot be built on this machine.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.imaging.preprocess import preprocess
from app.runtime import measure as measure_module
from app.runtime.cli import main as plan_main
from app.runtime.measure import MAX_SPEEDUP, SpeedGate, Throughput, judge, measure_alternating
from app.runtime.openvino_engine import OpenVinoEngine
from app.runtime.ort_engine import PROVIDER_LIBRARIES, missing_libraries, usable_providers
from app.runtime.plan import (
    CPU,
    CUDA,
    DISABLE_CPU_FALLBACK,
    PRECISE_U8S8,
    TENSORRT,
    PlanError,
    RuntimeOptions,
    TensorRTOptions,
    engine_cache_path,
    plan_engines,
    tensorrt_provider,
)
from app.runtime.select import open_engine
from app.runtime.startup import run_speed_gate
from app.toolchain.samples import EVAL_PHOTOS, available_photos, sample_bytes
from tests.conftest import REPO

ALL_GPU = [TENSORRT, CUDA, CPU]
SAMPLE = (224, 224, 3)


def trt(opts: RuntimeOptions) -> object:
    return tensorrt_provider(opts, "/cache/key", "image", SAMPLE)


def gpu_plan(available: list[str], **kw: object):  # type: ignore[no-untyped-def]
    opts = RuntimeOptions(prefer_gpu=True, **kw)  # type: ignore[arg-type]
    return plan_engines("v", opts, available, openvino=True, tensorrt=trt(opts))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the plan


def test_int8_on_a_gpu_node_runs_tensorrt_in_int8_with_caches_and_one_profile() -> None:
    plan = gpu_plan(ALL_GPU, precision="int8", require_gpu=True, tensorrt=TensorRTOptions(max_batch_size=64))
    (choice,) = plan.candidates
    assert choice.engine == "tensorrt" and choice.provider_names == [TENSORRT, CUDA]  # no CPU EP with require_gpu
    assert choice.session_config[DISABLE_CPU_FALLBACK] == "1"
    o = choice.providers[0].options
    assert o["trt_int8_enable"] is True and o["trt_fp16_enable"] is False
    assert o["trt_engine_cache_enable"] is True and o["trt_timing_cache_enable"] is True
    assert o["trt_engine_cache_path"] == o["trt_timing_cache_path"] == "/cache/key"
    assert o["trt_profile_min_shapes"] == "image:1x224x224x3"
    assert o["trt_profile_max_shapes"] == "image:64x224x224x3"
    assert choice.providers[1].options["cudnn_conv_algo_search"] == "HEURISTIC"


def test_fp32_keeps_tensorrt_out_of_int8_and_fp16_unless_configured() -> None:
    o = gpu_plan(ALL_GPU).candidates[0].providers[0].options
    assert (o["trt_int8_enable"], o["trt_fp16_enable"]) == (False, False)
    o = gpu_plan(ALL_GPU, fp16=True).candidates[0].providers[0].options
    assert o["trt_fp16_enable"] is True


def test_without_require_gpu_the_cpu_ep_stays_last_as_fallback() -> None:
    (choice,) = gpu_plan(ALL_GPU).candidates
    assert choice.provider_names == [TENSORRT, CUDA, CPU] and DISABLE_CPU_FALLBACK not in choice.session_config


def test_int8_on_cuda_without_tensorrt_is_refused_naming_tensorrt() -> None:
    with pytest.raises(PlanError, match="TensorRT") as e:
        gpu_plan([CUDA, CPU], precision="int8")
    assert "no INT8 kernels" in str(e.value) and "allow_slow_int8" in str(e.value)
    (choice,) = gpu_plan([CUDA, CPU], precision="int8", allow_slow_int8=True).candidates
    assert choice.engine == "cuda"


def test_fp32_on_cuda_without_tensorrt_is_fine() -> None:
    (choice,) = gpu_plan([CUDA, CPU]).candidates
    assert choice.engine == "cuda" and choice.provider_names == [CUDA, CPU]


def test_engines_named_explicitly_must_be_usable() -> None:
    with pytest.raises(PlanError, match="engine tensorrt"):
        gpu_plan([CUDA, CPU], engine="tensorrt")
    with pytest.raises(PlanError, match="engine cuda"):
        gpu_plan([CPU], engine="cuda")
    with pytest.raises(PlanError, match="openvino package"):
        plan_engines("v", RuntimeOptions(prefer_gpu=False, engine="openvino"), [CPU], openvino=False)


def test_cpu_auto_measures_openvino_against_the_cpu_ep() -> None:
    plan = plan_engines("v", RuntimeOptions(prefer_gpu=False), [CPU], openvino=True)
    assert [c.engine for c in plan.candidates] == ["openvino", "cpu"]
    assert plan.describe()["chosen_by"] == "throughput measured at warm-up"
    without = plan_engines("v", RuntimeOptions(prefer_gpu=False), [CPU], openvino=False)
    assert [c.engine for c in without.candidates] == ["cpu"]
    forced = plan_engines("v", RuntimeOptions(prefer_gpu=False, engine="cpu"), [CPU], openvino=True)
    assert [c.engine for c in forced.candidates] == ["cpu"]


def test_int8_weights_that_can_overflow_u8s8_run_on_ort_u8u8_kernels_alone_and_say_so() -> None:
    int8 = RuntimeOptions(prefer_gpu=False, precision="int8")
    plan = plan_engines("v", int8, [CPU], openvino=True, u8s8_overflow=True)
    assert [c.engine for c in plan.candidates] == ["cpu"]  # OpenVINO's kernels overflow alike: left out
    assert plan.candidates[0].session_config[PRECISE_U8S8] == "1"
    assert "without most of INT8's speed-up" in plan.note and "python -m app.models quantize" in plan.note
    with pytest.raises(PlanError, match="engine openvino has no such switch"):
        plan_engines("v", dataclasses.replace(int8, engine="openvino"), [CPU], openvino=True, u8s8_overflow=True)
    # A GPU replica falling back to the CPU gets the same plan, both notes kept.
    fallback = plan_engines("v", dataclasses.replace(int8, prefer_gpu=True), [CPU], openvino=True, u8s8_overflow=True)
    assert "no GPU execution provider" in fallback.note and PRECISE_U8S8 in fallback.candidates[0].session_config
    # What counts is the weights, not the declared precision: an INT8 model declared fp32 gets the same plan.
    declared_fp32 = plan_engines("v", RuntimeOptions(prefer_gpu=False), [CPU], openvino=True, u8s8_overflow=True)
    assert declared_fp32.candidates == plan.candidates
    # Weights within the pair limit keep both candidates and the U8S8 kernels.
    limited = plan_engines("v", int8, [CPU], openvino=True, u8s8_overflow=False)
    assert [c.engine for c in limited.candidates] == ["openvino", "cpu"] and not limited.note
    assert PRECISE_U8S8 not in limited.candidates[1].session_config
    # A GPU plan ignores it: TensorRT runs the INT8 artifact in its own kernels.
    gpu = plan_engines("v", dataclasses.replace(int8, prefer_gpu=True), [TENSORRT, CUDA, CPU], True, trt(int8), True)
    assert gpu.gpu and not gpu.note


def test_a_replica_reads_its_model_for_u8s8_overflow_only_when_its_plan_is_on_the_cpu(monkeypatch) -> None:
    from app.runtime import select

    read: list[str] = []
    monkeypatch.setattr(select, "u8s8_overflows_here", lambda path: read.append(path) or True)
    gpu = select._checked_plan("v", "m.onnx", RuntimeOptions(prefer_gpu=True), [CUDA, CPU])
    assert gpu.gpu and read == []  # a GPU plan never reads the model for this
    cpu = select._checked_plan("v", "m.onnx", RuntimeOptions(prefer_gpu=True, precision="int8"), [CPU])
    assert read == ["m.onnx"] and not cpu.gpu and PRECISE_U8S8 in cpu.candidates[0].session_config


def test_x86_without_vnni_reads_the_cpu_flags(tmp_path) -> None:
    from app.runtime.select import x86_without_vnni

    avx2, vnni = tmp_path / "avx2", tmp_path / "vnni"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    vnni.write_text("flags\t\t: fpu avx2 avx512f avx512_vnni\n")
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert x86_without_vnni(str(avx2)) is True
    assert x86_without_vnni(str(vnni)) is False
    assert x86_without_vnni(str(tmp_path / "missing")) is False  # unknown: the plan stays as it was


def test_a_granted_gpu_without_gpu_providers_falls_back_saying_so_or_fails_with_require_gpu() -> None:
    plan = gpu_plan([CPU])
    assert plan.gpu is False and "no GPU execution provider is usable" in plan.note
    with pytest.raises(PlanError, match="require_gpu=True"):
        gpu_plan([CPU], require_gpu=True)
    with pytest.raises(PlanError, match="require_gpu"):
        plan_engines("v", RuntimeOptions(prefer_gpu=False, require_gpu=True), [CPU], openvino=True)


def test_engine_cache_is_keyed_on_model_ort_tensorrt_and_gpu() -> None:
    base = engine_cache_path("/c", "ab" * 32, "1.31.1", "10.16.1", "NVIDIA H100 80GB HBM3")
    assert base == "/c/" + "ab" * 8 + "-ort1.31.1-trt10.16.1-NVIDIA-H100-80GB-HBM3"
    others = {
        engine_cache_path("/c", "cd" * 32, "1.31.1", "10.16.1", "NVIDIA H100 80GB HBM3"),
        engine_cache_path("/c", "ab" * 32, "1.32.0", "10.16.1", "NVIDIA H100 80GB HBM3"),
        engine_cache_path("/c", "ab" * 32, "1.31.1", "10.17.0", "NVIDIA H100 80GB HBM3"),
        engine_cache_path("/c", "ab" * 32, "1.31.1", "10.16.1", "NVIDIA L4"),
    }
    assert base not in others and len(others) == 4


# --------------------------------------------------------------------------- python -m app.runtime plan


def test_plan_cli_puts_tensorrt_first_for_prod_int8(capsys: pytest.CaptureFixture[str]) -> None:
    available = ",".join(ALL_GPU)
    assert plan_main(["plan", "configs/prod.yaml", "--available", available, "--gpu"]) == 0
    plan = json.loads(capsys.readouterr().out)["variants"]["int8"]
    assert plan["engine"] == "tensorrt" and plan["model_path"].endswith("int8-trt.onnx")
    names = [p["name"] for p in plan["providers"]]
    assert names[0] == TENSORRT and CPU not in names
    trt_options = plan["providers"][0]["options"]
    assert trt_options["trt_int8_enable"] is True and trt_options["trt_engine_cache_enable"] is True


def test_plan_cli_on_this_machine_for_the_local_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_main(["plan", "configs/local.yaml"]) == 0
    plan = json.loads(capsys.readouterr().out)["variants"]
    assert plan["fp32"]["engine"] == "openvino|cpu" and plan["fp32"]["gpu"] is False


# --------------------------------------------------------------------------- provider libraries


def _needed(library: Path) -> set[str]:
    out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return {line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line}


@pytest.mark.parametrize(("provider", "lib"), [(CUDA, "cuda"), (TENSORRT, "tensorrt")])
def test_provider_library_list_matches_what_the_installed_wheel_needs(provider: str, lib: str) -> None:
    import onnxruntime

    path = Path(onnxruntime.__file__).parent / "capi" / f"libonnxruntime_providers_{lib}.so"
    if shutil.which("readelf") is None or not path.is_file():
        pytest.skip("readelf or the GPU provider library is not here")
    system = {"libdl.so.2", "librt.so.1", "libpthread.so.0", "libstdc++.so.6", "libm.so.6", "libgcc_s.so.1"}
    system |= {"libc.so.6", "ld-linux-x86-64.so.2", "libcuda.so.1"}  # libcuda: the driver, not the image's
    # Every library the provider NEEDS is checked; cuDNN too, which the CUDA EP opens later, at run time.
    assert set(PROVIDER_LIBRARIES[provider]) - (_needed(path) - system) <= {"libcudnn.so.9"}
    assert _needed(path) - system <= set(PROVIDER_LIBRARIES[provider])


def test_providers_whose_libraries_are_missing_are_not_usable() -> None:
    usable = usable_providers()
    assert CPU in usable
    for provider in (CUDA, TENSORRT):
        assert (provider in usable) == (not missing_libraries(provider))


# --------------------------------------------------------------------------- engines on the real models


def _photos(model_files) -> np.ndarray:  # type: ignore[no-untyped-def]
    names = [n for n in EVAL_PHOTOS if n in available_photos()]
    return np.stack([preprocess(sample_bytes(n), size=224, max_pixels=50_000_000) for n in names])


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_openvino_gives_onnx_runtimes_answers(model_files, precision: str) -> None:  # type: ignore[no-untyped-def]
    path = str(getattr(model_files, precision))
    x = _photos(model_files)
    opts = RuntimeOptions(prefer_gpu=False, precision=precision)
    ort_logits = open_engine("v", path, RuntimeOptions(prefer_gpu=False, engine="cpu")).engine.logits(x)
    ov = OpenVinoEngine(path, opts)
    ov_logits = ov.logits(x)
    assert ov.spec.input_dtype == "tensor(uint8)" and ov.spec.batch_shape(2) == (2, 224, 224, 3)
    assert (ov_logits.argmax(1) == ort_logits.argmax(1)).all()
    if precision == "fp32":
        np.testing.assert_allclose(ov_logits, ort_logits, atol=1e-2)


def test_the_cpu_ep_reports_every_node_on_the_cpu(model_files) -> None:  # type: ignore[no-untyped-def]
    engine = open_engine("v", str(model_files.int8), RuntimeOptions(prefer_gpu=False, engine="cpu")).engine
    counts = engine.placement_counts()
    assert list(counts) == [CPU] and counts[CPU] > 100
    assert engine.describe()["nodes_per_provider"] == counts


def test_auto_keeps_the_engine_that_measured_faster(model_files, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def rigged(runs, x, parallel=1, rounds=5, min_s=0.2):  # type: ignore[no-untyped-def]
        return {name: Throughput(len(x), parallel, 1.0, 10.0 if name == "cpu" else 5.0) for name in runs}

    monkeypatch.setattr("app.runtime.select.measure_alternating", rigged)
    opened = open_engine("v", str(model_files.fp32), RuntimeOptions(prefer_gpu=False), measure_batch=2)
    assert opened.engine.name == "cpu" and set(opened.candidates) == {"openvino", "cpu"}


# --------------------------------------------------------------------------- measuring and the gate


def test_measure_alternating_times_each_run_and_reports_medians() -> None:
    calls: list[str] = []
    result = measure_alternating({"a": lambda x: calls.append("a"), "b": lambda x: calls.append("b")}, np.zeros(4))
    assert calls[:4] == ["a", "b", "a", "b"]  # one untimed round each, then alternating
    assert calls.count("a") == calls.count("b") >= 6
    assert result["a"].batch == 4 and result["a"].img_per_s > 0


def test_speed_gate_judges_both_ways() -> None:
    fast, slow = Throughput(16, 1, 10.0, 200.0), Throughput(16, 1, 20.0, 100.0)
    ok = judge("int8", SpeedGate("fp32", 1.5, "fail"), fast, slow)
    assert ok.passed and ok.speedup == 2.0 and "meets" in ok.message
    bad = judge("int8", SpeedGate("fp32", 2.5, "warn"), fast, slow)
    assert not bad.passed and "below min_speedup 2.5x" in bad.message and "200.0 img/s" in bad.message


def test_speed_gate_against_a_baseline_that_reads_zero_img_per_s_stays_a_finite_number() -> None:
    # 16 images in 400 s: 0.04 img/s, which rounds to 0.0; the ratio must come from the times, and stay finite
    crawling = Throughput(16, 1, 400_000.0, 0.0)
    verdict = judge("int8", SpeedGate("fp32", 1.2, "warn"), Throughput(16, 1, 10.0, 1600.0), crawling)
    assert verdict.passed and verdict.speedup == 40_000.0
    assert json.loads(json.dumps(verdict.describe(), allow_nan=False))["speedup"] == 40_000.0
    stuck = judge("int8", SpeedGate("fp32", 1.2, "warn"), Throughput(16, 1, 0.0, 0.0), Throughput(16, 1, 0.0, 0.0))
    assert stuck.speedup == 0.0 and not stuck.passed  # nothing measured: no speed-up claimed


def test_speed_gate_on_real_engines_judges_the_measured_ratio(model_files) -> None:  # type: ignore[no-untyped-def]
    """INT8 vs FP32 on the CPU EP, both run here in alternating rounds: the verdict is the measured ratio against
    min_speedup. The two gates are ones any measurement passes (0x) and none does (past MAX_SPEEDUP, where a measured
    ratio is capped), so the verdicts hold on any machine; how fast INT8 is, is the benchmarks' to say."""
    opened = open_engine("int8", str(model_files.int8), RuntimeOptions(prefer_gpu=False, engine="cpu")).engine
    batches: list[int] = []

    class Counted:  # the variant's engine, counting its calls
        def dummy_batch(self, n: int) -> np.ndarray:
            return opened.dummy_batch(n)

        def logits(self, x: np.ndarray) -> np.ndarray:
            batches.append(len(x))
            return opened.logits(x)

    counted: Any = Counted()
    base_opts = RuntimeOptions(prefer_gpu=False, engine="cpu")
    for min_speedup, passed in ((0.0, True), (2 * MAX_SPEEDUP, False)):
        batches.clear()
        gate = SpeedGate("fp32", min_speedup, "warn")
        result = run_speed_gate("int8", counted, gate, str(model_files.fp32), base_opts, batch=4, parallel=1)
        assert result.passed is passed and result.batch == 4
        assert result.speedup > 0 and result.baseline_img_per_s > 0  # both sides measured
        # The variant's own engine ran the rounds: one untimed, then at least three timed, all of the batch size.
        assert len(batches) >= 4 and set(batches) == {4}, batches


def test_measure_module_imports_no_engine() -> None:
    assert "onnxruntime" not in measure_module.__dict__ and "openvino" not in measure_module.__dict__


def test_the_runtime_imports_without_the_onnx_package() -> None:
    """The Triton peer's environment (benchmarks/baselines/triton_peer.py) has ONNX Runtime, not onnx: importing
    the runtime and its engine there must not need it (a module-level `import onnx` once stopped that peer)."""
    code = "import sys; sys.modules['onnx'] = None; import app.runtime; from app.runtime import onnxruntime_engine"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
