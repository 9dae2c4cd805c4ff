"""graveler's object stores: one interface, a local-directory backend and an S3 backend.

``open_store(uri)`` picks the backend from the URI:

  file:///abs/path  or  /abs/path   -> LocalStore (the directory is created if missing)
  s3://bucket[/prefix]              -> S3Store (boto3 is imported only then)
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from graveler.errors import InvalidArgument
from graveler.objstore.base import ObjectInfo, ObjectReader, ObjectStore, StoreConfig, validate_key
from graveler.objstore.local import LocalStore

__all__ = ["ObjectInfo", "ObjectReader", "ObjectStore", "StoreConfig", "LocalStore", "open_store", "validate_key"]


def open_store(uri: str, config: StoreConfig | None = None) -> ObjectStore:
    """The store rooted at ``uri``; ``InvalidArgument`` for a URI of no known kind."""
    if not isinstance(uri, str) or not uri:
        raise InvalidArgument(f"a store URI must be a non-empty str, not {uri!r}")
    if uri.startswith("s3://"):
        from graveler.objstore.s3 import S3Store

        bucket, _, prefix = uri[len("s3://"):].partition("/")
        return S3Store(bucket, prefix, config)
    if uri.startswith("file:"):
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise InvalidArgument(f"bad file URI {uri!r}: expected file:///absolute/path")
        path = unquote(parts.path)
        if not os.path.isabs(path):
            raise InvalidArgument(f"bad file URI {uri!r}: expected file:///absolute/path")
        return LocalStore(path)
    if os.path.isabs(uri):
        return LocalStore(uri)
    raise InvalidArgument(
        f"unsupported store URI {uri!r}: expected file:///absolute/path, an absolute path or s3://bucket[/prefix]"
    )
