"""`python -m app.config CONFIG...`: a thin face; the command line is app/ops/config_cli.py."""

from app.ops.config_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
