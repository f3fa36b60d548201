"""`python -m app.models`: build idempotence, the INT8 quality gate, `--target tensorrt`, and user errors (exit 2)."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app.models import ModelFiles
from app.models.__main__ import main

REPO = Path(__file__).resolve().parent.parent

# `python -m app.models` with the report's latency table cut to batch 1 and no time budget: the gate
# depends only on the quality numbers, and the full table (4 batch sizes x 1.5 s x 2 models) costs
# 15-35 s per run on two cores. The real entry point is run unpatched by the build and error tests.
QUICK_TIMING = """
import runpy, sys
import app.models.report as report
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


def _copy_fp32(src: ModelFiles, dst: Path) -> ModelFiles:
    files = ModelFiles(dst)
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src.fp32, files.fp32)
    shutil.copyfile(src.labels, files.labels)
    return files


# ---------------------------------------------------------------------------------------------
# The gate


@pytest.fixture(scope="module")
def gated(model_files, tmp_path_factory) -> tuple[ModelFiles, subprocess.CompletedProcess[str]]:
    """quantize with an impossible --min-agreement, in a fresh directory holding only FP32 + labels."""
    files = _copy_fp32(model_files, tmp_path_factory.mktemp("gate"))
    result = run_cli(
        "--model-dir", files.root, "quantize", "--num-images", "16", "--min-agreement", "1.01", quick_timing=True
    )
    return files, result


@pytest.mark.slow
def test_quantize_gate_fails_below_min_agreement_and_names_the_figure(gated):
    files, result = gated
    assert result.returncode == 1, result.stderr
    assert files.int8.is_file() and files.report_json.is_file() and files.report_md.is_file()
    report = json.loads(files.report_json.read_text())
    agreement = report["quality"]["top1_agreement"]
    assert 0.6 <= agreement < 1.01
    assert f"agreement with FP32 is {agreement:.3f}, below --min-agreement 1.010" in result.stderr
    assert "16 random crops/flips, seed 0" in result.stdout and "| top-1 agreement INT8 vs FP32 |" in result.stdout
    assert report["calibration"]["method"] == "minmax"
    assert [row["batch"] for row in report["latency"]["int8"]] == [1]  # QUICK_TIMING's cut
    # The CPU INT8's weights were rescaled for U8S8 kernels without VNNI, and none can overflow now.
    limited = report["calibration"]["pair_limit"]
    assert limited["layers"] == limited["rescaled_layers"] == 34 and 0 < limited["rescaled_channels"] <= 13048
    assert report["models"]["int8"]["u8s8_overflow_layers"] == 0 and "U8S8 pair limit: " in result.stdout


@pytest.mark.slow
def test_quantize_gate_passes_a_reachable_min_agreement(gated):
    files, _ = gated
    int8_before = files.int8.read_bytes()
    result = run_cli("--model-dir", files.root, "report", "--min-agreement", "0.5", quick_timing=True)
    assert result.returncode == 0, result.stderr
    assert "below --min-agreement" not in result.stderr
    assert files.int8.read_bytes() == int8_before  # report reads the models, never rewrites them
    assert f"wrote {files.report_json}" in result.stdout


# ---------------------------------------------------------------------------------------------
# --target tensorrt


@pytest.mark.slow
def test_quantize_tensorrt_writes_its_own_file_and_the_report_covers_both(model_files, tmp_path):
    """The CPU INT8 is left alone, the report gains the TensorRT section, the gate judges only what was written."""
    import onnx

    from app.models.quantize import tensorrt_problems

    files = _copy_fp32(model_files, tmp_path)
    shutil.copyfile(model_files.int8, files.int8)
    int8_before = files.int8.read_bytes()
    args = ("quantize", "--target", "tensorrt", "--num-images", "16", "--min-agreement", "1.01")
    result = run_cli("--model-dir", files.root, *args, quick_timing=True)
    assert result.returncode == 1, result.stderr
    assert files.int8_trt.is_file() and files.int8.read_bytes() == int8_before
    assert tensorrt_problems(onnx.load(str(files.int8_trt))) == []
    assert f"wrote {files.int8_trt}" in result.stdout and "with minmax for tensorrt" in result.stdout
    report = json.loads(files.report_json.read_text())
    assert report["calibration"]["target"] == "tensorrt" and "int8_trt" in report["models"]
    agreement = report["tensorrt"]["quality"]["top1_agreement"]
    assert 0.6 <= agreement < 1.01
    gate = result.stderr.splitlines()
    assert f"TensorRT INT8 top-1 agreement with FP32 is {agreement:.3f}, below --min-agreement 1.010" in gate
    assert not any(line.startswith("INT8 top-1 agreement") for line in gate)  # the CPU INT8 was not this run's
    assert "| top-1 agreement with FP32 |" in result.stdout and "TensorRT INT8 (" in files.report_md.read_text()


