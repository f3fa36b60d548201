"""`python -m app.models`: build idempotence; quantize and report for any model file as its config declares it,
the INT8 quality gate, `--target tensorrt`; and user errors (exit 2, one line naming the file or field)."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.models.cli import main
from app.served_model import ModelFiles
from app.toolchain.report import report_paths

REPO = Path(__file__).resolve().parent.parent

# `python -m app.models` with the report's latency table cut to batch 1 and no time budget: the gate
# depends only on the quality numbers, and the full table (4 batch sizes x 1.5 s x 2 models) costs
# 15-35 s per run on two cores. The real entry point is run unpatched by the build and error tests.
QUICK_TIMING = """
import runpy, sys
import app.toolchain.report as report
measure = report.time_batches
report.time_batches = lambda runner, sizes, budget_s=0.0: measure(runner, sizes[:1], 0.0)
sys.argv[0] = "app.models"
runpy.run_module("app.models", run_name="__main__", alter_sys=True)
"""


def run_cli(*args: str | Path, quick_timing: bool = False) -> subprocess.CompletedProcess[str]:
    head = ["-c", QUICK_TIMING] if quick_timing else ["-m", "app.models"]
    return subprocess.run(
        [sys.executable, *head, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=300
    )


LOCAL = REPO / "configs" / "local.yaml"


def _copy_fp32(src: ModelFiles, dst: Path) -> ModelFiles:
    files = ModelFiles(dst)
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src.fp32, files.fp32)
    shutil.copyfile(src.labels, files.labels)
    return files


# ---------------------------------------------------------------------------------------------
# The gate


@pytest.fixture(scope="module")
def gated(model_files, tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """quantize with an impossible --min-agreement, from an FP32 file of another name, into a file of any name."""
    root = tmp_path_factory.mktemp("gate")
    fp32, out = root / "my-model.onnx", root / "builds" / "my-model-q.onnx"
    shutil.copyfile(model_files.fp32, fp32)
    args = ("--model", fp32, "--config", LOCAL, "--output", out, "--num-images", "16", "--min-agreement", "1.01")
    return fp32, out, run_cli("quantize", *args, quick_timing=True)


@pytest.mark.slow
def test_quantize_gate_fails_below_min_agreement_and_names_the_figure(gated):
    _, out, result = gated
    assert result.returncode == 1, result.stderr
    report_json, report_md = report_paths(out)
    assert out.is_file() and report_json.is_file() and report_md.is_file()
    assert report_json.name == "my-model-q.report.json"
    report = json.loads(report_json.read_text())
    agreement = report["quality"]["top1_agreement"]
    assert 0.6 <= agreement < 1.01
    assert f"agreement with FP32 is {agreement:.3f}, below --min-agreement 1.010" in result.stderr
    assert "16 random crops/flips, seed 0" in result.stdout and "| top-1 agreement INT8 vs FP32 |" in result.stdout
    assert f"as declared in {LOCAL}" in result.stdout and report["model"]["name"] == "efficientnet_lite0"
    assert report["calibration"]["method"] == "minmax" and report["calibration_quality"]["images"] == 16
    assert [row["batch"] for row in report["latency"]["int8"]] == [1]  # QUICK_TIMING's cut
    # The CPU INT8's weights were rescaled for U8S8 kernels without VNNI, and none can overflow now.
    limited = report["calibration"]["pair_limit"]
    assert limited["layers"] == limited["rescaled_layers"] == 34 and 0 < limited["rescaled_channels"] <= 13048
    assert report["models"]["int8"]["u8s8_overflow_layers"] == 0 and "U8S8 pair limit: " in result.stdout


@pytest.mark.slow
def test_quantize_gate_passes_a_reachable_min_agreement(gated):
    fp32, out, _ = gated
    int8_before = out.read_bytes()
    args = ("--model", fp32, "--int8", out, "--config", LOCAL, "--min-agreement", "0.5")
    result = run_cli("report", *args, quick_timing=True)
    assert result.returncode == 0, result.stderr
    assert "below --min-agreement" not in result.stderr
    assert out.read_bytes() == int8_before  # report reads the models, never rewrites them
    assert f"wrote {report_paths(out)[0]}" in result.stdout


# ---------------------------------------------------------------------------------------------
# --target tensorrt


@pytest.mark.slow
def test_quantize_tensorrt_writes_its_file_and_its_report_judged_as_tensorrt_computes(model_files, tmp_path):
    import onnx

    from app.toolchain.qdq_placement import placement_problems
    from app.toolchain.quantize import tensorrt_problems

    out = tmp_path / "trt.onnx"
    args = ("--model", model_files.fp32, "--config", LOCAL, "--output", out, "--target", "tensorrt")
    result = run_cli("quantize", *args, "--num-images", "16", "--min-agreement", "1.01")
    assert result.returncode == 1, result.stderr
    written = onnx.load(str(out))
    assert tensorrt_problems(written) == [] and placement_problems(written) == []
    assert f"wrote {out}" in result.stdout and "with minmax for tensorrt" in result.stdout
    report = json.loads(report_paths(out)[0].read_text())
    assert report["calibration"]["target"] == report["target"] == "tensorrt" and "latency" not in report
    agreement = report["quality"]["top1_agreement"]
    assert 0.6 <= agreement < 1.01 and "disable_quant_qdq" in report["evaluated_as"]
    assert f"TensorRT INT8 top-1 agreement with FP32 is {agreement:.3f}, below --min-agreement 1.010" in result.stderr


def test_corrupt_int8_is_named_by_report(model_files, tmp_path, capsys):
    bad = tmp_path / "int8.onnx"
    bad.write_bytes(b"not onnx either")
    assert main(["report", "--model", str(model_files.fp32), "--int8", str(bad), "--config", str(LOCAL)]) == 2
    err = capsys.readouterr().err
    assert "INT8 model" in err and str(bad) in err and "not a valid ONNX file" in err
    assert not report_paths(bad)[0].exists()


# ---------------------------------------------------------------------------------------------
# build


def test_build_twice_is_idempotent(tmp_path):
    files = ModelFiles(tmp_path / "m")
    first = run_cli("--model-dir", files.root, "build")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("wrote:")
    before = {p: p.stat() for p in (files.fp32, files.labels)}
    second = run_cli("--model-dir", files.root, "build")
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("up to date:")
    for path, st in before.items():
        now = path.stat()
        assert (now.st_ino, now.st_mtime_ns, now.st_size) == (st.st_ino, st.st_mtime_ns, st.st_size), path
    labels = files.labels.read_text().splitlines()
    assert len(labels) == 1000 and labels[285] == "Egyptian cat"
    # the mode open() gives a new file under this umask, not mkstemp's 0600: a server running as
    # another user (a container's) must be able to read models built by root
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    for path in (files.fp32, files.labels):
        assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode), path
    # --force writes new files (atomically: a new inode replaces the old one)
    assert main(["--model-dir", str(files.root), "build", "--force"]) == 0
    assert files.fp32.stat().st_ino != before[files.fp32].st_ino
    assert files.fp32.read_bytes()[:64] and files.fp32.stat().st_size == before[files.fp32].st_size


def test_build_rewrites_when_the_labels_are_missing(model_files, tmp_path, capsys):
    files = _copy_fp32(model_files, tmp_path)
    files.labels.unlink()
    assert main(["--model-dir", str(tmp_path), "build"]) == 0
    assert capsys.readouterr().out.startswith("wrote:")
    assert files.labels.read_text() == model_files.labels.read_text()


# ---------------------------------------------------------------------------------------------
# User errors: one line on stderr, exit status 2


def quantize_args(fp32: Path, out: Path, *extra: str) -> list[str]:
    return ["quantize", "--model", str(fp32), "--config", str(LOCAL), "--output", str(out), *extra]


@pytest.mark.parametrize(
    "extra",
    [["--calibration-dir", "{missing}"], ["--eval-dir", "{missing}"], ["--calibration-dir", "{file}"]],
)
def test_missing_directories(model_files, tmp_path, capsys, extra):
    (tmp_path / "a_file.png").write_bytes(b"x")
    subs = {"{missing}": str(tmp_path / "no" / "such"), "{file}": str(tmp_path / "a_file.png")}
    extra = [subs.get(a, a) for a in extra]
    assert main(quantize_args(model_files.fp32, tmp_path / "o.onnx", *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: directory not found:") and extra[-1] in err
    assert not (tmp_path / "o.onnx").exists()


def test_missing_directory_via_the_real_entry_point(model_files, tmp_path):
    result = run_cli(*quantize_args(model_files.fp32, tmp_path / "o.onnx", "--calibration-dir", str(tmp_path / "nope")))
    assert result.returncode == 2
    assert "directory not found" in result.stderr and str(tmp_path / "nope") in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_fp32_is_named(tmp_path, capsys):
    missing = tmp_path / "nope.onnx"
    assert main(quantize_args(missing, tmp_path / "o.onnx")) == 2
    err = capsys.readouterr().err
    assert "FP32 model not found" in err and str(missing) in err
    assert main(["report", "--model", str(missing), "--int8", str(missing), "--config", str(LOCAL)]) == 2
    assert "FP32 model not found" in capsys.readouterr().err


def test_corrupt_fp32_is_named(tmp_path):
    bad = tmp_path / "fp32.onnx"
    bad.write_bytes(b"\x00garbage, not a protobuf\xff" * 40)
    result = run_cli(*quantize_args(bad, tmp_path / "o.onnx"))
    assert result.returncode == 2, result.stderr
    assert str(bad) in result.stderr and "not a valid ONNX file" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_quantize_empty_calibration_dir(model_files, tmp_path, capsys):
    (tmp_path / "calib").mkdir()
    assert main(quantize_args(model_files.fp32, tmp_path / "o.onnx", "--calibration-dir", str(tmp_path / "calib"))) == 2
    assert "no images" in capsys.readouterr().err


def test_output_may_not_overwrite_the_fp32_model(model_files, tmp_path, capsys):
    fp32 = tmp_path / "m.onnx"
    shutil.copyfile(model_files.fp32, fp32)
    assert main(quantize_args(fp32, fp32)) == 2
    assert "is the FP32 model itself" in capsys.readouterr().err


def _config(tmp_path: Path, model: dict) -> Path:
    cfg = {"applications": [{"name": "mine", "import_path": "app.main:build_app", "args": {"model": model}}]}
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"name": "m", "preprocess": {"mean": [1, 2]}}, "model.preprocess.mean"),  # two means, a 3-channel graph
        ({"name": "m", "preprocess": {"std": [128]}}, "model.preprocess.scale/mean/std"),  # the graph takes uint8
        ({"name": "m", "preprocess": {"resize_shorter": 200, "crop": "center"}}, "model.preprocess.resize_shorter"),
        ({"name": "m", "preprocess": {"color": "GRAY"}}, "model.preprocess.color"),
        ({"name": "m", "labels_path": "{labels}"}, "model.labels_path"),  # 3 labels for 1000 classes
    ],
)
def test_a_declaration_contradicting_the_graph_is_refused_naming_the_field(model_files, tmp_path, capsys, model, field):
    (tmp_path / "labels.txt").write_text("a\nb\nc\n")
    if model.get("labels_path") == "{labels}":
        model = {**model, "labels_path": str(tmp_path / "labels.txt")}
    args = ["quantize", "--model", str(model_files.fp32), "--config", str(_config(tmp_path, model))]
    assert main([*args, "--output", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {field}") and str(model_files.fp32) in err
    assert not (tmp_path / "o.onnx").exists()  # refused before any calibration


def test_config_errors_name_the_file_and_the_field(model_files, tmp_path, capsys):
    bad = _config(tmp_path, {"name": "has space"})
    assert main(["quantize", "--model", str(model_files.fp32), "--config", str(bad), "--output", "x"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "model.name" in err
    missing = ["quantize", "--model", str(model_files.fp32), "--config", str(tmp_path / "none.yaml"), "--output", "x"]
    assert main(missing) == 2 and "config not found" in capsys.readouterr().err
    other = ["quantize", "--model", str(model_files.fp32), "--config", str(bad), "--app", "other", "--output", "x"]
    assert main(other) == 2 and "no application 'other'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [["quantize", "--method", "kmeans"], ["quantize", "--target", "gpu"], ["quantize", "--model", "m.onnx"]],
)
def test_argparse_errors_exit_2(capsys, args):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err or "the following arguments are required: --output, --config" in err
