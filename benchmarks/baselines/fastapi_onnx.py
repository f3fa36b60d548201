"""The single-process FastAPI + ONNX Runtime server, written the way most teams write it first: one uvicorn
worker, `async def` endpoints that decode and call `session.run` inline (requests served one at a time on the
event loop), intra-op threads = all cores, no batching across requests. POST /v1/classify, POST
/v1/classify/batch (one session.run), GET /healthz, as benchmarks.baselines.classification answers them.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from app.errors import ServiceError
from app.served_model import ModelFiles
from benchmarks.baselines import classification as cls


def create_app(device: str = "auto", threads: int | None = None, files: ModelFiles | None = None) -> FastAPI:
    """Load both variants now (not per request) and return the FastAPI app that serves them."""
    models = cls.Models(device, threads, files)
    app = FastAPI(title="fastapi + onnxruntime baseline")
    for error in (ServiceError, Exception):
        app.add_exception_handler(error, cls.error_response)

    async def classify(request: Request, many: bool) -> JSONResponse:
        start = time.perf_counter()
        asked = cls.read_request(request, await request.body(), many, list(models.runners))
        results = cls.classify(models, [(im, asked.variant) for im in asked.images])  # blocks the loop: the point
        return cls.answer(asked, results, models.labels, start)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return models.health()

    @app.post("/v1/classify")
    async def classify_one(request: Request) -> JSONResponse:
        return await classify(request, many=False)

    @app.post("/v1/classify/batch")
    async def classify_batch(request: Request) -> JSONResponse:
        return await classify(request, many=True)

    return app


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8101)
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    args = parser.parse_args()
    app = create_app(args.device)
    uvicorn.run(app, host="127.0.0.1", port=args.port, workers=1, log_level="warning", access_log=False)
