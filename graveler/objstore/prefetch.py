"""The streams of :class:`graveler.objstore.chunked.ChunkedReader`: one streaming GET per
sequential reader and the parallel part GETs that follow it for large objects (their window,
its growth and reset: see :mod:`graveler.objstore.chunked`), owned by a :class:`ReadAheadPool`.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, InvalidStateError

from graveler.errors import CorruptedData, GravelerError, StoreUnavailable
from graveler.objstore.buffers import pool, trim_idle

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
# Parallel parts (see graveler.objstore.chunked): objects from PARTS_MIN_SIZE on, parts of PART_CHUNKS chunks,
# up to MAX_LANES GETs at once, only where a request's cost (the time to the stream's response) is at
# most 1/PART_COST of a part's transfer time at the stream's measured rate.
PARTS_MIN_SIZE = 64 * MiB
PART_CHUNKS = 4
MAX_LANES = 4
PART_COST = 2
# A doubling of the window is kept only if the chain then brings at least this many times the bytes
# per second it brought before (else the window goes back and grows no more: see ChunkedReader._grow).
GROWTH_GAIN = 1.15

_pool_lock = threading.Lock()
_owned: list["ReadAheadPool"] = []  # owners (a mount daemon), the newest last
_running = 0  # streams whose thread runs, in the process


def _count(d: int) -> int:
    global _running
    with _pool_lock:
        _running += d
        return _running


class ReadAheadPool:
    """The read-ahead of every :class:`ChunkedReader`, owned by whoever serves reads for a while
    (the mount daemon): made at its start, it keeps the streams of sequential readers (each a
    thread of its own, see :class:`_Stream`) until :meth:`close`, which ends them and waits for
    their threads. A program that makes none lets its streams end with their readers. ``lanes``
    (None: :data:`MAX_LANES`) is how many GETs at once its readers' parallel parts may reach
    (1: one stream per reader, no parts)."""

    def __init__(self, join_timeout: float = 10.0, lanes: int | None = None):
        self.lanes = MAX_LANES if lanes is None else max(1, lanes)
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
    """One GET of chunks ``first`` .. ``end`` - 1 -- the stream (to the end of the object) or, with
    ``chain`` (the stream it follows), a part -- read chunk by chunk in a thread of its own into the
    reader's chunk futures, at most the reader's window ahead of the reader. The stream's ``end``
    may be cut (a part follows it); a stream of a chain that fails or is cancelled breaks the chain."""

    def __init__(self, reader, first: int, end: int, chain: "_Stream | None" = None):
        self.r = reader  # the ChunkedReader it brings chunks to (it works under its lock)
        self.first = self.next = first
        self.end = end  # the chunk it stops before (the object's end, a chunk the data cache has, a part's start)
        self.chain = chain or self
        self.part = chain is not None
        self.cancelled = False
        self.done = False
        self.broken = False  # (the stream of a chain) a stream of the chain ended before its end
        self.claimed: dict[int, Future] = {}  # futures readers wait on, not yet reached
        self.thread = threading.Thread(target=self._run, name="graveler-part" if self.part else "graveler-stream",
                                       daemon=True)
        self.owner = _owner()

    def start(self) -> None:
        if self.owner is not None and not self.owner._add(self):
            self.owner = None
            self.cancelled = True  # the owner is closing: no new stream (the reads fetch single chunks)
        self.thread.start()

    def covers(self, index: int) -> bool:
        """Whether the stream will deliver chunk ``index`` soon: a part, any of its span; the
        stream, within the window (under the reader's lock)."""
        return (not self.done and not self.cancelled and self.next <= index < self.end
                and (self.part or index <= self.next + self.r._window()))

    def cancel(self) -> None:  # under the reader's lock
        self.cancelled = True
        self.r._cond.notify_all()

    def _run(self) -> None:
        r = self.r
        cs = r.chunk_size
        stream = data = None
        stalls_before = 0
        i = self.first
        t0 = t_last = time.monotonic()  # (t_last: when the response last brought bytes)
        buffers = pool(cs)
        _count(1)
        try:
            if self.cancelled:
                return
            stalls_before = r._stalls_now()  # (a stall of this stream is one more in a row)
            stream = r._request_store().open_stream(r.key, i * cs, min(self.end * cs, r.size) - i * cs)
            if stream.total != r.size:
                raise CorruptedData(f"{r.store.full_uri(r.key)}: the object has {stream.total} bytes, "
                                    f"the entry says {r.size}", r.store.full_uri(r.key))
            t1 = time.monotonic()
            got = 0
            readinto = stream.readinto  # (ObjectStream's: into our buffer, where the store can)
            with r._lock:
                r.gets += 1
                if self.part:
                    r.parts += 1
                else:
                    r.streams += 1
                    r._ttfb = t1 - t0  # what a request costs before its first byte (see PART_COST)
                    r._grown_t = t1
            if not self.part and i == 0 and self.end == r._nchunks() and r.cache is not None:
                r._fill_start(self)  # the whole object: its file fills as the chain brings it, in order
            while True:
                with r._lock:
                    idle = time.monotonic()
                    while not self.cancelled and i < self.end and i > r._stream_pos + r._window():
                        if not r._cond.wait(timeout=1.0) and time.monotonic() - idle > STREAM_IDLE_S:
                            self.cancelled = True  # its reader went elsewhere: let the connection go
                    if self.cancelled:
                        return
                    if i >= self.end:
                        break  # its end (maybe cut: a part brings what follows)
                    self.next = i
                want = min(cs, r.size - i * cs)
                # received straight into a reused page-aligned buffer (see graveler.objstore.buffers):
                # no fresh pages to fault in, and the cache file takes it with O_DIRECT as it is
                data = memoryview(buffers.take())[:want]
                n = 0
                while n < want:
                    k = readinto(data[n:])
                    if not k:
                        raise StoreUnavailable(f"{r.store.full_uri(r.key)}: the response ended at byte "
                                               f"{i * cs + n}, the object has {r.size}")
                    n += k
                got += len(data)
                t_last = time.monotonic()
                with r._lock:
                    r.bytes_from_store += len(data)
                    r._chain_bytes += len(data)
                    if not self.part:
                        r._rate = got / max(time.monotonic() - t1, 1e-6)
                if not r._fill_put(self.chain, i, data) and r.cache is not None:
                    r.cache.put(r._ck(i), bytes(data))
                with r._lock:
                    f = self.claimed.pop(i, None) or r._chunks.get(i)
                    if f is None or (f.done() and f.exception() is not None):
                        f = Future()
                    r._chunks[i] = f
                    r._chunks.move_to_end(i)
                    r._trim()
                    self.next = i + 1
                    r._delivered += 1
                    r._grow()
                    r._cond.notify_all()
                _set(f, data)
                i += 1
        except BaseException as e:
            slow = isinstance(e, StoreUnavailable) and time.monotonic() - t0 >= SLOW_FAILURE_S
            # a body that stopped coming for a timeout (a hung store, not a connection reset): the
            # requests that follow it have one attempt fewer (ChunkedReader._request_store)
            stalled = stream is not None and isinstance(e, StoreUnavailable) and (
                time.monotonic() - t_last >= SLOW_FAILURE_S)
            with r._lock:
                if stalled:
                    r._stalled(stalls_before)
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
            if stream is not None:
                stream.close()
            with r._lock:
                self.done = True
                whole = self.next >= self.end and not self.cancelled
                if not whole:
                    self.chain.broken = True  # the reads start a new stream where it stopped
                for f in self.claimed.values():
                    _set(f, exc=_StreamBroken("the stream ended"))
                self.claimed.clear()
                if whole:
                    r._launch()  # the next part, if the window has room
                r._cond.notify_all()
            if not whole:
                r._fill_abort(self.chain)
            del data
            if _count(-1) == 0:
                trim_idle()  # the last stream ended: the free buffers past a few go


__all__ = ["ReadAheadPool"]
