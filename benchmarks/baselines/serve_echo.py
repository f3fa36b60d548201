"""Ray Serve's floor: one deployment that reads the request body and returns its length. Whatever this cannot
exceed, no Serve app can: the proxy, the handle call and the replica's event loop, with no decoding and no
model. Same routes as the app (POST /v1/classify, GET /healthz); `serve run benchmarks.baselines.serve_echo:app`.
"""

from __future__ import annotations

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse


# No access log: one line per request costs CPU a 2-core machine does not have (as in configs/local.yaml).
@serve.deployment(
    max_ongoing_requests=256, ray_actor_options={"num_cpus": 0}, logging_config={"enable_access_log": False}
)
class Echo:
    async def __call__(self, request: Request) -> JSONResponse:
        if request.url.path.rstrip("/") == "/healthz":
            return JSONResponse({"status": "ok"})
        return JSONResponse({"bytes": len(await request.body())})


app = Echo.bind()  # type: ignore[attr-defined]

if __name__ == "__main__":
    from benchmarks.baselines.serve_local import serve_main

    serve_main(__doc__, 8102, "serve_echo", lambda device: app)
