"""`python -m app.models ...`: a thin face; the command line is app/ops/models_cli.py."""

import sys

from app.ops.models_cli import main

if __name__ == "__main__":
    sys.exit(main())
