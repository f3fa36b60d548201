"""One process-wide gate between CUDA graph captures and every other GPU call of the process.

ONNX Runtime captures a CUDA graph in CUDA's global capture mode (onnxruntime core/providers/cuda/cuda_graph.cc:
cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal)). While one thread captures, any other thread of the
same process that synchronises a stream or allocates device memory is refused (cudaErrorStreamCaptureUnsupported,
"operation not permitted when stream is capturing") and the capture is invalidated with it: seen on an H200 with two
sessions capturing from two threads (../shared/gpu-2026-12-04/probe3.log). Every GPU run of this process holds the
gate shared; a capture holds it alone, waiting for the runs in flight to finish and holding new ones back until it
is done. Other processes (the other variant's replica on the same GPU) have their own CUDA context: not affected.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class CaptureGate:
    """A readers-writer lock that prefers the writer: a capture waiting keeps new runs out, so it is never starved
    by a steady stream of batches."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._capturing = False
        self._waiting_captures = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._capturing or self._waiting_captures:
                self._cond.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                if not self._running:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting_captures += 1
            while self._capturing or self._running:
                self._cond.wait()
            self._waiting_captures -= 1
            self._capturing = True
        try:
            yield
        finally:
            with self._cond:
                self._capturing = False
                self._cond.notify_all()

    def state(self) -> dict[str, int | bool]:
        with self._cond:
            return {"running": self._running, "capturing": self._capturing, "waiting_captures": self._waiting_captures}


GATE = CaptureGate()
