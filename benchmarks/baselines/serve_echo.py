"""Ray Serve's floor: one deployment that reads the request body and returns its length.

Whatever this cannot exceed, no Serve app can: the proxy, the handle call and the replica's event loop,
with no decoding and no model. Same routes as the app (POST /v1/classify, GET /healthz).

    serve run benchmarks.baselines.serve_echo:app              # on port 8000
    python -m benchmarks.baselines.serve_echo --port 8102      # own local Ray instance
"""

from __future__ import annotations

import argparse

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
        body = await request.body()
        return JSONResponse({"bytes": len(body)})


app = Echo.bind()


def main(argv: list[str] | None = None) -> None:
    from benchmarks.baselines.serve_local import serve_until_signalled

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8102)
    parser.add_argument("--num-cpus", type=float, default=None, help="CPUs of the private Ray instance (default: all)")
    args = parser.parse_args(argv)
    serve_until_signalled(app, args.port, args.num_cpus, name="serve_echo")


if __name__ == "__main__":
    main()
