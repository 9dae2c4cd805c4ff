"""Data objects are checked against their entry on every read (graveler.objects), on every backend."""

from __future__ import annotations

import hashlib
import os

import pytest

from graveler.errors import CorruptedData, NotFound
from graveler.objects import is_md5_etag, iter_verified, read_range_checked, read_verified
from graveler.objstore import LocalStore, open_store

DATA = b"hello\n"


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request, tmp_path):
    if request.param == "local":
        s = open_store(str(tmp_path / "store"))
    else:
        s = open_store(f"s3://{request.getfixturevalue('s3_bucket')}/ns",
                       request.getfixturevalue("s3_config"))
    yield s
    s.close()


def _replace(store, key: str, data: bytes) -> None:
    """Change an object behind graveler's back: the file itself, or a raw PUT on S3."""
    if isinstance(store, LocalStore):
        with open(os.path.join(store.root, key), "wb") as f:
            f.write(data)
    else:
        store.put(key, data)


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def test_intact_object_reads(store):
    big = os.urandom(100_000)
    store.put("o", big)
    assert read_verified(store, "o", len(big), md5(big)) == big
    assert read_range_checked(store, "o", len(big), 10, 100) == big[10:110]
    assert read_range_checked(store, "o", len(big), 99_990, 100) == big[99_990:]
    assert read_range_checked(store, "o", len(big), 200_000, 10) == b""
    assert b"".join(iter_verified(store, "o", len(big), md5(big), chunk=30_000)) == big
    store.put("empty", b"")
    assert read_verified(store, "empty", 0, md5(b"")) == b""
    assert list(iter_verified(store, "empty", 0, md5(b""))) == []
    with pytest.raises(NotFound):
        read_verified(store, "missing", 1, md5(b"x"))


@pytest.mark.parametrize("damage", [b"", b"hel", b"hello\nand more", b"hellO\n"],
                         ids=["emptied", "truncated", "grown", "bit-flipped"])
def test_damaged_object_is_corrupted_data(store, damage):
    store.put("o", DATA)
    _replace(store, "o", damage)
    with pytest.raises(CorruptedData, match="o") as ei:
        read_verified(store, "o", len(DATA), md5(DATA))
    assert store.full_uri("o") in str(ei.value)
    with pytest.raises(CorruptedData):
        b"".join(iter_verified(store, "o", len(DATA), md5(DATA), chunk=4))
    if len(damage) != len(DATA):  # a ranged read checks the size, every time
        with pytest.raises(CorruptedData, match="bytes but its entry says 6"):
            read_range_checked(store, "o", len(DATA), 0, 2)
        with pytest.raises(CorruptedData):
            read_range_checked(store, "o", len(DATA), 50, 2)
    else:  # same size: a part cannot tell, the whole read did
        assert read_range_checked(store, "o", len(DATA), 0, 2) == damage[:2]


def test_streaming_holds_back_the_last_chunk_of_a_bad_object(store):
    data = os.urandom(10_000)
    store.put("o", data)
    bad = bytearray(data)
    bad[-1] ^= 1
    _replace(store, "o", bytes(bad))
    got = []
    with pytest.raises(CorruptedData, match="MD5"):
        for chunk in iter_verified(store, "o", len(data), md5(data), chunk=4096):
            got.append(chunk)
    assert sum(map(len, got)) == 8192  # the chunk holding the damage was never handed out


def test_multipart_etag_checks_size_only(store):
    store.put("o", DATA)
    etag = "0123456789abcdef0123456789abcdef-2"
    assert not is_md5_etag(etag) and is_md5_etag(md5(DATA)) and is_md5_etag('"%s"' % md5(DATA).upper())
    assert read_verified(store, "o", len(DATA), etag) == DATA
    with pytest.raises(CorruptedData):
        read_verified(store, "o", len(DATA) + 1, etag)


def test_local_object_replaced_by_a_symlink(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    store.put("o", DATA)
    other = tmp_path / "other"
    other.write_bytes(b"secret")  # same size, other bytes
    os.unlink(os.path.join(store.root, "o"))
    os.symlink(other, os.path.join(store.root, "o"))
    with pytest.raises(CorruptedData):
        read_verified(store, "o", len(DATA), md5(DATA))


def test_file_etag_is_the_md5_of_a_small_file_and_the_composite_of_a_large_ones_parts(tmp_path, monkeypatch):
    """A file nobody hashed while writing it: below COMPOSITE_MIN its etag is its MD5; from
    there on S3's multipart form over composite_part(size) parts, holes hashed as the zeros
    they read as (a sparse file and the same bytes written out have one etag), and any byte
    changed changes it. ``like`` chooses the form to compare with, whatever the size."""
    import graveler.objects as o

    monkeypatch.setattr(o, "COMPOSITE_MIN", 1 << 20)
    monkeypatch.setattr(o, "_COMPOSITE_PART", 256 << 10)
    size = 1_500_000  # six parts: holes at both ends and between, data crossing part boundaries
    sparse = os.open(tmp_path / "sparse", os.O_RDWR | os.O_CREAT)
    os.ftruncate(sparse, size)
    payload = os.urandom(400_000)
    os.pwrite(sparse, payload, 300_000)
    os.pwrite(sparse, b"tail", 1_200_000)
    content = os.pread(sparse, size + 1, 0)
    assert len(content) == size
    part = o.composite_part(size)
    assert part == 256 << 10
    want = hashlib.md5(b"".join(hashlib.md5(content[i:i + part]).digest() for i in range(0, size, part)))
    assert o.file_etag(sparse, size) == f"{want.hexdigest()}-6"
    written = os.open(tmp_path / "written", os.O_RDWR | os.O_CREAT)
    os.pwrite(written, content, 0)  # the same bytes, no holes
    assert o.file_etag(written, size) == o.file_etag(sparse, size)
    os.pwrite(written, b"\1", 5)  # one byte in a part that was a hole
    assert o.file_etag(written, size) != o.file_etag(sparse, size)
    assert o.file_etag(sparse, size, like=md5(b"x")) == md5(content)  # an MD5 to compare with: an MD5
    small = content[:1000]
    assert o.file_etag(sparse, 1000) == md5(small) and is_md5_etag(o.file_etag(sparse, 1000))
    one_part = hashlib.md5(hashlib.md5(small).digest()).hexdigest() + "-1"
    assert o.file_etag(sparse, 1000, like="0" * 32 + "-2") == one_part
    assert o.file_etag(sparse, 0) == md5(b"")
    os.close(sparse)
    os.close(written)


def test_file_etag_of_a_terabyte_of_holes_reads_none_of_them(tmp_path):
    """``truncate -s 1T`` and three bytes at the end: the composite etag hashes one part's
    zeros once and the three bytes, not a terabyte (half an hour of MD5 on these machines)."""
    import time

    import graveler.objects as o

    fd = os.open(tmp_path / "huge", os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, b"END", 1 << 40)
        size = (1 << 40) + 3
        part = o.composite_part(size)
        assert part == 128 << 20 and size // part == 8192
        zeros = hashlib.md5(bytes(part)).digest()
        want = hashlib.md5(zeros * 8192 + hashlib.md5(b"END").digest()).hexdigest() + "-8193"
        t = time.monotonic()
        assert o.file_etag(fd, size) == want
        assert time.monotonic() - t < 20
    finally:
        os.close(fd)
