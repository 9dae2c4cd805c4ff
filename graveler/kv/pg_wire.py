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

import os
import socket
import struct
import threading
import time
import weakref

import psycopg
import psycopg.errors
from psycopg import pq

OID_INT8 = 20
OID_BYTEA = 17
OID_TEXT = 25

_OK = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
_BAD = pq.ConnStatus.BAD

# A server that takes a connection and then never answers (stopped with SIGSTOP, wedged, a proxy
# that hangs) would hold a statement forever: libpq waits without a bound, and TCP keepalives do
# not help (the server's kernel still answers them). So every statement sent here (and through
# PgTxn's cursor) is watched: one still unanswered after STATEMENT_TIMEOUT_S has its connection
# shut down under it, and fails with StatementTimeout, which is not retried on another
# connection. The statements watched are the KV protocol's own, each a single short round trip
# (a get, a page of a scan, an upsert, BEGIN, COMMIT); administrative statements (a repository's
# DELETE, schema creation) go through psycopg unwatched.
STATEMENT_TIMEOUT_S = 10.0
_WATCH_EVERY_S = 0.25


class StatementTimeout(psycopg.OperationalError):
    """The server did not answer a statement within :data:`STATEMENT_TIMEOUT_S` (its connection
    was shut down: the pool drops it)."""


_busy: dict[int, tuple[float, psycopg.Connection]] = {}  # id(conn) -> (deadline, conn)
_cut: set[int] = set()
_busy_lock = threading.Lock()
_watcher: threading.Thread | None = None


def watch(conn: psycopg.Connection) -> int:
    """A statement on ``conn`` goes out now; :func:`unwatch` once it returned (in a finally)."""
    global _watcher
    key = id(conn)
    with _busy_lock:
        _busy[key] = (time.monotonic() + STATEMENT_TIMEOUT_S, conn)
        if _watcher is None:
            _watcher = threading.Thread(target=_watch, name="lakefuse-pg-watch", daemon=True)
            _watcher.start()
    return key


def unwatch(key: int) -> None:
    """The statement :func:`watch` saw go out has returned; StatementTimeout if it was cut."""
    with _busy_lock:
        _busy.pop(key, None)
        if key not in _cut:
            return
        _cut.discard(key)
    raise StatementTimeout(f"no answer from the server within {STATEMENT_TIMEOUT_S:g}s "
                           "(its connection was dropped; the server hung or the network holds the packets)")


def _watch() -> None:
    while True:
        time.sleep(_WATCH_EVERY_S)
        now = time.monotonic()
        with _busy_lock:  # (under the lock: a statement that has just returned is never cut)
            for key, (deadline, conn) in list(_busy.items()):
                if now >= deadline and key not in _cut:
                    _cut.add(key)
                    _shut(conn)


def _shut(conn: psycopg.Connection) -> None:
    """Shut the connection's socket down under libpq: its wait ends, the statement fails."""
    try:
        fd = os.dup(conn.pgconn.socket)
    except (OSError, psycopg.Error):
        return
    try:
        with socket.socket(fileno=fd) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


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
    key = watch(conn)
    try:
        if name not in done:
            _check(conn, pg.prepare(name, _statements[name]))
            done.add(name)
        res = pg.exec_prepared(name, params, [1] * len(params), 1)
    finally:
        unwatch(key)
    if res is not None and res.status == pq.ExecStatus.FATAL_ERROR and \
            res.error_field(pq.DiagnosticField.SQLSTATE) == b"26000":
        done.clear()  # deallocated behind our back (DEALLOCATE ALL): prepare again next time
    return _check(conn, res)


def simple(conn: psycopg.Connection, sql: bytes) -> pq.abc.PGresult:
    """One statement (or several, ``;``-separated) in the simple protocol."""
    key = watch(conn)
    try:
        res = conn.pgconn.exec_(sql)
    finally:
        unwatch(key)
    return _check(conn, res)


def first_value(res: pq.abc.PGresult) -> bytes | None:
    """The first column of the first row (None: no row)."""
    return res.get_value(0, 0) if res.ntuples else None
