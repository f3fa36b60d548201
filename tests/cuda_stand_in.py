"""A GPU node without TensorRT, stood in inside Ray workers where no CUDA device can exist (this CI machine).

`sitecustomize` (SITECUSTOMIZE, written by the test into a folder that its application's runtime_env puts first on
PYTHONPATH) calls `setup` when each of that application's workers starts, before the worker imports anything of the
app's: ONNX Runtime's CUDA EP then counts as usable, and every engine the server would build on it is built on the
CPU EP from the same file. (Ray's `worker_process_setup_hook` applies to a job's workers, not to an application's
actors.) TensorRT's absence is this machine's own (its libraries are not here), so what the app reports about it
is what a stock Ray GPU image would make it report. Used by tests/test_fallback_served.py only.
"""

from __future__ import annotations

from typing import Any

SITECUSTOMIZE = "from tests.cuda_stand_in import setup\n\nsetup()\n"


def setup() -> None:
    from app.runtime import select
    from app.runtime.ort_engine import OrtEngine
    from app.runtime.plan import CPU, CUDA, cpu_choice

    real_build = select.build
    select.usable_providers = lambda: [CUDA, CPU]  # type: ignore[assignment]

    def build(path: str, opts: Any, choice: Any) -> Any:
        if choice.engine == "openvino":
            return real_build(path, opts, choice)
        return OrtEngine(path, opts, cpu_choice())  # the CUDA device, stood in by the CPU EP

    select.build = build  # type: ignore[assignment]
