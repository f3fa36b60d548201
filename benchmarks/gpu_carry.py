"""What a GPU node without network must be handed for the GPU targets: `python -m benchmarks.gpu_check --carry`.

The set is derived, not listed by hand: every library the CUDA and TensorRT providers NEED
(app/runtime/ort_engine.py PROVIDER_LIBRARIES, checked against readelf by tests/test_runtime.py) maps to the pip
package that ships it, plus what those packages require in turn (nvidia-cublas requires nvidia-cuda-nvrtc). The
versions are what the package index resolved for `onnxruntime-gpu[cuda,cudnn]==1.31.1` on 2026-12-03 for CPython
3.11 and 3.12, manylinux x86_64 (`pip install --dry-run --report`, the command in docs/engines.md); pinned exactly so
the carried set is the one that was named. ORT's [cuda] extra also brings nvidia-cufft and nvidia-nvjitlink: no
provider library NEEDS them (cuFFT serves FFT operators, which EfficientNet has none of), so they are left out.

CUDA 13's pip packages share one directory, site-packages/nvidia/cu13/lib (checked in the nvidia-cuda-runtime
13.5.37 wheel; ONNX Runtime's own preload_dlls looks there); cuDNN keeps site-packages/nvidia/cudnn/lib; TensorRT's
tensorrt-cu13-libs puts its libraries in site-packages/tensorrt_libs. None of them is on the loader's path, so the
node sets LD_LIBRARY_PATH (the provider check, ort_engine.missing_libraries, asks the loader as ORT does).

TensorRT 10 for CUDA 13 is not on the package index as a wheel: tensorrt-cu13-libs 10.16.1.11 there is a stub
sdist that downloads NVIDIA's wheel (about 3.7 GB unpacked) from NVIDIA's own package index while it installs. The
carry lists it with that source; the CUDA targets do not need it.
"""

from __future__ import annotations

import ctypes
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.runtime.ort_engine import PROVIDER_LIBRARIES
from app.runtime.plan import CUDA, TENSORRT

PYTHON_TAGS = ("cp311", "cp312")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# manylinux tags the wheels below carry (pip download needs the platforms a wheel may be tagged with)
PLATFORM_FLAGS = (*PLATFORMS, "manylinux2010_x86_64", "manylinux_2_12_x86_64", "manylinux1_x86_64")
NVIDIA_INDEX = "NVIDIA's package index"  # named, not addressed: its URL is in NVIDIA's TensorRT install guide


@dataclass(frozen=True)
class Wheel:
    package: str
    version: str
    wheel: str  # the file name; {py} is the CPython tag (cp311, cp312) for a wheel built per Python
    lib_dir: str  # where its libraries land, relative to site-packages ("" for onnxruntime-gpu itself)
    source: str = "the package index"
    why: str = ""


ORT = Wheel("onnxruntime-gpu", "1.31.1", "onnxruntime_gpu-1.31.1-{py}-{py}-manylinux_2_28_x86_64.whl", "")
WHEELS: dict[str, Wheel] = {
    w.package: w
    for w in (
        Wheel(
            "nvidia-cuda-runtime",
            "13.5.37",
            "nvidia_cuda_runtime-13.5.37-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            "nvidia/cu13/lib",
        ),
        Wheel(
            "nvidia-cublas",
            "13.10.0.20",
            "nvidia_cublas-13.10.0.20-py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl",
            "nvidia/cu13/lib",
        ),
        Wheel(
            "nvidia-cuda-nvrtc",
            "13.5.37",
            "nvidia_cuda_nvrtc-13.5.37-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
            "nvidia/cu13/lib",
            why="required by nvidia-cublas",
        ),
        Wheel(
            "nvidia-curand",
            "10.4.5.25",
            "nvidia_curand-10.4.5.25-py3-none-manylinux_2_27_x86_64.whl",
            "nvidia/cu13/lib",
        ),
        Wheel(
            "nvidia-cudnn-cu13",
            "9.28.1.4",
            "nvidia_cudnn_cu13-9.28.1.4-py3-none-manylinux_2_27_x86_64.whl",
            "nvidia/cudnn/lib",
        ),
        Wheel(
            "tensorrt-cu13-libs",
            "10.16.1.11",
            "tensorrt_cu13_libs-10.16.1.11 (NVIDIA's wheel; the package index holds a stub sdist that fetches it)",
            "tensorrt_libs",
            source=NVIDIA_INDEX,
        ),
    )
}
# The pip package that ships each library a provider NEEDS.
SONAME_PACKAGE = {
    "libcudart.so.13": "nvidia-cuda-runtime",
    "libcublas.so.13": "nvidia-cublas",
    "libcublasLt.so.13": "nvidia-cublas",
    "libcurand.so.10": "nvidia-curand",
    "libcudnn.so.9": "nvidia-cudnn-cu13",
    "libnvinfer.so.10": "tensorrt-cu13-libs",
    "libnvonnxparser.so.10": "tensorrt-cu13-libs",
}
REQUIRES = {"nvidia-cublas": ("nvidia-cuda-nvrtc",), "nvidia-cudnn-cu13": ("nvidia-cublas",)}


