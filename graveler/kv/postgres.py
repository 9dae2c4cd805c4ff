"""The PostgreSQL backend of the KV protocol (:mod:`graveler.kv.base`): refs and staging on a shared server.

``KVConfig(url="postgresql://USER[:PASS]@HOST[:PORT]/DB?...")`` or
``postgresql:///DB?host=/socket/dir`` -- any libpq URL, so the password may also come
from ``~/.pgpass`` or ``$PGPASSWORD`` and the URL may carry libpq options (for instance
``options=-csearch_path%3Dmyschema`` to keep lakefuse's tables in a schema of its own).

The driver is psycopg 3 with :mod:`psycopg_pool`: it is libpq itself (every libpq URL,
``.pgpass``, service files, SSL and unix sockets work as they do for ``psql``), it
passes ``bytes`` as ``bytea`` in the binary protocol without copies through text, it
prepares hot statements by itself, and it has a pool. The pool does not check a connection
before handing it out (that would be one more round trip per transaction); a
transaction's first statement is its ``BEGIN`` (with any ``SET LOCAL``, one round trip in
the simple protocol), and a connection found dead there -- a server restart -- is
dropped and another one taken before the caller's code runs, so a restart costs no
failed call, and no pool of dead sockets stays.

Schema (lakeFS's shape, one table for every repository)::

    lakefuse_kv(partition_key text, tbl text, key bytea, value bytea,
                primary key (partition_key, tbl, key))
    lakefuse_kv_schema(version int)       -- one row: the layout this table has

``partition_key`` is the repository's name, ``tbl`` one of :data:`TABLES` (a
repository's existence is a marker row in table ``.partition``, so a created store
with no record yet counts; a partial index on those rows lists repositories without
reading the others). The tables are named ``lakefuse_*`` so that a database
shared with lakeFS itself (whose table is ``kv``) stays apart. A database whose
schema version is newer than :data:`SCHEMA_VERSION` is refused (``CorruptedData``,
nothing changed), as an LMDB file in a newer format is.

Transactions: a read is ``REPEATABLE READ READ ONLY`` (one snapshot, never a
serialization failure, so the caller's ``with`` body never needs a rerun -- the price is
that a snapshot may show a write whose serial-order predecessor is still committing,
PostgreSQL's read-only anomaly; a decision that depends on what it read belongs in a
write, which is checked); a write is ``SERIALIZABLE`` and is rerun by
:meth:`PgStore.write` when the server reports a serialization failure or a deadlock
(SQLSTATE 40001 / 40P01), with jittered backoff -- the protocol lets a write function
run more than once. ``durable=True`` commits with ``synchronous_commit=on`` (the
commit record is flushed before the server answers); ``durable=False`` commits with
it off (visible at once, flushed by the WAL writer within milliseconds), and
:meth:`PgStore.sync` makes every earlier write durable by one synchronous commit of
a transaction that writes one WAL record (a WAL flush covers everything before it; a
transaction that wrote none commits without waiting for the flush, even with
``synchronous_commit=on``).

Grouped writes (:meth:`PgStore.write_grouped`: staged writes, the hot path of many writer
processes) lock instead: ``READ COMMITTED``, and every get is ``SELECT ... FOR SHARE``, so
a row a group read cannot change until the group commits (the protocol's rule: a grouped
write decides only on present keys it got). A staged write reads its branch that way: a
commit, whose seal updates the branch row, waits for the staged writes holding it, and a
staged write arriving during a seal waits for it and then reads the new staging token --
it never writes into a sealed one. Its stamp bump is a :meth:`PgTxn.add` to its process's
own stripe row (graveler.refs.manager), which no other process touches. So staged writes
of many processes share only share locks, never fail each other, and commit side by side
(one WAL flush serves many); under ``SERIALIZABLE`` they all bumped one stamp row and
queued behind each other's commit flush (2,300/s from 8 processes where this does 8,000+).

Round trips: a write buffers its upserts (``put`` / ``put_many``) and counter increments
(``add``) and sends them as one statement before its next statement of another kind or
its commit, and a transaction answers a second get of a key from what it read or wrote,
so a staged write -- or a whole group of them sharing a transaction -- is BEGIN, one get
of the branch, one upsert and COMMIT. Those statements go to libpq directly with binary
parameters (:mod:`graveler.kv.pg_wire`: a third of psycopg's client CPU per statement);
everything else uses psycopg's cursors, prepared by psycopg once hot.

Scans are paged: ``key >= start ORDER BY key LIMIT n``, then ``key > last``, so a big
staging area is never one huge fetch and no server cursor stays open while the
caller works. ``set_if`` is a compare-and-set in SQL (``UPDATE ... WHERE value =
expected``, ``INSERT ... ON CONFLICT DO NOTHING``, ``DELETE ... WHERE value =
expected``). :meth:`PgStore.write_grouped` batches concurrent callers of a process into
one transaction as the LMDB backend does; a failing group reruns each caller alone.

Errors: psycopg never escapes. An unreachable server or a dropped connection is
``StoreUnavailable`` naming the server (user@host:port/db, never the password); a
malformed URL is ``InvalidArgument``; so is a login the server refuses (wrong or missing
password, unknown role or database), with the server's one-line reason. Credentials are never logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from typing import Callable, Iterator, TypeVar

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from graveler.errors import CorruptedData, GravelerError, InvalidArgument, NotFound, StoreUnavailable
from graveler.kv import pg_probe, pg_wire
from graveler.kv.pg_url import one_line, parse_url, password_of, redact, unavailable
from graveler.kv.base import MAX_KEY_BYTES, TABLES, GroupCommit, NestedTransaction, ThreadTxns

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 1
KV_TABLE = "lakefuse_kv"
SCHEMA_TABLE = "lakefuse_kv_schema"
PARTITION_MARKER = ".partition"  # tbl of the row that says a repository exists
SCAN_PAGE = 1000  # rows per page of an ordered scan
POOL_MAX = 8  # connections per backend (a process)
POOL_TIMEOUT_S = 10.0  # wait for a pooled connection before the server counts as unreachable
QUICK_WAIT_S = 0.5  # no pooled connection this soon: check whether the server is up at all
CONNECT_TIMEOUT_S = 10  # libpq connect_timeout when the URL sets none
SUSPECT_S = 60.0  # after a statement timed out or a connect failed: how long calls ask pg_probe first
WRITE_RETRY_S = 60.0  # serialization failures are retried for this long
_RETRY_SQLSTATES = ("40001", "40P01")  # serialization_failure, deadlock_detected
_ADVISORY_LOCK = 0x6C616B65  # "lake": serializes schema creation among processes

_SCHEMA_SQL = f"""
CREATE TABLE IF NOT EXISTS {KV_TABLE} (
    partition_key text NOT NULL,
    tbl text NOT NULL,
    key bytea NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (partition_key, tbl, key)
);
CREATE INDEX IF NOT EXISTS {KV_TABLE}_partitions ON {KV_TABLE} (partition_key) WHERE tbl = '{PARTITION_MARKER}';
CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    version integer NOT NULL
);
"""



# The statements every transaction runs, on libpq directly (graveler.kv.pg_wire): a get, a locking
# transaction's get (the row cannot change until it commits), the buffered upserts, the buffered
# counter increments, and both of those in one statement.
_W_GET_SQL = f"SELECT value FROM {KV_TABLE} WHERE partition_key = $1::text AND tbl = $2::text AND key = $3::bytea"
_W_GET = pg_wire.statement("get", _W_GET_SQL)
_W_GET_SHARE = pg_wire.statement("get_share", _W_GET_SQL + " FOR SHARE")
# Two keys in one round trip, each by its own primary-key lookup (a join with an array's rows was
# planned as a scan once the table grew past what its statistics knew): rows tagged 0 and 1.
_W_GET2_SQL = ("WITH a AS (" + _W_GET_SQL + "{lock}), b AS ("
               + _W_GET_SQL.replace("$2", "$4").replace("$3", "$5") + "{lock}) "
               "SELECT 0, value FROM a UNION ALL SELECT 1, value FROM b")
_W_GET2 = pg_wire.statement("get2", _W_GET2_SQL.format(lock=""))
_W_GET2_SHARE = pg_wire.statement("get2_share", _W_GET2_SQL.format(lock=" FOR SHARE"))
_W_RANGE = pg_wire.statement("range", f"SELECT key, value FROM {KV_TABLE} WHERE partition_key = $1::text AND "
                                      "tbl = $2::text AND key >= $3::bytea AND key < $4::bytea ORDER BY key")
_UPSERT = (f"INSERT INTO {KV_TABLE} SELECT $1::text, t, k, v FROM unnest($2::text[], $3::bytea[], $4::bytea[]) "
           "AS u(t, k, v) ON CONFLICT (partition_key, tbl, key) DO UPDATE SET value = EXCLUDED.value")
_U64 = "('x' || encode({}, 'hex'))::bit(64)::bigint"  # an 8-byte big-endian bytea as a number
_ADD = (f"INSERT INTO {KV_TABLE} SELECT $1::text, t, k, int8send(d) FROM unnest(${{0}}::text[], ${{1}}::bytea[], "
        f"${{2}}::int8[]) AS u(t, k, d) ON CONFLICT (partition_key, tbl, key) DO UPDATE SET value = "
        f"int8send({_U64.format(KV_TABLE + '.value')} + {_U64.format('EXCLUDED.value')})")
_W_UPSERT = pg_wire.statement("upsert", _UPSERT)
_W_ADD = pg_wire.statement("add", _ADD.format(2, 3, 4))
_W_UPSERT_ADD = pg_wire.statement("upsert_add", f"WITH p AS ({_UPSERT}) {_ADD.format(5, 6, 7)}")


# -- transactions -------------------------------------------------------------------


_MISS = object()  # not in a transaction's cache


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, (bytes, bytearray, memoryview)) or not 0 < len(key) <= MAX_KEY_BYTES:
        raise InvalidArgument(f"a key must be 1 to {MAX_KEY_BYTES} bytes")
    return bytes(key)


class PgTxn:
    """The protocol's transaction (:class:`graveler.kv.base.Txn`) on one pooled connection."""

    __slots__ = ("_conn", "_cursor", "_part", "_part_b", "_write", "_pending", "_adds", "_seen", "_get")

    def __init__(self, conn: psycopg.Connection, partition: str, write: bool, locking: bool = False):
        self._conn = conn
        self._cursor: psycopg.Cursor | None = None  # for the statements not in pg_wire, made when first needed
        self._part = partition
        self._part_b = partition.encode()
        self._write = write
        self._get = _W_GET_SHARE if locking else _W_GET
        self._adds: dict[tuple[str, bytes], int] = {}  # counter increments not yet sent (with the upserts)
        # Upserts not yet sent: (table, key) -> value. They go to the server as ONE statement before
        # the next statement of any other kind and before the commit (:meth:`flush`), so a staged
        # write's stamp bump and its records cost one round trip, and the order of effects is kept.
        self._pending: dict[tuple[str, bytes], bytes] = {}
        # What this transaction has read or written of single keys ((table, key) -> value, None:
        # absent). Its snapshot never changes but by its own writes, so a second get of a key (a
        # group of staged writes reads one branch and one stamp once each) needs no round trip.
        self._seen: dict[tuple[str, bytes], bytes | None] = {}

    def _x(self, sql: str, params: tuple) -> psycopg.Cursor:
        if self._pending or self._adds:
            self.flush()
        if self._cursor is None:
            self._cursor = self._conn.cursor()
        key = pg_wire.watch(self._conn)
        try:
            return self._cursor.execute(sql, params, binary=True)
        finally:
            pg_wire.unwatch(key)

    def _q(self, sql: str, *params) -> psycopg.Cursor:
        return self._x(sql, (self._part, *params))

    def flush(self) -> None:
        """Send the buffered upserts and counter increments: one multi-row ``INSERT ... ON
        CONFLICT`` each, and both in one statement (a data-modifying ``WITH``) when they touch
        different keys."""
        pending, self._pending = self._pending, {}
        adds, self._adds = self._adds, {}
        if not pending and not adds:
            return
        arr = pg_wire.array
        put_args = [arr(pg_wire.OID_TEXT, [t.encode() for t, _ in pending]),
                    arr(pg_wire.OID_BYTEA, [k for _, k in pending]), arr(pg_wire.OID_BYTEA, list(pending.values()))]
        add_args = [arr(pg_wire.OID_TEXT, [t.encode() for t, _ in adds]), arr(pg_wire.OID_BYTEA, [k for _, k in adds]),
                    arr(pg_wire.OID_INT8, [pg_wire.int8(d) for d in adds.values()])]
        self._seen.update(pending)
        for k in adds:
            self._seen.pop(k, None)
        if pending and adds and pending.keys().isdisjoint(adds.keys()):
            pg_wire.run(self._conn, _W_UPSERT_ADD, [self._part_b, *put_args, *add_args])
            return
        if pending:
            pg_wire.run(self._conn, _W_UPSERT, [self._part_b, *put_args])
        if adds:
            pg_wire.run(self._conn, _W_ADD, [self._part_b, *add_args])

    def _writing(self) -> None:
        if not self._write:
            raise InvalidArgument("a write in a read transaction")

    def get(self, table: str, key: bytes) -> bytes | None:
        k = (table, bytes(key))
        v = self._pending.get(k, _MISS)
        if v is _MISS:
            v = self._seen.get(k, _MISS)
            if v is _MISS:
                if self._pending or self._adds:
                    self.flush()
                v = self._seen[k] = pg_wire.first_value(
                    pg_wire.run(self._conn, self._get, [self._part_b, table.encode(), k[1]]))
        return v

    def get_many(self, keys: list[tuple[str, bytes]]) -> list[bytes | None]:
        want = [k for k in dict.fromkeys((t, bytes(key)) for t, key in keys)
                if k not in self._pending and k not in self._seen]
        for i in range(0, len(want) - 1, 2):  # two at a time (one left over: get's own statement)
            if self._pending or self._adds:
                self.flush()
            (t1, k1), (t2, k2) = want[i], want[i + 1]
            res = pg_wire.run(self._conn, _W_GET2_SHARE if self._get is _W_GET_SHARE else _W_GET2,
                              [self._part_b, t1.encode(), k1, t2.encode(), k2])
            got = [None, None]
            for r in range(res.ntuples):
                got[int.from_bytes(res.get_value(r, 0), "big")] = res.get_value(r, 1)
            self._seen[want[i]], self._seen[want[i + 1]] = got
        return [self.get(t, key) for t, key in keys]

    def _saw(self, table: str, key: bytes, done: bool, value: bytes | None) -> bool:
        """After a conditional change of ``key``: its value is ``value`` if ``done``, else unknown here."""
        if done:
            self._seen[(table, key)] = value
        else:
            self._seen.pop((table, key), None)
        return done

    def put(self, table: str, key: bytes, value: bytes) -> None:
        self._writing()
        self._pending[(table, _check_key(key))] = bytes(value)

    def put_many(self, table: str, items: list[tuple[bytes, bytes]]) -> int:
        self._writing()
        pending = self._pending  # a dict: one row is never upserted twice in a statement (the last value wins)
        for k, v in items:
            pending[(table, _check_key(k))] = bytes(v)
        return len(items)

    def insert(self, table: str, key: bytes, value: bytes) -> bool:
        self._writing()
        key, value = _check_key(key), bytes(value)
        return self._saw(table, key, self._q(f"INSERT INTO {KV_TABLE} VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                                             table, key, value).rowcount == 1, value)

    def set_if(self, table: str, key: bytes, value: bytes | None, expected: bytes | None) -> bool:
        self._writing()
        key = _check_key(key)
        if expected is None and value is None:
            return self.get(table, key) is None
        if expected is None:
            return self.insert(table, key, value)
        where = "partition_key = %s AND tbl = %s AND key = %s AND value = %s"
        if value is None:
            return self._saw(table, key, self._q(f"DELETE FROM {KV_TABLE} WHERE {where}", table, key,
                                                 bytes(expected)).rowcount == 1, None)
        value = bytes(value)
        return self._saw(table, key, self._x(f"UPDATE {KV_TABLE} SET value = %s WHERE {where}",
                                             (value, self._part, table, key, bytes(expected))).rowcount == 1, value)

    def delete(self, table: str, key: bytes) -> bool:
        self._writing()
        key = bytes(key)
        n = self._q(f"DELETE FROM {KV_TABLE} WHERE partition_key = %s AND tbl = %s AND key = %s", table, key).rowcount
        self._seen[(table, key)] = None
        return n == 1

    def scan(self, table: str, start: bytes = b"", end: bytes | None = None,
             values: bool = True) -> Iterator[tuple[bytes, bytes | None]]:
        cols = "key, value" if values else "key"
        bound = "" if end is None else " AND key < %s"
        tail = () if end is None else (bytes(end),)
        op, after = ">=", bytes(start)
        while True:
            rows = self._q(f"SELECT {cols} FROM {KV_TABLE} WHERE partition_key = %s AND tbl = %s "
                           f"AND key {op} %s{bound} ORDER BY key LIMIT {SCAN_PAGE}", table, after, *tail).fetchall()
            for row in rows:
                yield (row[0], row[1]) if values else (row[0], None)
            if len(rows) < SCAN_PAGE:
                return
            op, after = ">", rows[-1][0]

    def delete_range(self, table: str, start: bytes, end: bytes | None, limit: int | None = None) -> int:
        self._writing()
        self.flush()
        self._seen.clear()
        bound = "" if end is None else " AND key < %s"
        params = (table, bytes(start)) + (() if end is None else (bytes(end),))
        sel = f"partition_key = %s AND tbl = %s AND key >= %s{bound}"
        if limit is not None:
            # The last key to go, then one range delete: two index range scans. (A ``key IN (SELECT ...
            # LIMIT n)`` may be planned as a nested loop that rescans the subquery per row, quadratic
            # while the table's statistics still say the range is small.)
            if limit <= 0:
                return 0
            row = self._q(f"SELECT key FROM {KV_TABLE} WHERE {sel} ORDER BY key OFFSET %s LIMIT 1",
                          *params, int(limit) - 1).fetchone()
            if row is not None:
                return self._q(f"DELETE FROM {KV_TABLE} WHERE {sel} AND key <= %s", *params, row[0]).rowcount
        return self._q(f"DELETE FROM {KV_TABLE} WHERE {sel}", *params).rowcount

    def count(self, table: str) -> int:
        return self._q(f"SELECT count(*) FROM {KV_TABLE} WHERE partition_key = %s AND tbl = %s",
                       table).fetchone()[0]

    def add(self, table: str, key: bytes, delta: int) -> None:
        self._writing()
        k = (table, _check_key(key))
        if k in self._pending:  # put then add in one transaction: keep their order
            self.flush()
        self._adds[k] = self._adds.get(k, 0) + int(delta)


# -- stores ----------------------------------------------------------------------------


class PgStore:
    """One repository's partition of the backend's table (see the module docstring)."""

    def __init__(self, backend: "PgBackend", repo: str):
        self.backend = backend
        self.repo = repo
        self.label = f"repository {repo!r}: refs on {backend.server}"
        self._txns = ThreadTxns()
        self._grouped = GroupCommit(self._write_locking)
        self.closed = False

    stats_retries = 0  # write transactions rerun after a serialization failure or deadlock

    def get(self, table: str, key: bytes) -> bytes | None:
        held = self._txns.held()
        if held is not None:
            return held.get(table, key)
        return self.backend.get_one(self.label, self.repo, table, bytes(key))

    def get_range(self, table: str, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        held = self._txns.held()
        if held is not None:
            return list(held.scan(table, start, end))
        return self.backend.get_range(self.label, self.repo, table, bytes(start), bytes(end))

    @contextlib.contextmanager
    def read(self) -> Iterator[PgTxn]:
        held = self._txns.held()
        if held is not None:
            yield held
            return
        with self.backend.transaction(self.label, write=False) as conn:
            t = PgTxn(conn, self.repo, write=False)
            with self._txns.holding(t):
                yield t

    def write(self, fn: Callable[[PgTxn], T], durable: bool = True, locking: bool = False) -> T:
        if self._txns.held() is not None:
            raise NestedTransaction(f"{self.label}: a write was asked for inside another transaction of the "
                                    "same thread; finish that one first")

        def body(conn: psycopg.Connection) -> T:
            t = PgTxn(conn, self.repo, write=True, locking=locking)
            with self._txns.holding(t):
                result = fn(t)
            t.flush()
            return result
        return self.backend.run_write(self.label, body, durable, locking)

    def _write_locking(self, fn: Callable[[PgTxn], T], durable: bool = True) -> T:
        """A grouped write: READ COMMITTED, every present key it gets locked ``FOR SHARE``."""
        return self.write(fn, durable, locking=True)

    def write_grouped(self, fn: Callable[[PgTxn], T], durable: bool = True) -> T:
        if self._txns.held() is not None:
            return self.write(fn, durable)  # raises NestedTransaction
        return self._grouped.run(fn, durable)

    def sync(self) -> None:
        self.backend.sync(self.label)

    def close(self) -> None:
        self.closed = True

    def stat(self) -> dict[str, int]:
        with self.read() as txn:
            return {name: txn.count(name) for name in TABLES}


class _Retry(Exception):
    """The server asked for the transaction to be run again (40001 / 40P01)."""


# -- the backend -------------------------------------------------------------------


class PgBackend:
    """``postgresql://...``: every repository of a home in one table of one database."""

    def __init__(self, url: str, pool_timeout: float = POOL_TIMEOUT_S):
        self._secret = password_of(url)
        params, self.server = parse_url(url)
        self.url = redact(url)
        if "connect_timeout" not in params:
            params["connect_timeout"] = str(CONNECT_TIMEOUT_S)
        self._params = params
        self._probe_at = pg_probe.server_address(params)  # (None: several hosts; no probe)
        self._suspect_until = 0.0  # calls ask pg_probe first until then (a hang or a failed connect: _suspect)
        self._stores: dict[str, PgStore] = {}
        self._lock = threading.Lock()
        self._unsynced = 0  # non-durable commits since the last sync
        self._out = 0  # pooled connections checked out (_pooled)
        self._check_schema()
        # No check at checkout (it would cost a round trip per transaction): every transaction's first
        # statement is its BEGIN, and a connection found dead there is replaced before the caller runs.
        self.pool = ConnectionPool(kwargs={**params, "autocommit": True}, min_size=1, max_size=POOL_MAX,
                                   timeout=pool_timeout,
                                   configure=_configure, name=f"lakefuse-kv {self.server}", open=False)
        try:
            self.pool.open(wait=True, timeout=pool_timeout)
        except PoolTimeout:
            self.pool.close()
            raise StoreUnavailable(f"{self.server}: no connection within {pool_timeout:g}s") from None

    # -- connections

    def _connect(self) -> psycopg.Connection:
        try:
            return psycopg.connect(**self._params, autocommit=True)
        except psycopg.Error as e:
            raise unavailable(self.server, e, self._secret) from None

    def _check_schema(self) -> None:
        """Create the tables when absent; refuse a database whose schema is newer than this code.

        Tables that exist are not created again, so a host's role needs only row access
        (SELECT, INSERT, UPDATE, DELETE) once an owner role has made them."""
        with self._connect() as conn:
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_LOCK,))
                    made = conn.execute("SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
                                        (KV_TABLE, SCHEMA_TABLE)).fetchone()[0]
                    if not made:
                        conn.execute(_SCHEMA_SQL)
                    row = conn.execute(f"SELECT version FROM {SCHEMA_TABLE}").fetchone()
                    if row is None:
                        conn.execute(f"INSERT INTO {SCHEMA_TABLE} (version) VALUES (%s)", (SCHEMA_VERSION,))
                    elif row[0] > SCHEMA_VERSION:
                        raise CorruptedData(
                            f"{self.server}: the refs tables are at schema version {row[0]}, newer than this "
                            f"lakefuse knows (version {SCHEMA_VERSION}); upgrade lakefuse. Nothing was changed")
            except psycopg.Error as e:
                raise unavailable(self.server, e, self._secret) from None

    @contextlib.contextmanager
    def transaction(self, label: str, write: bool, durable: bool = True,
                    locking: bool = False) -> Iterator[psycopg.Connection]:
        """One transaction on a pooled connection; psycopg's errors become graveler's. A
        ``locking`` write runs at READ COMMITTED (its caller locks what it reads)."""
        if not write:
            begin = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        else:
            begin = b"BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE" if locking else \
                b"BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE"
            if not durable:
                begin += b"; SET LOCAL synchronous_commit = off"
        try:
            for attempt in range(POOL_MAX + 1):
                with self._pooled(label) as conn:
                    try:
                        pg_wire.simple(conn, begin)  # one round trip (BEGIN; SET: the simple protocol takes both)
                    except pg_wire.StatementTimeout:
                        raise  # a hung server: another connection would wait as long
                    except psycopg.OperationalError:
                        conn.close()  # died while pooled (a server restart): the pool drops it
                        if attempt < POOL_MAX:
                            continue  # take another
                        raise
                    done = False
                    try:
                        yield conn
                        done = True
                    finally:
                        if not done and not conn.broken:
                            with contextlib.suppress(psycopg.Error):
                                pg_wire.simple(conn, b"ROLLBACK")
                    if pg_wire.simple(conn, b"COMMIT").command_status != b"COMMIT":  # an aborted one "commits" as ROLLBACK
                        raise psycopg.errors.InFailedSqlTransaction("the transaction was aborted and rolled back")
                    break
            if write and not durable:
                with self._lock:
                    self._unsynced += 1
        except PoolTimeout:  # (a psycopg.OperationalError too)
            raise StoreUnavailable(f"{label}: no connection within {self.pool.timeout:g}s: {self._why()}") from None
        except psycopg.Error as e:
            if write and getattr(e, "sqlstate", None) in _RETRY_SQLSTATES:
                raise _Retry from None
            raise self._error(label, e) from None

    def _suspect(self) -> None:
        """The server did not answer (a statement's watch ran out, a connect failed): the calls of
        the next :data:`SUSPECT_S` ask :mod:`graveler.kv.pg_probe` first."""
        if self._probe_at is not None:
            self._suspect_until = time.monotonic() + SUSPECT_S

    def _error(self, label: str, e: psycopg.Error) -> GravelerError:
        if isinstance(e, pg_wire.StatementTimeout):
            self._suspect()
        if isinstance(e, psycopg.errors.ProgramLimitExceeded):
            return InvalidArgument(f"{label}: {one_line(e, self._secret)}")
        return StoreUnavailable(f"{label}: {one_line(e, self._secret)}")

    def get_one(self, label: str, partition: str, table: str, key: bytes) -> bytes | None:
        """One key's value in one statement and one round trip: no BEGIN / COMMIT (a single
        statement is a consistent snapshot by itself), prepared by psycopg once it is hot."""
        return self._statement(label, lambda conn: pg_wire.first_value(
            pg_wire.run(conn, _W_GET, [partition.encode(), table.encode(), key])))

    def get_range(self, label: str, partition: str, table: str, start: bytes,
                  end: bytes) -> list[tuple[bytes, bytes]]:
        """A small key range in one statement (as :meth:`get_one`)."""
        def run(conn: psycopg.Connection) -> list[tuple[bytes, bytes]]:
            res = pg_wire.run(conn, _W_RANGE, [partition.encode(), table.encode(), start, end])
            return [(res.get_value(i, 0), res.get_value(i, 1)) for i in range(res.ntuples)]
        return self._statement(label, run)

    def _statement(self, label: str, run: Callable[[psycopg.Connection], T]) -> T:
        """``run(conn)``: one read statement on its own (autocommit); a connection found dead is
        replaced and the statement sent again."""
        try:
            for attempt in range(POOL_MAX + 1):
                with self._pooled(label) as conn:
                    try:
                        return run(conn)
                    except pg_wire.StatementTimeout:
                        raise  # a hung server: another connection would wait as long
                    except psycopg.OperationalError:
                        conn.close()  # died while pooled (a server restart): the pool drops it
                        if attempt < POOL_MAX:
                            continue  # take another
                        raise
        except PoolTimeout:
            raise StoreUnavailable(f"{label}: no connection within {self.pool.timeout:g}s: {self._why()}") from None
        except psycopg.Error as e:
            raise self._error(label, e) from None
        raise StoreUnavailable(f"{label}: every pooled connection was broken")  # not reached: the pool refills

    @contextlib.contextmanager
    def _pooled(self, label: str) -> Iterator[psycopg.Connection]:
        """A pooled connection for the ``with`` block. A pool with none to give within
        :data:`QUICK_WAIT_S` asks the server directly: if it is down, that is ``StoreUnavailable``
        now (a request of the mount must not hang for the pool's whole timeout while the database
        restarts); if it answers, the pool is only busy and the wait goes on."""
        if self._suspect_until and time.monotonic() < self._suspect_until:
            if pg_probe.hung(self._probe_at):  # (fail now, not after the whole watch or a connect timeout)
                raise StoreUnavailable(f"{label}: the server does not answer (nothing within "
                                       f"{pg_probe.PROBE_TIMEOUT_S:g}s; a statement or a connect timed out before)")
            self._suspect_until = 0.0
        try:
            conn = self.pool.getconn(timeout=min(QUICK_WAIT_S, self.pool.timeout))
        except PoolTimeout:
            try:
                direct = psycopg.connect(**{**self._params, "connect_timeout": "3"}, autocommit=True)
            except psycopg.Error as e:
                self._suspect()
                raise StoreUnavailable(f"{label}: no connection: {one_line(e, self._secret)}") from None
            if self._out < POOL_MAX:  # the server answers, the pool gave nothing, not all its connections
                # are out: it waits out its reconnect backoff (uncapped doubling): this connection serves
                with direct:
                    _configure(direct)
                    yield direct
                return
            direct.close()
            conn = self.pool.getconn()  # all out: the pool is busy, and its wait is the right one
        with self._lock:
            self._out += 1
        try:
            yield conn
        finally:
            with self._lock:
                self._out -= 1
            self.pool.putconn(conn)

    def _why(self) -> str:
        """Why the pool has no connection to give: the server's (or libpq's) answer to a fresh connect."""
        try:
            psycopg.connect(**{**self._params, "connect_timeout": "3"}).close()
        except psycopg.Error as e:
            self._suspect()
            return one_line(e, self._secret)
        return f"all {POOL_MAX} connections of this process are busy"

    def run_write(self, label: str, body: Callable[[psycopg.Connection], T], durable: bool = True,
                  locking: bool = False) -> T:
        """``body(cursor)`` in a SERIALIZABLE transaction (``locking``: READ COMMITTED), rerun
        (jittered backoff) while the server answers 40001 / 40P01; its result once committed."""
        deadline = time.monotonic() + WRITE_RETRY_S
        delay = 0.002
        while True:
            try:
                with self.transaction(label, write=True, durable=durable, locking=locking) as conn:
                    return body(conn)
            except _Retry:
                if time.monotonic() > deadline:
                    raise StoreUnavailable(f"{label}: a write kept conflicting with concurrent writes for "
                                           f"{WRITE_RETRY_S:.0f}s; try again") from None
                PgStore.stats_retries += 1
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.25)

    def sync(self, label: str) -> None:
        """Make every commit of this process so far durable: one synchronous commit flushes the WAL up to it."""
        with self._lock:
            n, self._unsynced = self._unsynced, 0
        if not n:
            return
        try:
            # a WAL record in the transaction: its commit then waits for the flush, which covers every
            # earlier commit (one that wrote no WAL -- an xid alone -- is committed without waiting)
            self.run_write(label, lambda conn: conn.execute("SELECT pg_logical_emit_message(true, 'lakefuse', 'sync')"))
        except BaseException:
            with self._lock:
                self._unsynced += n
            raise

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self.transaction(self.server, write=False) as conn:
            return conn.execute(sql, params).fetchall()

    # -- the protocol

    def open(self, repo: str, create: bool = True) -> PgStore:
        if not repo:
            raise InvalidArgument("a repository name must not be empty")
        with self._lock:
            store = self._stores.get(repo)
        if store is None or store.closed:
            if create:
                store = PgStore(self, repo)
                store.write(lambda t: t._q(f"INSERT INTO {KV_TABLE} VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                                           PARTITION_MARKER, b"", b""))
            elif not self.exists(repo):
                raise NotFound(f"repository {repo!r}: no refs on {self.server}")
            else:
                store = PgStore(self, repo)
            with self._lock:
                cur = self._stores.get(repo)
                if cur is not None and not cur.closed:
                    return cur
                self._stores[repo] = store
        return store

    def exists(self, repo: str) -> bool:
        return bool(self._query(f"SELECT 1 FROM {KV_TABLE} WHERE partition_key = %s AND tbl = %s AND key = ''",
                                (repo, PARTITION_MARKER)))

    def names(self) -> list[str]:
        rows = self._query(f"SELECT partition_key FROM {KV_TABLE} WHERE tbl = %s", (PARTITION_MARKER,))
        return sorted(r[0] for r in rows)

    @contextlib.contextmanager
    def borrowed(self, repo: str) -> Iterator[PgStore]:
        yield self.open(repo, create=False)

    def close(self, repo: str) -> None:
        with self._lock:
            store = self._stores.pop(repo, None)
        if store is not None:
            store.close()

    def refuse_in_use(self, repo: str, doing: str) -> None:
        """(Another process's use is not seen here: nothing is refused.)"""

    def remove(self, repo: str) -> None:
        self.close(repo)
        self.run_write(f"repository {repo!r}: refs on {self.server}",
                       lambda conn: conn.execute(f"DELETE FROM {KV_TABLE} WHERE partition_key = %s", (repo,)))

    def shutdown(self) -> None:
        """Close every connection of this backend (it is unusable after)."""
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for s in stores:
            s.close()
        self.pool.close()


def _configure(conn: psycopg.Connection) -> None:
    conn.execute("SET synchronous_commit = on")  # durable commits whatever the server's default
    # psycopg prepares nothing on these connections: the hot statements are prepared by pg_wire, and
    # psycopg answers a ROLLBACK it sees by deallocating every prepared statement, pg_wire's included.
    conn.prepare_threshold = None


# One backend (one pool) per URL and process: every Graveler of the process shares it.
_registry_lock = threading.Lock()
_registry: dict[tuple[int, str], PgBackend] = {}


def open_pg_backend(url: str) -> PgBackend:
    """The process-wide backend of ``url`` (connected, schema checked, on first use)."""
    key = (os.getpid(), url)
    with _registry_lock:
        b = _registry.get(key)
        if b is None:
            b = _registry[key] = PgBackend(url)
        return b


def close_pg_backends() -> None:
    """Close every backend of this process (tests; a process exiting needs not)."""
    with _registry_lock:
        backends = list(_registry.values())
        _registry.clear()
    for b in backends:
        b.shutdown()


__all__ = ["PgBackend", "PgStore", "PgTxn", "SCHEMA_VERSION", "close_pg_backends", "open_pg_backend",
           "parse_url"]
