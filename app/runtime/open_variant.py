"""A variant's engine as a Classifier replica opens it, and its speed gate: one place for the Classifier
(`app.serve.classifier`) and the batch scoring actors (`app.batch.scoring`), so a node scores what it would serve.

`open_variant`: the declaration checked against the variant's graph (`model_io`), `runtime_options`, the declared
fallback (`fallback_options`, whose file must pass the same checks only where it would serve), `open_engine`, the
engine prepared for the largest batch (closed again when anything after the open fails). `gate_variant`: the speed
gate's verdict against the baseline variant on this node (`speed_gate_for`, `run_speed_gate`), and `gate_failure`
what a gate with `action: fail` that failed says.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.config import AppArgs
from app.config.speed_gate import SpeedGateVerdict
from app.runtime.fallback import Build
from app.runtime.plan import RuntimeOptions
from app.runtime.select import Engine, Opened, open_engine
from app.runtime.spec import ModelLoadError
from app.runtime.startup import run_speed_gate
from app.runtime.variants import fallback_options, runtime_options, speed_gate_for
from app.served_model.model_io import ModelIO, model_io
from app.served_model.prologue import served_model


@dataclass(frozen=True)
class OpenedVariant:
    """What `open_variant` opened: the engine, the I/O and options of the file that serves (the declared fallback's
    where it serves), and the declared fallback's build (None: it declares none)."""

    opened: Opened
    io: ModelIO
    opts: RuntimeOptions
    fallback: Build | None


@dataclass(frozen=True)
class _Fallback:
    build: Build
    io: ModelIO | None  # None: its file failed the declaration's checks (`error` says how)
    error: str


def open_variant(
    args: AppArgs, variant: str, gpu: bool, threads: int, streams: int, max_batch: int,
    *, name: str | None = None, requested: ModelIO | None = None,
) -> OpenedVariant:  # fmt: skip
    """`variant`'s engine as a Classifier replica granted a GPU (`gpu`) or not, with `threads` intra-op threads and
    `streams` parallel batches of at most `max_batch` images, opens it here.

    `name` names the opener in the checks' errors (default `Classifier_<variant>`); `requested`: the declared file's
    ModelIO when the caller has read it already (else read here: ValueError naming the field when the file fails the
    declaration). ModelLoadError when no engine opens, or when the declared fallback serves but its file failed the
    declaration's checks."""
    name = name or f"Classifier_{variant}"
    if requested is None:
        path = args.resolved_path(args.variants[variant].model_path)
        requested = model_io(args.model, path, f"{name}: variants.{variant}.model_path")
    opts = runtime_options(args, variant, gpu, threads, streams)
    fallback = _declared_fallback(args, variant, gpu, threads, streams, name)
    build = fallback.build if fallback is not None else None
    opened = open_engine(variant, str(requested.served.path), opts, max_batch, build)
    io = requested
    try:
        if opened.serving is not None and fallback is not None:  # open_engine logged why
            if fallback.io is None:
                raise ModelLoadError(f"{opened.serving.line(variant)}, but {fallback.error}")
            io, opts = fallback.io, fallback.build.opts
        # CUDA graphs captured before any image: each slot alone on the GPU (`app.runtime.graphs`).
        opened.engine.prepare(max_batch)
    except BaseException:
        opened.engine.close()
        raise
    return OpenedVariant(opened, io, opts, build)


def _declared_fallback(
    args: AppArgs, variant: str, gpu: bool, threads: int, streams: int, name: str
) -> _Fallback | None:
    """The variant's declared fallback build, as this opener would run it (None: it declares none). A fallback file
    that fails the declaration's checks is reported only where it would serve (`open_variant`)."""
    declared = fallback_options(args, variant, gpu, threads, streams)
    if declared is None:
        return None
    path, opts = declared
    try:
        io = model_io(args.model, path, f"{name}: variants.{variant}.fallback.model_path")
    except (ValueError, OSError) as e:
        return _Fallback(Build(str(path), opts), None, str(e))
    return _Fallback(Build(str(io.served.path), opts), io, "")


def gate_variant(
    args: AppArgs, variant: str, engine: Engine, gpu: bool, threads: int, streams: int, max_batch: int
) -> SpeedGateVerdict | None:
    """The speed gate's verdict on `variant` running on `engine` (None: no gate applies to it): the baseline variant's
    model, as that variant serves it, on the engine family `variant` chose here, both timed at `max_batch` with
    `streams` parallel calls (run_speed_gate logs the verdict)."""
    gate = speed_gate_for(args, variant, gpu, threads, streams, engine.name)
    if gate is None:
        return None
    spec, path, opts = gate
    path = str(served_model(path, args.model.preprocess).path)  # as that variant serves it
    return run_speed_gate(variant, engine, spec, path, opts, max_batch, streams)


def gate_failure(verdict: SpeedGateVerdict | None) -> str | None:
    """What a failed gate with `action: fail` says (the opener must not serve, nor score); None otherwise."""
    if verdict is None or verdict.passed or verdict.action != "fail":
        return None
    return f"{verdict.message} (speed_gate.action: fail)"
