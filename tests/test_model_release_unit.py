"""Which model version a Classifier's user_config names, whether it is a change, and which versions may replace the
serving one under the same Router (app.serve.model_release): pure, on stand-ins for the engines (no Ray, no model)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.config import AppArgs, ClassifierConfig
from app.imaging.transform import Transform
from app.serve.model_release import differing_inputs, wanted

DIGEST = "ab" * 32
ARGS = AppArgs.model_validate(
    {
        "model": {"name": "m"},
        "variants": {"int8": {"model_path": "s3://models/m/v1/m-int8.onnx", "sha256": DIGEST, "precision": "int8"}},
    }
)


def engine(transform: Transform, classes: int) -> Any:
    return SimpleNamespace(io=SimpleNamespace(transform=transform, labels=[f"c{i}" for i in range(classes)]))


def test_the_user_configs_version_overrides_the_args_and_without_one_the_args_serve() -> None:
    assert wanted(ARGS, "int8", ClassifierConfig()) == ("s3://models/m/v1/m-int8.onnx", DIGEST)
    cfg = ClassifierConfig(model_path="s3://models/m/v2/m-int8.onnx", sha256="sha256:" + "CD" * 32)
    assert wanted(ARGS, "int8", cfg) == ("s3://models/m/v2/m-int8.onnx", "cd" * 32)


def test_a_user_config_digest_needs_its_path_and_plain_http_is_refused() -> None:
    with pytest.raises(ValueError, match="sha256 without model_path"):
        ClassifierConfig(sha256=DIGEST)
    with pytest.raises(ValueError, match="plain http is refused"):
        ClassifierConfig(model_path="http://models.example/m.onnx")
    with pytest.raises(ValueError, match="64 hex digits"):
        ClassifierConfig(model_path="gs://b/m.onnx", sha256="abc")


def test_a_version_with_the_same_input_and_classes_may_replace_the_serving_one() -> None:
    t = Transform(224, 224, 3, 256, "cubic", "RGB")
    assert differing_inputs(engine(t, 1000), engine(Transform(224, 224, 3, 256, "cubic", "RGB"), 1000)) is None


@pytest.mark.parametrize(
    ("new", "classes", "said"),
    [
        (Transform(240, 240, 3, 274, "cubic", "RGB"), 1000, "240x240x3"),
        (Transform(224, 224, 3, 256, "cubic", "BGR"), 1000, "BGR"),
        (Transform(224, 224, 3, 256, "area", "RGB"), 1000, "area"),
        (Transform(224, 224, 3, 256, "cubic", "RGB"), 10, "10 classes"),
    ],
)
def test_a_version_that_wants_other_images_or_classes_is_refused_saying_which(
    new: Transform, classes: int, said: str
) -> None:
    serving = engine(Transform(224, 224, 3, 256, "cubic", "RGB"), 1000)
    reason = differing_inputs(serving, engine(new, classes))
    assert reason is not None and said in reason
