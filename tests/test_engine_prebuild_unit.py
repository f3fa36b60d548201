"""Engines built once per GPU type (app/runtime/prebuild.py, `python -m app.runtime build-engines`), without a GPU.

TensorRT cannot load here, so the dry run and the refusal run as they are, and the one test that builds stands
a CPU-only session in for the TensorRT one (as tests/test_engine_cache_unit.py does): what it checks is which
model file, options and cache directory each build opens, with the build lock held, that each is opened once,
and that a rebuild under the same file name is not reported as a load.
"""

from __future__ import annotations

import copy
import fcntl
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import AppArgs
from app.runtime import prebuild, select
from app.runtime.cli import main
from app.runtime.ort_engine import OrtEngine
from app.runtime.plan import CPU, TENSORRT, EngineChoice, Provider, RuntimeOptions
from app.runtime.variants import runtime_options, speed_gate_for
from app.served_model.prologue import served_model

REPO = Path(__file__).resolve().parent.parent
PROD = REPO / "configs" / "prod.yaml"
KEY = {"model_sha256": "ab" * 32, "ort": "1.31.1", "tensorrt": "10.16.1", "gpu": "NVIDIA L4"}


def _prod() -> dict[str, Any]:
    return yaml.safe_load(PROD.read_text())


def _with_models(cfg: dict[str, Any], model_files: Any) -> dict[str, Any]:
    """prod.yaml with its variants on this checkout's model files (the image's are not here)."""
    cfg = copy.deepcopy(cfg)
    cfg["applications"][0]["args"]["model"]["labels_path"] = str(model_files.labels)
    variants = cfg["applications"][0]["args"]["variants"]
    variants["int8"]["model_path"] = str(model_files.int8)
    variants["fp32"]["model_path"] = str(model_files.fp32)
    return cfg


def test_the_speed_gates_fp32_engine_is_the_fp32_replicas_engine(model_files: Any) -> None:
    """The INT8 replica's gate opens FP32 with the FP32 replica's cache directory and TensorRT options, though its
    threads and parallel batches are the INT8 deployment's: a shared cache holds one FP32 engine for both."""
    args = AppArgs.model_validate(_with_models(_prod(), model_files)["applications"][0]["args"])
    replica = runtime_options(args, "fp32", True, threads=1, streams=2)
    gate = speed_gate_for(args, "int8", True, threads=3, streams=4, chosen_engine="tensorrt")
    assert gate is not None
    spec, gate_path, gate_opts = gate
    assert spec.baseline == "fp32" and gate_opts.engine == "tensorrt" and replica.engine == "auto"
    # The same file: the replica loads model_io's served copy, the gate served_model's (app/serve/classifier.py).
    replica_file = Path(prebuild.served_path(args, "fp32"))
    assert served_model(gate_path, args.model.preprocess).path == replica_file
    mine = select.tensorrt_for(str(replica_file), replica, KEY)
    theirs = select.tensorrt_for(str(replica_file), gate_opts, KEY)
    assert mine == theirs
    # And the INT8 replica's own engine is another directory: INT8 is part of the key.
    int8 = select.tensorrt_for(str(replica_file), runtime_options(args, "int8", True, 1, 2), KEY)
    assert int8.options["trt_engine_cache_path"] != mine.options["trt_engine_cache_path"]


