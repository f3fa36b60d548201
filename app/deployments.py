"""The Ray Serve deployments: Router (HTTP ingress, A/B), Preprocessor (CPU), Classifier (GPU, batched).

Data path: the Router reads and checks the request, picks a variant, calls the
Preprocessor and passes its DeploymentResponse straight into the Classifier,
so the image tensor goes Preprocessor -> object store -> Classifier and never
back through the Router. Only the top-k scores come back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray import serve
from ray.exceptions import RayActorError, TaskCancelledError
from ray.serve._private.common import ReplicaState
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, RequestCancelledError
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from app import v2
from app.abstats import ABStats, compare_top
from app.body import INLINE_INFLATE_BYTES, BodyGate, check_encoding, content_length, inflate
from app.config import AppArgs, RouterConfig
from app.errors import ServiceError, find_service_error
from app.guards import admin_token, check_admin, check_url, deadline_message, parse_top_k, wall_deadline
from app.metrics import STAGES, RouterMetrics
from app.multipart import parse_multipart
from app.parse_pool import ParsePool, parse_request
from app.payloads import Pixels, Scores
from app.preprocess import check_header
from app.routing import Choice, VariantHealth, WeightedSplit, candidates, choose_variant
from app.runtime import softmax
from app.serve_internals import replica_id

logger = logging.getLogger("ray.serve")

IMAGE_TYPES_EXTRA = {"application/octet-stream"}
MULTIPART = "multipart/form-data"
# Endpoints that change state: they need the admin token (guards.check_admin).
ADMIN_ROUTES = frozenset({("POST", "/v1/ab/reset")})


class _VariantFailed(RuntimeError):
    """A call abandoned because its variant failed while it waited (see Router._call)."""


# Replica-level failures worth one retry on another replica (inference is idempotent).
_REPLICA_FAILURES = (RayActorError, DeploymentUnavailableError, _VariantFailed)


async def _await(response: Any) -> Any:
    return await response


def _routable_replicas(handle: DeploymentHandle) -> int | None:
    """How many replicas this process's handle can route to right now, or None if unknown.

    Serve drops a replica from a handle the moment a call to it fails with the actor dead,
    long before the controller's next health check: the quickest "this variant is down" signal.
    Private Serve state (Ray 2.60), read defensively: any change in Serve's internals gives None.
    """
    router = getattr(getattr(handle, "_router", None), "_asyncio_router", None)
    request_router = getattr(router, "_request_router", None)
    try:
        return None if request_router is None else len(request_router.curr_replicas)
    except (AttributeError, TypeError):
        return None


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def _request_id(request: Request) -> str:
    """Serve's own request id (it also returns it as the X-Request-Id header and logs it)."""
    try:
        rid = serve.context._get_serve_request_context().request_id
    except Exception:
        rid = ""
    return rid or request.headers.get("x-request-id") or uuid.uuid4().hex


# --------------------------------------------------------------------------- A/B ledger


@serve.deployment(name="ABLedger", num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64)
class ABLedger:
    """The one place A/B counts add up: every Router ships its deltas here about once a second."""

    def __init__(self) -> None:
        self.stats = ABStats()
        self.since = time.time()

    def add(self, delta: ABStats) -> None:
        self.stats.merge(delta)

    def summary(self) -> dict[str, Any]:
        return {"since": self.since, **self.stats.summary()}

    def reset(self) -> dict[str, Any]:
        before = self.summary()
        self.stats, self.since = ABStats(), time.time()
        return before


# --------------------------------------------------------------------------- Router


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(body, status_code=status, headers=headers)


def error_response(err: ServiceError) -> Response:
    return _json(err.body(), err.status, err.headers())


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def _is_image_type(media_type: str) -> bool:
    return media_type.startswith("image/") or media_type in IMAGE_TYPES_EXTRA


@dataclass
class _Pending:
    """A single-image request waiting in the Router for its group."""

    data: bytes
    top_k: int
    t0: float  # arrival, for the deadline
    future: asyncio.Future[tuple[Scores, int, bool, float]]
    enqueued: float
    choice: Choice


SHADOW_TOP_K = 5  # the classifier always returns at least this many, so a shadow pair can compare top-5


