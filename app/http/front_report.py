"""What a Router knows of the admission front before it (app/front/): never silent about whether it is there.

Each request that came through the front carries X-App-Front (set by HAProxy, replacing any a client sent): the
HAProxy's host and its limits. The Router keeps, per HAProxy host, the limits last seen and when, counts the
requests that came without it (direct to a replica, gRPC, or through an HAProxy whose front failed open), and
compares the limits with its own config's `args.front`: /v1/models shows it, `app_admission_front_active` says
it per HAProxy, and a front whose limits differ from the config is logged once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

from app.front.haproxy_config import Front, parse_header

logger = logging.getLogger("ray.serve")
STALE_S = 60.0  # an HAProxy not seen for this long is reported inactive


class FrontReport:
    def __init__(self, configured: Front) -> None:
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
