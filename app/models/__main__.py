"""`python -m app.models ...`: a thin face; the command line is `app.models.cli`."""

import sys

from app.models.cli import main

if __name__ == "__main__":
    sys.exit(main())
