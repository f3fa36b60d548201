"""A node-local, content-addressed cache of model files fetched from object storage (s3://, gs://, https://), pinned
by SHA-256: app.storage.cache downloads each file once per node, verifies it before anyone sees it, and bounds the
cache without evicting a file in use. A leaf package: it imports nothing else of the app, and no Ray.
"""

from app.storage.cache import CachedFile, CacheEntry, ModelCache
from app.storage.digest import sha256_file
from app.storage.failures import FetchError
from app.storage.ref import ModelRef, parse_sha256
from app.storage.stores import filesystem_for, open_output

__all__ = [
    "CacheEntry",
    "CachedFile",
    "FetchError",
    "ModelCache",
    "ModelRef",
    "filesystem_for",
    "open_output",
    "parse_sha256",
    "sha256_file",
]
