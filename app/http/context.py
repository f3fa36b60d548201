"""What every part of one Router replica shares, made once by the assembly: the config, the variants, the pipeline,
the live policy, the body gate, the replies and the metrics. Each handler takes it and what is its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.config import AppArgs, Limits
from app.http.body_reader import BodyReader
from app.http.policy import RouterPolicy
from app.http.replies import Replies
from app.pipeline.service import Pipeline

if TYPE_CHECKING:  # a type only: the Router's metrics are made and handed in by the deployment
    from app.http.ports import Metrics


@dataclass(frozen=True)
class RouterContext:
    args: AppArgs
    variants: list[str]  # the Classifiers' variants
    pipeline: Pipeline
    policy: RouterPolicy
    bodies: BodyReader
    replies: Replies
    metrics: Metrics

    @property
    def limits(self) -> Limits:
        return self.args.limits
