"""The PostgreSQL backend's hot statements on libpq directly (:mod:`graveler.kv.postgres`).

A staged write is four statements (BEGIN, a locking get of the branch, one upsert of the
records and the stamp, COMMIT); many writers on a 2-core machine are bound by the client's
CPU, not the server's. Through psycopg's cursors each statement costs 17-33 µs of client
CPU here (adapting parameters, arrays above all, and its prepare bookkeeping); through
libpq's own ``PQexecPrepared`` with parameters already in the binary wire format, 7-13 µs
(both measured on this machine). So the few statements every transaction runs go this way,
and everything else stays on psycopg cursors on the same connection (libpq is the one
state: psycopg reads the transaction status from it).

A statement is prepared once per connection, under a name of ours (the backend turns
psycopg's own preparing off on its connections: psycopg deallocates every prepared statement
of a connection when it sees a ROLLBACK; should one vanish anyway, the failing statement
clears the record and the next prepares it again). libpq releases the GIL while it waits for the server. A failed statement raises
psycopg's exception for its SQLSTATE (``psycopg.errors.error_from_result``), a lost
connection ``psycopg.OperationalError``, so callers handle both paths alike.
"""

from __future__ import annotations

import struct
import weakref

import psycopg
import psycopg.errors
from psycopg import pq

OID_INT8 = 20
OID_BYTEA = 17
OID_TEXT = 25

_OK = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
_BAD = pq.ConnStatus.BAD

# name -> SQL of the prepared statements (parameters binary; results binary)
_statements: dict[bytes, bytes] = {}
_prepared: "weakref.WeakKeyDictionary[psycopg.Connection, set[bytes]]" = weakref.WeakKeyDictionary()


def statement(name: str, sql: str) -> bytes:
    """Register a statement (``$1``-style parameters) under ``name``; the name to run it by."""
    key = f"lakefuse_{name}".encode()
    _statements[key] = sql.encode()
    return key


def array(oid: int, items: list[bytes]) -> bytes:
    """A one-dimensional array without NULLs in the binary wire format."""
    if not items:
        return struct.pack("!iiI", 0, 0, oid)
    out = [struct.pack("!iiIii", 1, 0, oid, len(items), 1)]
    for item in items:
        out.append(struct.pack("!i", len(item)))
        out.append(item)
    return b"".join(out)


def int8(n: int) -> bytes:
    return struct.pack("!q", n)


def _check(conn: psycopg.Connection, res: pq.abc.PGresult | None) -> pq.abc.PGresult:
    if res is not None and res.status in _OK:
        return res
    if res is None or conn.pgconn.status == _BAD or not res.error_field(pq.DiagnosticField.SQLSTATE):
        # no answer of the server's (no SQLSTATE): the connection failed, as psycopg would say
        msg = (res.get_error_message() if res is not None else "") or conn.pgconn.get_error_message()
        if isinstance(msg, bytes):
            msg = msg.decode("utf-8", "replace")
        raise psycopg.OperationalError(msg.strip() or "the connection to the server was lost")
    raise psycopg.errors.error_from_result(res)


def run(conn: psycopg.Connection, name: bytes, params: list[bytes]) -> pq.abc.PGresult:
    """Execute the registered statement ``name`` with binary ``params`` (binary results)."""
    pg = conn.pgconn
    done = _prepared.get(conn)
    if done is None:
        done = _prepared[conn] = set()
    if name not in done:
        _check(conn, pg.prepare(name, _statements[name]))
        done.add(name)
    res = pg.exec_prepared(name, params, [1] * len(params), 1)
    if res is not None and res.status == pq.ExecStatus.FATAL_ERROR and \
            res.error_field(pq.DiagnosticField.SQLSTATE) == b"26000":
        done.clear()  # deallocated behind our back (DEALLOCATE ALL): prepare again next time
    return _check(conn, res)


def simple(conn: psycopg.Connection, sql: bytes) -> pq.abc.PGresult:
    """One statement (or several, ``;``-separated) in the simple protocol."""
    return _check(conn, conn.pgconn.exec_(sql))


def first_value(res: pq.abc.PGresult) -> bytes | None:
    """The first column of the first row (None: no row)."""
    return res.get_value(0, 0) if res.ntuples else None
