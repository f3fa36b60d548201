"""`python -m app.front env|status ...`: a thin face; the command line is `app.front.cli`."""

import sys

from app.front.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
