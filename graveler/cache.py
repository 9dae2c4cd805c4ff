"""The local cache tier for immutable objects (range and metarange files).

Objects that never change once written -- they are named by the hash of their
content -- are kept on local disk in a ``diskcache.Cache`` bounded in bytes
(least-recently-used eviction).  diskcache keeps its index in SQLite, so one
cache directory can be shared by the threads of a process and by several
processes (a mount and a CLI, Spark executors on one host).

On a miss the object is fetched from the store and checked by ``verify`` (for
example: the sstable footer and checksums, or the hash in its name).  A file
that fails verification is fetched a second time -- a damaged download should
not fail a read -- and if it is still bad, ``CorruptedData`` is raised and
nothing is cached.  A hit is verified again too, unless a :class:`CheckMemo`
knows that very file (by its fingerprint) passed before: a cached file damaged
or replaced on disk is dropped and fetched again, never returned.  A repaired copy is logged once (a warning); a copy that is bad in
the store too is one ``CorruptedData`` and no log line, so a command prints
one error, not three.

Concurrent misses on one key in one process are served by a single fetch.  If
the cache directory itself fails (disk full, a broken SQLite file), reads and
writes fall back to the store with a warning rather than failing.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import diskcache

from graveler.errors import CorruptedData, InvalidArgument, StoreUnavailable
from graveler.objstore.base import Fingerprint, ObjectInfo, ObjectStore, file_fingerprint, map_file, private_dir

log = logging.getLogger(__name__)

# what SQLite says of a database file a cache cannot use as it is
_DAMAGED_DB = ("file is not a database", "malformed")
_VALUE_DIR = frozenset("0123456789abcdef")


def open_diskcache(directory: str, **kwargs) -> diskcache.Cache:
    """``diskcache.Cache(directory, **kwargs)``, for a cache that holds only copies: a damaged
    database is emptied with what it indexes and made again (a warning says so), where every
    command and mount failed "store unavailable" (exit 6) until someone deleted the directory.
    (Value files no index names -- its file removed by hand under a process that wrote on -- are
    not looked for: another process filling a new cache has such files for a moment.)"""
    try:
        cache = diskcache.Cache(directory, **kwargs)
    except sqlite3.DatabaseError as exc:
        if not any(m in str(exc) for m in _DAMAGED_DB):
            raise
        log.warning("the cache in %s is damaged (%s): emptied and made again (it holds only copies)",
                    directory, exc)
        empty_diskcache(directory)
        return diskcache.Cache(directory, **kwargs)
    return cache


def _value_dirs(directory: str) -> list[str]:
    """diskcache's value directories in ``directory`` (two hex digits each)."""
    try:
        return [e.path for e in os.scandir(directory)
                if e.is_dir(follow_symlinks=False) and len(e.name) == 2 and set(e.name) <= _VALUE_DIR]
    except OSError:
        return []


def empty_diskcache(directory: str) -> None:
    """Remove a diskcache's database and value files from ``directory`` (nothing else of it)."""
    for name in (diskcache.core.DBNAME, diskcache.core.DBNAME + "-wal", diskcache.core.DBNAME + "-shm"):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
    for d in _value_dirs(directory):
        shutil.rmtree(d, ignore_errors=True)

Verifier = Callable[[str, bytes], None]

# What a broken cache directory raises; the object store is still there to read from.
_CACHE_ERRORS = (OSError, sqlite3.Error, diskcache.Timeout)
# Reading a memo entry can also fail to unpickle one that another version of lakefuse wrote (a class this
# version does not have): the memo then forgets that entry (the table is checked again), never fails a read.
_MEMO_READ_ERRORS = (Exception,)


class CacheStats:
    """Thread-safe counters: ``hits`` (served from disk), ``misses`` (not on disk),
    ``fetches`` (GETs sent to the store) and ``verify_failures``."""

    __slots__ = ("_lock", "hits", "misses", "fetches", "verify_failures")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.fetches = 0
        self.verify_failures = 0

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "fetches": self.fetches,
                    "verify_failures": self.verify_failures}

    def __repr__(self) -> str:
        return f"CacheStats({self.snapshot()})"


