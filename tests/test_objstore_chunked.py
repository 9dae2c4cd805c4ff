"""ChunkedReader (ranged reads with read-ahead) and DataCache (object chunks on disk)."""

from __future__ import annotations

import os
import stat

import pytest

from graveler.errors import CorruptedData, NotFound
from graveler.objstore import LocalStore
from graveler.objstore.base import ObjectStream
from graveler.objstore.chunked import ChunkedReader, DataCache


class CountingStore(LocalStore):
    def __init__(self, root):
        super().__init__(root)
        self.ranges = []

    def get_range(self, key, start, length):
        self.ranges.append((start, length))
        return super().get_range(key, start, length)

    def get_range_sized(self, key, start, length):
        self.ranges.append((start, length))
        return super().get_range_sized(key, start, length)


@pytest.fixture
def store(tmp_path):
    return CountingStore(str(tmp_path / "store"))


def test_reads_any_range_and_reads_ahead(store, tmp_path):
    data = os.urandom(10_000)
    store.put("obj", data)
    r = ChunkedReader(store, "obj", len(data), "file:///obj", "etag1", None, chunk_size=1000, read_ahead=3,
                      keep=20)
    out = b"".join(r.read(off, 700) for off in range(0, len(data), 700))
    assert out == data
    assert r.read(9_990, 100) == data[9_990:]
    assert r.read(10_000, 5) == b"" and r.read(3_500, 0) == b""
    assert r.read(1_234, 4_321) == data[1_234:5_555]
    # a sequential reader is served by one stream (one request from where it started), each chunk once
    assert sum(n for _, n in store.ranges) == len(data) == r.bytes_from_store
    assert store.ranges == [(0, 10_000)] and r.gets == 1
    r.close()
    # a random reader fetches single chunks
    store.ranges.clear()
    r = ChunkedReader(store, "obj", len(data), "file:///obj", "etag1", None, chunk_size=1000, read_ahead=3)
    assert r.read(5_500, 10) == data[5_500:5_510]
    assert r.read(2_500, 10) == data[2_500:2_510]
    assert store.ranges == [(5000, 1000), (2000, 1000)]
    r.close()


def test_stream_stays_a_few_chunks_ahead_and_follows_a_jump(store):
    """The stream runs at most ``read_ahead`` chunks ahead of its reader; a reader that jumps
    ahead gets a new stream from there; every byte is the object's across chunk boundaries."""
    import time

    data = os.urandom(50_000)
    store.put("obj", data)
    r = ChunkedReader(store, "obj", len(data), "file:///obj", "e", None, chunk_size=1000, read_ahead=3)
    assert r.read(0, 1500) == data[:1500]
    time.sleep(0.3)
    assert r.bytes_from_store <= (2 + 3 + 1) * 1000  # chunks 0-1 read, 3 ahead (+1 being filled)
    assert r.read(1500, 2000) == data[1500:3500]
    assert r.read(30_500, 1000) == data[30_500:31_500]  # a jump: not sequential, single chunks
    assert r.read(31_500, 5000) == data[31_500:36_500]  # sequential again: a stream from here
    assert b"".join(r.read(o, 999) for o in range(36_500, 50_000, 999)) == data[36_500:]
    assert r.gets >= 2
    r.close()


@pytest.mark.expect_log("a damaged cached chunk is fetched again, with one warning")
def test_data_cache_is_shared_and_checked(store, tmp_path):
    data = os.urandom(5_000)
    store.put("obj", data)
    cache = DataCache(str(tmp_path / "cache"), 1 << 20)
    r1 = ChunkedReader(store, "obj", len(data), "s3://b/obj", "e", cache, chunk_size=2048, read_ahead=0)
    assert r1.read(0, 5_000) == data
    fetched = len(store.ranges)
    r2 = ChunkedReader(store, "obj", len(data), "s3://b/obj", "e", cache, chunk_size=2048, read_ahead=0)
    assert r2.read(0, 5_000) == data
    assert len(store.ranges) == fetched  # all from the cache
    assert cache.stats()["hits"] == 3
    # another etag is another object: no stale bytes
    r3 = ChunkedReader(store, "obj", len(data), "s3://b/obj", "other", cache, chunk_size=2048, read_ahead=0)
    assert r3.read(0, 10) == data[:10] and len(store.ranges) == fetched + 1
    # a damaged cache entry is dropped and fetched again
    key = DataCache.key("s3://b/obj", "e", 1)
    raw = cache._cache.get(key)
    cache._cache.set(key, raw[:10] + bytes([raw[10] ^ 1]) + raw[11:])
    r4 = ChunkedReader(store, "obj", len(data), "s3://b/obj", "e", cache, chunk_size=2048, read_ahead=0)
    assert r4.read(2048, 2048) == data[2048:4096]
    assert cache.stats()["damaged"] == 1
    # a healthy chunk kept under another chunk's key (two cache files swapped): damaged too, never served
    k0, k2 = DataCache.key("s3://b/obj", "e", 0), DataCache.key("s3://b/obj", "e", 2)
    raw0, raw2 = cache._cache.get(k0), cache._cache.get(k2)
    cache._cache.set(k0, raw2)
    cache._cache.set(k2, raw0)
    r5 = ChunkedReader(store, "obj", len(data), "s3://b/obj", "e", cache, chunk_size=2048, read_ahead=0)
    assert r5.read(0, 5_000) == data
    assert cache.stats()["damaged"] == 3
    cache.close()


