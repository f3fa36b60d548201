"""The Router's parts, assembled in one place: the pipeline, the live policy, the handlers and their route table.

Each part gets what it uses as constructor arguments; nothing is set on a part after it is built. The Router
deployment builds one RouterApp per replica on Serve's handles and metrics, and the
unit tests build it on a fake Backend.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.config import AppArgs, RouterConfig
from app.front import declared
from app.http.body_reader import BodyReader
from app.http.context import RouterContext
from app.http.docs import Docs
from app.http.front_report import FrontReport
from app.http.ingress import Ingress
from app.http.policy import RouterPolicy
from app.http.replies import Replies
from app.http.report import RouterReport
from app.http.rollout import RolloutAPI
from app.http.routes import ROUTES, Routes, routes
from app.http.v1 import V1
from app.http.v2_dataplane import V2DataPlane
from app.http.v2_grpc import GRPC
from app.http.v2_rest import V2
from app.imaging.transform import Transform
from app.pipeline.capture import CaptureStore
from app.pipeline.ports import Backend
from app.pipeline.service import Pipeline
from app.protocol.v2.parse_pool import ParsePool

if TYPE_CHECKING:  # a type only: the Router's metrics are made and handed in by the deployment
    from app.http.ports import Metrics


class RouterApp:
    def __init__(
        self,
        args: AppArgs,
        backend: Backend,
        variants: list[str],
        replica: str,
        metrics: Metrics,
        serve_request_id: Callable[[], str | None] = lambda: None,
        decoder_state: Callable[[], dict[str, Any]] | None = None,
        transform: Transform | None = None,
    ) -> None:
        """variants: the Classifiers; serve_request_id: Serve's id of the request being handled;
        decoder_state: the Router's own decoder's describe() (decode_in: router); transform: the model's, as the
        deploy read it (None: asked of a Classifier once)."""
        rng = random.Random()
        captures = {n: c.capture for n, c in args.cascades.items() if c.capture.enabled}
        self.capture = CaptureStore(captures) if captures else None  # the cascades' calibration capture
        self.metrics = metrics
        self.pipeline = Pipeline(
            backend,
            variants,
            metrics,
            metrics.request_cancelled,
            rng,
            dict(args.cascades),
            capture=self.capture,
            after_flush=self.after_flush,
            transform=transform,
        )
        self.policy = RouterPolicy(self.pipeline, variants, list(args.cascades), metrics, rng)
        self.front = FrontReport(declared(args.front))  # which admission fronts this Router's requests came through
        bodies = BodyReader(args.limits, self.policy, metrics, self.pipeline.admission.client_gone)
        self.ctx = ctx = RouterContext(args, variants, self.pipeline, self.policy, bodies, Replies(metrics), metrics)
        parsers = ParsePool()  # large V2 JSON is parsed in a child process (CPython's json holds the GIL)
        report = RouterReport(replica, args, self.pipeline, bodies, parsers, self.capture, decoder_state)
        v1 = V1(ctx, report, self.front, serve_request_id)
        ops = V2DataPlane(ctx)  # the V2 protocol's operations, for REST and gRPC
        v2 = V2(ctx, ops, parsers)
        self.grpc = GRPC(ctx, ops)  # the gRPC calls' handler (Serve calls the Router's method of each RPC)
        docs = Docs(ctx, ROUTES)  # documents the table the Ingress dispatches on
        table = Routes.of(routes(v1, v2, RolloutAPI(ctx), docs))
        self.ingress = Ingress(ctx, table, v2, self.front)  # the HTTP requests

    def configure(self, cfg: RouterConfig) -> None:
        """A user_config, at deploy time or live."""
        self.policy.configure(cfg)

    async def after_flush(self) -> None:
        """About once a second, after the A/B flush: the front's state, the rollout's weights, then the cascades'
        auto thresholds and the capture's sweep."""
        self.metrics.admission_front(self.front.active(), self.front.unreported())
        await self.policy.poll_rollout()
        await self.policy.refit_cascades()
        if self.capture is not None:
            self.capture.maybe_sweep()
