"""The LMDB backend of the KV protocol (:mod:`graveler.kv.base`): the embedded default.

The one place that opens LMDB: an environment per repository, short transactions.

Every repository keeps its refs (repository record, branches, tags, commits) and
its staging areas in one LMDB environment, ``<home>/repos/<name>/refs.lmdb``.
Because refs and staging live in the same environment, an operation that reads
a branch and writes to its staging token (or seals it) does so in ONE write
transaction: LMDB serialises writers across threads and processes, so there is
no window in which a write lands in a token that a commit has already sealed.

Rules kept here:

* A transaction starts and ends inside one call (:meth:`Env.read`,
  :meth:`Env.write`); callers never hold one across object-store I/O or across
  a ``yield`` to their own caller.
* An LMDB file is opened at most once per process (opening it twice breaks
  LMDB's locking): :func:`open_env` keeps a per-process registry.
* A thread holds at most one transaction of an environment at a time.  A
  :meth:`Env.read` inside a read or write of the same thread reuses the open
  transaction; a :meth:`Env.write` inside one raises :class:`NestedTransaction`
  at once: it could never grow the map (see :meth:`Env.write`), so it would hang.
* The map size starts at ``KVConfig.map_size`` and doubles when full; a grow (or
  adopting a size another process grew to) waits until this process has no
  transaction open.  Another process growing the map (``MDB_MAP_RESIZED``) is
  never an error here: opening, reading and writing adopt the new size and
  try again.
* Before LMDB maps ``data.mdb`` the file is checked against its own meta pages
  (:func:`check_data_file`): a file that ends before a page the database uses
  would be a SIGBUS on first touch, an empty file would silently become a new,
  empty database.  Both are ``CorruptedData`` naming the repository.  A file
  that ends early only by free pages (LMDB does not write loose pages) is
  healthy; it is opened, and extended to its meta page's length while this
  process holds LMDB's writer lock, so later opens need no proof.
* ``lmdb.Error`` never escapes: it becomes ``StoreUnavailable`` (or
  ``CorruptedData`` for a damaged file).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import lmdb

from graveler.config import KVConfig
from graveler.errors import Conflict, CorruptedData, GravelerError, NoSpace, NotFound, StoreUnavailable
from graveler.kv import lmdb_file, lmdb_redo, lmdb_schema
from graveler.kv.lmdb_redo import nearly_full
from graveler.kv.lmdb_txn import LmdbTxn
from graveler.locks import RWLock
from graveler.kv.base import TABLES, GroupCommit, NestedTransaction, SnapshotReads, ThreadTxns

log = logging.getLogger(__name__)

T = TypeVar("T")

_RESIZE_ATTEMPTS = 20  # adopt-and-retry rounds when other processes keep growing the map

REPOS_DIR = "repos"  # <home>/repos/<name>/refs.lmdb: one environment per repository
REFS_DIR = "refs.lmdb"

# (the layout's version record: graveler.kv.lmdb_schema)


# What LMDB says about a damaged file.  MDB_BAD_TXN is what every later call of a
# transaction answers once a page read inside it failed (a damaged page); our own
# code never uses a transaction after an error, so here it means damage too.
_DAMAGE_ERRORS = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.VersionMismatchError,
                  lmdb.BadTxnError, lmdb.BadDbiError, lmdb.BadValsizeError)


def _label(path: Path) -> str:
    """How messages name an environment: the repository when the path is ``.../repos/<name>/refs.lmdb``."""
    if path.name == "refs.lmdb" and path.parent.name:
        return f"repository {path.parent.name!r}: refs database {path}"
    return f"refs database {path}"


def _wrap(e: lmdb.Error, path: Path) -> GravelerError:
    if isinstance(e, _DAMAGE_ERRORS):
        return CorruptedData(f"{_label(path)} is damaged ({type(e).__name__}: {e})")
    full = any(t in str(e) for t in ("No space left on device", "Disk quota exceeded"))  # (its errno's text)
    if not full and "Input/output error" in str(e) and nearly_full(path):
        return NoSpace(f"{_label(path)}: {e} (its disk is full)")
    return (NoSpace if full else StoreUnavailable)(f"{_label(path)}: {e}")


_EMPTY_GRACE_S = 1.0  # a creator writes the meta pages right after creating the file


def check_data_file(path: Path | str) -> lmdb_file.Verdict | None:
    """Refuse an environment whose ``data.mdb`` LMDB must not map: ``CorruptedData`` naming it.

    A missing file is fine (LMDB creates it): None.  An empty or short file, bad
    meta pages, or a file that ends before a page the database uses (a truncated
    copy: mapping it would kill the process with SIGBUS) is refused.  A file that
    ends early only by pages on the free list is healthy (LMDB does not write loose
    pages): see :mod:`graveler.lmdb_file` for the rule and why it is sound.  An
    empty file gets a short grace period, since a process creating the environment
    writes the meta pages right after creating the file.
    """
    path = Path(path)
    data = path / "data.mdb"
    deadline = time.monotonic() + _EMPTY_GRACE_S
    while True:
        try:
            fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreUnavailable(f"{_label(path)}: cannot open {data}: {e.strerror or e}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CorruptedData(f"{_label(path)} is damaged: {data} is not a regular file")
            if st.st_size == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            verdict = lmdb_file.check(fd)
        except OSError as e:
            raise StoreUnavailable(f"{_label(path)}: cannot read {data}: {e.strerror or e}") from None
        except RuntimeError as e:
            raise StoreUnavailable(f"{_label(path)}: {e}; try again") from None
        finally:
            os.close(fd)
        break
    if verdict.size == 0:
        raise CorruptedData(f"{_label(path)} is damaged: {data} is empty (0 bytes)")
    if not verdict.healthy:
        raise CorruptedData(f"{_label(path)} is damaged: {data} {verdict.damage}")
    if verdict.meta.version != lmdb_file.DATA_VERSION:  # not damage: a format this LMDB cannot read
        raise CorruptedData(f"{_label(path)}: {data} is in LMDB data format v{verdict.meta.version}, which this "
                            f"lakefuse's LMDB (format v{lmdb_file.DATA_VERSION}) cannot read; nothing was changed")
    return verdict


class Env(SnapshotReads):
    """One open LMDB environment with the repository's named databases."""

    def __init__(self, path: Path, config: KVConfig = KVConfig(), create: bool = True):
        """Open (``create``: or create) the environment at ``path``; ``create=False``: ``NotFound``
        when there is no ``data.mdb``. An existing file is checked before it is mapped (:func:`check_data_file`)."""
        self.path = Path(path)
        self.config = config
        self._gate = RWLock()  # transactions are shared, a map resize is exclusive
        self._seq_lock = threading.Lock()
        self._commit_seq = 0  # commits of this process so far
        self._sync_lock = threading.Lock()
        self._synced_seq = 0  # commits known durable
        self._grouped = GroupCommit(self.write)
        self._syncer: threading.Thread | None = None  # started by the first unsynced commit
        self._stop_syncer = threading.Event()
        self._ckpt_soon = threading.Event()
        self._txns = ThreadTxns()
        # the redo log (graveler.kv.lmdb_redo): commits are not flushed one by one; without
        # ``config.sync`` (benchmarks, tests) nothing is kept for a power loss
        self._redo = lmdb_redo.RedoLog(self.path, _label(self.path)) if config.sync else None
        self._recording = self._redo is not None  # (off while recovery redoes the log)
        self._keeper: lmdb_redo.Keeper | None = None  # (with the LMDB environment)
        self._closed = False
        if not create and not (self.path / "data.mdb").exists():
            if os.path.lexists(self.path) and not self.path.is_dir():
                raise CorruptedData(f"{_label(self.path)} is not a directory (an LMDB environment is one): "
                                    f"the repository's refs database is damaged ('lakefuse refs restore' brings back "
                                    f"what 'lakefuse refs dump' wrote)")
            raise NotFound(f"{_label(self.path)} does not exist")
        try:
            verdict, redo = self._prepare_file()
        except BaseException:
            if self._redo is not None:
                self._redo.close()
            raise
        if self._redo is not None:
            self._keeper = lmdb_redo.Keeper(self._redo, self._env, self.path / "data.mdb")
        try:
            if self._env.info()["map_size"] < config.map_size:
                self._env.set_mapsize(config.map_size)
            if verdict is not None and verdict.short_pages:
                self._extend_to_meta(verdict)  # first: before any write moves the meta it proved
            self.dbs = self._open_dbs()
            # reader slots of processes that died, cleared under the writer lock: a writer
            # relying on another process's pin of the checkpoint checks it under that lock
            for _ in range(_RESIZE_ATTEMPTS):
                try:
                    txn = self._env.begin(write=True)
                except lmdb.MapResizedError:
                    self._env.set_mapsize(0)
                    continue
                try:
                    stale = self._env.reader_check()
                    if self._keeper is not None:
                        self._keeper.clear_dead_pin()
                finally:
                    txn.abort()
                break
            else:
                raise StoreUnavailable(f"{_label(self.path)}: the map keeps being resized by other processes")
            if stale:
                log.info("cleared %d stale LMDB reader slot(s) in %s", stale, self.path)
            if self._redo is not None:
                self._open_redo(redo)
        except lmdb.Error as e:
            self._close_quietly()
            raise _wrap(e, self.path) from None
        except OSError as e:
            self._close_quietly()
            raise StoreUnavailable(f"{_label(self.path)}: {e.strerror or e}") from None
        except BaseException:
            self._close_quietly()
            raise

    def _prepare_file(self) -> tuple:
        """Before LMDB maps ``data.mdb``: the redo log's recovery (:meth:`RedoLog.prepare`), the
        file's check, then LMDB's open; (the check's verdict, the commits to redo)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            redo = self._redo.prepare() if self._redo is not None else None
        except OSError as e:
            what = "cannot open" if self.path.is_dir() else "cannot create"  # (another user's home: it is there)
            raise StoreUnavailable(f"{_label(self.path)}: {what} {self.path}: {e.strerror or e}") from None
        verdict = check_data_file(self.path)
        try:
            self._env = lmdb.open(
                str(self.path),
                map_size=self.config.map_size,
                max_dbs=len(TABLES) + 2,
                max_readers=self.config.max_readers,
                lock=True,
                # A commit is visible and kept if the process dies, and flushes nothing
                # (MDB_NOSYNC): the redo log keeps the file whole across a power loss
                # (graveler.kv.lmdb_redo). ``write(durable=True)`` and :meth:`sync` fdatasync
                # the log -- once for a group of concurrent commits -- and a background thread
                # checkpoints within ``sync_interval`` of a commit (see :meth:`_lazy_sync`).
                sync=False,
                metasync=False,
                readahead=False,
            )
        except lmdb.Error as e:
            raise _wrap(e, self.path) from None
        except OSError as e:  # py-lmdb reports some open failures as OSError
            raise StoreUnavailable(f"{_label(self.path)}: cannot open: {e.strerror or e}") from None
        return verdict, redo

    def _close_quietly(self) -> None:
        if self._keeper is not None:
            self._keeper.drop_pin()
        if self._redo is not None:
            self._redo.close()
        self._env.close()

    def _open_redo(self, redo: list | None) -> None:
        """After a restart (``redo`` not None: :meth:`RedoLog.prepare` put the checkpoint back),
        redo the logged commits and checkpoint; with no checkpoint yet, make one."""
        try:
            if redo:
                self._recording = False
                try:
                    self.write(lambda t: [lmdb_redo.apply_ops(t, ops) for _, ops in redo], durable=False)
                finally:
                    self._recording = True
            if redo is not None or self._redo.current() is None:
                self._checkpoint_now()
        finally:
            self._redo.unlock()

    def _extend_to_meta(self, verdict: lmdb_file.Verdict) -> None:
        """Give a healthy short ``data.mdb`` (it ends early only by free pages) the
        length its meta page counts, so later opens take the quick path and a full
        copy of the map (``mdb_env_copy``) never touches a page past the end.

        Done while holding LMDB's writer lock (an open write transaction, aborted):
        no process writes the file meanwhile, so growing it with ``ftruncate`` can
        neither race a writer nor shrink the file.  Only if the newest meta is still
        the one proven: a later one was not proven here (the next open proves it).
        The new pages are a hole that reads as zeros; LMDB writes each one in full
        when it takes it from the free list.
        """
        data = self.path / "data.mdb"
        with self._gate.shared():
            try:
                txn = self._env.begin(write=True)
            except lmdb.Error as e:  # e.g. another process grew the map: the next open tries again
                log.debug("could not extend %s: %s", data, e)
                return
            try:
                info = self._env.info()
                if info["last_txnid"] != verdict.meta.txnid or info["last_pgno"] != verdict.meta.last_pg:
                    return
                fd = os.open(data, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    if os.fstat(fd).st_size < verdict.meta.size_needed:
                        os.ftruncate(fd, verdict.meta.size_needed)
                finally:
                    os.close(fd)
                log.info("%s ended %d free page(s) early (pages LMDB never writes); extended it to %d bytes",
                         data, verdict.short_pages, verdict.meta.size_needed)
            except OSError as e:  # a read-only file or filesystem: the proof stands, the next open makes it again
                log.debug("could not extend %s: %s", data, e)
            finally:
                txn.abort()

    def _open_dbs(self) -> dict[str, object]:
        """The named databases (one per table), after the schema version is checked; opening one
        runs a transaction, which meets another process's grow."""
        for _ in range(_RESIZE_ATTEMPTS):
            try:
                return lmdb_schema.open_tables(self._env, self.label, TABLES)
            except lmdb.MapResizedError:
                self._env.set_mapsize(0)  # adopt the size another process grew the map to
        raise StoreUnavailable(f"{_label(self.path)}: the map keeps being resized by other processes")

    @property
    def label(self) -> str:
        return _label(self.path)

    def _held(self) -> "LmdbTxn | None":
        return self._txns.held()

    # -- transactions -------------------------------------------------------

    @contextlib.contextmanager
    def read(self) -> Iterator["LmdbTxn"]:
        """A read-only snapshot. Keep the ``with`` body short and free of I/O.

        Nested: inside a ``read`` or ``write`` of the same thread, this is the
        transaction already open (a read inside a write sees that write's changes);
        a second transaction could not be resized under the first one.
        """
        held = self._held()
        if held is not None:
            yield held
            return
        for attempt in range(_RESIZE_ATTEMPTS):
            with self._gate.shared():
                try:
                    txn = self._env.begin(write=False, buffers=False)
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as e:
                    raise _wrap(e, self.path) from None
                if txn is not None:
                    t = LmdbTxn(txn, self.dbs)
                    try:
                        with self._txns.holding(t):
                            yield t
                    except lmdb.Error as e:
                        raise _wrap(e, self.path) from None
                    finally:
                        txn.abort()
                        # py-lmdb's abort of a read only resets it: the reader slot stays taken until the
                        # Transaction object goes. An exception leaving the body keeps this frame (and the
                        # caller's, holding ``t``) alive in its traceback -- in a daemon whose collector
                        # runs rarely, for good: 2,000 failed lookups held ~200 of the 1,024 slots
                        # every process of the repository shares, and then every read failed (READERS_FULL)
                        t.raw = txn = None
                    return
            self._adopt_size()
        raise StoreUnavailable(f"{_label(self.path)}: the map keeps being resized by other processes")

    def write(self, fn: Callable[["LmdbTxn"], T], durable: bool = True) -> T:
        """Run ``fn(txn)`` in one write transaction and commit it; return its result.

        ``durable`` (the default): return only once the commit is on disk. With False
        the commit is complete and visible and survives the death of any process (it is
        in the page cache), but nothing flushes it until the next durable commit,
        :meth:`sync` or the background sync (within ``KVConfig.sync_interval``): a power
        loss or kernel crash before then may undo it, and LMDB 0.9 does not promise its
        file intact across one in that window (``MDB_NOSYNC``).

        ``fn`` may run more than once (after the map grew), so it must not have
        side effects outside the transaction. An exception from ``fn`` aborts the
        transaction and propagates.

        Nested: ``NestedTransaction`` if this thread holds a transaction of this
        environment already (inside a ``read``, or inside ``fn``): the write may
        have to grow the map, which LMDB allows only with no transaction open in
        the process, so it would wait for itself forever.  Reads inside ``fn`` are
        fine (they use ``fn``'s transaction).
        """
        if self._held() is not None:
            raise NestedTransaction(
                f"{_label(self.path)}: a write was asked for inside another transaction of the same thread; "
                "finish that one first (a nested write could never grow the map)")
        for attempt in range(40):
            grow = False
            with self._gate.shared():
                txn = self._begin_write()
                if txn is not None:
                    try:
                        t = LmdbTxn(txn, self.dbs, [] if self._recording else None)
                        with self._txns.holding(t):
                            result = fn(t)
                        if t.ops:
                            logged = self._keeper.log(txn, t.ops)
                            try:
                                txn.commit()
                            except BaseException:
                                self._keeper.log_abort(*logged)
                                raise
                            finally:
                                self._keeper.done()
                        else:
                            txn.commit()
                        with self._seq_lock:
                            self._commit_seq += 1
                            seq = self._commit_seq
                        if durable:
                            self._sync_to(seq)
                        if self.config.sync and (self._syncer is None or self._keeper.due()):
                            self._start_syncer(self._syncer is not None)  # (or a checkpoint is due: wake it)
                        return result
                    except lmdb.MapFullError:
                        txn.abort()
                        grow = True
                    except lmdb.Error as e:
                        txn.abort()
                        raise _wrap(e, self.path) from None
                    except BaseException:
                        txn.abort()
                        raise
            if grow:
                self._grow()
            else:
                self._adopt_size()
        raise StoreUnavailable(f"{_label(self.path)}: could not get a write transaction")

    def _begin_write(self) -> "lmdb.Transaction | None":
        """A write transaction (LMDB's writer lock), or None when another process grew the map
        (adopt its size and try again)."""
        try:
            return self._env.begin(write=True)
        except lmdb.MapResizedError:
            return None
        except lmdb.Error as e:
            raise _wrap(e, self.path) from None

    def write_grouped(self, fn: Callable[["LmdbTxn"], T], durable: bool = True) -> T:
        """Like :meth:`write`, but concurrent callers share transactions: while one
        thread commits, the others queue their ``fn``; the next of them to go runs all
        queued ones in one transaction and one sync (group commit). If that shared
        transaction fails, each ``fn`` runs in its own, so one caller's error (a
        missing branch) is its own and never another's."""
        if self._held() is not None:
            return self.write(fn, durable)  # raises NestedTransaction
        result = self._grouped.run(fn, False)  # one sync below covers the group (see _sync_to)
        if durable:
            self.sync()
        return result

    # -- the redo log (graveler.kv.lmdb_redo) ----------------------------------

    def _checkpoint_locked(self, last: int) -> None:
        """A checkpoint of ``last`` (the last commit; the caller holds the writer lock)."""
        with self._seq_lock:
            seq = self._commit_seq
        self._keeper.checkpoint(last)
        with self._sync_lock:
            self._synced_seq = max(self._synced_seq, seq)

    def _checkpoint_now(self) -> None:
        """A checkpoint of everything committed so far (takes the writer lock, after a flush
        without it: then only the pages of the commits made meanwhile are left to flush)."""
        with self._gate.shared():
            try:
                self._env.sync(True)
            except lmdb.Error as e:
                raise _wrap(e, self.path) from None
        for _ in range(_RESIZE_ATTEMPTS):
            with self._gate.shared():
                txn = self._begin_write()
                if txn is not None:
                    try:
                        self._checkpoint_locked(txn.id() - 1)
                    except lmdb.Error as e:
                        raise _wrap(e, self.path) from None
                    except OSError as e:
                        raise StoreUnavailable(f"{self.label}: cannot write its checkpoint: {e.strerror or e}") from None
                    finally:
                        txn.abort()
                    return
            self._adopt_size()
        raise StoreUnavailable(f"{_label(self.path)}: the map keeps being resized by other processes")

    def sync(self) -> None:
        """Make every commit of this process so far durable."""
        with self._seq_lock:
            seq = self._commit_seq
        with self._gate.shared():
            self._sync_to(seq)

    def _sync_to(self, seq: int) -> None:
        """Group commit: one fdatasync makes every commit up to now durable, so
        concurrent writers that waited for it have nothing left to do."""
        if not self.config.sync:
            return
        with self._sync_lock:
            if self._synced_seq >= seq:
                self.stats_group_synced += 1
                return
            with self._seq_lock:
                target = self._commit_seq
            try:
                if self._redo is not None:
                    self._redo.sync()  # the log holds every commit since the checkpoint
                else:
                    self._env.sync(True)
            except lmdb.Error as e:
                raise _wrap(e, self.path) from None
            except OSError as e:
                raise StoreUnavailable(f"{self.label}: cannot sync its redo log: {e.strerror or e}") from None
            self._synced_seq = max(self._synced_seq, target)

    stats_group_synced = 0  # durable commits that another writer's sync covered

    def _start_syncer(self, due: bool = False) -> None:
        if due:
            self._ckpt_soon.set()
        with self._sync_lock:
            if self._syncer is None:
                self._syncer = threading.Thread(target=self._lazy_sync, name=f"lmdb-sync {self.path.parent.name}",
                                                daemon=True)
                self._syncer.start()

    def _lazy_sync(self) -> None:
        """Every ``KVConfig.sync_interval`` seconds, or sooner when a commit finds one due, checkpoint
        the commits made meanwhile (which also makes them durable): a power loss loses at most that
        much of the ones left unsynced (``durable=False``), as ext4 loses at most its journal commit
        interval of what was written without fsync. Nothing committed: nothing to do."""
        failing = False
        while not self._stop_syncer.is_set():
            woken = self._ckpt_soon.wait(self.config.sync_interval)
            self._ckpt_soon.clear()
            if self._closed or self._stop_syncer.is_set():
                return
            if not self._keeper.since or (woken and not self._keeper.due()):  # (woken late: done already)
                continue
            try:
                self._checkpoint_now()
            except GravelerError as e:  # said once per run of failures: commits go on, kept by the redo log
                if not failing:
                    log.warning("%s: a background checkpoint failed (%s); the redo log keeps every commit "
                                "until one goes through (tried again every %g s)", self.label, e,
                                self.config.sync_interval)
                failing = True
            else:
                if failing:
                    log.warning("%s: checkpoints go through again", self.label)
                failing = False

    def _grow(self) -> None:
        with self._gate.exclusive():
            try:
                size = self._env.info()["map_size"]
                new = min(size * 2, self.config.max_map_size)
                if new <= size:
                    raise StoreUnavailable(f"{_label(self.path)} is full ({size} bytes, the configured maximum)")
                log.info("growing LMDB map of %s from %d to %d bytes", self.path, size, new)
                self._resize(new)
            except lmdb.Error as e:
                raise _wrap(e, self.path) from None

    def _resize(self, size: int) -> None:
        """``set_mapsize`` (0: adopt another process's), which ends this process's pin: unnamed first."""
        if self._keeper is None:
            self._env.set_mapsize(size)
            return
        self._keeper.before_resize()
        try:
            self._env.set_mapsize(size)
        finally:
            self._keeper.after_resize()

    def _adopt_size(self) -> None:
        with self._gate.exclusive():
            try:
                self._resize(0)  # adopt the size another process set
            except lmdb.Error as e:
                raise _wrap(e, self.path) from None

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        self._stop_syncer.set()
        self._ckpt_soon.set()
        gone = not os.path.isdir(self.path)  # (the repository deleted meanwhile: nothing to keep, nothing to say)
        if self._keeper is not None and not self._closed and self._keeper.since and not gone:
            try:  # a clean close leaves nothing for a restart to redo
                self._checkpoint_now()
            except GravelerError as e:
                log.warning("%s: no checkpoint at close (the redo log keeps every commit): %s", self.label, e)
        with self._gate.exclusive():
            if not self._closed:
                self._closed = True
                if self._keeper is not None:
                    try:
                        self._keeper.drop_pin()
                    except FileNotFoundError:
                        if not gone:
                            raise
                if self._redo is not None:
                    self._redo.close()
                self._env.close()

    def stat(self) -> dict[str, int]:
        """Entry counts per table (for tests and ``status``)."""
        with self.read() as txn:
            return {name: txn.count(name) for name in TABLES}


