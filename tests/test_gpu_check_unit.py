"""benchmarks/gpu_check.py without a GPU: the whole flow as a CPU dry run, the report, and the refusals.

Pure: no Ray. Every run is tiny (batch 1 and 2, a few timed calls, in this process), so the module takes seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.runtime.ort_engine import missing_libraries, usable_providers
from app.runtime.plan import CPU, CUDA, TENSORRT
from app.served_model import ModelFiles
from benchmarks import gpu_check
from benchmarks.gpu_check import TARGETS, TORCH, Check, batch_table, run

ORT_TARGETS = [t for t in TARGETS if t.framework != TORCH]  # the torch ones have tests of their own below
TARGET_NAMES = [t.name for t in ORT_TARGETS]
FAST = {"warmup": 1, "min_runs": 2, "max_runs": 3, "budget_s": 0.01}


def _check(files: ModelFiles, out_dir: Path, **over: Any) -> Check:
    """A dry run of every target at batch 1 and 2 in this process; the TensorRT artifact when it is built, else
    the CPU INT8 one as a stand-in (the CPU EP runs either)."""
    trt = files.root / "efficientnet_lite0-int8-trt.onnx"
    models = {"fp32": str(files.fp32), "int8": str(files.int8), "trt_int8": str(trt if trt.is_file() else files.int8)}
    if not files.fp16.is_file():
        from app.toolchain.fp16 import convert

        convert(files.fp32, files.fp16)
    models["fp16"] = str(files.fp16)
    settings: dict[str, Any] = {"batches": (1, 2), "dry_run": True, "models": models, "timing": FAST}
    settings |= {"targets": ORT_TARGETS, "agreement_images": 3}
    return Check(**{**settings, "isolate": False, "out_dir": out_dir, **over})


def _table_rows(markdown: str) -> list[list[str]]:
    """The data rows of the first Markdown table in `markdown`."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| target | batch |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


