"""`ClassifierConfig`: each Classifier deployment's user_config, its dynamic batching and the model version it
serves (both live)."""

from __future__ import annotations

from pydantic import Field, model_validator

from app.config.base import _Strict
from app.served_model.source import ModelUri, Sha256

VERSION_KEYS = ("model_path", "sha256", "fallback_model_path", "fallback_sha256")  # the model version it names


class ClassifierConfig(_Strict):
    """A Classifier's user_config: dynamic batching and the model version, changed live through reconfigure."""

    model_path: ModelUri | None = Field(
        None,
        description="the variant's model file, overriding args' (a release in place: the replica fetches, checks, "
        "opens, warms and gates it beside the one it serves, then switches; a failure leaves the old one serving); "
        "None: args' model_path",
    )
    sha256: Sha256 = Field(None, description="model_path's SHA-256; with model_path only")
    fallback_model_path: ModelUri | None = Field(
        None,
        description="the same version's build of the variant's declared fallback (args' fallback.model_path, which "
        "serves where the variant's own build is refused); with model_path only, and required with it where args "
        "declare a fallback: a release never pairs a new model with an old fallback",
    )
    fallback_sha256: Sha256 = Field(None, description="fallback_model_path's SHA-256")

    max_batch_size: int = Field(16, gt=0, le=256, description="images per ONNX Runtime call")
    batch_wait_timeout_s: float = Field(0.003, ge=0, le=1, description="how long a partial batch waits to fill")
    max_concurrent_batches: int = Field(1, gt=0, le=8, description="batches in flight per replica")
    warmup: bool = Field(True, description="run every batch size once at start so first requests are not slow")
    profile_batches: int = Field(0, ge=0, le=1000, description="profile the next N batches with ONNX Runtime")
    profile_dir: str = Field("/tmp/app-profiles", description="where profiling traces are written")

    @model_validator(mode="after")
    def _sha256_with_path(self) -> ClassifierConfig:
        if self.sha256 is not None and self.model_path is None:
            raise ValueError("sha256 without model_path: the digest pins the model_path beside it")
        if self.fallback_model_path is not None and self.model_path is None:
            raise ValueError(
                "fallback_model_path without model_path: it is the fallback of the version model_path names"
            )
        if self.fallback_sha256 is not None and self.fallback_model_path is None:
            raise ValueError("fallback_sha256 without fallback_model_path")
        return self

    def version(self) -> dict[str, str | None]:
        """The model version it names (empty: the args')."""
        return {k: getattr(self, k) for k in VERSION_KEYS if getattr(self, k) is not None}

    def check_against(self, max_ongoing_requests: int) -> None:
        """Batches can only fill if a replica accepts enough requests at once."""
        needed = self.max_batch_size * self.max_concurrent_batches
        if max_ongoing_requests < needed:
            raise ValueError(
                f"user_config.max_batch_size ({self.max_batch_size}) x max_concurrent_batches "
                f"({self.max_concurrent_batches}) = {needed} exceeds max_ongoing_requests ({max_ongoing_requests}): "
                "batches could never fill; raise max_ongoing_requests or lower max_batch_size"
            )


def classifier_deployment_name(variant: str) -> str:
    return f"Classifier_{variant}"
