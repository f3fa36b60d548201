"""Accuracy on a labelled tree (class sub-folders named by ImageNet id or by label, as `python -m app.models report
--eval-dir` reads them: `app.toolchain.report.resolve_label`): top-1 and top-5 per variant, each variant's top-1
agreement with the baseline (FP32), and the per-class drop; a report in the quantize report's form (JSON + Markdown)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, cast

import pyarrow as pa

from app.batch.pipeline import Job, scored
from app.batch.sources import Listed
from app.runtime.model_files import ModelFiles
from app.served_model.graph import read_graph
from app.toolchain.report import resolve_label

COLUMNS = ["path", "variant", "class_ids", "error_code", "engine", "model_sha256"]


def collect(listed: Listed, job: Job) -> pa.Table:
    """Every output row's few columns evaluation needs, on the driver (ids only: a 50,000-image set is a few MB)."""
    batches = [cast(pa.Table, b).select(COLUMNS) for b in scored(listed, job).iter_batches(batch_format="pyarrow")]
    return pa.concat_tables(batches) if batches else pa.table({c: [] for c in COLUMNS})


def class_labels(job: Job) -> list[str]:
    local = ModelFiles.for_node(job.args).local_all(job.args, job.variants[:1])  # remote files: this node's cache
    try:
        path = local.args.resolved_path(local.args.variants[job.variants[0]].model_path)
        return local.args.model.labels(read_graph(path).classes)
    finally:
        local.release()


def evaluate(listed: Listed, job: Job, eval_set: str, baseline: str = "fp32") -> dict[str, Any]:
    """The evaluation report of `listed` (labelled by its folders) for the job's variants."""
    labels = class_labels(job)
    truth = {p: resolve_label(f, labels) for p, f in zip(listed.paths, listed.folders, strict=True)}
    return report(collect(listed, job), truth, labels, job, eval_set, baseline)


def report(
    rows: pa.Table, truth: dict[str, int | None], labels: list[str], job: Job, eval_set: str, baseline: str
) -> dict[str, Any]:
    """The report from the output rows (pure): per variant, against the baseline, per class."""
    top: dict[str, dict[str, list[int]]] = defaultdict(dict)
    errors: dict[str, int] = defaultdict(int)
    meta: dict[str, dict[str, str]] = {}
    for r in rows.to_pylist():
        meta[r["variant"]] = {"engine": r["engine"], "model_sha256": r["model_sha256"]}
        if r["error_code"]:
            errors[r["variant"]] += 1
        else:
            top[r["variant"]][r["path"]] = r["class_ids"]
    base = baseline if baseline in job.variants else job.variants[0]
    variants = {v: _accuracy(top[v], truth) | {"errors": errors[v], **meta.get(v, {})} for v in job.variants}
    quality = {v: _agreement(top[base], top[v], truth, base, v) for v in job.variants if v != base}
    return {
        "model": job.args.model.model_dump(mode="json"),
        "eval_set": eval_set,
        "baseline": base,
        "variants": variants,
        "quality": quality,
        "per_class": {v: _per_class(top[base], top[v], truth, labels) for v in quality},
        "pool": job.pool.describe(),
    }


def _accuracy(top: dict[str, list[int]], truth: dict[str, int | None]) -> dict[str, Any]:
    known = [p for p in top if truth.get(p) is not None]
    hit1 = sum(top[p][0] == truth[p] for p in known)
    hit5 = sum(truth[p] in top[p][:5] for p in known)
    n = len(known)
    return {
        "images": len(top),
        "labelled_images": n,
        "top1_accuracy": hit1 / n if n else 0.0,
        "top5_accuracy": hit5 / n if n else 0.0,
        "top1_count": hit1,
        "top5_count": hit5,
    }


