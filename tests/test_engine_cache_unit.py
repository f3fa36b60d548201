"""The TensorRT engine cache cannot poison itself (app/runtime/plan.py, app/runtime/select.py), without a GPU.

TensorRT cannot exist here, so its one behaviour the recovery depends on is stood in for: loading a session
whose engine cache holds a truncated engine fails (ORT raises at session creation: onnxruntime#15982). The rest
is the real code: the cache key, the build lock, setting the bad files aside, and ONNX Runtime's CPU EP
building the session on the second try.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from app.runtime import select
from app.runtime.plan import (
    CPU,
    TENSORRT,
    EngineChoice,
    Provider,
    RuntimeOptions,
    engine_build_key,
    engine_cache_path,
)
from app.runtime.spec import ModelLoadError


def test_the_cache_key_changes_with_the_profile_the_precision_the_workspace_and_the_builder_level() -> None:
    base = RuntimeOptions(precision="int8")
    variants = [
        dataclasses.replace(base, tensorrt=dataclasses.replace(base.tensorrt, max_batch_size=32)),
        dataclasses.replace(base, tensorrt=dataclasses.replace(base.tensorrt, opt_batch_size=8)),
        dataclasses.replace(base, fp16=True),
        dataclasses.replace(base, precision="fp32"),
        dataclasses.replace(base, tensorrt=dataclasses.replace(base.tensorrt, workspace_bytes=1 << 30)),
        dataclasses.replace(base, tensorrt=dataclasses.replace(base.tensorrt, builder_optimization_level=5)),
    ]
    keys = {engine_build_key(o) for o in variants}
    assert engine_build_key(base) == "b1.64.64-int8-ws2048m-l3"
    assert len(keys) == len(variants) and engine_build_key(base) not in keys
    path = engine_cache_path("/c", "ab" * 32, "1.31.1", "10.16.1", "NVIDIA L4", engine_build_key(base))
    assert path == "/c/" + "ab" * 8 + "-ort1.31.1-trt10.16.1-NVIDIA-L4-b1.64.64-int8-ws2048m-l3"


def _choice(cache: Path) -> EngineChoice:
    """A TensorRT choice whose session ORT can still build here: TensorRT's options ride on a CPU-only session."""
    return EngineChoice("cpu", (Provider(TENSORRT, {"trt_engine_cache_path": str(cache)}), Provider(CPU)), {})


def test_a_truncated_engine_in_the_cache_is_set_aside_and_the_start_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_files: Any
) -> None:
    cache = tmp_path / "key"
    cache.mkdir()
    (cache / "TensorrtExecutionProvider_TRTKernel_graph_main_1_0_0_sm90.engine").write_bytes(b"ftrt\x00\x01")
    (cache / "TensorrtExecutionProvider_TRTKernel_graph_main_1_0_0_sm90.profile").write_bytes(b"\x00")
    attempts: list[list[str]] = []

    class TensorRTStandIn(select.OrtEngine):  # type: ignore[misc]
        """ORT with TensorRT fails to deserialize a truncated engine; with the engine gone it builds one."""

        def __init__(self, path: str, opts: RuntimeOptions, choice: EngineChoice) -> None:
            present = sorted(p.name for p in cache.glob("*.engine"))
            attempts.append(present)
            if present:  # ORT's wording (tensorrt_execution_provider.cc), as OrtEngine passes it on
                raise ModelLoadError(
                    f"cannot load model {path} on ['TensorrtExecutionProvider']: [ONNXRuntimeError] : 6 : "
                    f"RUNTIME_EXCEPTION : TensorRT EP could not deserialize engine from cache: {cache / present[0]}"
                )
            cpu_only = EngineChoice("cpu", (Provider(CPU),), {})
            super().__init__(path, opts, cpu_only)

    monkeypatch.setattr(select, "OrtEngine", TensorRTStandIn)
    engine = select.build(str(model_files.fp32), RuntimeOptions(), _choice(cache))
    assert attempts == [["TensorrtExecutionProvider_TRTKernel_graph_main_1_0_0_sm90.engine"], []]
    assert engine.spec.input_name  # a real session, built on the second try
    rejected = sorted(p.name for p in (cache / "rejected").iterdir())
    assert [n.rsplit(".", 1)[0] for n in rejected] == [
        "TensorrtExecutionProvider_TRTKernel_graph_main_1_0_0_sm90.engine",
        "TensorrtExecutionProvider_TRTKernel_graph_main_1_0_0_sm90.profile",
    ]
    assert not list(cache.glob("*.engine")) and (cache / ".build.lock").is_file()