def test_the_builds_are_each_cache_directory_once_with_who_uses_it(
    model_files: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("APP_TRT_CACHE_DIR", str(tmp_path))
    builds = prebuild.engine_builds(_with_models(_prod(), model_files), KEY)
    assert [b.used_by for b in builds] == [["Classifier_int8"], ["Classifier_fp32", "speed gate of Classifier_int8"]]
    assert [b.opts.precision for b in builds] == ["int8", "fp32"]
    for b in builds:
        assert b.cache_dir.startswith(f"{tmp_path}/{'ab' * 8}-ort1.31.1-trt10.16.1-NVIDIA-L4-b1.64.64-")
        assert b.provider.options["trt_engine_cache_path"] == b.cache_dir


def test_a_cpu_config_has_no_engines_to_build(model_files: Any) -> None:
    cfg = _with_models(_prod(), model_files)
    cfg["applications"][0]["args"]["device"] = "cpu"
    assert prebuild.engine_builds(cfg, KEY) == []


def test_dry_run_prints_the_cache_directories(
    model_files: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "prod.yaml"
    config.write_text(yaml.safe_dump(_with_models(_prod(), model_files), sort_keys=False))
    monkeypatch.setenv("APP_TRT_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["build-engines", str(config), "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] is True
    dirs = [b["cache_dir"] for b in out["builds"]]
    sha = select.model_sha256(str(model_files.int8), model_files.int8.stat().st_mtime_ns)[:16]
    # This machine's own key, its unknowns named: no TensorRT and no GPU here.
    assert dirs[0] == f"{tmp_path}/cache/{sha}-ort1.31.1-trtVERSION-GPU-b1.64.64-int8-ws2048m-l3"
    assert dirs[1].endswith("-ort1.31.1-trtVERSION-GPU-b1.64.64-fp32-ws2048m-l3")
    assert not (tmp_path / "cache").exists()  # nothing built, nothing made


def test_without_tensorrt_it_refuses_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build-engines", str(PROD)]) == 1
    err = capsys.readouterr()
    assert err.out == ""
    lines = err.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("build-engines: TensorrtExecutionProvider cannot load here (missing ")
    assert "libnvinfer.so.10" in lines[0] and "--dry-run" in lines[0]


ENGINE = "TensorrtExecutionProvider_TRTKernel_graph_main_1_0_0_sm89.engine"


def _lock_is_held(cache: Path) -> bool:
    """Another open file's non-blocking flock on the build lock is refused: someone holds it."""
    with open(cache / ".build.lock", "w") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(other, fcntl.LOCK_UN)
        return False


def _tensorrt_stand_in(
    opened: list[tuple[str, RuntimeOptions, EngineChoice]], rebuild: bool = False
) -> type[OrtEngine]:
    """ORT's TensorRT EP as the cache sees it: with no engine cached it builds one (writes the file); with one
    cached it loads it (reads it, leaves it as it is), or, with `rebuild`, writes it again under the same name."""

    class TensorRTStandIn(OrtEngine):
        def __init__(self, path: str, opts: RuntimeOptions, choice: EngineChoice) -> None:
            opened.append((path, opts, choice))
            cache = Path(choice.providers[0].options["trt_engine_cache_path"])
            assert _lock_is_held(cache)  # opened under the replicas' build lock
            engine = cache / ENGINE
            if engine.is_file() and not rebuild:
                engine.read_bytes()
            else:
                tmp = cache / "rewritten"
                tmp.write_bytes(b"engine, built again" if engine.is_file() else b"engine")
                tmp.replace(engine)  # a new inode whatever the file system's mtime granularity
            super().__init__(path, opts, EngineChoice("cpu", (Provider(CPU),), {}))

    return TensorRTStandIn


def test_each_build_opens_its_engine_as_the_replica_would(
    model_files: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """TensorRT stood in for: a CPU-only session is made where the TensorRT one would be (its build writes one
    engine file, as ORT's TensorRT EP does into trt_engine_cache_path); the rest is the real build path."""
    monkeypatch.setenv("APP_TRT_CACHE_DIR", str(tmp_path))
    opened: list[tuple[str, RuntimeOptions, EngineChoice]] = []
    monkeypatch.setattr(select, "OrtEngine", _tensorrt_stand_in(opened))
    builds = prebuild.engine_builds(_with_models(_prod(), model_files), KEY)
    results = [prebuild.run_build(b, [TENSORRT, CPU]) for b in builds]
    assert len(opened) == 2  # FP32 once, for its replicas and the gate alike
    for (path, opts, choice), b in zip(opened, builds, strict=True):
        assert path == b.model_path and opts == b.opts
        assert choice.engine == "tensorrt" and choice.providers[0] == b.provider  # the replica's own options
        assert not _lock_is_held(Path(b.cache_dir))  # and let go after
    assert [r["loaded_from_cache"] for r in results] == [False, False]
    assert all(r["engine_files"] == [ENGINE] for r in results)
    again = prebuild.run_build(builds[1], [TENSORRT, CPU])  # a second run finds the engine where it left it
    assert again["loaded_from_cache"] is True


def test_an_engine_rewritten_under_the_same_name_is_reported_rebuilt(
    model_files: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ORT rewrites a rebuilt engine under its old name: the same file names before and after are not a load."""
    monkeypatch.setenv("APP_TRT_CACHE_DIR", str(tmp_path))
    opened: list[tuple[str, RuntimeOptions, EngineChoice]] = []
    builds = prebuild.engine_builds(_with_models(_prod(), model_files), KEY)
    monkeypatch.setattr(select, "OrtEngine", _tensorrt_stand_in(opened))
    first = prebuild.run_build(builds[1], [TENSORRT, CPU])
    monkeypatch.setattr(select, "OrtEngine", _tensorrt_stand_in(opened, rebuild=True))
    again = prebuild.run_build(builds[1], [TENSORRT, CPU])
    assert first["engine_files"] == again["engine_files"] == [ENGINE]
    assert again["loaded_from_cache"] is False
    assert (Path(builds[1].cache_dir) / ENGINE).read_bytes() == b"engine, built again"
