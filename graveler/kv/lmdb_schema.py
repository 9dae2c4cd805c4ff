"""The layout of an LMDB environment: its named databases (one per table), opened and checked.

The layout (named databases and their records) is kept in a named database of its own, so a
newer lakefuse's file is refused before anything is created in it. Version 1 is the layout since
the KV protocol (:data:`graveler.kv.base.TABLES`); an environment written before versions were
recorded has that same layout and is stamped 1 when first opened (the migration from
"unversioned").

Opening a named database takes LMDB's writer lock (py-lmdb opens one in a write transaction;
handles opened in a read-only one do not outlive it), so a process opening the repository waits
while another holds a write transaction: lakefuse's own are short, but a writer stopped in one
(SIGSTOP, a debugger) held every command back without a word (found by a concurrency tour). The
tables are opened in a write transaction begun here -- its wait releases the GIL, where
``open_db``'s own held it and stopped the whole process -- and a wait over :data:`WAIT_NOTE_S` is
said, once, naming the database.
"""

from __future__ import annotations

import logging
import threading

import lmdb

from graveler.errors import CorruptedData

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
META_DB = b"lakefuse-meta"
SCHEMA_KEY = b"schema_version"
WAIT_NOTE_S = 2.0  # an open waiting this long for the writer lock says so


def open_tables(env, label: str, tables) -> dict[str, object]:
    """The named databases of ``tables`` (name -> handle), after the layout's version is checked
    (CorruptedData for a newer one) or recorded (a new or unversioned environment)."""
    note = threading.Timer(WAIT_NOTE_S, log.warning, (
        "%s: waiting for another process's write transaction to end (LMDB takes one writer at a time; "
        "a process stopped inside one holds every other back)", label))
    note.daemon = True
    note.start()
    try:
        # the write transaction begun here waits for the writer lock with the GIL released (the note can
        # be said); py-lmdb's open_db without one waits holding it -- the whole process stood still
        txn = env.begin(write=True)
        try:
            try:
                meta = env.open_db(META_DB, txn=txn, create=False)
                dbs = {name: env.open_db(name.encode(), txn=txn, create=False) for name in tables}
            except lmdb.NotFoundError:
                dbs = None
            raw = txn.get(SCHEMA_KEY, db=meta) if dbs is not None else None
            if raw is not None and raw.isdigit() and int(raw) == SCHEMA_VERSION:
                txn.commit()  # (the handles outlive a committed write transaction)
                txn = None
                return dbs
        finally:
            if txn is not None:
                txn.abort()
        _check_schema(env, label, tables)  # (new, unversioned, another version: said or recorded)
        return {name: env.open_db(name.encode()) for name in tables}
    finally:
        note.cancel()


def _check_schema(env, label: str, tables) -> None:
    """Refuse an environment of a newer layout (nothing created in it); stamp a new or an
    unversioned one (same layout) with :data:`SCHEMA_VERSION`."""
    try:
        meta = env.open_db(META_DB, create=False)
    except lmdb.NotFoundError:
        meta = None
    if meta is not None:
        with env.begin(db=meta) as txn:
            raw = txn.get(SCHEMA_KEY)
        if raw is not None:
            if not raw.isdigit():
                raise CorruptedData(f"{label} is damaged: its schema version record is {raw[:32]!r}")
            version = int(raw)
            if version > SCHEMA_VERSION:
                raise CorruptedData(
                    f"{label} was written by a newer lakefuse (schema version {version}; this "
                    f"lakefuse reads up to {SCHEMA_VERSION}): upgrade lakefuse. Nothing was changed")
            if version == SCHEMA_VERSION:
                return
            # an older versioned layout would be migrated here (none exists yet)
    unversioned = any(_has_db(env, name) for name in tables)
    meta = env.open_db(META_DB)
    with env.begin(write=True, db=meta) as txn:
        txn.put(SCHEMA_KEY, str(SCHEMA_VERSION).encode())
    if unversioned:
        log.info("%s: recorded schema version %d (written before versions were recorded; same layout)",
                 label, SCHEMA_VERSION)


def _has_db(env, name: str) -> bool:
    try:
        env.open_db(name.encode(), create=False)
    except lmdb.NotFoundError:
        return False
    return True
