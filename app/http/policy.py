"""The Router's live policy: the user_config in force, a rollout's weights over it, the A/B choice of each request.

A user_config arrives at deploy time or live (`configure`); about once a second the Router asks the ledger for the
rollout controller's weights (`poll_rollout`) and lays them over it (`apply_override`); a deploy drops them. The
pipeline is told each change (its limits, split and the rollout's shadow pair) through `Pipeline.configure`. The
cascades' `margin: auto` thresholds are refitted from the ledger's evidence here too (`refit_cascades`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.config import RouterConfig
from app.pipeline.cascade_rule import MarginEvidence
from app.pipeline.routing import Choice, WeightedSplit, choose_variant
from app.pipeline.service import Pipeline
from app.request.guards import MIN_ADMIN_TOKEN_CHARS, admin_token
from app.rollout.board import config_id
from app.tracing import spans

if TYPE_CHECKING:  # a type only: the Router's metrics are made and handed in by the deployment
    from app.http.ports import Metrics

logger = logging.getLogger("ray.serve")


class RouterPolicy:
    def __init__(
        self, pipeline: Pipeline, variants: list[str], cascades: list[str], metrics: Metrics, rng: random.Random
    ) -> None:
        """variants: the Classifiers; cascades: the cascades' names (both can be routed to)."""
        self.pipeline = pipeline
        self.variants = variants
        self.known = frozenset([*variants, *cascades])  # what a request can be routed to
        self.metrics = metrics
        self.rng = rng
        self.cfg: RouterConfig | None = None  # in force: the user_config, or it with the rollout's weights
        self.base: RouterConfig | None = None  # the user_config as deployed
        self.config_id: str | None = None
        self.override_generation: Any = None
        self.split: WeightedSplit | None = None
        self.admin_token: str | None = None
        self.metrics.cascade_thresholds(pipeline.cascades.thresholds())

    @property
    def config(self) -> RouterConfig:
        assert self.cfg is not None, "configure() has not run"
        return self.cfg

    def configure(self, cfg: RouterConfig) -> None:
        """A user_config (deploy time or live); it replaces any rollout weights until the ledger says otherwise."""
        self._use(cfg, None)  # a deploy drops a rollout's weights: its pair goes with them
        self.base, self.override_generation = cfg, None
        self.config_id = config_id({"user_config": cfg.model_dump(mode="json"), "variants": self.variants})
        self.admin_token = admin_token(cfg.admin_token_env)
        if self.admin_token:
            admin = f"token from ${cfg.admin_token_env}"
            if len(self.admin_token) < MIN_ADMIN_TOKEN_CHARS:
                logger.warning(
                    "the admin token in $%s is under %d characters: guessable",
                    cfg.admin_token_env,
                    MIN_ADMIN_TOKEN_CHARS,
                )
        else:
            admin = "open to anyone (allow_unauthenticated_admin)" if cfg.allow_unauthenticated_admin else "disabled"
        logger.info(
            "Router A/B weights %s (sticky %s, override %s, shadow %.2f); admin endpoints: %s",
            cfg.weights,
            cfg.sticky_header,
            "allowed" if cfg.allow_override else "refused",
            cfg.shadow_fraction,
            admin,
        )

    def _use(self, cfg: RouterConfig, pair: tuple[str, str] | None) -> None:
        unknown = sorted(set(cfg.weights) - self.known)
        if unknown:
            raise ValueError(f"user_config.weights names unknown variants {unknown}; deployed: {sorted(self.known)}")
        split = WeightedSplit(cfg.weights)
        self.pipeline.configure(cfg, split, pair)
        self.cfg, self.split = cfg, split

    async def poll_rollout(self, timeout_s: float = 5.0) -> None:
        """About once a second (after the A/B flush): the rollout controller's weights from the ledger, if any."""
        if self.base is None or self.config_id is None:
            return
        try:
            override = await self.pipeline.specs.ask(
                self.pipeline.backend.ledger_poll(self.config_id, self.base.weights), timeout_s
            )
        except Exception as e:  # the ledger is best-effort; serving is not: keep the weights we have
            logger.debug("rollout poll failed: %s", type(e).__name__)
            return
        self.apply_override(override)

    def apply_override(self, override: dict[str, Any] | None) -> None:
        """The rollout's weights (and its shadow-fraction floor) over this Router's user_config; None: the config's."""
        generation = override.get("generation") if override else None
        if generation == self.override_generation or self.base is None:
            return
        self.override_generation = generation
        cfg = self.base
        pair = override.get("pair") if override else None
        if override is not None:
            weights = {v: float(w) for v, w in override["weights"].items() if v in self.known}
            update = {
                "weights": {**cfg.weights, **weights},
                "shadow_fraction": max(cfg.shadow_fraction, float(override.get("shadow_fraction") or 0.0)),
            }
            cfg = cfg.model_copy(update=update)
        try:
            self._use(cfg, (pair[0], pair[1]) if pair and set(pair) <= self.known else None)
        except ValueError as e:  # e.g. every weight 0: keep routing as before, and say why
            logger.warning("rollout weights %s not applied: %s", override, e)
            return
        logger.info("rollout: weights %s, shadow %.3f (generation %s)", cfg.weights, cfg.shadow_fraction, generation)

    async def refit_cascades(self, timeout_s: float = 5.0) -> None:
        """`margin: auto` thresholds from the ledger's evidence, merged over every Router."""
        cascades = self.pipeline.cascades
        if not cascades.any_auto():
            return
        try:
            raw = await self.pipeline.specs.ask(self.pipeline.backend.ledger_margins(), timeout_s)
            margins = {k: MarginEvidence.from_dict(v) for k, v in raw.items()}
        except Exception as e:  # the ledger is best-effort: keep the thresholds we have
            logger.debug("cascade evidence not read: %s", type(e).__name__)
            return
        if cascades.refit(margins):
            self.metrics.cascade_thresholds(cascades.thresholds())

    def choose(self, headers: Mapping[str, str], pinned: str | None = None) -> Choice:
        """The A/B choice (sticky, override or weighted), or the variant a V2 model name pins.

        headers: an HTTP request's, or another protocol's call's (gRPC metadata), case-insensitive.
        """
        if pinned is not None:
            choice = Choice(pinned, "model")
        else:
            cfg, split = self.config, self.split
            assert split is not None
            sticky, override = headers.get(cfg.sticky_header), headers.get(cfg.override_header)
            choice = choose_variant(split, self.known, sticky, override, cfg.allow_override, self.rng)
        if spans.ENABLED:  # the routing decision, on the request's span
            spans.annotate({"app.variant": choice.variant, "app.routing.reason": choice.reason})
        return choice

    def user(self, headers: Mapping[str, str]) -> str | None:
        """Who sent the request, as the sticky header says (None: not said)."""
        return headers.get(self.config.sticky_header)
