"""The typed application builder, which Serve reaches as `import_path: app.main:build_app`.

No `from __future__ import annotations` here: Serve inspects the builder's
parameter annotation at run time to validate `args` with the pydantic model.
"""

import fcntl
import logging

from ray.serve import Application

from app.config import AppArgs, classifier_deployment_name
from app.serve.classifier import Classifier
from app.serve.deployments import ABLedger, RolloutController, Router
from app.serve.preprocessor import Preprocessor
from app.served_model import ModelFiles
from app.served_model.check import check_files
from app.served_model.declaration import ModelDeclaration
from app.served_model.model_io import transform_of

logger = logging.getLogger("ray.serve")


class ConfigError(ValueError):
    """A config that cannot be deployed; the message names the field."""


def ensure_models(args: AppArgs) -> None:
    """Build the built-in models if they are missing and allowed to; else insist every file exists (a variant's declared
    fallback's too: the node that needs it is the one where the variant's own build cannot run)."""
    declared = dict(args.model_files())
    missing = {field: p for field, p in declared.items() if not p.is_file()}
    buildable = {field: p for field, p in missing.items() if args.build_default_models and args.is_default_model(p)}
    for root in {p.parent for p in buildable.values()}:
        files = ModelFiles(root)
        wanted = set(buildable.values())
        build_default_models(files, tensorrt=files.int8_trt in wanted, model=args.model, fp16=files.fp16 in wanted)
    still = {field: p for field, p in missing.items() if not p.is_file()}
    if still and args.check_model_files:
        field, path = next(iter(sorted(still.items())))
        raise ConfigError(f"{field}: model file not found: {path}")
    try:
        # the declaration against every graph here (a Classifier checks its own at start too)
        check_files(args.model, args.model_files())
    except ValueError as e:
        raise ConfigError(str(e)) from None


def build_default_models(
    files: ModelFiles, tensorrt: bool = False, model: ModelDeclaration | None = None, fp16: bool = False
) -> None:
    """FP32 + INT8 (+ the TensorRT INT8 and the FP16 build when a variant uses them), once, under a file lock
    (builders may race); the INT8 builds calibrated on images prepared as `model` declares (default: the built-in
    declaration)."""
    from app.toolchain.build import build_fp32
    from app.toolchain.quantize import QuantizeOptions, quantize
    from app.toolchain.samples import augmented_samples

    files.root.mkdir(parents=True, exist_ok=True)
    with open(files.root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if build_fp32(files):
            logger.info("built %s", files.fp32)
        if not files.int8.is_file():
            logger.info("quantizing %s -> %s (first start only)", files.fp32, files.int8)
            quantize(files.fp32, files.int8, augmented_samples(64, 0), QuantizeOptions(), model)
        if tensorrt and not files.int8_trt.is_file():
            logger.info("quantizing %s -> %s for TensorRT (first start only)", files.fp32, files.int8_trt)
            quantize(files.fp32, files.int8_trt, augmented_samples(64, 0), QuantizeOptions(target="tensorrt"), model)
        if fp16 and not files.fp16.is_file():
            from app.toolchain.fp16 import convert

            logger.info("converting %s -> %s (first start only)", files.fp32, files.fp16)
            convert(files.fp32, files.fp16)


def build_app(args: AppArgs) -> Application:
    """Router -> Preprocessor -> Classifier_<variant> for every variant in `args` (no Preprocessor when the Router
    decodes)."""
    ensure_models(args)
    # How the model wants its images, known here from its files: the Router hands it down with every decode (each
    # Classifier checks its own file gives the same), and asks a Classifier only where no model file is on this node.
    transform = transform_of(args.model, args.model_files())
    declared = transform.to_dict() if transform is not None else None
    classifiers = {
        name: Classifier.options(  # type: ignore[attr-defined]
            name=classifier_deployment_name(name)
        ).bind(name, args.model_dump(), declared)
        for name in args.variants
    }
    preprocessor = (
        Preprocessor.bind(args.limits.model_dump())  # type: ignore[attr-defined]
        if args.decode_in == "preprocessor"
        else None  # the Router decodes (AppArgs.decode_in)
    )
    ledger = ABLedger.bind()  # type: ignore[attr-defined]
    controller = RolloutController.bind(ledger, args.routable)  # type: ignore[attr-defined]
    return Router.bind(  # type: ignore[attr-defined]
        preprocessor,
        classifiers,
        ledger,
        args.model_dump(),
        controller,
        declared,
    )
