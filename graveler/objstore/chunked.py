"""Reading remote objects in chunks: one streaming GET per sequential reader, parallel parts
for large objects, a local data cache.

:class:`ChunkedReader` serves positional reads of one object from fixed-size chunks. A
sequential reader (a read where the previous one ended) gets a *stream*
(:class:`_Stream`): one GET from where it reads to the end of the object, read chunk by
chunk by a thread of its own at most ``read_ahead`` chunks ahead of the reader, as the
best S3 clients read (one long request, not a request per piece). For an object of at
least :data:`PARTS_MIN_SIZE` whose reader waits for the stream (the store sets the pace, not
the reader), the window of concurrent *part* GETs grows as mountpoint-s3's prefetcher's does:
the stream is cut a part ahead of the reader and ranged GETs of :data:`PART_CHUNKS` chunks
each follow it, their number doubling (1, 2, 4...) up to ``max_lanes`` while the reader still
waits and each doubling brings :data:`GROWTH_GAIN` times the bytes per second (one that does
not is undone, and the window grows no more) -- only where a request costs little against a
part's transfer (the stream's time to its response, at most 1/:data:`PART_COST` of a part's
time at its rate: a server that copies the whole object for every GET, as moto does, keeps
its one stream). A reader that jumps gets
a new stream and the window starts again from one. A random reader fetches single chunks
with ranged GETs. Chunks of recent reads stay in memory (a few per reader, the window's
worth while parts run). The daemon owns the streams (:class:`ReadAheadPool`) and ends them
when it stops.

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

import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future

from graveler.errors import StoreUnavailable
from graveler.objects import read_range_checked, read_verified
from graveler.objstore.base import ObjectReader, check_range
from graveler.objstore.buffers import trim_idle
from graveler.objstore.datacache import WHOLE_MAX, DataCache, WholeFill  # noqa: F401 (re-exported)
from graveler.objstore.prefetch import (  # noqa: F401 (re-exported)
    GROWTH_GAIN,
    MAX_LANES,
    PART_CHUNKS,
    PART_COST,
    PARTS_MIN_SIZE,
    SLOW_FAILURE_S,
    STREAM_AHEAD,
    STREAM_IDLE_S,
    UNAVAILABLE_MEMO_S,
    ReadAheadPool,
    _owner,
    _set,
    _Stream,
    _StreamBroken,
)

log = logging.getLogger(__name__)

MiB = 1 << 20


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
                 chunk_size: int = 8 * MiB, read_ahead: int = STREAM_AHEAD, max_window: int = 1, keep: int = 0,
                 max_lanes: int | None = None, part_chunks: int = PART_CHUNKS, parts_min: int = PARTS_MIN_SIZE,
                 part_cost: float = PART_COST):
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
        self._stalled_t: float | None = None  # when a stream's response last stalled for a timeout (_request_store)
        self._stalls = 0  # responses stalled in a row, each within UNAVAILABLE_MEMO_S of the one before
        self._next_offset = -1
        self._stream: _Stream | None = None  # the stream of the chain under way (parts follow it)
        self._streams: list[_Stream] = []  # the chain: the stream, then its parts (those not done)
        self._stream_pos = -1  # the last chunk a read took from the chain's span
        # parallel parts (see the module docstring)
        owner = _owner()
        self.max_lanes = max(1, max_lanes if max_lanes is not None else owner.lanes if owner else MAX_LANES)
        self.part_chunks = max(1, part_chunks)
        self.parts_min = parts_min
        self.part_cost = part_cost
        self._lanes = 1  # GETs the chain may run at once (the window: see _window)
        self._frontier = self._chain_end = 0  # the first chunk no stream of the chain has; where it stops
        self._starved = 0  # reads that waited for a chunk the chain was bringing, since the window last grew
        self._delivered = self._grown_at = 0  # chunks the chain delivered; how many when the window last grew
        self._ttfb: float | None = None  # the stream's time to its response (a request's cost)
        self._rate: float | None = None  # the stream's bytes per second since its response
        self._cap = self.max_lanes  # lanes the window may still reach (lowered when a doubling did not pay)
        self._chain_bytes = self._grown_bytes = 0  # bytes the chain brought; how many when the window last changed
        self._grown_t = 0.0  # when the window last changed (or the stream's response came)
        self._base_rate = 0.0  # the chain's bytes per second before the window last doubled
        self._judge = False  # the window doubled: whether that paid is not known yet
        # the whole-object file the chain fills, in order (chunks that arrived early are held)
        self._fill_lock = threading.Lock()
        self._fill: WholeFill | None = None
        self._fill_chain: _Stream | None = None
        self._fill_next = 0
        self._fill_held: dict[int, bytes] = {}
        self._whole_fd = -1
        self._whole_checked = cache is None
        self._content: bytes | None = None
        self._whole_failed: tuple[float, str] | None = None  # (when, why) read_whole found the store away
        self.bytes_from_store = 0
        self.bytes_from_cache = 0
        self.gets = 0
        self.streams = 0  # streaming GETs (one per sequential run)
        self.parts = 0  # part GETs (parallel, behind a stream)
        self.lanes_max = 1  # the most GETs a chain of this reader ran at once

    # -- parallel parts: the window, its growth, the parts; the whole file filled in order --

    @property
    def lanes(self) -> int:
        """How many GETs the chain under way may run at once (1 again after a jump)."""
        return self._lanes

    def _window(self) -> int:
        """How many chunks past the reader's last the chain may bring (under the lock)."""
        return self.read_ahead + (self._lanes - 1) * self.part_chunks

    def _parts_pay(self) -> bool:
        """Whether another GET is worth its cost: a large object, and the stream's time to its
        response at most 1/part_cost of a part's transfer time at the stream's rate (under the lock)."""
        if self.size < self.parts_min or self._ttfb is None or not self._rate:
            return False
        return self._ttfb * self.part_cost <= self.part_chunks * self.chunk_size / self._rate

    def _grow(self) -> None:
        """After a chunk of the chain arrived: once the window's GETs brought two parts each since
        it last changed, double it if the reader waited for the chain (and parts pay), cutting the
        stream a part ahead -- unless the last doubling brought less than GROWTH_GAIN times the
        bytes per second before it: then the window goes back to what it was and grows no more
        (a store, or a machine, that another connection does not speed up). Then start the
        parts the window has room for. Under the lock."""
        head = self._stream
        if head is None or head.broken or head.cancelled:
            return
        if self._starved and (self._lanes < self._cap or self._judge) and self._parts_pay() and \
                self._delivered - self._grown_at >= 2 * self.part_chunks * self._lanes:
            now = time.monotonic()
            rate = (self._chain_bytes - self._grown_bytes) / max(now - self._grown_t, 1e-6)
            if self._judge and rate < self._base_rate * GROWTH_GAIN:  # the last doubling did not pay
                self._lanes = self._cap = self._lanes // 2
                self._judge = False
            elif self._lanes < self._cap:
                self._base_rate = rate
                self._lanes = min(self._cap, self._lanes * 2)
                self._judge = True
                if not head.done and head.end == self._chain_end == self._frontier:
                    head.end = self._frontier = min(head.end, head.next + self.part_chunks)
            else:
                self._judge = False  # it paid, and the window is at its most
            self._starved = 0
            self._grown_at, self._grown_bytes, self._grown_t = self._delivered, self._chain_bytes, now
        self._launch()

    def _launch(self, need: int = -1) -> None:
        """Start parts from the frontier while fewer than the window's GETs run and the window has
        room -- and, whatever the window, up to chunk ``need`` (a read asks for it). Under the lock."""
        head = self._stream
        if head is None or head.broken or head.cancelled:
            return
        live = [s for s in self._streams if not s.done]
        limit = self._stream_pos + self._window()
        while self._frontier < self._chain_end and (self._frontier <= need or (
                len(live) < self._lanes and self._frontier <= limit)):
            a = self._frontier
            # a part; back to one GET at a time: one for the rest (a stream again)
            b = self._chain_end if self._lanes == 1 else min(a + self.part_chunks, self._chain_end)
            part = _Stream(self, a, b, chain=head)
            live.append(part)
            self._frontier = b
            part.start()
        self._streams = live
        self.lanes_max = max(self.lanes_max, len(live))

    def _fill_start(self, head: "_Stream") -> None:
        fill = self.cache.whole_fill(self.address, self.etag, self.size)
        if fill is not None:
            with self._fill_lock:
                with self._lock:
                    old, self._fill, self._fill_chain, self._fill_next = self._fill, fill, head, 0
                    self._fill_held.clear()
                if old is not None:  # an earlier chain's, left unfinished
                    old.abort()

    def _fill_put(self, chain: "_Stream", i: int, data: bytes) -> bool:
        """Chunk ``i`` of ``chain`` to the whole-object file, written in order (chunks that came
        early wait); the file is committed (size, MD5: :meth:`WholeFill.commit`) after its last
        chunk. False when the chain fills none (the chunk goes to the chunk cache)."""
        with self._fill_lock:  # one writer at a time: the file is written in order
            with self._lock:
                fill = self._fill
                if fill is None or self._fill_chain is not chain:
                    return False
                self._fill_held[i] = data
                batch = []
                while self._fill_next in self._fill_held:
                    batch.append(self._fill_held.pop(self._fill_next))
                    self._fill_next += 1
                last = self._fill_next == self._nchunks()
                if last:
                    self._fill = self._fill_chain = None
            for piece in batch:
                fill.write(piece)
            if last:
                fill.commit()  # kept once its size and MD5 are checked (in the background)
        return True

    def _fill_abort(self, chain: "_Stream") -> None:
        """The chain ended before the end of the object: its whole file is dropped."""
        with self._fill_lock:
            with self._lock:
                fill = self._fill if self._fill_chain is chain else None
                if fill is not None:
                    self._fill = self._fill_chain = None
                    self._fill_held.clear()
            if fill is not None:
                fill.abort()

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
            self._unavailable_whole()
            try:
                data = read_verified(self.store, self.key, self.size, self.etag)
            except StoreUnavailable as e:
                self._whole_failed = (time.monotonic(), str(e))
                raise
            self.bytes_from_store += len(data)
            self.gets += 1
            if self.cache is not None:
                self.cache.whole_put(self.address, self.etag, data)
            self._content = data
        return self._content

    def _unavailable_whole(self) -> None:
        """StoreUnavailable again, without a request, within :data:`UNAVAILABLE_MEMO_S` of a
        :meth:`read_whole` that found the store away: the open of a small file fetched it whole
        and waited out every attempt; its first read must not wait them out once more (a hung
        store held ``cat`` of a small file for twice the bound)."""
        failed = self._whole_failed
        if failed is not None:
            if time.monotonic() - failed[0] < UNAVAILABLE_MEMO_S:
                raise StoreUnavailable(failed[1])
            self._whole_failed = None

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
        keep = self._keep + (self.lanes_max - 1) * self.part_chunks  # the widest window held more
        if len(self._chunks) > keep and self.lanes_max > 1:  # parts arrive out of order: those read go first
            for k in [k for k in self._chunks if k < self._stream_pos][:len(self._chunks) - keep]:
                del self._chunks[k]
                self._unavailable.pop(k, None)
        while len(self._chunks) > keep:
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

    def _stalls_now(self) -> int:
        """Responses stalled in a row that a request starting now follows (0 past the memo)."""
        t = self._stalled_t
        return 0 if t is None or time.monotonic() - t >= UNAVAILABLE_MEMO_S else self._stalls

    def _stalled(self, stalls_before: int) -> None:
        """A request that followed ``stalls_before`` stalls in a row was held up for a timeout too:
        one more in a row (requests that ran side by side count once). Under the lock."""
        self._stalls = max(self._stalls_now(), stalls_before + 1)
        self._stalled_t = time.monotonic()

    def _request_store(self):
        """The store for a request now: within :data:`UNAVAILABLE_MEMO_S` of a stream whose
        response stalled for a timeout, with one attempt fewer per stall in a row
        (:meth:`ObjectStore.after_stall`: the read waiting on them waits for one request's
        attempts in all, not one more per new stream); StoreUnavailable when that leaves none."""
        stalls = self._stalls_now()
        if not stalls:
            return self.store
        store = self.store.after_stall(stalls)
        if store is None:
            raise StoreUnavailable(f"{self.store.full_uri(self.key)}: the store stopped answering "
                                   f"midway {stalls} time(s) in a row, its attempts all used (see --max-attempts)")
        return store

    def _fetch_run(self, first: int, futures: list[Future]) -> None:
        """Fill the futures of chunks ``first``, ``first + 1``...: from the data cache where
        it has them, the rest with one ranged GET."""
        n = len(futures)
        results: list[bytes | None] = [None] * n
        t0 = time.monotonic()
        stalls_before = None
        try:
            if self.cache is not None:
                for k in range(n):
                    results[k] = self.cache.get(self._ck(first + k))
                hit = sum(len(r) for r in results if r is not None)
                if hit:
                    with self._lock:
                        self.bytes_from_cache += hit  # (chunks: the whole file's are counted where it is read)
            missing = [k for k in range(n) if results[k] is None]
            if missing:
                stalls_before = self._stalls_now()
                store = self._request_store()
                lo, hi = missing[0], missing[-1]
                cs = self.chunk_size
                start = (first + lo) * cs
                end = min((first + hi + 1) * cs, self.size)
                whole = start == 0 and end == self.size
                if whole:  # the whole object: size and MD5 checked
                    data = read_verified(store, self.key, self.size, self.etag)
                else:  # a part: the object's size checked in the same request
                    data = read_range_checked(store, self.key, self.size, start, end - start)
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
                    if stalls_before is not None:  # a request the store held up
                        self._stalled(stalls_before)
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
                self.bytes_from_cache += len(data)
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
            for old in self._streams:
                old.cancel()
            self._stream = s = _Stream(self, start, end)
            self._streams = [s]
            self._frontier = self._chain_end = end
            self._lanes = 1  # a new run: the window starts again from one GET
            self._starved = self._delivered = self._grown_at = self._chain_bytes = self._grown_bytes = 0
            self._ttfb = self._rate = None
            self._cap = self.max_lanes
            self._judge = False
            self._stream_pos = last
            s.start()

    def _stream_serves(self, first: int, last: int) -> bool:
        """Whether the chain under way delivers chunks ``first`` .. ``last`` (then it may run on up
        to its window past ``last``; parts start for what no stream of it covers yet). Under the lock."""
        s = self._stream
        if s is None or s.cancelled or s.broken:
            return False
        while first < s.first and first <= last and self._present(first) is not None:
            first += 1  # chunks before the stream's first, in memory already (the jump's own)
        if not (s.first <= first < self._chain_end or (first > last and first == s.first)):
            return False
        if self._frontier >= self._chain_end and all(x.done for x in self._streams):
            return False  # the chain brought all it was to: what is missing needs a new stream
        if first > max(self._stream_pos, s.next) + self._window():
            return False  # a jump ahead: a new stream from there
        self._stream_pos = max(self._stream_pos, last)
        self._launch(min(last, self._chain_end - 1))
        self._cond.notify_all()
        return True

    def _covering(self, index: int) -> "_Stream | None":
        """The stream of the chain that brings chunk ``index`` soon, else None. Under the lock."""
        for s in self._streams:
            if s.covers(index):
                return s
        return None

    def _claim(self, s: "_Stream", index: int) -> Future:
        """A future for chunk ``index`` that stream ``s`` completes; a read waiting for the chain
        past its first chunk counts towards widening the window. Under the lock."""
        f = s.claimed.get(index)
        if f is None:
            f = s.claimed[index] = Future()
        if index > s.chain.first:
            self._starved += 1
        self._stream_pos = max(self._stream_pos, index)
        self._cond.notify_all()
        return f

    def _chunk(self, index: int) -> Future:
        with self._lock:
            f = self._present(index)
            if f is not None:
                self._chunks.move_to_end(index)
                return f
            s = self._covering(index)
            if s is not None:
                return self._claim(s, index)
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
        self._unavailable_whole()
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
        if len(parts) == 1:  # bytes: a stream's chunk is a view of a buffer it reuses once let go
            return parts[0] if isinstance(parts[0], bytes) else bytes(parts[0])
        return b"".join(parts)

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
                    self._stream_pos = max(self._stream_pos, i)  # as a read of it: the stream may go on
                    self._cond.notify_all()
                    return f
                s = self._covering(i)
                return self._claim(s, i) if s is not None else None
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
            for s in self._streams:
                s.cancel()
            self._stream, self._streams = None, []
            self._chunks.clear()
            self._unavailable.clear()
            fd, self._whole_fd = self._whole_fd, -1
            chain = self._fill_chain
        if chain is not None:  # a whole file its chain left unfinished
            self._fill_abort(chain)
        if fd >= 0:
            os.close(fd)
        trim_idle()  # its chunks' buffers are free now: past a few free ones, they go


__all__ = ["ChunkedReader", "DataCache", "ReadAheadPool", "WholeFill"]