_registry_lock = threading.Lock()
_registry: dict[tuple[int, str], Env] = {}


def open_env(path: Path | str, config: KVConfig = KVConfig(), create: bool = True) -> Env:
    """The process-wide ``Env`` for ``path`` (opened on first use; see :class:`Env` for ``create``)."""
    key = (os.getpid(), os.path.realpath(path))
    with _registry_lock:
        env = _registry.get(key)
        if env is None or env._closed:
            env = Env(Path(path), config, create)
            _registry[key] = env
        return env


def close_env(path: Path | str) -> None:
    """Close and forget the process-wide ``Env`` for ``path``, if open."""
    key = (os.getpid(), os.path.realpath(path))
    with _registry_lock:
        env = _registry.pop(key, None)
    if env is not None:
        env.close()


@contextlib.contextmanager
def borrowed_env(path: Path | str, config: KVConfig = KVConfig(), create: bool = True) -> Iterator[Env]:
    """The process-wide ``Env`` for ``path`` if it is open; else one opened for the
    ``with`` block and closed after it (a quick look that leaves nothing open)."""
    key = (os.getpid(), os.path.realpath(path))
    with _registry_lock:
        env = _registry.get(key)
        was_open = env is not None and not env._closed
    if was_open:
        yield env
        return
    env = open_env(path, config, create)
    try:
        yield env
    finally:
        close_env(path)


