"""benchmarks/gpu_carry.py (`python -m benchmarks.gpu_check --carry`): the wheels a GPU node without network needs,
derived from the providers' NEEDED libraries, checked against ONNX Runtime's own idea of where they land.

Pure: no Ray, no network, no GPU.
"""

from __future__ import annotations

import json
import re
from importlib.metadata import requires, version
from pathlib import Path

import onnxruntime
import pytest

from app.runtime.ort_engine import PROVIDER_LIBRARIES
from app.runtime.plan import CUDA, TENSORRT
from benchmarks import gpu_carry, gpu_check
from benchmarks.gpu_carry import ORT, SONAME_PACKAGE, WHEELS, carry, packages_for

REPO = Path(__file__).resolve().parents[1]


def test_every_library_a_provider_needs_comes_from_a_carried_package() -> None:
    for provider in (CUDA, TENSORRT):
        carried = {w.package for w in packages_for((provider,))}
        for lib in PROVIDER_LIBRARIES[provider]:
            assert SONAME_PACKAGE[lib] in carried, (provider, lib)
    cuda = [w.package for w in packages_for((CUDA,))]
    assert cuda[0] == "onnxruntime-gpu" and "tensorrt-cu13-libs" not in cuda
    assert "nvidia-cuda-nvrtc" in cuda  # nvidia-cublas requires it: the closure, not only the NEEDED list
    assert "tensorrt-cu13-libs" in {w.package for w in packages_for((CUDA, TENSORRT))}


def test_the_carried_onnxruntime_is_the_installed_one_and_the_projects_pin() -> None:
    """A bump of onnxruntime-gpu fails here until the carry is re-resolved (its NVIDIA wheels follow ORT's)."""
    try:
        installed = version("onnxruntime-gpu")
    except Exception:
        pytest.skip("onnxruntime-gpu is not installed here (Linux x86_64 only)")
    assert ORT.version == installed == onnxruntime.__version__
    pin = re.search(r'"onnxruntime-gpu==([\d.]+)\.\*', (REPO / "pyproject.toml").read_text())
    assert pin and ORT.version.startswith(pin.group(1) + ".")
    # the NVIDIA packages of ORT's [cuda,cudnn] extras, less the two no provider NEEDS, are the carried ones
    extras = {
        re.split(r"[~=<>; ]", r)[0]
        for r in requires("onnxruntime-gpu") or []
        if 'extra == "cuda"' in r or 'extra == "cudnn"' in r
    }
    carried = {w.package for w in packages_for((CUDA,))} - {"onnxruntime-gpu"}
    assert extras - {"nvidia-cufft"} <= carried
    assert carried - extras <= {"nvidia-cublas"}  # ORT's extras reach cuBLAS through nvidia-cudnn-cu13


def test_the_libraries_land_where_onnxruntime_itself_looks_for_them() -> None:
    """ONNX Runtime's preload_dlls knows the CUDA 13 wheels' layout (nvidia/cu13/lib, nvidia/cudnn/lib)."""
    paths = getattr(onnxruntime, "_get_nvidia_dll_paths", None)
    if paths is None or not getattr(onnxruntime, "cuda_version", ""):
        pytest.skip("this onnxruntime is not a CUDA build")
    ort_dirs = {parts[-1]: "/".join(parts[:-1]) for parts in paths(False, cuda=True, cudnn=True)}
    checked = 0
    for lib, package in SONAME_PACKAGE.items():
        if lib in ort_dirs:
            assert WHEELS[package].lib_dir == ort_dirs[lib], lib
            checked += 1
    assert checked >= 5  # cudart, cublas, cublasLt, curand, cudnn


def test_the_carried_tensorrt_is_the_images_and_its_source_is_named() -> None:
    """The image takes TensorRT from NVIDIA's apt repository, a pip node the wheel: the same major.minor."""
    trt = WHEELS["tensorrt-cu13-libs"]
    assert trt.lib_dir == "tensorrt_libs" and trt.source == gpu_carry.NVIDIA_INDEX
    pinned = re.search(r"^ARG TENSORRT_VERSION=(\S+)$", (REPO / "k8s" / "Dockerfile").read_text(), re.M)
    assert pinned and trt.version.startswith(pinned.group(1) + ".")


def test_the_report_has_both_pythons_a_download_each_and_the_library_path(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    report = carry(site)
    assert report["python_tags"] == ["cp311", "cp312"]
    for py in ("cp311", "cp312"):
        wheels = report["wheels"][py]
        assert wheels[0]["wheel"] == f"onnxruntime_gpu-1.31.1-{py}-{py}-manylinux_2_28_x86_64.whl"
        assert all(w["wheel"].endswith(".whl") for w in wheels if w["source"] == "the package index")
        cmd = report["download"][py]
        assert cmd.startswith("pip download --no-deps --only-binary=:all: ")
        assert f"--python-version {py[2]}.{py[3:]} " in cmd and f"-d wheels-{py} " in cmd
        pins = re.findall(r"(\S+)==(\S+)", cmd)
        assert pins == [(w["package"], w["version"]) for w in wheels if w["source"] == "the package index"]
        assert "tensorrt" not in cmd  # not on the package index as a wheel
    dirs = report["ld_library_path"]["all_targets"].split(":")
    assert dirs == [str(site / "nvidia/cu13/lib"), str(site / "nvidia/cudnn/lib"), str(site / "tensorrt_libs")]
    assert report["ld_library_path"]["cuda_targets"].split(":") == dirs[:2]
    assert report["export"].startswith(f"export LD_LIBRARY_PATH={':'.join(dirs)}")
    libs = {r["library"]: r for r in report["libraries"]}
    assert set(libs) == set(PROVIDER_LIBRARIES[CUDA]) | set(PROVIDER_LIBRARIES[TENSORRT])
    assert libs["libnvinfer.so.10"]["needed_by"] == [TENSORRT] and isinstance(libs["libcudnn.so.9"]["loads_here"], bool)


def test_carry_on_the_command_line_prints_and_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gpu_check, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(gpu_check, "run", lambda check: pytest.fail("--carry measures nothing"))
    assert gpu_check.main(["--carry"]) == 0
    out = capsys.readouterr().out
    assert "| libcudnn.so.9 |" in out and "pip download --no-deps" in out and "export LD_LIBRARY_PATH=" in out
    [path] = tmp_path.glob("*-gpu-carry.json")
    assert json.loads(path.read_text())["download"]["cp312"] in out
    assert path.with_suffix(".md").is_file()
