"""The KV protocol: what refs and staging need of a key-value store, and nothing more.

The size is lakeFS's ``kv.Store`` (Get, Set, SetIf, Delete, Scan): a backend offers

* a :class:`Backend` -- where the repositories of a home keep their refs and staging:
  open one repository's :class:`Store`, list, test and remove repositories;
* a :class:`Store` -- one repository's partition: short read transactions
  (:meth:`Store.read`, a consistent snapshot) and write transactions
  (:meth:`Store.write`) that are **serializable** and may be run more than once
  (a backend retries them on a serialization failure, LMDB after growing its map),
  so a write function must have no side effect outside its transaction;
* a :class:`Txn` -- get / put / insert / delete / compare-and-set / ordered scan from a
  key / range delete / count, on one of the named :data:`TABLES`.

Durability is part of the protocol: ``write(fn, durable=True)`` returns only once the
transaction is durable; ``durable=False`` returns once it is committed and visible
(never half-applied), and a later :meth:`Store.sync` makes every write before it
durable. Concurrent writers may share one transaction and one sync
(:meth:`Store.write_grouped`, group commit), which a backend keeps inside itself.

Nesting: a thread holds at most one transaction of a store. A read inside a read or
write of the same thread is that transaction; a write inside either raises
:class:`NestedTransaction` at once.

Keys are bytes, compared bytewise; every backend takes keys up to
:data:`MAX_KEY_BYTES` (LMDB's limit decides it for all, so a path that fits one
backend fits every one). A shared backend keeps each repository in its own
partition (the repository's name goes with every key it stores); an embedded one
may keep one file per repository -- callers never see the difference.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, ContextManager, Iterator, Protocol, TypeVar

from graveler.errors import GravelerError

T = TypeVar("T")

# The named tables of a repository.
REPO = "repo"  # b"record" -> repository record (JSON)
BRANCHES = "branches"  # branch name -> graveler_pb2.BranchData
TAGS = "tags"  # tag name -> graveler_pb2.TagData
COMMITS = "commits"  # commit ID (hex) -> graveler_pb2.CommitData
STAGING = "staging"  # token + b"\0" + path -> staged value or tombstone
STAMPS = "stamps"  # branch name [+ b"\0" + writer stripe] -> u64 big-endian counter (graveler.refs.manager)
TABLES = (REPO, BRANCHES, TAGS, COMMITS, STAGING, STAMPS)

MAX_KEY_BYTES = 511  # LMDB's key limit; the one limit of every backend


class NestedTransaction(GravelerError):
    """A thread asked for a write transaction while it holds one of the same store (a bug in the caller)."""


class Txn(Protocol):
    """One transaction: a snapshot to read, and (for a write) the changes it makes."""

    def get(self, table: str, key: bytes) -> bytes | None:
        """The value of ``key``, or None."""

    def get_many(self, keys: list[tuple[str, bytes]]) -> list[bytes | None]:
        """The values of several ``(table, key)``, in order (None: absent); a server's store reads
        them in one round trip, and a later :meth:`get` of one of them needs none."""

    def put(self, table: str, key: bytes, value: bytes) -> None:
        """Set ``key`` to ``value``."""

    def put_many(self, table: str, items: list[tuple[bytes, bytes]]) -> int:
        """Set every (key, value) of ``items``; return how many."""

    def insert(self, table: str, key: bytes, value: bytes) -> bool:
        """Set ``key`` only if it is absent: False (and nothing changed) if it was there."""

    def set_if(self, table: str, key: bytes, value: bytes | None, expected: bytes | None) -> bool:
        """Compare-and-set: if ``key`` holds ``expected`` (None: absent), set it to ``value``
        (None: delete it) and return True; else change nothing and return False."""

    def delete(self, table: str, key: bytes) -> bool:
        """Remove ``key``; False if it was absent."""

    def scan(self, table: str, start: bytes = b"", end: bytes | None = None,
             values: bool = True) -> Iterator[tuple[bytes, bytes | None]]:
        """(key, value) with ``start <= key < end`` (no ``end``: to the last key), in key
        order; with ``values=False`` the values are None. Consume it inside the
        transaction, and change nothing in ``table`` while it runs."""

    def delete_range(self, table: str, start: bytes, end: bytes | None, limit: int | None = None) -> int:
        """Remove the keys ``start <= key < end`` (at most ``limit``, the first ones); return how many."""

    def count(self, table: str) -> int:
        """How many keys ``table`` holds."""

    def add(self, table: str, key: bytes, delta: int) -> None:
        """Add ``delta`` to the counter at ``key`` (a u64 big-endian value; absent: 0) without
        reading it first, so concurrent adds to one key never fail each other (a server applies
        each to the latest committed value)."""


class Store(Protocol):
    """One repository's refs and staging (see the module docstring)."""

    label: str  # how messages name it, e.g. "repository 'x': refs database /home/.../refs.lmdb"

    def read(self) -> ContextManager[Txn]:
        """A read snapshot; keep the ``with`` body short and free of I/O."""

    def get(self, table: str, key: bytes) -> bytes | None:
        """One key's value (None if absent): a read of its own, as cheap as the backend can
        make it (one statement on a server); inside a transaction of this thread, that
        transaction's view."""

    def write(self, fn: Callable[[Txn], T], durable: bool = True) -> T:
        """Run ``fn(txn)`` in one serializable write transaction (perhaps more than once) and
        commit it; return its result. An exception from ``fn`` aborts and propagates."""

    def write_grouped(self, fn: Callable[[Txn], T], durable: bool = True) -> T:
        """:meth:`write`, sharing a transaction and a sync with concurrent callers; one
        caller's error is its own (the group is retried one by one).

        For the hot path of many writers (staged writes), a backend may run a group with
        row locks instead of serializable snapshots: every key ``fn`` gets that exists is
        locked against change (shared) until the commit, so a decision resting on such a key
        stays true; an absent key and a scan are read as of the statement, unprotected. So
        ``fn`` may decide only on present keys it got; counters it bumps use :meth:`Txn.add`."""

    def get_range(self, table: str, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """The (key, value) pairs with ``start <= key < end``, as one read of their own (one
        statement on a server), for ranges known to be small; inside a transaction of this
        thread, that transaction's view."""

    def sync(self) -> None:
        """Make every write of this process so far durable."""

    def close(self) -> None:
        """Release the store (later calls are errors)."""


class Backend(Protocol):
    """Where a home's repositories keep refs and staging."""

    url: str  # the backend's name as configured (``lmdb``, ``memory://NAME``)

    def open(self, repo: str, create: bool = True) -> Store:
        """The process-wide store of ``repo`` (NotFound when absent and not ``create``)."""

    def exists(self, repo: str) -> bool:
        """Whether ``repo`` has a store (a create that never wrote its record counts)."""

    def names(self) -> list[str]:
        """Every repository that has a store, by name."""

    def borrowed(self, repo: str) -> ContextManager[Store]:
        """The open store of ``repo``, or one opened for the ``with`` block and closed after it."""

    def close(self, repo: str) -> None:
        """Close ``repo``'s store if this process has it open."""

    def remove(self, repo: str) -> None:
        """Forget ``repo``'s refs and staging entirely."""

    def refuse_in_use(self, repo: str, doing: str) -> None:
        """Conflict while another process this backend can see has ``repo`` open (LMDB: any
        process of this host that maps it); what it wrote meanwhile would be lost to ``doing``.
        A server's KV sees no other host's use: it refuses nothing."""


class SnapshotReads:
    """:meth:`Store.get` and :meth:`Store.get_range` as a read transaction of their own: what an
    embedded backend, whose transactions cost nothing to start, needs (a server answers both in
    one statement instead). Inside a transaction of this thread, ``read`` is that one."""

    def get(self, table: str, key: bytes) -> bytes | None:
        with self.read() as txn:
            return txn.get(table, key)

    def get_range(self, table: str, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        with self.read() as txn:
            return list(txn.scan(table, start, end))


def prefix_successor(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    p = bytearray(prefix)
    while p:
        if p[-1] != 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return None


class GroupCommit:
    """Group commit over a store's ``write(fn, durable)``: concurrent callers queue their ``fn``; one of
    them at a time leads: it takes every queued ``fn`` and runs them in ONE transaction (durable if any
    caller asked for it), then a waiting caller whose ``fn`` was not in it takes over. A caller whose
    ``fn`` a leader ran is woken at once (it does not queue for the leadership to learn that). If a shared transaction fails, each ``fn`` runs in its own, so
    one caller's error (a missing branch) is its own and never another's. The backends'
    ``Store.write_grouped`` is this."""

    def __init__(self, write: Callable[[Callable[[Txn], T], bool], T]):
        self._write = write
        self._cv = threading.Condition(threading.Lock())
        self._queue: list[list] = []  # [fn, durable, result, error, done] waiting for a leader
        self._leading = False
        self.saved = 0  # transactions saved by grouping

    def run(self, fn: Callable[[Txn], T], durable: bool) -> T:
        slot = [fn, durable, None, None, False]
        with self._cv:
            self._queue.append(slot)
            while self._leading and not slot[4]:
                self._cv.wait()
            lead = not slot[4]
            if lead:
                self._leading = True
        if lead:  # our slot is still queued: this batch has it
            with self._cv:
                batch, self._queue = self._queue, []
            try:
                self._run(batch)
            except BaseException as e:  # noqa: BLE001 -- (an interrupt) every caller of the batch gets it
                for s in batch:
                    if not s[4]:
                        s[3], s[4] = e, True
            finally:
                with self._cv:
                    self._leading = False
                    self._cv.notify_all()
        if slot[3] is not None:
            raise slot[3]
        return slot[2]

    def _run(self, batch: list[list]) -> None:
        if len(batch) > 1:
            try:
                results = self._write(lambda txn: [s[0](txn) for s in batch], any(s[1] for s in batch))
            except Exception:  # noqa: BLE001 -- each runs alone below and gets its own outcome
                pass
            else:
                for s, r in zip(batch, results):
                    s[2], s[4] = r, True
                self.saved += len(batch) - 1
                return
        for s in batch:
            try:
                s[2] = self._write(s[0], s[1])
            except BaseException as e:  # noqa: BLE001 -- handed to the caller of this fn
                s[3] = e
            s[4] = True


class ThreadTxns:
    """Which transaction each thread holds of one store (the nesting rule's bookkeeping)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def held(self):
        return getattr(self._local, "txn", None)

    @contextlib.contextmanager
    def holding(self, txn) -> Iterator[None]:
        self._local.txn = txn
        try:
            yield
        finally:
            self._local.txn = None
