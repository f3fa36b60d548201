"""The Router's side of a rollout (app/http/policy.py): the ledger's override over the deployed user_config, and
what a redeploy does to it. Pure: the pipeline on fake handles, no Ray."""

from __future__ import annotations

from collections.abc import Mapping

from app.config import AppArgs, RouterConfig
from app.http.assembly import RouterApp
from app.serve.metrics import RouterMetrics
from tests.test_pipeline_unit import FakeBackend

VARIANTS = ["fp32", "int8", "mobilenet"]
CONFIG = {"weights": {"fp32": 60, "int8": 0, "mobilenet": 40}}


def router(variants: list[str] = VARIANTS, config: Mapping[str, object] = CONFIG) -> RouterApp:
    """A Router's parts as app/http/assembly.py puts them together, on fake handles, configured."""
    args = AppArgs.model_validate(
        {
            "model": {"name": "classifier"},
            "variants": {v: {"model_path": f"{v}.onnx"} for v in variants},
            "check_model_files": False,
            "build_default_models": False,
        }
    )
    app = RouterApp(args, FakeBackend(), variants, "r1", RouterMetrics(args.model.name))
    app.configure(RouterConfig.model_validate(config))
    return app


def override(generation: str, weights: dict[str, float], pair: list[str] | None) -> dict[str, object]:
    return {"weights": weights, "shadow_fraction": 0.2, "pair": pair, "config_id": "x", "generation": generation}


def test_the_override_sets_weights_shadows_and_pair_and_a_redeploy_drops_them_all() -> None:
    ing = router()
    policy = ing.policy
    policy.apply_override(override("1.running.0", {"fp32": 45.0, "int8": 15.0, "mobilenet": 40.0}, ["int8", "fp32"]))
    assert policy.split is not None and policy.split.fractions["int8"] == 0.15
    assert policy.config.shadow_fraction == 0.2 and ing.pipeline.shadow.pair == ("int8", "fp32")
    ing.configure(RouterConfig.model_validate(CONFIG))  # serve deploy of the config: the deploy wins
    assert policy.split.fractions.get("int8", 0.0) == 0.0 and policy.config.shadow_fraction == 0.0
    assert ing.pipeline.shadow.pair is None
    policy.apply_override(None)  # what the ledger answers the new config
    assert ing.pipeline.shadow.pair is None


def test_weights_that_cannot_apply_leave_routing_and_shadowing_as_they_were() -> None:
    ing = router()
    policy = ing.policy
    policy.apply_override(override("1.running.0", {"fp32": 0.0, "int8": 0.0, "mobilenet": 0.0}, ["int8", "fp32"]))
    assert policy.split is not None and policy.split.fractions == {"fp32": 0.6, "mobilenet": 0.4}
    assert ing.pipeline.shadow.pair is None  # the pair comes only with weights that took
    policy.apply_override(override("1.running.1", {"int8": 60.0, "fp32": 0.0, "mobilenet": 40.0}, ["int8", "nosuch"]))
    assert policy.split.fractions["int8"] == 0.6 and ing.pipeline.shadow.pair is None  # an unknown pair is ignored
