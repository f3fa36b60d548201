"""`validate_serve_config` checks a whole Serve config: the app's args, each deployment's user_config, and what only
the file shows (limits that must agree across deployments, batches that cannot fill).
"""

from __future__ import annotations

from pydantic import BaseModel

from app.config.args import AppArgs
from app.config.classifier import ClassifierConfig, classifier_deployment_name
from app.config.router import RouterConfig, router_deployment_name


def validate_serve_config(cfg: dict, app_index: int = 0) -> AppArgs:
    """Check a whole Serve config file the way a deploy would, plus what only the file can show.

    Serve validates each user_config only when a replica runs `reconfigure`; this
    finds the same mistakes (and batch sizes that cannot fill) before any deploy.
    Errors name the field as `deployments[<name>].user_config.<field>`.
    """
    app_cfg = cfg["applications"][app_index]
    args = AppArgs.model_validate(app_cfg.get("args") or {})
    deployments = {d["name"]: d for d in app_cfg.get("deployments", [])}

    def field(name: str, model: type[BaseModel]) -> BaseModel:
        try:
            return model.model_validate(deployments.get(name, {}).get("user_config") or {})
        except ValueError as e:
            raise ValueError(f"deployments[{name}].user_config: {e}") from e

    if args.decode_in == "router" and "Preprocessor" in deployments:
        raise ValueError(
            "deployments[Preprocessor]: args.decode_in is router, so the application has no Preprocessor deployment "
            "(the Router decodes; give it the CPUs instead)"
        )
    if args.decode_in == "gpu":
        _check_gpu_decode(args, deployments)
    router = field(router_deployment_name(), RouterConfig)
    assert isinstance(router, RouterConfig)
    router_ongoing = deployments.get(router_deployment_name(), {}).get("max_ongoing_requests")
    if router_ongoing is not None and int(router_ongoing) < router.max_ongoing_needed():
        raise ValueError(
            f"deployments[Router].max_ongoing_requests ({router_ongoing}) is below max_in_flight + max_queued "
            f"(x2 with paced refusals) + max_slow_bodies ({router.max_ongoing_needed()}): Serve would queue or "
            "refuse (with its own text 503) the requests the Router means to hold or answer"
        )
    if args.front.queue_timeout_s >= router.inference_timeout_s:
        raise ValueError(
            f"args.front.queue_timeout_s ({args.front.queue_timeout_s}) must be below deployments[Router].user_config."
            f"inference_timeout_s ({router.inference_timeout_s}): a request waits at most the two together"
        )
    if router_ongoing is not None and args.front.maxconn_per_replica > int(router_ongoing):
        raise ValueError(
            f"args.front.maxconn_per_replica ({args.front.maxconn_per_replica}) exceeds deployments[Router]."
            f"max_ongoing_requests ({router_ongoing}): Serve would refuse what the front lets in"
        )
    unknown = sorted(set(router.weights) - set(args.routable))
    if unknown:
        raise ValueError(f"deployments[Router].user_config.weights: unknown variants or cascades {unknown}")
    for variant in args.variants:
        name = classifier_deployment_name(variant)
        c = field(name, ClassifierConfig)
        assert isinstance(c, ClassifierConfig)
        max_ongoing = deployments.get(name, {}).get("max_ongoing_requests")
        problems = args.batching_problems(variant, c, None if max_ongoing is None else int(max_ongoing))
        if problems:
            raise ValueError(f"deployments[{name}]: {'; '.join(problems)}")
    return args


def _check_gpu_decode(args: AppArgs, deployments: dict[str, dict]) -> None:
    """decode_in: gpu: no Preprocessor deployment, and a GPU for every Classifier (its batch decodes the JPEGs)."""
    if "Preprocessor" in deployments:
        raise ValueError(
            "deployments[Preprocessor]: args.decode_in is gpu, so the application has no Preprocessor deployment "
            "(each Classifier decodes its batch; give the CPUs to the Classifiers for the images the GPU declines)"
        )
    for variant in args.variants:
        name = classifier_deployment_name(variant)
        gpus = (deployments.get(name, {}).get("ray_actor_options") or {}).get("num_gpus") or 0
        if float(gpus) <= 0:
            raise ValueError(
                f"deployments[{name}].ray_actor_options.num_gpus: args.decode_in is gpu, so every Classifier decodes "
                "JPEGs on a GPU and needs one (num_gpus > 0); on a node without a usable GPU use decode_in: "
                "preprocessor or router"
            )
