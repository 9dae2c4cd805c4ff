"""Reading remote objects in chunks: one streaming GET per sequential reader, a local data cache.

:class:`ChunkedReader` serves positional reads of one object from fixed-size chunks. A
sequential reader (a read where the previous one ended) gets a *stream*
(:class:`_Stream`): one GET from where it reads to the end of the object, read chunk by
chunk by a thread of its own at most ``read_ahead`` chunks ahead of the reader, as the
best S3 clients read (one long request, not a request per piece). A random reader
fetches single chunks with ranged GETs. Chunks of recent reads stay in memory (a few per
reader). The daemon owns the streams (:class:`ReadAheadPool`) and ends them when it stops.

:class:`graveler.objstore.datacache.DataCache` keeps chunks on local disk, checked (CRC32C)
on every hit, and objects read whole as one file each, checked (size, MD5) when filled.

What the store returns is checked against the entry before it is used or cached
(:mod:`graveler.objects`): a fetch of the whole object checks its size and MD5
etag, a fetch of part of it (a stream's response too) checks the object's size from the
same request -- a grown, truncated or replaced object is ``CorruptedData``, never its
bytes. A stream hands its bytes out as they arrive: it cannot wait for the MD5 of bytes it
has not fetched (the data cache's whole file waits for it).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError

from graveler.errors import CorruptedData, GravelerError, StoreUnavailable
from graveler.objects import is_md5_etag, read_range_checked, read_verified
from graveler.objstore.base import ObjectReader, check_range
from graveler.objstore.datacache import WHOLE_MAX, DataCache, WholeFill  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

MiB = 1 << 20
# A chunk whose fetch found the store unavailable slowly (attempts that timed out: at least
# SLOW_FAILURE_S) fails at once when asked for again within UNAVAILABLE_MEMO_S: the kernel follows
# a failed read-ahead with a read of the same page, which would otherwise wait out every attempt
# again. A quick failure (connection refused) is not remembered: trying again costs nothing.
UNAVAILABLE_MEMO_S = 2.0
SLOW_FAILURE_S = 1.0
# A sequential stream (one GET) runs at most this many chunks ahead of its reader and ends itself when
# its reader has not come for STREAM_IDLE_S (the connection is not held for a reader gone elsewhere).
STREAM_AHEAD = 4
STREAM_IDLE_S = 30.0

_pool_lock = threading.Lock()
_owned: list["ReadAheadPool"] = []  # owners (a mount daemon), the newest last


class ReadAheadPool:
    """The read-ahead of every :class:`ChunkedReader`, owned by whoever serves reads for a while
    (the mount daemon): made at its start, it keeps the streams of sequential readers (each a
    thread of its own, see :class:`_Stream`) until :meth:`close`, which ends them and waits for
    their threads. A program that makes none lets its streams end with their readers."""

    def __init__(self, join_timeout: float = 10.0):
        self._streams: set[_Stream] = set()
        self._closed = False
        self._join_timeout = join_timeout
        with _pool_lock:
            _owned.append(self)

    def _add(self, s: "_Stream") -> bool:
        with _pool_lock:
            if self._closed:
                return False
            self._streams.add(s)
            return True

    def _remove(self, s: "_Stream") -> None:
        with _pool_lock:
            self._streams.discard(s)

    def threads(self) -> list[threading.Thread]:
        with _pool_lock:
            return [s.thread for s in self._streams]

    def close(self) -> None:
        with _pool_lock:
            self._closed = True
            if self in _owned:
                _owned.remove(self)
            streams = list(self._streams)
        for s in streams:
            with s.r._lock:
                s.cancel()
        deadline = time.monotonic() + self._join_timeout
        for s in streams:
            s.thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "ReadAheadPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _owner() -> "ReadAheadPool | None":
    with _pool_lock:
        return _owned[-1] if _owned else None


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
        self.owner = _owner()

    def start(self) -> None:
        if self.owner is not None and not self.owner._add(self):
            self.owner = None
            self.cancelled = True  # the owner is closing: no new stream (the reads fetch single chunks)
        self.thread.start()

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
            if self.cancelled:
                return
            stream = r.store.open_stream(r.key, i * cs, min(n * cs, r.size) - i * cs)
            if stream.total != r.size:
                raise CorruptedData(f"{r.store.full_uri(r.key)}: the object has {stream.total} bytes, "
                                    f"the entry says {r.size}", r.store.full_uri(r.key))
            with r._lock:
                r.gets += 1
            if whole and r.cache is not None:
                fill = r.cache.whole_fill(r.address, r.etag, r.size)
            # an object of one chunk, read whole: its MD5 is checked before it is handed out (larger
            # ones read without a cache are checked by size: see graveler.objects)
            md5 = (hashlib.md5(usedforsecurity=False) if fill is None and whole and n == 1
                   and is_md5_etag(r.etag) else None)
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
                        fill.commit()  # kept once its size and MD5 are checked (in the background)
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
            if self.owner is not None:
                self.owner._remove(self)
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
        self._follow_lock = threading.Lock()
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
                whole = start == 0 and end == self.size
                if whole:  # the whole object: size and MD5 checked
                    data = read_verified(self.store, self.key, self.size, self.etag)
                else:  # a part: the object's size checked in the same request
                    data = read_range_checked(self.store, self.key, self.size, start, end - start)
                with self._lock:
                    self.bytes_from_store += len(data)
                    self.gets += 1
                if whole and n == 1 and self.cache is not None and 0 < self.size <= self.cache.whole_max:
                    self.cache.whole_put(self.address, self.etag, data)  # checked: kept whole, not in chunks
                    results[0] = data
                    missing = []
                view = memoryview(data)
                for k in range(lo, hi + 1) if missing else ():
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
        them, or start one from the first chunk not in memory or the data cache (one read at a
        time decides: the kernel sends several of a sequential reader's reads at once)."""
        with self._follow_lock:
            self._follow_locked(first, last)

    def _follow_locked(self, first: int, last: int) -> None:
        with self._lock:
            if self._stream_serves(first, last):
                return
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
            if self._stream_serves(first, last):  # another read started one meanwhile
                return
            if self._stream is not None:
                self._stream.cancel()
            self._stream = s = _Stream(self, start, end)
            self._stream_pos = last
            s.start()

    def _stream_serves(self, first: int, last: int) -> bool:
        """Whether the stream under way delivers chunks ``first`` .. ``last`` (then it may run on
        up to ``read_ahead`` chunks past ``last``). Under the lock."""
        s = self._stream
        if s is not None and not s.done and not s.cancelled and s.first <= first <= s.next + self.read_ahead \
                and first < s.end:
            self._stream_pos = max(self._stream_pos, last)
            self._cond.notify_all()
            return True
        return False

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
        # the kernel's first reads of a file may arrive out of order: any read in the first chunk
        # before the reader has a position starts the stream from the start
        sequential = offset == self._next_offset or offset == 0 or (self._next_offset < 0 and first == 0)
        self._next_offset = end
        if sequential and self.read_ahead > 0 and self._nchunks() > 1:  # an object of one chunk: one GET
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

    def read_ready(self, offset: int, length: int) -> bytes | memoryview | None:
        """:meth:`read`'s bytes when every chunk they need is in memory already and a stream (if
        the read is sequential) is under way for what follows -- never blocks, never fetches --
        else None (then :meth:`read`)."""
        if offset < 0 or length <= 0 or offset >= self.size or self._content is not None or self._whole_fd >= 0:
            return None
        end = min(offset + length, self.size)
        first, last = offset // self.chunk_size, (end - 1) // self.chunk_size
        with self._lock:
            got = []
            for i in range(first, last + 1):
                f = self._chunks.get(i)
                if f is None or not f.done() or f.exception() is not None or i in self._unavailable:
                    return None
                got.append(f.result())
            sequential = offset == self._next_offset or offset == 0
            if sequential and self.read_ahead > 0 and last + 1 < self._nchunks() \
                    and not self._stream_serves(last + 1, last):
                return None  # what follows needs a stream: read() starts it
            self._next_offset = end
        parts = []
        for k, data in enumerate(got):
            base = (first + k) * self.chunk_size
            if len(data) < min(self.chunk_size, self.size - base):
                return None  # a short chunk: read() reports it
            lo, hi = max(offset - base, 0), min(end - base, len(data))
            parts.append(memoryview(data)[lo:hi] if (lo, hi) != (0, len(data)) else data)
        return parts[0] if len(parts) == 1 else b"".join(parts)  # a view: no copy of the chunk's bytes

    def pending(self, offset: int, length: int) -> Future | None:
        """A chunk :meth:`read_ready` waits for before it can answer this read: the future of the
        first chunk of the read that is not in memory yet but that the stream under way brings
        (or a read already asked for) -- a caller that must not block waits for it by a callback,
        then asks :meth:`read_ready` again. None when no such chunk (all in memory, or one that
        needs a fetch, or failed): then :meth:`read`. Never blocks, never fetches."""
        if offset < 0 or length <= 0 or offset >= self.size or self._content is not None or self._whole_fd >= 0:
            return None
        end = min(offset + length, self.size)
        first, last = offset // self.chunk_size, (end - 1) // self.chunk_size
        with self._lock:
            for i in range(first, last + 1):
                f = self._present(i)
                if f is not None:
                    if f.done():
                        if f.exception() is not None:
                            return None
                        continue
                else:
                    s = self._stream
                    if s is None or not s.covers(i):
                        return None
                    f = s.claimed.get(i)
                    if f is None:
                        f = s.claimed[i] = Future()
                self._stream_pos = max(self._stream_pos, i)  # as a read of it: the stream may go on
                self._cond.notify_all()
                return f
        return None

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
