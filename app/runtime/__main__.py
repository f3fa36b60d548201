"""`python -m app.runtime plan|build-engines ...`: a thin face; the command line is app/ops/runtime_cli.py."""

import sys

from app.ops.runtime_cli import main

if __name__ == "__main__":
    sys.exit(main())
