"""Which inodes the kernel reads through a backing file (FUSE passthrough), and which one.

The kernel binds an inode to one backing file while any passthrough open of it lasts, and
refuses (``EIO`` to the caller) an open of that inode in any other mode meanwhile -- a
cached open (the daemon serves its reads) or a passthrough open onto another file -- as it
refuses a passthrough open while a cached one lasts. So the core decides each open of a
file under one lock, here:

* a read-only open of a local object may be handed to the kernel (:meth:`Backings.bind`)
  when the inode has no cached open, and no passthrough open onto another object;
* any other open of the file (a writer, a reader the daemon serves) holds the inode in
  cached mode (:meth:`Backings.hold`) -- refused while passthrough opens last.

A refusal is the core's cue to give the file's name a new inode (the old one keeps serving
the passthrough opens it has, as a file renamed over does) and to answer ``ESTALE``: the
kernel then looks the name up again and repeats the open on the new inode
(``open(2)``, ``truncate(2)`` retry once on ``ESTALE``).
"""

from __future__ import annotations

import threading
import time

# what an open of an inode may be, as :meth:`Backings.bind` answers
PASSTHROUGH = "passthrough"  # handed to the kernel: bound to the object's file
CACHED = "cached"  # the daemon serves it (the inode has cached opens)
STALE = "stale"  # bound to another object's file: the name needs a new inode
WRITER_WAIT_S = 2.0  # how long a refused writer's name keeps its next inode from passthrough readers
WRITTEN_KEEP = 10_000  # names a writer opened or truncated through the mount, the most recent (Backings.wrote)


class Backings:
    """Passthrough and cached opens by inode, and the object each passthrough-bound
    inode's backing file holds (see the module docstring). Thread-safe; never blocks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # a name a writer was refused on (ESTALE: its retry comes on the name's next inode) ->
        # until when readers of that name's inodes are served by the daemon, not bound
        self._writer_waits: dict[object, float] = {}
        self._bound: dict[int, list] = {}  # ino -> [object identity, passthrough opens]
        self._held: dict[int, int] = {}  # ino -> cached opens
        self._fhs: dict[int, tuple[int, bool]] = {}  # fh -> (ino, passthrough)
        self._written: dict[object, None] = {}  # names written through the mount, oldest first

    def wrote(self, key) -> None:
        """A handle opened the file named ``key`` for writing, or truncate(2) cut it: its readers the
        daemon serves skip the page cache from now on (:meth:`written`; the kernel pads a page read
        while the file shrinks or grows with zeros and keeps it)."""
        with self._lock:
            w = self._written
            w.pop(key, None)
            w[key] = None
            if len(w) > WRITTEN_KEEP:
                del w[next(iter(w))]

    def written(self, key) -> bool:
        """Whether :meth:`wrote` named ``key`` (one of the last :data:`WRITTEN_KEEP`); never blocks."""
        return key in self._written

    def writer_waits(self, key) -> None:
        """A writer's open of the file named ``key`` was refused (passthrough readers hold its
        inode): the kernel retries it once, on the name's next inode. Until then (at most
        :data:`WRITER_WAIT_S`) readers of that name do not bind the new inode to a backing file
        -- one that did would refuse the retry too, and ESTALE would reach the writer."""
        with self._lock:
            now = time.monotonic()
            if len(self._writer_waits) > 1000:
                self._writer_waits = {k: t for k, t in self._writer_waits.items() if t > now}
            self._writer_waits[key] = now + WRITER_WAIT_S

    def bind(self, ino: int, identity: bytes, key=None) -> str:
        """One passthrough open of ``ino`` onto the file of the object ``identity``, if the
        kernel can take it: :data:`PASSTHROUGH` (then :meth:`opened` with its fh, or
        :meth:`undo`), :data:`CACHED` (the daemon serves it: held as by :meth:`hold`) or
        :data:`STALE`. ``key``: the file's name (:meth:`writer_waits`)."""
        with self._lock:
            if key is not None and self._writer_waits and ino not in self._bound:
                t = self._writer_waits.get(key)
                if t is not None and time.monotonic() < t:  # a writer's retry comes: it needs a cached inode
                    self._held[ino] = self._held.get(ino, 0) + 1
                    return CACHED
            b = self._bound.get(ino)
            if b is not None:
                if b[0] != identity:
                    return STALE
                b[1] += 1
                return PASSTHROUGH
            n = self._held.get(ino, 0)
            if n > 0:
                self._held[ino] = n + 1
                return CACHED
            self._bound[ino] = [identity, 1]
            return PASSTHROUGH

    def hold(self, ino: int) -> bool:
        """One cached open of ``ino`` (then :meth:`opened` with its fh, or :meth:`undo`);
        False (nothing held) while passthrough opens of it last."""
        with self._lock:
            if ino in self._bound:
                return False
            self._held[ino] = self._held.get(ino, 0) + 1
            return True

    def bound(self, ino: int) -> bool:
        with self._lock:
            return ino in self._bound

    def opened(self, fh: int, ino: int, passthrough: bool) -> None:
        """The open :meth:`bind` or :meth:`hold` admitted got ``fh``: released with it."""
        with self._lock:
            self._fhs[fh] = (ino, passthrough)

    def refused(self, fh: int) -> None:
        """The kernel refused the passthrough open of ``fh``: the daemon serves it (cached)."""
        with self._lock:
            ino, pt = self._fhs.get(fh, (None, False))
            if ino is None or not pt:
                return
            self._drop(ino, True)
            self._held[ino] = self._held.get(ino, 0) + 1
            self._fhs[fh] = (ino, False)

    def undo(self, ino: int, passthrough: bool) -> None:
        """An admitted open that failed before it had an fh."""
        with self._lock:
            self._drop(ino, passthrough)

    def released(self, fh: int) -> None:
        with self._lock:
            got = self._fhs.pop(fh, None)
            if got is not None:
                self._drop(*got)

    def _drop(self, ino: int, passthrough: bool) -> None:
        if passthrough:
            b = self._bound.get(ino)
            if b is not None:
                b[1] -= 1
                if b[1] <= 0:
                    del self._bound[ino]
        else:
            n = self._held.get(ino, 0) - 1
            if n > 0:
                self._held[ino] = n
            else:
                self._held.pop(ino, None)

    def counts(self) -> tuple[int, int]:
        """(inodes bound to a backing file, inodes with cached opens)."""
        with self._lock:
            return len(self._bound), len(self._held)
