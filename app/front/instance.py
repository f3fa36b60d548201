"""One Serve instance's environment on this machine: `private_serve_env` makes configs/serve.env private to the
instance on one HTTP port (its own replica port ranges, fallback proxy ports, HAProxy files and ports) and hands the
admission front its limits; `private_haproxy_env` is the HAProxy part. `make serve`, the tests and the benchmarks
start Serve with it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml

from app.config import SERVE_ENV, read_serve_env
from app.front import config_env, real_haproxy, with_front


def private_haproxy_env(port: int) -> dict[str, str]:
    """HAProxy's files and its own stats/metrics ports for one Serve instance on this machine.

    They default to fixed values (/tmp/haproxy-serve, 8404, 9101), so two HAProxy-fronted Serve
    instances at once (a test session beside `make serve`, a benchmark target beside a soak) would
    fight over them. Files go to a fresh short directory under /tmp (HAProxy puts its admin socket
    in a 56-character subdirectory and refuses socket paths over 97 bytes); stats and metrics to
    port+91 and port+92 of the instance's HTTP port.
    """
    hap = Path(tempfile.mkdtemp(prefix="hap-", dir="/tmp"))
    return {
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(hap / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(hap / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(hap),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(hap / "server-state"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(port + 91),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(port + 92),
    }


def private_serve_env(
    port: int, env: dict[str, str] | None = None, front: bool = True, config: dict[str, Any] | None = None
) -> dict[str, str]:
    """`env` (default: configs/serve.env) made private to the Serve instance on HTTP port `port`.

    Replicas' own HTTP (direct ingress) and gRPC ports come from fixed ranges (30000-31000,
    40000-41000) and are bound with SO_REUSEPORT, so a second Serve instance on this machine (a test
    session beside `make serve`, or a Ray cluster left running) binds the same ports and the kernel
    splits one instance's traffic between both: half the requests answered by the other app. Each
    instance therefore gets its own ranges, derived from its port (HTTP port+20000 .. +20, gRPC
    port+21000 .. +50; instances whose ports are 50 or more apart never overlap), its own fallback
    proxy ports (port+93, +94), and, when the
    environment turns HAProxy on, its own HAProxy files and ports (`private_haproxy_env`) and, unless
    `front` is False (the benchmarks' Serve peers, as Ray ships them), the admission front
    (`app.front.with_front`) with the limits of `config`'s args.front (default: configs/local.yaml's) as
    APP_FRONT_* variables.
    """
    out = read_serve_env() if env is None else dict(env)
    out.update(
        {
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port + 20000),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 20020),
            "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(port + 21000),
            "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(port + 21050),
            # With HAProxy, Serve keeps a fallback proxy (127.0.0.1:8500 / 9500 by default, SO_REUSEPORT) for
            # when no Router is up: shared, it let another instance answer this one's requests while starting.
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(port + 93),
            "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(port + 94),
        }
    )
    if out.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        out.update(private_haproxy_env(port))
        if not front:  # HAProxy itself, even where the caller's environment names the front
            out["RAY_SERVE_HAPROXY_BINARY_PATH"] = real_haproxy()
        else:  # the front's limits: the config's args.front, under any the caller set itself
            served = config if config is not None else yaml.safe_load((SERVE_ENV.parent / "local.yaml").read_text())
            out = {**config_env(served), **out}
    return with_front(out) if front else out
