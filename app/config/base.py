"""The base of every config model: unknown fields are refused, and a validated config is frozen.

A misspelt key fails at deploy naming the field instead of being silently ignored.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