@serve.deployment(name="Router", ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=256)
class Router:
    """HTTP ingress: validation, the A/B choice, the Preprocessor -> Classifier chain, the reply."""

    def __init__(
        self,
        preprocessor: DeploymentHandle,
        classifiers: dict[str, DeploymentHandle],
        ledger: DeploymentHandle,
        args: dict[str, Any],
        labels: list[str],
    ) -> None:
        self.args = AppArgs.model_validate(args)
        self.limits = self.args.limits
        self.preprocessor = preprocessor
        self.classifiers = classifiers
        self.ledger = ledger
        self.variants = sorted(classifiers)
        self.labels = labels
        self.cfg: RouterConfig | None = None
        self.split: WeightedSplit | None = None
        self._specs: dict[str, dict[str, Any]] = {}
        self.replica_id = replica_id()
        self.rng = random.Random()
        self.metrics = RouterMetrics()
        self.stats = ABStats()
        self._flusher: asyncio.Task[None] | None = None
        self._in_flight = 0
        self._cancelled = 0
        self._shadows: set[asyncio.Task[None]] = set()
        self.health = VariantHealth()
        self._poller: asyncio.Task[None] | None = None
        self._pending: dict[tuple[str, bool], list[_Pending]] = collections.defaultdict(list)
        self._groups: dict[tuple[str, bool], int] = collections.defaultdict(int)
        self._failures: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)
        self.bodies = BodyGate()  # bodies still arriving: before admission, with their own deadline
        self.parsers = ParsePool()  # large V2 JSON is parsed in a child process (CPython's json holds the GIL)
        self.inflater = ThreadPoolExecutor(max_workers=2, thread_name_prefix="inflate")  # zlib releases the GIL
        self._admin_token: str | None = None
        self.routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
            ("POST", "/v1/classify"): self.classify,
            ("POST", "/v1/classify/batch"): self.classify_batch,
            ("GET", "/v1/models"): self.models,
            ("GET", "/v1/ab/summary"): self.ab_summary,
            ("POST", "/v1/ab/reset"): self.ab_reset,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
        }

    def reconfigure(self, config: dict[str, Any]) -> None:
        cfg = RouterConfig.model_validate(config)
        unknown = sorted(set(cfg.weights) - set(self.variants))
        if unknown:
            raise ValueError(f"user_config.weights names unknown variants {unknown}; deployed: {self.variants}")
        self.split = WeightedSplit(cfg.weights)
        self.cfg = cfg
        self._admin_token = admin_token(cfg.admin_token_env)
        if self._admin_token:
            admin = f"token from ${cfg.admin_token_env}"
            if len(self._admin_token) < 16:
                logger.warning("the admin token in $%s is under 16 characters: guessable", cfg.admin_token_env)
        else:
            admin = "open to anyone (allow_unauthenticated_admin)" if cfg.allow_unauthenticated_admin else "disabled"
        logger.info(
            "Router A/B weights %s (sticky %s, override %s, shadow %.2f); admin endpoints: %s",
            self.split.fractions,
            cfg.sticky_header,
            "allowed" if cfg.allow_override else "refused",
            cfg.shadow_fraction,
            admin,
        )

    # -- HTTP dispatch ---------------------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        try:
            raw_path = request.scope.get("raw_path") or request.url.path.encode()
            check_url(raw_path, request.scope.get("query_string") or b"", self.limits.max_url_bytes)
        except ServiceError as e:
            return self._v2_error(e) if path.startswith("/v2") else self._error("other", e)
        if path.startswith("/v2"):
            return await self._v2(request, path)
        handler = self.routes.get((request.method, path))
        if handler is None:
            if any(p == path for _, p in self.routes):
                return self._error("other", ServiceError("method_not_allowed", f"{request.method} not allowed here"))
            return self._error("other", ServiceError("not_found", f"no route {request.url.path}"))
        try:
            if (request.method, path) in ADMIN_ROUTES:
                assert self.cfg is not None
                check_admin(
                    request.headers.get("authorization"), self._admin_token, self.cfg.allow_unauthenticated_admin
                )
            return await handler(request)
        except ServiceError as e:
            return self._error(path, e)
        except Exception as e:  # a bug, not an input's fault: keep the replica serving
            logger.exception("unhandled error on %s %s", request.method, request.url.path)
            return self._error(path, ServiceError("internal_error", f"internal error ({type(e).__name__})"))

    def _error(self, endpoint: str, err: ServiceError, variant: str = "none") -> Response:
        self.metrics.requests.inc(tags={"endpoint": endpoint, "variant": variant, "status": str(err.status)})
        self.metrics.errors.inc(tags={"endpoint": endpoint, "code": err.code})
        return error_response(err)

    async def healthz(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        states = await asyncio.gather(
            *(self._call(self.classifiers[v].ready.remote(), 2.0) for v in self.variants), return_exceptions=True
        )
        detail = {v: (s is True) for v, s in zip(self.variants, states, strict=True)}
        if all(detail.values()):
            return _json({"status": "ready", "variants": detail})
        err = ServiceError("not_ready", f"variants not ready: {sorted(v for v, ok in detail.items() if not ok)}")
        return _json({**err.body(), "variants": detail}, err.status, err.headers())

    async def models(self, request: Request) -> Response:
        assert self.cfg is not None and self.split is not None
        described = await asyncio.gather(
            *(self._call(self.classifiers[v].describe.remote(), 5.0) for v in self.variants), return_exceptions=True
        )
        variants = {}
        for v, d in zip(self.variants, described, strict=True):
            info = d if isinstance(d, dict) else {"error": str(find_service_error(d) or type(d).__name__)}
            variants[v] = {
                "deployment": f"Classifier_{v}",
                "weight": self.cfg.weights.get(v, 0.0),
                "traffic_fraction": self.split.fractions.get(v, 0.0),
                "description": self.args.variants[v].description,
                **info,
            }
        return _json(
            {
                "model": self.args.model_name,
                "variants": variants,
                "routing": {
                    "sticky_header": self.cfg.sticky_header,
                    "override_header": self.cfg.override_header,
                    "allow_override": self.cfg.allow_override,
                    "failover": self.cfg.failover,
                    "inference_timeout_s": self.cfg.inference_timeout_s,
                    "shadow_fraction": self.cfg.shadow_fraction,
                },
                "limits": self.limits.model_dump(),
                "router_replica_id": self.replica_id,
                "cancelled_requests": self._cancelled,
                "bodies": {
                    "slow_now": self.bodies.slow,
                    "timed_out": self.bodies.timed_out,
                    "refused_slow": self.bodies.refused_slow,
                },
                "json_parsers": {"started": self.parsers.started, "parsed": self.parsers.parsed},
            }
        )

    # -- A/B evidence -------------------------------------------------------------------

    async def ab_summary(self, request: Request) -> Response:
        await self._flush()
        return _json(await self._call(self.ledger.summary.remote(), 10.0))

    async def ab_reset(self, request: Request) -> Response:
        """Zero the A/B counters (POST /v1/ab/reset); returns the summary as it was."""
        self.stats = ABStats()  # this replica's unflushed counts go too
        return _json({"reset": True, "before": await self._call(self.ledger.reset.remote(), 10.0)})

    async def _flush(self) -> None:
        if self.stats.empty():
            return
        delta, self.stats = self.stats, ABStats()
        try:
            await self._call(self.ledger.add.remote(delta), 5.0)
        except Exception as e:  # the evidence is best-effort; serving is not
            logger.warning(
                "A/B ledger unreachable (%s); dropping %d variants' deltas", type(e).__name__, len(delta.variants)
            )

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self._flush()

    def _ensure_flusher(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())

    def _maybe_shadow(self, primary: Scores, pixels: DeploymentResponse) -> None:
        """Run a sample of these images on the other variant, off the response path, and record agreement.

        Each image is sampled with probability shadow_fraction; only the sampled rows are re-run.
        """
        assert self.cfg is not None
        f = self.cfg.shadow_fraction
        if f <= 0 or len(self.variants) < 2:
            return
        rows = [i for i in range(len(primary.top)) if self.rng.random() < f]
        if not rows:
            return
        other = next(v for v in self.variants if v != primary.variant)
        pair = "|".join(sorted((primary.variant, other)))
        if len(self._shadows) >= self.cfg.max_shadow_in_flight:  # shed shadows first under load
            for _ in rows:
                self.stats.record_dropped_shadow(primary.variant, other)
            self.metrics.shadow.inc(len(rows), tags={"pair": pair, "outcome": "dropped"})
            return

        async def run() -> None:
            try:
                shadow = await self._call(self.classifiers[other].remote(pixels, SHADOW_TOP_K, False, rows), 30.0)
            except Exception:
                for _ in rows:
                    self.stats.record_dropped_shadow(primary.variant, other)
                self.metrics.shadow.inc(len(rows), tags={"pair": pair, "outcome": "failed"})
                return
            for row, shadow_top in zip(rows, shadow.top, strict=True):
                agree, overlap, dp = compare_top(primary.top[row], shadow_top)
                self.stats.record_shadow(primary.variant, other, agree, overlap, dp)
                self.metrics.shadow.inc(tags={"pair": pair, "outcome": "agree" if agree else "disagree"})
                self.metrics.shadow_abs_dp.observe(dp, tags={"pair": pair})

        task = asyncio.get_running_loop().create_task(run())
        self._shadows.add(task)
        task.add_done_callback(self._shadows.discard)

    # -- classification ----------------------------------------------------------------

    def _admit(self) -> None:
        assert self.cfg is not None
        if self._in_flight >= self.cfg.max_in_flight:
            raise ServiceError("overloaded", f"{self._in_flight} requests in flight on this Router; retry shortly")

    @contextlib.asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        """Count the request in flight, or refuse it at once when the Router is at max_in_flight."""
        self._ensure_flusher()
        self._admit()
        self._in_flight += 1
        try:
            yield
        except asyncio.CancelledError:
            # The client went away: Serve cancels this coroutine; a request still waiting for its group
            # is dropped before it is sent, and Serve cancels a single request's downstream calls.
            self._cancelled += 1
            self.metrics.cancelled.inc()
            raise
        finally:
            self._in_flight -= 1

    async def classify(self, request: Request) -> Response:
        t0 = time.perf_counter()
        top_k = parse_top_k(request.query_params.get("top_k"), self.limits.default_top_k, self.limits.max_top_k)
        media = _media_type(request.headers.get("content-type"))
        if media != MULTIPART and not _is_image_type(media):
            raise ServiceError(
                "unsupported_media_type",
                f"Content-Type {media or '(none)'!r} is not an image; send image/* or multipart/form-data",
            )
        raw = await self._receive(request)  # admission counts the request only once its body is here
        async with self._admitted():
            return await self._classify(request, raw, media == MULTIPART, top_k, t0)

    async def _classify(self, request: Request, raw: bytes, multipart: bool, top_k: int, t0: float) -> Response:
        endpoint = "/v1/classify"
        request_id = _request_id(request)
        data = self._multipart_images(request, raw, 1)[0] if multipart else raw
        received = time.perf_counter()  # the request's deadline runs from here
        receive_ms = _ms(received - t0)
        choice = self._choose(request)
        self._check_image_header(data, self._known_size(choice.variant))
        try:
            scores, row, failed_over, waited_ms = await self._coalesced(choice, data, top_k, received)
        except ServiceError as e:
            variant = getattr(e, "variant", choice.variant)
            if e.status >= 500:
                self.stats.record_request(variant, 0.0, ok=False)
            logger.info("classify request_id=%s variant=%s status=%d code=%s", request_id, variant, e.status, e.code)
            return self._error(endpoint, e, variant)
        body = self._result_body(scores, row, request_id, choice.reason, failed_over, top_k)
        total_ms = _ms(time.perf_counter() - t0)
        timings = body["timings_ms"]
        timings["queue"] = round(timings["queue"] + waited_ms, 3)  # waiting to be sent counts as queueing
        body["timings_ms"] = {"receive": receive_ms, **timings, "total": total_ms}
        self._observe(endpoint, scores.variant, body["timings_ms"])
        self.stats.record_request(scores.variant, total_ms, ok=True)
        logger.info("classify request_id=%s variant=%s status=200 total_ms=%.1f", request_id, scores.variant, total_ms)
        return _json(body, headers=self._headers(scores.variant, body["timings_ms"]))

    # -- coalescing: concurrent single-image requests share one trip down the chain ----

    async def _coalesced(self, choice: Choice, data: bytes, top_k: int, t0: float) -> tuple[Scores, int, bool, float]:
        """Queue one image for its variant and wait for the group it rides in.

        While a variant has max_groups_in_flight groups in flight, arrivals wait here and
        leave together as the next group: one Preprocessor call and one Classifier call for
        the lot. At low load a request leaves at once, alone, so nothing waits for company.
        """
        assert self.cfg is not None
        key = (choice.variant, choice.reason in ("override", "model"))
        item = _Pending(data, top_k, t0, asyncio.get_running_loop().create_future(), time.perf_counter(), choice)
        self._pending[key].append(item)
        self._send_groups(key)
        return await item.future

    def _send_groups(self, key: tuple[str, bool]) -> None:
        assert self.cfg is not None
        pending = self._pending[key]
        while pending and self._groups[key] < self.cfg.max_groups_in_flight:
            group, pending[:] = pending[: self.cfg.coalesce_max], pending[self.cfg.coalesce_max :]
            self._groups[key] += 1
            task = asyncio.get_running_loop().create_task(self._run_group(key, group))
            task.add_done_callback(functools.partial(self._group_done, key))

    def _group_done(self, key: tuple[str, bool], _task: asyncio.Task[None]) -> None:
        self._groups[key] -= 1
        self._send_groups(key)

    async def _run_group(self, key: tuple[str, bool], group: list[_Pending]) -> None:
        started = time.perf_counter()
        live = [it for it in group if not it.future.done()]  # a client that went away is not sent
        if not live:
            return
        top_k = max(it.top_k for it in live)
        try:
            scores, _, failed_over, pixels = await self._infer_choice(
                live[0].choice, "many", [it.data for it in live], top_k, min(it.t0 for it in live)
            )
        except BaseException as e:
            for it in live:
                if not it.future.done():
                    it.future.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        rows = {pos: row for row, pos in enumerate(scores.positions)}
        for pos, it in enumerate(live):
            if it.future.done():
                continue
            if pos in scores.errors:
                it.future.set_exception(scores.errors[pos])
            else:
                it.future.set_result((scores, rows[pos], failed_over, _ms(started - it.enqueued)))
        if pixels is not None and scores.positions:
            self._maybe_shadow(scores, pixels)

    async def classify_batch(self, request: Request) -> Response:
        t0 = time.perf_counter()
        top_k = parse_top_k(request.query_params.get("top_k"), self.limits.default_top_k, self.limits.max_top_k)
        if _media_type(request.headers.get("content-type")) != MULTIPART:
            raise ServiceError("unsupported_media_type", "send multipart/form-data with one or more `file` parts")
        raw = await self._receive(request)
        async with self._admitted():
            return await self._classify_batch(request, raw, top_k, t0)

    async def _classify_batch(self, request: Request, raw: bytes, top_k: int, t0: float) -> Response:
        endpoint = "/v1/classify/batch"
        request_id = _request_id(request)
        images = self._multipart_images(request, raw, self.limits.max_batch_files)
        received = time.perf_counter()
        receive_ms = _ms(received - t0)
        choice = self._choose(request)
        # Every image's header is checked here, as on /v1/classify; a refused one fails only its own entry.
        size = self._known_size(choice.variant)
        errors: dict[int, ServiceError] = {}
        for i, data in enumerate(images):
            try:
                self._check_image_header(data, size)
            except ServiceError as e:
                errors[i] = e
        sent = [i for i in range(len(images)) if i not in errors]
        reason, failed_over = choice.reason, False
        scores = Scores([], 0.0, 0.0, 0.0, 0, choice.variant, "", {}, [])  # when no image is left to send
        if sent:
            try:
                scores, reason, failed_over, _ = await self._infer_choice(
                    choice, "many", [images[i] for i in sent], top_k, received
                )
            except ServiceError as e:
                return self._error(endpoint, e, getattr(e, "variant", "none"))
            errors.update({sent[i]: err for i, err in scores.errors.items()})
        results: list[dict[str, Any]] = [{} for _ in images]
        for i, err in sorted(errors.items()):
            results[i] = {**err.body(), "status": err.status}
            self.metrics.errors.inc(tags={"endpoint": endpoint, "code": err.code})
        for row, pos in enumerate(scores.positions):
            results[sent[pos]] = self._result_body(scores, row, f"{request_id}-{sent[pos]}", reason, failed_over, top_k)
        timings = {
            "receive": receive_ms,
            "preprocess": scores.preprocess_ms,
            "queue": scores.queue_ms,
            "inference": scores.inference_ms,
            "total": _ms(time.perf_counter() - t0),
            "batch_size": scores.batch_size,
        }
        self._observe(endpoint, scores.variant, timings)
        self.stats.record_request(scores.variant, timings["total"], ok=True)
        body = {"request_id": request_id, "variant": scores.variant, "results": results, "timings_ms": timings}
        return _json(body, headers=self._headers(scores.variant, timings))

    def _observe(self, endpoint: str, variant: str, timings: dict[str, float]) -> None:
        self.metrics.requests.inc(tags={"endpoint": endpoint, "variant": variant, "status": "200"})
        for stage in STAGES:
            if stage in timings:
                self.metrics.stage_ms.observe(timings[stage], tags={"stage": stage, "variant": variant})

    def _result_body(
        self, s: Scores, row: int, request_id: str, reason: str, failed_over: bool, top_k: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "request_id": request_id,
            "variant": s.variant,
            "model": self.args.model_name,
            "predictions": [
                {"class_id": c, "label": self.labels[c] if c < len(self.labels) else str(c), "score": round(p, 6)}
                for c, p in s.top[row][:top_k]
            ],
            "routing": reason,
            "timings_ms": {
                "preprocess": s.preprocess_ms,
                "queue": s.queue_ms,
                "inference": s.inference_ms,
                "batch_size": s.batch_size,
            },
        }
        if failed_over:
            body["failover"] = True
        return body

    def _headers(self, variant: str, timings: dict[str, float]) -> dict[str, str]:
        server_timing = ", ".join(f"{k};dur={v}" for k, v in timings.items() if k != "batch_size")
        return {"X-Model-Variant": variant, "Server-Timing": server_timing}

    # -- Open Inference Protocol (KServe V2) ----------------------------------------------

    async def _v2(self, request: Request, path: str) -> Response:
        """/v2/...: the same limits, A/B policy and status table, errors in the protocol's flat shape."""
        try:
            matched = v2.match_v2_path(request.method, path)
            if matched is None:
                raise ServiceError("not_found", f"no route {request.url.path}")
            handler, params = matched
            return await getattr(self, f"_v2_{handler}")(request, params)
        except ServiceError as e:
            return self._v2_error(e)
        except Exception as e:
            logger.exception("unhandled error on %s %s", request.method, path)
            status, body = v2.v2_error(ServiceError("internal_error", f"internal error ({type(e).__name__})"))
            return _json(body, status)

    def _v2_error(self, e: ServiceError) -> Response:
        status, body = v2.v2_error(e)
        self.metrics.requests.inc(tags={"endpoint": "/v2", "variant": "none", "status": str(status)})
        self.metrics.errors.inc(tags={"endpoint": "/v2", "code": e.code})
        return _json(body, status, e.headers())

    async def _v2_server_metadata(self, request: Request, params: dict[str, str]) -> Response:
        from app import __version__

        return _json(v2.server_metadata(__version__))

    async def _v2_server_live(self, request: Request, params: dict[str, str]) -> Response:
        return Response(status_code=200)

    async def _v2_server_ready(self, request: Request, params: dict[str, str]) -> Response:
        await self._require_ready(self.variants)
        return Response(status_code=200)

    def _v2_variant(self, params: dict[str, str]) -> str | None:
        return v2.resolve_model(params["model"], self.args.model_name, self.variants, params.get("version") or None)

    async def _v2_model_ready(self, request: Request, params: dict[str, str]) -> Response:
        pinned = self._v2_variant(params)
        await self._require_ready([pinned] if pinned else self.variants)
        return Response(status_code=200)

    async def _v2_model_metadata(self, request: Request, params: dict[str, str]) -> Response:
        pinned = self._v2_variant(params)
        spec = await self._model_spec(pinned or self.variants[0])
        return _json(v2.model_metadata(params["model"], [v2.DEFAULT_VERSION], spec, len(self.labels) or None))

    async def _require_ready(self, variants: list[str]) -> None:
        states = await asyncio.gather(
            *(self._call(self.classifiers[v].ready.remote(), 2.0) for v in variants), return_exceptions=True
        )
        down = [v for v, s in zip(variants, states, strict=True) if s is not True]
        if down:
            raise ServiceError("not_ready", f"variants not ready: {down}")

    async def _v2_infer(self, request: Request, params: dict[str, str]) -> Response:
        t0 = time.perf_counter()
        pinned = self._v2_variant(params)
        # Everything the headers can refuse is refused before the body is read.
        header_length = v2.parse_header_length(request.headers.get(v2.HEADER_LENGTH))
        encoding = request.headers.get("content-encoding")
        compressed = check_encoding(encoding)
        json_limit, body_limit = self.limits.max_json_bytes, self.limits.max_body_bytes
        if header_length is not None and header_length > json_limit:
            raise ServiceError(
                "payload_too_large", f"{v2.HEADER_LENGTH} is {header_length}; the JSON limit is {json_limit} bytes"
            )
        raw = await self._receive(request, json_limit if header_length is None and not compressed else body_limit)
        async with self._admitted():
            received = time.perf_counter()
            choice = self._choose(request, pinned)
            body = await self._inflate(raw, encoding, json_limit if header_length is None else body_limit)
            spec = await self._model_spec(choice.variant)
            assert self.cfg is not None
            remaining = received + self.cfg.inference_timeout_s - time.perf_counter()
            req = await parse_request(self.parsers, body, header_length, self.limits, v2.image_hw(spec), remaining)
            full = req.needs_logits or req.needs_probabilities
            payload: Any
            if req.images is not None:
                size = await self._input_size(choice.variant)
                for data in req.images:  # the protocol has no per-item errors: the first refusal fails the request
                    self._check_image_header(data, size)
                method, payload = "many", req.images
            else:
                assert req.pixels is not None
                n = len(req.pixels)
                method, payload = "pixels", Pixels(np.ascontiguousarray(req.pixels), 0.0, {}, list(range(n)))
            scores, reason, failed_over, _ = await self._infer(
                request, method, payload, req.max_k, received, choice, full
            )
        if scores.errors:  # the protocol has no per-item errors: the first bad image fails the request
            raise scores.errors[min(scores.errors)]
        probabilities = softmax(scores.logits) if req.needs_probabilities and scores.logits is not None else None
        model_name = v2.model_name_for(self.args.model_name, pinned)
        out, headers = v2.encode_infer_response(
            req,
            model_name,
            self.labels,
            logits=scores.logits,
            probabilities=probabilities,
            top=scores.top,
            parameters={"variant": scores.variant, "routing": reason, **({"failover": True} if failed_over else {})},
        )
        total_ms = _ms(time.perf_counter() - t0)
        timings = {
            "preprocess": scores.preprocess_ms,
            "queue": scores.queue_ms,
            "inference": scores.inference_ms,
            "total": total_ms,
        }
        self._observe("/v2/infer", scores.variant, timings)
        self.stats.record_request(scores.variant, total_ms, ok=True)
        return Response(out, headers={**headers, **self._headers(scores.variant, timings)})

    # -- reading the request -----------------------------------------------------------

    async def _receive(self, request: Request, max_bytes: int | None = None) -> bytes:
        """The whole body through the body gate (app/body.py), before the request is admitted: 413/408 here."""
        assert self.cfg is not None
        cfg = self.cfg
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
            self._cancelled += 1
            self.metrics.cancelled.inc()
            raise ServiceError("bad_request", "the client closed the connection before its body arrived") from None
        self.metrics.input_bytes.observe(len(body))
        return body

    async def _inflate(self, raw: bytes, encoding: str | None, max_bytes: int) -> bytes:
        """Undo the Content-Encoding within the size and ratio limits; a large one on a thread (zlib frees the GIL)."""
        ratio = self.limits.max_inflate_ratio
        if check_encoding(encoding) and len(raw) > INLINE_INFLATE_BYTES:
            return await asyncio.get_running_loop().run_in_executor(
                self.inflater, inflate, raw, encoding, max_bytes, ratio
            )
        return inflate(raw, encoding, max_bytes, ratio)

    def _multipart_images(self, request: Request, body: bytes, max_files: int) -> list[bytes]:
        """The `file` parts of a multipart body (<= max_files, each image/* or untyped)."""
        content_type = request.headers.get("content-type", "")
        parts = [p for p in parse_multipart(body, content_type, max_parts=max_files + 8) if p.name == "file"]
        if not parts:
            raise ServiceError("missing_file", "the multipart body has no part named `file`")
        if len(parts) > max_files:
            raise ServiceError("too_many_files", f"{len(parts)} files in one request; the limit is {max_files}")
        for p in parts:
            if p.content_type and not _is_image_type(_media_type(p.content_type)):
                raise ServiceError("unsupported_media_type", f"part Content-Type {p.content_type!r} is not an image")
        return [p.data for p in parts]

    def _check_image_header(self, data: bytes, size: int | None) -> None:
        """Refuse what the header alone condemns, before any replica decodes anything.

        `app.preprocess.check_header`, the Preprocessor's own first step: empty or unrecognised
        bytes, pixel bombs, decode-budget bombs (Limits.max_decode_bytes), TIFFs OpenCV decodes
        wrongly. `size`: the model's input size (a JPEG far larger is decoded reduced, which costs
        less); None while it is not known yet: the estimate is then a full decode's, never lower.
        """
        info, _ = check_header(data, self.limits.max_pixels, size, self.limits.max_decode_bytes)
        self.metrics.input_pixels.observe(info.pixels)

    # -- the chain ----------------------------------------------------------------------

    async def _model_spec(self, variant: str) -> dict[str, Any]:
        """The model's input spec, read from the Classifier's session once, never assumed."""
        if variant not in self._specs:
            info = await self._call(self.classifiers[variant].describe.remote(), 10.0)
            self._specs[variant] = info["input"]
        return self._specs[variant]

    async def _input_size(self, variant: str) -> int:
        return int((await self._model_spec(variant))["size"][0])

    def _known_size(self, variant: str) -> int | None:
        """The variant's input size if its spec is known already (no call: the header check must not wait)."""
        spec = self._specs.get(variant)
        return int(spec["size"][0]) if spec else None

    def _choose(self, request: Request, pinned: str | None = None) -> Choice:
        assert self.cfg is not None and self.split is not None
        if pinned is not None:
            return Choice(pinned, "model")
        cfg = self.cfg
        return choose_variant(
            self.split,
            self.classifiers,
            request.headers.get(cfg.sticky_header),
            request.headers.get(cfg.override_header),
            cfg.allow_override,
            self.rng,
        )

    async def _infer(
        self,
        request: Request,
        method: str,
        payload: Any,
        top_k: int,
        t0: float,
        choice: Choice | None = None,
        full: bool = False,
    ) -> tuple[Scores, str, bool, DeploymentResponse | None]:
        choice = choice or self._choose(request)
        return await self._infer_choice(choice, method, payload, top_k, t0, full)

    async def _infer_choice(
        self, choice: Choice, method: str, payload: Any, top_k: int, t0: float, full: bool = False
    ) -> tuple[Scores, str, bool, DeploymentResponse | None]:
        """Run the chain on the chosen variant; on a replica failure retry once, elsewhere when possible.

        "Elsewhere" is the next healthy variant when failover is on, else the same variant
        (Serve routes the retry to another replica, or to the replacement). A variant known
        to be down is skipped without waiting for it.
        """
        assert self.cfg is not None and self.split is not None
        deadline = t0 + self.cfg.inference_timeout_s
        if self.health.down_until:  # only after a failure: a handle that lost every replica is down now
            self.health.set_routable({v: _routable_replicas(h) for v, h in self.classifiers.items()})
        order = candidates(choice, self.variants, self.split, self.cfg.failover, self.health, time.monotonic())
        if not order:
            err = ServiceError("variant_unavailable", f"variant {choice.variant} has no healthy replica; retry shortly")
            err.variant = choice.variant  # type: ignore[attr-defined]
            raise err
        tries = order if len(order) > 1 else order * 2  # one retry: elsewhere if we can, else the same again
        failure: BaseException | None = None
        for n, variant in enumerate(tries[:2]):
            if n and time.perf_counter() >= deadline:
                break
            # With somewhere else to go, a call still waiting when its variant fails is abandoned at once:
            # after a replica dies, Serve holds new calls until a replacement starts (seconds).
            abort = self._failures[variant] if n == 0 and tries[1] != variant else None
            try:
                scores, pixels = await self._chain(variant, method, payload, top_k, deadline, full, abort)
                return scores, choice.reason, variant != choice.variant, pixels
            except _REPLICA_FAILURES as e:
                self._mark_failed(variant)
                logger.warning(
                    "Classifier_%s or the Preprocessor failed mid-request (%s)%s",
                    variant,
                    type(e).__name__,
                    "; retrying once" if n == 0 else "",
                )
                failure = e
            except ServiceError as e:
                e.variant = variant  # type: ignore[attr-defined]
                raise
        unavailable = isinstance(failure, DeploymentUnavailableError)
        err = ServiceError(
            "variant_unavailable" if unavailable else "replica_failed",
            f"Classifier_{choice.variant} or the Preprocessor failed ({type(failure).__name__}) and the retry too",
        )
        err.variant = choice.variant  # type: ignore[attr-defined]
        raise err

    def _mark_failed(self, variant: str) -> None:
        self.health.mark_failed(variant, time.monotonic())
        self._failures.pop(variant).set()  # wakes every call waiting on this variant; the next gets a new event
        self._ensure_health_poller()

    def _ensure_health_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_health())
            self._poller.add_done_callback(lambda _t: self.health.set_running({}))

    async def _poll_health(self) -> None:
        """Once a second, how many RUNNING replicas each Classifier has, from the Serve controller.

        Only while it matters: from a failure seen on the request path until every variant
        has replicas again and 30 s have passed without a failure (the poll costs the
        controller CPU that an idle 2-core machine should not spend).
        """
        try:
            app_name = serve.get_replica_context().app_name
        except Exception:
            return
        while self.health.recently_troubled(time.monotonic(), quiet_s=30.0):
            try:
                status = await asyncio.to_thread(serve.status)
                deployments = status.applications[app_name].deployments
                self.health.set_running(
                    {
                        v: int(deployments[f"Classifier_{v}"].replica_states.get(ReplicaState.RUNNING, 0))
                        for v in self.variants
                        if f"Classifier_{v}" in deployments
                    }
                )
            except Exception as e:  # the controller restarting must not take the Router down
                logger.debug("health poll failed: %s", e)
            await asyncio.sleep(1.0)

    async def _chain(
        self,
        variant: str,
        method: str,
        payload: Any,
        top_k: int,
        deadline: float,
        full: bool = False,
        abort: asyncio.Event | None = None,
    ) -> tuple[Scores, DeploymentResponse | None]:
        """Preprocessor -> Classifier, or (method "pixels") pixels straight to the Classifier."""
        handle = self.classifiers[variant]

        def gone() -> bool:
            return _routable_replicas(handle) == 0

        if method == "pixels":
            scores = handle.remote(payload, max(top_k, SHADOW_TOP_K), full)
            return await self._call(scores, deadline - time.perf_counter(), abort=abort, gone=gone), None
        size = await self._input_size(variant)
        # The Preprocessor gets the deadline as wall-clock time: perf_counter means nothing in another process.
        pixels: DeploymentResponse = getattr(self.preprocessor, method).remote(payload, size, wall_deadline(deadline))
        # The DeploymentResponse goes straight into the Classifier call: Serve resolves it there.
        scores = handle.remote(pixels, max(top_k, SHADOW_TOP_K), full)
        return await self._call(scores, deadline - time.perf_counter(), pixels, abort=abort, gone=gone), pixels

    async def _call(
        self,
        response: Any,
        timeout_s: float,
        *upstream: Any,
        abort: asyncio.Event | None = None,
        gone: Callable[[], bool] | None = None,
    ) -> Any:
        """Await a downstream call with a deadline, turning Ray's failures into ServiceErrors.

        With `abort`, the call is abandoned (a replica failure, so the caller retries elsewhere) when
        the event is set or `gone()` says the handle has no replica left, checked every 100 ms.
        """

        async def wait() -> Any:
            if abort is None:
                return await response
            answer = asyncio.ensure_future(_await(response))
            aborted = asyncio.ensure_future(abort.wait())
            try:
                while True:
                    # Serve may re-queue a call whose replica died without failing it; then it waits
                    # for a replacement. Asking the handle too catches that.
                    await asyncio.wait((answer, aborted), timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
                    if answer.done():
                        return answer.result()
                    if abort.is_set() or (gone is not None and gone()):
                        answer.cancel()
                        raise _VariantFailed("the variant lost its replicas while this call was waiting")
            finally:
                aborted.cancel()

        try:
            return await asyncio.wait_for(wait(), timeout=max(timeout_s, 0.001))
        except asyncio.TimeoutError:
            for r in (response, *upstream):
                r.cancel()
            raise ServiceError("inference_timeout", deadline_message(timeout_s)) from None
        except BackPressureError as e:
            raise ServiceError("overloaded", f"the service is at capacity ({e.message}); retry shortly") from None
        except _REPLICA_FAILURES:
            raise
        except (RequestCancelledError, TaskCancelledError, asyncio.CancelledError):
            raise
        except Exception as e:
            found = find_service_error(e)
            if found is not None:
                raise found from None
            if isinstance(getattr(e, "cause", None), _REPLICA_FAILURES):
                raise e.cause from e  # type: ignore[attr-defined]
            raise
