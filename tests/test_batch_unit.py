"""app/batch/ without Ray: the sources, the decode's error rows, the pool's size, the scoring actor's rows and its speed
gate, the evaluation report and the command line's refusals. Ray Data runs in tests/test_batch_cluster.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import ray

from app.batch.cli import main
from app.batch.decoding import decode_batch
from app.batch.evaluation import largest_drop, report, to_markdown
from app.batch.pipeline import Job
from app.batch.scoring import SCHEMA, Scorer, serve_variant
from app.batch.sizing import Pool, cpu_actors, size_pool
from app.batch.sources import list_images
from app.config import AppArgs, Limits
from app.imaging.transform import Transform
from app.served_model import ModelFiles
from app.toolchain.samples import sample_bytes
from tests.batch_files import bad_files
from tests.conftest import load_config, local_config


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here may start Ray: ray.init raises (as Ray Serve's own unit tests hold theirs)."""

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test started Ray")

    monkeypatch.setattr(ray, "init", refused)


def test_a_tree_lists_images_recursively_with_their_class_folders(tmp_path: Path) -> None:
    (tmp_path / "285").mkdir()
    (tmp_path / "285" / "a.png").write_bytes(b"x")
    (tmp_path / "top.JPG").write_bytes(b"x")
    (tmp_path / "readme.txt").write_text("not listed")
    listed = list_images(str(tmp_path))
    assert listed.paths == [str(tmp_path / "285" / "a.png"), str(tmp_path / "top.JPG")]
    assert listed.folders == ["285", None]


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_a_list_names_the_images_relative_paths_from_its_own_directory(tmp_path: Path, kind: str) -> None:
    table = pa.table({"path": ["images/a.png", "/elsewhere/b.jpg", "s3://bucket/c.png"]})
    path = tmp_path / f"list.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    else:
        pa_csv.write_csv(table, path)
    listed = list_images(str(path))
    assert listed.paths == [str(tmp_path / "images" / "a.png"), "/elsewhere/b.jpg", "s3://bucket/c.png"]


def test_no_images_and_no_path_column_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no images"):
        list_images(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no such"):
        list_images(str(tmp_path / "missing"))
    pq.write_table(pa.table({"file": ["a.png"]}), tmp_path / "list.parquet")
    with pytest.raises(ValueError, match="no `path` column"):
        list_images(str(tmp_path / "list.parquet"))


def test_every_bad_file_is_a_row_with_the_apis_error_code(tmp_path: Path) -> None:
    codes = bad_files(tmp_path)
    (tmp_path / "big.jpg").write_bytes(b"\xff\xd8" + b"\0" * 2**20)
    codes["big.jpg"] = "payload_too_large"
    codes["missing.png"] = "missing_file"
    (tmp_path / "good.jpg").write_bytes(sample_bytes("rocket"))
    codes["good.jpg"] = ""
    names = sorted(codes)
    t = Transform(224, 224, 3, 256, "cubic", "RGB")
    limits = Limits(max_body_bytes=2**20, max_json_bytes=2**20).model_dump()
    out = decode_batch({"path": np.array([str(tmp_path / n) for n in names])}, t.to_dict(), limits)
    assert dict(zip(names, out["error_code"], strict=True)) == codes
    good = names.index("good.jpg")
    assert out["pixels"].shape == (len(names), 224, 224, 3) and out["pixels"][good].any()
    assert all(m for n, m in zip(names, out["error_message"], strict=True) if codes[n])


def test_the_pool_follows_the_gpus_or_fills_the_cores_with_small_engines_and_leaves_half_the_cpus_to_decoding() -> None:
    cfg = load_config("prod.yaml")
    args = AppArgs.model_validate(cfg["applications"][0]["args"])
    gpu_nodes = [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}, {"CPU": 4.0}]
    pool = size_pool(gpu_nodes, cfg, args, ["int8", "fp32"])
    assert pool.num_gpus == 0.5 and pool.actors == 4  # a Classifier's half GPU: two a GPU
    assert size_pool(gpu_nodes, cfg, args, ["fp32"], actors=1, gpus_per_actor=1.0).actors == 1
    local = load_config("local.yaml")
    largs = AppArgs.model_validate(local["applications"][0]["args"])
    # CPU nodes: one-thread engines filling the cores, half the logical CPUs left to the decode tasks
    assert size_pool([{"CPU": 2.0}], local, largs, ["fp32"]) == Pool(2, 0.5, 0.0, 1, pool_batch(local))
    assert size_pool([{"CPU": 1.0}, {"CPU": 1.0}], local, largs, ["fp32"]) == Pool(1, 1.0, 0.0, 1, pool_batch(local))
    big = size_pool([{"CPU": 16.0}] * 4, local, largs, ["fp32"])
    assert (big.actors, big.num_cpus, big.threads) == (32, 1.0, 2)  # 8 a node of 2 threads, 8 of 16 CPUs reserved
    for cores in (2, 3, 8, 16, 64):
        num_cpus, per_node, threads = cpu_actors(cores)
        assert per_node * threads <= cores and num_cpus * per_node == cores / 2
    with pytest.raises(ValueError, match="--actors"):
        size_pool([{"CPU": 2.0}], local, largs, ["fp32"], actors=0)


def cpu_args(model_files: ModelFiles, **changes: Any) -> dict[str, Any]:
    """configs/local.yaml's args (its speed gate: int8 against fp32, warn) on the real files, ONNX Runtime's CPU EP."""
    args = local_config(model_files)["applications"][0]["args"]
    for v in args["variants"].values():
        v["engine"] = "cpu"
    return dict(args, **changes)


