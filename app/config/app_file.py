"""One application's `args` from a Serve config file, as the model commands read it (`python -m app.models quantize
--config`, `publish --config`): the file, the application (`--app`: an index or a name; default the first of
`app.main:build_app`, else the first), its args validated as a deploy would. Every mistake is one line naming the
file and, for the args, the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.config.args import AppArgs

IMPORT_PATH = "app.main:build_app"


class AppFileError(ValueError):
    """A config file that does not give an application's args; one line."""


def errors_line(e: ValidationError, whole: str = "") -> str:
    """A validation error on one line: each problem as `field: message` (`whole`: the name of an error of the whole
    model, which has no field)."""
    said = []
    for err in e.errors():
        where = ".".join(map(str, err["loc"])) or whole
        said.append(f"{where}: {err['msg']}" if where else err["msg"])
    return " ".join("; ".join(said).split())


def _chosen(path: Path, apps: list[Any], app: str | None) -> int:
    names = [a.get("name") if isinstance(a, dict) else None for a in apps]
    if app is None:
        ours = [i for i, a in enumerate(apps) if isinstance(a, dict) and a.get("import_path") == IMPORT_PATH]
        return ours[0] if ours else 0
    if app.isdigit():
        if int(app) >= len(apps):
            raise AppFileError(f"{path}: --app {app}: there are {len(apps)} applications")
        return int(app)
    if app not in names:
        raise AppFileError(f"{path}: no application {app!r}; the applications are {names}")
    return names.index(app)


def read_app_args(path: Path, app: str | None = None) -> AppArgs:
    import yaml

    if not path.is_file():
        raise AppFileError(f"config not found: {path}")
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise AppFileError(f"{path} is not YAML: {str(e).splitlines()[0]}") from None
    apps = cfg.get("applications") if isinstance(cfg, dict) else None
    if not isinstance(apps, list) or not apps:
        raise AppFileError(f"{path}: no applications")
    index = _chosen(path, apps, app)
    chosen = apps[index] if isinstance(apps[index], dict) else {}
    try:
        return AppArgs.model_validate(chosen.get("args") or {})
    except ValidationError as e:
        raise AppFileError(f"{path}: applications[{index}].args: {errors_line(e)}") from None
