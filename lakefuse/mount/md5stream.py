"""The MD5 of a file being written, computed beside its writes.

A spool file written from the start in order is hashed as it is written, so its close
needs no second pass over it (:class:`lakefuse.mount.spool.SpoolFile`). Hashing a 1 MiB
write takes about as long as storing it, and a writer waits for both before its next
write: :class:`Md5Stream` hands pieces of :data:`BESIDE_MIN` bytes and more to one hashing
thread (hashlib releases the GIL while it hashes), so the writer is answered once its bytes
are stored and the next write is stored while the last one is hashed. The digest waits for
the pieces still being hashed. At most :data:`MAX_PENDING` pieces of one stream, and
:data:`MAX_HELD` of all streams of the process, wait at once (their bytes are held until
hashed): a writer ahead of the hashing thread by more waits for it. Smaller pieces (a small
file's) are hashed at once, as before, unless larger ones are still waiting (the order is
the stream's).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading
from collections import deque

BESIDE_MIN = 128 << 10
MAX_PENDING = 8
MAX_HELD = 32

_held = threading.BoundedSemaphore(MAX_HELD)

_lock = threading.Lock()
_thread: concurrent.futures.ThreadPoolExecutor | None = None


def _hasher() -> concurrent.futures.ThreadPoolExecutor:
    """The one hashing thread of the process (one thread: every stream's pieces in the order given)."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = concurrent.futures.ThreadPoolExecutor(1, "lakefuse-md5")
        return _thread


class Md5Stream:
    """``hashlib.md5`` fed in order, large pieces hashed in the hashing thread (see the
    module docstring). Not thread-safe: its owner serializes the calls (the spool file's lock)."""

    __slots__ = ("_h", "_pending")

    def __init__(self) -> None:
        self._h = hashlib.md5(usedforsecurity=False)
        self._pending: deque[concurrent.futures.Future] = deque()

    def update(self, data) -> None:
        pending = self._pending
        while pending and pending[0].done():
            pending.popleft().result()
        if len(data) < BESIDE_MIN and not pending:
            self._h.update(data)
            return
        while len(pending) >= MAX_PENDING:
            pending.popleft().result()
        if not isinstance(data, bytes):
            data = bytes(data)  # (hashed later: a buffer the caller reuses must not change meanwhile)
        _held.acquire()
        try:
            pending.append(_hasher().submit(_hash, self._h, data))
        except BaseException:
            _held.release()
            raise

    def hexdigest(self) -> str:
        while self._pending:
            self._pending.popleft().result()
        return self._h.hexdigest()


def _hash(h, data) -> None:
    try:
        h.update(data)
    finally:
        _held.release()