class CheckMemo:
    """Which files passed an expensive content check, remembered across processes.

    Checking that a table file hashes to the ID in its name reads and hashes all
    of it (tens of milliseconds for a 20 MiB range). The file never changes once
    written, so one check per file is enough: the memo keeps, per object URI, the
    :data:`~graveler.objstore.base.Fingerprint` (device, inode, size, mtime,
    ctime) of the local file that passed. A file rewritten, copied over, replaced
    or touched since has another fingerprint and is checked again; an object with
    no local file (``None``) is never taken as checked.

    ``directory``: a diskcache directory shared by the processes of a home (a
    mount, the CLI, Spark executors on one host); None keeps the memo in this
    process only. Whoever writes a table records it right away (it hashed the
    records itself). If the directory fails (disk full, a broken database), the
    memo forgets (tables are checked again), it never fails a read.
    """

    _MAX_LOCAL = 100_000
    # Every database call runs on the memo's one thread and is waited for at most this long; SQLite
    # waits at most DB_TIMEOUT_S for a lock. A memo slower than that is skipped (the table is
    # checked), never waited on: it is an optimisation. (diskcache opens an SQLite connection per
    # calling thread: threads that come and go -- a commit's writer pool, trio's idle workers --
    # left one open file pair each behind, and with no file descriptor left its retry spun forever.)
    WAIT_S = 10.0
    DB_TIMEOUT_S = 2.0

    def __init__(self, directory: str | None = None, max_bytes: int = 256 << 20):
        self.directory = directory
        self.max_bytes = max_bytes
        self._local: dict[str, Fingerprint] = {}
        self._facts: dict[str, bytes] = {}
        self._db_handle = None
        self._io: ThreadPoolExecutor | None = None
        self._pid = None
        self._lock = threading.Lock()
        self._warned = False

    def _thread(self) -> ThreadPoolExecutor | None:
        """The memo's one database thread, (re)made on first use in this process (an SQLite connection
        and a thread must not cross a fork: a daemonized mount, a Spark worker); None without a directory."""
        if self.directory is None:
            return None
        pid = os.getpid()
        if self._pid != pid:
            with self._lock:
                if self._pid != pid:
                    self._db_handle = None
                    self._io = ThreadPoolExecutor(1, "graveler-memo")
                    self._pid = pid
        return self._io

    def _open(self):
        """The diskcache (on the memo's thread), opened on first use; None if it cannot be."""
        if self._db_handle is None:
            try:
                # diskcache unpickles what its rows say: a memo another user may write (root
                # running on someone's home) would run their code as this user -- and may
                # call any table checked: this process then keeps its own memo only
                private_dir(self.directory)  # (made 0700)
                # least-recently-stored: a lookup is a read, not a write of its access time
                self._db_handle = open_diskcache(self.directory, size_limit=self.max_bytes, timeout=self.DB_TIMEOUT_S,
                                                 eviction_policy="least-recently-stored")
            except InvalidArgument as exc:
                self._warn("the check of its directory", exc)
                self._db_handle = False
            except _CACHE_ERRORS as exc:
                self._warn("open", exc)  # (tried again at the next call: the directory may be back)
        return self._db_handle if self._db_handle is not False else None  # (an empty cache is falsy: len 0)

    def _call(self, what: str, op: Callable, default=None):
        """``op(db)`` on the memo's thread, its result; ``default`` if the memo has no database, fails
        or takes longer than :attr:`WAIT_S` (a warning, once)."""
        io = self._thread()
        if io is None:
            return default

        def run():
            db = self._open()
            return default if db is None else op(db)
        try:
            return io.submit(run).result(timeout=self.WAIT_S)
        except _MEMO_READ_ERRORS as exc:  # (a timeout, an interpreter shutting down, a database error)
            self._warn(what, exc)
            return default

    def _warn(self, what: str, exc: BaseException) -> None:
        if not self._warned:
            self._warned = True
            log.warning("table check memo in %s: %s failed (%s); tables are checked again", self.directory,
                        what, str(exc) or type(exc).__name__)

    def checked(self, uri: str, fp: Fingerprint | None) -> bool:
        """Whether the file with fingerprint ``fp`` passed the check for ``uri``."""
        if fp is None:
            return False
        if self._local.get(uri) == fp:
            return True
        # anything but a fingerprint (a value another version of lakefuse wrote) means: not known as checked
        got = self._call("read", lambda db: db.get(uri, default=None))
        if isinstance(got, (tuple, list)) and tuple(got) == fp:
            self._keep(uri, fp)
            return True
        return False

    def remember(self, uri: str, fp: Fingerprint | None) -> None:
        """``uri``'s file with fingerprint ``fp`` passed the check (or was written from checked content)."""
        if fp is None:
            return
        self._keep(uri, fp)
        self._call("write", lambda db: db.set(uri, fp))

    def forget(self, uri: str) -> None:
        self._local.pop(uri, None)
        self._call("write", lambda db: db.delete(uri))

    # -- facts about a table's content (by ID: true of every copy) ------------------------------------
    _MAX_FACTS_LOCAL = 64

    def put_facts(self, table_id: str, blob: bytes) -> None:
        """Keep ``blob`` (e.g. a range's checkpoints, :mod:`graveler.committed.checkpoints`) for ``table_id``."""
        with self._lock:
            if len(self._facts) >= self._MAX_FACTS_LOCAL:
                self._facts.pop(next(iter(self._facts)))
            self._facts[table_id] = blob
        self._call("write", lambda db: db.set("facts:" + table_id, blob))

    def get_facts(self, table_id: str) -> bytes | None:
        blob = self._facts.get(table_id)
        if blob is not None:
            return blob
        blob = self._call("read", lambda db: db.get("facts:" + table_id, default=None))
        return blob if isinstance(blob, bytes) else None

    def _keep(self, uri: str, fp: Fingerprint) -> None:
        if len(self._local) >= self._MAX_LOCAL:
            self._local.clear()
        self._local[uri] = fp

    def close(self) -> None:
        with self._lock:
            io, mine = self._io, self._pid == os.getpid()
            self._io = None
            self._pid = None
        if io is not None and mine:
            def shut():
                if self._db_handle is not None and self._db_handle is not False:
                    self._db_handle.close()
                self._db_handle = None
            try:
                io.submit(shut).result(timeout=self.WAIT_S)
            except _MEMO_READ_ERRORS:
                pass
            io.shutdown(wait=False)
        else:
            self._db_handle = None


