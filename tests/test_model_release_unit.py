"""Which model version a Classifier's user_config names (with its fallback), which versions may replace the serving one
under the same Router, and when a retired version's engine closes (app.serve.model_release,
app.runtime.model_files.with_version): pure, on stand-ins for the engines and files (no Ray, no model)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.config import AppArgs, ClassifierConfig
from app.imaging.transform import Transform
from app.runtime.model_files import ModelFileError, with_version
from app.serve.model_release import Version, differing_inputs

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
    assert ClassifierConfig().version() == {}
    cfg = ClassifierConfig(model_path="s3://models/m/v2/m-int8.onnx", sha256="sha256:" + "CD" * 32)
    assert cfg.version() == {"model_path": "s3://models/m/v2/m-int8.onnx", "sha256": "cd" * 32}
    args = with_version(ARGS, "int8", cfg.version())
    assert (args.variants["int8"].model_path, args.variants["int8"].sha256) == (cfg.model_path, cfg.sha256)
    assert args.variants["int8"].precision == "int8" and args.model == ARGS.model  # the declaration stays


def test_a_new_version_brings_its_own_fallback_where_args_declare_one() -> None:
    fb = {"precision": "fp16", "model_path": "s3://models/m/v1/m-fp16.onnx"}
    args = AppArgs.model_validate(
        {**ARGS.model_dump(), "variants": {"int8": {**ARGS.variants["int8"].model_dump(), "fallback": fb}}}
    )
    v2 = {"model_path": "s3://models/m/v2/m-int8.onnx", "sha256": DIGEST}
    with pytest.raises(ModelFileError, match="give the same version's fallback_model_path"):
        with_version(args, "int8", v2)
    both = with_version(args, "int8", {**v2, "fallback_model_path": "s3://models/m/v2/m-fp16.onnx"})
    fallback = both.variants["int8"].fallback
    assert fallback is not None and fallback.model_path == "s3://models/m/v2/m-fp16.onnx"
    assert fallback.precision == "fp16"
    with pytest.raises(ModelFileError, match="args declare no fallback"):
        with_version(ARGS, "int8", {**v2, "fallback_model_path": "s3://models/m/v2/m-fp16.onnx"})


def test_a_user_config_digest_needs_its_path_and_plain_http_is_refused() -> None:
    with pytest.raises(ValueError, match="sha256 without model_path"):
        ClassifierConfig(sha256=DIGEST)
    with pytest.raises(ValueError, match="plain http is refused"):
        ClassifierConfig(model_path="http://models.example/m.onnx")
    with pytest.raises(ValueError, match="64 hex digits"):
        ClassifierConfig(model_path="gs://b/m.onnx", sha256="abc")
    with pytest.raises(ValueError, match="fallback_model_path without model_path"):
        ClassifierConfig(fallback_model_path="gs://b/m-fp16.onnx")


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


class Closing:
    """A stand-in for a version's engine and files: counts closes and releases."""

    def __init__(self) -> None:
        self.closed = self.released = 0
        self.opened = self
        self.engine = self

    def close(self) -> None:
        self.closed += 1

    def release(self) -> None:
        self.released += 1


def test_a_retired_version_closes_when_its_last_batch_leaves_and_not_before() -> None:
    parts = Closing()
    v = Version(parts, parts, {})  # type: ignore[arg-type]
    v.enter()
    v.enter()
    v.retire()  # switched away while two batches run on it
    assert (parts.closed, parts.released) == (0, 0)
    v.leave()
    assert parts.closed == 0
    v.leave()
    assert (parts.closed, parts.released) == (1, 1)


def test_a_version_retired_while_idle_closes_at_once() -> None:
    parts = Closing()
    Version(parts, parts, {}).retire()  # type: ignore[arg-type]
    assert (parts.closed, parts.released) == (1, 1)
