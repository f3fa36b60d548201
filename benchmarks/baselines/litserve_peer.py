"""The contract served by LitServe 0.2: an HTTP front process (uvicorn) reads each request by the app's rules
(benchmarks.baselines.classification) and queues its images to inference worker processes, which decode and run
them, batched across requests by LitServe's own loop. POST /v1/classify, POST /v1/classify/batch, GET /healthz.

Configured as a LitServe user would for a 2-core CPU box. /v1/classify: a LitAPI with max_batch_size 16 and
batch_timeout 5 ms, serve_single's @serve.batch settings, so the two Python batchers compare like for like (0 is no
option: LitServe's loop then spins on its manager queue). /v1/classify/batch: a second LitAPI without batching (the
client batched: one session.run per request). Two workers per API with one ORT intra-op thread each (--workers 1:
one worker, threads = cores): a worker decodes its batch on one core, so with one worker the second core only
helps inside session.run; two keep both busy (better at c >= 8 and for 16-image requests, slightly worse at c=1).
One API server process, not LitServe's default of one per worker (4 here). LitServe reads only JSON or form bodies,
so the v1 routes are a LitSpec (the hook its OpenAI spec uses): the app's errors keep their JSON shape and status,
LitServe's queue timeout (504) and worker failures become the peers' 503s. /healthz: 503 until every worker is up.
Idle, each batching worker polls its manager queue every ms (~15% of a core): LitServe's cost, not hidden.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
import uuid
from typing import Any

import litserve as ls
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from litserve.specs.base import LitSpec
from litserve.utils import LitAPIStatus, ResponseBufferItem, WorkerSetupStatus

from app.errors import ServiceError
from app.served_model import MODEL_NAME, default_files
from benchmarks.baselines import classification as cls

VARIANTS, CORES = ("fp32", "int8"), os.cpu_count() or 1


class Classifier(ls.LitAPI):
    """(image, variant) items, batched across requests by LitServe, or one request's list of them."""

    def __init__(self, where: str, threads: int, path: str, many: bool, **batching: Any) -> None:
        super().__init__(spec=V1Spec(path, many), **batching)
        self.where, self.threads = where, threads

    def setup(self, device: str) -> None:
        self.models = cls.Models(self.where, self.threads)

    def decode_request(self, request: Any, **kwargs: Any) -> Any:  # the spec queues model inputs as they are
        return request

    encode_response = decode_request

    def predict(self, x: list[tuple[bytes, str]], **kwargs: Any) -> list[Any]:
        # A ServiceError does not survive pickling: its (code, message) crosses back to the front process.
        return [(r.code, r.message) if isinstance(r, ServiceError) else r for r in cls.classify(self.models, x)]


class V1Spec(LitSpec):
    """One v1 route: read the request in the front process, queue its work, answer as the other peers do."""

    def __init__(self, path: str, many: bool) -> None:
        super().__init__()
        self.api_path, self.many, self.labels = path, many, default_files().labels.read_text().splitlines()
        self.add_endpoint(path, self.classify, ["POST"])

    async def classify(self, request: Request) -> Response:
        start = time.perf_counter()
        asked = cls.read_request(request, await request.body(), self.many, VARIANTS)
        items = [(image, asked.variant) for image in asked.images]
        uid, event = str(uuid.uuid4()), asyncio.Event()
        self.response_buffer[uid] = ResponseBufferItem(event=event)
        self.request_queue.put((self.response_queue_id, uid, time.monotonic(), items if self.many else items[0]))
        await event.wait()
        out, status = self.response_buffer.pop(uid).response
        if status == LitAPIStatus.ERROR:
            code = "inference_timeout" if getattr(out, "status_code", None) == 504 else "replica_failed"
            raise ServiceError(code, f"LitServe worker: {out!r}")
        results = [ServiceError(*r) if isinstance(r, tuple) else r for r in (out if self.many else [out])]
        return cls.answer(asked, results, self.labels, start)


def create_server(device: str = "auto", workers: int = 2) -> ls.LitServer:
    threads = max(1, CORES // workers)  # each worker's ORT intra-op threads: the cores, shared out
    one = Classifier(device, threads, "/v1/classify", False, max_batch_size=16, batch_timeout=0.005)
    many = Classifier(device, threads, "/v1/classify/batch", True)
    server = ls.LitServer([one, many], accelerator="cpu", workers_per_device=workers)
    for error in (ServiceError, Exception):
        server.app.add_exception_handler(error, cls.error_response)

    @server.app.get("/healthz")
    async def healthz() -> JSONResponse:
        if not all(s == WorkerSetupStatus.READY for s in server.workers_setup_status.values()):
            raise ServiceError("not_ready", "LitServe workers are still loading the models")
        return JSONResponse({"status": "ok", "model": MODEL_NAME, "threads": threads, "workers": workers})

    return server


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8109)
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    parser.add_argument("--workers", type=int, default=2, help="inference processes per API")
    args, leader = parser.parse_args(), os.getpid()

    def stop(*_: Any) -> None:
        """SIGINT/SIGTERM: LitServe's Ctrl-C shutdown of its processes, whatever SIGINT disposition this one
        inherited; a forked child (uvicorn re-raises the SIGTERM LitServe stops it with) just exits."""
        if os.getpid() != leader:
            sys.exit(0)
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    create_server(args.device, args.workers).run(
        "127.0.0.1", args.port, num_api_servers=1, log_level="warning", generate_client_file=False, access_log=False
    )
