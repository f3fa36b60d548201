"""`configs/serve.env`: its reader (`read_serve_env`, `parse_serve_env`). What makes it private to one Serve instance
on this machine (its own ports and HAProxy files, and the admission front's limits) is `app.front.instance`."""

from __future__ import annotations

import re
from pathlib import Path

# The environment of every Ray process that runs Serve (docs/performance.md). Read by `make serve`,
# the benchmarks, the tests and the RayService renderer, so the laptop, CI and Kubernetes agree.
SERVE_ENV = Path(__file__).resolve().parents[2] / "configs" / "serve.env"
_ENV_LINE = re.compile(r"([A-Z_][A-Z0-9_]*)=([^\s'\"#]*)")


def read_serve_env(path: Path = SERVE_ENV) -> dict[str, str]:
    """KEY=VALUE lines (blank lines and `#` comments skipped); anything else is an error naming the line.

    Deliberately narrower than a shell or dotenv file: no quotes, spaces, expansion or `export`, so
    `make` (`set -a; . file`), Python and the Kubernetes manifest all read the same values.
    """
    return parse_serve_env(Path(path).read_text(), str(path))


def parse_serve_env(text: str, source: str) -> dict[str, str]:
    """`read_serve_env` on text already read; errors name `source` and the line."""
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _ENV_LINE.fullmatch(line)
        if m is None:
            raise ValueError(f"{source}:{number}: expected KEY=VALUE (no quotes or spaces), got {raw!r}")
        if m[1] in env:
            raise ValueError(f"{source}:{number}: {m[1]} is set twice")
        if m[1].startswith("APP_FRONT_"):
            raise ValueError(
                f"{source}:{number}: {m[1]} is the admission front's, set in the app config (args.front), from which "
                "`make serve`, the tests and the RayService renderer hand it to HAProxy"
            )
        env[m[1]] = m[2]
    return env
