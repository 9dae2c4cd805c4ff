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

import hashlib
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor

import diskcache
import google_crc32c

from graveler.errors import CorruptedData, GravelerError, StoreUnavailable
from graveler.objects import is_md5_etag, read_range_checked, read_verified
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
# Objects up to this size (and a quarter of the whole-object budget) are kept whole in the data cache
# as one file each (see DataCache): filled by a read of the whole object, checked then, not per hit.
WHOLE_MAX = 1 << 30
# A sequential stream (one GET) runs at most this many chunks ahead of its reader and ends itself when
# its reader has not come for STREAM_IDLE_S (the connection is not held for a reader gone elsewhere).
STREAM_AHEAD = 4
STREAM_IDLE_S = 30.0
_TMP = ".tmp-"

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

    def __init__(self, directory: str, max_bytes: int, whole_max: int | None = None):
        self.directory = directory
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.bytes_from_cache = 0
        self.corrupt = 0
        # whole objects: half the budget, objects up to whole_max (at most a quarter of that half)
        self.whole_budget = max_bytes // 2
        self.whole_max = min(WHOLE_MAX if whole_max is None else whole_max, self.whole_budget // 4)
        self.whole_dir = os.path.join(directory, "whole")
        self.whole_hits = 0
        self.whole_filled = 0
        self.whole_rejected = 0
        self._whole_bytes: int | None = None  # what the whole files take (scanned at the first fill)
        try:
            if self.whole_max > 0:
                os.makedirs(self.whole_dir, exist_ok=True)
            # least-recently-stored: a hit costs no SQLite write
            self._cache = diskcache.Cache(directory, size_limit=max_bytes - (self.whole_budget if self.whole_max > 0
                                                                              else 0),
                                          eviction_policy="least-recently-stored")
        except _CACHE_ERRORS as exc:
            raise StoreUnavailable(f"cannot open the data cache {directory!r}: {exc}") from exc

    # -- whole objects: one file each, checked (size, MD5) when filled, then used as they are --

    def whole_path(self, address: str, etag: str) -> str:
        name = hashlib.sha256(f"{etag}:{address}".encode()).hexdigest()
        return os.path.join(self.whole_dir, name[:2], name)

    def open_whole(self, address: str, etag: str, size: int) -> int:
        """A read-only descriptor of the object's whole file (-1 when there is none of ``size``
        bytes). The caller owns it (an eviction meanwhile unlinks the name, not the file)."""
        if self.whole_max <= 0 or size > self.whole_max:
            return -1
        path = self.whole_path(address, etag)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1
        try:
            if os.fstat(fd).st_size != size:  # never the case for a file this cache filled
                os.close(fd)
                self._unlink(path)
                return -1
            os.utime(fd)  # recently used: evicted last
        except OSError:
            pass
        with self._lock:
            self.whole_hits += 1
            self.hits += 1
        return fd

    def whole_fill(self, address: str, etag: str, size: int) -> "WholeFill | None":
        """A file to fill with the whole object in order (:class:`WholeFill`), or None when the
        object is too big for the whole-object form."""
        if self.whole_max <= 0 or size > self.whole_max:
            return None
        try:
            return WholeFill(self, self.whole_path(address, etag), size, etag)
        except OSError as exc:
            log.warning("data cache write failed; continuing without it: %s", exc)
            return None

    def whole_put(self, address: str, etag: str, data: bytes) -> None:
        """Keep ``data`` (already checked against size and MD5) as the object's whole file."""
        fill = self.whole_fill(address, etag, len(data))
        if fill is not None:
            fill.write(data)
            fill.commit(check=False)

    def _whole_added(self, n: int) -> None:
        with self._lock:
            if self._whole_bytes is None:
                self._whole_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(self.whole_dir)
                                        for f in fs if not f.startswith(_TMP))
            else:
                self._whole_bytes += n
            self.whole_filled += 1
            over = self._whole_bytes > self.whole_budget
        if over:
            self._evict_whole()

    def _evict_whole(self) -> None:
        """The least recently used whole files go until the rest fits the budget."""
        files = []
        for d, _, fs in os.walk(self.whole_dir):
            for f in fs:
                if f.startswith(_TMP):
                    continue
                try:
                    st = os.stat(os.path.join(d, f))
                except OSError:
                    continue
                files.append((st.st_mtime_ns, st.st_size, os.path.join(d, f)))
        files.sort()
        total = sum(f[1] for f in files)
        for _, size, path in files:
            if total <= self.whole_budget:
                break
            self._unlink(path)
            total -= size
        with self._lock:
            self._whole_bytes = total

    @staticmethod
    def _unlink(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass

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

    def contains(self, key: str) -> bool:
        """Whether a chunk is cached (no read of it, no check)."""
        try:
            return key in self._cache
        except _CACHE_ERRORS:
            return False

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
                    "damaged": self.corrupt, "whole_hits": self.whole_hits, "whole_filled": self.whole_filled,
                    "whole_rejected": self.whole_rejected}

    def count_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes_from_cache += n

    def volume(self) -> int:
        return self._cache.volume()

    def close(self) -> None:
        self._cache.close()


