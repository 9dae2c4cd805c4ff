"""Refs and staging storage: the KV protocol (:mod:`graveler.kv.base`) and its backends.

* :mod:`graveler.kv.base` -- the protocol: :class:`Backend` (a home's repositories),
  :class:`Store` (one repository: read / write transactions, durability, group
  commit), :class:`Txn` (get / put / insert / compare-and-set / delete / ordered scan /
  range delete / count on the named tables).
* :mod:`graveler.kv.lmdb` -- LMDB, the embedded default: one environment per repository
  under ``<home>/repos/<name>/refs.lmdb`` (and :mod:`graveler.kv.lmdb_file`, its
  ``data.mdb`` checked before it is mapped).
* :mod:`graveler.kv.memory` -- in memory, for unit tests (``memory://NAME``).
* :mod:`graveler.kv.postgres` -- PostgreSQL, shared by every host that reaches the server
  (``postgresql://USER[:PASS]@HOST[:PORT]/DB?...``, any libpq URL; psycopg 3, imported
  only when such a URL is used, from the ``postgres`` extra).

Only this package imports ``lmdb`` and ``psycopg``. :func:`open_backend` picks a backend from
``KVConfig.url``; everything above it (refs, staging, commits, the home, the mount)
uses the protocol only.
"""

from __future__ import annotations

import re
from pathlib import Path

from graveler.config import PG_SCHEMES, KVConfig
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
    """The backend ``config.url`` names: ``lmdb`` (under ``home``), ``memory://NAME`` or a
    ``postgresql://`` (``postgres://``) libpq URL (one process-wide backend per URL)."""
    url = config.url
    if url == "lmdb":
        return LmdbBackend(home, config)
    if url.startswith("memory://") and len(url) > len("memory://"):
        return MemoryBackend(url)
    if url.startswith(PG_SCHEMES):
        try:
            from graveler.kv.postgres import open_pg_backend
        except ImportError as e:
            raise InvalidArgument(f"a PostgreSQL KV backend needs psycopg ({e}): "
                                  "pip install 'lakefuse[postgres]'") from None
        return open_pg_backend(url)
    raise InvalidArgument(f"unknown KV backend {_shown(url)!r}: use 'lmdb' or 'postgresql://...' (memory://NAME: "
                          "a library's own process only)")


def _shown(url: str) -> str:
    """What a message may show of a KV setting that is not understood: a bare word whole, else
    only what comes before its first ``:``, ``/``, ``@``, ``=``, ``?`` or space -- never a
    password, whatever shape it was written in (``user:PASS@host``, ``password=PASS``...)."""
    if re.fullmatch(r"[\w.+-]*", url):
        return url
    head = re.split(r"[:/@=?\s]", url, maxsplit=1)[0]
    return head + ("://..." if url[len(head):].startswith("://") else "...")


__all__ = [
    "BRANCHES", "COMMITS", "MAX_KEY_BYTES", "REPO", "STAGING", "STAMPS", "TABLES", "TAGS",
    "Backend", "Env", "KVConfig", "LmdbBackend", "LmdbTxn", "MemoryBackend", "NestedTransaction", "Store", "Txn",
    "borrowed_env", "check_data_file", "close_env", "open_backend", "open_env", "prefix_successor",
]
