"""The model declaration (`args.model`, app/served_model/declaration.py): what it may say, what the graph refuses, and
`python -m app.config` naming the field of each contradiction without starting anything. Pure: no Ray."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from pydantic import ValidationError

from app.config import AppArgs
from app.served_model import BUILTIN_MODEL
from app.served_model.check import check_files
from app.served_model.declaration import ModelDeclaration, PreprocessDeclaration
from app.served_model.graph import graph_io_of
from app.served_model.model_io import check_transform, transform_for, transform_of
from tests.conftest import REPO, load_config
from tests.test_prologue import CLASSES, H, W, classifier


def _error(**fields: Any) -> str:
    with pytest.raises(ValidationError) as e:
        ModelDeclaration.model_validate({"name": "m", **fields})
    return str(e.value)


def test_the_declarations_own_rules() -> None:
    assert "set resize_shorter" in _error(preprocess={"crop": "center"})
    assert "add crop: center" in _error(preprocess={"resize_shorter": 256})
    assert "std must not be 0" in _error(preprocess={"std": [0.2, 0, 0.2]})
    assert "mean has 3 values and std 2" in _error(preprocess={"mean": [1, 2, 3], "std": [1, 2]})
    assert "preprocess.interpolation" in _error(preprocess={"interpolation": "lanczos"})
    assert "preprocess.scale" in _error(preprocess={"scale": 0})
    assert "output" in _error(output="softmax")
    assert "name" in _error(name="has space") and "name" in _error(name="a-b")  # '-' separates <name>-<variant>
    assert "extra_forbidden" in _error(labels="x.txt")  # a misspelt key
    m = ModelDeclaration.model_validate({"name": "my_classifier.v2"})
    assert m.preprocess.is_identity and m.output == "logits" and m.preprocess.per_channel(3) == ([0.0] * 3, [1.0] * 3)


def test_a_single_mean_or_std_applies_to_every_channel() -> None:
    p = PreprocessDeclaration(mean=[127], std=[128])
    assert p.per_channel(3) == ([127.0] * 3, [128.0] * 3) and p.per_channel(1) == ([127.0], [128.0])


FLOAT_NCHW = graph_io_of(classifier())  # 'input' float32 [N, 3, H, W]
GREY = graph_io_of(classifier(channels=1))
UINT8 = graph_io_of(classifier("uint8", "NHWC"))


@pytest.mark.parametrize(
    ("model", "graph", "labels", "field"),
    [
        ({"preprocess": {"mean": [0.5, 0.5, 0.5], "color": "GRAY"}}, GREY, None, "model.preprocess.mean"),
        ({"preprocess": {"std": [1, 2]}}, FLOAT_NCHW, None, "model.preprocess.std"),
        (
            {"preprocess": {"resize_shorter": max(H, W) - 1, "crop": "center"}},
            FLOAT_NCHW,
            None,
            "model.preprocess.resize_shorter",
        ),
        ({}, FLOAT_NCHW, CLASSES + 1, "model.labels_path"),
        ({}, GREY, None, "model.preprocess.color"),
        ({"preprocess": {"color": "GRAY"}}, FLOAT_NCHW, None, "model.preprocess.color"),
        ({"preprocess": {"scale": 0.5}}, UINT8, None, "model.preprocess.scale/mean/std"),
    ],
)
def test_a_declaration_contradicting_the_graph_names_the_field(
    model: dict[str, Any], graph: Any, labels: int | None, field: str
) -> None:
    declared = ModelDeclaration.model_validate({"name": "m", **model})
    with pytest.raises(ValueError, match=rf"^{field}.*\(variants\.x\.model_path: here\)$"):
        declared.check_against(graph, labels, "variants.x.model_path: here")


def test_a_declaration_that_fits_passes() -> None:
    ok = ModelDeclaration.model_validate(
        {"name": "m", "preprocess": {"resize_shorter": max(H, W), "crop": "center", "mean": [0.5], "std": [0.2]}}
    )
    ok.check_against(FLOAT_NCHW, CLASSES)
    ModelDeclaration.model_validate({"name": "m", "preprocess": {"color": "GRAY", "mean": [0.1]}}).check_against(GREY)


def test_labels_are_the_file_else_imagenets_for_1000_classes_else_class_i(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative labels_path is relative to the working directory
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    assert ModelDeclaration(name="m", labels_path="labels.txt").labels(2) == ["cat", "dog"]
    assert ModelDeclaration(name="m", labels_path="labels.txt").label_count() == 2
    with pytest.raises(ValueError, match=r"model.labels_path: 2 labels in .*labels.txt for a graph output of 3"):
        ModelDeclaration(name="m", labels_path="labels.txt").labels(3)
    with pytest.raises(FileNotFoundError, match=r"model\.labels_path: labels file not found"):
        ModelDeclaration(name="m", labels_path="none.txt").labels(2)
    assert ModelDeclaration(name="m", labels_path="none.txt").label_count() is None  # not on this machine
    imagenet = ModelDeclaration(name="m").labels(1000)
    assert len(imagenet) == 1000 and imagenet[285] == "Egyptian cat"
    assert ModelDeclaration(name="m").labels(3) == ["class_0", "class_1", "class_2"]


def test_the_built_in_declaration_is_the_default_only_for_the_built_in_files() -> None:
    assert AppArgs().model == ModelDeclaration.model_validate(BUILTIN_MODEL)
    builtin = {"variants": {"a": {"model_path": "/anywhere/efficientnet_lite0-int8-trt.onnx"}}}
    assert AppArgs.model_validate(builtin).model.name == "efficientnet_lite0"
    with pytest.raises(
        ValidationError, match=r"model: required for a variant that is not the built-in model \(m.onnx\)"
    ):
        AppArgs.model_validate({"variants": {"a": {"model_path": "m.onnx"}}})
    for old, new in (("model_name", "model.name"), ("labels_path", "model.labels_path")):
        with pytest.raises(ValidationError, match=f"{old} is now {new}"):
            AppArgs.model_validate({old: "x"})


def test_the_shipped_configs_declare_the_built_in_model_as_its_default_does() -> None:
    for name in ("local.yaml", "prod.yaml"):
        declared = AppArgs.model_validate(load_config(name)["applications"][0]["args"]).model
        assert declared.model_dump(exclude={"labels_path"}) == AppArgs().model.model_dump(exclude={"labels_path"})


def test_variants_of_one_model_must_take_the_same_input(tmp_path: Path) -> None:
    onnx.save(classifier(), tmp_path / "a.onnx")
    onnx.save(classifier(layout="NHWC"), tmp_path / "b.onnx")
    args = AppArgs.model_validate(
        {
            "model": {"name": "m"},
            "variants": {"a": {"model_path": str(tmp_path / "a.onnx")}, "b": {"model_path": str(tmp_path / "b.onnx")}},
        }
    )
    with pytest.raises(ValueError, match=r"variants.b.model_path: .* the variants of one model share its declaration"):
        check_files(args.model, args.model_files())
    missing = args.model_copy(
        update={
            "variants": {
                "a": args.variants["a"],
                "c": args.variants["a"].model_copy(update={"model_path": "none.onnx"}),
            }
        }
    )
    # a file not here is checked by its Classifier
    assert check_files(missing.model, missing.model_files()) == [tmp_path / "a.onnx"]


def test_the_deploy_reads_the_transform_from_the_first_file_here_and_a_node_with_another_file_refuses_to_start(
    tmp_path: Path,
) -> None:
    """build_app hands the Router the transform of the model's files as the deploying node has them (none there:
    None, the Router asks a Classifier); a Classifier whose own file wants another one fails its start saying so."""
    onnx.save(classifier(), tmp_path / "a.onnx")
    model = ModelDeclaration.model_validate({"name": "m", "preprocess": {"resize_shorter": 8, "crop": "center"}})
    files = [("variants.x.model_path", tmp_path / "absent.onnx"), ("variants.a.model_path", tmp_path / "a.onnx")]
    read = transform_of(model, files)
    assert read == transform_for(model, graph_io_of(onnx.load(str(tmp_path / "a.onnx"))))
    assert transform_of(model, files[:1]) is None
    check_transform(read.to_dict(), read, "Classifier_a")  # the same file on both nodes
    check_transform(None, read, "Classifier_a")  # nothing read at deploy: nothing to compare
    other = dataclasses.replace(read, height=H + 1)  # what another node's file of another input size would give
    refused = rf"Classifier_a: this node's model file wants {H + 1}x{W}x3 .* deploy read {H}x{W}x3 .* files differ"
    with pytest.raises(ValueError, match=refused):
        check_transform(read.to_dict(), other, "Classifier_a")


# --------------------------------------------------------------------------- python -m app.config


def _config_file(tmp_path: Path, graph: onnx.ModelProto, model: dict[str, Any]) -> Path:
    onnx.save(graph, tmp_path / "mine.onnx")
    cfg = copy.deepcopy(load_config("local.yaml"))
    app = cfg["applications"][0]
    app["args"]["model"] = {"name": "mine", **model}
    app["args"]["variants"] = {"fp32": {"model_path": str(tmp_path / "mine.onnx")}}
    app["args"].pop("speed_gate")
    app["args"].pop("cascades")
    app["deployments"] = [d for d in app["deployments"] if d["name"] != "Classifier_int8"]
    next(d for d in app["deployments"] if d["name"] == "Router")["user_config"]["weights"] = {"fp32": 1}
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _app_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.config", str(path)], cwd=REPO, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("graph", "model", "field"),
    [
        (classifier(channels=1), {"preprocess": {"color": "GRAY", "mean": [1, 2, 3]}}, "model.preprocess.mean"),
        (classifier(), {"preprocess": {"resize_shorter": 4, "crop": "center"}}, "model.preprocess.resize_shorter"),
        (classifier(), {"labels_path": "{labels}"}, "model.labels_path"),
    ],
    ids=["three means for one channel", "a crop larger than the resize", "labels that do not match the output"],
)
def test_app_config_refuses_a_contradictory_declaration_naming_the_field(
    tmp_path: Path, graph: onnx.ModelProto, model: dict[str, Any], field: str
) -> None:
    (tmp_path / "labels.txt").write_text("only\ntwo\n")
    if model.get("labels_path") == "{labels}":
        model = {"labels_path": str(tmp_path / "labels.txt")}
    out = _app_config(_config_file(tmp_path, graph, model))
    assert out.returncode == 1 and field in out.stderr and "mine.onnx" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_app_config_says_what_it_checked(tmp_path: Path) -> None:
    ok = _app_config(_config_file(tmp_path, classifier(), {"preprocess": {"mean": [127], "std": [128]}}))
    assert ok.returncode == 0 and f"the model declaration checked against {tmp_path / 'mine.onnx'}" in ok.stdout
    prod = _app_config(REPO / "configs" / "prod.yaml")
    assert prod.returncode == 0 and "no model file here" in prod.stdout
