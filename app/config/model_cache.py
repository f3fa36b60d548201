"""The node-local cache remote model files are fetched into (`app.storage`), shared by every replica of a node."""

from __future__ import annotations

import os

from pydantic import Field

from app.config.base import _Strict


class ModelCacheArgs(_Strict):
    """The node-local cache remote model files are fetched into, shared by every replica of the node."""

    dir: str | None = Field(
        None, description="the cache's directory; default $APP_MODEL_CACHE_DIR, else /tmp/app-model-cache"
    )
    max_bytes: int = Field(
        20 << 30,
        gt=0,
        description="the cache's size limit: versions no running replica uses are evicted, least recently used "
        "first, once it is exceeded (files in use are never evicted)",
    )

    def resolved_dir(self) -> str:
        return self.dir or os.environ.get("APP_MODEL_CACHE_DIR") or "/tmp/app-model-cache"
