"""Typed configuration: the application's build arguments and each deployment's user_config.

Build arguments (`AppArgs`) fix what the app is made of: the variants and
their model files, the device policy, the input limits. They change only with
a redeploy that restarts replicas. `RouterConfig` and `ClassifierConfig` are
user_configs: Serve hands them to `reconfigure` on running replicas, so A/B
weights and batch settings change live, without a restart.

Every model rejects unknown fields, so a misspelt key fails at deploy naming
the field instead of being silently ignored.

Settings and their validation only: what turns them into engine options is app/runtime/variants.py, into the
front's limits app/front/. A module a concept; this package re-exports what the rest of the app uses:

- `args.py`: `AppArgs` (the `args:` block) and the variants, TensorRT builds and speed gate it holds
- `limits.py`: `Limits` (`args.limits`), the input limits
- `front.py`: `FrontArgs` (`args.front`), the admission front's limits (the front itself: app/front/)
- `cascade.py`: `CascadeArgs` (`args.cascades`) and `CaptureArgs`, the images a cascade keeps
- `router.py`, `classifier.py`: the Router's and each Classifier's user_config, and their deployments' names
- `check.py`: `validate_serve_config`, a whole Serve config checked as a deploy would (`python -m app.config`:
  app/config/cli.py)
- `serve_env.py`: `configs/serve.env`, read (made private to one Serve instance: app/front/instance.py)
- `base.py`: the strict, frozen base of every model
- `speed_gate.py`: `SpeedGateVerdict`, the speed gate's verdict (not a setting: the one record of it that app/runtime
  makes and app/protocol/v1.py reports, here as the lowest package both import)
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