def test_setting_aside_twice_keeps_both_rejected_copies(tmp_path: Path) -> None:
    cache = tmp_path / "key"
    cache.mkdir()
    name = "TensorrtExecutionProvider_TRTKernel_graph_main_1_0_0_sm90.engine"
    for content in (b"first", b"second"):
        (cache / name).write_bytes(content)
        assert select._set_aside_cached_engines(_choice(cache), ModelLoadError("could not deserialize"))
    kept = sorted((cache / "rejected").iterdir())
    assert len(kept) == 2 and {p.read_bytes() for p in kept} == {b"first", b"second"}
    assert all(p.name.startswith(name + ".") for p in kept)


def test_another_load_error_is_raised_and_leaves_the_cached_engines_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_files: Any
) -> None:
    """On a shared cache one Pod's trouble (its GPU out of memory) must not throw away the fleet's engines."""
    cache = tmp_path / "key"
    cache.mkdir()
    engine = cache / "TensorrtExecutionProvider_TRTKernel_graph_main_1_0_0_sm90.engine"
    engine.write_bytes(b"a good engine")
    calls: list[int] = []

    class OutOfMemory(select.OrtEngine):  # type: ignore[misc]
        def __init__(self, path: str, opts: RuntimeOptions, choice: EngineChoice) -> None:
            calls.append(1)
            raise ModelLoadError(
                f"cannot load model {path} on ['TensorrtExecutionProvider']: [ONNXRuntimeError] : 6 : "
                "RUNTIME_EXCEPTION : CUDA failure 2: out of memory"
            )

    monkeypatch.setattr(select, "OrtEngine", OutOfMemory)
    with pytest.raises(ModelLoadError, match="out of memory"):
        select.build(str(model_files.fp32), RuntimeOptions(), _choice(cache))
    assert calls == [1]
    assert engine.read_bytes() == b"a good engine" and not (cache / "rejected").exists()


def test_a_failure_with_nothing_cached_is_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_files: Any
) -> None:
    calls: list[int] = []

    class Failing(select.OrtEngine):  # type: ignore[misc]
        def __init__(self, path: str, opts: RuntimeOptions, choice: EngineChoice) -> None:
            calls.append(1)
            raise ModelLoadError("out of device memory")

    monkeypatch.setattr(select, "OrtEngine", Failing)
    with pytest.raises(ModelLoadError, match="out of device memory"):
        select.build(str(model_files.fp32), RuntimeOptions(), _choice(tmp_path / "empty"))
    assert calls == [1]  # not retried: there was nothing to blame


def test_a_cache_on_a_file_system_without_locks_builds_unlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_files: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An NFS mount with `nolock` (or a FUSE file system) answers flock() with ENOLCK: such a mount cannot be made
    here, so flock's answer is stood in for; the build goes on, and says it had no lock."""
    import errno

    def no_locks(fd: Any, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(select.fcntl, "flock", no_locks)
    cpu = EngineChoice("cpu", (Provider(CPU),), {})

    class CpuStandIn(select.OrtEngine):  # type: ignore[misc]
        def __init__(self, path: str, opts: RuntimeOptions, choice: EngineChoice) -> None:
            super().__init__(path, opts, cpu)

    monkeypatch.setattr(select, "OrtEngine", CpuStandIn)
    with caplog.at_level("WARNING", logger="ray.serve"):
        engine = select.build(str(model_files.fp32), RuntimeOptions(), _choice(tmp_path / "nolock"))
    assert engine.spec.input_name
    assert "cannot be locked" in caplog.text and "building without the lock" in caplog.text


def test_other_lock_errors_still_fail_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_files: Any
) -> None:
    import errno

    def interrupted(fd: Any, op: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(select.fcntl, "flock", interrupted)
    with pytest.raises(OSError, match="Input/output error"):
        select.build(str(model_files.fp32), RuntimeOptions(), _choice(tmp_path / "eio"))


def test_the_engine_files_state_tells_a_rewrite_under_the_same_name(tmp_path: Path) -> None:
    """What build-engines and benchmarks/gpu_check.py compare: a rebuilt engine keeps its name, not its state."""
    key = tmp_path / "key"
    (key / "rejected").mkdir(parents=True)
    (key / "rejected" / "old.engine").write_bytes(b"set aside")
    (key / "timing.cache").write_bytes(b"not an engine")
    engine = key / "TensorrtExecutionProvider_TRTKernel_graph_main_1_0_0_sm90.engine"
    engine.write_bytes(b"engine")
    before = select.engine_files_state(tmp_path)
    assert list(before) == ["key/TensorrtExecutionProvider_TRTKernel_graph_main_1_0_0_sm90.engine"]
    assert select.engine_files_state(tmp_path) == before  # read, not written: the same
    (key / "new").write_bytes(b"engine")  # the same size, written again under the same name
    (key / "new").replace(engine)
    assert select.engine_files_state(tmp_path) != before
    assert select.engine_files_state(tmp_path / "absent") == {}
