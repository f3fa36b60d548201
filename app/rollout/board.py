"""Where the rollout controller's weights meet the Routers: a small board kept by the ABLedger.

Every Router polls it about once a second with its own user_config's fingerprint and weights
(`poll`), and gets back the weights the controller set (`set`), if any. So every Router replica
routes by the same weights within about a second, and no Router needs to know the controller.

A `serve deploy` wins: an override carries the fingerprint of the Routers' config it was set
against, and once a Router reports another one (its user_config was redeployed), the override is
dropped for everyone and the board says so (`seen()["config_changed"]`), which the controller
reads as "abort". Pure: no Ray here.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def config_id(user_config: dict[str, Any]) -> str:
    """A fingerprint of a Router's user_config, the same on every replica and restart."""
    blob = json.dumps(user_config, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


class RolloutBoard:
    def __init__(self) -> None:
        self.override: dict[str, Any] | None = None  # {"weights", "shadow_fraction", "config_id", "generation"}
        self.config: tuple[str, dict[str, float]] | None = None  # the latest Router config seen
        self.config_changed = False

    def set(self, override: dict[str, Any] | None) -> None:
        """The controller's weights (None: none, the Routers' own config rules). A redeploy seen under the previous
        override stays flagged until the controller sets weights for another config, or none."""
        before = self.override
        if override is None or before is None or override.get("config_id") != before.get("config_id"):
            self.config_changed = False
        self.override = override

    def poll(self, config_id: str, weights: dict[str, float]) -> dict[str, Any] | None:
        self.config = (config_id, dict(weights))
        ov = self.override
        if ov is not None and ov.get("config_id") != config_id:
            self.override, self.config_changed = None, True  # redeployed under the rollout: the deploy wins
            return None
        return ov

    def seen(self) -> dict[str, Any]:
        """What the controller needs from the Routers' side."""
        cid, weights = self.config if self.config else (None, None)
        return {
            "config_id": cid,
            "weights": weights,
            "config_changed": self.config_changed,
        }