def test_the_scorer_carries_the_speed_gates_verdict_on_every_row_of_the_gated_variant(
    model_files: ModelFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Context:  # the actor's own, stood in: one CPU granted, on node "n1"
        def get_assigned_resources(self) -> dict[str, float]:
            return {"CPU": 1.0}

        def get_node_id(self) -> str:
            return "n1"

    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [])
    monkeypatch.setattr(ray, "get_runtime_context", Context)
    scorer = Scorer(cpu_args(model_files), ["int8", "fp32"], top=5, batch_size=2, threads=1, declaration="{}")
    batch = {
        "path": np.array(["a.png", "b.png"], dtype=object),
        "pixels": np.full((2, 224, 224, 3), 127, dtype=np.uint8),
        "error_code": np.array(["", "undecodable_image"], dtype=object),
        "error_message": np.array(["", "not an image"], dtype=object),
        "decode_node": np.array(["n0", "n0"], dtype=object),
        "decode_cpu_ms": np.array([1.0, 2.0]),
    }
    table = scorer(batch)
    assert table.schema == SCHEMA and table.num_rows == 4
    gates = {(r["variant"], r["path"]): r["speed_gate"] for r in table.to_pylist()}
    assert gates[("fp32", "a.png")] is None and gates[("fp32", "b.png")] is None  # the baseline: no gate applies
    assert gates[("int8", "a.png")] == gates[("int8", "b.png")]  # one verdict, on every row, error rows too
    assert gates[("int8", "a.png")].startswith("speed gate: int8 does ")
    assert " img/s at batch 2, fp32 does " in gates[("int8", "a.png")]


def test_a_failed_speed_gate_with_action_fail_fails_the_actor_naming_the_variant(model_files: ModelFiles) -> None:
    """A gate no measurement passes (1e9x): `fail` refuses the variant, as it fails a Classifier replica; `warn` lets it
    score, its verdict on its rows."""
    gate = {"baseline": "fp32", "min_speedup": 1e9}
    args = AppArgs.model_validate(cpu_args(model_files, speed_gate=gate | {"action": "fail"}))
    with pytest.raises(RuntimeError) as failed:
        serve_variant(args, "int8", gpu=False, threads=1, batch_size=2)
    message = str(failed.value)
    assert message.startswith("batch int8: speed gate: int8 does ") and " is below min_speedup " in message
    assert message.endswith(" (speed_gate.action: fail)")
    warned = serve_variant(AppArgs.model_validate(cpu_args(model_files, speed_gate=gate)), "int8", False, 1, 2)
    assert warned.speed_gate is not None and " is below min_speedup " in warned.speed_gate
    assert warned.engine_name == "cpu" and warned.io.served.source == model_files.int8
    warned.engine.close()


def pool_batch(cfg: dict[str, Any]) -> int:
    return max(
        (d.get("user_config") or {}).get("max_batch_size", 16)
        for d in cfg["applications"][0]["deployments"]
        if d["name"] == "Classifier_fp32"
    )


def rows(answers: dict[str, dict[str, list[int] | None]]) -> pa.Table:
    out: dict[str, list[Any]] = {"path": [], "variant": [], "class_ids": [], "error_code": []}
    out |= {"engine": [], "model_sha256": []}
    for variant, by_path in answers.items():
        for path, ids in by_path.items():
            out["path"].append(path)
            out["variant"].append(variant)
            out["class_ids"].append(ids)
            out["error_code"].append(None if ids else "undecodable_image")
            out["engine"].append("cpu")
            out["model_sha256"].append("0" * 64)
    return pa.table(out)


def test_the_report_counts_accuracy_agreement_and_the_per_class_drop() -> None:
    cfg = load_config("local.yaml")
    args = AppArgs.model_validate(cfg["applications"][0]["args"])
    job = Job(args, ["int8", "fp32"], Pool(1, 1.0, 0.0, 1, 16), 5)
    truth = {"a": 1, "b": 1, "c": 2, "d": None, "e": 2}
    answers = {
        "fp32": {"a": [1, 9], "b": [1, 9], "c": [2, 9], "d": [7, 9], "e": None},
        "int8": {"a": [1, 9], "b": [9, 1], "c": [2, 9], "d": [8, 9], "e": None},
    }
    labels = [f"class {i}" for i in range(10)]
    r = report(rows(answers), truth, labels, job, "tree", "fp32")
    assert r["variants"]["fp32"] | {"engine": "", "model_sha256": ""} == {
        "images": 4, "labelled_images": 3, "top1_accuracy": 1.0, "top5_accuracy": 1.0, "top1_count": 3,
        "top5_count": 3, "errors": 1, "engine": "", "model_sha256": "",
    }  # fmt: skip
    assert r["variants"]["int8"]["top1_accuracy"] == pytest.approx(2 / 3)
    assert r["variants"]["int8"]["top5_accuracy"] == 1.0
    q = r["quality"]["int8"]
    assert (q["top1_agree_count"], q["images"]) == (2, 4)
    assert q["fp32_top1_accuracy"] - q["int8_top1_accuracy"] == pytest.approx(1 / 3)
    assert largest_drop(r) == pytest.approx(1 / 3)
    worst = r["per_class"]["int8"][0]
    assert (worst["class_id"], worst["images"], worst["drop"]) == (1, 2, 0.5)
    md = to_markdown(r)
    assert "| top-1 agreement INT8 vs FP32 | 0.500 (2/4) |" in md and "| 1 class 1 | 2 |" in md


def test_the_command_line_refuses_an_unknown_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["score", "configs/local.yaml", "--input", ".", "--output", "x", "--variants", "fp64"]) == 2
    assert "fp64" in capsys.readouterr().err
