"""The one place that opens LMDB: an environment per repository, short transactions.

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
* The map size starts at ``KVConfig.map_size`` and doubles when full; a grow (or
  adopting a size another process grew to) waits until this process has no
  transaction open.
* ``lmdb.Error`` never escapes: it becomes ``StoreUnavailable`` (or
  ``CorruptedData`` for a damaged file).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import lmdb

from graveler.config import KVConfig
from graveler.errors import CorruptedData, GravelerError, StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# The named sub-databases of a repository environment.
DB_REPO = b"repo"  # b"record" -> repository record (JSON)
DB_BRANCHES = b"branches"  # branch name -> graveler_pb2.BranchData
DB_TAGS = b"tags"  # tag name -> graveler_pb2.TagData
DB_COMMITS = b"commits"  # commit ID (hex) -> graveler_pb2.CommitData
DB_STAGING = b"staging"  # token + b"\0" + path -> staged value or tombstone
DB_STAMPS = b"stamps"  # branch name -> change stamp (u64 big-endian), bumped by every change of the branch
ALL_DBS = (DB_REPO, DB_BRANCHES, DB_TAGS, DB_COMMITS, DB_STAGING, DB_STAMPS)


class _Gate:
    """Shared/exclusive gate: transactions are shared, a map resize is exclusive."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._exclusive = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if self._active == 0:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._exclusive = True
            while self._active:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


def _wrap(e: lmdb.Error, path: str) -> GravelerError:
    if isinstance(e, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.VersionMismatchError)):
        return CorruptedData(f"refs database is damaged ({e})", path)
    return StoreUnavailable(f"refs database {path}: {e}")


class Env:
    """One open LMDB environment with the repository's named databases."""

    def __init__(self, path: Path, config: KVConfig = KVConfig()):
        self.path = Path(path)
        self.config = config
        self._gate = _Gate()
        self._closed = False
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._env = lmdb.open(
                str(self.path),
                map_size=config.map_size,
                max_dbs=len(ALL_DBS) + 2,
                max_readers=config.max_readers,
                lock=True,
                sync=config.sync,
                metasync=config.sync,
                readahead=False,
            )
            # Adopt a larger size another process may already have grown to.
            info_size = self._env.info()["map_size"]
            if info_size < config.map_size:
                self._env.set_mapsize(config.map_size)
            self.dbs = {name: self._env.open_db(name) for name in ALL_DBS}
            stale = self._env.reader_check()  # reader slots of processes that died
            if stale:
                log.info("cleared %d stale LMDB reader slot(s) in %s", stale, self.path)
        except lmdb.Error as e:
            raise _wrap(e, str(self.path)) from None

    # -- transactions -------------------------------------------------------

    @contextlib.contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A read-only snapshot. Keep the ``with`` body short and free of I/O."""
        for attempt in range(3):
            with self._gate.shared():
                try:
                    txn = self._env.begin(write=False, buffers=False)
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as e:
                    raise _wrap(e, str(self.path)) from None
                if txn is not None:
                    try:
                        yield txn
                    except lmdb.Error as e:
                        raise _wrap(e, str(self.path)) from None
                    finally:
                        txn.abort()
                    return
            self._adopt_size()
        raise StoreUnavailable(f"refs database {self.path}: map keeps being resized")

    def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``fn(txn)`` in one write transaction and commit it; return its result.

        ``fn`` may run more than once (after the map grew), so it must not have
        side effects outside the transaction. An exception from ``fn`` aborts the
        transaction and propagates.
        """
        for attempt in range(40):
            grow = False
            with self._gate.shared():
                try:
                    txn = self._env.begin(write=True)
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as e:
                    raise _wrap(e, str(self.path)) from None
                if txn is not None:
                    try:
                        result = fn(txn)
                        txn.commit()
                        return result
                    except lmdb.MapFullError:
                        txn.abort()
                        grow = True
                    except lmdb.Error as e:
                        txn.abort()
                        raise _wrap(e, str(self.path)) from None
                    except BaseException:
                        txn.abort()
                        raise
            if grow:
                self._grow()
            else:
                self._adopt_size()
        raise StoreUnavailable(f"refs database {self.path}: could not get a write transaction")

    def _grow(self) -> None:
        with self._gate.exclusive():
            try:
                size = self._env.info()["map_size"]
                new = min(size * 2, self.config.max_map_size)
                if new <= size:
                    raise StoreUnavailable(f"refs database {self.path} is full ({size} bytes)")
                log.info("growing LMDB map of %s from %d to %d bytes", self.path, size, new)
                self._env.set_mapsize(new)
            except lmdb.Error as e:
                raise _wrap(e, str(self.path)) from None

    def _adopt_size(self) -> None:
        with self._gate.exclusive():
            try:
                self._env.set_mapsize(0)  # adopt the size another process set
            except lmdb.Error as e:
                raise _wrap(e, str(self.path)) from None

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        with self._gate.exclusive():
            if not self._closed:
                self._closed = True
                self._env.close()

    def stat(self) -> dict[str, int]:
        """Entry counts per named database (for tests and ``status``)."""
        with self.read() as txn:
            return {name.decode(): txn.stat(db)["entries"] for name, db in self.dbs.items()}


_registry_lock = threading.Lock()
_registry: dict[tuple[int, str], Env] = {}


def open_env(path: Path | str, config: KVConfig = KVConfig()) -> Env:
    """The process-wide ``Env`` for ``path`` (opened on first use)."""
    key = (os.getpid(), os.path.realpath(path))
    with _registry_lock:
        env = _registry.get(key)
        if env is None or env._closed:
            env = Env(Path(path), config)
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
def borrowed_env(path: Path | str, config: KVConfig = KVConfig()) -> Iterator[Env]:
    """The process-wide ``Env`` for ``path`` if it is open; else one opened for the
    ``with`` block and closed after it (a quick look that leaves nothing open)."""
    key = (os.getpid(), os.path.realpath(path))
    with _registry_lock:
        env = _registry.get(key)
        was_open = env is not None and not env._closed
    if was_open:
        yield env
        return
    env = open_env(path, config)
    try:
        yield env
    finally:
        close_env(path)


def prefix_successor(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    p = bytearray(prefix)
    while p:
        if p[-1] != 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return None
