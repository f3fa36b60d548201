"""Everything this app reads from Ray Serve that its public API does not give: the one place it is done.

Each use names the Ray version it was read from (2.60) and is read defensively: a change in
Serve's internals gives "unknown" (None), never a failing request.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve._private.common import ReplicaState  # Ray 2.60: the RUNNING state in serve.status()


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
