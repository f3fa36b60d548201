"""`python -m app.batch score|evaluate ...`: a thin face; the command line is app/ops/batch_cli.py."""

import sys

from app.ops.batch_cli import main

if __name__ == "__main__":
    sys.exit(main())
