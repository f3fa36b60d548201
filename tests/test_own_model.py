"""A user's own classifier, served by configuration alone: EfficientNet-Lite1 at 240 px exported as PyTorch users
export it (float32 NCHW input, (x - 127) / 128 outside the graph, logits out), built with the project's own builder
(no torch), quantized by `python -m app.models quantize --model --config --output`, and deployed as a second
application (route_prefix /lite1) beside the shared one, from configs/examples/efficientnet-lite1.yaml.

The proof that its declaration is served as written: photographs whose shorter side already is resize_shorter
(lossless PNG: no resampling anywhere) get exactly the probabilities the graph gives on the same pixels, cropped,
normalised and laid out here by hand and run through the raw graph with ONNX Runtime.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import httpx
import numpy as np
import onnxruntime as ort
import pytest
import yaml
from ray import serve

from app.runtime import softmax
from app.toolchain.build import export_lite1
from app.toolchain.samples import sample_bytes
from tests.conftest import REPO, ServeDeployer, local_config, wait_until

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "configs" / "examples" / "efficientnet-lite1.yaml"
APP, PREFIX, NAME = "lite1", "/lite1", "efficientnet_lite1"
SHORTER, CROP = 274, 240  # the example's resize_shorter, and the graph's input size
PHOTOS = ("chelsea", "coffee", "astronaut", "motorcycle_left", "rocket")


@pytest.fixture(scope="module")
def lite1(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The FP32 export, its labels, its declaration (the example's, pointed here) and its INT8 build by the CLI."""
    root = tmp_path_factory.mktemp("lite1")
    files = {"fp32": root / "lite1.onnx", "int8": root / "q" / "lite1-quantized.onnx", "labels": root / "names.txt"}
    export_lite1(files["fp32"])
    files["labels"].write_text("".join(f"lite1 class {i}\n" for i in range(1000)))
    cfg = yaml.safe_load(EXAMPLE.read_text())
    args = cfg["applications"][0]["args"]
    args["model"]["labels_path"] = str(files["labels"])
    args["variants"]["fp32"]["model_path"] = str(files["fp32"])
    args["variants"]["int8"]["model_path"] = str(files["int8"])
    files["config"] = root / "serve.yaml"
    files["config"].write_text(yaml.safe_dump(cfg))
    quantize = [sys.executable, "-m", "app.models", "quantize", "--model", files["fp32"], "--config", files["config"]]
    done = subprocess.run(
        [*map(str, quantize), "--output", str(files["int8"]), "--num-images", "16", "--no-report"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return files


def app_config(files: dict[str, Path]) -> dict[str, Any]:
    """The example's application at /lite1, sized to share this machine's cores with the shared app."""
    app = copy.deepcopy(yaml.safe_load(files["config"].read_text())["applications"][0])
    app |= {"name": APP, "route_prefix": PREFIX}
    args = app["args"]
    args.pop("speed_gate")  # measuring FP32 beside INT8 at start costs these 2 cores seconds; tested elsewhere
    for v in args["variants"].values():
        v["engine"] = "cpu"  # auto would measure OpenVINO too at start; the engine choice is tested elsewhere
    for d in app["deployments"]:
        d["ray_actor_options"] = {"num_cpus": 0.1}
        d["max_constructor_retry_count"] = 1
        if d["name"] == "Router":
            d["user_config"]["shadow_fraction"] = 1.0  # every request also on the other variant: agreement evidence
        else:
            d["user_config"] |= {"max_batch_size": 4, "max_concurrent_batches": 1}
    return app


@pytest.fixture(scope="module")
def served(local_app: ServeDeployer, model_files: Any, lite1: dict[str, Path]) -> Iterator[str]:
    from ray.serve.schema import ServeDeploySchema

    base = local_config(model_files)
    both = copy.deepcopy(base)
    both["applications"].append(app_config(lite1))

    def schema(cfg: dict[str, Any]) -> Any:
        return ServeDeploySchema.model_validate(
            {k: v for k, v in cfg.items() if k not in ("http_options", "proxy_location")}
        )

    local_app.client.deploy_apps(schema(both))

    def running() -> bool:
        st = serve.status().applications.get(APP)
        if st is not None and st.status == "DEPLOY_FAILED":
            raise AssertionError(st.message)
        return (
            st is not None
            and st.status == "RUNNING"
            and httpx.get(local_app.url + PREFIX + "/readyz").status_code == 200
        )

    wait_until(running, 240, 0.5, "the lite1 application running")
    yield local_app.url + PREFIX
    local_app.client.deploy_apps(schema(base))
    wait_until(lambda: APP not in serve.status().applications, 60, what="lite1 removed")


def exact_size_png(photo: str) -> bytes:
    """The sample photograph made to a shorter side of exactly SHORTER, as a lossless PNG."""
    img = cv2.imdecode(np.frombuffer(sample_bytes(photo), np.uint8), cv2.IMREAD_COLOR)
    h, w = img.shape[:2]
    k = SHORTER / min(h, w)
    size = (SHORTER, round(h * k)) if w <= h else (round(w * k), SHORTER)
    img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
    assert min(img.shape[:2]) == SHORTER
    return cv2.imencode(".png", img)[1].tobytes()


def by_hand(png: bytes, fp32: Path) -> np.ndarray:
    """The graph's own probabilities: centre crop (torchvision's offsets), RGB, (x - 127) / 128, NCHW, the raw
    graph, softmax; nothing from app/ but the softmax."""
    img = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
    h, w = img.shape[:2]
    top, left = round((h - CROP) / 2.0), round((w - CROP) / 2.0)
    rgb = img[top : top + CROP, left : left + CROP, ::-1].astype(np.float64)
    x = ((rgb - 127.0) / 128.0).transpose(2, 0, 1)[None].astype(np.float32)
    session = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    return softmax(session.run(None, {"input": x})[0].astype(np.float64))[0]


def classify(url: str, png: bytes, variant: str, top_k: int = 5) -> dict[str, Any]:
    r = httpx.post(
        url + "/v1/classify",
        content=png,
        params={"top_k": top_k},
        headers={"Content-Type": "image/png", "X-Model-Variant": variant},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_exact_size_photos_get_exactly_the_graphs_own_probabilities(served: str, lite1: dict[str, Path]) -> None:
    for photo in PHOTOS:
        png = exact_size_png(photo)
        want = by_hand(png, lite1["fp32"])
        body = classify(served, png, "fp32")
        assert body["model"] == NAME and body["variant"] == "fp32"
        got = [(p["class_id"], p["score"]) for p in body["predictions"]]
        best = np.argsort(-want)[:5]
        assert [c for c, _ in got] == best.tolist(), photo
        for (c, score), w in zip(got, want[best], strict=True):
            assert abs(score - w) < 1e-3, (photo, c, score, w)
        assert body["predictions"][0]["label"] == f"lite1 class {best[0]}"  # the declared labels file


def test_the_cli_made_int8_twin_serves_beside_it_with_agreement_measured(served: str) -> None:
    pngs = [exact_size_png(p) for p in PHOTOS]
    int8 = [classify(served, png, "int8", 1)["predictions"][0]["class_id"] for png in pngs]
    fp32 = [classify(served, png, "fp32", 1)["predictions"][0]["class_id"] for png in pngs]
    assert sum(a == b for a, b in zip(int8, fp32, strict=True)) >= 3, (int8, fp32)

    def compared() -> dict[str, Any] | None:  # shadow_fraction 1.0: each request also ran on the other variant
        summary = httpx.get(served + "/v1/ab/summary", timeout=10).json()
        pair = summary.get("pairs", {}).get("fp32|int8")
        return summary if pair and pair["shadowed"] >= len(pngs) else None

    summary = wait_until(compared, 30, 0.5, "shadow comparisons in the A/B summary")
    pair = summary["pairs"]["fp32|int8"]
    assert summary["model"] == NAME and 0.0 <= pair["top1_agreement"] <= 1.0


def test_models_and_v2_metadata_name_the_declared_model_and_its_graph(served: str) -> None:
    models = httpx.get(served + "/v1/models", timeout=10).json()
    assert models["model"] == NAME and models["declaration"]["preprocess"]["resize_shorter"] == SHORTER
    for variant, v in models["variants"].items():
        assert v["model"] == NAME and v["precision"] == variant
        spec = v["input"]
        assert spec["graph"]["input"] == {
            "name": "input",
            "shape": [-1, 3, CROP, CROP],
            "dtype": "float32",
            "layout": "NCHW",
        }
        assert spec["pixels"] == {"dtype": "uint8", "shape": [-1, CROP, CROP, 3], "order": "RGB"}
        assert spec["prologue"]["steps"] == ["Transpose", "Cast", "Conv"] and spec["classes"] == 1000
        assert spec["served_file"] != spec["file"] and spec["file"].endswith(".onnx")
    meta = httpx.get(served + f"/v2/models/{NAME}-int8", timeout=10).json()
    assert meta["name"] == f"{NAME}-int8"
    assert meta["inputs"][1] == {"name": "image", "datatype": "UINT8", "shape": [-1, CROP, CROP, 3]}
    assert meta["outputs"][0]["shape"] == [-1, 1000]
    config = httpx.get(served + f"/v2/models/{NAME}/config", timeout=10).json()
    assert config["parameters"]["graph_input"]["string_value"] == f"input float32 NCHW [3,{CROP},{CROP}]"
    assert httpx.get(served + "/v2/models/efficientnet_lite0", timeout=10).status_code == 404  # not this app's
    # /docs under the route_prefix: its assets relative to the page, its document sending "Try it out" there too
    assert httpx.get(served + "/docs", timeout=10).status_code == 200
    assert httpx.get(served + "/docs/assets/init.js", timeout=10).status_code == 200
    assert httpx.get(served + "/openapi.json", timeout=10).json()["servers"] == [{"url": PREFIX}]
