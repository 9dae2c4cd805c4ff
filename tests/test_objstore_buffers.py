"""The chunk buffers streams receive into (graveler.objstore.buffers): reused, never under a holder."""

from __future__ import annotations

import os

import pytest

from graveler.objstore.buffers import BufferPool, pool
from graveler.objstore.chunked import ChunkedReader, ReadAheadPool


def test_a_buffer_is_reused_only_once_nothing_refers_to_it():
    """A buffer comes back from the pool only when its last holder let go: a memoryview of any
    part of it (what a FUSE reply or a chunk in memory holds) keeps it out."""
    p = BufferPool(1 << 16, keep=4)
    a = p.take()
    first = id(a)
    assert len(a) == 1 << 16 and p.made == 1
    a[:5] = b"hello"
    held = memoryview(a)[1:3]  # a slice of a view: holds the buffer too
    del a
    b = p.take()
    assert id(b) != first and p.made == 2  # still held: a new buffer
    del b
    assert bytes(held) == b"el"
    c = p.take()  # the second one is free again: reused
    assert id(c) != first and p.made == 2
    del held
    d = p.take()  # now the first is free too
    assert id(d) == first and p.made == 2 and p.free() == 0
    del c, d
    assert p.free() == 2
    many = [p.take() for _ in range(6)]  # past what the pool keeps: made, then let go
    assert p.made == 6 and p.free() == 0
    del many
    assert p.free() == 4
    kept = p.take()
    p.trim(1)  # free ones go past one kept buffer; a held one stays
    assert p.free() == 0 and p.take() is not kept and p.made == 7


@pytest.mark.s3
def test_a_stream_receives_into_reused_buffers_and_what_a_reader_holds_keeps_its_bytes(s3_config, s3_bucket):
    """An S3 stream receives its chunks straight into the pool's buffers: the bytes a reader was
    handed (views of them, as FUSE replies are) stay the object's bytes while the stream runs on
    past them; a second read that lets go of what it read (as FUSE replies do) takes buffers the
    first one let go, and makes none; with no stream left, a few free buffers stay kept."""
    from graveler.objstore.buffers import KEEP_IDLE
    from graveler.objstore.s3 import S3Store

    chunk = 1 << 20
    store = S3Store(s3_bucket, "ns", s3_config)
    data = os.urandom(12 * chunk + 4321)
    etag = store.put("obj", data).etag
    step = 300_001

    def read_all(held: list, keep: bool = True) -> ChunkedReader:
        r = ChunkedReader(store, "obj", len(data), store.full_uri("obj"), etag, None, chunk_size=chunk,
                          read_ahead=2)
        off = 0
        while off < len(data):  # as the FUSE adapter reads: what is in memory, else wait, else read
            got = r.read_ready(off, step)
            if got is None:
                f = r.pending(off, step)
                if f is not None:
                    f.result()
                    got = r.read_ready(off, step)
            if got is None:
                got = r.read(off, step)
            assert got == data[off:off + len(got)]
            if keep:
                held.append(got)
            off += len(got)
        assert r.gets == 1
        return r

    with ReadAheadPool() as rp:
        held: list = []
        r = read_all(held)
        assert b"".join(held) == data  # every piece held to the end: none was overwritten
        assert any(isinstance(h, memoryview) for h in held)  # handed out as views, no copy
        del held
        r.close()
    assert pool(chunk).free() == KEEP_IDLE  # all let go at its close: a few kept for the next stream
    made = pool(chunk).made
    with ReadAheadPool() as rp:
        read_all([], keep=False).close()
    assert pool(chunk).made == made  # the second read reused the first one's buffers
    assert rp.threads() == []
    store.close()


def test_a_whole_file_a_process_left_unfinished_is_removed_when_the_cache_opens_again(tmp_path):
    """A whole file whose fill or MD5 check a process's exit cut short (its temporary file) is
    removed when a data cache opens on the directory again, once it is old enough not to be
    another process's fill under way; a recent one and the kept files stay."""
    from graveler.objstore.datacache import TMP_STALE_S, DataCache

    cache = DataCache(str(tmp_path / "dc"), 1 << 30)
    fill = cache.whole_fill("s3://b/obj", "0" * 32, 5, threaded=False)
    fill.write(b"hello")  # never committed: as a daemon that exited meanwhile leaves it
    kept = cache.whole_fill("s3://b/kept", "k", 4)
    kept.write(b"kept")
    kept.commit(check=False)
    cache.close()
    recent = cache.whole_fill("s3://b/other", "1" * 32, 5, threaded=False)  # another process's, under way
    recent.write(b"world")
    stale = [fill.tmp]
    past = os.stat(fill.tmp).st_mtime - TMP_STALE_S - 1
    os.utime(fill.tmp, (past, past))
    DataCache(str(tmp_path / "dc"), 1 << 30).close()
    assert not any(os.path.exists(p) for p in stale)
    assert os.path.exists(recent.tmp) and os.path.exists(cache.whole_path("s3://b/kept", "k"))
    recent.abort()
    fill.abort()
