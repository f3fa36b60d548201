"""What a Router knows of the ingress before it: never silent about which it is, nor about the admission front.

At start (`ingress_of`, `serve_env_state`, logged once, in /v1/models as `ingress`): which ingress Serve runs, read
from this process's environment, which is its node's (`ray start`'s; Ray copies no variable between nodes): HAProxy
with the admission front (`app-haproxy`: `haproxy+admission-front`), plain HAProxy (`haproxy`), or Serve's Python
proxy (`serve-python-proxy`, Ray's default: a cluster started without configs/serve.env); and which of serve.env's
settings are in force, missing, or set otherwise. Serve's controller decides HAProxy or its Python proxy from the
head node's environment and each node's proxy finds its HAProxy binary in its own: the report is exact when every
node was started with the same environment (docs/operating.md "A Ray cluster of your own", the RayService's Pods),
and a Router on a node started otherwise says so. The file is configs/serve.env, or `APP_SERVE_ENV_FILE` where the
app is installed without the repository (the image sets it to its copy).

Each request that came through the front carries X-App-Front (set by HAProxy, replacing any a client sent): the
HAProxy's host and its limits. The Router keeps, per HAProxy host, the limits last seen and when, counts the
requests that came without it (direct to a replica, gRPC, or through an HAProxy whose front failed open), and
compares the limits with its own config's `args.front`: /v1/models shows it, `app_admission_front_active` says
it per HAProxy, and a front whose limits differ from the config is logged once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.config import SERVE_ENV, read_serve_env
from app.front.haproxy_config import Front, parse_header

logger = logging.getLogger("ray.serve")
SERVE_ENV_FILE = "APP_SERVE_ENV_FILE"  # where serve.env is, for an install without the repository's configs/
STALE_S = 60.0  # an HAProxy not seen for this long is reported inactive
FRONT_BINARY = "app-haproxy"  # the admission front's script (pyproject's [project.scripts])


def ingress_of(environ: Mapping[str, str]) -> str:
    """The ingress Serve runs in a cluster whose processes have this environment."""
    if environ.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
        return "serve-python-proxy"
    binary = environ.get("RAY_SERVE_HAPROXY_BINARY_PATH", "")
    return "haproxy+admission-front" if Path(binary).name == FRONT_BINARY else "haproxy"


def serve_env_state(environ: Mapping[str, str], path: Path = SERVE_ENV) -> dict[str, Any]:
    """configs/serve.env against this environment: its settings in force, missing, and set to another value."""
    try:
        wanted = read_serve_env(path)
    except OSError as e:  # an install without the repository's configs/ (the RayService sets it from the Pod spec)
        return {"file": str(path), "read": False, "error": str(e), "in_force": [], "missing": [], "differs": {}}
    return {
        "file": str(path),
        "read": True,
        "in_force": sorted(k for k, v in wanted.items() if environ.get(k) == v),
        "missing": sorted(k for k in wanted if k not in environ),
        "differs": {
            k: {"serve_env": v, "set": environ[k]} for k, v in sorted(wanted.items()) if environ.get(k, v) != v
        },
    }


class FrontReport:
    def __init__(
        self, configured: Front, environ: Mapping[str, str] = os.environ, serve_env: Path | None = None
    ) -> None:
        serve_env = serve_env or Path(environ.get(SERVE_ENV_FILE) or SERVE_ENV)
        self.ingress: dict[str, Any] = {"runs": ingress_of(environ), "serve_env": serve_env_state(environ, serve_env)}
        self._log_ingress()
        self.configured = {k: str(v) for k, v in asdict(configured).items() if k != "retry_after_s"}
        self.haproxies: dict[str, tuple[dict[str, str], float]] = {}  # host -> (limits, last seen, monotonic)
        self.without = 0  # requests that came without the header
        self._reported = 0  # of them, those already handed to the metrics (unreported())
        self._last_raw: str | None = None
        self._last_host = ""
        self._warned: set[str] = set()

    def saw(self, raw: str | None) -> None:
        """One request's X-App-Front (None: it had none). Cheap when the value is the last one again."""
        if raw is None:
            self.without += 1
            return
        now = time.monotonic()
        if raw == self._last_raw:
            limits, _ = self.haproxies[self._last_host]
            self.haproxies[self._last_host] = (limits, now)
            return
        parsed = parse_header(raw)
        if not parsed:
            self.without += 1  # not the front's value: as good as none
            return
        host = parsed.pop("host")
        self.haproxies[host] = (parsed, now)
        self._last_raw, self._last_host = raw, host
        differs = self.differences(parsed)
        if differs and host not in self._warned:
            self._warned.add(host)
            logger.warning(
                "the admission front on %s runs %s, this app's config (args.front) says %s: hand Serve's processes "
                "`python -m app.front env CONFIG` (make serve and the RayService do)",
                host,
                {k: parsed.get(k) for k in differs},
                {k: self.configured[k] for k in differs},
            )

    def _log_ingress(self) -> None:
        runs, env = self.ingress["runs"], self.ingress["serve_env"]
        if not env["read"]:
            logger.warning(
                "ingress: %s; %s not read (%s), so its settings are not checked: set %s to its path",
                runs,
                env["file"],
                env["error"],
                SERVE_ENV_FILE,
            )
        elif env["missing"] or env["differs"]:
            logger.warning(
                "ingress: %s; of %s, %d settings are in force, %s missing%s: start every Ray node with it in its "
                'environment (docs/operating.md "A Ray cluster of your own")',
                runs,
                env["file"],
                len(env["in_force"]),
                ", ".join(env["missing"]) or "none",
                f", set otherwise: {env['differs']}" if env["differs"] else "",
            )
        else:
            logger.info("ingress: %s; every setting of %s is in force", runs, env["file"])

    def unreported(self) -> int:
        """Requests without the front since the last call (the metric's increment)."""
        new, self._reported = self.without - self._reported, self.without
        return new

    def differences(self, limits: dict[str, str]) -> list[str]:
        return sorted(k for k, v in self.configured.items() if _norm(limits.get(k)) != _norm(v))

    def active(self) -> dict[str, bool]:
        """HAProxy host -> whether its front was seen within STALE_S."""
        now = time.monotonic()
        return {host: now - seen < STALE_S for host, (_, seen) in self.haproxies.items()}

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "in_place": any(self.active().values()),
            "configured": self.configured,
            "haproxies": {
                host: {
                    "active": now - seen < STALE_S,
                    "last_seen_s_ago": round(now - seen, 1),
                    "limits": limits,
                    "differs_from_config": self.differences(limits),
                }
                for host, (limits, seen) in sorted(self.haproxies.items())
            },
            "requests_without_front": self.without,
        }


def _norm(value: str | None) -> str | None:
    """A limit as text, so that 4 and 4.0 compare equal."""
    if value is None:
        return None
    try:
        return repr(float(value))
    except ValueError:
        return value
