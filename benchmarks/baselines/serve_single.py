"""A single-deployment Ray Serve classifier in the shape of Ray's own example: the replica reads the request, and
a `@serve.batch` method decodes the images and runs one `session.run` per variant in the batch, on a worker thread
so the replica keeps accepting requests (and filling the next batch) meanwhile. The app's contract, as
benchmarks.baselines.fastapi_onnx. `serve run benchmarks.baselines.serve_single:app` serves it on port 8000.
"""

from __future__ import annotations

import asyncio
import time

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from app.errors import ServiceError
from benchmarks.baselines import classification as cls

ROUTES = ("/v1/classify", "/v1/classify/batch")


# No access log: one line per request costs CPU a 2-core machine does not have (as in configs/local.yaml).
@serve.deployment(
    max_ongoing_requests=64, ray_actor_options={"num_cpus": 1}, logging_config={"enable_access_log": False}
)
class ImageClassifier:
    def __init__(self, device: str = "auto") -> None:
        self.models = cls.Models(device)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def classify(self, items: list[tuple[bytes, str]]) -> list[cls.Classified | ServiceError]:
        # Errors are returned, not raised: one bad image must not fail the other requests in its batch.
        return await asyncio.to_thread(cls.classify, self.models, items)

    async def __call__(self, request: Request) -> JSONResponse:
        path, start = request.url.path.rstrip("/"), time.perf_counter()
        try:
            if path == "/healthz" and request.method == "GET":
                return JSONResponse(self.models.health())
            if path not in ROUTES:
                raise ServiceError("not_found", f"no route {path}")
            if request.method != "POST":
                raise ServiceError("method_not_allowed", f"{request.method} {path} is not served")
            asked = cls.read_request(request, await request.body(), path == ROUTES[1], list(self.models.runners))
            results = await asyncio.gather(*(self.classify((image, asked.variant)) for image in asked.images))
            return cls.answer(asked, list(results), self.models.labels, start)
        except Exception as e:
            return await cls.error_response(request, e)


app = ImageClassifier.bind()  # type: ignore[attr-defined]

if __name__ == "__main__":
    from benchmarks.baselines.serve_local import serve_main

    serve_main(__doc__, 8103, "serve_single", ImageClassifier.bind)  # type: ignore[attr-defined]
