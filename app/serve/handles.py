"""Serve's deployment handles as the pipeline's Backend, and Ray's failures in its terms."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ray.exceptions import RayActorError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, RequestCancelledError
from ray.serve.handle import DeploymentHandle

from app.errors import ServiceError, find_service_error
from app.imaging.payloads import Encoded, Pixels
from app.imaging.transform import Transform
from app.pipeline.ports import Call, ReplicaLost
from app.serve import serve_internals
from app.serve.preprocessor import Decoder
from app.serve.serve_internals import routable_replicas, running_replicas

_LOST = (RayActorError, DeploymentUnavailableError)


def _lost(e: BaseException) -> ReplicaLost:
    """A call's replica is gone (RayActorError), or the whole deployment is (DeploymentUnavailableError)."""
    return ReplicaLost(type(e).__name__, unavailable=isinstance(e, DeploymentUnavailableError))


class ServeBackend:
    def __init__(
        self,
        preprocessor: DeploymentHandle | None,
        classifiers: dict[str, DeploymentHandle],
        ledger: DeploymentHandle,
        controller: DeploymentHandle | None = None,
        decoder: Decoder | None = None,
    ) -> None:
        """`decoder`: decode here, in this process (AppArgs.decode_in router), instead of calling `preprocessor`;
        neither: the Classifiers decode (AppArgs.decode_in gpu), the images go to them encoded."""
        if preprocessor is not None and decoder is not None:
            raise ValueError("a Preprocessor handle or a local decoder, not both")
        self.preprocessor = preprocessor
        self.classifiers = classifiers
        self.ledger = ledger
        self.controller = controller
        self.decoder = decoder

    def preprocess(self, images: list[bytes], transform: Transform, wall_deadline: float) -> Call:
        if self.decoder is not None:  # a Task: awaitable and cancellable, like a DeploymentResponse
            return asyncio.ensure_future(self.decoder.many(images, transform, wall_deadline))
        if self.preprocessor is None:  # decode_in: gpu: nothing to do here, the Classifier's batch decodes them
            done: asyncio.Future[Encoded] = asyncio.get_running_loop().create_future()
            done.set_result(Encoded(images, wall_deadline))
            return done
        return self.preprocessor.many.remote(images, transform, wall_deadline)

    def classify(self, variant: str, pixels: Call | Pixels, top_k: int, full: bool, rows: list[int] | None) -> Call:
        # A DeploymentResponse passed in is resolved by Serve: in the Classifier's process by reference, here (then
        # sent on) by value, which configs/serve.env's gRPC between replicas is. A local decode is awaited here.
        handle = self.classifiers[variant]
        if isinstance(pixels, asyncio.Future):
            return asyncio.ensure_future(self._classify_decoded(handle, pixels, top_k, full, rows))
        if rows is None:
            return handle.remote(pixels, top_k, full)
        return handle.remote(pixels, top_k, full, rows)

    @staticmethod
    async def _classify_decoded(
        handle: DeploymentHandle,
        pixels: asyncio.Future[Pixels | Encoded],
        top_k: int,
        full: bool,
        rows: list[int] | None,
    ) -> Any:
        # Cancelling this call (a deadline, a failover abort, the client gone) cancels a decode still running too;
        # a finished one is unaffected, so a shadow run can reuse its pixels.
        decoded = await pixels
        if isinstance(decoded, Encoded):  # the Classifier decodes them all; `rows` picks among the decoded ones
            response = (
                handle.remote(decoded, top_k, full) if rows is None else handle.remote(decoded, top_k, full, rows)
            )
        else:
            if rows is not None:  # a shadow run: only its sampled rows travel (the answer is the same, row by row)
                picked = decoded.array[rows]
                decoded = Pixels(picked, decoded.preprocess_ms, {}, [decoded.positions[r] for r in rows])
            response = handle.remote(decoded, top_k, full)
        try:
            return await response
        except asyncio.CancelledError:  # as a DeploymentResponse passed to the pipeline would be: cancelled at Serve
            response.cancel()
            raise

    def describe(self, variant: str) -> Call:
        return self.classifiers[variant].describe.remote()

    def labels(self, variant: str) -> Call:
        return self.classifiers[variant].labels.remote()

    def ready(self, variant: str) -> Call:
        return self.classifiers[variant].ready.remote()

    def ledger_add(self, delta: Any) -> Call:
        return self.ledger.add.remote(delta)

    def ledger_summary(self) -> Call:
        return self.ledger.summary.remote()

    def ledger_reset(self) -> Call:
        return self.ledger.reset.remote()

    def ledger_margins(self) -> Call:
        return self.ledger.margins.remote()

    def ledger_model_stats(self) -> Call:
        return self.ledger.model_stats.remote()

    def ledger_poll(self, config_id: str, weights: dict[str, float]) -> Call:
        return self.ledger.poll.remote(config_id, weights)

    def rollout(self, method: str, *args: Any) -> Call:
        if self.controller is None:
            raise ServiceError("not_found", "this application has no rollout controller")
        return getattr(self.controller, method).remote(*args)

    async def result(self, call: Call) -> Any:
        try:
            return await call
        except BackPressureError as e:
            raise ServiceError("overloaded", f"the service is at capacity ({e.message}); retry shortly") from None
        except _LOST as e:
            raise _lost(e) from e
        except (RequestCancelledError, TaskCancelledError, asyncio.CancelledError):
            raise
        except Exception as e:
            found = find_service_error(e)
            if found is not None:
                raise found from None
            cause = getattr(e, "cause", None)
            if isinstance(cause, _LOST):
                raise _lost(cause) from e
            raise

    def routable(self, variant: str) -> int | None:
        return routable_replicas(self.classifiers[variant])

    async def running(self) -> dict[str, int] | None:
        names = {v: f"Classifier_{v}" for v in self.classifiers}
        return await asyncio.to_thread(running_replicas, names)


class RolloutPorts:
    """The rollout controller's I/O (its `Ports`): the ledger's board and snapshot, and its
    state in Ray's internal KV, which lives in the GCS (kept in Redis with GCS fault tolerance), so a restarted
    controller replica, or a restarted head, finds it."""

    NAMESPACE = "image_classifier"

    def __init__(self, ledger: DeploymentHandle, key: str) -> None:
        self.ledger = ledger
        self.key = key.encode()

    async def snapshot(self) -> dict[str, Any]:
        return dict(await self.ledger.snapshot.remote())

    async def set_override(self, override: dict[str, Any] | None) -> None:
        await self.ledger.set_override.remote(override)

    async def load(self) -> dict[str, Any] | None:
        raw = await asyncio.to_thread(serve_internals.kv_get, self.key, self.NAMESPACE)
        return json.loads(raw) if raw else None

    async def save(self, state: dict[str, Any]) -> None:
        blob = json.dumps(state).encode()
        await asyncio.to_thread(serve_internals.kv_put, self.key, blob, self.NAMESPACE)