@pytest.fixture(scope="module")
def dry_run(model_files: ModelFiles, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("gpu-check")
    rc = run(_check(model_files, out))
    return {"rc": rc, "files": sorted(out.iterdir())}


def _json(run: dict[str, Any]) -> dict[str, Any]:
    [path] = [f for f in run["files"] if f.suffix == ".json"]
    return json.loads(path.read_text())


def test_the_dry_run_writes_json_and_markdown_beside_it_with_every_target_and_batch(dry_run: dict[str, Any]) -> None:
    assert dry_run["rc"] == 0
    names = sorted(f.name for f in dry_run["files"])
    assert len(names) == 2 and names[0].endswith("-gpu-dryrun.json") and names[1].endswith("-gpu-dryrun.md")
    assert names[0].removesuffix(".json") == names[1].removesuffix(".md")
    result = _json(dry_run)
    assert result["dry_run"] is True
    assert list(result["targets"]) == list(TARGET_NAMES)
    for name, r in result["targets"].items():
        assert "error" not in r, name
        assert [b["batch"] for b in r["batches"]] == [1, 2]
        for b in r["batches"]:
            assert b["runs"] >= 2 and 0 < b["p50_ms"] <= b["max_ms"]
            assert b["images_per_s"] == pytest.approx(b["batch"] * 1000 / b["p50_ms"])
    assert {"onnxruntime", "tensorrt", "usable_providers", "missing_libraries"} <= set(result["runtime"])
    assert result["environment"]["packages"]


def test_the_graph_targets_capture_check_and_decide_on_the_cpu_ep(dry_run: dict[str, Any]) -> None:
    """The dry run walks the CUDA graphs' code path (buffers, slot threads, captures, checks, the per-size decision)
    on the CPU EP, where nothing is really captured: the GPU's run meets no untried code."""
    targets = _json(dry_run)["targets"]
    for name in ("cuda-fp32-graphs", "cuda-fp16-graphs"):
        graphs = targets[name]["cold_start"]["cuda_graphs"]
        assert graphs["enabled"] and graphs["buckets_captured"] == [1, 2] and graphs["prepared"]
        assert not graphs["slots_without_graphs"] and set(graphs["plain_ms"]) <= {"1", "2"}
    assert targets["cuda-fp32"]["cold_start"].get("cuda_graphs") is None
    assert targets["cuda-fp16"]["model"].endswith("efficientnet_lite0-fp16.onnx")


def test_every_node_of_the_dry_run_is_placed_and_all_on_the_cpu_ep(dry_run: dict[str, Any]) -> None:
    targets = _json(dry_run)["targets"]
    for name, r in targets.items():
        assert r["intended_provider"] == CPU, name
        placement = r["cold_start"]["placement"]
        assert set(placement) == {CPU} and r["nodes_per_provider"] == {CPU: len(placement[CPU])}, name
        assert len(placement[CPU]) > 0 and r["not_on_intended"] == []
        assert r["cached_placement_same"] is True
        assert [p["name"] for p in r["ran"]["providers"]] == [CPU]
        assert r["cold_start"]["requested_providers"] == r["cold_start"]["providers"] == [CPU]
    # the QDQ graph has its Quantize/Dequantize nodes: more nodes than the FP32 graph it came from
    assert targets["cuda-int8-qdq"]["nodes_per_provider"][CPU] > targets["cuda-fp32"]["nodes_per_provider"][CPU]


def test_cold_and_cached_start_are_both_reported(dry_run: dict[str, Any]) -> None:
    for name, r in _json(dry_run)["targets"].items():
        for phase in ("cold_start", "cached_start"):
            start = r[phase]
            assert start["session_s"] > 0 and start["first_call_ms"] > 0, (name, phase)
            assert start["first_call_batch"] == 1
            assert start["engine_cache"] == {"files": 0, "bytes": 0}  # the CPU EP writes no engine
        assert r["cached_start_rebuilt"] is False
        assert "batches" not in r["cold_start"] and "batches" not in r["cached_start"]
        assert Path(r["cache_dir"]).name == name  # each target builds into its own directory


def test_the_dry_run_records_the_gpu_providers_the_real_run_would_request(dry_run: dict[str, Any]) -> None:
    targets = _json(dry_run)["targets"]

    def planned(name: str) -> list[dict[str, Any]]:
        return targets[name]["planned"]["providers"]

    assert [p["name"] for p in planned("trt-int8")] == [TENSORRT, CUDA, CPU]
    assert [p["name"] for p in planned("trt-fp16")] == [TENSORRT, CUDA, CPU]
    assert [p["name"] for p in planned("cuda-fp32")] == [CUDA, CPU]
    assert [p["name"] for p in planned("cuda-int8-qdq")] == [CUDA, CPU]
    int8, fp16 = planned("trt-int8")[0]["options"], planned("trt-fp16")[0]["options"]
    assert (int8["trt_int8_enable"], int8["trt_fp16_enable"]) == (True, False)
    assert (fp16["trt_int8_enable"], fp16["trt_fp16_enable"]) == (False, True)
    assert fp16["trt_profile_max_shapes"] == "image:64x224x224x3"
    # each TensorRT target builds into its own directory under the run's cache root
    assert int8["trt_engine_cache_path"].startswith(targets["trt-int8"]["cache_dir"] + "/")
    assert fp16["trt_engine_cache_path"].startswith(targets["trt-fp16"]["cache_dir"] + "/")
    assert targets["cuda-int8-qdq"]["model"].endswith("efficientnet_lite0-int8.onnx")
    assert targets["trt-fp16"]["model"] == targets["cuda-fp32"]["model"]


def test_the_table_has_one_row_per_target_and_batch(dry_run: dict[str, Any]) -> None:
    result = _json(dry_run)
    md = next(f for f in dry_run["files"] if f.suffix == ".md").read_text()
    rows = _table_rows(md)
    assert [(r[0], r[1]) for r in rows] == [(t, b) for t in TARGET_NAMES for b in ("1", "2")]
    assert _table_rows(batch_table(result)) == rows
    by_key = {(r[0], r[1]): r for r in rows}
    assert by_key[("cuda-fp32", "1")][6] == "1.00x"  # the reference against itself
    qdq = result["targets"]["cuda-int8-qdq"]["batches"][1]["images_per_s"]
    ref = result["targets"]["cuda-fp32"]["batches"][1]["images_per_s"]
    assert by_key[("cuda-int8-qdq", "2")][6] == f"{qdq / ref:.2f}x"
    assert "cold start s" in md and "cached start s" in md and "nodes not on intended EP" in md


def test_the_table_is_printed_too(model_files: ModelFiles, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_check(model_files, tmp_path, targets=[TARGETS[2]])) == 0
    out = capsys.readouterr().out
    assert [(r[0], r[1]) for r in _table_rows(out)] == [("cuda-fp32", "1"), ("cuda-fp32", "2")]
    # the engine caches go to a temporary directory, removed afterwards
    [path] = tmp_path.glob("*.json")
    cache_root = Path(json.loads(path.read_text())["targets"]["cuda-fp32"]["cache_dir"]).parent
    assert cache_root.name.startswith("gpu-check-cache-") and not cache_root.exists()


@pytest.mark.skipif(
    {TENSORRT, CUDA} <= set(usable_providers()), reason="the GPU providers load here: nothing is missing"
)
def test_without_the_gpu_libraries_it_exits_2_naming_them(
    model_files: ModelFiles, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(_check(model_files, tmp_path, dry_run=False)) == 2
    err = capsys.readouterr().err
    missing = set(missing_libraries(TENSORRT)) | set(missing_libraries(CUDA))
    assert missing, "no library missing, yet the providers are unusable"
    for lib in missing:
        assert lib in err
    assert "--cpu-dry-run" in err
    assert list(tmp_path.iterdir()) == []
    # only the CUDA targets: TensorRT's own libraries are not asked for
    if missing_libraries(CUDA):
        assert run(_check(model_files, tmp_path, dry_run=False, targets=[TARGETS[2]])) == 2
        err = capsys.readouterr().err
        assert TENSORRT not in err and "libnvinfer" not in err and missing_libraries(CUDA)[0] in err


def test_a_missing_model_file_fails_its_targets_only(model_files: ModelFiles, tmp_path: Path) -> None:
    check = _check(model_files, tmp_path, targets=[TARGETS[0], TARGETS[3]])
    gone = check.models["trt_int8"] = str(tmp_path / "no-such-int8-trt.onnx")
    assert run(check) == 1
    [path] = tmp_path.glob("*.json")
    targets = json.loads(path.read_text())["targets"]
    assert targets["trt-int8"]["error"].startswith("planning:") and gone in targets["trt-int8"]["error"]
    assert "error" not in targets["cuda-int8-qdq"]


def test_a_target_that_fails_is_reported_and_the_others_still_run(model_files: ModelFiles, tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    three = [t for t in ORT_TARGETS if t.name in ("trt-fp16", "cuda-fp32", "cuda-int8-qdq")]
    check = _check(model_files, tmp_path, targets=three)
    check.models["fp32"] = str(broken)
    assert run(check) == 1
    [path] = tmp_path.glob("*.json")
    result = json.loads(path.read_text())
    assert result["targets"]["trt-fp16"]["error"].startswith("planning:")  # TensorRT's options read the model
    assert result["targets"]["cuda-fp32"]["error"].startswith("cold start:")
    assert "error" not in result["targets"]["cuda-int8-qdq"]
    rows = _table_rows(batch_table(result))
    assert len(rows) == 6
    assert all(r[7].startswith("failed") and r[6] == "n/a" for r in rows if r[0] != "cuda-int8-qdq")
    assert all(r[5] != "n/a" and r[6] == "n/a" for r in rows if r[0] == "cuda-int8-qdq")  # the reference did not run


def test_each_start_can_run_in_a_fresh_process(model_files: ModelFiles, tmp_path: Path) -> None:
    check = _check(model_files, tmp_path, targets=[TARGETS[2]], batches=(1,), isolate=True)
    assert run(check) == 0
    [path] = tmp_path.glob("*.json")
    result = json.loads(path.read_text())
    r = result["targets"]["cuda-fp32"]
    assert result["isolate"] is True
    assert r["cold_start"]["session_s"] > 0 and r["cached_start"]["session_s"] > 0
    assert set(r["nodes_per_provider"]) == {CPU}


def test_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--help"])
    assert e.value.code == 0 and "--cpu-dry-run" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--batches", "1"])  # the batches and targets are fixed: docs/engines.md
    assert e.value.code == 2


def test_a_target_whose_provider_cannot_load_is_skipped_and_the_others_run(
    model_files: ModelFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU node with ONNX Runtime's CUDA libraries but no TensorRT: the TensorRT targets are skipped with their
    reason, the CUDA ones run (here on the CPU EP: the dry run's flow, with TensorRT's absence stood in for)."""

    def no_tensorrt(target: gpu_check.Target, check: gpu_check.Check) -> str | None:
        return "TensorrtExecutionProvider cannot load libnvinfer.so.10" if target.intended == TENSORRT else None

    monkeypatch.setattr(gpu_check, "skip_reason", no_tensorrt)
    assert run(_check(model_files, tmp_path, batches=(1,))) == 0  # skipped is not failed
    [path] = tmp_path.glob("*.json")
    result = json.loads(path.read_text())
    targets = result["targets"]
    tensorrt = {"trt-int8", "trt-fp16", "trt-int8-graphs"}
    assert {n for n, r in targets.items() if "skipped" in r} == tensorrt
    assert all("libnvinfer" in targets[n]["skipped"] for n in tensorrt)
    assert all("error" not in r and "batches" in r for n, r in targets.items() if n.startswith("cuda-"))
    rows = _table_rows(batch_table(result))
    assert {r[0] for r in rows if r[7].startswith("skipped: ")} == tensorrt


def test_the_targets_are_chosen_on_the_command_line(
    model_files: ModelFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen: list[list[str]] = []
    monkeypatch.setattr(gpu_check, "run", lambda check: chosen.append([t.name for t in check.targets]) or 0)
    assert gpu_check.main(["--cpu-dry-run", "--targets", "cuda-fp32, trt-int8"]) == 0
    assert chosen == [["trt-int8", "cuda-fp32"]]  # in the table's order
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--targets", "cuda-fp32,torch-fp64"])
    assert e.value.code == 2


def test_the_issues_spelling_and_the_old_one_both_name_the_qdq_target(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[list[str]] = []
    monkeypatch.setattr(gpu_check, "run", lambda check: chosen.append([t.name for t in check.targets]) or 0)
    assert gpu_check.main(["--cpu-dry-run", "--targets", "cuda-qdq-int8,torch-fp32"]) == 0
    assert gpu_check.main(["--targets", "cuda-int8-qdq"]) == 0
    assert chosen == [["cuda-int8-qdq", "torch-fp32"], ["cuda-int8-qdq"]]


def test_every_target_is_compared_with_the_cpu_eps_fp32_answers(dry_run: dict[str, Any]) -> None:
    """The agreement images are real photographs: the FP32 model on the CPU EP agrees with the reference exactly
    (the same session), the INT8 ones classify them too but with logits of their own."""
    targets = _json(dry_run)["targets"]
    for name, r in targets.items():
        agreed = r["agreement"]
        assert agreed["images"] == 3 and agreed["reference"] == gpu_check.AGREEMENT_REFERENCE, name
        assert 0 <= agreed["top1_agree"] <= 1 and agreed["max_abs_logit_diff"] >= 0, name
        assert "agreement_logits" not in r["cold_start"]
    assert targets["cuda-fp32"]["agreement"]["max_abs_logit_diff"] == 0
    assert targets["cuda-fp32"]["agreement"]["top1_agree"] == 1
    assert targets["cuda-int8-qdq"]["agreement"]["max_abs_logit_diff"] > 0  # INT8 is not the FP32 network's output
    md = next(f for f in dry_run["files"] if f.suffix == ".md").read_text()
    assert "top-1 agree" in md and "max logit gap" in md


def test_without_a_reference_the_targets_still_run(model_files: ModelFiles, tmp_path: Path) -> None:
    check = _check(model_files, tmp_path, targets=[TARGETS[3]], batches=(1,))
    check.models["fp32"] = str(tmp_path / "gone-fp32.onnx")  # the reference's model; cuda-int8-qdq runs the INT8 one
    assert run(check) == 0
    [path] = tmp_path.glob("*.json")
    r = json.loads(path.read_text())["targets"]["cuda-int8-qdq"]
    assert "batches" in r and "gone-fp32.onnx" in r["agreement"]["error"]


def test_a_torch_target_without_torch_is_skipped_and_the_others_run(
    model_files: ModelFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Done-when command of issue 35 on a machine without torch (torch's absence stood in for where it is
    installed): cuda-fp32 is measured on the CPU EP, torch-fp32 is skipped saying why, exit 0."""
    monkeypatch.setattr(gpu_check, "torch_version", lambda: "not installed")
    torch_fp32 = next(t for t in TARGETS if t.name == "torch-fp32")
    assert run(_check(model_files, tmp_path, targets=[TARGETS[2], torch_fp32], batches=(1,))) == 0
    [path] = tmp_path.glob("*.json")
    result = json.loads(path.read_text())
    assert result["targets"]["torch-fp32"]["skipped"].startswith("torch not installed")
    assert "batches" in result["targets"]["cuda-fp32"] and result["runtime"]["torch"] == "not installed"
    rows = _table_rows(batch_table(result))
    assert [r[7][:29] for r in rows if r[0] == "torch-fp32"] == ["skipped: torch not installed "]


# --------------------------------------------------------------------------- torch (where it is installed)


def test_torch_targets_run_the_same_network_on_torchs_cpu(model_files: ModelFiles, tmp_path: Path) -> None:
    """The dry run of the torch targets (torch's CPU device): torch-fp32 measured, its answers the CPU EP's to
    float rounding; torch-fp16 skipped, as FP16 is emulated on a CPU. Needs torch (the gpu-check extra)."""
    pytest.importorskip("torch", reason="torch is not installed: the gpu-check extra, in a venv of its own")
    import onnx

    torch_targets = [t for t in TARGETS if t.framework == TORCH]
    assert run(_check(model_files, tmp_path, targets=torch_targets, batches=(1, 2))) == 0
    [path] = tmp_path.glob("*.json")
    targets = json.loads(path.read_text())["targets"]
    r = targets["torch-fp32"]
    assert r["intended_provider"] == "torch:cpu" and [b["batch"] for b in r["batches"]] == [1, 2]
    assert r["planned"]["device"] == "cuda" and r["ran"]["device"] == "cpu"
    assert r["cold_start"]["dtype"] == "float32" and r["cold_start"]["torch"]
    graph_nodes = len(onnx.load(str(model_files.fp32)).graph.node)
    assert r["nodes_per_provider"] == {"torch:cpu": graph_nodes} and r["not_on_intended"] == []
    assert r["agreement"]["top1_agree"] == 1 and r["agreement"]["max_abs_logit_diff"] < 1e-3
    assert "emulated" in targets["torch-fp16"]["skipped"]
