"""Large Open Inference Protocol requests parsed in a child process, so the Router's event loop never waits on them.

Why a process and not a thread: CPython's json, base64 and numpy's list-to-array conversion run in
C holding the GIL for the whole call, so a thread that parses frees nothing. Measured on this
machine: `json.loads` of the 10 MiB `{"inputs":[[],[],...]}` of the "Hostile load" issue takes
1.7 s, and run in `asyncio.to_thread` it stalled the event loop for the same 1.7 s; one 224x224x3
UINT8 image as tritonclient JSON takes ~28 ms. (zlib releases the GIL: the Router inflates on a
thread, `app.request.body_gate`.)

`parse_request` parses inline what is cheap, a JSON part of at most INLINE_JSON_BYTES (a few ms at
worst: ~5 ms for 32 KiB of empty lists, the costliest JSON per byte), and hands the rest to a
`ParsePool`: `workers` child processes (one per Router by default), each parsing one request at a
time. At most `max_waiting` requests wait for a child (503 overloaded beyond), none past its own
deadline (503 inference_timeout). A parse whose caller stopped waiting still finishes (its size is
bounded by Limits.max_json_bytes) and its child goes back to the pool; a child that takes longer
than `hard_timeout_s`, or dies, is replaced. Each child caps its own address space at
MEMORY_LIMIT_BYTES above what it holds after start-up, so a parse that would balloon fails in the
child with 413, not with an out-of-memory kill on the node.

The protocol on a child's stdin and stdout: frames of an 8-byte little-endian length and a pickle.
Both ends are this module and the parent builds every frame the child reads (the request's bytes
travel inside as one bytes value): no pickle from a client is ever read. A child exits when its
stdin closes, i.e. when the Router's process ends.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import pickle
import struct
import sys
from pathlib import Path
from typing import IO, Any

from app.config import Limits
from app.errors import ServiceError
from app.protocol import v2

logger = logging.getLogger("ray.serve")

INLINE_JSON_BYTES = 32 * 1024
MEMORY_LIMIT_BYTES = 1 << 30
_FRAME = struct.Struct("<Q")
_PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the directory `app` is imported from


# What `v2.parse_infer_request` takes: (body, header_length, limits, image_size).
ParseJob = tuple[bytes, "int | None", Limits, tuple[int, ...]]


def json_part(body: bytes, header_length: int | None) -> int:
    """How many bytes of the request are JSON: all of it, or the header before binary tensor data."""
    return len(body) if header_length is None else min(header_length, len(body))


async def parse_request(
    pool: ParsePool,
    body: bytes,
    header_length: int | None,
    limits: Limits,
    image_size: tuple[int, ...],
    timeout_s: float,
) -> v2.InferRequest:
    """`v2.parse_infer_request`, inline when its JSON is small, else in `pool`; 413 past Limits.max_json_bytes."""
    n = json_part(body, header_length)
    if n > limits.max_json_bytes:
        raise ServiceError(
            "payload_too_large",
            f"the request's JSON is {n} bytes; the limit is {limits.max_json_bytes} (send tensors as binary data)",
        )
    if n <= INLINE_JSON_BYTES:
        return v2.parse_infer_request(body, header_length, limits, image_size)
    return await pool.parse((body, header_length, limits, image_size), timeout_s)


# --------------------------------------------------------------------------- the child


def _read_frame(stream: IO[bytes]) -> bytes | None:
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    (n,) = _FRAME.unpack(head)
    data = stream.read(n)
    return data if len(data) == n else None


def _handle(frame: bytes) -> bytes:
    """One request frame in, one reply frame's payload out: ("ok", InferRequest) or ("error", code, message)."""
    result: tuple[Any, ...]
    try:
        body, header_length, limits, image_size = pickle.loads(frame)
        result = ("ok", v2.parse_infer_request(body, header_length, limits, image_size))
    except ServiceError as e:
        result = ("error", e.code, e.message)
    except (MemoryError, RecursionError):
        result = ("error", "payload_too_large", "parsing this request would take too much memory")
    except Exception as e:  # a bug: the parent logs it; the child keeps serving
        result = ("error", "internal_error", f"the request parser failed ({type(e).__name__}: {str(e)[:200]})")
    try:
        return pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except MemoryError:
        return pickle.dumps(("error", "payload_too_large", "the parsed request is too large"))


def _limit_memory(extra_bytes: int = MEMORY_LIMIT_BYTES) -> None:
    """Cap this process's address space at what it has now plus extra_bytes (best effort)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            vm_bytes = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = vm_bytes + extra_bytes
        if hard == resource.RLIM_INFINITY or want <= hard:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (OSError, ValueError, ImportError):
        pass


def child_main() -> None:
    """`python -m app.protocol.v2.parse_pool`: parse frames from stdin until it closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must never corrupt a frame
    _limit_memory()
    while (frame := _read_frame(stdin)) is not None:
        reply = _handle(frame)
        stdout.write(_FRAME.pack(len(reply)))
        stdout.write(reply)
        stdout.flush()


