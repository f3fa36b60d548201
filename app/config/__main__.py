"""`python -m app.config CONFIG...`: a thin face; the command line is `app.config.cli`."""

from app.config.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
