"""The Router (HTTP and gRPC ingress, A/B), the ABLedger and the RolloutController on Serve; the Preprocessor and the
Classifier live in their own modules.

The Router hands a request to its handlers (the http package), which pick a variant and hand the images to the
pipeline: it calls the Preprocessor and passes its DeploymentResponse straight into the Classifier call (with
`decode_in: router` the Router decodes itself, under the same decode budget, and sends the pixels on by value). With
configs/serve.env's throughput-optimised mode Serve sends by value over gRPC and resolves that response in the
Router; by value measured cheaper than by reference (the performance page says how much). Only the top-k scores
come back to the client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from app.config import AppArgs, RouterConfig
from app.http.assembly import RouterApp
from app.http.v2_grpc import RPCS
from app.imaging.transform import Transform
from app.pipeline.abstats import ABStats
from app.pipeline.inferstats import ModelStatsTable
from app.rollout.board import RolloutBoard
from app.rollout.controller import RolloutService
from app.serve.handles import RolloutPorts, ServeBackend
from app.serve.metrics import RolloutMetrics, RouterMetrics
from app.serve.preprocessor import Decoder
from app.serve.serve_internals import replica_id, request_id
from app.serve.tracing import turn_on_here

logger = logging.getLogger("ray.serve")
TICK_S = 1.0  # the rollout controller's decision period
START_POLL_S = 2.0  # how long a starting Router waits for the ledger's rollout weights before serving anyway


@serve.deployment(name="ABLedger", num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64)
class ABLedger:
    """The one place A/B counts add up: every Router ships its deltas here about once a second."""

    def __init__(self) -> None:
        self.stats = ABStats()
        self.since = time.time()
        self.rollout = RolloutBoard()  # where the rollout controller's weights meet the Routers (`RolloutBoard`)

    def add(self, delta: ABStats) -> None:
        self.stats.merge(delta)

    def poll(self, config_id: str, weights: dict[str, float]) -> dict[str, Any] | None:
        """A Router, about once a second: its user_config as it stands; back, the rollout's weights if any."""
        return self.rollout.poll(config_id, weights)

    def snapshot(self) -> dict[str, Any]:
        """For the rollout controller: the evidence so far, its epoch, and what the Routers' configs say."""
        return {"stats": ABStats(self.stats.variants, self.stats.pairs), "since": self.since, **self.rollout.seen()}

    def set_override(self, override: dict[str, Any] | None) -> None:
        self.rollout.set(override)

    def summary(self) -> dict[str, Any]:
        return {"since": self.since, **self.stats.summary()}

    def margins(self) -> dict[str, dict[str, list[int]]]:
        """The cascades' evidence, merged over every Router ("first>then" -> counts by margin): each Router fits
        its `margin: auto` thresholds from it (`Cascades`)."""
        return {k: m.to_dict() for k, m in self.stats.margins.items()}

    def reset(self) -> dict[str, Any]:
        before = self.summary()
        self.stats, self.since = ABStats(models=self.stats.models), time.time()  # Triton's counters only grow
        # The cascades' evidence goes with the rest: an auto threshold falls back to its default until refitted.
        return before

    def model_stats(self) -> ModelStatsTable:
        return self.stats.models


@serve.deployment(name="RolloutController", num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=16)
class RolloutController:
    """The canary ramp (`RolloutService`) ticking once a second; its state in Ray's internal KV."""

    async def __init__(self, ledger: DeploymentHandle, variants: list[str]) -> None:  # type: ignore[misc]
        app = serve.get_replica_context().app_name
        self.service = RolloutService(RolloutPorts(ledger, f"rollout/{app}"), variants)
        self.metrics = RolloutMetrics()
        await self.service.restore()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self.service.tick()
                self.metrics.observe(self.service.describe())
            except Exception as e:  # the ledger or the KV briefly away (a restart, the GCS): try again next tick
                logger.warning("rollout tick failed: %s: %s", type(e).__name__, e)

    async def start(self, body: Any, router: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.service.start(body, router)

    async def get(self) -> dict[str, Any]:
        return self.service.describe()

    async def abort(self) -> dict[str, Any]:
        return await self.service.abort()

    def check_health(self) -> None:
        if self._task.done():  # the loop must never end; if it did, Serve replaces this replica
            raise RuntimeError(f"the rollout loop ended: {self._task.exception()!r}")


def answers_rpcs(cls: type[Router]) -> type[Router]:
    """The Router with one method per gRPC method of the Open Inference Protocol (configs' grpc_options), named after
    the RPC as Serve calls it, each handing the message and its context to the gRPC handler."""

    def method(name: str) -> Any:
        async def rpc(self: Router, request: Any, grpc_context: Any = None) -> Any:
            return await self.app.grpc.call(name, request, grpc_context)

        rpc.__name__ = rpc.__qualname__ = name
        return rpc

    for entry in RPCS:
        setattr(cls, entry.name, method(entry.name))
    return cls


@serve.deployment(name="Router", ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=256)
@answers_rpcs
class Router:
    """HTTP and gRPC ingress: the v1 and V2 handlers over one Pipeline, on Serve's handles."""

    def __init__(
        self,
        preprocessor: DeploymentHandle | None,
        classifiers: dict[str, DeploymentHandle],
        ledger: DeploymentHandle,
        args: dict[str, Any],
        controller: DeploymentHandle | None = None,
        transform: dict[str, Any] | None = None,
    ) -> None:
        """transform: the model's (app.imaging.transform.Transform.to_dict()), as the deploy read it from the model's
        files; None where they were not on its node: the first request asks a Classifier."""
        turn_on_here()  # the app's spans, where Serve traces this process
        parsed = AppArgs.model_validate(args)
        decoder = Decoder(parsed.limits) if parsed.decode_in == "router" else None  # gpu: the Classifiers decode
        backend = ServeBackend(preprocessor, classifiers, ledger, controller, decoder)
        state = decoder.describe if decoder is not None else None
        metrics = RouterMetrics(parsed.model.name)
        known = Transform.from_dict(transform) if transform is not None else None
        self.app = RouterApp(parsed, backend, sorted(classifiers), replica_id(), metrics, request_id, state, known)
        self.ingress = self.app.ingress

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """user_config, live: weights, headers, deadlines, limits of the pipeline (no restart).

        Then one rollout poll before traffic (Serve runs this before a replica takes any): a Router that replaces
        a lost one routes by a running rollout's weights from its first request, not by the config's for a
        second. A new config's poll finds no weights for it (the deploy wins), and a ledger not up yet costs at
        most START_POLL_S."""
        self.app.configure(RouterConfig.model_validate(config))
        await self.app.policy.poll_rollout(START_POLL_S)

    async def __call__(self, request: Request) -> Response:
        return await self.ingress(request)