def test_missing_and_short_objects(store):
    r = ChunkedReader(store, "nope", 100, "x", "e", None, chunk_size=64)
    with pytest.raises(NotFound):
        r.read(0, 10)
    with pytest.raises(NotFound):  # tried again, not remembered as a failure
        r.read(0, 10)
    store.put("short", b"abc")
    r = ChunkedReader(store, "short", 100, "y", "e", None, chunk_size=64)
    with pytest.raises(CorruptedData):  # the object is not what its entry says: never its bytes
        r.read(0, 100)
    store.put("other", b"x" * 10)
    r = ChunkedReader(store, "other", 10, "z", "0" * 32, None, chunk_size=64)  # right size, wrong MD5
    with pytest.raises(CorruptedData):
        r.read(0, 10)


def test_an_object_whose_size_changed_is_corrupted_and_never_cached(tmp_path):
    """The S3 data path checks the object's size (Content-Range / fstat) before a chunk is used or cached."""
    from graveler.objstore import LocalStore

    store = LocalStore(str(tmp_path / "s"))
    data = bytes(range(256)) * 40
    store.put("obj", data)
    cache = DataCache(str(tmp_path / "c"), 1 << 20)
    store.put("obj", data + b"grown")  # same first bytes, another object
    r = ChunkedReader(store, "obj", len(data), "s3://b/obj", "e", cache, chunk_size=1000, read_ahead=2)
    with pytest.raises(CorruptedData, match="entry says 10240"):
        r.read(0, 100)
    assert cache.volume() < 200_000 and cache.stats()["hits"] == 0
    store.put("obj", data)
    r2 = ChunkedReader(store, "obj", len(data), "s3://b/obj", "e", cache, chunk_size=1000, read_ahead=2)
    assert r2.read(0, 100) == data[:100]
    cache.close()


def test_read_ahead_pool_is_owned_and_closed(store):
    """The mount daemon owns the read-ahead: while its pool is open every reader's stream is
    its; close() ends the streams under way and their threads, and no stream starts after."""
    import time

    from graveler.objstore import chunked

    data = os.urandom(20_000)
    store.put("obj", data)
    pool = chunked.ReadAheadPool()
    try:
        assert chunked._owner() is pool
        r = ChunkedReader(store, "obj", len(data), "file:///obj", "e", None, chunk_size=1000, read_ahead=3)
        assert r.read(0, 1000) == data[:1000]  # a stream, held 3 chunks ahead of the reader
        threads = pool.threads()
        assert threads and all(t.name == "graveler-stream" for t in threads)
    finally:
        pool.close()
    assert not any(t.is_alive() for t in threads)
    assert chunked._owner() is not pool
    # the reader still reads (single chunks now), every byte right
    assert b"".join(r.read(o, 1000) for o in range(1000, len(data), 1000)) == data[1000:]
    r.close()
    time.sleep(0.05)


# -- on S3 (the moto server, through the fault proxy where a fault is wanted) ------------------


def _s3_object(s3_config, s3_bucket, size: int, endpoint: str | None = None):
    import dataclasses

    from graveler.objstore.s3 import S3Store

    cfg = s3_config if endpoint is None else dataclasses.replace(s3_config, s3_endpoint_url=endpoint)
    store = S3Store(s3_bucket, "ns", cfg)
    data = os.urandom(size)
    info = store.put("obj", data)
    return store, data, info.etag


