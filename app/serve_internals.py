"""Serve's replica facts that its public API does not give, read defensively in one place (Ray 2.60)."""

from __future__ import annotations

from ray import serve


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
