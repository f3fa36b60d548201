"""NVIDIA Triton Inference Server as a benchmark peer, through PyTriton (nvidia-pytriton 0.7.0, which ships the real
`tritonserver` binary and its Python backend). Only the serving path differs from the app: the same FP32 model file
(app.served_model.default_files().fp32), the same decode (app.imaging.preprocess.preprocess with the built-in model's
declared transform, app.served_model.builtin_transform: OpenCV, shorter side to 256, centre 224, bicubic, uint8 RGB
NHWC), the same engine (app.runtime.onnxruntime_engine: ONNX Runtime's CPU EP, one intra-op thread per instance) and
the same softmax (app.served_model.outputs).

Open Inference Protocol only (no /v1): model `efficientnet_lite0` (--model-name), input `image_bytes` BYTES (one
encoded image per element, binary extension or JSON), output `top_k` FP32 [N, 1000] probabilities, which Triton's
own classification extension turns into "score:index:label" strings when the request asks for
`{"name": "top_k", "parameters": {"classification": k}}` (the labels file goes to Triton with the model). Triton's
dynamic batcher (max_batch_size 16, no queue delay: the app's Classifier settings) feeds 2 instances (--instances),
each its own ONNX Runtime session, run by PyTriton in threads of this process. A batching Triton model takes
image_bytes as [N, 1] only (Triton requires dims of at least one element after the batch dimension; `reshape` does
not change what a request must send), so the load generator sends [N, 1], which the app takes as well as [N].
--max-batch-size 0 takes [N], but then there is no dynamic batcher, and the classification extension ranks the
whole [N, 1000] output as one vector: right for N=1 only. Triton refuses a request of more than max_batch_size
images; one undecodable image fails its whole batch.

HTTP on 127.0.0.1:PORT, gRPC PORT+1, metrics PORT+2. Ready: GET /v2/models/<model>/ready (/v2/health/ready answers
200 before the model is loaded). SIGINT or SIGTERM stops Triton and cleans its workspace (~5-8 s).

Why a separate venv (.venv-triton, from Debian's /usr/bin/python3): PyTriton's Python-backend stubs fail under the
pyenv Python 3.11.7 (`RLock._recursion_count`) and work under Debian's 3.11.2; and the stub binary needs numpy 1
(under numpy 2 it misreads BYTES tensors and aborts). The app's ONNX Runtime and OpenCV versions go in too (the
CPU wheel of the GPU wheel's version): OpenCV 5's wheel says numpy>=2 but runs on numpy 1.26, with byte-identical
decodes, so it is installed without its dependencies.

    .venv/bin/python -m benchmarks.baselines.triton_peer --setup           # once: builds .venv-triton
    .venv-triton/bin/python -m benchmarks.baselines.triton_peer --port 8106  # from the repository root
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-triton"
PYTRITON = "nvidia-pytriton==0.7.0"
LABELS_FILE = "labels.txt"
# PyTriton 0.7.0 starts model instances in parallel, and that is racy: now and then an instance fails its handshake
# with the first (ConnectionRefusedError) or tritonserver aborts (boost::interprocess::lock_exception). Start again.
START_ATTEMPTS = 3
HANDSHAKE_TIMEOUT = b"def get_config_from_handshake_server(socket_path: pathlib.Path, timeout_s: float = 1.0)"


def pinned(package: str, *installed_as: str) -> str:
    """`package==version` of the first of `installed_as` (default: `package`) installed here, else `package`."""
    for name in installed_as or (package,):
        try:
            return f"{package}=={metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return package


def setup() -> None:
    """Create .venv-triton from /usr/bin/python3: PyTriton (and its numpy<2), this venv's ONNX Runtime and OpenCV."""
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(VENV)], check=True)
    subprocess.run([*pip, PYTRITON, pinned("onnxruntime", "onnxruntime", "onnxruntime-gpu")], check=True)
    subprocess.run([*pip, "--no-deps", pinned("opencv-python-headless")], check=True)


def with_labels(config: dict) -> dict:
    """PyTriton's generated model config (JSON form) with the labels file on `top_k` (PyTriton has no such field)."""
    for out in config.get("output", []):
        if out["name"] == "top_k":
            out["label_filename"] = LABELS_FILE
    return config


