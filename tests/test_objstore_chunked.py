"""ChunkedReader (ranged reads with read-ahead) and DataCache (object chunks on disk)."""

from __future__ import annotations

import os

import pytest

from graveler.errors import CorruptedData, NotFound
from graveler.objstore import LocalStore
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
    """The mount daemon owns the read-ahead workers: while its pool is open every reader's
    read-ahead runs there; close() ends its threads, and readers fall back to the process pool."""
    from graveler.objstore import chunked

    data = os.urandom(10_000)
    store.put("obj", data)
    pool = chunked.ReadAheadPool(workers=2)
    try:
        assert chunked._executor() is pool
        r = ChunkedReader(store, "obj", len(data), "file:///obj", "e", None, chunk_size=1000, read_ahead=3)
        assert b"".join(r.read(off, 1000) for off in range(0, len(data), 1000)) == data
        r.close()
        threads = set(pool._executor._threads)
        assert threads  # the read-ahead ran on the owner's workers
    finally:
        pool.close()
    assert not any(t.is_alive() for t in threads)
    assert chunked._executor() is not pool
    with pytest.raises(RuntimeError):
        pool.submit(print)  # closed: takes no more work