def _processes_mapping(path: Path) -> list[tuple[int, str]]:
    """(pid, command line shortened) of each other process that maps ``path`` (an LMDB
    environment's data file: a process that has it open), of those whose maps this process may
    read (its own user's, or all as root)."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/maps", "rb") as maps:
                hit = any(_maps_file(line) == (dev, st.st_ino) for line in maps)
            if hit:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    args = f.read().decode("utf-8", "replace").split("\0")
                # (an argument that may hold a credential -- a URL's user:password@, password= -- not shown)
                cmd = " ".join("***" if "@" in a or "password" in a.lower() else a for a in args if a)
                out.append((int(d), cmd if len(cmd) <= 400 else cmd[:399] + "…"))  # (its mount point whole)
        except (OSError, ValueError):
            continue
    return out


def _maps_file(line: bytes) -> tuple[str, int] | None:
    """(device as /proc shows it, inode) of the file a /proc/PID/maps line maps (None: anonymous)."""
    fields = line.split(maxsplit=5)
    return (fields[3].decode(), int(fields[4])) if len(fields) >= 6 else None


class LmdbBackend:
    """The embedded backend: ``<home>/repos/<name>/refs.lmdb``, one environment per repository
    (a damaged one never stops the others)."""

    url = "lmdb"

    def __init__(self, home: Path, config: KVConfig = KVConfig()):
        self.root = Path(home) / REPOS_DIR
        self.config = config

    def path(self, repo: str) -> Path:
        return self.root / repo / REFS_DIR

    def open(self, repo: str, create: bool = True) -> Env:
        return open_env(self.path(repo), self.config, create)

    def exists(self, repo: str) -> bool:
        """Whether ``repo`` has a refs database: its environment, or anything else in its place
        (a file where the environment's directory should be is a damaged repository, which
        opening reports -- not a name free for a new one)."""
        p = self.path(repo)
        return (p / "data.mdb").exists() or (os.path.lexists(p) and not p.is_dir())

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(d.name for d in self.root.iterdir() if self.exists(d.name))

    def borrowed(self, repo: str):
        return borrowed_env(self.path(repo), self.config, create=False)

    def close(self, repo: str) -> None:
        close_env(self.path(repo))

    def remove(self, repo: str) -> None:
        """Delete ``repo``'s environment; Conflict while another process has it open (a mount
        daemon, a command, a job: what it wrote next would go into a deleted database, and a
        mount would go on serving the repository that is gone, or a new one of the same name)."""
        self.close(repo)
        self.refuse_in_use(repo, "deleting the repository")
        try:
            shutil.rmtree(self.root / repo)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StoreUnavailable(f"cannot remove repository {repo!r} from {self.root}: {e.strerror or e}") from None

    def refuse_in_use(self, repo: str, doing: str) -> None:
        """Conflict while another process has ``repo``'s environment open (a mount daemon, a
        command, a job), naming them: what they write meanwhile would be lost to ``doing``."""
        users = _processes_mapping(self.path(repo) / "data.mdb")
        if users:
            users.sort(key=lambda u: " mount " not in u[1])  # (a mount daemon first: the likeliest)
            shown = "; ".join(f"{pid} ({cmd})" for pid, cmd in users[:3]) + (" and others" if users[3:] else "")
            raise Conflict(f"repository {repo!r} is open in process{'es' if users[1:] else ''} {shown}: "
                           f"stop {'them' if users[1:] else 'it'} (a mount: lakefuse umount) before {doing}")
