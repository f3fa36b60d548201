"""`python -m app.config FILE...` (its face: `app.config.__main__`): check Serve config files and serve.env the way a
deploy would, without deploying: each config validated as a whole (`validate_serve_config`) and its model declaration
checked against the model files on this machine."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from app.config import read_serve_env, validate_serve_config
from app.served_model.check import check_files


def main(argv: list[str] | None = None) -> int:
    """python -m app.config FILE...: validate Serve config files without deploying them."""
    status = 0
    for path in argv if argv is not None else sys.argv[1:]:
        if path.endswith(".env"):
            try:
                print(f"{path}: ok ({', '.join(read_serve_env(Path(path))) or 'empty'})")
            except ValueError as e:
                print(e, file=sys.stderr)
                status = 1
            continue
        with open(path) as f:
            cfg = yaml.safe_load(f)
        try:
            args = validate_serve_config(cfg)
            checked = check_files(args.model, args.model_files())
            if checked:
                print(f"{path}: ok (the model declaration checked against {', '.join(map(str, checked))})")
            else:
                print(f"{path}: ok (no model file here: each Classifier checks the declaration against its graph)")
        except ValueError as e:
            print(f"{path}: {e}", file=sys.stderr)
            status = 1
    return status
