"""`python -m app.config CONFIG...`: check Serve configs and serve.env without deploying them."""

from app.config.check import main

if __name__ == "__main__":
    raise SystemExit(main())
