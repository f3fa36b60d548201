"""The single-process FastAPI + ONNX Runtime server, written the way most teams write it first.

One uvicorn worker; an `async def` endpoint that reads the body, decodes it with OpenCV and calls
`session.run` inline, so requests are served one at a time on the event loop; intra-op threads = all cores.
No batching across requests. Same contract as the app: POST /v1/classify (raw image or multipart `file`,
?top_k, X-Model-Variant), POST /v1/classify/batch (several `file` parts, one session.run), GET /healthz.

    python -m benchmarks.baselines.fastapi_onnx --port 8101
"""

from __future__ import annotations

import argparse
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from app.errors import ServiceError
from app.models import MODEL_NAME, ModelFiles
from benchmarks.baselines import classification as cls
from benchmarks.device import runtime_options


def create_app(device: str = "auto", threads: int | None = None, files: ModelFiles | None = None) -> FastAPI:
    """Load both variants now (not per request) and return the FastAPI app that serves them."""
    runners = cls.load_runners(runtime_options(device, threads), files)
    labels = cls.load_labels(files)
    size = runners[cls.DEFAULT_VARIANT].spec.height
    app = FastAPI(title="fastapi + onnxruntime baseline")

    def classify_images(images: list[bytes], variant: str) -> list[cls.Classified]:
        t0 = time.perf_counter()
        tensors = [cls.decode(data, size) for data in images]
        t1 = time.perf_counter()
        probs = cls.infer(runners[variant], tensors)
        t2 = time.perf_counter()
        decode_ms, inference_ms = (t1 - t0) * 1000 / len(images), (t2 - t1) * 1000
        return [cls.Classified(variant, p, decode_ms, inference_ms, len(images)) for p in probs]

    @app.exception_handler(ServiceError)
    async def service_error(_: Request, e: ServiceError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers())

    @app.exception_handler(Exception)
    async def unexpected(_: Request, e: Exception) -> JSONResponse:
        err = cls.internal_error(e)
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    @app.get("/healthz")
    async def healthz() -> dict[str, object]:
        return {
            "status": "ok",
            "model": MODEL_NAME,
            "providers": {v: r.active_provider for v, r in runners.items()},
            "threads": runners[cls.DEFAULT_VARIANT].opts.threads,
        }

    @app.post("/v1/classify")
    async def classify(request: Request) -> JSONResponse:
        start = time.perf_counter()
        top_k = cls.parse_top_k(request.query_params.get("top_k"))
        variant = cls.choose_variant(request.headers, runners)
        body = await request.body()
        [data] = cls.request_images(body, request.headers.get("content-type", ""), many=False)
        [result] = classify_images([data], variant)  # blocks the event loop: that is the point of this baseline
        out = cls.reply(result, labels, top_k, (time.perf_counter() - start) * 1000)
        return JSONResponse(out, headers={"X-Model-Variant": variant})

    @app.post("/v1/classify/batch")
    async def classify_batch(request: Request) -> JSONResponse:
        start = time.perf_counter()
        top_k = cls.parse_top_k(request.query_params.get("top_k"))
        variant = cls.choose_variant(request.headers, runners)
        body = await request.body()
        images = cls.request_images(body, request.headers.get("content-type", ""), many=True)
        results = classify_images(images, variant)
        total_ms = (time.perf_counter() - start) * 1000
        out = {"results": [cls.reply(r, labels, top_k, total_ms) for r in results]}
        return JSONResponse(out, headers={"X-Model-Variant": variant})

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8101)
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: all)")
    args = parser.parse_args(argv)
    app = create_app(args.device, args.threads)
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
