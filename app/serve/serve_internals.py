"""Everything this app, its tests and its benchmarks take from Ray that Ray's public API does not give: the one place
it is done (import-linter's private-API contract and tests/test_layering.py hold everything else to the public API).

Each use names the Ray version it was read from (2.60). What the serving code reads is read defensively: a change in
Serve's internals gives "unknown" (None), never a failing request. What the tests and benchmarks use (the controller
client, a handle's router thread, Serve's HAProxy renderer) fails loudly instead: they must notice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve._private.common import ReplicaState  # Ray 2.60: the RUNNING state in serve.status()

from app.protocol.v2.pb import SERVICER


def replica_id() -> str:
    """This replica's id (public API), or "local" outside a replica."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a replica (unit use)
        return "local"


def max_ongoing_requests() -> int | None:
    """This replica's max_ongoing_requests (private: ReplicaContext._deployment_config, Ray 2.60), or None."""
    try:
        return int(serve.get_replica_context()._deployment_config.max_ongoing_requests)
    except Exception:
        return None


def request_id() -> str:
    """Serve's id of the request being handled (private: serve.context._get_serve_request_context, Ray 2.60)."""
    try:
        return str(serve.context._get_serve_request_context().request_id or "")
    except Exception:
        return ""


def routable_replicas(handle: Any) -> int | None:
    """How many replicas this process's handle can route to right now, or None if unknown.

    Serve drops a replica from a handle the moment a call to it fails with the actor dead,
    long before the controller's next health check: the quickest "this variant is down" signal.
    Private: handle._router._asyncio_router._request_router.curr_replicas (Ray 2.60).
    """
    router = getattr(getattr(handle, "_router", None), "_asyncio_router", None)
    request_router = getattr(router, "_request_router", None)
    try:
        return None if request_router is None else len(request_router.curr_replicas)
    except (AttributeError, TypeError):
        return None


def running_replicas(deployments: dict[str, str]) -> dict[str, int] | None:
    """RUNNING replicas per key of `deployments` (key -> deployment name in this replica's app), from the
    controller (serve.status, public; ReplicaState is private in Ray 2.60). None outside a replica."""
    try:
        app_name = serve.get_replica_context().app_name
    except Exception:
        return None
    found = serve.status().applications[app_name].deployments
    return {
        key: int(found[name].replica_states.get(ReplicaState.RUNNING, 0))
        for key, name in deployments.items()
        if name in found
    }


def kv_get(key: bytes, namespace: str) -> bytes | None:
    """A value in Ray's internal KV store (the GCS's, in Redis with fault tolerance): private
    (ray.experimental.internal_kv, Ray 2.60), the only durable store a Serve app has without one of its own."""
    from ray.experimental.internal_kv import _internal_kv_get

    value = _internal_kv_get(key, namespace=namespace)
    return None if value is None else bytes(value)


def kv_put(key: bytes, value: bytes, namespace: str) -> None:
    """Set (overwrite) a value in Ray's internal KV store (private, as kv_get)."""
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(key, value, True, namespace=namespace)


def serve_client() -> Any:
    """The driver's client of the running Serve controller (ServeControllerClient), as serve.start() left it, else
    found by name. Private: ray.serve.context._get_global_client (Ray 2.60). What the tests and benchmarks call on it,
    deploy_apps (a whole config, as `serve deploy` sends it) and get_serve_details (the configs deployed), has no
    public Python API: only the dashboard's REST API, which they run without."""
    from ray.serve.context import _get_global_client

    return _get_global_client()


def init_handle_on_router_thread(handle: Any) -> None:
    """Initialise a handle not yet used so that its router runs on Serve's own thread and loop: what a synchronous
    caller (a test) needs when RAY_SERVE_THROUGHPUT_OPTIMIZED would run it on the caller's event loop, which it lacks.
    Private: DeploymentHandle._init(_run_router_in_separate_loop=True) (Ray 2.60); handle.options() does not take it
    and RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP is read once, for every handle of the process."""
    handle._init(_run_router_in_separate_loop=True)


@dataclass(frozen=True)
class HAProxyBackend:
    """One backend of Serve's HAProxy config: an application's Routers as (server name, host, port)."""

    name: str
    path_prefix: str
    app_name: str
    servers: list[tuple[str, str, int]]
    fallback: tuple[str, str, int] | None = None
    grpc: bool = False


def render_haproxy_config(directory: Path, host: str, ports: dict[str, int], backends: list[HAProxyBackend]) -> str:
    """The haproxy.cfg Serve writes (into `directory`, with its socket and server-state files) for `backends`, as once
    its controller has sent routes and servers, without the per-request metrics log; `ports`: http, grpc, stats,
    metrics. Plain Python: no Ray is started. Private: ray.serve._private.haproxy (HAProxyConfig, HAProxyApi and its
    _generate_config_file_internal, Ray 2.60): Serve's HAProxy mode has no public renderer."""
    from ray.serve._private.common import RequestProtocol
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig

    cfg = HAProxyConfig(
        socket_path=str(directory / "admin.sock"),
        server_state_base=str(directory),
        server_state_file=str(directory / "server-state"),
        stats_port=ports["stats"],
        metrics_port=ports["metrics"],
        metrics_enabled=False,  # else HAProxy logs every request to Serve's shared metrics socket
        has_received_routes=True,  # as once Serve's controller has sent them: /-/healthz then answers 200
        has_received_servers=True,
    )
    cfg.http_options.host, cfg.http_options.port = host, ports["http"]
    cfg.grpc_options.port = ports["grpc"]
    cfg.grpc_options.grpc_servicer_functions = [SERVICER]  # as configs/ name it; a non-empty list turns gRPC on
    configs = {
        b.name: BackendConfig(
            b.name,
            b.path_prefix,
            servers=[ServerConfig(*s) for s in b.servers],
            fallback_server=None if b.fallback is None else ServerConfig(*b.fallback),
            app_name=b.app_name,
            protocol=RequestProtocol.GRPC if b.grpc else RequestProtocol.HTTP,
        )
        for b in backends
    }
    HAProxyApi(cfg, configs, config_file_path=str(directory / "haproxy.cfg"))._generate_config_file_internal()
    return (directory / "haproxy.cfg").read_text()


def haproxy_maxconn() -> int:
    """HAProxy's global maxconn as Serve renders it (RAY_SERVE_HAPROXY_MAXCONN, with Serve's default). Private:
    ray.serve._private.constants (Ray 2.60)."""
    from ray.serve._private.constants import RAY_SERVE_HAPROXY_MAXCONN

    return int(RAY_SERVE_HAPROXY_MAXCONN)


def tracing_enabled() -> bool:
    """Whether Serve set tracing up in this process (private: ray.serve._private.tracing_utils.is_tracing_enabled,
    Ray 2.60; its replicas set it up before the deployment's constructor runs). False if that cannot be read."""
    try:
        from ray.serve._private.tracing_utils import is_tracing_enabled

        return bool(is_tracing_enabled())
    except Exception:
        return False