def _agreement(
    base: dict[str, list[int]], other: dict[str, list[int]], truth: dict[str, int | None], b: str, v: str
) -> dict[str, Any]:
    """`v` against the baseline `b` on the images both scored, with the quantize report's keys."""
    both = [p for p in base if p in other]
    agree = sum(base[p][0] == other[p][0] for p in both)
    overlap = [len(set(base[p][:5]) & set(other[p][:5])) / 5 for p in both]
    out: dict[str, Any] = {
        "images": len(both),
        "top1_agreement": agree / len(both) if both else 0.0,
        "top1_agree_count": agree,
        "top5_overlap": sum(overlap) / len(overlap) if overlap else 0.0,
    }
    known = [p for p in both if truth.get(p) is not None]
    if known:
        out["labelled_images"] = len(known)
        out[f"{b}_top1_accuracy"] = sum(base[p][0] == truth[p] for p in known) / len(known)
        out[f"{v}_top1_accuracy"] = sum(other[p][0] == truth[p] for p in known) / len(known)
        out["top1_accuracy_drop"] = out[f"{b}_top1_accuracy"] - out[f"{v}_top1_accuracy"]
    return out


def _per_class(
    base: dict[str, list[int]], other: dict[str, list[int]], truth: dict[str, int | None], labels: list[str]
) -> list[dict[str, Any]]:
    """Per labelled class: images, both top-1 accuracies and the drop, largest drop first."""
    classes: dict[int, list[str]] = defaultdict(list)
    for p in base:
        if p in other and truth.get(p) is not None:
            classes[int(truth[p])].append(p)  # type: ignore[arg-type]
    out = []
    for c, paths in classes.items():
        a = sum(base[p][0] == c for p in paths) / len(paths)
        b = sum(other[p][0] == c for p in paths) / len(paths)
        label = labels[c] if 0 <= c < len(labels) else str(c)
        out.append({"class_id": c, "label": label, "images": len(paths), "baseline": a, "build": b, "drop": a - b})
    return sorted(out, key=lambda r: (-r["drop"], r["class_id"]))


def largest_drop(r: dict[str, Any]) -> float:
    """The largest top-1 accuracy drop of any variant against the baseline (0 without labels or other variants)."""
    return max((q.get("top1_accuracy_drop", 0.0) for q in r["quality"].values()), default=0.0)


def to_markdown(r: dict[str, Any]) -> str:
    base = r["baseline"]
    lines = [
        f"{r['model']['name']}: {', '.join(r['variants'])} on {r['eval_set']} (`python -m app.batch evaluate`)",
        "",
        "| variant | engine | images | errors | labelled | top-1 accuracy | top-5 accuracy | model sha256 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, a in r["variants"].items():
        lines.append(
            f"| {v} | {a.get('engine', '-')} | {a['images']} | {a['errors']} | {a['labelled_images']} "
            f"| {a['top1_accuracy']:.3f} ({a['top1_count']}) | {a['top5_accuracy']:.3f} ({a['top5_count']}) "
            f"| {a.get('model_sha256', '-')[:12]} |"
        )
    for v, q in r["quality"].items():
        big, ref = v.upper(), base.upper()
        lines += [
            "",
            f"{big} against {ref}:",
            "",
            "| metric | value |",
            "|---|---|",
            f"| top-1 agreement {big} vs {ref} | {q['top1_agreement']:.3f} ({q['top1_agree_count']}/{q['images']}) |",
            f"| top-5 overlap | {q['top5_overlap']:.3f} |",
        ]
        if "labelled_images" in q:
            lines += [
                f"| top-1 accuracy {ref} / {big} ({q['labelled_images']} labelled) "
                f"| {q[f'{base}_top1_accuracy']:.3f} / {q[f'{v}_top1_accuracy']:.3f} |",
                f"| top-1 accuracy drop | {q['top1_accuracy_drop']:.4f} |",
            ]
        worst = [c for c in r["per_class"].get(v, []) if c["drop"] > 0][:10]
        if worst:
            lines += [
                "",
                f"Classes {big} loses most on:",
                "",
                f"| class | images | {ref} | {big} | drop |",
                "|---|---|---|---|---|",
            ]
            lines += [f"| {c['class_id']} {c['label']} | {c['images']} | {_class_row(c)} |" for c in worst]
    return "\n".join(lines) + "\n"


def _class_row(c: dict[str, Any]) -> str:
    return f"{c['baseline']:.3f} | {c['build']:.3f} | {c['drop']:.3f}"


def write_report(r: dict[str, Any], json_path: Path | None, md_path: Path | None) -> None:
    if json_path is not None:
        json_path.write_text(json.dumps(r, indent=2) + "\n")
    if md_path is not None:
        md_path.write_text(to_markdown(r))
