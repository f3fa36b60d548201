"""The serving application over real HTTP, on the session's Ray cluster, deployed from configs/local.yaml."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import cv2
import httpx
import numpy as np
import pytest

from app.toolchain.samples import sample_bytes
from tests.conftest import ServeDeployer, deployment, local_config, wait_until

pytestmark = pytest.mark.slow

# The top-1 of each sample photograph as the service prepares it (the built-in declaration: shorter side 256,
# centre 224, bicubic): docs/model.md "The model" says why chelsea is a tiger cat here and grace_hopper a near-tie.
EXPECTED = {"chelsea": 282, "coffee": 967, "rocket": 657}


def small_png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    ok, buf = cv2.imencode(".png", rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    assert ok
    return buf.tobytes()


def post_image(url: str, data: bytes, headers: dict[str, str] | None = None, **params: Any) -> httpx.Response:
    return httpx.post(
        url + "/v1/classify",
        content=data,
        headers={"Content-Type": "image/jpeg", **(headers or {})},
        params=params,
        timeout=30,
    )


async def post_many(url: str, bodies: list[tuple[bytes, dict[str, str]]], concurrency: int) -> list[httpx.Response]:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(data: bytes, headers: dict[str, str]) -> httpx.Response:
            async with sem:
                return await client.post("/v1/classify", content=data, headers={"Content-Type": "image/png", **headers})

        return await asyncio.gather(*(one(d, h) for d, h in bodies))


@pytest.mark.parametrize("variant", ["fp32", "int8"])
@pytest.mark.parametrize("photo", sorted(EXPECTED))
def test_sample_photographs_classified_by_both_variants(local_app: ServeDeployer, variant: str, photo: str) -> None:
    r = post_image(local_app.url, sample_bytes(photo), {"X-Model-Variant": variant})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["variant"] == variant == r.headers["x-model-variant"]
    assert body["routing"] == "override"
    assert body["predictions"][0]["class_id"] == EXPECTED[photo]
    assert len(body["predictions"]) == 5
    scores = [p["score"] for p in body["predictions"]]
    assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1


def test_rocket_is_a_missile_via_multipart(local_app: ServeDeployer) -> None:
    files = {"file": ("rocket.jpg", sample_bytes("rocket"), "image/jpeg")}
    r = httpx.post(local_app.url + "/v1/classify", files=files, timeout=30)
    assert r.status_code == 200, r.text
    top = r.json()["predictions"][0]
    assert (top["class_id"], top["label"]) == (657, "missile")
    assert r.json()["variant"] in ("int8", "fp32")


def test_raw_body_and_multipart_give_the_same_answer(local_app: ServeDeployer) -> None:
    data = sample_bytes("chelsea")
    raw = post_image(local_app.url, data, {"X-Model-Variant": "fp32"}, top_k=3)
    multi = httpx.post(
        local_app.url + "/v1/classify",
        files={"file": ("c.png", data, "image/png")},
        headers={"X-Model-Variant": "fp32"},
        params={"top_k": 3},
        timeout=30,
    )
    assert raw.status_code == multi.status_code == 200
    assert raw.json()["predictions"] == multi.json()["predictions"]
    assert len(raw.json()["predictions"]) == 3


def test_response_contract(local_app: ServeDeployer) -> None:
    r = post_image(local_app.url, sample_bytes("coffee"), top_k=1)
    body = r.json()
    assert set(body) >= {"request_id", "variant", "model", "predictions", "timings_ms"}
    assert body["model"] == "efficientnet_lite0"
    assert set(body["predictions"][0]) == {"class_id", "label", "score"}
    assert body["predictions"][0]["label"] == "espresso"
    t = body["timings_ms"]
    assert set(t) >= {"receive", "preprocess", "queue", "inference", "total", "batch_size"}
    assert t["total"] >= t["inference"] > 0 and t["batch_size"] >= 1
    assert r.headers["x-request-id"] == body["request_id"]
    # Server-Timing parses as name;dur=number entries
    entries = dict(e.strip().split(";dur=") for e in r.headers["server-timing"].split(","))
    assert float(entries["total"]) == pytest.approx(t["total"])


def test_models_health_and_readiness(local_app: ServeDeployer) -> None:
    assert httpx.get(local_app.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(local_app.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["variants"] == {"fp32": True, "int8": True}
    models = httpx.get(local_app.url + "/v1/models").json()
    assert set(models["variants"]) == {"int8", "fp32"}
    for name, v in models["variants"].items():
        assert v["deployment"] == f"Classifier_{name}"
        # auto on a CPU replica: OpenVINO and the CPU EP were both measured; the faster serves.
        assert set(v["engine_candidates"]) == {"openvino", "cpu"}
        fastest = max(v["engine_candidates"], key=lambda e: v["engine_candidates"][e]["img_per_s"])
        assert v["engine"] == fastest
        assert v["execution_provider"] == {"openvino": "OpenVINO", "cpu": "CPUExecutionProvider"}[v["engine"]]
        assert v["fell_back_to_cpu"] is False and v["on_gpu"] is False
        assert v["precision"] == name
        measured = v["measured"]
        assert set(measured) == {"batch_1", "batch_16"}
        assert measured["batch_16"]["batch"] == 16 and measured["batch_16"]["img_per_s"] > 0
        assert measured["batch_16"]["parallel"] == 2  # max_concurrent_batches: measured as it serves
        assert v["model_file"].endswith(f"efficientnet_lite0-{name}.onnx")
        assert v["batching"]["max_batch_size"] == 16
        assert v["warmed_up_to"] == 16
        assert v["intra_op_threads"] == 1  # num_cpus 0.5 -> one thread, never more than the share
    # local.yaml's speed gate: the INT8 replica measured the FP32 model beside itself (warn: a flag, no refusal).
    gate = models["variants"]["int8"]["speed_gate"]
    assert gate["baseline"] == "fp32" and gate["action"] == "warn" and gate["min_speedup"] == 1.2
    assert gate["passed"] == (gate["speedup"] >= 1.2) and gate["variant_img_per_s"] > 0
    assert "speed_gate" not in models["variants"]["fp32"]
    assert models["routing"]["override_header"] == "X-Model-Variant"


def test_errors_are_json_with_the_right_status(local_app: ServeDeployer) -> None:
    url = local_app.url
    cases = [
        (post_image(url, b""), 400, "empty_body"),
        (post_image(url, b"not an image at all"), 400, "undecodable_image"),
        (post_image(url, sample_bytes("coffee"), top_k=0), 422, "invalid_parameter"),
        (post_image(url, sample_bytes("coffee"), top_k="many"), 422, "invalid_parameter"),
        (post_image(url, sample_bytes("coffee"), {"X-Model-Variant": "int4"}), 422, "unknown_variant"),
        (
            httpx.post(url + "/v1/classify", content=b"x", headers={"Content-Type": "text/plain"}),
            415,
            "unsupported_media_type",
        ),
        (httpx.get(url + "/v1/nothing-here"), 404, "not_found"),
        (httpx.get(url + "/v1/classify"), 405, "method_not_allowed"),
    ]
    for r, status, code in cases:
        assert r.status_code == status, (code, r.text)
        assert r.json()["error"]["code"] == code
        assert r.json()["error"]["message"]


def test_weighted_split_30_70_within_5_points(local_app: ServeDeployer, model_files: Any) -> None:
    cfg = local_config(model_files, weights={"int8": 30, "fp32": 70})
    local_app.deploy(cfg)
    try:
        bodies = [(small_png(i % 8), {}) for i in range(1000)]
        responses = asyncio.run(post_many(local_app.url, bodies, concurrency=24))
        assert all(r.status_code == 200 for r in responses), collections.Counter(r.status_code for r in responses)
        split = collections.Counter(r.headers["x-model-variant"] for r in responses)
        assert abs(split["int8"] / 1000 - 0.30) <= 0.05, split
        assert all(r.json()["routing"] == "weighted" for r in responses[:10])
    finally:
        local_app.deploy(local_config(model_files))


def test_a_user_id_always_maps_to_the_same_variant(local_app: ServeDeployer) -> None:
    users = [f"user-{i}" for i in range(24)]
    bodies = [(small_png(0), {"X-User-Id": u}) for u in users for _ in range(4)]
    responses = asyncio.run(post_many(local_app.url, bodies, concurrency=16))
    seen: dict[str, set[str]] = collections.defaultdict(set)
    for (_, headers), r in zip(bodies, responses, strict=True):
        assert r.status_code == 200
        assert r.json()["routing"] == "sticky"
        seen[headers["X-User-Id"]].add(r.headers["x-model-variant"])
    assert all(len(v) == 1 for v in seen.values()), seen
    assert {next(iter(v)) for v in seen.values()} == {"int8", "fp32"}  # 24 users at 50/50 see both


def test_override_is_refused_when_disabled(local_app: ServeDeployer, model_files: Any) -> None:
    local_app.deploy(local_config(model_files, allow_override=False))
    try:
        r = post_image(local_app.url, sample_bytes("coffee"), {"X-Model-Variant": "fp32"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "override_forbidden"
        assert post_image(local_app.url, sample_bytes("coffee")).status_code == 200
    finally:
        local_app.deploy(local_config(model_files))


def replica_ids(url: str) -> dict[str, str]:
    models = httpx.get(url + "/v1/models", timeout=10).json()
    return {"Router": models["router_replica_id"], **{k: v["replica_id"] for k, v in models["variants"].items()}}


def test_live_weight_and_batch_change_keeps_replicas(local_app: ServeDeployer, model_files: Any) -> None:
    before = replica_ids(local_app.url)
    cfg = local_config(model_files, weights={"int8": 0, "fp32": 1})
    deployment(cfg, "Classifier_fp32")["user_config"]["max_batch_size"] = 8
    local_app.deploy(cfg)
    try:
        wait_until(
            lambda: httpx.get(local_app.url + "/v1/models").json()["variants"]["int8"]["traffic_fraction"] == 0.0,
            30,
            what="new weights live",
        )
        variants = {post_image(local_app.url, small_png(i)).headers["x-model-variant"] for i in range(20)}
        assert variants == {"fp32"}
        models = httpx.get(local_app.url + "/v1/models").json()
        assert models["variants"]["fp32"]["batching"]["max_batch_size"] == 8
        assert replica_ids(local_app.url) == before  # reconfigured in place, not restarted
    finally:
        local_app.deploy(local_config(model_files))


def test_concurrent_requests_form_batches(local_app: ServeDeployer) -> None:
    bodies = [(small_png(i), {"X-Model-Variant": "fp32"}) for i in range(64)]
    responses = asyncio.run(post_many(local_app.url, bodies, concurrency=32))
    assert all(r.status_code == 200 for r in responses)
    sizes = [r.json()["timings_ms"]["batch_size"] for r in responses]
    assert max(sizes) > 1, sizes
    assert max(sizes) <= 16


def test_batch_endpoint_keeps_order_and_isolates_bad_images(local_app: ServeDeployer) -> None:
    files = [
        ("file", ("a.png", sample_bytes("chelsea"), "image/png")),
        ("file", ("b.txt", b"garbage", "image/png")),
        ("file", ("c.jpg", sample_bytes("rocket"), "image/jpeg")),
        ("file", ("d.png", sample_bytes("coffee"), "image/png")),
    ]
    r = httpx.post(local_app.url + "/v1/classify/batch", files=files, headers={"X-Model-Variant": "fp32"}, timeout=30)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x.get("predictions", [{}])[0].get("class_id") for x in results] == [282, None, 657, 967]
    assert results[1]["error"]["code"] == "undecodable_image" and results[1]["status"] == 400
    assert r.json()["timings_ms"]["batch_size"] >= 3  # the three good images rode together


def test_an_image_over_grpcs_default_4_mib_message_limit_is_classified(local_app: ServeDeployer) -> None:
    """serve.env sends calls between replicas over gRPC, whose replica servers take 4 MiB per message unless
    RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH says more: a 6 MB photo (or a group of 16 large ones) must pass."""
    noise = np.random.default_rng(0).integers(0, 256, (1500, 1400, 3), dtype=np.uint8)
    ok, png = cv2.imencode(".png", noise, [cv2.IMWRITE_PNG_COMPRESSION, 0])
    assert ok and 4 * 2**20 < len(png) < 10 * 2**20
    r = post_image(local_app.url, png.tobytes(), {"Content-Type": "image/png"})
    assert r.status_code == 200, r.text


# --------------------------------------------------------------------------- the cascade (docs/ab-rollout-cascade.md)

CASCADE_PHOTOS = ["chelsea", "coffee", "astronaut", "rocket", "grace_hopper"]


def _answers(url: str, variant: str) -> list[dict[str, Any]]:
    out = []
    for photo in CASCADE_PHOTOS:
        r = post_image(url, sample_bytes(photo), {"X-Model-Variant": variant})
        assert r.status_code == 200, r.text
        assert r.headers["x-model-variant"] == variant
        out.append({**r.json(), "server_timing": r.headers["server-timing"]})
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same classes in the same order, the same probabilities (to 1e-4: a batch of another size may round
    differently)."""
    pa, pb = a["predictions"], b["predictions"]
    return [p["class_id"] for p in pa] == [p["class_id"] for p in pb] and all(
        abs(x["score"] - y["score"]) < 1e-4 for x, y in zip(pa, pb, strict=True)
    )


