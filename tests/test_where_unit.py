"""benchmarks/where.py's pure parts: naming processes by role, py-spy's stacks by package, the tables; and
benchmarks/tracing_profile.py's rule for a sample that ran tracing code. No Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.where import by_package, library, main, package, perf_counts, role, to_markdown


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
        "V2.dispatch (app/http/v2_rest.py:56);dumps (ray/serve/_private/serialization.py:9) 3\n"
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


def test_perf_samples_are_shared_out_by_library() -> None:
    assert library("onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so") == "engine"
    assert library("cv2.abi3.so") == "OpenCV"
    assert library("libpython3.11.so.1.0") == library("python3.11") == "Python interpreter"
    assert library("loop.cpython-311-x86_64-linux-gnu.so") == "other Python extensions"
    assert library("cygrpc.cpython-311-x86_64-linux-gnu.so") == "gRPC"
    assert library("[kernel.kallsyms]") == "kernel" and library("libc.so.6") == "libc"
    assert library("libstdc++.so.6.0.30") == "other native code"
    report = (
        "# Samples: 1K\n#\n 74.39% ; 787 ;cv2.abi3.so   \n 11.72% ; 124 ;libpython3.11.so.1.0\n"
        " 6.71%  ; 71  ;libc.so.6\n 0.50%  ; 5   ;python3.11\n not a row\n"
    )
    assert perf_counts(report) == {"OpenCV": 787, "Python interpreter": 129, "libc": 71}


def test_the_markdown_turns_perfs_shares_into_ms_per_image() -> None:
    step = {
        "images_per_s": 50.0,
        "cpu_ms_per_image_by_role": {"Router": 4.0, "Classifier_fp32": 13.0, "HAProxy": 0.1},
        "perf_by_library": {
            "Router": {"OpenCV": 0.75, "Python interpreter": 0.25},
            "Classifier_fp32": {"engine": 1.0},
            "HAProxy": {"libc": 1.0},  # under half a millisecond per image: not worth a row
        },
    }
    result = {"workload": "v2", "concurrency": 32, "env": {}, "targets": [{"name": "app", "steps": [step]}]}
    md = to_markdown(result)
    assert "| Router | 4.0 | 0.0 | 3.0 | 0.0 | 0.0 | 0.0 | 1.0 |" in md
    assert "| Classifier_fp32 | 13.0 | 13.0 |" in md and "| HAProxy | 0.1 |" in md.split("by library")[0]
    assert "| HAProxy | 0.1 | 0.0" not in md
    assert "All processes: 17.10 CPU-ms per image: the engine 13.00, OpenCV 3.00, **the serving path 1.10**" in md


def test_perf_missing_is_refused_before_any_target_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("benchmarks.where.shutil.which", lambda name: None)
    with pytest.raises(SystemExit) as e:
        main(["--targets", "app_ortcpu", "--perf"])
    assert e.value.code == 2  # argparse's usage error: nothing was started


def test_a_sample_is_tracings_by_its_export_thread_or_its_innermost_non_stdlib_frame(tmp_path: Path) -> None:
    from benchmarks.tracing_profile import is_tracing, tracing_share

    std, site = "/root/.pyenv/versions/3.11.7/lib/python3.11", "/w/.venv/lib/python3.11/site-packages"
    thread = f"Thread.run ({std}/threading.py:982)"
    export = [thread, f"BatchProcessor.worker ({site}/opentelemetry/sdk/_shared_internal/__init__.py:162)"]
    assert is_tracing([*export, f"Session.send ({site}/requests/sessions.py:700)"])  # the export thread's post
    in_app_span = [thread, "Ingress._traced (/w/app/http/ingress.py:51)", "start (/w/app/tracing/spans.py:100)"]
    assert is_tracing([*in_app_span, f"RLock.__enter__ ({std}/threading.py:100)"])  # stdlib under tracing code
    assert is_tracing([thread, f"enter ({site}/ray/serve/_private/tracing_utils.py:110)"])
    assert not is_tracing([*in_app_span, "decode (/w/app/imaging/decode.py:10)"])  # tracing above, not innermost
    assert not is_tracing([thread, f"Replica.call ({site}/ray/serve/_private/replica.py:3309)"])
    assert not is_tracing([thread])
    raw = tmp_path / "Router.txt"
    raw.write_text(";".join([*export, f"encode ({site}/opentelemetry/x.py:1)"]) + " 3\n" + thread + " 5\n")
    assert tracing_share(raw) == (8, 3)
