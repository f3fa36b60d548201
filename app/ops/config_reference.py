"""The configuration reference (docs/configuration-reference.md), generated from the typed config's own fields.

    python -m app.ops.config_reference            # rewrite docs/configuration-reference.md
    python -m app.ops.config_reference --check    # exit 1 when the file is not what the models say (make lint)

One table per model: each key (dotted under the application's `args`, or a deployment's `user_config`), its type,
its default, and the field's description, as pydantic holds them. Nested models get a section of their own, so every
key a user can write is listed once, with the validation that refuses a bad value named in the type column.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from app.config import AppArgs, ClassifierConfig, RouterConfig

OUT = Path(__file__).resolve().parents[2] / "docs" / "configuration-reference.md"
ROOTS: list[tuple[str, str, type[BaseModel]]] = [
    ("args", "the application's `args` (`applications[].args` in a Serve config)", AppArgs),
    ("Router user_config", "the Router deployment's `user_config` (live: applied without a restart)", RouterConfig),
    ("Classifier user_config", "each Classifier deployment's `user_config` (live)", ClassifierConfig),
]
HEAD = """# Configuration reference

Generated from the typed config (`app/config/`, `app/served_model/declaration.py`) by
`python -m app.ops.config_reference`;
`make lint` fails when this page and the models differ. Unknown keys are refused everywhere. How the pieces fit,
and `configs/serve.env`: [configuration.md](configuration.md).
"""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside a field's type (itself, or in a dict's values, a list, an Optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        return annotation.__name__
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:  # a checked type (a model URI, a sha256): the type it checks
        return _type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(repr(a).replace("'", '"') for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    return str(annotation)


def _bounds(info: FieldInfo) -> str:
    names = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    found = [f"{names[k]} {getattr(m, k)}" for m in info.metadata for k in names if getattr(m, k, None) is not None]
    return f" ({', '.join(found)})" if found else ""


def _default(info: FieldInfo) -> str:
    if info.default is PydanticUndefined:
        if info.default_factory is None:
            return "see what it does" if "omitted" in (info.description or "") else "required"
        value = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return "(its fields' defaults)"
    text = repr(value).replace("'", '"')
    return f"`{text}`" if len(text) <= 40 else "(see configs/local.yaml)"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def sections(prefix: str, title: str, model: type[BaseModel], seen: set[str]) -> list[str]:
    """This model's table, then one for each model nested in it (each model once, at its first key)."""
    rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        key = f"{prefix}.{name}"
        inner_models = _models_in(info.annotation)
        mapped = typing.get_origin(info.annotation) is dict
        what = info.description or ""
        if inner_models and not what:
            what = f"the keys of `{key}.<name>`, below" if mapped else f"the keys of `{key}`, below"
        rows.append(
            f"| `{key}` | {_cell(_type_name(info.annotation) + _bounds(info))} | {_cell(_default(info))} | "
            f"{_cell(what)} |"
        )
        nested += [(f"{key}.<name>" if mapped else key, inner) for inner in inner_models]
    doc = _cell((model.__doc__ or "").strip().split("\n\n")[0])
    out = [f"## `{prefix}`: {title}" if title else f"## `{prefix}`", "", *([doc, ""] if doc else []), *rows, ""]
    for key, inner in nested:
        if inner.__name__ not in seen:
            seen.add(inner.__name__)
            out += sections(key, "", inner, seen)
    return out


def render() -> str:
    lines, seen = [HEAD], set[str]()
    for prefix, title, model in ROOTS:
        seen.add(model.__name__)
        lines += sections(prefix, title, model, seen)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args == ["--check"]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python -m app.ops.config_reference", file=sys.stderr)
            return 1
        print(f"{OUT.name} is up to date")
        return 0
    if args:
        print("usage: python -m app.ops.config_reference [--check]", file=sys.stderr)
        return 2
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
