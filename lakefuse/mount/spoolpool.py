"""Empty spool files made ahead of need, so a new file's first write creates nothing.

Creating a file is the costliest step of saving a small one (the filesystem's journal:
hundreds of microseconds when other writers sync), and a file written through the mount
needs one for its spool copy. :class:`FilePool` keeps a few empty ``<sid>.data`` files
open and ready in the spool instance directory, made by a background thread; a new spool
file takes one (or makes its own when the pool is empty, as before). A pooled file holds
nothing and has no record in the spool's journal: a crash leaves it empty, and recovery
drops an empty data file without a record (:mod:`lakefuse.mount.recovery`).

The same thread removes the names of spool files that became stored objects (or were uploaded) (:meth:`FilePool.discard`):
a create holds the directory's lock, on ext4 without a journal for hundreds of microseconds after
many deletes (its inode search skips the recently freed ones), and an unlink in the save's thread
waited for it, spinning. A crash before such a name goes leaves a file recovery finds saved.
A write that finds the spool's disk full removes them at once (:meth:`FilePool.make_room`): a saved
file's copy, on a disk of its own, held its space until then.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path

from graveler.objects import unique_hex16

log = logging.getLogger(__name__)

POOL_SIZE = 32


def new_sid() -> str:
    """A spool file's name stem: unique, in creation order."""
    return f"{time.time_ns():019d}-{unique_hex16()}"


def _unlink(name, then=None) -> None:
    try:
        os.unlink(name)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("spool: cannot remove %s: %s", name, e)
    if then is not None:
        then()


class FilePool:
    """Up to ``size`` empty spool data files in ``directory``, open read-write (see the module docstring)."""

    def __init__(self, directory: Path, size: int = POOL_SIZE):
        self.dir = Path(directory)
        self.size = size
        self._ready: deque[tuple[str, int]] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.taken = 0
        self.missed = 0
        self._dead: deque[tuple[str, object]] = deque()  # (name, then) to remove in the pool's thread
        # free_reads(): the read caches on the spool's disk give up their space, bytes freed (the daemon)
        self.free_reads = None

    def make_room(self) -> bool:
        """The spool's disk is full: remove now the names of saved files' copies waiting for this
        pool's thread (up to a second: their space is held until then), then let the read caches
        give theirs up; whether anything was freed (a write then tries once more)."""
        freed = self.reap() > 0
        return bool(self.free_reads is not None and self.free_reads()) or freed

    def discard(self, name: str, then) -> None:
        """Remove spool file name ``name``, then call ``then()``: in the pool's thread, which makes the
        directory's new files (a save need not wait for the directory its creates hold), or at once."""
        if self._thread is None or self._stop:
            return _unlink(name, then)
        self._dead.append((name, then))
        if len(self._dead) in (1, self.size // 2):  # (the first: the thread then waits a second at most)
            with self._cv:
                self._cv.notify()

    def reap(self) -> int:
        """Remove now the names given to :meth:`discard` (any thread); how many."""
        n = 0
        while True:
            try:
                item = self._dead.popleft()
            except IndexError:  # (none left, or another thread took the last)
                return n
            _unlink(*item)
            n += 1

    def take(self) -> tuple[str, int] | None:
        """(sid, descriptor) of an empty ``<sid>.data``, now the caller's; None when none is ready
        (the caller makes its own). Never blocks on the filesystem."""
        try:
            item = self._ready.popleft()
        except IndexError:
            item = None
        with self._cv:
            if self._thread is None and not self._stop:
                self._thread = threading.Thread(target=self._fill, name="lakefuse-spool-pool", daemon=True)
                self._thread.start()
            elif len(self._ready) < self.size // 2:
                self._cv.notify()
        if item is None:
            self.missed += 1
        else:
            self.taken += 1
        return item

    def _fill(self) -> None:
        while True:
            with self._cv:
                while not self._stop and len(self._ready) >= self.size // 2 and len(self._dead) < self.size // 2:
                    if not self._cv.wait(1.0 if self._dead else None):
                        break  # (names to remove wait a second at most)
                if self._stop:
                    return
            self.reap()
            while len(self._ready) < self.size:
                sid = new_sid()
                try:
                    fd = os.open(self.dir / f"{sid}.data", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                except OSError as e:  # (a full disk): the spool files are made on demand meanwhile
                    log.debug("spool pool: cannot make a file in %s: %s", self.dir, e)
                    with self._cv:
                        self._cv.wait(1.0)
                    break
                with self._cv:
                    if self._stop:
                        os.close(fd)
                        _unlink(self.dir / f"{sid}.data")
                        return
                    self._ready.append((sid, fd))

    def close(self) -> None:
        """Stop making files; remove the ones not taken."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(10)
        self.reap()
        while self._ready:
            sid, fd = self._ready.popleft()
            os.close(fd)
            _unlink(self.dir / f"{sid}.data")