class WholeFill:
    """A whole object being written into the data cache in order: a temporary file, hashed as it
    is written; :meth:`commit` checks its size and (for a plain-MD5 etag) MD5, then renames it into
    place -- a bad object never enters the cache (``CorruptedData``); :meth:`abort` drops it."""

    def __init__(self, cache: DataCache, path: str, size: int, etag: str):
        self.cache, self.path, self.size, self.etag = cache, path, size, etag
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.tmp = os.path.join(os.path.dirname(path), f"{_TMP}{uuid.uuid4().hex}")
        self._fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._md5 = hashlib.md5(usedforsecurity=False) if is_md5_etag(etag) else None
        self.written = 0

    def write(self, data) -> None:
        if self._fd < 0:
            return
        if self._md5 is not None:
            self._md5.update(data)
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as exc:
            log.warning("data cache write failed; continuing without it: %s", exc)
            self.abort()
            return
        self.written += len(data)

    def commit(self, check: bool = True) -> None:
        """Check and keep the file; ``CorruptedData`` if it is not the object its entry describes."""
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        if check:
            bad = None
            if self.written != self.size:
                bad = f"{self.written} bytes, the entry says {self.size}"
            elif self._md5 is not None and self._md5.hexdigest() != self.etag:
                bad = f"MD5 {self._md5.hexdigest()}, the entry says {self.etag}"
            if bad is not None:
                DataCache._unlink(self.tmp)
                with self.cache._lock:
                    self.cache.whole_rejected += 1
                raise CorruptedData(f"the object read whole is not its entry's ({bad}); not cached", self.path)
        try:
            os.rename(self.tmp, self.path)
        except OSError as exc:
            log.warning("data cache write failed; continuing without it: %s", exc)
            DataCache._unlink(self.tmp)
            return
        self.cache._whole_added(self.size)

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            DataCache._unlink(self.tmp)


class _StreamBroken(Exception):
    """A stream ended before it delivered a chunk a reader waited for: fetch it on its own."""


def _set(f: Future, result=None, exc: BaseException | None = None) -> None:
    """Complete ``f`` unless another fetch of the same chunk did first."""
    try:
        if exc is not None:
            f.set_exception(exc)
        else:
            f.set_result(result)
    except InvalidStateError:
        pass


