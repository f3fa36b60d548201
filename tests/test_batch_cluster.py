"""`python -m app.batch` on a two-node local Ray cluster (`ray.cluster_utils.Cluster`): real photographs and files the
API refuses scored into Parquet and read back with pyarrow; `evaluate` against `python -m app.models report
--eval-dir` on the same labelled tree. Run apart from the session cluster: `pytest -m cluster`."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import ray
import yaml
from ray.cluster_utils import Cluster

from app.batch.cli import main
from app.config import AppArgs
from app.served_model import ModelFiles
from app.toolchain.report import build_report
from app.toolchain.samples import sample_path
from tests.batch_files import bad_files
from tests.conftest import local_config
from tests.test_app import EXPECTED

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# EXPECTED: what /v1/classify answers for these photographs with either variant on configs/local.yaml, asserted
# against the served app by tests/test_app.py::test_sample_photographs_classified_by_both_variants (the session tier;
# serving the app here too would double this module's time).
PHOTOS = {"chelsea": "chelsea.png", "coffee": "coffee.png", "rocket": "rocket.jpg", "astronaut": "people/astronaut.png"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=2)
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def write_config(model_files: ModelFiles, path: Path, engine: str | None = None, **args: Any) -> Path:
    cfg = copy.deepcopy(local_config(model_files))
    if engine is not None:
        for v in cfg["applications"][0]["args"]["variants"].values():
            v["engine"] = engine
    cfg["applications"][0]["args"] |= args
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_score_writes_a_row_per_image_and_variant_with_the_apis_answers_and_errors(
    cluster: Cluster, model_files: ModelFiles, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = tmp_path / "images"
    (images / "people").mkdir(parents=True)
    for name, rel in PHOTOS.items():
        shutil.copy(sample_path(name), images / rel)
    codes = bad_files(images)
    config = write_config(model_files, tmp_path / "local.yaml")
    out = tmp_path / "scores"
    assert main(["score", str(config), "--input", str(images), "--output", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] == len(PHOTOS) + len(codes) and summary["rows"] == 2 * summary["images"]
    assert summary["errors"] == {c: list(codes.values()).count(c) for c in set(codes.values())}
    assert 0 < summary["first_rows_s"] <= summary["seconds"]

    # Written by the driver: this run's one file (under the row cap), named by the run.
    names = [p.name for p in out.iterdir()]
    assert summary["files"] == 1 and len(names) == 1 and re.fullmatch(r"[0-9a-f]{12}-00000\.parquet", names[0]), names
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == summary["rows"]
    args = AppArgs.model_validate(yaml.safe_load(config.read_text())["applications"][0]["args"])
    declaration = json.loads(rows[0]["declaration"])
    assert declaration == args.model.model_dump(mode="json")
    nodes = {n["NodeID"] for n in ray.nodes()}
    by_variant: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_variant.setdefault(r["variant"], {})[Path(r["path"]).name] = r
        assert {r["decode_node"], r["score_node"]} <= nodes
    assert set(by_variant) == {"int8", "fp32"}
    for variant, got in by_variant.items():
        model = Path(args.variants[variant].model_path)
        assert {r["model_sha256"] for r in got.values()} == {hashlib.sha256(model.read_bytes()).hexdigest()}
        # local.yaml's gate (int8 against fp32, warn): the verdict of the actor's node on the int8 rows, none on fp32's
        gates = {r["speed_gate"] for r in got.values()}
        if variant == "fp32":
            assert gates == {None}
        else:
            assert len(gates) == 1 and next(iter(gates)).startswith("speed gate: int8 does "), gates
        for name, code in codes.items():
            assert got[name]["error_code"] == code and got[name]["error_message"], (variant, name)
            assert got[name]["class_ids"] is None
        for name, rel in PHOTOS.items():
            r = got[Path(rel).name]
            assert r["error_code"] is None and len(r["class_ids"]) == 5 == len(r["labels"]) == len(r["scores"])
            assert r["scores"] == sorted(r["scores"], reverse=True) and 0 < r["scores"][0] <= 1
            if name in EXPECTED:
                assert r["class_ids"][0] == EXPECTED[name], (variant, name, r["labels"])


def test_a_failed_speed_gate_with_action_fail_fails_the_job_naming_the_variant(
    cluster: Cluster, model_files: ModelFiles, tmp_path: Path
) -> None:
    """As it fails a Classifier replica: the scoring actor raises, and Ray Data fails the job with its message."""
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(sample_path("rocket"), images / "rocket.jpg")
    gate = {"baseline": "fp32", "min_speedup": 1e9, "action": "fail"}  # a speed-up no measurement reaches
    config = write_config(model_files, tmp_path / "local.yaml", engine="cpu", speed_gate=gate)
    with pytest.raises(Exception) as failed:  # Ray's error for an actor that died in its constructor, wrapping ours
        main(["score", str(config), "--input", str(images), "--output", str(tmp_path / "scores"), "--variants", "int8"])
    message = str(failed.value)
    assert "batch int8: speed gate: int8 does " in message and " (speed_gate.action: fail)" in message, message


def test_evaluate_gives_the_accuracy_of_models_report_on_the_same_tree(
    cluster: Cluster, model_files: ModelFiles, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "eval"
    # By label and by id, as --eval-dir takes them; the astronaut filed under a class it is not.
    for folder, name in (("tiger_cat", "chelsea"), ("967", "coffee"), ("missile", "rocket"), ("285", "astronaut")):
        (tree / folder).mkdir(parents=True)
        shutil.copy(sample_path(name), tree / folder / sample_path(name).name)
    # ONNX Runtime's CPU EP for both, as the report judges a cpu build (engine auto might pick OpenVINO).
    config = write_config(model_files, tmp_path / "local.yaml", engine="cpu")
    report_json, report_md = tmp_path / "eval.json", tmp_path / "eval.md"
    argv = ["evaluate", str(config), "--input", str(tree), "--json", str(report_json), "--markdown", str(report_md)]
    assert main([*argv, "--min-accuracy-drop", "-1"]) == 1  # any drop, even none, exceeds -1: the gate refuses
    assert "exceeds --min-accuracy-drop" in capsys.readouterr().err
    got = json.loads(report_json.read_text())
    assert "| top-1 agreement INT8 vs FP32 |" in report_md.read_text()

    args = AppArgs.model_validate(yaml.safe_load(config.read_text())["applications"][0]["args"])
    reference = build_report(model_files.fp32, model_files.int8, args.model, "cpu", eval_dir=tree, batch_sizes=(1,))
    q = reference["quality"]
    assert got["variants"]["fp32"]["labelled_images"] == q["labelled_images"] == 4
    assert got["variants"]["fp32"]["top1_accuracy"] == q["fp32_top1_accuracy"] == 0.75
    assert got["variants"]["int8"]["top1_accuracy"] == q["int8_top1_accuracy"]
    assert got["quality"]["int8"]["top1_agree_count"] == q["top1_agree_count"]
