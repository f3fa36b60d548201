"""`python -m app.runtime plan|build-engines ...`: a thin face; the command line is `app.runtime.cli`."""

import sys

from app.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
