"""python -m app.models {build,quantize,report}: see app/models/__init__.py."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from app.models import TARGETS, ModelFiles, Target, default_files


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
        raise CLIError(f"{what} model not found: {path} (run `python -m app.models build` first)")
    try:
        onnx.checker.check_model(str(path))
    except Exception as e:
        raise CLIError(f"{what} model {path} is not a valid ONNX file: {str(e).splitlines()[0]}") from e


def cmd_build(args: argparse.Namespace, files: ModelFiles) -> int:
    from app.models.build import build_fp32

    wrote = build_fp32(files, force=args.force)
    print(f"{'wrote' if wrote else 'up to date'}: {files.fp32} and {files.labels}")
    return 0


def cmd_quantize(args: argparse.Namespace, files: ModelFiles) -> int:
    from app.models.quantize import QuantizeOptions, quantize

    calibration_dir = _existing_dir(args.calibration_dir)
    eval_dir = _existing_dir(args.eval_dir)
    _check_onnx(files.fp32, "FP32")
    out = files.int8_for(args.target)
    if args.target != "cpu" and not args.no_report and not files.int8.is_file():
        # The report compares FP32 with the CPU INT8 first: say so now, not after minutes of calibration.
        raise CLIError(
            f"the report needs the CPU INT8 model {files.int8}: run `python -m app.models quantize` first, "
            "or pass --no-report"
        )
    started = time.perf_counter()
    if calibration_dir is not None:
        from app.models.calibration import sample_directory

        picked = sample_directory(calibration_dir, args.num_images, args.seed)
        images = [p.path.read_bytes() for p in tqdm(picked, desc="reading calibration images", unit="img")]
        source = f"{calibration_dir} ({len(images)} images, seed {args.seed})"
    else:
        from app.models.samples import augmented_samples

        images = augmented_samples(args.num_images, args.seed)
        source = f"sample photographs, {len(images)} random crops/flips, seed {args.seed} (a demo set)"
    opts = QuantizeOptions(
        method=args.method,
        op_types=args.op_types,
        exclude_nodes=args.exclude_nodes or (),
        target=args.target,
        pair_limit=not args.no_pair_limit,
    )
    print(f"calibrating on {source} with {args.method} for {args.target}")
    fit = quantize(files.fp32, out, images, opts)
    print(f"wrote {out} in {time.perf_counter() - started:.1f}s")
    if fit is not None:
        print(
            f"U8S8 pair limit: {fit.rescaled_channels} of {fit.channels} channels in {fit.rescaled_layers} of "
            f"{fit.layers} layers rescaled so x86 CPUs without VNNI cannot overflow (app/models/u8s8.py)"
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
    # The gate judges the model this run wrote; the report still covers every INT8 model there is.
    return _report(files, eval_dir, args.min_agreement, {"calibration": calibration}, gate=(args.target,))


def cmd_report(args: argparse.Namespace, files: ModelFiles) -> int:
    eval_dir = _existing_dir(args.eval_dir)
    return _report(files, eval_dir, args.min_agreement, {})


def _report(
    files: ModelFiles,
    eval_dir: Path | None,
    min_agreement: float | None,
    extra: dict,
    gate: Sequence[Target] = TARGETS,
) -> int:
    from app.models.report import build_report, to_markdown, write_report

    _check_onnx(files.fp32, "FP32")
    _check_onnx(files.int8, "INT8")
    trt = files.int8_trt if files.int8_trt.exists() else None
    if trt is not None:
        _check_onnx(trt, "TensorRT INT8")
    labels = files.labels.read_text().splitlines()
    report = build_report(files.fp32, files.int8, labels, eval_dir=eval_dir, extra=extra, int8_trt=trt)
    write_report(report, files.report_json, files.report_md)
    print(to_markdown(report))
    print(f"wrote {files.report_json} and {files.report_md}")
    agreements = {"cpu": ("INT8", report["quality"]["top1_agreement"])}
    if "tensorrt" in report:
        agreements["tensorrt"] = ("TensorRT INT8", report["tensorrt"]["quality"]["top1_agreement"])
    status = 0
    for target in gate:
        if target not in agreements or min_agreement is None:
            continue
        name, agreement = agreements[target]
        if agreement < min_agreement:
            print(
                f"{name} top-1 agreement with FP32 is {agreement:.3f}, below --min-agreement {min_agreement:.3f}",
                file=sys.stderr,
            )
            status = 1
    return status


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.models", description=__doc__)
    p.add_argument("--model-dir", type=Path, help="where models live (default: $APP_MODEL_DIR or ./models)")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the FP32 EfficientNet-Lite0 ONNX model and its labels")
    b.add_argument("--force", action="store_true", help="rebuild even if the files exist")
    b.set_defaults(func=cmd_build)
    for name, func, helptext in (
        ("quantize", cmd_quantize, "INT8 by post-training static quantization, then the report"),
        ("report", cmd_report, "quality and speed of INT8 (and of the TensorRT INT8, if built) against FP32"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--eval-dir", help="evaluation images (class sub-folders named by id or label give accuracy)")
        s.add_argument(
            "--min-agreement",
            type=float,
            help="exit 1 if INT8 top-1 agreement with FP32 is below this (quantize: the model it wrote; "
            "report: every INT8 model)",
        )
        s.set_defaults(func=func)
        if name == "quantize":
            s.add_argument("--calibration-dir", help="calibration images (class sub-folders are sampled evenly)")
            s.add_argument("--num-images", type=int, default=64, help="calibration images to use (default 64)")
            s.add_argument("--seed", type=int, default=0)
            s.add_argument("--method", choices=["minmax", "percentile", "entropy"], default="minmax")
            s.add_argument(
                "--op-types",
                type=_csv,
                help="comma-separated op types to quantize (default: all for cpu; Conv,Gemm,MatMul,Add for tensorrt)",
            )
            s.add_argument("--exclude-nodes", type=_csv, help="comma-separated node names to keep in FP32")
            s.add_argument(
                "--target",
                choices=TARGETS,
                default="cpu",
                help="cpu: QUInt8 activations for ONNX Runtime's CPU kernels (writes the INT8 model); "
                "tensorrt: symmetric S8S8 for TensorRT's explicit quantization (writes the -int8-trt model)",
            )
            s.add_argument(
                "--no-pair-limit",
                action="store_true",
                help="cpu target: keep the weights as calibrated, for a fleet of VNNI CPUs only (on AVX2 without "
                "VNNI, ONNX Runtime's U8S8 kernels then overflow: app/models/u8s8.py)",
            )
            s.add_argument("--no-report", action="store_true", help="skip the report")
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
        from app.models.build import MissingPackageError

        if isinstance(e, MissingPackageError | FileNotFoundError):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