def test_cascades_answer_as_their_margin_says_on_the_real_models(local_app: ServeDeployer) -> None:
    url = local_app.url
    int8, fp32 = _answers(url, "int8"), _answers(url, "fp32")
    everything, nothing = _answers(url, "int8>fp32-all"), _answers(url, "int8>fp32-none")
    auto = _answers(url, "int8>fp32")  # local.yaml's: no evidence yet, so its default threshold, 0.5
    for i, photo in enumerate(CASCADE_PHOTOS):
        assert everything[i]["cascade"]["escalated"] is True and _same(everything[i], fp32[i]), photo
        assert nothing[i]["cascade"]["escalated"] is False and _same(nothing[i], int8[i]), photo
        assert "escalation;dur=" in everything[i]["server_timing"]
        c = auto[i]["cascade"]
        top = int8[i]["predictions"]
        assert c["threshold"] == 0.5 and c["first"] == "int8" and c["then"] == "fp32"
        assert c["margin"] == pytest.approx(top[0]["score"] - top[1]["score"], abs=1e-4), photo
        assert c["escalated"] == (c["margin"] < 0.5), photo
        assert _same(auto[i], fp32[i] if c["escalated"] else int8[i]), photo
    assert any(a["cascade"]["escalated"] for a in auto) and not all(a["cascade"]["escalated"] for a in auto)
    models = httpx.get(url + "/v1/models", timeout=10).json()
    assert models["cascades"]["int8>fp32"]["margin"] == "auto" and models["cascades"]["int8>fp32"]["weight"] == 0
    summary = httpx.get(url + "/v1/ab/summary", timeout=10).json()
    fit = summary["cascades"]["int8>fp32"]["fit"]
    assert fit["fitted"] is False and fit["threshold"] == 0.5
