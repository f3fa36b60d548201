"""Checking JSON bodies against the schemas an OpenAPI 3.1 document declares (Draft 2020-12, its components)."""

from __future__ import annotations

from typing import Any

import jsonschema


def declared(doc: dict[str, Any], path: str, method: str, status: int | str) -> dict[str, Any]:
    """The JSON schema of `method path`'s `status` response."""
    response = doc["paths"][path][method.lower()]["responses"][str(status)]
    schema: dict[str, Any] = response["content"]["application/json"]["schema"]
    return schema


def component(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def check(doc: dict[str, Any], schema: dict[str, Any], body: Any) -> None:
    """Raise jsonschema's ValidationError unless `body` fits `schema` (whose $refs point into `doc`)."""
    rooted = {**schema, "components": doc["components"]}
    jsonschema.Draft202012Validator(rooted).validate(body)


def fits(doc: dict[str, Any], schema: dict[str, Any], body: Any) -> bool:
    try:
        check(doc, schema, body)
    except jsonschema.ValidationError:
        return False
    return True
