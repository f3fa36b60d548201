"""Typed configuration: bad values fail naming the field; the shipped configs are valid."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
from pydantic import ValidationError

from app.config import AppArgs, ClassifierConfig, RouterConfig, validate_serve_config
from tests.conftest import REPO, deployment, load_config


@pytest.mark.parametrize("name", ["local.yaml", "prod.yaml"])
def test_shipped_configs_validate(name: str) -> None:
    args = validate_serve_config(load_config(name))
    assert set(args.variants) == {"int8", "fp32"}


def test_cli_checks_files() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "app.config", "configs/local.yaml", "configs/prod.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(": ok") == 2


@pytest.mark.parametrize(
    "weights, fragment",
    [
        ({"int8": -1, "fp32": 1}, "weights must be >= 0"),
        ({"int8": 0, "fp32": 0}, "at least one weight must be positive"),
    ],
)
def test_bad_weights_name_the_field(weights: dict[str, float], fragment: str) -> None:
    with pytest.raises(ValidationError) as e:
        RouterConfig(weights=weights)
    assert "weights" in str(e.value) and fragment in str(e.value)


def test_unknown_fields_are_errors() -> None:
    with pytest.raises(ValidationError, match="max_batch"):
        ClassifierConfig.model_validate({"max_batch": 8})
    with pytest.raises(ValidationError, match="weight"):
        RouterConfig.model_validate({"weights": {"a": 1}, "weight": 3})


def test_batch_larger_than_max_ongoing_requests_is_refused() -> None:
    cfg = load_config("local.yaml")
    deployment(cfg, "Classifier_fp32")["user_config"]["max_batch_size"] = 64
    with pytest.raises(
        ValueError, match=r"deployments\[Classifier_fp32\].*max_batch_size \(64\).*max_ongoing_requests \(32\)"
    ):
        validate_serve_config(cfg)


def test_weights_for_unknown_variants_are_refused() -> None:
    cfg = copy.deepcopy(load_config("local.yaml"))
    deployment(cfg, "Router")["user_config"]["weights"] = {"int4": 1}
    with pytest.raises(ValueError, match=r"weights: unknown variants \['int4'\]"):
        validate_serve_config(cfg)


def test_app_args_validation() -> None:
    with pytest.raises(ValidationError, match="variants"):
        AppArgs.model_validate({"variants": {}})
    with pytest.raises(ValidationError, match="device"):
        AppArgs.model_validate({"device": "tpu"})
    with pytest.raises(ValidationError, match="default_top_k"):
        AppArgs.model_validate({"limits": {"default_top_k": 30, "max_top_k": 20}})
