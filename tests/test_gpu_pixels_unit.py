"""`decode_in: gpu` in the Classifier, without a GPU: the batch of requests decoded by the host stand-in for
nvImageCodec and transformed by the transform graph on the CPU EP (what a GPU node runs on the CUDA EP), the per-image
CPU fallback, the refusals of config and plan, and the one-stream wiring of the decoder and the transform. Pure: no
Ray. nvImageCodec and the CUDA EP cannot run here: their construction is stood in for where named."""

from __future__ import annotations

import copy
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from app.config import Limits, validate_serve_config
from app.errors import ServiceError
from app.imaging.gpu_decode import BatchDecode
from app.imaging.opencv import cv2
from app.imaging.payloads import Pixels
from app.imaging.preprocess import preprocess
from app.imaging.standin_decoder import HostJpegDecoder
from app.imaging.transform import Transform
from app.runtime import cli as runtime_cli
from app.runtime import cuda_transform
from app.runtime.cuda_transform import DECODER_ENV, CudaImageTransform, decoder_factory, open_gpu_pixels, plan_decode
from app.runtime.gpu_pixels import GpuPixels
from app.runtime.plan import PlanError
from app.runtime.transform_graph import GraphTransform
from app.serve.batch_decoder import merge_decoded
from app.toolchain.samples import sample_bytes
from tests.hostile import cv_encode, jpeg_with_size, pattern_image

