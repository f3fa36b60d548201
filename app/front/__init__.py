"""The admission front: HAProxy (C) holds and refuses the requests the Routers cannot take, before any Python.

Serve 2.60 renders HAProxy's config itself and offers no setting for a per-server `maxconn`, a `timeout queue`,
buffering a request whole, a per-client bound or a refusal rule; it does let the operator name the HAProxy binary.
`app-haproxy` (`haproxy.main`) is that binary: it adds the front to Serve's config (`haproxy_config`) and execs
HAProxy. Its limits are the app config's `args.front`, handed to Serve's processes as APP_FRONT_* variables
(`limits`; `python -m app.front env CONFIG` prints them; `instance` makes a whole Serve environment). Each Router
compares what its requests' X-App-Front header says with its own config and says so in /v1/models; without the front
their own admission stays the line.
"""

from app.front.haproxy import SERVE_COPY, front_binary, main, real_haproxy, rewrite, with_front
from app.front.haproxy_config import MARK, V1_BODY, V2_BODY, Front, Unrecognised, admit, http_backends
from app.front.limits import VARIABLES, config_env, declared, env_of, from_env

__all__ = [
    "MARK",
    "SERVE_COPY",
    "V1_BODY",
    "V2_BODY",
    "VARIABLES",
    "Front",
    "Unrecognised",
    "admit",
    "config_env",
    "declared",
    "env_of",
    "from_env",
    "front_binary",
    "http_backends",
    "main",
    "real_haproxy",
    "rewrite",
    "with_front",
]
