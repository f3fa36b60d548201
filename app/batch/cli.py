"""python -m app.batch score CONFIG --input URI --output URI [--variants fp32,int8] [--actors N] [--gpus-per-actor G]
    [--batch-size B] [--top-k K]
python -m app.batch evaluate CONFIG --input DIR [--variants ...] [--min-accuracy-drop X] [--json PATH] [--markdown PATH]

Score an image collection, or evaluate a labelled one, with a Serve config's model declaration, limits and engines on
Ray Data (`app.batch`): decode in CPU tasks with the Preprocessor's code, the variants in an actor pool on each node's
engine. Runs on the cluster at RAY_ADDRESS, else on a Ray started here (`ray.init()`).

`score` writes Parquet under --output (one row per image and variant; a file that cannot be used is a row with the
API's error code) and prints a JSON summary. `evaluate` takes class sub-folders named by ImageNet id or label (as
`python -m app.models report --eval-dir`) and prints the report in the quantize report's form; with
--min-accuracy-drop X it exits 1 when a variant's top-1 accuracy is more than X below the baseline's (fp32).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import ray
import yaml

from app.batch.evaluation import evaluate, largest_drop, to_markdown, write_report
from app.batch.pipeline import Job, score
from app.batch.sizing import size_pool
from app.batch.sources import Listed, list_images
from app.config import AppArgs, validate_serve_config


def _variants(args: AppArgs, given: str | None) -> list[str]:
    names = [v.strip() for v in given.split(",") if v.strip()] if given else list(args.variants)
    unknown = [v for v in names if v not in args.variants]
    if unknown or not names:
        raise ValueError(f"--variants: {', '.join(unknown) or '(none)'} not in the config's {', '.join(args.variants)}")
    return names


def _nodes() -> list[dict[str, float]]:
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def job_for(ns: argparse.Namespace) -> tuple[Job, Listed]:
    """The job the flags describe, against the running Ray's nodes (the config and the variants checked first)."""
    with open(ns.config) as f:
        cfg: dict[str, Any] = yaml.safe_load(f)
    args = validate_serve_config(cfg)
    variants = _variants(args, ns.variants)
    listed = list_images(ns.input)
    if not ray.is_initialized():
        ray.init()  # RAY_ADDRESS when set, else a Ray of its own here
    pool = size_pool(_nodes(), cfg, args, variants, ns.actors, ns.gpus_per_actor, ns.batch_size)
    top = ns.top_k or max(5, args.limits.default_top_k)
    return Job(args, variants, pool, top, extra={"config": ns.config, "input": ns.input}), listed


def cmd_score(ns: argparse.Namespace) -> int:
    job, listed = job_for(ns)
    summary = score(listed, job, ns.output) | {"output": ns.output}
    print(json.dumps(summary, indent=2))
    return 0


def cmd_evaluate(ns: argparse.Namespace) -> int:
    job, listed = job_for(ns)
    report = evaluate(listed, job, ns.input)
    write_report(report, Path(ns.json) if ns.json else None, Path(ns.markdown) if ns.markdown else None)
    print(to_markdown(report))
    drop = largest_drop(report)
    if ns.min_accuracy_drop is not None and drop > ns.min_accuracy_drop:
        print(f"top-1 accuracy drop {drop:.4f} exceeds --min-accuracy-drop {ns.min_accuracy_drop}", file=sys.stderr)
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.batch", description=__doc__.split("\n\n")[1])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("score", help="score a collection into Parquet")
    e = sub.add_parser("evaluate", help="accuracy per variant on a labelled tree")
    for q in (s, e):
        q.add_argument("config", help="a Serve config (configs/local.yaml, configs/prod.yaml)")
        q.add_argument("--variants", help="comma-separated variants (default: every variant of the config)")
        q.add_argument("--actors", type=int, help="scoring actors (default: one per GPU share, or one per CPU node)")
        q.add_argument("--gpus-per-actor", type=float, help="GPUs each actor asks for (default: a Classifier's)")
        q.add_argument("--batch-size", type=int, help="images per engine call (default: the Classifiers')")
        q.add_argument("--top-k", type=int, help="classes per image (default: the config's default_top_k, at least 5)")
    s.add_argument("--input", required=True, help="a directory tree of images, or a Parquet/CSV file with `path`")
    s.add_argument("--output", required=True, help="a directory (any filesystem pyarrow reaches) for the Parquet")
    s.set_defaults(func=cmd_score)
    e.add_argument("--input", required=True, help="class sub-folders named by ImageNet id or by label")
    e.add_argument("--min-accuracy-drop", type=float, help="exit 1 when a variant's top-1 drop exceeds this")
    e.add_argument("--json", help="write the report's JSON here")
    e.add_argument("--markdown", help="write the report's Markdown here")
    e.set_defaults(func=cmd_evaluate)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    try:
        status: int = ns.func(ns)
    except (FileNotFoundError, ValueError) as e:
        print(f"python -m app.batch {ns.command}: {e}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