REPO = Path(__file__).resolve().parent.parent
T = Transform(224, 224, resize_shorter=256)
PHOTO = sample_bytes("coffee")  # a PNG photograph: the CPU path's
JPEG = cv_encode(".jpg", pattern_image(300, 400), [cv2.IMWRITE_JPEG_QUALITY, 95])
JPEG_B = cv_encode(".jpg", pattern_image(480, 640, seed=1), [cv2.IMWRITE_JPEG_QUALITY, 95])
BROKEN = JPEG[: len(JPEG) // 2]
BOMB = jpeg_with_size(60_000, 60_000)


def gpu_pixels(transform: Any = None) -> GpuPixels:
    decode = BatchDecode(HostJpegDecoder(), T, executor=ThreadPoolExecutor(2))
    return GpuPixels(decode, transform if transform is not None else GraphTransform(T))


def cpu_error(data: bytes) -> ServiceError:
    with pytest.raises(ServiceError) as e:
        preprocess(data, T)
    return e.value


def test_a_batch_of_requests_comes_out_as_each_requests_pixels_and_errors() -> None:
    out, counts = gpu_pixels()([[JPEG, PHOTO, BROKEN], [BOMB], [JPEG_B]])

    first, second, third = out
    assert first.positions == [0, 1] and set(first.errors) == {2}
    assert first.array.shape == (2, 224, 224, 3) and first.array.dtype == np.uint8
    # the JPEG by the "device" + the transform graph: within a grey level of the CPU path on average
    assert np.abs(first.array[0].astype(int) - preprocess(JPEG, T).astype(int)).mean() <= 1.0
    np.testing.assert_array_equal(first.array[1], preprocess(PHOTO, T))  # the PNG by the CPU path itself
    for data, error in ((BROKEN, first.errors[2]), (BOMB, second.errors[0])):  # the CPU path's codes and statuses
        expected = cpu_error(data)
        assert (error.code, error.status) == (expected.code, expected.status)
    assert second.array.shape == (0, 224, 224, 3) and second.positions == []
    assert third.positions == [0] and not third.errors
    assert counts["hardware"] == 2 and counts["cpu"] == 1 and counts["failed"] == 2
    assert first.preprocess_ms == second.preprocess_ms > 0  # one decode for the whole batch


def test_a_failing_gpu_transform_falls_back_to_the_cpu_path_per_image() -> None:
    class Failing:
        def __call__(self, image: Any, /) -> np.ndarray:
            raise RuntimeError("CUDA failure 700: an illegal memory access")

    gp = gpu_pixels(Failing())
    (pixels,), counts = gp([[JPEG, JPEG_B]])
    np.testing.assert_array_equal(pixels.array, np.stack([preprocess(JPEG, T), preprocess(JPEG_B, T)]))
    assert counts["transform_fallback"] == 2 and counts["cpu"] == 2 and counts["hardware"] == 0
    assert gp.counts()["transform_fallback"] == 2


def test_a_transform_of_the_wrong_shape_is_not_served() -> None:
    (pixels,), counts = gpu_pixels(lambda image: np.zeros((1, 10, 10, 3), np.uint8))([[JPEG]])
    np.testing.assert_array_equal(pixels.array[0], preprocess(JPEG, T))
    assert counts["transform_fallback"] == 1


def test_a_requests_chunks_merge_back_in_order() -> None:
    err = ServiceError("undecodable_image", "x")
    chunks = [
        Pixels(np.zeros((1, 2, 2, 3), np.uint8), 3.0, {1: err}, [0]),
        Pixels(np.zeros((2, 2, 2, 3), np.uint8), 5.0, {}, [0, 1]),
        Pixels(np.zeros((0, 2, 2, 3), np.uint8), 4.0, {0: err}, []),
    ]
    errors, positions, ms = merge_decoded(chunks)
    assert positions == [0, 2, 3] and set(errors) == {1, 4} and ms == 5.0


def test_the_decoder_is_chosen_by_the_environment_only() -> None:
    assert decoder_factory({})[0] == "nvimgcodec"
    assert decoder_factory({DECODER_ENV: "standin"})[0] == "standin"
    with pytest.raises(ValueError, match=DECODER_ENV):
        decoder_factory({DECODER_ENV: "cpu"})
    gp = open_gpu_pixels(T, Limits(), 1.0, 4, factory=decoder_factory({DECODER_ENV: "standin"})[1])
    (pixels,), _ = gp([[JPEG]])
    assert pixels.positions == [0]


def test_the_decoder_and_the_transform_share_one_cuda_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unordered, the transform read a half-written image on an H200 (probe4.log): both must get the same stream, and
    not 0 (ONNX Runtime's "none"). The CUDA runtime and nvImageCodec are stood in for: neither runs here."""
    seen: dict[str, int] = {}

    class Decoder:
        def __init__(self, num_cpus: float, device_id: int, max_batch: int, cuda_stream: int = 0) -> None:
            seen["decoder"] = cuda_stream

    class Transform_(CudaImageTransform):
        def __init__(self, t: Transform, device_id: int, stream: int) -> None:
            self.stream = stream
            seen["transform"] = stream
            seen["provider"] = int(cuda_transform.cuda_provider(device_id, stream)[1]["user_compute_stream"])

    import app.imaging.nvimgcodec_decoder as nv

    monkeypatch.setattr(cuda_transform, "new_stream", lambda: 0x7F00DEAD)
    monkeypatch.setattr(cuda_transform, "CudaImageTransform", Transform_)
    monkeypatch.setattr(nv, "NvImageCodecDecoder", Decoder)
    decoder_factory({})[1](T, 2.0, 8, 0)
    assert seen == {"decoder": 0x7F00DEAD, "transform": 0x7F00DEAD, "provider": 0x7F00DEAD}
    with pytest.raises(ValueError, match="own stream"):
        cuda_transform.cuda_provider(0, 0)


def test_a_device_image_that_is_not_contiguous_rgb_is_refused_before_the_gpu() -> None:
    transform = object.__new__(CudaImageTransform)  # the CUDA EP cannot load here; the checks come first

    class Image:
        def __init__(self, **cai: Any) -> None:
            self.__cuda_array_interface__ = {"shape": (4, 6, 3), "typestr": "|u1", "data": (1, False), **cai}

    with pytest.raises(ValueError, match="uint8 RGB"):
        transform(Image(typestr="<f4"))
    with pytest.raises(ValueError, match="contiguous"):
        transform(Image(strides=(24, 3, 2)))


def test_plan_says_where_images_are_decoded_and_refuses_gpu_decoding_without_a_gpu() -> None:
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert plan_decode("router", False, ["CPUExecutionProvider"], None) == {"where": "router"}
    assert plan_decode("gpu", True, cuda, True)["where"] == "gpu"
    with pytest.raises(PlanError, match="without a GPU"):
        plan_decode("gpu", False, cuda, True)
    with pytest.raises(PlanError, match="CUDA EP"):
        plan_decode("gpu", True, ["CPUExecutionProvider"], True)
    with pytest.raises(PlanError, match="pip install nvidia-nvimgcodec"):
        plan_decode("gpu", True, cuda, False)


def gpu_config() -> dict[str, Any]:
    return yaml.safe_load((REPO / "configs" / "examples" / "gpu-decode.yaml").read_text())


def test_the_gpu_decode_example_plans_on_a_cuda_node_and_is_refused_on_a_cpu_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(REPO / "configs" / "examples" / "gpu-decode.yaml")
    listed = "CUDAExecutionProvider,CPUExecutionProvider"
    assert runtime_cli.main(["plan", path, "--gpu", "--available", listed]) == 0
    out = capsys.readouterr()
    assert '"where": "gpu"' in out.out
    assert runtime_cli.main(["plan", path, "--available", "CPUExecutionProvider"]) == 1
    assert "decode_in: gpu" in capsys.readouterr().err


def test_config_refuses_gpu_decoding_with_a_preprocessor_or_a_classifier_without_a_gpu() -> None:
    validate_serve_config(gpu_config())
    with_pre = copy.deepcopy(gpu_config())
    with_pre["applications"][0]["deployments"].append({"name": "Preprocessor"})
    with pytest.raises(ValueError, match=r"deployments\[Preprocessor\].*decode_in is gpu"):
        validate_serve_config(with_pre)
    no_gpu = copy.deepcopy(gpu_config())
    for d in no_gpu["applications"][0]["deployments"]:
        (d.get("ray_actor_options") or {}).pop("num_gpus", None)
    with pytest.raises(ValueError, match=r"num_gpus.*decode_in is gpu"):
        validate_serve_config(no_gpu)


def test_nvimgcodec_is_not_imported_by_the_serving_modules() -> None:
    assert "nvidia.nvimgcodec" not in sys.modules
