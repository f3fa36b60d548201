"""Where a model file comes from, as a declaration names it: a URI (s3://, gs://, https://, file:// or a plain path)
pinned by an optional SHA-256 (the config's `model_path`/`labels_path` and their `sha256`/`labels_sha256`).

The config's field types over `app.storage.ref`: a URI with an unknown scheme, or a digest that is not one, is refused
when the config is read, naming the field. A pinned file is checked against its digest before anything opens it,
wherever it comes from; a remote one is fetched once per node into a content-addressed cache (`app.storage`).
Credentials never come from a config: the storage clients read the standard places (the SDKs' environment variables,
instance or workload identity, a mounted file).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

from app.storage import ModelRef, parse_sha256


def is_remote(uri: str) -> bool:
    """Whether `uri` names a file in object storage or on a web server (fetched into the cache), not on this node."""
    return ModelRef(uri).remote


def local_part(uri: str) -> str:
    """A local file's path: a file:// URI's, a plain path as is."""
    return str(ModelRef(uri).local_path())


def _uri(value: object) -> object:
    if isinstance(value, str):
        if value.lower().startswith("http://"):
            raise ValueError(f"{value}: plain http is refused for a model file (its bytes are code a replica runs)")
        ModelRef(value)  # ValueError naming the URI and what is wrong with it
    return value


def _sha256(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("sha256: expected 64 hex digits")
    return parse_sha256(value)


ModelUri = Annotated[str, BeforeValidator(_uri)]
Sha256 = Annotated[str | None, BeforeValidator(_sha256)]
