"""Typed configuration: the application's build arguments (`AppArgs`, the `args:` block) and each deployment's
user_config (`RouterConfig`, `ClassifierConfig`), settings and their validation only.

Build arguments fix what the app is made of (the variants and their model files, the device policy, the limits, the
admission front, the cascades) and change only with a redeploy that restarts replicas; a user_config is handed to
`reconfigure` on running replicas, so A/B weights and batch settings change live. Every model rejects unknown fields:
a misspelt key fails at deploy, naming it. What turns settings into engine options is the engines' business, into
HAProxy's limits the front's. A module a concept, re-exported here: `args`, `limits`, `front`, `cascade`, `router`,
`classifier`, `check` (`validate_serve_config`, as `python -m app.config` runs it), `serve_env` (configs/serve.env
read), `base` (the strict, frozen base); and `speed_gate`, not a setting but the speed gate's verdict, the one record
the engines make and /v1/models reports, here as the lowest package both import.
"""

from app.config.args import AppArgs, SpeedGateArgs, TensorRTArgs, VariantArgs
from app.config.cascade import CASCADE_NAME, CaptureArgs, CascadeArgs
from app.config.check import validate_serve_config
from app.config.classifier import ClassifierConfig, classifier_deployment_name
from app.config.front import FrontArgs
from app.config.limits import Limits
from app.config.router import RouterConfig, router_deployment_name
from app.config.serve_env import SERVE_ENV, parse_serve_env, read_serve_env

__all__ = [
    "CASCADE_NAME",
    "SERVE_ENV",
    "AppArgs",
    "CaptureArgs",
    "CascadeArgs",
    "ClassifierConfig",
    "FrontArgs",
    "Limits",
    "RouterConfig",
    "SpeedGateArgs",
    "TensorRTArgs",
    "VariantArgs",
    "classifier_deployment_name",
    "parse_serve_env",
    "read_serve_env",
    "router_deployment_name",
    "validate_serve_config",
]