class _Stream:
    """One GET from chunk ``first`` to the end of the object, read chunk by chunk in a thread of
    its own into the reader's chunk futures, at most ``read_ahead`` chunks ahead of the reader."""

    def __init__(self, reader: "ChunkedReader", first: int, end: int):
        self.r = reader
        self.first = self.next = first
        self.end = end  # the chunk it stops before (the end of the object, or a chunk the data cache has)
        self.cancelled = False
        self.done = False
        self.claimed: dict[int, Future] = {}  # futures readers wait on, not yet reached
        self.thread = threading.Thread(target=self._run, name="graveler-stream", daemon=True)

    def covers(self, index: int) -> bool:
        """Whether the stream will deliver chunk ``index`` soon (under the reader's lock)."""
        return (not self.done and not self.cancelled and self.next <= index < self.end
                and index <= self.next + self.r.read_ahead)

    def cancel(self) -> None:  # under the reader's lock
        self.cancelled = True
        self.r._cond.notify_all()

    def _run(self) -> None:
        r = self.r
        cs, n = r.chunk_size, self.end
        stream = fill = None
        i = self.first
        t0 = time.monotonic()
        whole = i == 0 and n == r._nchunks()
        try:
            stream = r.store.open_stream(r.key, i * cs, min(n * cs, r.size) - i * cs)
            if stream.total != r.size:
                raise CorruptedData(f"{r.store.full_uri(r.key)}: the object has {stream.total} bytes, "
                                    f"the entry says {r.size}", r.store.full_uri(r.key))
            with r._lock:
                r.gets += 1
            if whole and r.cache is not None:
                fill = r.cache.whole_fill(r.address, r.etag, r.size)
            # read whole from its start: its MD5 is checked before the last chunk is handed out
            md5 = (hashlib.md5(usedforsecurity=False) if fill is None and whole and is_md5_etag(r.etag)
                   and r.size <= WHOLE_MAX else None)
            while i < n:
                with r._lock:
                    idle = time.monotonic()
                    while not self.cancelled and i > r._stream_pos + r.read_ahead:
                        if not r._cond.wait(timeout=1.0) and time.monotonic() - idle > STREAM_IDLE_S:
                            self.cancelled = True  # its reader went elsewhere: let the connection go
                    if self.cancelled:
                        return
                    self.next = i
                want = min(cs, r.size - i * cs)
                parts, got = [], 0
                while got < want:
                    piece = stream.read(want - got)
                    if not piece:
                        raise StoreUnavailable(f"{r.store.full_uri(r.key)}: the response ended at byte "
                                               f"{i * cs + got}, the object has {r.size}")
                    parts.append(piece)
                    got += len(piece)
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                with r._lock:
                    r.bytes_from_store += len(data)
                if fill is not None:
                    fill.write(data)
                    if i == n - 1:
                        fill.commit()  # CorruptedData for a whole object that is not its entry's
                        fill = None
                else:
                    if md5 is not None:
                        md5.update(data)
                        if i == n - 1 and md5.hexdigest() != r.etag:
                            raise CorruptedData(f"{r.store.full_uri(r.key)}: MD5 {md5.hexdigest()}, the entry "
                                                f"says {r.etag}", r.store.full_uri(r.key))
                    if r.cache is not None:
                        r.cache.put(r._ck(i), data)
                with r._lock:
                    f = self.claimed.pop(i, None) or r._chunks.get(i)
                    if f is None or (f.done() and f.exception() is not None):
                        f = Future()
                    r._chunks[i] = f
                    r._chunks.move_to_end(i)
                    r._trim()
                    self.next = i + 1
                    r._cond.notify_all()
                _set(f, data)
                i += 1
        except BaseException as e:
            slow = isinstance(e, StoreUnavailable) and time.monotonic() - t0 >= SLOW_FAILURE_S
            with r._lock:
                waiting = dict(self.claimed)
                self.claimed.clear()
                if i not in waiting:
                    f = r._chunks.get(i)
                    if f is None or f.done():
                        f = Future()
                        r._chunks[i] = f
                    waiting[i] = f
                if isinstance(e, CorruptedData):
                    for k in [k for k, f in r._chunks.items() if f.done() and f.exception() is None]:
                        del r._chunks[k]  # the bytes read so far are of a bad object: never again from memory
                if slow and stream is None:  # the request itself timed out: see UNAVAILABLE_MEMO_S
                    now = time.monotonic()
                    for k, f in waiting.items():
                        r._chunks[k] = f
                        r._unavailable[k] = now
            # a failure of the request or a bad object is every waiting reader's; a body that broke
            # off midway is not: its chunks are fetched again, alone
            first_failed = isinstance(e, GravelerError) and (stream is None or isinstance(e, CorruptedData))
            for k, f in waiting.items():
                _set(f, exc=e if first_failed else _StreamBroken(str(e)))
        finally:
            if fill is not None:
                fill.abort()
            if stream is not None:
                stream.close()
            with r._lock:
                self.done = True
                for f in self.claimed.values():
                    _set(f, exc=_StreamBroken("the stream ended"))
                self.claimed.clear()
                r._cond.notify_all()


