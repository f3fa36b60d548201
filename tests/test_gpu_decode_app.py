"""`decode_in: gpu` served: the Router sends encoded images, each Classifier's batch decodes them. On this machine the
GPU decoder is the host stand-in (APP_GPU_DECODER=standin in the Classifiers' environment: nvImageCodec needs a CUDA
device) and the transform graph runs on the CPU EP; everything else is the real app on the session's Ray cluster: the
same answers, errors and status codes as the CPU decode path, and /v1/models saying where each image was decoded."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np

from app.imaging.opencv import cv2
from app.toolchain.samples import sample_bytes
from tests.conftest import ServeDeployer, deployment, local_config
from tests.hostile import cv_encode, jpeg_with_size, pattern_image

JPEG = cv_encode(".jpg", pattern_image(60, 80))
BROKEN = JPEG[: len(JPEG) // 2]  # header and part of the scan (tests/test_gpu_decode_unit.py: OpenCV fails on it)


def _files() -> list[tuple[str, tuple[str, bytes, str]]]:
    chelsea = cv2.imdecode(np.frombuffer(sample_bytes("chelsea"), np.uint8), cv2.IMREAD_COLOR)
    ok, jpeg = cv2.imencode(".jpg", chelsea, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    return [
        ("file", ("chelsea.jpg", jpeg.tobytes(), "image/jpeg")),  # a JPEG: the "GPU" decoder's
        ("file", ("broken.jpg", BROKEN, "image/jpeg")),  # its header passes, its scan does not decode: 400
        ("file", ("coffee.png", sample_bytes("coffee"), "image/png")),  # a PNG: the CPU path's, in the same batch
        ("file", ("bomb.jpg", jpeg_with_size(60_000, 60_000), "image/jpeg")),  # over max_pixels, 413
        ("file", ("rocket.jpg", sample_bytes("rocket"), "image/jpeg")),
    ]


def _classify(url: str) -> list[dict[str, Any]]:
    r = httpx.post(url + "/v1/classify/batch", files=_files(), headers={"X-Model-Variant": "fp32"}, timeout=60)
    assert r.status_code == 200, r.text
    assert "preprocess;dur=" in r.headers["server-timing"]
    return [
        {"top1": x["predictions"][0]["class_id"]}
        if "predictions" in x
        else {"error": x["error"]["code"], "status": x["status"]}
        for x in r.json()["results"]
    ]


def test_gpu_decoding_answers_as_the_cpu_path_and_says_where_it_decoded(
    local_app: ServeDeployer, model_files: Any
) -> None:
    on_cpu = _classify(local_app.url)  # local.yaml: the Router decodes
    cfg = local_config(model_files)
    cfg["applications"][0]["args"]["decode_in"] = "gpu"
    for name in ("Classifier_int8", "Classifier_fp32"):
        options = deployment(cfg, name).setdefault("ray_actor_options", {})
        options["runtime_env"] = {"env_vars": {"APP_GPU_DECODER": "standin"}}
    local_app.deploy(cfg)
    try:
        on_gpu = _classify(local_app.url)
        assert on_gpu == on_cpu
        assert [a.get("top1") for a in on_gpu] == [282, None, 967, None, 657]
        assert [a.get("status") for a in on_gpu] == [None, 400, None, 413, None]
        models = httpx.get(local_app.url + "/v1/models", timeout=10).json()
        assert models["decode"]["where"] == "gpu"
        decoded = models["variants"]["fp32"]["gpu_decode"]
        assert decoded["decoder"] == "standin"
        images = decoded["images"]
        # chelsea and rocket by the "hardware" decoder, coffee by the CPU path; the broken JPEG
        # declined by the device, then failed on the CPU path (the bomb never reaches a Classifier: the Router's
        # header check refuses it)
        assert images["hardware"] == 2 and images["cpu"] == 1 and images["failed"] == 1, images
        assert images["fallback"] == 1 and images["device_errors"] == 0 and images["transform_fallback"] == 0, images
    finally:
        local_app.deploy(local_config(model_files))
