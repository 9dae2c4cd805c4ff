"""graveler's object stores: one interface, a local-directory backend and an S3 backend.

``open_store(uri)`` picks the backend from the URI:

  file:///abs/path  or  /abs/path   -> LocalStore (the directory is created if missing)
  s3://bucket[/prefix]              -> S3Store (boto3 is imported only then)

URIs are parsed and printed by :class:`graveler.objstore.uri.StorageURI` only.
"""

from __future__ import annotations

from graveler.objstore.base import ObjectInfo, ObjectReader, ObjectStore, StoreConfig, validate_key
from graveler.objstore.local import LocalStore
from graveler.objstore.uri import FILE, StorageURI

__all__ = ["ObjectInfo", "ObjectReader", "ObjectStore", "StoreConfig", "LocalStore", "StorageURI", "open_store",
           "validate_key"]


def open_store(uri: str, config: StoreConfig | None = None) -> ObjectStore:
    """The store rooted at ``uri`` (a str or a StorageURI); ``InvalidArgument`` for a URI of no known kind."""
    u = uri if isinstance(uri, StorageURI) else StorageURI.parse(uri)
    if u.scheme == FILE:
        return LocalStore(u.path)
    from graveler.objstore.s3 import S3Store

    return S3Store(u.bucket, u.path, config)
