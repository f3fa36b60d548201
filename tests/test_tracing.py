"""One trace per request, served: configs/local.yaml on the session's Ray cluster with tracing on, a Preprocessor
deployment (decode_in: preprocessor) and spans exported by OTLP to receivers started here (tests/otlp_receiver.py),
which decode the exporters' real requests: the Router exports over gRPC, the Preprocessor and Classifiers over HTTP.

Tracing is turned on as an operator does, by Serve's variable and the standard OTEL_* ones in the application's
runtime_env. The sampler is OTEL_TRACES_SAMPLER's `parentbased_traceidratio` at 0 while Serve's own ratio is 1: a
request is traced only where its caller's traceparent says sampled, which shows both that the OTEL_* sampler is the one
in force and that a caller's decision stands. Classifier_int8 batches up to 2 and waits 1 s for the second, so two
concurrent requests share one batch.
"""

from __future__ import annotations

import concurrent.futures
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from app.imaging.preprocess import preprocess
from app.protocol.v2.pb import grpc_service_pb2 as pb
from app.protocol.v2.pb import grpc_service_pb2_grpc as pb_grpc
from app.served_model import ModelFiles, builtin_transform
from app.storage import sha256_file
from app.toolchain.samples import sample_bytes
from tests.conftest import ServeDeployer, deployment, local_config, wait_until
from tests.otlp_receiver import Receivers, Span, Spans
from tests.test_observability import scrape, total
from tests.test_v2_http import INT8

pytestmark = pytest.mark.slow
SERVER, SAMPLED = 2, "01"


@dataclass
class Traced:
    app: ServeDeployer
    receivers: Receivers
    int8_sha256: str

    @property
    def spans(self) -> Spans:
        return self.receivers.sink


@pytest.fixture(scope="module")
def traced(local_app: ServeDeployer, model_files: ModelFiles) -> Iterator[Traced]:
    with Receivers() as receivers:
        cfg = local_config(model_files)
        app = cfg["applications"][0]
        app["args"]["decode_in"] = "preprocessor"
        app["runtime_env"] = {
            "env_vars": {
                "RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH": "app.serve.tracing:span_processors",
                "RAY_SERVE_TRACING_SAMPLING_RATIO": "1.0",
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0",
                "OTEL_EXPORTER_OTLP_ENDPOINT": receivers.http_url,
                "OTEL_SERVICE_NAME": "image-classifier-test",
                "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "otel,process",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            }
        }
        router = deployment(cfg, "Router")
        router["ray_actor_options"]["runtime_env"] = {
            "env_vars": {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_ENDPOINT": receivers.grpc_url,
                "OTEL_BSP_MAX_QUEUE_SIZE": "32",  # a stalled collector fills it within a few requests (the last test)
            }
        }
        deployment(cfg, "Classifier_int8")["user_config"].update(
            max_batch_size=2, batch_wait_timeout_s=1.0, max_concurrent_batches=1
        )
        local_app.deploy(cfg, 300)
        try:
            yield Traced(local_app, receivers, sha256_file(model_files.int8))
        finally:
            local_app.deploy(local_config(model_files), 300)


def caller(sampled: bool = True) -> tuple[str, str, str]:
    """(trace id, span id, traceparent) of a caller's span."""
    tid, sid = secrets.token_hex(16), secrets.token_hex(8)
    return tid, sid, f"00-{tid}-{sid}-{SAMPLED if sampled else '00'}"


def one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def classify(url: str, image: bytes, traceparent: str | None) -> httpx.Response:
    headers = {"content-type": "image/png", "X-Model-Variant": "int8"}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    return httpx.post(url + "/v1/classify", content=image, headers=headers, timeout=30)


NAMES = {"POST /v1/classify", "decode", "classifier batch"}


def test_a_request_with_a_traceparent_is_one_trace_across_the_router_preprocessor_and_classifier(
    traced: Traced,
) -> None:
    image = sample_bytes("coffee")
    tid, sid, header = caller()
    reply = classify(traced.app.url, image, header)
    assert reply.status_code == 200, reply.text
    back = reply.headers["traceparent"].split("-")
    assert back[1] == tid and back[3] == SAMPLED

    spans = traced.spans.wait_for(lambda t: {s.name for s in t} >= NAMES, tid)
    ids = {s.span_id for s in spans}
    assert all(s.parent_span_id in ids or s.parent_span_id == sid for s in spans), "one tree under the caller's span"
    server = one(spans, "POST /v1/classify")
    assert server.span_id == back[2] and server.kind == SERVER and server.status == 0
    assert server.attributes["http.route"] == "/v1/classify" and server.attributes["http.response.status_code"] == 200
    assert server.attributes["app.variant"] == "int8" and server.attributes["app.routing.reason"] == "override"
    assert server.attributes["http.request.body.size"] == len(image) and server.attributes["app.body_read_ms"] >= 0
    assert server.via == "grpc" and server.resource["service.name"] == "image-classifier-test"
    # Serve's spans are there too, the app's under them: its proxy-less ingress span on the Router, each handle call.
    assert any(s.name.startswith("replica_handle_request Router") for s in spans)
    assert any(s.name.startswith("route_to_replica Classifier_int8") for s in spans)
    # Three processes: the Router's, a Preprocessor's, Classifier_int8's.
    pids = {s.resource["process.pid"] for s in spans}
    assert len(pids) >= 3
    decode = one(spans, "decode")
    assert decode.via == "http" and decode.resource["process.pid"] != server.resource["process.pid"]
    assert decode.attributes["app.image.format"] == "png" and decode.attributes["app.image.bytes"] == len(image)
    assert decode.attributes["app.image.pixels"] == 400 * 600
    batch = one(spans, "classifier batch")
    assert batch.attributes["app.batch.images"] == 1 and batch.attributes["app.model.sha256"] == traced.int8_sha256
    assert batch.attributes["app.engine"] in ("cpu", "openvino") and batch.attributes["app.execution_provider"]
    assert batch.attributes["app.batch.cuda_graph"] is False
    assert batch.resource["process.pid"] not in (server.resource["process.pid"], decode.resource["process.pid"])
    # Alone in its group and its batch: no group span (a group of one is the request), the batch in its own trace.
    assert not {"coalesced group", "router queue", "batch queue", "preprocess"} & {s.name for s in spans}


def test_two_requests_batched_together_both_link_to_the_one_batch_span(traced: Traced) -> None:
    """Ready pixels (V2 UINT8) go straight from each request to Classifier_int8, whose batch waits for the second."""
    pixels = preprocess(sample_bytes("chelsea"), builtin_transform())[None]
    callers = [caller(), caller()]

    def infer(header: str) -> Any:
        client = triton.InferenceServerClient(traced.app.url.removeprefix("http://"), network_timeout=60)
        inp = triton.InferInput("image", list(pixels.shape), "UINT8")
        inp.set_data_from_numpy(pixels, binary_data=True)
        return client.infer(INT8, [inp], headers={"traceparent": header})

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(infer, [h for _, _, h in callers]))
    assert all(int(np.argmax(r.as_numpy("logits"))) == 282 for r in results)

    # One trace has the batch as its own span (the batch's parent); the other a batch-queue span linked to it.
    names = ("classifier batch", "batch queue")
    traces = [traced.spans.wait_for(lambda t: bool(set(names) & {s.name for s in t}), tid) for tid, _, _ in callers]
    (batch,) = [s for t in traces for s in t if s.name == "classifier batch"]
    (queued,) = [s for t in traces for s in t if s.name == "batch queue"]
    assert queued.links == [(batch.trace_id, batch.span_id)] and queued.trace_id != batch.trace_id
    assert batch.attributes["app.batch.requests"] == 2
    assert {t for t, _ in batch.links} == {tid for tid, _, _ in callers}  # linked to both requests' spans