# --------------------------------------------------------------------------- the parent


class _Child:
    """One parser process and its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def call(self, frame: bytes) -> bytes:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(_FRAME.pack(len(frame)))
        stdin.write(frame)
        await stdin.drain()
        (n,) = _FRAME.unpack(await stdout.readexactly(_FRAME.size))
        return await stdout.readexactly(n)

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"  # numpy's thread pools: one parse is one thread
    return env


class ParsePool:
    """Child processes that run `v2.parse_infer_request` (see the module docstring). Event-loop only."""

    def __init__(self, workers: int = 1, max_waiting: int = 8, hard_timeout_s: float = 30.0) -> None:
        if workers < 1 or max_waiting < 0:
            raise ValueError(f"workers ({workers}) must be >= 1 and max_waiting ({max_waiting}) >= 0")
        self.workers = workers
        self.max_waiting = max_waiting
        self.hard_timeout_s = hard_timeout_s
        self._idle: list[_Child] = []
        self._busy = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._tasks: set[asyncio.Task[bytes]] = set()
        self._closed = False
        self.started = 0  # children started, for tests and /v1/models
        self.parsed = 0

    @property
    def waiting(self) -> int:
        return sum(not f.done() for f in self._waiters)

    async def parse(self, job: ParseJob, timeout_s: float) -> v2.InferRequest:
        """`v2.parse_infer_request(*job)` in a child, within timeout_s.

        Raises what the parse raises (ServiceError), or overloaded (503: too many waiting),
        inference_timeout (503: no answer in time), internal_error (the child failed or died).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        await self._acquire(timeout_s)
        try:
            frame = pickle.dumps(tuple(job), protocol=pickle.HIGHEST_PROTOCOL)
            task = loop.create_task(self._run(frame))
        except BaseException:
            self._release()
            raise
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_retrieve)
        try:
            reply = await asyncio.wait_for(asyncio.shield(task), max(deadline - loop.time(), 0.001))
        except asyncio.TimeoutError:
            raise ServiceError("inference_timeout", "the request's deadline passed while its JSON was parsed") from None
        result = pickle.loads(reply)
        if result[0] == "ok":
            self.parsed += 1
            request = result[1]
            assert isinstance(request, v2.InferRequest)
            return request
        _, code, message = result
        if code == "internal_error":
            logger.error("V2 request parser: %s", message)
        raise ServiceError(code, message)

    async def _acquire(self, timeout_s: float) -> None:
        if self._busy < self.workers and not self.waiting:
            self._busy += 1
            return
        if self.waiting >= self.max_waiting:
            raise ServiceError(
                "overloaded", f"{self.waiting} large JSON requests are waiting to be parsed; retry shortly"
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, max(timeout_s, 0.001))
        except BaseException as e:
            if fut.done() and not fut.cancelled():  # granted just as the caller gave up: hand it on
                self._release()
            else:
                fut.cancel()
            if isinstance(e, asyncio.TimeoutError):
                raise ServiceError(
                    "inference_timeout", "the request's deadline passed while its JSON waited for a parser"
                ) from None
            raise

    def _release(self) -> None:
        self._busy -= 1
        while self._waiters and self._busy < self.workers:
            fut = self._waiters.popleft()
            if not fut.done():
                self._busy += 1
                fut.set_result(None)

    async def _run(self, frame: bytes) -> bytes:
        """One parse on an idle (or new) child; holds the slot taken by `parse` until it is done."""
        try:
            child = self._idle.pop() if self._idle else await self._spawn()
            healthy = False
            try:
                reply = await asyncio.wait_for(child.call(frame), self.hard_timeout_s)
                healthy = True
                return reply
            except asyncio.TimeoutError:
                raise ServiceError("inference_timeout", "the request's JSON took too long to parse") from None
            except (asyncio.IncompleteReadError, BrokenPipeError, ConnectionResetError) as e:
                logger.error("V2 request parser process %s died (%s); starting another", child.proc.pid, e)
                raise ServiceError("internal_error", "the request parser process died") from None
            finally:
                if healthy and not self._closed and len(self._idle) < self.workers:
                    self._idle.append(child)
                else:
                    child.kill()
        finally:
            self._release()

    async def _spawn(self) -> _Child:
        self._closed = False
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app.protocol.v2.parse_pool",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=_child_env(),
            limit=1 << 20,
        )
        self.started += 1
        return _Child(proc)

    def close(self) -> None:
        """Stop the idle children; a busy one stops when its parse ends. A closed pool starts new children again."""
        self._closed = True
        for child in self._idle:
            child.kill()
        self._idle.clear()


def _retrieve(task: asyncio.Task[bytes]) -> None:
    """Read a finished parse's exception, so one nobody waited for logs no "never retrieved" warning."""
    if not task.cancelled():
        task.exception()


if __name__ == "__main__":
    child_main()
