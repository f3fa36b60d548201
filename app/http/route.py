"""One entry of the Router's HTTP route table: a method, a path, the handler that answers it, its /openapi.json entry
and whether it needs the admin token."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.responses import Response

from app.http.openapi import Doc


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # exact, or a template (`paths.PathTemplate`): its parameters go to the handler
    # The method of the Router's part that answers it (v1.classify; in ROUTES its class's function). V2's take
    # (request, path parameters); the others (request), a template's parameters in request.path_params.
    handler: Callable[..., Awaitable[Response]]
    doc: Doc | None = None  # its /openapi.json entry; None: not in the document (the V2 protocol's own)
    admin: bool = False  # needs the admin bearer token (it changes the traffic or the evidence)

    @property
    def name(self) -> str:
        """The handler's name: V2's operation (`infer`, `model_ready`, ...)."""
        return self.handler.__name__