@pytest.mark.s3
def test_streamed_read_is_right_across_chunk_boundaries_and_after_a_broken_response(s3_endpoint, s3_config,
                                                                                   s3_bucket):
    """A sequential reader of an S3 object gets one streaming GET; reads that straddle chunk
    boundaries get the object's bytes; a response that breaks off midway (the proxy sends part of
    the body, then closes) costs the chunk it was in one ranged GET of its own, not wrong bytes."""
    from tests.faultproxy import Fault, FaultProxy

    chunk = 1 << 20
    with FaultProxy(s3_endpoint) as proxy:
        store, data, etag = _s3_object(s3_config, s3_bucket, 3 * chunk + chunk // 2, proxy.url)
        r = ChunkedReader(store, "obj", len(data), store.full_uri("obj"), etag, None, chunk_size=chunk)
        assert b"".join(r.read(o, 300_001) for o in range(0, len(data), 300_001)) == data
        assert r.gets == 1 and r.bytes_from_store == len(data)
        r.close()
        proxy.add(Fault("short", method="GET", path="/ns/obj", after=chunk + chunk // 3, times=1))
        r = ChunkedReader(store, "obj", len(data), store.full_uri("obj"), etag, None, chunk_size=chunk)
        assert b"".join(r.read(o, 300_001) for o in range(0, len(data), 300_001)) == data
        assert r.gets >= 2  # the stream, then the chunk it broke in (and a stream for the rest)
        r.close()
    store.close()


@pytest.mark.s3
def test_streamed_read_of_a_short_or_resized_object_is_an_error_not_its_bytes(s3_endpoint, s3_config, s3_bucket):
    """Every response cut short (the proxy closes after part of the body, every time) is
    StoreUnavailable once the retries are spent; an object whose size is not its entry's is
    CorruptedData before a byte is handed out (the size comes with the stream's own response)."""
    from graveler.errors import StoreUnavailable
    from tests.faultproxy import Fault, FaultProxy

    chunk = 1 << 20
    with FaultProxy(s3_endpoint) as proxy:
        store, data, etag = _s3_object(s3_config, s3_bucket, 2 * chunk + 5, proxy.url)
        proxy.add(Fault("short", method="GET", path="/ns/obj", after=chunk // 2))
        r = ChunkedReader(store, "obj", len(data), store.full_uri("obj"), etag, None, chunk_size=chunk)
        with pytest.raises(StoreUnavailable):
            r.read(0, 4096)
        r.close()
        proxy.clear()
        r = ChunkedReader(store, "obj", len(data) + 1, store.full_uri("obj"), etag, None, chunk_size=chunk)
        with pytest.raises(CorruptedData, match="entry says"):
            r.read(0, 4096)
        r.close()
    store.close()


@pytest.mark.s3
@pytest.mark.expect_log("a whole object whose MD5 is not its entry's is refused by the cache, with a warning")
def test_whole_object_enters_the_data_cache_only_with_its_size_and_md5(tmp_path, s3_config, s3_bucket):
    """A stream that reads an object whole fills the cache's whole-object file, checked when
    complete: an entry whose etag is not the object's MD5 (same size) keeps it out; the healthy
    object is kept, and a later reader reads that file (no GET); a small object read whole at
    open is checked the same way (and refused as CorruptedData)."""
    chunk = 1 << 20
    store, data, etag = _s3_object(s3_config, s3_bucket, 3 * chunk + 123)
    cache = DataCache(str(tmp_path / "dc"), 256 << 20)
    addr = store.full_uri("obj")
    wrong = "0" * 32
    r = ChunkedReader(store, "obj", len(data), addr, wrong, cache, chunk_size=chunk)
    assert b"".join(r.read(o, 1 << 20) for o in range(0, len(data), 1 << 20)) == data  # streamed: not held back
    r.close()
    assert cache.wait_fills()
    st = cache.stats()
    assert st["whole_rejected"] == 1 and st["whole_filled"] == 0
    assert not os.path.exists(cache.whole_path(addr, wrong))
    assert [p for p in (tmp_path / "dc" / "whole").rglob("*") if p.is_file()] == []  # no temporary file left
    r = ChunkedReader(store, "obj", len(data), addr, etag, cache, chunk_size=chunk)
    assert b"".join(r.read(o, 1 << 20) for o in range(0, len(data), 1 << 20)) == data
    r.close()
    assert cache.wait_fills()
    assert cache.stats()["whole_filled"] == 1 and os.path.getsize(cache.whole_path(addr, etag)) == len(data)
    r = ChunkedReader(store, "obj", len(data), addr, etag, cache, chunk_size=chunk)
    assert r.open_cached() and r.fileno() >= 0
    assert r.read(chunk - 10, 20) == data[chunk - 10:chunk + 10] and r.read(0, len(data)) == data
    assert r.bytes_from_store == 0 and r.gets == 0 and cache.stats()["whole_hits"] == 1
    r.close()
    path = cache.whole_path(addr, etag)
    assert stat.S_IMODE(os.stat(tmp_path / "dc").st_mode) == 0o700 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # changed in place since its check (same size, another byte): not served, fetched again -- not
    # counted damaged (nothing says which bytes are wrong); what a later open reads is the object
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(bytes([data[1000] ^ 0xFF]))
    r = ChunkedReader(store, "obj", len(data), addr, etag, cache, chunk_size=chunk)
    assert not r.open_cached()
    assert b"".join(r.read(o, 1 << 20) for o in range(0, len(data), 1 << 20)) == data
    r.close()
    assert cache.wait_fills() and cache.stats()["whole_unchecked"] == 1 and cache.stats()["damaged"] == 0
    r = ChunkedReader(store, "obj", len(data), addr, etag, cache, chunk_size=chunk)
    assert r.open_cached() and r.read(0, len(data)) == data  # the fresh fill, checked, is served
    r.close()
    # ... and a cache opened again (another process) serves it too: the check's record is on disk
    cache2 = DataCache(str(tmp_path / "dc"), 256 << 20)
    r = ChunkedReader(store, "obj", len(data), addr, etag, cache2, chunk_size=chunk)
    assert r.open_cached() and r.read(0, len(data)) == data and cache2.stats()["whole_unchecked"] == 0
    r.close()
    cache2.close()
    # a small object read whole at open: checked (size, MD5) before it is kept or served
    small = store.put("small", b"tiny object")
    r = ChunkedReader(store, "small", 11, store.full_uri("small"), wrong, cache)
    with pytest.raises(CorruptedData):
        r.read_whole()
    assert not os.path.exists(cache.whole_path(store.full_uri("small"), wrong))
    r = ChunkedReader(store, "small", 11, store.full_uri("small"), small.etag, cache)
    assert r.read_whole() == b"tiny object" and r.read(5, 100) == b"object"
    assert os.path.exists(cache.whole_path(store.full_uri("small"), small.etag))
    cache.close()
    store.close()


@pytest.mark.s3
def test_an_object_of_one_chunk_is_one_checked_get_kept_whole(tmp_path, s3_config, s3_bucket):
    """An object that fits in one chunk is fetched by one GET of the whole object, checked by size
    and MD5 before a byte is handed out, and kept whole (not as a chunk); a wrong MD5 is
    CorruptedData and nothing is kept."""
    store, data, etag = _s3_object(s3_config, s3_bucket, 700_000)
    cache = DataCache(str(tmp_path / "dc"), 256 << 20)
    addr = store.full_uri("obj")
    r = ChunkedReader(store, "obj", len(data), addr, "1" * 32, cache, chunk_size=1 << 20)
    with pytest.raises(CorruptedData):
        r.read(0, 65536)
    r.close()
    assert not os.path.exists(cache.whole_path(addr, "1" * 32)) and cache.volume() < 100_000
    r = ChunkedReader(store, "obj", len(data), addr, etag, cache, chunk_size=1 << 20)
    assert b"".join(r.read(o, 65536) for o in range(0, len(data), 65536)) == data
    assert r.gets == 1
    r.close()
    assert os.path.getsize(cache.whole_path(addr, etag)) == len(data)
    assert not cache.contains(DataCache.key(addr, etag, 0))
    cache.close()
    store.close()


@pytest.mark.s3
@pytest.mark.expect_log("a whole object whose MD5 is not its entry's is refused by the cache, with a warning")
def test_a_streamed_object_past_the_direct_write_size_is_kept_whole_only_when_it_checks(tmp_path, s3_config,
                                                                                        s3_bucket):
    """A stream of an object of 8 MiB and more fills the whole file past the page cache (O_DIRECT
    where the file system has it, as on this disk; a last partial page without): the reads are the
    object's bytes, the whole file is kept with the right MD5 and refused with a wrong one."""
    chunk = 1 << 20
    store, data, etag = _s3_object(s3_config, s3_bucket, 9 * chunk + 777)
    cache = DataCache(str(tmp_path / "dc"), 512 << 20)
    addr = store.full_uri("obj")
    for tag, ok in (("2" * 32, False), (etag, True)):
        r = ChunkedReader(store, "obj", len(data), addr, tag, cache, chunk_size=chunk)
        assert b"".join(r.read(o, 300_001) for o in range(0, len(data), 300_001)) == data
        assert r.gets == 1
        r.close()
        assert cache.wait_fills()
        assert os.path.exists(cache.whole_path(addr, tag)) == ok
    with open(cache.whole_path(addr, etag), "rb") as f:
        assert f.read() == data
    assert cache.stats()["whole_rejected"] == 1 and cache.stats()["whole_filled"] == 1
    cache.close()
    store.close()


@pytest.mark.expect_log("the file with a wrong MD5 is refused by the cache, with a warning")
def test_the_md5_check_of_a_whole_file_yields_the_cpu_to_reads(tmp_path):
    """The check of a whole file runs in a thread of its own VERIFY_NICE nicer than the process
    (the reads under way keep the CPU), and still keeps the file only with its MD5."""
    import hashlib

    from graveler.objstore.datacache import VERIFY_NICE

    cache = DataCache(str(tmp_path / "dc"), 1 << 30)
    data = os.urandom(3 << 20)
    for etag, kept in (("3" * 32, False), (hashlib.md5(data).hexdigest(), True)):
        fill = cache.whole_fill("s3://b/obj", etag, len(data))
        fill.write(data)
        fill.commit()
        assert cache.wait_fills()
        assert fill.verify_nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + VERIFY_NICE)
        assert os.path.exists(cache.whole_path("s3://b/obj", etag)) == kept
    cache.close()


@pytest.mark.s3
def test_a_chunk_on_its_way_is_a_future_to_wait_for_and_a_broken_one_is_fetched_alone(s3_endpoint, s3_config,
                                                                                     s3_bucket):
    """:meth:`ChunkedReader.pending` (what the mount waits on without a thread): a chunk the stream
    is bringing is a future not done yet; a chunk in memory, or one the stream does not cover,
    is None (read_ready answers, or read fetches). When the stream breaks off in that chunk the
    future completes all the same, read_ready still says nothing, and read fetches it alone."""
    from tests.faultproxy import Fault, FaultProxy

    chunk = 1 << 20
    with FaultProxy(s3_endpoint) as proxy:
        store, data, etag = _s3_object(s3_config, s3_bucket, 3 * chunk + 99, proxy.url)
        proxy.add(Fault("hang", method="GET", path="/ns/obj", after=chunk + 1000, times=1))
        r = ChunkedReader(store, "obj", len(data), store.full_uri("obj"), etag, None, chunk_size=chunk,
                          read_ahead=1)
        assert r.read(0, 4096) == data[:4096]  # the stream brought chunk 0; it hangs in chunk 1
        assert r.pending(100, 4096) is None and bytes(r.read_ready(100, 4096)) == data[100:4196]
        f = r.pending(chunk + 10, 4096)
        assert f is not None and not f.done()
        assert r.pending(3 * chunk, 10) is None  # past what the stream covers: read() fetches it
        proxy.release()
        assert f.exception(timeout=30) is not None
        assert r.read_ready(chunk + 10, 4096) is None
        assert r.read(chunk + 10, 4096) == data[chunk + 10:chunk + 4106]
        assert r.read(chunk, len(data)) == data[chunk:]
        r.close()
    store.close()


# -- parallel parts: a stream, then part GETs in a window that grows --------------------------


class PacedStore(LocalStore):
    """A local store whose streams bring one piece per ``pace`` seconds (a store slower than its
    reader), after ``open_delay`` seconds (a request's cost); it records every stream it opens and
    how many were open at once. ``replaced_parts``: a stream opened after the first one, from past
    the start, sees an object one byte longer (the object was replaced under the reader)."""

    def __init__(self, root, pace: float = 0.01, open_delay: float = 0.0, replaced_parts: bool = False,
                 shared: bool = False):
        import threading

        super().__init__(root)
        self.pace, self.open_delay, self.replaced_parts = pace, open_delay, replaced_parts
        self.pipe = threading.Lock() if shared else None  # one read at a time: more GETs bring no more
        self.opened: list[tuple[int, int | None]] = []
        self.active = self.max_active = 0
        self.lock = threading.Lock()

    def open_stream(self, key, start=0, length=None):
        import time

        time.sleep(self.open_delay)
        with self.lock:
            first = not self.opened
            self.opened.append((start, length))
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        size = os.path.getsize(self._path(key))
        return _PacedStream(self, key, start, size - start if length is None else length,
                            size + (1 if self.replaced_parts and not first and start > 0 else 0))


class _PacedStream(ObjectStream):  # (its own read; ObjectStream's readinto)
    def __init__(self, store, key, start, length, total):
        self.store, self.key, self.pos, self.end, self.total = store, key, start, start + length, total
        self.closed = False

    def read(self, n):
        import time

        if self.store.pipe is not None:
            with self.store.pipe:
                time.sleep(self.store.pace)
        else:
            time.sleep(self.store.pace)
        n = min(n, self.end - self.pos)
        data = LocalStore.get_range(self.store, self.key, self.pos, n) if n > 0 else b""
        self.pos += len(data)
        return data

    def close(self):
        if not self.closed:
            self.closed = True
            with self.store.lock:
                self.store.active -= 1


def _read_sequentially(r, start: int, end: int, step: int = 1 << 16) -> bytes:
    return b"".join(r.read(o, min(step, end - o)) for o in range(start, end, step))


def _paced(tmp_path, size: int, **kw):
    import hashlib

    store = PacedStore(str(tmp_path / "paced"), **kw)
    data = os.urandom(size)
    store.put("obj", data)
    return store, data, hashlib.md5(data).hexdigest()


def test_a_large_object_read_sequentially_gets_parallel_parts_in_a_growing_window(tmp_path):
    """A sequential reader that waits for its stream (the store sets the pace) gets part GETs
    behind the stream, their number doubling up to ``max_lanes``: each part a ranged GET of
    ``part_chunks`` chunks, the parts contiguous from where the stream was cut to the end, every
    chunk fetched once, the bytes the object's; the whole-object file fills in order and is kept
    (size and MD5 checked)."""
    chunk = 1 << 16
    store, data, md5 = _paced(tmp_path, 48 * chunk + 999)
    cache = DataCache(str(tmp_path / "cache"), 64 << 20)
    r = ChunkedReader(store, "obj", len(data), "s3://b/obj", md5, cache, chunk_size=chunk, read_ahead=2,
                      max_lanes=4, part_chunks=2, parts_min=0)
    assert _read_sequentially(r, 0, len(data)) == data
    assert r.streams == 1 and r.parts >= 3 and r.gets == r.streams + r.parts
    assert r.lanes_max == 4 and store.max_active >= 3  # the window grew 1 -> 2 -> 4
    assert r.bytes_from_store == len(data)  # every chunk once
    head, parts = store.opened[0], sorted(store.opened[1:])
    assert head == (0, len(data))  # the stream asked for all of it, and was cut
    assert parts[-1][0] + parts[-1][1] == len(data)
    assert all(a + n == b for (a, n), (b, _) in zip(parts, parts[1:]))  # contiguous, no overlap
    assert all(n <= 2 * chunk for _, n in parts)
    r.close()
    assert cache.wait_fills()
    with open(cache.whole_path("s3://b/obj", md5), "rb") as f:
        assert f.read() == data
    assert cache.stats()["whole_filled"] == 1
    cache.close()


def test_parts_wait_for_a_size_and_a_cheap_request_and_a_jump_resets_the_window(tmp_path):
    """No parts below ``parts_min``, nor where a request costs much against a part's transfer
    (its time to the response: moto copies the whole object for every GET) -- one stream then; a
    reader that jumps gets a new stream whose window starts again from one GET."""
    chunk = 1 << 16
    store, data, md5 = _paced(tmp_path, 40 * chunk)
    r = ChunkedReader(store, "obj", len(data), "file:///obj", md5, None, chunk_size=chunk, read_ahead=2,
                      max_lanes=4, part_chunks=2, parts_min=len(data) + 1)
    assert _read_sequentially(r, 0, len(data)) == data
    assert (r.streams, r.parts, r.lanes_max) == (1, 0, 1)
    r.close()
    slow = PacedStore(str(tmp_path / "paced"), open_delay=0.3)  # the same files, costly requests
    r = ChunkedReader(slow, "obj", len(data), "file:///obj", md5, None, chunk_size=chunk, read_ahead=2,
                      max_lanes=4, part_chunks=2, parts_min=0)
    assert _read_sequentially(r, 0, len(data)) == data
    assert (r.streams, r.parts, r.lanes_max) == (1, 0, 1) and len(slow.opened) == 1
    r.close()
    r = ChunkedReader(store, "obj", len(data), "file:///obj", md5, None, chunk_size=chunk, read_ahead=2,
                      max_lanes=4, part_chunks=2, parts_min=0)
    assert _read_sequentially(r, 0, 16 * chunk) == data[:16 * chunk]
    assert r.lanes_max > 1 and r.parts >= 1  # the window grew
    assert r.read(30 * chunk + 5, 100) == data[30 * chunk + 5:30 * chunk + 105]  # a jump: one chunk alone
    assert r.read(30 * chunk + 105, 1000) == data[30 * chunk + 105:30 * chunk + 1105]  # sequential again
    # a new stream from there, the window back to one GET and free to grow (_cap 4); on a loaded
    # machine it may have doubled already and judged the doubling not to pay (back to 1, _cap 1)
    assert r.lanes == 1 and r._cap in (4, 1)
    assert _read_sequentially(r, 30 * chunk + 1105, len(data)) == data[30 * chunk + 1105:]
    assert r.streams == 2
    r.close()


def test_a_doubling_that_brings_no_more_bytes_is_undone_and_the_window_grows_no_more(tmp_path):
    """Where another connection does not speed the store up (all streams share one pipe), the
    window goes back after the doubling that did not pay and grows no more (with one GET left,
    what the parts under way do not bring comes in one GET); the bytes the object's, every
    chunk once."""
    chunk = 1 << 16
    store, data, md5 = _paced(tmp_path, 48 * chunk, shared=True, pace=0.02)  # periods long against noise
    r = ChunkedReader(store, "obj", len(data), "file:///obj", md5, None, chunk_size=chunk, read_ahead=2,
                      max_lanes=2, part_chunks=4, parts_min=0)
    assert _read_sequentially(r, 0, len(data)) == data
    assert r.lanes == 1 and r.lanes_max == 2 and r.parts >= 1 and r.bytes_from_store == len(data)
    assert store.max_active <= 2
    tail = store.opened[-1]
    assert tail[0] + tail[1] == len(data)  # the last GET reaches the end (one for all that was left)
    r.close()


def test_a_part_of_another_size_is_refused_and_nothing_is_cached(tmp_path):
    """Every part's response is checked against the entry's size before a byte of it is used: a
    part that sees another object (replaced under the reader) is ``CorruptedData``, and the whole
    object never enters the data cache."""
    chunk = 1 << 16
    store, data, md5 = _paced(tmp_path, 48 * chunk, replaced_parts=True)
    cache = DataCache(str(tmp_path / "cache"), 64 << 20)
    r = ChunkedReader(store, "obj", len(data), "s3://b/obj", md5, cache, chunk_size=chunk, read_ahead=2,
                      max_lanes=4, part_chunks=2, parts_min=0)
    with pytest.raises(CorruptedData):
        _read_sequentially(r, 0, len(data))
    assert len(store.opened) >= 2 and r.parts == 0  # parts were asked for, none was taken
    r.close()
    assert cache.wait_fills()
    assert not os.path.exists(cache.whole_path("s3://b/obj", md5))
    assert cache.stats()["whole_filled"] == 0
    cache.close()


@pytest.mark.s3
def test_parallel_parts_on_s3_bring_the_objects_bytes(s3_config, s3_bucket):
    """On S3 (moto) the parts are ranged GETs of one client, each checked by the object's size
    (``Content-Range``): a sequential read with parts on brings the object's bytes, the chunks
    once each."""
    chunk = 1 << 18
    store, data, etag = _s3_object(s3_config, s3_bucket, 16 * chunk + 4321)
    r = ChunkedReader(store, "obj", len(data), store.full_uri("obj"), etag, None, chunk_size=chunk, read_ahead=2,
                      max_lanes=4, part_chunks=2, parts_min=0, part_cost=0)
    assert _read_sequentially(r, 0, len(data)) == data
    assert r.streams == 1 and r.parts >= 1 and r.bytes_from_store == len(data)
    r.close()
    store.close()


def test_the_mounts_lanes_setting_reaches_its_readers_and_is_checked(monkeypatch, tmp_path):
    """``$LAKEFUSE_S3_LANES`` (the daemon's ReadAheadPool) bounds its readers' GETs at once (1: one
    stream, no parts); a value that is not a whole number from 1 up is a clear error."""
    from graveler.errors import InvalidArgument
    from graveler.objstore.chunked import MAX_LANES, ReadAheadPool
    from lakefuse.mount.daemon import MountConfig

    monkeypatch.setenv("LAKEFUSE_S3_LANES", "1")
    assert MountConfig("r", "/mnt").s3_lanes == 1
    for bad in ("0", "two", "-3"):
        monkeypatch.setenv("LAKEFUSE_S3_LANES", bad)
        with pytest.raises(InvalidArgument, match=r"\$LAKEFUSE_S3_LANES: expected a whole number"):
            MountConfig("r", "/mnt")
    monkeypatch.delenv("LAKEFUSE_S3_LANES")
    assert MountConfig("r", "/mnt").s3_lanes is None
    chunk = 1 << 16
    store, data, md5 = _paced(tmp_path, 24 * chunk)
    with ReadAheadPool(lanes=1):
        r = ChunkedReader(store, "obj", len(data), "file:///obj", md5, None, chunk_size=chunk, read_ahead=2,
                          part_chunks=2, parts_min=0)
        assert r.max_lanes == 1
        assert _read_sequentially(r, 0, len(data)) == data
        assert (r.streams, r.parts) == (1, 0)
        r.close()
    with ReadAheadPool():
        assert ChunkedReader(store, "obj", len(data), "file:///obj", md5).max_lanes == MAX_LANES


def test_failed_cache_writes_are_said_once_a_minute_with_a_count(tmp_path, caplog):
    """An administrator's finding: a full cache disk gave one warning per chunk (19 for one read)."""
    import logging

    cache = DataCache(str(tmp_path / "dc"), 64 << 20)
    with caplog.at_level(logging.WARNING, logger="graveler.objstore.datacache"):
        for _ in range(5):
            cache.warn_write(OSError(28, "No space left on device"))
        assert len(caplog.records) == 1 and "No space left" in caplog.records[0].getMessage()
        cache._warned_t -= 61  # a minute later
        cache.warn_write(OSError(28, "No space left on device"))
        assert len(caplog.records) == 2 and "(4 more since the last such warning)" in caplog.records[1].getMessage()
    cache.close()


def _value_files(d) -> list:
    return [p for p in d.rglob("*.val")]


@pytest.mark.expect_log("a damaged or lost cache index is said once, and the cache made again")
def test_a_data_cache_whose_index_is_damaged_is_made_again_and_one_removed_stops_growing(tmp_path):
    """Found by an S3 user's tour: a damaged cache.db made every mount fail "store unavailable"
    (exit 6) until the directory was deleted; a cache.db removed under a mount made each chunk a
    file no index named, which nothing evicted, across remounts too (1.2 GB in a 100 MB cache).
    The cache holds only copies: a damaged one is emptied and made again; one whose index went
    stops keeping chunks at the first write that finds it gone."""
    d = tmp_path / "dc"
    cache = DataCache(str(d), 1 << 20)
    for i in range(4):
        cache.put(f"k{i}", os.urandom(40_000))  # (beyond diskcache's inline size, 32 KiB: value files)
    cache.close()
    assert len(_value_files(d)) == 4
    # the healthy side: reopened as it was, its chunks served
    cache = DataCache(str(d), 1 << 20)
    assert cache.contains("k0") and len(_value_files(d)) == 4
    cache.close()
    # damaged: emptied and made again, not "store unavailable"
    with open(d / "cache.db", "r+b") as f:
        f.write(os.urandom(4096))
    cache = DataCache(str(d), 1 << 20)
    assert not cache.contains("k0") and _value_files(d) == []
    cache.put("k9", os.urandom(40_000))
    assert cache.contains("k9")
    # removed under a live cache: no more files that nothing indexes
    for name in ("cache.db", "cache.db-wal", "cache.db-shm"):
        (d / name).unlink(missing_ok=True)

    def puts():  # (a new thread: diskcache opens it a connection of its own, to the path, which finds no table)
        for i in range(5):
            cache.put(f"n{i}", os.urandom(40_000))

    import threading

    t = threading.Thread(target=puts)
    t.start()
    t.join()
    assert len(_value_files(d)) <= 2  # (k9's, and the one write that found the index gone)
    cache.close()
