"""Reading remote objects in chunks: sequential read-ahead and a local data cache.

:class:`ChunkedReader` serves positional reads of one object from fixed-size
chunks (ranged GETs). A read that continues where the previous one ended is
sequential: the next ``read_ahead`` chunks are fetched in parallel in the
background, so a large file streams at several connections' bandwidth. Chunks
of recent reads stay in memory (a few per reader).

:class:`DataCache` keeps chunks on local disk (diskcache, bounded in bytes,
multi-process safe, kept across restarts). A chunk is keyed by the object's
physical address, its etag and the chunk's index, so every ref that points at
the same object shares it, and a changed object (new etag) never hits stale
bytes. Each cached chunk carries its CRC32C: a damaged cache file is dropped and
fetched again, never returned.

What the store returns is checked against the entry before it is used or cached
(:mod:`graveler.objects`): a fetch of the whole object checks its size and MD5
etag, a fetch of part of it checks the object's size (from the same request) --
a grown, truncated or replaced object is ``CorruptedData``, never its bytes.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import diskcache
import google_crc32c

from graveler.errors import StoreUnavailable
from graveler.objects import read_range_checked, read_verified
from graveler.objstore.base import ObjectReader, check_range

log = logging.getLogger(__name__)

MiB = 1 << 20
# A chunk whose fetch found the store unavailable slowly (attempts that timed out: at least
# SLOW_FAILURE_S) fails at once when asked for again within UNAVAILABLE_MEMO_S: the kernel follows
# a failed read-ahead with a read of the same page, which would otherwise wait out every attempt
# again. A quick failure (connection refused) is not remembered: trying again costs nothing.
UNAVAILABLE_MEMO_S = 2.0
SLOW_FAILURE_S = 1.0
_CACHE_ERRORS = (OSError, sqlite3.Error, diskcache.Timeout)

_pool_lock = threading.Lock()
_owned: list["ReadAheadPool"] = []  # pools of owners (a mount daemon), the newest last
_pool: ThreadPoolExecutor | None = None  # the fallback of a program that owns none (a script)


class ReadAheadPool:
    """The worker threads that fetch read-ahead chunks, owned by whoever serves reads for a
    while (the mount daemon): made at its start, it serves every :class:`ChunkedReader`
    until :meth:`close`, which waits for the fetches under way and ends the threads. A
    program that makes none gets a pool that lives as long as the process."""

    def __init__(self, workers: int = 16):
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="graveler-readahead")
        with _pool_lock:
            _owned.append(self)

    def submit(self, fn, *args) -> Future:
        return self._executor.submit(fn, *args)

    def close(self) -> None:
        with _pool_lock:
            if self in _owned:
                _owned.remove(self)
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "ReadAheadPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _executor():
    global _pool
    with _pool_lock:
        if _owned:
            return _owned[-1]
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="graveler-readahead")
        return _pool


class DataCache:
    """Object chunks on local disk, bounded in bytes (see the module docstring)."""

    def __init__(self, directory: str, max_bytes: int):
        self.directory = directory
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.bytes_from_cache = 0
        self.corrupt = 0
        try:
            # least-recently-stored: a hit costs no SQLite write
            self._cache = diskcache.Cache(directory, size_limit=max_bytes, eviction_policy="least-recently-stored")
        except _CACHE_ERRORS as exc:
            raise StoreUnavailable(f"cannot open the data cache {directory!r}: {exc}") from exc

    @staticmethod
    def key(address: str, etag: str, index: int) -> str:
        return f"{etag}:{index}:{address}"

    def get(self, key: str) -> bytes | None:
        try:
            raw = self._cache.get(key, default=None, retry=True)
        except _CACHE_ERRORS as exc:
            log.warning("data cache read failed, reading from the store: %s", exc)
            raw = None
        if raw is not None:
            data = raw[4:]
            if len(raw) >= 4 and int.from_bytes(raw[:4], "little") == google_crc32c.value(data):
                with self._lock:
                    self.hits += 1
                    self.bytes_from_cache += len(data)
                return data
            with self._lock:
                self.corrupt += 1
            log.warning("data cache entry %s is damaged; fetching it again", key)
            self.discard(key)
        with self._lock:
            self.misses += 1
        return None

    def put(self, key: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        try:
            self._cache.set(key, google_crc32c.value(data).to_bytes(4, "little") + data, retry=True)
        except _CACHE_ERRORS as exc:
            log.warning("data cache write failed; continuing without it: %s", exc)

    def discard(self, key: str) -> None:
        try:
            self._cache.delete(key, retry=True)
        except _CACHE_ERRORS:
            pass

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "bytes_from_cache": self.bytes_from_cache,
                    "damaged": self.corrupt}

    def volume(self) -> int:
        return self._cache.volume()

    def close(self) -> None:
        self._cache.close()


class ChunkedReader(ObjectReader):
    """Positional reads of one remote object through chunks (see the module docstring).

    ``size`` and ``etag`` are the entry's: every GET is checked against them before a
    chunk is used or cached (:func:`graveler.objects.read_range_checked`: the object's
    size from the same request; a GET of the whole object also its MD5), so a changed
    or damaged object is ``CorruptedData``, never kept. ``address``/``etag`` key the data cache.

    A sequential reader is served by read-ahead *windows*: runs of consecutive chunks
    fetched with one ranged GET each (1 chunk, then 2, 4... up to ``max_window``),
    several windows in flight, up to ``read_ahead`` chunks ahead; a random reader
    fetches single chunks. At most ``keep`` chunks stay in memory per reader.
    """

    def __init__(self, store, key: str, size: int, address: str, etag: str, cache: DataCache | None = None,
                 chunk_size: int = 8 * MiB, read_ahead: int = 8, max_window: int = 8, keep: int = 0):
        super().__init__(store, key, size)
        self.address = address
        self.etag = etag
        self.cache = cache
        self.chunk_size = chunk_size
        self.read_ahead = read_ahead
        self.max_window = max(1, max_window)
        self._keep = max(keep, read_ahead + self.max_window + 2)
        self._lock = threading.Lock()
        self._chunks: OrderedDict[int, Future] = OrderedDict()
        self._unavailable: dict[int, float] = {}  # chunk -> when its fetch found the store unavailable
        self._next_offset = -1
        self._window = 1
        self.bytes_from_store = 0
        self.gets = 0

    def _nchunks(self) -> int:
        return (self.size + self.chunk_size - 1) // self.chunk_size

    def _ck(self, index: int) -> str:
        return DataCache.key(self.address, self.etag, index)

    def _present(self, index: int) -> Future | None:
        """The chunk's future, unless it failed for want of the store longer ago than
        :data:`UNAVAILABLE_MEMO_S` (then it is dropped: the next read fetches again). Under the lock."""
        f = self._chunks.get(index)
        if f is not None and index in self._unavailable:
            if time.monotonic() - self._unavailable[index] < UNAVAILABLE_MEMO_S:
                return f
            del self._chunks[index], self._unavailable[index]
            return None
        return f

    def _fetch_run(self, first: int, futures: list[Future]) -> None:
        """Fill the futures of chunks ``first``, ``first + 1``...: from the data cache where
        it has them, the rest with one ranged GET."""
        n = len(futures)
        results: list[bytes | None] = [None] * n
        t0 = time.monotonic()
        try:
            if self.cache is not None:
                for k in range(n):
                    results[k] = self.cache.get(self._ck(first + k))
            missing = [k for k in range(n) if results[k] is None]
            if missing:
                lo, hi = missing[0], missing[-1]
                cs = self.chunk_size
                start = (first + lo) * cs
                end = min((first + hi + 1) * cs, self.size)
                if start == 0 and end == self.size:  # the whole object: size and MD5 checked
                    data = read_verified(self.store, self.key, self.size, self.etag)
                else:  # a part: the object's size checked in the same request
                    data = read_range_checked(self.store, self.key, self.size, start, end - start)
                with self._lock:
                    self.bytes_from_store += len(data)
                    self.gets += 1
                view = memoryview(data)
                for k in range(lo, hi + 1):
                    if results[k] is not None:
                        continue
                    piece = bytes(view[(k - lo) * cs:(k - lo + 1) * cs]) if hi > lo else data
                    results[k] = piece
                    expected = min(cs, self.size - (first + k) * cs)
                    if len(piece) == expected and self.cache is not None:
                        self.cache.put(self._ck(first + k), piece)
        except BaseException as e:  # every reader waiting on these chunks sees it
            now = time.monotonic()
            if isinstance(e, StoreUnavailable) and now - t0 >= SLOW_FAILURE_S:
                with self._lock:
                    for k in range(n):
                        if results[k] is None and self._chunks.get(first + k) is futures[k]:
                            self._unavailable[first + k] = now  # see UNAVAILABLE_MEMO_S
            for k, f in enumerate(futures):
                if results[k] is not None:
                    f.set_result(results[k])
                else:
                    f.set_exception(e)
            return
        for f, r in zip(futures, results):
            f.set_result(r)

    def _request(self, first: int, count: int, background: bool) -> None:
        """Make sure chunks ``first`` .. ``first + count - 1`` are present or on their way;
        the missing ones are fetched as consecutive runs (one GET each)."""
        runs: list[tuple[int, list[Future]]] = []
        with self._lock:
            for i in range(first, min(first + count, self._nchunks())):
                f = self._present(i)
                if f is not None:
                    self._chunks.move_to_end(i)
                    continue
                f = Future()
                self._chunks[i] = f
                if runs and runs[-1][0] + len(runs[-1][1]) == i:
                    runs[-1][1].append(f)
                else:
                    runs.append((i, [f]))
            while len(self._chunks) > self._keep:
                self._unavailable.pop(self._chunks.popitem(last=False)[0], None)
        for start, futures in runs:
            if background:
                _executor().submit(self._fetch_run, start, futures)
            else:
                self._fetch_run(start, futures)

    def _chunk(self, index: int, window: int = 1) -> Future:
        with self._lock:
            f = self._present(index)
        if f is None:
            self._request(index, window, background=False)
            with self._lock:
                f = self._chunks.get(index)
            if f is None:  # evicted at once by a burst of other reads: fetch it alone
                f = Future()
                self._fetch_run(index, [f])
        return f

    def read(self, offset: int, length: int) -> bytes:
        check_range(offset, length)
        if offset >= self.size or length == 0:
            return b""
        end = min(offset + length, self.size)
        first, last = offset // self.chunk_size, (end - 1) // self.chunk_size
        sequential = offset == self._next_offset or offset == 0
        self._next_offset = end
        if sequential:
            # read-ahead: when the first chunk not yet requested is within ``read_ahead`` of
            # the reader, request a whole window from there (windows double while the
            # reader stays sequential), so a steady stream costs one GET per window
            nchunks = self._nchunks()
            start, stop = last + 1, min(last + 1 + self.read_ahead, nchunks)
            with self._lock:
                while start < stop and start in self._chunks:
                    start += 1
            if start < stop:
                self._request(start, self._window, background=True)
                self._window = min(self._window * 2, self.max_window)
        else:
            self._window = 1
        parts = []
        for i in range(first, last + 1):
            f = self._chunk(i, self._window if sequential else 1)
            try:
                data = f.result()
            except BaseException:
                with self._lock:
                    if self._chunks.get(i) is f and i not in self._unavailable:
                        del self._chunks[i]  # a failed fetch is tried again by the next read
                raise
            base = i * self.chunk_size
            lo = max(offset - base, 0)
            hi = min(end - base, len(data))
            if lo >= len(data):
                break
            parts.append(data[lo:hi] if (lo, hi) != (0, len(data)) else data)
            if len(data) < min(self.chunk_size, self.size - base):
                break  # the object is shorter than its entry says
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        with self._lock:
            self._chunks.clear()
            self._unavailable.clear()


__all__ = ["ChunkedReader", "DataCache", "ReadAheadPool"]