def packages_for(providers: tuple[str, ...]) -> list[Wheel]:
    """onnxruntime-gpu, then the packages that ship what `providers` NEED and what those require, in a stable order."""
    names: list[str] = []
    todo = [SONAME_PACKAGE[lib] for p in providers for lib in PROVIDER_LIBRARIES[p]]
    while todo:
        name = todo.pop(0)
        if name not in names:
            names.append(name)
            todo.extend(REQUIRES.get(name, ()))
    order = list(WHEELS)
    return [ORT] + [WHEELS[n] for n in sorted(names, key=order.index)]


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def library_path(wheels: list[Wheel], site: Path) -> str:
    dirs = dict.fromkeys(str(site / w.lib_dir) for w in wheels if w.lib_dir)
    return ":".join(dirs)


def download_command(wheels: list[Wheel], py: str) -> str:
    """pip download of exactly `wheels` (no resolver surprises: --no-deps, every version pinned) for one CPython."""
    version = f"{py[2]}.{py[3:]}"
    platforms = " ".join(f"--platform {p}" for p in PLATFORM_FLAGS)
    pins = " ".join(f"{w.package}=={w.version}" for w in wheels if w.source == "the package index")
    return (
        f"pip download --no-deps --only-binary=:all: --python-version {version} --implementation cp "
        f"{platforms} -d wheels-{py} {pins}"
    )


def _loads(lib: str) -> bool:
    try:
        ctypes.CDLL(lib)
    except OSError:
        return False
    return True


def carry(site: Path | None = None) -> dict[str, Any]:
    """The whole report: per CPython tag the wheels and the download command, the libraries and where they land,
    the LD_LIBRARY_PATH to set, and which libraries the loader finds on this machine now."""
    site = site or site_packages()
    cuda, trt = packages_for((CUDA,)), packages_for((CUDA, TENSORRT))
    libs = [
        {
            "library": lib,
            "needed_by": [p for p in (CUDA, TENSORRT) if lib in PROVIDER_LIBRARIES[p]],
            "package": SONAME_PACKAGE[lib],
            "version": WHEELS[SONAME_PACKAGE[lib]].version,
            "lands_in": f"site-packages/{WHEELS[SONAME_PACKAGE[lib]].lib_dir}",
            "loads_here": _loads(lib),
        }
        for lib in dict.fromkeys(lib for p in (CUDA, TENSORRT) for lib in PROVIDER_LIBRARIES[p])
    ]
    return {
        "python_tags": list(PYTHON_TAGS),
        "wheels": {
            py: [
                {
                    "package": w.package,
                    "version": w.version,
                    "wheel": w.wheel.format(py=py),
                    "source": w.source,
                    "for": "TensorRT targets" if w not in cuda else "CUDA and TensorRT targets",
                    **({"why": w.why} if w.why else {}),
                }
                for w in trt
            ]
            for py in PYTHON_TAGS
        },
        "download": {py: download_command(trt, py) for py in PYTHON_TAGS},
        "install": "pip install --no-index --find-links wheels-<tag> "
        + " ".join(f"{w.package}=={w.version}" for w in cuda),
        "tensorrt": f"tensorrt-cu13-libs=={WHEELS['tensorrt-cu13-libs'].version} comes from {NVIDIA_INDEX}: on a "
        "machine with network, pip download it with that index as an extra index (the package index's own "
        "10.16.1.11 is a stub sdist that downloads the wheel while it installs), or install it in k8s/Dockerfile",
        "libraries": libs,
        "site_packages": str(site),
        "ld_library_path": {
            "cuda_targets": library_path(cuda, site),
            "all_targets": library_path(trt, site),
        },
        "export": f"export LD_LIBRARY_PATH={library_path(trt, site)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}",
    }


def to_markdown(report: dict[str, Any]) -> str:
    from benchmarks.report import markdown_table

    rows = [[w["package"], w["version"], w["wheel"], w["source"], w["for"]] for w in report["wheels"]["cp312"]]
    wheels = markdown_table(
        ["package", "version", "wheel (cp312; cp311 the same but onnxruntime-gpu's tag)", "source", "for"], rows, 0
    )
    libs = markdown_table(
        ["library", "needed by", "package", "lands in", "loads here"],
        [
            [r["library"], ", ".join(r["needed_by"]), r["package"], r["lands_in"], "yes" if r["loads_here"] else "no"]
            for r in report["libraries"]
        ],
        0,
    )
    downloads = "\n".join(f"{py}: {cmd}" for py, cmd in report["download"].items())
    return (
        f"# GPU carry: what a node without network needs\n\n{wheels}\n{libs}\n"
        f"Download, on a machine with network, per Python:\n\n```\n{downloads}\n```\n\n"
        f"Install on the node: `{report['install']}`\n\n{report['tensorrt']}.\n\n"
        f"Then, before python -m benchmarks.gpu_check:\n\n```\n{report['export']}\n```\n"
    )
