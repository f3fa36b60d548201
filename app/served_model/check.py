"""The model's declaration against the graphs of the files that serve it, and the files against each other:
`check_files`, at deploy (`build_app`) and in `python -m app.config`. (A Classifier checks the declaration against its
own file as it loads it: `app.served_model.model_io`.)"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from app.served_model.declaration import ModelDeclaration
from app.served_model.graph import GraphError, GraphIO, read_graph


def check_files(model: ModelDeclaration, files: Sequence[tuple[str, Path]]) -> list[Path]:
    """`model` against the graph of each (field, path) whose file is on this machine, and the files against each other
    (one model: one input, one set of classes); ValueError naming the field. The files checked."""
    checked: list[Path] = []
    first: tuple[str, GraphIO] | None = None
    labels = model.label_count()
    for field_name, path in files:
        if not path.is_file():
            continue  # a file not here is checked by the Classifier that loads it
        where = f"{field_name}: {path}"
        try:
            graph = read_graph(path)
        except GraphError as e:
            raise ValueError(f"{where}: {e}") from None
        model.check_against(graph, labels, where)
        if first is not None and _io(graph) != _io(first[1]):
            raise ValueError(
                f"{where}: its graph takes {graph.describe_input()} with {graph.classes} classes, "
                f"{_variant(first[0])}'s {first[1].describe_input()} with {first[1].classes}: the variants of one "
                "model share its declaration, so they must take the same input and give the same classes"
            )
        first = first or (field_name, graph)
        checked.append(path)
    return checked


def _variant(field_name: str) -> str:
    """`variants.fp32` of `variants.fp32.model_path` (or of its fallback's field)."""
    return ".".join(field_name.split(".")[:2])


def _io(graph: GraphIO) -> tuple[object, ...]:
    return (graph.input_shape[1:], graph.dtype, graph.layout, graph.classes)
