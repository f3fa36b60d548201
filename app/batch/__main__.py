"""`python -m app.batch score|evaluate ...`: a thin face; the command line is `app.batch.cli`."""

import sys

from app.batch.cli import main

if __name__ == "__main__":
    sys.exit(main())
