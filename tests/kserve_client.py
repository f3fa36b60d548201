"""KServe's Python SDK (`kserve` 0.21, unmodified) as a client of this service: its V2 REST and gRPC inference
clients (`InferenceRESTClient` with `RESTConfig(protocol="v2")`, `InferenceGRPCClient`), run as a script in a
virtual environment of its own, which prints what each call returned, or how it failed, as one JSON object that
tests/test_kserve_client.py asserts on.

Why a venv of its own (.venv-kserve): kserve 0.21 pins psutil<6 (the app's Ray environment has psutil 7) and brings
pandas, kubernetes and grpcio-tools, none of which the app needs. `setup()` makes it from the interpreter running it
(its base Python: `python -m venv` from within a venv uses the one the venv was made from) and installs kserve with
pip; `make test` runs it once (the stamp .venv-kserve/.installed).

    .venv/bin/python -m tests.kserve_client --setup      # once (make test does it)
    echo '{"rest": "http://127.0.0.1:8000", "grpc": "127.0.0.1:9000", "model": "efficientnet_lite0-fp32",
           "images": ["a.jpg", "b.jpg"], "pixels": "pixels.npy"}' | .venv-kserve/bin/python tests/kserve_client.py

The script half imports only kserve and numpy (both in .venv-kserve), never app/: the client sees the service only
over the wire. Its arguments come as JSON on stdin, because importing kserve parses the command line (its model
server's options) and refuses options it does not know. Inputs: the image files (sent as BYTES) and an .npy of UINT8
pixels [N, H, W, C] at the model's size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv-kserve"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".installed"
REQUIREMENT = "kserve==0.21.*"
UNKNOWN = "resnet50"  # a model the service does not have


def setup(venv: Path = VENV) -> None:
    """Create `venv` with kserve in it (idempotent: the stamp is written last)."""
    stamp = venv / ".installed"
    if stamp.is_file():
        return
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "install", REQUIREMENT], check=True)
    stamp.touch()


def why_not_runnable(venv: Path = VENV) -> str | None:
    """None when the kserve venv is in place; else why not (for a test's skip)."""
    if not (venv / ".installed").is_file():
        return f"{venv} is missing: run `python -m tests.kserve_client --setup` (make test does)"
    return None


def run(rest: str, grpc: str, model: str, images: list[Path], pixels: Path, timeout_s: float = 120) -> dict[str, Any]:
    """The script in the kserve venv against the service; its JSON report."""
    spec = {"rest": rest, "grpc": grpc, "model": model, "images": list(map(str, images)), "pixels": str(pixels)}
    cmd = [str(PYTHON), str(Path(__file__).resolve())]
    done = subprocess.run(cmd, input=json.dumps(spec), capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"the kserve client script failed ({done.returncode}): {done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])  # the last line: kserve may log before it
    return report


# -- the script, in the kserve venv ---------------------------------------------------------------------------------


def _top1(response: Any) -> list[int]:
    """Each row's best class, from the `top_k` output ("score:index:label", bytes or str as the client decoded)."""
    rows = response.outputs[[o.name for o in response.outputs].index("top_k")].as_numpy()
    return [int((r[0].decode() if isinstance(r[0], bytes) else str(r[0])).split(":")[1]) for r in rows]


async def _calls(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

    images = np.array([Path(p).read_bytes() for p in spec["images"]], dtype=np.object_)
    pixels = np.load(spec["pixels"])
    base, model = spec["rest"], spec["model"]
    report: dict[str, Any] = {}

    async def record(name: str, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            report[name] = {"value": await call()}
        except Exception as e:  # what the client raised, as the test wants to see it
            code = getattr(e, "code", None)
            report[name] = {
                "error": type(e).__name__,
                "message": str(e),
                "status": getattr(getattr(e, "response", None), "status_code", None),
                "code": code().name if callable(code) else None,
                "details": e.details() if callable(getattr(e, "details", None)) else None,
            }

    def bytes_input() -> Any:
        inp = InferInput("image_bytes", [len(images)], "BYTES")
        inp.set_data_from_numpy(images, binary_data=True)
        return inp

    def pixels_input(binary: bool) -> Any:
        inp = InferInput("image", list(pixels.shape), "UINT8")
        inp.set_data_from_numpy(pixels, binary_data=binary)
        return inp

    def answer(response: Any) -> dict[str, Any]:
        return {"model_name": response.model_name, "id": response.id, "top1": _top1(response)}

    rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    try:
        await record("rest_live", lambda: rest.is_server_live(base))
        await record("rest_ready", lambda: rest.is_server_ready(base))
        await record("rest_model_ready", lambda: rest.is_model_ready(base, model))
        await record("rest_unknown_model_ready", lambda: rest.is_model_ready(base, UNKNOWN))

        async def rest_infer(inp: Any, name: str = model, **params: Any) -> dict[str, Any]:
            request = InferRequest(name, [inp], request_id="kserve-rest", parameters=params or None)
            return answer(await rest.infer(base, request, model_name=name))

        await record("rest_bytes_binary", lambda: rest_infer(bytes_input(), binary_data_output=True))
        await record("rest_pixels_json", lambda: rest_infer(pixels_input(binary=False)))
        await record("rest_pixels_binary", lambda: rest_infer(pixels_input(binary=True)))
        await record("rest_unknown_model", lambda: rest_infer(bytes_input(), UNKNOWN))
    finally:
        await rest.close()

    grpc = InferenceGRPCClient(spec["grpc"], timeout=60)
    try:
        await record("grpc_live", grpc.is_server_live)
        await record("grpc_ready", grpc.is_server_ready)
        await record("grpc_model_ready", lambda: grpc.is_model_ready(model))

        async def grpc_infer(inp: Any, name: str = model) -> dict[str, Any]:
            return answer(await grpc.infer(InferRequest(name, [inp], request_id="kserve-grpc")))

        await record("grpc_bytes", lambda: grpc_infer(bytes_input()))
        await record("grpc_pixels", lambda: grpc_infer(pixels_input(binary=True)))
        await record("grpc_unknown_model", lambda: grpc_infer(bytes_input(), UNKNOWN))
    finally:
        await grpc.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--setup", action="store_true", help="create .venv-kserve and exit")
    if parser.parse_args(argv).setup:
        setup()
        return 0
    print(json.dumps(asyncio.run(_calls(json.load(sys.stdin)))))  # the calls' arguments: JSON on stdin
    return 0


if __name__ == "__main__":
    sys.exit(main())