def test_the_callers_decision_stands_and_a_refused_request_is_the_clients_error(traced: Traced) -> None:
    url = traced.app.url
    image = sample_bytes("coffee")
    unsampled = caller(sampled=False)
    assert "traceparent" not in classify(url, image, unsampled[2]).headers  # the caller said: not sampled
    assert "traceparent" not in classify(url, image, None).headers  # no caller: OTEL_TRACES_SAMPLER_ARG 0 says no

    tid, _, header = caller()
    bad = classify(url, b"not an image at all", header)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "undecodable_image"
    spans = traced.spans.wait_for(lambda t: any(s.kind == SERVER and s.name.startswith("POST") for s in t), tid)
    server = one(spans, "POST /v1/classify")
    assert server.attributes["http.response.status_code"] == 400
    assert server.attributes["error.type"] == "undecodable_image" and server.status == 0  # a 4xx: the client's
    # Exports are per process and ordered: the sampled request's spans are in, the unsampled caller's never came.
    assert traced.spans.of_trace(unsampled[0]) == []


def test_a_grpc_call_is_a_server_span_continuing_the_callers_metadata(traced: Traced) -> None:
    pixels = preprocess(sample_bytes("coffee"), builtin_transform())[None]
    request = pb.ModelInferRequest(model_name=INT8)
    request.inputs.add(name="image", datatype="UINT8", shape=list(pixels.shape))
    request.raw_input_contents.append(pixels.tobytes())
    tid, sid, header = caller()
    with grpc.insecure_channel(traced.app.grpc_url) as channel:
        _, call = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer.with_call(
            request, metadata=[("traceparent", header)], timeout=60
        )
    trailing = dict(call.trailing_metadata() or ())
    assert trailing["traceparent"].split("-")[1] == tid
    spans = traced.spans.wait_for(lambda t: "classifier batch" in {s.name for s in t}, tid)
    server = one(spans, "inference.GRPCInferenceService/ModelInfer")
    assert server.kind == SERVER and server.span_id == trailing["traceparent"].split("-")[2]
    assert server.attributes["rpc.system"] == "grpc" and server.attributes["rpc.method"] == "ModelInfer"
    assert server.attributes["rpc.grpc.status_code"] == 0 and server.attributes["app.routing.reason"] == "model"
    ids = {s.span_id for s in spans}
    assert all(s.parent_span_id in ids or s.parent_span_id == sid for s in spans)


def test_a_stalled_collector_costs_spans_counted_as_dropped_never_a_request(traced: Traced) -> None:
    """The receivers hold every export: the Router's queue (32 spans here) fills and its spans are dropped and
    counted, while every request is answered as before. 48 requests: a lone single-image request makes about 4 spans
    in the Router, so the queue overflows several times over whatever the held exporter took before it stalled."""
    dropped = "ray_app_trace_spans_dropped_total"
    before = total(scrape(), dropped, reason="queue_full")
    traced.receivers.hold()
    try:
        headers = {"content-type": "image/png", "X-Model-Variant": "fp32"}
        image = sample_bytes("coffee")
        url = traced.app.url + "/v1/classify"
        with httpx.Client(timeout=30) as client:
            statuses = [
                client.post(url, content=image, headers=headers | {"traceparent": caller()[2]}).status_code
                for _ in range(48)
            ]
        assert statuses == [200] * 48
        wait_until(lambda: total(scrape(), dropped, reason="queue_full") > before, 60, what="drops counted")
    finally:
        traced.receivers.release()
