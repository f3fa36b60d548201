"""`python -m app.ops capacity` (app/ops/capacity.py): the arithmetic from fixed figures, without Ray and without
measuring; then the command once on configs/local.yaml with three images and the engine's rate given."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from app.config import validate_serve_config
from app.imaging.opencv import cv2
from app.ops import capacity
from app.ops.capacity import (
    CapacityError,
    Cost,
    GpuFootprint,
    autoscaling_bounds,
    classifier_gpus,
    gpu_decode_rate,
    parse_mix,
    per_part,
    size_all,
    size_cpu_decode,
    size_gpu_decode,
)

REPO = Path(__file__).resolve().parent.parent
# The H200 node's figures (../shared/gpu-2026-12-04): the app's preprocess on one of its cores (decode2.log), the FP32
# engine at batch 64 (gpu_check), nvImageCodec's hardware decode + resize (probe2.log).
H200_DECODE_MS = {"640x480": 2.51, "1080p": 6.99}
H200_ENGINE = 8777.0
H200_GPU_DECODE = {"640x480": 13820.0, "1080p": 4280.0}


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here may import Ray: an import of it fails."""
    monkeypatch.setitem(sys.modules, "ray", None)


def h200_mix(header_ms: float = 0.02, declined: float = 0.0) -> list[Cost]:
    return [
        Cost("640x480", 0.7, H200_DECODE_MS["640x480"], header_ms, declined),
        Cost("1080p", 0.3, H200_DECODE_MS["1080p"], header_ms, declined),
    ]


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "configs" / name).read_text())


def test_cpu_decode_needs_the_engine_rate_times_the_mix_s_decode_cost() -> None:
    s = size_cpu_decode(H200_ENGINE, h200_mix(), "mix", cpus_per_replica=1.0, cores=16)
    assert s.cpu_ms == pytest.approx(0.7 * 2.51 + 0.3 * 6.99)  # 3.854
    assert s.cores == pytest.approx(H200_ENGINE * 3.854 / 1000, abs=0.01)  # 33.83
    assert s.replicas == 34
    assert s.img_s_at_cores == pytest.approx(16 * 1000 / 3.854, abs=0.1)  # what 16 cores decode: 4,151.5
    assert s.bottleneck == "CPU: the Preprocessors"


def test_replicas_of_half_a_core_are_twice_as_many() -> None:
    one = size_cpu_decode(1000.0, [Cost("a", 1.0, 2.0, 0.0)], "a", cpus_per_replica=1.0, cores=64)
    half = size_cpu_decode(1000.0, [Cost("a", 1.0, 2.0, 0.0)], "a", cpus_per_replica=0.5, cores=64)
    assert (one.cores, one.replicas, half.replicas) == (2.0, 2, 4)
    assert one.bottleneck == "Classifier: engine"  # 64 cores decode 32,000 img/s


def test_gpu_decode_rate_of_a_mix_is_the_inverse_of_its_mean_time() -> None:
    rate = gpu_decode_rate(h200_mix(), H200_GPU_DECODE)
    assert rate == pytest.approx(1 / (0.7 / 13820 + 0.3 / 4280))  # 8,281.9
    assert gpu_decode_rate(h200_mix(), {}) is None
    assert gpu_decode_rate(h200_mix(declined=1.0), H200_GPU_DECODE) == math.inf  # declined images cost it nothing


def test_decode_in_gpu_takes_the_slower_of_engine_and_gpu_decode() -> None:
    mix = size_gpu_decode(H200_ENGINE, h200_mix(), "mix", H200_GPU_DECODE, cores=16)
    assert (mix.gpu_bound, mix.gpu_img_s) == ("gpu decode", pytest.approx(8281.9, abs=0.1))
    assert mix.bottleneck == "Classifier: gpu decode"
    assert mix.replicas is None  # no Preprocessor: the CPU work is the Classifier's
    small = size_gpu_decode(H200_ENGINE, h200_mix()[:1], "640x480", H200_GPU_DECODE, cores=16)
    assert (small.gpu_bound, small.gpu_img_s) == ("engine", H200_ENGINE)
    unknown = size_gpu_decode(H200_ENGINE, h200_mix(), "mix", {}, cores=16)
    assert (unknown.gpu_bound, unknown.gpu_img_s) == ("engine", H200_ENGINE)


def test_decode_in_gpu_costs_the_cpu_a_header_check_and_the_declined_images() -> None:
    costs = [Cost("a", 1.0, decode_ms=4.0, header_ms=0.02, declined=0.25)]
    s = size_gpu_decode(1000.0, costs, "a", {"a": 2000.0}, cores=1)
    assert s.cpu_ms == pytest.approx(0.02 + 0.25 * 4.0)
    assert s.cores == pytest.approx(1.02)  # 1,000 img/s x 1.02 ms
    assert s.gpu_img_s == 1000.0  # the GPU decodes 3 in 4: 2,667 img/s of the whole mix, over the engine's 1,000
    assert s.bottleneck == "CPU: header checks and declined images"


def test_size_all_gives_each_part_then_the_mix_for_each_decode_in() -> None:
    rows = size_all(H200_ENGINE, h200_mix(), H200_GPU_DECODE, 1.0, 16)
    assert [(r.decode_in, r.images) for r in rows] == [
        ("preprocessor", "640x480"),
        ("preprocessor", "1080p"),
        ("preprocessor", "mix"),
        ("gpu", "640x480"),
        ("gpu", "1080p"),
        ("gpu", "mix"),
    ]
    assert rows[1].cpu_ms == H200_DECODE_MS["1080p"]  # a part alone: its own cost, whatever its share in the mix
    assert [r.images for r in size_all(1.0, h200_mix()[:1], {}, 1.0, 1)] == ["640x480", "640x480"]


