"""A Classifier alone, as `app.main:build_app` binds it, for tests/test_fallback_served.py: the fallback is the
Classifier's own business, so the test deploys no Router, Preprocessor or side deployments beside it (five replicas
fewer on CI's two cores)."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from app.config import AppArgs, classifier_deployment_name
from app.serve.classifier import Classifier


def build(args: dict[str, Any]) -> Application:
    parsed = AppArgs.model_validate(args)
    [variant] = parsed.variants
    return Classifier.options(name=classifier_deployment_name(variant)).bind(  # type: ignore[attr-defined]
        variant, parsed.model_dump()
    )
