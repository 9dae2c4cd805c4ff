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
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import diskcache
import google_crc32c

from graveler.errors import StoreUnavailable
from graveler.objstore.base import ObjectReader, check_range

log = logging.getLogger(__name__)

MiB = 1 << 20
_CACHE_ERRORS = (OSError, sqlite3.Error, diskcache.Timeout)

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
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

    ``size`` is trusted (the entry's): a store that returns fewer bytes makes the
    read short, which the caller reports. ``address``/``etag`` key the data cache.
    """

    def __init__(self, store, key: str, size: int, address: str, etag: str, cache: DataCache | None = None,
                 chunk_size: int = 8 * MiB, read_ahead: int = 4, keep: int = 8):
        super().__init__(store, key, size)
        self.address = address
        self.etag = etag
        self.cache = cache
        self.chunk_size = chunk_size
        self.read_ahead = read_ahead
        self._keep = max(keep, read_ahead + 2)
        self._lock = threading.Lock()
        self._chunks: OrderedDict[int, Future] = OrderedDict()
        self._next_offset = -1
        self.bytes_from_store = 0

    def _nchunks(self) -> int:
        return (self.size + self.chunk_size - 1) // self.chunk_size

    def _fetch(self, index: int) -> bytes:
        ck = DataCache.key(self.address, self.etag, index) if self.cache is not None else None
        if ck is not None:
            data = self.cache.get(ck)
            if data is not None:
                return data
        start = index * self.chunk_size
        length = min(self.chunk_size, self.size - start)
        data = self.store.get_range(self.key, start, length)
        with self._lock:
            self.bytes_from_store += len(data)
        if len(data) == length and ck is not None:
            self.cache.put(ck, data)
        return data

    def _chunk(self, index: int, background: bool = False) -> Future:
        with self._lock:
            f = self._chunks.get(index)
            if f is not None:
                self._chunks.move_to_end(index)
                return f
            f = Future()
            self._chunks[index] = f
            while len(self._chunks) > self._keep:
                self._chunks.popitem(last=False)
        if background:
            def run():
                try:
                    f.set_result(self._fetch(index))
                except BaseException as e:  # the reader that needs it raises it
                    f.set_exception(e)

            _executor().submit(run)
        else:
            try:
                f.set_result(self._fetch(index))
            except BaseException as e:
                f.set_exception(e)
                with self._lock:
                    if self._chunks.get(index) is f:
                        del self._chunks[index]
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
            for i in range(last + 1, min(last + 1 + self.read_ahead, self._nchunks())):
                self._chunk(i, background=True)
        parts = []
        for i in range(first, last + 1):
            f = self._chunk(i)
            try:
                data = f.result()
            except BaseException:
                with self._lock:
                    if self._chunks.get(i) is f:
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


__all__ = ["ChunkedReader", "DataCache"]
