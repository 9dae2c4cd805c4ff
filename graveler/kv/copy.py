"""Copy repositories' refs and staging from one KV backend to another (``lakefuse kv copy``).

Only the protocol (:mod:`graveler.kv.base`) is used, so any backend copies to any other:
LMDB to PostgreSQL to move a repository onto a shared server, PostgreSQL to LMDB to
bring it back, PostgreSQL to another PostgreSQL database.

What is copied is every row of every table of :data:`TABLES` -- the repository record,
branches, tags, commits, the staging areas (uncommitted changes, tombstones included) and
the branches' change stamps -- byte for byte, so the copy is the same repository: same
commit IDs, same staging tokens, nothing to rewrite. The committed data (ranges,
metaranges, objects) stays in the storage namespace, which both copies name.

How it is all-or-nothing, per repository:

* the whole source is read in ONE read transaction (a consistent snapshot: a commit or a
  staged write racing the copy is in it entirely or not at all);
* every repository named is checked first: one missing from the source is ``NotFound``,
  one the target already holds is ``AlreadyExists`` -- and then nothing is written at all;
* a repository is written in ONE write transaction, which first checks that the target's
  store is still empty (a repository created there meanwhile is ``AlreadyExists`` and is
  left alone);
* then the target's row counts are read back and compared with the source's; on a
  mismatch, or if the write failed, the target's store of that repository is removed
  again, so a failed copy leaves no half repository behind.

Repositories already copied before a later one fails stay copied (each is whole).
The source is never changed: this is a copy, not a move.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable

from graveler.errors import AlreadyExists, CorruptedData, GravelerError, NotFound
from graveler.kv.base import REPO, TABLES, Backend, Txn

log = logging.getLogger(__name__)

BATCH = 5000  # rows per put_many


@dataclass(frozen=True)
class Copied:
    """One repository copied: its name and how many rows of each table it has."""

    name: str
    counts: dict[str, int]


def _snapshot(txn: Txn) -> dict[str, list[tuple[bytes, bytes]]]:
    return {t: [(bytes(k), bytes(v)) for k, v in txn.scan(t)] for t in TABLES}


def read_repository(src: Backend, name: str) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every row of ``name`` in ``src``, table by table, from one read snapshot."""
    with src.borrowed(name) as store:
        with store.read() as txn:
            rows = _snapshot(txn)
    if not rows[REPO]:
        raise NotFound(f"repository {name!r} has no record in {src.url} (a create that never finished)")
    return rows


def _write_all(rows: dict[str, list[tuple[bytes, bytes]]], name: str, url: str):
    def fn(txn: Txn) -> None:
        for t in TABLES:
            if txn.count(t):
                raise AlreadyExists(f"repository {name!r} appeared in {url} during the copy; left as it is")
        for t, items in rows.items():
            for i in range(0, len(items), BATCH):
                txn.put_many(t, items[i:i + BATCH])
    return fn


def copy_repository(src: Backend, dst: Backend, name: str,
                    rows: dict[str, list[tuple[bytes, bytes]]] | None = None) -> Copied:
    """Copy one repository (see the module docstring); ``AlreadyExists`` if ``dst`` holds it."""
    if rows is None:
        rows = read_repository(src, name)
    if dst.exists(name):
        raise AlreadyExists(f"repository {name!r} already exists in {dst.url}; nothing was copied")
    expected = {t: len(items) for t, items in rows.items()}
    store = dst.open(name, create=True)
    try:
        store.write(_write_all(rows, name, dst.url), durable=True)
        with store.read() as txn:
            got = {t: txn.count(t) for t in TABLES}
        if got != expected:
            raise CorruptedData(f"repository {name!r}: the copy in {dst.url} has {got} rows per table, "
                                f"the source {expected}; the copy was removed")
    except AlreadyExists:
        raise  # someone else's repository: not ours to remove
    except BaseException as e:
        try:
            dst.remove(name)
        except GravelerError as again:
            if isinstance(e, GravelerError):
                raise type(e)(f"{e} (and its partial copy could not be removed: {again})") from None
        raise
    log.info("copied repository %s (%s) from %s to %s", name,
             ", ".join(f"{t} {n}" for t, n in expected.items()), src.url, dst.url)
    return Copied(name, expected)


def copy_repositories(src: Backend, dst: Backend, names: Iterable[str] = ()) -> list[Copied]:
    """Copy ``names`` (every repository of ``src`` if none) from ``src`` to ``dst``.

    Every name is checked before anything is written: ``NotFound`` for one ``src`` lacks,
    ``AlreadyExists`` for one ``dst`` holds."""
    named = list(dict.fromkeys(names))
    names = named or src.names()
    missing = [n for n in names if not src.exists(n)]
    if missing:
        raise NotFound(f"no repository {', '.join(map(repr, missing))} in {src.url}; nothing was copied")
    present = [n for n in names if dst.exists(n)]
    if present:
        raise AlreadyExists(f"{dst.url} already holds repository {', '.join(map(repr, present))}; "
                            "nothing was copied (delete it there first, or name the others)")
    out = []
    for n in names:
        try:
            rows = read_repository(src, n)
        except NotFound:
            if named:
                raise
            continue  # a store without a record (a create that never finished) is no repository
        out.append(copy_repository(src, dst, n, rows))
    return out


__all__ = ["Copied", "copy_repositories", "copy_repository", "read_repository"]
