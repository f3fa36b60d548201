"""Run one Serve application on a private, local Ray instance until SIGINT/SIGTERM, then tear both down.

`address="local"` always starts a new Ray instance owned by this process, so a benchmark never deploys into
(or shuts down) a cluster someone else is using on the same machine.
"""

from __future__ import annotations

import os
import signal
import threading

from ray import serve
from ray.serve.deployment import Application


def serve_until_signalled(app: Application, port: int, num_cpus: float | None = None, name: str = "default") -> None:
    import ray

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
        serve.run(app, name=name, route_prefix="/", blocking=False)
        print(f"serving {name} on http://127.0.0.1:{port}/ (Ctrl-C stops)", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
