"""Refs and staging storage: the KV protocol (:mod:`graveler.kv.base`) and its backends.

* :mod:`graveler.kv.base` -- the protocol: :class:`Backend` (a home's repositories),
  :class:`Store` (one repository: read / write transactions, durability, group
  commit), :class:`Txn` (get / put / insert / compare-and-set / delete / ordered scan /
  range delete / count on the named tables).
* :mod:`graveler.kv.lmdb` -- LMDB, the embedded default: one environment per repository
  under ``<home>/repos/<name>/refs.lmdb`` (and :mod:`graveler.kv.lmdb_file`, its
  ``data.mdb`` checked before it is mapped).
* :mod:`graveler.kv.memory` -- in memory, for unit tests (``memory://NAME``).

Only this package imports ``lmdb``. :func:`open_backend` picks a backend from
``KVConfig.url``; everything above it (refs, staging, commits, the home, the mount)
uses the protocol only.
"""

from __future__ import annotations

from pathlib import Path

from graveler.config import KVConfig
from graveler.errors import InvalidArgument
from graveler.kv.base import (
    BRANCHES,
    COMMITS,
    MAX_KEY_BYTES,
    REPO,
    STAGING,
    STAMPS,
    TABLES,
    TAGS,
    Backend,
    NestedTransaction,
    Store,
    Txn,
    prefix_successor,
)
from graveler.kv.lmdb import (
    Env,
    LmdbBackend,
    LmdbTxn,
    borrowed_env,
    check_data_file,
    close_env,
    open_env,
)
from graveler.kv.memory import MemoryBackend


def open_backend(config: KVConfig, home: Path) -> Backend:
    """The backend ``config.url`` names: ``lmdb`` (under ``home``) or ``memory://NAME``."""
    url = config.url
    if url == "lmdb":
        return LmdbBackend(home, config)
    if url.startswith("memory://") and len(url) > len("memory://"):
        return MemoryBackend(url)
    raise InvalidArgument(f"unknown KV backend {url!r}: use 'lmdb' or 'memory://NAME'")


__all__ = [
    "BRANCHES", "COMMITS", "MAX_KEY_BYTES", "REPO", "STAGING", "STAMPS", "TABLES", "TAGS",
    "Backend", "Env", "KVConfig", "LmdbBackend", "LmdbTxn", "MemoryBackend", "NestedTransaction", "Store", "Txn",
    "borrowed_env", "check_data_file", "close_env", "open_backend", "open_env", "prefix_successor",
]