_memos: dict[str, CheckMemo] = {}
_memos_lock = threading.Lock()


def shared_memo(directory: str, max_bytes: int = 256 << 20) -> CheckMemo:
    """The process's one CheckMemo on ``directory`` (every repository of a home shares it)."""
    directory = os.path.abspath(directory)
    with _memos_lock:
        memo = _memos.get(directory)
        if memo is None:
            memo = _memos[directory] = CheckMemo(directory, max_bytes)
        return memo


class _Flight:
    """One fetch in progress that other threads wait for."""

    __slots__ = ("done", "data", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None


class ImmutableCache:
    """Local tier for immutable objects (range/metarange files), on diskcache, bounded in bytes.

    Entries are keyed by the object's full URI, so stores with different roots
    can share one directory.  An object larger than ``max_bytes`` is returned but
    not cached.  ``close`` closes the cache, not the store.
    """

    def __init__(self, store: ObjectStore, directory: str, max_bytes: int = 1 << 30,
                 verify: Verifier | None = None, memo: CheckMemo | None = None):
        self.store = store
        self.directory = directory
        self.max_bytes = max_bytes
        self.verify = verify
        self.memo = memo  # cached files known to have passed ``verify`` (by fingerprint)
        self.stats = CacheStats()
        try:
            self._cache = open_diskcache(private_dir(directory), size_limit=max_bytes,
                                         eviction_policy="least-recently-used")
        except _CACHE_ERRORS as exc:
            raise StoreUnavailable(f"cannot open the cache directory {directory!r}: {exc}") from exc
        self._lock = threading.Lock()
        self._flights: dict[str, _Flight] = {}

    def _ck(self, key: str) -> str:
        return self.store.full_uri(key)  # also validates the key

    def get(self, key: str) -> bytes:
        ck = self._ck(key)
        try:
            data = self._cache.get(ck, default=None, retry=True)
        except _CACHE_ERRORS as exc:
            log.warning("cache read of %s failed, reading from the store: %s", ck, exc)
            data = None
        damaged_hit = None
        if data is not None and self.verify is not None:
            try:
                self.verify(key, data)
            except CorruptedData as exc:
                self.stats.add("verify_failures")
                damaged_hit = exc
                try:
                    self._cache.delete(ck, retry=True)
                except _CACHE_ERRORS:
                    pass
                data = None
        if data is not None:
            self.stats.add("hits")
            return data
        self.stats.add("misses")

        with self._lock:
            flight = self._flights.get(ck)
            leader = flight is None
            if leader:
                flight = self._flights[ck] = _Flight()
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.data

        try:
            data = self._fetch_verified(key)
            if damaged_hit is not None:  # said only now that it is repaired; a bad store copy is one error
                log.warning("cached copy of %s was damaged (%s); evicted it and fetched it again", ck, damaged_hit)
            flight.data = data
            self._fill(ck, data)
            return data
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._flights[ck]
            flight.done.set()

    def get_mapped(self, key: str):
        """``get``, except that a hit stored as a file comes back memory-mapped (read-only), so a large
        range is paged in as it is read instead of living in memory whole."""
        return self.get_immutable(key)[0]

    def get_immutable(self, key: str) -> tuple[object, Fingerprint | None]:
        """``get_mapped``'s buffer, verified, and the fingerprint of the cached file it maps (None when
        it is not one: a small entry kept in the cache's database, or an object not cached)."""
        try:
            f = self._cache.get(self._ck(key), default=None, read=True, retry=True)
        except _CACHE_ERRORS as exc:
            log.warning("cache read of %s failed, reading from the store: %s", key, exc)
            f = None
        if f is None:
            return self.get(key), None  # a miss: fetched, verified and cached as get does
        return self._mapped_hit(key, f)

    def _mapped_hit(self, key: str, f) -> tuple[object, Fingerprint | None]:
        fp = None
        if isinstance(f, bytes):  # small entries live in the cache's database
            data = f
        else:
            try:
                with f:
                    st = os.fstat(f.fileno())
                    data = map_file(f.fileno(), st.st_size)
                    fp = file_fingerprint(st)
            except (OSError, ValueError) as exc:
                log.warning("cannot map the cached %s, reading it: %s", key, exc)
                return self.get(key), None
        if self.verify is not None:
            ck = self._ck(key)
            if self.memo is None or not self.memo.checked(ck, fp):
                try:
                    self.verify(key, data)
                except CorruptedData:
                    # damaged: get reads it again, counts and reports it, evicts it and fetches a good copy
                    if self.memo is not None:
                        self.memo.forget(ck)
                    return self.get(key), None
                if self.memo is not None:
                    self.memo.remember(ck, fp)
        self.stats.add("hits")
        return data, fp

    def _fetch_verified(self, key: str) -> bytes:
        """The object from the store, verified; fetched a second time if the first copy
        fails (a damaged download). Only a second failure is an error (CorruptedData,
        raised without a log line: the caller reports it, once)."""
        self.stats.add("fetches")
        data = self.store.get(key)
        if self.verify is None:
            return data
        try:
            self.verify(key, data)
            return data
        except CorruptedData as exc:
            self.stats.add("verify_failures")
            first = exc
        self.stats.add("fetches")
        data = self.store.get(key)
        try:
            self.verify(key, data)
        except CorruptedData:
            self.stats.add("verify_failures")
            raise  # twice: not a bad download but a bad object; nothing is cached
        log.warning("%s failed verification once (%s); the second fetch was good", self.store.full_uri(key), first)
        return data

    def _fill(self, ck: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            log.debug("not caching %s: %d bytes is over the cache's %d", ck, len(data), self.max_bytes)
            return
        try:
            self._cache.set(ck, bytes(data), retry=True)
            if self.memo is not None and self.verify is not None:
                # what was just filled is verified (or written by us): remember the file it landed in
                f = self._cache.get(ck, default=None, read=True, retry=True)
                if f is not None and not isinstance(f, bytes):
                    with f:
                        self.memo.remember(ck, file_fingerprint(os.fstat(f.fileno())))
        except _CACHE_ERRORS as exc:
            log.warning("cache write of %s failed; continuing without it: %s", ck, exc)

    def put(self, key: str, data: bytes) -> None:
        """Write-through: ``store.put_immutable`` (what the cache holds never changes), then fill the cache
        (for files we just wrote)."""
        self.store.put_immutable(key, data)
        self._fill(self._ck(key), data)

    def contains(self, key: str) -> bool:
        try:
            return self._ck(key) in self._cache
        except _CACHE_ERRORS as exc:
            log.warning("cache lookup of %s failed: %s", key, exc)
            return False

    def evict(self, key: str) -> None:
        try:
            self._cache.delete(self._ck(key), retry=True)
        except _CACHE_ERRORS as exc:
            raise StoreUnavailable(f"cannot evict {key!r} from the cache in {self.directory!r}: {exc}") from exc

    def volume(self) -> int:
        """Bytes the cache directory uses (entries plus its SQLite file)."""
        return self._cache.volume()

    def close(self) -> None:
        self._cache.close()

    def __enter__(self) -> ImmutableCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