class ChunkedReader(ObjectReader):
    """Positional reads of one remote object through chunks (see the module docstring).

    ``size`` and ``etag`` are the entry's: every GET is checked against them before a
    chunk is used or cached (:func:`graveler.objects.read_range_checked`: the object's
    size from the same request; a GET of the whole object also its MD5), so a changed
    or damaged object is ``CorruptedData``, never kept. ``address``/``etag`` key the data cache.

    A sequential reader is served by one *stream*: a single GET from where it reads to the end
    of the object, read chunk by chunk in a thread of its own, at most ``read_ahead`` chunks
    ahead of the reader (a reader that jumps gets a new stream; one that goes away lets its
    stream end). A random reader fetches single chunks with ranged GETs. A stream from the
    start of an object small enough for the cache's whole-object form fills that file, checked
    (size, MD5) when complete; such a file, once there, serves every read (:meth:`fileno`).
    At most ``keep`` chunks stay in memory per reader.
    """

    def __init__(self, store, key: str, size: int, address: str, etag: str, cache: DataCache | None = None,
                 chunk_size: int = 8 * MiB, read_ahead: int = STREAM_AHEAD, max_window: int = 1, keep: int = 0):
        super().__init__(store, key, size)
        self.address = address
        self.etag = etag
        self.cache = cache
        self.chunk_size = chunk_size
        self.read_ahead = read_ahead
        self._keep = max(keep, read_ahead + max(1, max_window) + 2)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._chunks: OrderedDict[int, Future] = OrderedDict()
        self._unavailable: dict[int, float] = {}  # chunk -> when its fetch found the store unavailable
        self._next_offset = -1
        self._stream: _Stream | None = None
        self._stream_pos = -1  # the last chunk a read took from the stream's span
        self._whole_fd = -1
        self._whole_checked = cache is None
        self._content: bytes | None = None
        self.bytes_from_store = 0
        self.bytes_from_cache = 0
        self.gets = 0

    # -- the whole object: in memory (small, read at open) or the data cache's whole file --

    def open_cached(self) -> bool:
        """Whether the data cache has the object whole (then every read comes from that file)."""
        if not self._whole_checked:
            self._whole_checked = True
            self._whole_fd = self.cache.open_whole(self.address, self.etag, self.size)
        return self._whole_fd >= 0

    def fileno(self) -> int:
        """The descriptor of the object's whole file in the data cache, or -1 (as
        :meth:`graveler.objstore.local.LocalReader.fileno`: the reader's, closed by :meth:`close`)."""
        return self._whole_fd

    def read_whole(self) -> bytes:
        """The whole object, checked (size and MD5), kept in memory for every read and put in the
        data cache's whole-object form: what an open of a small file does."""
        if self._content is None:
            data = read_verified(self.store, self.key, self.size, self.etag)
            self.bytes_from_store += len(data)
            self.gets += 1
            if self.cache is not None:
                self.cache.whole_put(self.address, self.etag, data)
            self._content = data
        return self._content

    @property
    def content(self) -> bytes | None:
        """The object when it is in memory (:meth:`read_whole`), else None."""
        return self._content

    def _pread(self, offset: int, n: int) -> bytes:
        try:
            data = os.pread(self._whole_fd, n, offset)
            while len(data) < n:
                more = os.pread(self._whole_fd, n - len(data), offset + len(data))
                if not more:
                    break
                data += more
        except OSError as exc:
            raise StoreUnavailable(f"reading the data cache's copy of {self.address} failed: "
                                   f"{exc.strerror or exc}") from exc
        self.bytes_from_cache += len(data)
        if self.cache is not None:
            self.cache.count_bytes(len(data))
        return data

    # -- chunks --------------------------------------------------------------------------

    def _nchunks(self) -> int:
        return (self.size + self.chunk_size - 1) // self.chunk_size

    def _ck(self, index: int) -> str:
        return DataCache.key(self.address, self.etag, index)

    def _trim(self) -> None:  # under the lock
        while len(self._chunks) > self._keep:
            self._unavailable.pop(self._chunks.popitem(last=False)[0], None)

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
                    _set(f, results[k])
                else:
                    _set(f, exc=e)
            return
        for f, r in zip(futures, results):
            _set(f, r)

    def _follow(self, first: int, last: int) -> None:
        """A sequential read of chunks ``first`` .. ``last``: keep the stream that delivers
        them, or start one from the first chunk not in memory or the data cache."""
        with self._lock:
            s = self._stream
            if s is not None and not s.done and not s.cancelled and s.first <= first <= s.next + self.read_ahead:
                self._stream_pos = max(self._stream_pos, last)
                self._cond.notify_all()
                return
            if s is not None:
                s.cancel()
            start, n = first, self._nchunks()
            while start < n and start <= last + self.read_ahead:
                f = self._present(start)
                if f is None:
                    break
                if f.done() and f.exception() is not None:
                    return  # a chunk that just failed: the read reports it, no new request now
                start += 1
        while self.cache is not None and start < n and start <= last:  # the cached chunks first
            data = self.cache.get(self._ck(start))
            if data is None:
                break
            f = Future()
            f.set_result(data)
            with self._lock:
                self._chunks[start] = f
                self._trim()
            start += 1
        if start >= n:
            return
        end = start + 1
        if self.cache is not None:
            if start > last and self.cache.contains(self._ck(start)):
                return  # the next read takes it from the cache
            while end < n and not self.cache.contains(self._ck(end)):
                end += 1
        else:
            end = n
        with self._lock:
            self._stream = s = _Stream(self, start, end)
            self._stream_pos = last
        s.thread.start()

    def _chunk(self, index: int) -> Future:
        with self._lock:
            f = self._present(index)
            if f is not None:
                self._chunks.move_to_end(index)
                return f
            s = self._stream
            if s is not None and s.covers(index):
                f = s.claimed.get(index)
                if f is None:
                    f = s.claimed[index] = Future()
                self._stream_pos = max(self._stream_pos, index)
                self._cond.notify_all()
                return f
            f = Future()
            self._chunks[index] = f
            self._trim()
        self._fetch_run(index, [f])
        return f

    def read(self, offset: int, length: int) -> bytes:
        check_range(offset, length)
        if offset >= self.size or length == 0:
            return b""
        end = min(offset + length, self.size)
        if self._content is not None:
            return self._content[offset:end]
        if self.open_cached():
            return self._pread(offset, end - offset)
        first, last = offset // self.chunk_size, (end - 1) // self.chunk_size
        sequential = offset == self._next_offset or offset == 0
        self._next_offset = end
        if sequential and self.read_ahead > 0:
            self._follow(first, last)
        parts = []
        for i in range(first, last + 1):
            f = self._chunk(i)
            try:
                data = f.result()
            except _StreamBroken:
                with self._lock:
                    if self._chunks.get(i) is f:
                        del self._chunks[i]
                f = Future()
                self._fetch_run(i, [f])  # the stream broke off: this chunk alone, checked
                data = self._result(i, f)
            except BaseException:
                self._forget_failed(i, f)
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

    def _result(self, i: int, f: Future) -> bytes:
        try:
            return f.result()
        except BaseException:
            self._forget_failed(i, f)
            raise

    def _forget_failed(self, i: int, f: Future) -> None:
        with self._lock:
            if self._chunks.get(i) is f and i not in self._unavailable:
                del self._chunks[i]  # a failed fetch is tried again by the next read

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.cancel()
                self._stream = None
            self._chunks.clear()
            self._unavailable.clear()
            fd, self._whole_fd = self._whole_fd, -1
        if fd >= 0:
            os.close(fd)


__all__ = ["ChunkedReader", "DataCache", "ReadAheadPool", "WholeFill"]
