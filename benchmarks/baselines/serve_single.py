"""A single-deployment Ray Serve classifier: decode and infer in one replica, batched with @serve.batch.

The shape of Ray's own image-classifier example: the replica reads the request, and a `@serve.batch`
method decodes the images and runs one `session.run` per variant in the batch. The batch's work runs on a
worker thread so the replica keeps accepting requests (and filling the next batch) meanwhile.
Same contract as the app (POST /v1/classify, POST /v1/classify/batch, GET /healthz).

    serve run benchmarks.baselines.serve_single:app                               # on port 8000
    serve run benchmarks.baselines.serve_single:build_app max_batch_size=32       # builder arguments
    python -m benchmarks.baselines.serve_single --port 8103                       # own local Ray instance
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from app.errors import ServiceError
from app.models import MODEL_NAME
from benchmarks.baselines import classification as cls
from benchmarks.device import runtime_options

Item = tuple[bytes, str]  # (image bytes, variant)


# No access log: one line per request costs CPU a 2-core machine does not have (as in configs/local.yaml).
@serve.deployment(
    max_ongoing_requests=64, ray_actor_options={"num_cpus": 1}, logging_config={"enable_access_log": False}
)
class ImageClassifier:
    def __init__(
        self,
        device: str = "auto",
        threads: int | None = None,
        max_batch_size: int = 16,
        batch_wait_timeout_s: float = 0.005,
    ) -> None:
        self.runners = cls.load_runners(runtime_options(device, threads))
        self.labels = cls.load_labels()
        self.size = self.runners[cls.DEFAULT_VARIANT].spec.height
        self.classify.set_max_batch_size(max_batch_size)
        self.classify.set_batch_wait_timeout_s(batch_wait_timeout_s)

    def _classify_now(self, items: list[Item]) -> list[cls.Classified | ServiceError]:
        out: list[cls.Classified | ServiceError] = [ServiceError("replica_failed", "not classified")] * len(items)
        groups: dict[str, list[tuple[int, np.ndarray, float]]] = {}
        for i, (data, variant) in enumerate(items):
            t0 = time.perf_counter()
            try:
                tensor = cls.decode(data, self.size)
            except ServiceError as e:
                out[i] = e
                continue
            groups.setdefault(variant, []).append((i, tensor, (time.perf_counter() - t0) * 1000))
        for variant, group in groups.items():
            t0 = time.perf_counter()
            try:
                probs = cls.infer(self.runners[variant], [tensor for _, tensor, _ in group])
            except Exception as e:
                for i, _, _ in group:
                    out[i] = cls.internal_error(e)
                continue
            inference_ms = (time.perf_counter() - t0) * 1000
            for (i, _, decode_ms), p in zip(group, probs, strict=True):
                out[i] = cls.Classified(variant, p, decode_ms, inference_ms, len(group))
        return out

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def classify(self, items: list[Item]) -> list[cls.Classified | ServiceError]:
        # Errors are returned, not raised: one bad image must not fail the other requests in its batch.
        return await asyncio.to_thread(self._classify_now, items)

    async def _one(self, data: bytes, variant: str) -> cls.Classified:
        result = await self.classify((data, variant))
        if isinstance(result, ServiceError):
            raise result
        return result

    async def __call__(self, request: Request) -> JSONResponse:
        path = request.url.path.rstrip("/")
        try:
            if path == "/healthz" and request.method == "GET":
                providers = {v: r.active_provider for v, r in self.runners.items()}
                return JSONResponse({"status": "ok", "model": MODEL_NAME, "providers": providers})
            if request.method != "POST":
                raise ServiceError("method_not_allowed", f"{request.method} {path} is not served")
            if path not in ("/v1/classify", "/v1/classify/batch"):
                raise ServiceError("not_found", f"no route {path}")
            return await self._classify_request(request, many=path.endswith("/batch"))
        except ServiceError as e:
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers())
        except Exception as e:
            err = cls.internal_error(e)
            return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    async def _classify_request(self, request: Request, many: bool) -> JSONResponse:
        start = time.perf_counter()
        top_k = cls.parse_top_k(request.query_params.get("top_k"))
        variant = cls.choose_variant(request.headers, self.runners)
        images = cls.request_images(await request.body(), request.headers.get("content-type", ""), many=many)
        headers = {"X-Model-Variant": variant}
        if not many:
            result = await self._one(images[0], variant)
            body = cls.reply(result, self.labels, top_k, (time.perf_counter() - start) * 1000)
            return JSONResponse(body, headers=headers)
        results = await asyncio.gather(*(self._one(data, variant) for data in images), return_exceptions=True)
        total_ms = (time.perf_counter() - start) * 1000
        entries = []
        for r in results:
            if isinstance(r, ServiceError):
                entries.append(r.body())
            elif isinstance(r, BaseException):
                entries.append(cls.internal_error(r if isinstance(r, Exception) else RuntimeError(r)).body())
            else:
                entries.append(cls.reply(r, self.labels, top_k, total_ms))
        return JSONResponse({"results": entries}, headers=headers)


def build_app(args: dict[str, Any]) -> Any:
    """`serve run benchmarks.baselines.serve_single:build_app key=value ...`: keys are ImageClassifier's arguments."""
    kwargs: dict[str, Any] = {}
    for key, cast in (("device", str), ("threads", int), ("max_batch_size", int), ("batch_wait_timeout_s", float)):
        if key in args:
            kwargs[key] = cast(args[key])
    num_cpus = float(args.get("num_cpus", 1))
    return ImageClassifier.options(ray_actor_options={"num_cpus": num_cpus}).bind(**kwargs)


app = ImageClassifier.bind()


def main(argv: list[str] | None = None) -> None:
    from benchmarks.baselines.serve_local import serve_until_signalled

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8103)
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: all)")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.005)
    parser.add_argument("--replica-cpus", type=float, default=1.0, help="num_cpus of the replica")
    parser.add_argument("--num-cpus", type=float, default=None, help="CPUs of the private Ray instance (default: all)")
    args = parser.parse_args(argv)
    application = build_app(
        {
            "device": args.device,
            "max_batch_size": args.max_batch_size,
            "batch_wait_timeout_s": args.batch_wait_timeout_s,
            "num_cpus": args.replica_cpus,
            **({"threads": args.threads} if args.threads else {}),
        }
    )
    serve_until_signalled(application, args.port, args.num_cpus, name="serve_single")


if __name__ == "__main__":
    main()
