"""The command line of a Serve peer: its application on a private, local Ray instance until SIGINT/SIGTERM, then
both torn down. `address="local"` always starts a new Ray instance owned by this process, so a benchmark never
deploys into (or shuts down) a cluster someone else is using on the same machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Callable

from ray import serve
from ray.serve.deployment import Application


def serve_main(doc: str, port: int, name: str, bind: Callable[[str], Application]) -> None:
    """Parse --port and --device, then serve `bind(device)` on 127.0.0.1:port until signalled."""
    import ray

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto", help="for a classifier")
    args = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False)
    try:
        http = {"host": "127.0.0.1", "port": args.port}
        serve.start(http_options=http, logging_config={"enable_access_log": False})
        serve.run(bind(args.device), name=name, route_prefix="/", blocking=False)
        print(f"serving {name} on http://127.0.0.1:{args.port}/ (Ctrl-C stops)", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
