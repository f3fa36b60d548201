"""Serve's entry point: `import_path: app.main:build_app` in a Serve config, the name every config and manifest uses.

The builder itself is `app.serve.application`; this face only names it.
"""

from app.serve.application import build_app

__all__ = ["build_app"]
