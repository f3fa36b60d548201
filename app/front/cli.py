"""`python -m app.front env CONFIG [APPLICATION]` (the front's variables from a config) and `status URL` (whether the
front is in place before the app at URL); its face is `app.front.__main__`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import yaml

from app.front import config_env


def print_env(argv: list[str]) -> int:
    """`python -m app.front env CONFIG [APP]`: the APP_FRONT_* lines of a Serve config's args.front, for a shell
    (`set -a; eval "$(python -m app.front env configs/local.yaml)"`) or a Pod's environment."""
    if not argv:
        print("usage: python -m app.front env CONFIG.yaml [APPLICATION]", file=sys.stderr)
        return 2
    try:
        env = config_env(yaml.safe_load(Path(argv[0]).read_text()), argv[1] if len(argv) > 1 else None)
    except (OSError, ValueError) as e:
        print(f"{argv[0]}: {e}", file=sys.stderr)
        return 2
    for key, value in env.items():
        print(f"{key}={value}")
    return 0


def print_status(url: str, wait_s: float = 600) -> int:
    """`python -m app.front status URL`: once the app at URL is ready, one line: is the front in place, and how.

    `make serve` runs it beside `serve run`, so a front that failed open is said at start, not found later."""
    import httpx  # a test and benchmark extra: `env`, what a Pod's start runs, must not need it

    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            print(f"admission front: {url} was not ready within {wait_s:g} s", file=sys.stderr)
            return 1
        time.sleep(1)
    front = httpx.get(url + "/v1/models", timeout=10).json()["admission_front"]
    active = {h: f for h, f in front["haproxies"].items() if f["active"]}
    if not active:
        print(
            f"admission front: NOT in place: {front['requests_without_front']} requests reached the Router without it "
            "(RAY_SERVE_HAPROXY_BINARY_PATH must name app-haproxy; its reason is on HAProxy's stderr)",
            file=sys.stderr,
        )
        return 1
    for host, seen in active.items():
        limits = " ".join(f"{k}={v}" for k, v in seen["limits"].items())
        differs = f"; differs from the config in {seen['differs_from_config']}" if seen["differs_from_config"] else ""
        print(f"admission front: in place on {host}: {limits}{differs}")
    return 0


def main(argv: list[str]) -> int:
    match argv[:1]:
        case ["env"]:
            return print_env(argv[1:])
        case ["status"] if len(argv) == 2:
            return print_status(argv[1].rstrip("/"))
    print(
        "usage: python -m app.front env CONFIG.yaml [APPLICATION] | status URL  (HAProxy runs as `app-haproxy`)",
        file=sys.stderr,
    )
    return 1  # as it always has
