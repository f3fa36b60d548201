"""The app's own Open Inference Protocol messages (app/protocol/v2/pb/, python -m app.ops.proto_gen): they pickle by
reference, which Serve's Python gRPC proxy needs, and they are tritonclient's on the wire."""

from __future__ import annotations

import pickle
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from google.protobuf.descriptor import Descriptor
from tritonclient.grpc import model_config_pb2 as triton_config
from tritonclient.grpc import service_pb2 as triton_pb

from app.ops import proto_gen
from app.protocol.v2.pb import SERVICER, grpc_service_pb2_grpc, model_config_pb2
from app.protocol.v2.pb import grpc_service_pb2 as pb


def _messages(d: Any) -> dict[str, Descriptor]:
    """Every message type of a file or message descriptor, nested ones too, by full name."""
    out: dict[str, Descriptor] = {}
    for m in d.message_types_by_name.values() if hasattr(d, "message_types_by_name") else d.nested_types:
        out[m.full_name] = m
        out |= _messages(m)
    return out


def test_every_message_pickles_by_reference_to_the_apps_package() -> None:
    msg = pb.ModelInferRequest(model_name="efficientnet_lite0", id="r1")
    msg.inputs.add(name="image_bytes", datatype="BYTES", shape=[1, 1])
    msg.raw_input_contents.append(b"\xff\xd8 jpeg")
    msg.parameters["x"].CopyFrom(pb.InferParameter(int64_param=3))
    back = pickle.loads(pickle.dumps(msg))
    assert back == msg and type(back) is pb.ModelInferRequest
    for module, file in ((pb, pb.DESCRIPTOR), (model_config_pb2, model_config_pb2.DESCRIPTOR)):
        for name in (m.name for m in file.message_types_by_name.values()):
            cls = getattr(module, name)
            assert cls.__module__ == module.__name__ and cls.__module__.startswith("app.protocol.v2.pb.")
            assert type(pickle.loads(pickle.dumps(cls()))) is cls


def test_the_messages_are_tritonclients_field_for_field() -> None:
    """Every message both define has the same fields (name, number, type, label); the service's RPCs the same paths.
    With the pinned tritonclient installed, the two files are the same bytes."""
    ours = _messages(pb.DESCRIPTOR) | _messages(model_config_pb2.DESCRIPTOR)
    theirs = _messages(triton_pb.DESCRIPTOR) | _messages(triton_config.DESCRIPTOR)
    assert {"inference.ModelInferRequest", "inference.ModelConfig"} <= ours.keys()
    for name in ours.keys() & theirs.keys():
        fields = [{(f.name, f.number, f.type, f.label) for f in d.fields} for d in (ours[name], theirs[name])]
        assert fields[0] == fields[1], name
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs_service = triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == theirs_service.full_name == "inference.GRPCInferenceService"
    served = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig")
    for rpc in (*served, "ModelStatistics", "ModelInfer"):
        ours_m, theirs_m = service.methods_by_name[rpc], theirs_service.methods_by_name[rpc]
        assert ours_m.input_type.full_name == theirs_m.input_type.full_name, rpc
        assert ours_m.output_type.full_name == theirs_m.output_type.full_name, rpc
    if proto_gen.installed_tritonclient() == proto_gen.TRITONCLIENT:
        assert pb.DESCRIPTOR.serialized_pb == triton_pb.DESCRIPTOR.serialized_pb
        assert model_config_pb2.DESCRIPTOR.serialized_pb == triton_config.DESCRIPTOR.serialized_pb
    assert SERVICER.rsplit(".", 1) == [grpc_service_pb2_grpc.__name__, "add_GRPCInferenceServiceServicer_to_server"]


class _Servicer(grpc_service_pb2_grpc.GRPCInferenceServiceServicer):
    def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        out = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        out.outputs.add(name="echo", datatype="UINT8", shape=[len(request.raw_input_contents[0])])
        out.raw_output_contents.append(request.raw_input_contents[0])
        return out


def test_tritonclient_calls_a_server_made_with_the_apps_servicer() -> None:
    """The registration function the configs name, on a plain gRPC server: tritonclient's calls reach it."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_live()
        data = np.arange(5, dtype=np.uint8)
        inp = triton.InferInput("x", [5], "UINT8")
        inp.set_data_from_numpy(data)
        result = client.infer("m", [inp], request_id="r9")
        assert result.get_response().id == "r9" and list(result.as_numpy("echo")) == list(data)
        with pytest.raises(triton.InferenceServerException) as e:  # an RPC the servicer does not implement
            client.is_server_ready()
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    finally:
        server.stop(None)


def test_the_generators_rewrite_puts_protocs_output_under_the_package() -> None:
    """What proto_gen does to protoc's text: package-path imports and module names, the package's own pool."""
    protoc = (
        "from google.protobuf import descriptor_pool as _descriptor_pool\n"
        "import model_config_pb2 as model__config__pb2\n"
        "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(b'...')\n"
        "_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'grpc_service_pb2', _globals)\n"
    )
    text = proto_gen.rewrite("grpc_service_pb2.py", protoc)
    assert text.startswith("# Generated by python -m app.ops.proto_gen from tritonclient ")
    assert "from app.protocol.v2.pb import model_config_pb2 as model__config__pb2\n" in text
    assert "from app.protocol.v2.pb import _pool\n" in text and "_descriptor_pool" not in text
    assert "DESCRIPTOR = _pool.POOL.AddSerializedFile(" in text
    assert "(DESCRIPTOR, 'app.protocol.v2.pb.grpc_service_pb2', _globals)" in text
    for name in proto_gen.GENERATED:  # the committed files are the generator's (its header)
        assert (proto_gen.OUT / name).read_text().startswith(text.splitlines()[0])


def test_the_generator_without_grpcio_tools_says_how_to_get_them(capsys: pytest.CaptureFixture[str]) -> None:
    from app.ops import proto_gen

    assert proto_gen.main(["--check", "--tools-python", "/bin/false"]) == 2  # a Python that cannot import grpc_tools
    assert "make proto" in capsys.readouterr().err