def serve(port: int, model_name: str, instances: int, max_batch_size: int, queue_delay_us: int) -> None:
    import numpy as np
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.models.model import Model
    from pytriton.triton import Triton, TritonConfig

    from app.imaging.preprocess import preprocess
    from app.runtime import RuntimeOptions, onnxruntime_engine
    from app.served_model import builtin_transform, default_files, outputs

    files = default_files()
    labels = files.labels.read_bytes()
    # PyTriton loads the model through Triton's model control API with a config and files it generates. Triton reads
    # label_filename from the model's directory: add the labels to both. And the instances after the first wait 1 s
    # for the first one's handshake socket, too short on a busy 2-core machine: give them a minute.
    config_of, files_of = Model.get_model_config, Model.get_proxy_model_files

    def proxy_files(self: Model) -> dict[str, bytes]:
        out, key = {**files_of(self), f"file:{LABELS_FILE}": labels}, f"file:{self.model_version}/communication.py"
        out[key] = out[key].replace(HANDSHAKE_TIMEOUT, HANDSHAKE_TIMEOUT.replace(b"1.0", b"60.0"))
        return out

    Model.get_model_config = lambda self: with_labels(config_of(self))  # type: ignore[method-assign]
    Model.get_proxy_model_files = proxy_files  # type: ignore[method-assign]

    def instance() -> object:
        engine = onnxruntime_engine(files.fp32, RuntimeOptions(threads=1, prefer_gpu=False))
        served = builtin_transform(engine.spec.height)  # what the app serves the built-in model

        def infer(requests: list) -> list[dict[str, np.ndarray]]:
            counts = [len(r["image_bytes"]) for r in requests]
            images = [preprocess(bytes(b), served) for r in requests for b in r["image_bytes"].reshape(-1)]
            probs = outputs.softmax(engine.logits(np.stack(images)).astype(np.float32))
            return [{"top_k": p} for p in np.split(probs, np.cumsum(counts)[:-1])]

        return infer

    for sig in (signal.SIGINT, signal.SIGTERM):  # both stop Triton (SIGINT too: a background job may ignore it)
        signal.signal(sig, signal.default_int_handler)
    # max_batch_size > 0: Triton prepends the batch dimension to the input's dims [1], so a request's image_bytes is
    # [N, 1]. 0: no dynamic batcher (one request per model execution), and image_bytes is [N] as the app takes it.
    batching = max_batch_size > 0
    config = TritonConfig(http_address="127.0.0.1", http_port=port, grpc_address="127.0.0.1", grpc_port=port + 1)
    config.metrics_address, config.metrics_port, config.exit_timeout_secs = "127.0.0.1", port + 2, 15
    batcher = DynamicBatcher(max_queue_delay_microseconds=queue_delay_us)
    infer_funcs = [instance() for _ in range(instances)]
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            with Triton(config=config) as triton:
                try:
                    triton.bind(
                        model_name=model_name,
                        infer_func=infer_funcs,
                        inputs=[Tensor(name="image_bytes", dtype=np.bytes_, shape=(1,) if batching else (-1,))],
                        outputs=[Tensor(name="top_k", dtype=np.float32, shape=(-1,) if batching else (-1, -1))],
                        config=ModelConfig(batching=batching, max_batch_size=max_batch_size, batcher=batcher),
                        strict=True,
                    )
                except Exception as e:  # the model did not load; Triton is stopped on the way out
                    print(f"triton_peer: start {attempt}/{START_ATTEMPTS} failed: {e!r}", file=sys.stderr, flush=True)
                    continue
                triton.serve()
                return
        finally:  # shared memory of Python-backend stubs that crashed (PyTriton names it after this process)
            for region in Path("/dev/shm").glob(f"pytrtion{os.getpid()}-*"):
                region.unlink(missing_ok=True)
    sys.exit(f"triton_peer: the model did not load in {START_ATTEMPTS} starts")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true", help="create .venv-triton and exit")
    parser.add_argument("--port", type=int, default=8106, help="HTTP; gRPC is PORT+1, metrics PORT+2")
    parser.add_argument("--model-name", default="efficientnet_lite0")
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=16, help="0: no batching, image_bytes [N] not [N, 1]")
    parser.add_argument("--queue-delay-us", type=int, default=0)
    args = parser.parse_args()
    if args.setup:
        sys.exit(setup())
    print(json.dumps(vars(args)), flush=True)
    serve(args.port, args.model_name, args.instances, args.max_batch_size, args.queue_delay_us)
