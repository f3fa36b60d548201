"""The Router's HTTP side: the route table, the request's body and the choice of variant, over one Pipeline.

Everything a handler needs lives here once: the limits, the live RouterConfig, the A/B split,
the body gate, the JSON parser processes, the replies. Handlers are in v1.py and v2.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from app.config import AppArgs, RouterConfig
from app.errors import ServiceError
from app.http.front_report import FrontReport
from app.http.replies import Replies
from app.pipeline.capture import CaptureStore
from app.pipeline.cascade import MarginEvidence
from app.pipeline.ports import Backend
from app.pipeline.routing import Choice, WeightedSplit, choose_variant
from app.pipeline.service import Pipeline
from app.protocol.parse_pool import ParsePool
from app.request.body import INLINE_INFLATE_BYTES, BodyGate, check_encoding, content_length, inflate
from app.request.guards import admin_token, check_admin, check_url
from app.rollout.board import config_id

if TYPE_CHECKING:  # a type only: the Router's metrics are made and handed in by the deployment
    from app.serve.metrics import RouterMetrics

logger = logging.getLogger("ray.serve")
Handler = Callable[[Request], Awaitable[Response]]


class Ingress:
    def __init__(
        self,
        args: AppArgs,
        backend: Backend,
        variants: list[str],
        replica: str,
        metrics: RouterMetrics,
        serve_request_id: Callable[[], str | None] = lambda: None,
        decoder_state: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """Wired by app/serve/deployments.py; `decoder_state`: the decoder's describe(), with decode_in: router."""
        self.args = args
        self.decoder_state = decoder_state
        self.limits = args.limits
        self.variants = variants  # the Classifiers
        self.known = frozenset([*variants, *args.cascades])  # what a request can be routed to
        self.replica = replica
        self.metrics = metrics
        self.serve_request_id = serve_request_id
        self.front = FrontReport(args.front.limits())  # which admission fronts this Router's requests came through
        self.replies = Replies(self.metrics)
        self.rng = random.Random()
        self.pipeline = Pipeline(
            backend, variants, self.metrics, self.metrics.cancelled.inc, self.rng, dict(args.cascades)
        )
        self.pipeline.evidence.poller = self.after_flush
        self.metrics.cascade_thresholds(self.pipeline.cascades.thresholds())
        captures = {n: c.capture for n, c in args.cascades.items() if c.capture.enabled}
        self.capture = CaptureStore(captures) if captures else None  # the cascades' calibration capture
        self.pipeline.cascader.capture = self.capture
        self.bodies = BodyGate()  # bodies still arriving: before admission, with their own deadline
        self.parsers = ParsePool()  # large V2 JSON is parsed in a child process (CPython's json holds the GIL)
        self.inflater = ThreadPoolExecutor(max_workers=2, thread_name_prefix="inflate")  # zlib frees the GIL
        self.cfg: RouterConfig | None = None  # in force: the user_config, or it with the rollout's weights
        self.base: RouterConfig | None = None  # the user_config as deployed
        self.config_id: str | None = None
        self.override_generation: Any = None
        self.split: WeightedSplit | None = None
        self.admin_token: str | None = None
        self.routes: dict[tuple[str, str], Handler] = {}
        self.admin_routes: set[tuple[str, str]] = set()
        self.v2: Callable[[Request, str], Awaitable[Response]] | None = None

    def configure(self, cfg: RouterConfig) -> None:
        """A user_config (deploy time or live); it replaces any rollout weights until the ledger says otherwise."""
        self._use(cfg)
        self.base, self.override_generation = cfg, None
        self.pipeline.shadow.pair = None  # a deploy drops a rollout's weights: its pair goes with them
        self.config_id = config_id({"user_config": cfg.model_dump(mode="json"), "variants": self.variants})
        self.admin_token = admin_token(cfg.admin_token_env)
        if self.admin_token:
            admin = f"token from ${cfg.admin_token_env}"
            if len(self.admin_token) < 16:
                logger.warning("the admin token in $%s is under 16 characters: guessable", cfg.admin_token_env)
        else:
            admin = "open to anyone (allow_unauthenticated_admin)" if cfg.allow_unauthenticated_admin else "disabled"
        logger.info(
            "Router A/B weights %s (sticky %s, override %s, shadow %.2f); admin endpoints: %s",
            cfg.weights,
            cfg.sticky_header,
            "allowed" if cfg.allow_override else "refused",
            cfg.shadow_fraction,
            admin,
        )

    def _use(self, cfg: RouterConfig) -> None:
        unknown = sorted(set(cfg.weights) - self.known)
        if unknown:
            raise ValueError(f"user_config.weights names unknown variants {unknown}; deployed: {sorted(self.known)}")
        self.split = WeightedSplit(cfg.weights)
        self.cfg = cfg
        self.pipeline.configure(cfg, self.split)

    async def after_flush(self) -> None:
        """About once a second, after the A/B flush: the rollout's weights, then the cascades' auto thresholds."""
        self.metrics.admission_front(self.front.active(), self.front.unreported())
        await self.poll_rollout()
        await self.refit_cascades()
        if self.capture is not None:
            self.capture.maybe_sweep()

    async def refit_cascades(self, timeout_s: float = 5.0) -> None:
        """`margin: auto` thresholds from the ledger's evidence, merged over every Router."""
        cascades = self.pipeline.cascades
        if not cascades.any_auto():
            return
        try:
            raw = await self.pipeline.ask(self.pipeline.backend.ledger_margins(), timeout_s)
            margins = {k: MarginEvidence.from_dict(v) for k, v in raw.items()}
        except Exception as e:  # the ledger is best-effort: keep the thresholds we have
            logger.debug("cascade evidence not read: %s", type(e).__name__)
            return
        if cascades.refit(margins):
            self.metrics.cascade_thresholds(cascades.thresholds())

    async def poll_rollout(self, timeout_s: float = 5.0) -> None:
        """About once a second (after the A/B flush): the rollout controller's weights from the ledger, if any."""
        if self.base is None or self.config_id is None:
            return
        try:
            override = await self.pipeline.ask(
                self.pipeline.backend.ledger_poll(self.config_id, self.base.weights), timeout_s
            )
        except Exception as e:  # the ledger is best-effort; serving is not: keep the weights we have
            logger.debug("rollout poll failed: %s", type(e).__name__)
            return
        self.apply_override(override)

    def apply_override(self, override: dict[str, Any] | None) -> None:
        """The rollout's weights (and its shadow-fraction floor) over this Router's user_config; None: the config's."""
        generation = override.get("generation") if override else None
        if generation == self.override_generation or self.base is None:
            return
        self.override_generation = generation
        cfg = self.base
        pair = override.get("pair") if override else None
        if override is not None:
            weights = {v: float(w) for v, w in override["weights"].items() if v in self.known}
            update = {
                "weights": {**cfg.weights, **weights},
                "shadow_fraction": max(cfg.shadow_fraction, float(override.get("shadow_fraction") or 0.0)),
            }
            cfg = cfg.model_copy(update=update)
        try:
            self._use(cfg)
        except ValueError as e:  # e.g. every weight 0: keep routing as before, and say why
            logger.warning("rollout weights %s not applied: %s", override, e)
            return
        self.pipeline.shadow.pair = (pair[0], pair[1]) if pair and set(pair) <= self.known else None
        logger.info("rollout: weights %s, shadow %.3f (generation %s)", cfg.weights, cfg.shadow_fraction, generation)

    @property
    def config(self) -> RouterConfig:
        assert self.cfg is not None, "reconfigure() has not run"
        return self.cfg

    # -- dispatch ------------------------------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        self.front.saw(request.headers.get("x-app-front"))
        path = app_path(request).rstrip("/") or "/"
        is_v2 = path.startswith("/v2")
        try:
            raw_path = request.scope.get("raw_path") or request.url.path.encode()
            check_url(raw_path, request.scope.get("query_string") or b"", self.limits.max_url_bytes)
        except ServiceError as e:
            return self.replies.v2_error(e) if is_v2 else self.replies.error("other", e)
        if is_v2:
            assert self.v2 is not None
            return await self.v2(request, path)
        handler = self.routes.get((request.method, path))
        if handler is None:
            if any(p == path for _, p in self.routes):
                return self.replies.error("other", ServiceError("method_not_allowed", f"{request.method} not allowed"))
            return self.replies.error("other", ServiceError("not_found", f"no route {request.url.path}"))
        try:
            if (request.method, path) in self.admin_routes:
                auth = request.headers.get("authorization")
                check_admin(auth, self.admin_token, self.config.allow_unauthenticated_admin)
            return await handler(request)
        except ServiceError as e:
            return self.replies.error(path, e)
        except Exception as e:  # a bug, not an input's fault: keep the replica serving
            logger.exception("unhandled error on %s %s", request.method, request.url.path)
            return self.replies.error(path, ServiceError("internal_error", f"internal error ({type(e).__name__})"))

    # -- what every handler needs ----------------------------------------------------------

    async def receive(self, request: Request, max_bytes: int | None = None) -> bytes:
        """The whole body through the body gate (app/request/body.py), before the request is admitted: 413/408 here."""
        cfg = self.config
        try:
            body = await self.bodies.read(
                request.stream(),
                declared=content_length(request.headers.get("content-length")),
                max_bytes=self.limits.max_body_bytes if max_bytes is None else max_bytes,
                timeout_s=cfg.body_timeout_s,
                slow_after_s=cfg.slow_body_after_s,
                max_slow=cfg.max_slow_bodies,
            )
        except ClientDisconnect:
            self.pipeline.admission.client_gone()
            raise ServiceError("bad_request", "the client closed the connection before its body arrived") from None
        self.metrics.input_bytes.observe(len(body))
        return body

    async def inflate(self, raw: bytes, encoding: str | None, max_bytes: int) -> bytes:
        """Undo the Content-Encoding within the size and ratio limits; a large one on a thread (zlib frees the GIL)."""
        ratio = self.limits.max_inflate_ratio
        if check_encoding(encoding) and len(raw) > INLINE_INFLATE_BYTES:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.inflater, inflate, raw, encoding, max_bytes, ratio)
        return inflate(raw, encoding, max_bytes, ratio)

    def choose(self, request: Request | Headers, pinned: str | None = None) -> Choice:
        """The A/B choice (sticky, override or weighted), or the variant a V2 model name pins.

        request: an HTTP request, or the headers of another protocol's call (gRPC metadata).
        """
        if pinned is not None:
            return Choice(pinned, "model")
        cfg, split = self.config, self.split
        assert split is not None
        headers = _headers(request)
        return choose_variant(
            split,
            self.known,
            headers.get(cfg.sticky_header),
            headers.get(cfg.override_header),
            cfg.allow_override,
            self.rng,
        )

    def request_id(self, request: Request) -> str:
        """Serve's own request id (it also returns it as X-Request-Id and logs it)."""
        return self.serve_request_id() or request.headers.get("x-request-id") or uuid.uuid4().hex

    def user(self, request: Request | Headers) -> str | None:
        """Who sent the request, as the sticky header says (None: not said)."""
        return _headers(request).get(self.config.sticky_header)

    def observe_pixels(self, pixels: list[int]) -> None:
        for n in pixels:
            self.metrics.input_pixels.observe(n)

    def summary(self) -> dict[str, Any]:
        """This Router's own counters, for /v1/models."""
        return {
            "router_replica_id": self.replica,
            "cancelled_requests": self.pipeline.admission.cancelled,
            "admission": self.pipeline.admission.describe(),
            "decode": {"where": self.args.decode_in, **(self.decoder_state() if self.decoder_state else {})},
            "cascades": self.cascades_state(),
            "bodies": {
                "slow_now": self.bodies.slow,
                "timed_out": self.bodies.timed_out,
                "refused_slow": self.bodies.refused_slow,
            },
            "json_parsers": {"started": self.parsers.started, "parsed": self.parsers.parsed},
        }

    def cascades_state(self) -> dict[str, Any]:
        """Each cascade's threshold and fit, with its capture's state when it keeps images."""
        out = self.pipeline.cascades.describe()
        for name, shelf in (self.capture.describe() if self.capture is not None else {}).items():
            out[name]["capture"] = shelf
        return out


def app_path(request: Request) -> str:
    """The request's path within this application: Serve puts the application's route_prefix in the ASGI
    `root_path` and leaves it in `path` too, so an app deployed at /lite1 sees /lite1/v1/classify as /v1/classify."""
    path, root = request.url.path, request.scope.get("root_path") or ""
    return path[len(root) :] or "/" if root and path.startswith(root) else path


def _headers(request: Request | Headers) -> Headers:
    """An HTTP request's headers, or another protocol's call's (gRPC metadata) as they are."""
    return request.headers if isinstance(request, Request) else request
