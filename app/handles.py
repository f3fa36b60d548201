"""Serve's deployment handles as the pipeline's Backend (app/pipeline/ports.py), and Ray's failures in its terms."""

from __future__ import annotations

import asyncio
from typing import Any

from ray.exceptions import RayActorError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, RequestCancelledError
from ray.serve.handle import DeploymentHandle

from app.errors import ServiceError, find_service_error
from app.payloads import Pixels
from app.pipeline.ports import Call, ReplicaLost
from app.serve_internals import routable_replicas, running_replicas

_LOST = (RayActorError, DeploymentUnavailableError)


def _lost(e: BaseException) -> ReplicaLost:
    """A call's replica is gone (RayActorError), or the whole deployment is (DeploymentUnavailableError)."""
    return ReplicaLost(type(e).__name__, unavailable=isinstance(e, DeploymentUnavailableError))


class ServeBackend:
    def __init__(
        self, preprocessor: DeploymentHandle, classifiers: dict[str, DeploymentHandle], ledger: DeploymentHandle
    ) -> None:
        self.preprocessor = preprocessor
        self.classifiers = classifiers
        self.ledger = ledger

    def preprocess(self, images: list[bytes], size: int, wall_deadline: float) -> Call:
        return self.preprocessor.many.remote(images, size, wall_deadline)

    def classify(self, variant: str, pixels: Call | Pixels, top_k: int, full: bool, rows: list[int] | None) -> Call:
        # A DeploymentResponse passed in is resolved by Serve in the Classifier's process.
        handle = self.classifiers[variant]
        if rows is None:
            return handle.remote(pixels, top_k, full)
        return handle.remote(pixels, top_k, full, rows)

    def describe(self, variant: str) -> Call:
        return self.classifiers[variant].describe.remote()

    def ready(self, variant: str) -> Call:
        return self.classifiers[variant].ready.remote()

    def ledger_add(self, delta: Any) -> Call:
        return self.ledger.add.remote(delta)

    def ledger_summary(self) -> Call:
        return self.ledger.summary.remote()

    def ledger_reset(self) -> Call:
        return self.ledger.reset.remote()

    def ledger_model_stats(self) -> Call:
        return self.ledger.model_stats.remote()

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