def test_quantize_tensorrt_needs_the_cpu_int8_for_its_report(model_files, tmp_path, capsys):
    files = _copy_fp32(model_files, tmp_path)
    assert main(["--model-dir", str(tmp_path), "quantize", "--target", "tensorrt"]) == 2
    err = capsys.readouterr().err
    assert "the report needs the CPU INT8 model" in err and str(files.int8) in err and "--no-report" in err
    assert not files.int8_trt.exists() and not files.report_json.exists()  # said before calibrating


def test_corrupt_tensorrt_int8_is_named_by_report(model_files, tmp_path, capsys):
    files = _copy_fp32(model_files, tmp_path)
    shutil.copyfile(model_files.int8, files.int8)
    files.int8_trt.write_bytes(b"not onnx either")
    assert main(["--model-dir", str(tmp_path), "report"]) == 2
    err = capsys.readouterr().err
    assert "TensorRT INT8 model" in err and str(files.int8_trt) in err and "not a valid ONNX file" in err
    assert not files.report_json.exists()


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


@pytest.mark.parametrize(
    "args",
    [
        ["quantize", "--calibration-dir", "{missing}"],
        ["quantize", "--eval-dir", "{missing}"],
        ["report", "--eval-dir", "{missing}"],
        ["quantize", "--calibration-dir", "{file}"],
    ],
)
def test_missing_directories(tmp_path, capsys, args):
    (tmp_path / "a_file.png").write_bytes(b"x")
    subs = {"{missing}": str(tmp_path / "no" / "such"), "{file}": str(tmp_path / "a_file.png")}
    args = [subs.get(a, a) for a in args]
    assert main(["--model-dir", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: directory not found:") and args[-1] in err


def test_missing_directory_via_the_real_entry_point(tmp_path):
    result = run_cli("--model-dir", tmp_path, "quantize", "--calibration-dir", tmp_path / "nope")
    assert result.returncode == 2
    assert "directory not found" in result.stderr and str(tmp_path / "nope") in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_fp32_tells_to_run_build(tmp_path, capsys):
    for command in ("quantize", "report"):
        assert main(["--model-dir", str(tmp_path), command]) == 2
        err = capsys.readouterr().err
        assert "FP32 model not found" in err and str(ModelFiles(tmp_path).fp32) in err
        assert "python -m app.models build" in err
    assert not ModelFiles(tmp_path).int8.exists()


def test_corrupt_fp32_is_named(tmp_path):
    files = ModelFiles(tmp_path)
    files.fp32.write_bytes(b"\x00garbage, not a protobuf\xff" * 40)
    for command in ("quantize", "report"):
        result = run_cli("--model-dir", tmp_path, command)
        assert result.returncode == 2, (command, result.stderr)
        assert str(files.fp32) in result.stderr and "not a valid ONNX file" in result.stderr
        assert "Traceback" not in result.stderr
    assert not files.int8.exists()


def test_corrupt_int8_is_named_by_report(model_files, tmp_path, capsys):
    files = _copy_fp32(model_files, tmp_path)
    files.int8.write_bytes(b"not onnx at all")
    assert main(["--model-dir", str(tmp_path), "report"]) == 2
    err = capsys.readouterr().err
    assert "INT8 model" in err and str(files.int8) in err and "not a valid ONNX file" in err
    assert not files.report_json.exists()


def test_quantize_empty_calibration_dir(model_files, tmp_path, capsys):
    _copy_fp32(model_files, tmp_path)
    (tmp_path / "calib").mkdir()
    assert main(["--model-dir", str(tmp_path), "quantize", "--calibration-dir", str(tmp_path / "calib")]) == 2
    assert "no images" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["quantize", "--method", "kmeans"], ["quantize", "--target", "gpu"]])
def test_argparse_errors_exit_2(capsys, args):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
