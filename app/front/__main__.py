"""`python -m app.front env|status ...`: a thin face; the command line is app/ops/front_cli.py."""

import sys

from app.ops.front_cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
