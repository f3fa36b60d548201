"""benchmarks/where.py's pure parts: naming processes by role, py-spy's stacks by package, the tables. No Ray."""

from __future__ import annotations

from pathlib import Path

from benchmarks.where import by_package, package, role, to_markdown


def test_processes_are_named_by_their_role() -> None:
    assert role(("ray::ServeReplica:classifier:Classifier_fp32",)) == "Classifier_fp32"
    assert role(("ray::ServeController",)) == "Serve controller"
    assert role(("ray::HAProxyManager",)) == "ray::HAProxyManager"  # other Ray actors by their own title
    assert role(("/venv/lib/ray/core/src/ray/raylet/raylet", "--node-ip-address=x")) == "raylet"
    assert role(("/opt/tritonserver/backends/python/triton_python_backend_stub", "m")) == "Triton Python stubs"
    assert role(("/opt/tritonserver/bin/tritonserver", "--model-repository=x")) == "tritonserver"
    assert role(("python", "-m", "benchmarks.baselines.triton_peer")).startswith("the started process")


def test_py_spy_stacks_are_shared_out_by_the_innermost_frames_package(tmp_path: Path) -> None:
    raw = tmp_path / "Router.txt"
    raw.write_text(
        "Thread.run (threading.py:982);Ingress.__call__ (app/http/ingress.py:146) 6\n"
        "Thread.run (threading.py:982);call_asgi (ray/serve/_private/replica.py:3309);"
        "V2.dispatch (app/http/v2.py:56);dumps (ray/serve/_private/serialization.py:9) 3\n"
        "Thread.run (threading.py:982) 1\n"
    )
    got = by_package(raw)
    assert got["self"] == {"app (ours)": 0.6, "Ray Serve": 0.3, "asyncio and threads": 0.1}
    assert got["under"]["app (ours)"] == 0.9 and got["under"]["asyncio and threads"] == 1.0
    assert got["samples"] == {"n": 10.0}
    assert package("x (/usr/lib/python3.11/site-packages/grpc/aio/_call.py:1)") == "gRPC"
    assert by_package(tmp_path / "missing.txt") == {}


def test_the_markdown_has_every_role_a_total_and_the_spied_replicas() -> None:
    spied = {"self": {"app (ours)": 0.5, "gRPC": 0.5}, "under": {}, "samples": {"n": 40.0}}
    step = {
        "images_per_s": 50.0,
        "cpu_ms_per_image_by_role": {"Router": 3.0, "HAProxy": 0.5},
        "py_spy_by_package": {"Router": spied, "ABLedger": {**spied, "samples": {"n": 2.0}}},
    }
    result = {"workload": "v2", "concurrency": 32, "env": {}, "targets": [{"name": "app", "steps": [step]}]}
    md = to_markdown(result)
    assert "| Router | 3.0 |" in md and "| **all** | 3.5 |" in md and "| images/s | 50.0 |" in md
    assert "| Router | 40 | 50% |" in md and "ABLedger | 2" not in md  # too few samples to say anything