def test_prod_gpus_and_preprocessor_bounds_from_the_h200_figures() -> None:
    """configs/prod.yaml's Preprocessor max_replicas is this arithmetic's for the H200 figures (its comment says so);
    its min_replicas stays the availability floor, 2, below the arithmetic's 34 (one GPU kept busy)."""
    cfg = load("prod.yaml")
    gpus = classifier_gpus(cfg, validate_serve_config(cfg))
    assert gpus == GpuFootprint(1.0, 4.0)  # two Classifiers at 0.5 GPU: 1 + 1 replicas, 4 + 4 at most
    mix = size_cpu_decode(H200_ENGINE, h200_mix(), "mix", 1.0, 16)
    bounds = autoscaling_bounds(mix, gpus, cpus_per_replica=1.0)
    assert bounds == {"images": "mix", "min_replicas": 34, "max_replicas": 136}
    pre = next(d for d in cfg["applications"][0]["deployments"] if d["name"] == "Preprocessor")
    scaling = pre["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"]) == (2, bounds["max_replicas"])


def test_no_bounds_where_the_classifiers_hold_no_gpu() -> None:
    cfg = load("local.yaml")
    gpus = classifier_gpus(cfg, validate_serve_config(cfg))
    assert gpus == GpuFootprint(0.0, 0.0)
    assert autoscaling_bounds(size_cpu_decode(300.0, h200_mix(), "mix", 1.0, 2), gpus, 1.0) is None


def test_the_engine_is_measured_at_the_batch_its_replicas_run() -> None:
    prod, local = load("prod.yaml"), load("local.yaml")
    assert capacity.classifier_batch(prod, validate_serve_config(prod), "fp32") == 64
    assert capacity.classifier_batch(local, validate_serve_config(local), "int8") == 16


def test_parse_mix_and_per_size_figures() -> None:
    parts = parse_mix("640x480:0.7, 1080p:0.3")
    assert [(p.name, p.share, p.width, p.height) for p in parts] == [
        ("640x480", 0.7, 640, 480),
        ("1080p", 0.3, 1920, 1080),
    ]
    assert per_part("640x480:13820,1920x1080:4280", parts, "--x") == H200_GPU_DECODE
    assert per_part("5000", parts, "--x") == {"640x480": 5000.0, "1080p": 5000.0}
    assert per_part(None, parts, "--x") == {}
    for bad in ("640x480:0.7,640x480:0.3", "640:1", "640x480:-1", "640x480:a", ""):
        with pytest.raises(CapacityError):
            parse_mix(bad)
    with pytest.raises(CapacityError, match="no figure for 1080p"):
        per_part("640x480:13820", parts, "--gpu-decode-img-s")


def _jpeg(img: np.ndarray, progressive: bool = False) -> bytes:
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)])
    assert ok
    return buf.tobytes()


def test_the_command_on_local_yaml_with_three_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A baseline JPEG the GPU would decode, a progressive JPEG and a PNG it declines; the engine's rate given, so
    nothing but the three images is measured (and no engine opened)."""
    img = cv2.resize(np.arange(48 * 64 * 3, dtype=np.uint8).reshape(48, 64, 3), (320, 240))
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(_jpeg(img))
    (folder / "b.jpg").write_bytes(_jpeg(img, progressive=True))
    (folder / "c.png").write_bytes(cv2.imencode(".png", img)[1].tobytes())
    out = tmp_path / "capacity.json"
    argv = [str(REPO / "configs" / "local.yaml"), "--images", str(folder), "--engine-img-s", "300"]
    argv += ["--gpu-decode-img-s", "1000", "--cores", "2", "--seconds", "0.01", "--json", str(out)]
    assert capacity.main(argv) == 0
    result = json.loads(out.read_text())
    (part,) = result["cpu"]["parts"]
    assert (part["images"], part["refused"], part["declined"]) == (3, 0, pytest.approx(2 / 3, abs=1e-4))
    assert part["declined_why"] == {"a progressive or multi-scan JPEG": 1, "a png image": 1}
    assert part["decode_ms"] > 0 and part["header_ms"] > 0
    assert result["engine"] == {"img_s": 300.0, "batch": None, "source": "given (--engine-img-s)"}
    assert [(r["decode_in"], r["images"]) for r in result["rows"]] == [("preprocessor", "images"), ("gpu", "images")]
    assert result["rows"][0]["replicas"] >= 1
    assert result["preprocessor_autoscaling"] is None  # local.yaml's Classifiers hold no GPU
    printed = capsys.readouterr().out
    assert "| preprocessor | images |" in printed and "| gpu | images |" in printed
    assert "cores: 2, given (--cores)" in printed


def test_the_command_refuses_what_it_cannot_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    local = str(REPO / "configs" / "local.yaml")
    assert capacity.main([local, "--images", str(tmp_path / "missing"), "--engine-img-s", "1"]) == 1
    assert capacity.main([local, "--mix", "640x480", "--variant", "nope", "--engine-img-s", "1"]) == 1
    err = capsys.readouterr().err
    assert "neither a file nor a folder" in err and "--variant nope" in err
