"""A sparse file stays sparse through every copy a branch file goes through (real ext4 or tmpfs
files, a real local store): the copy-in of a saved object at its first change, the
copy-on-write of a file saved and then written on, and a store's copy when it cannot take the
spool file by a hard link. Each reads back byte for byte as the source. (A 200 MB file made with
``truncate`` took 200 MB of disk at its first change, and 1 GiB failed with ENOSPC on a small
spool disk.)"""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from graveler.objects import PosixAttrs
from graveler.objstore import sparse
from graveler.objstore.local import LocalStore
from lakefuse.mount.spool import Spool, SpoolConfig
from tests.graveler_testutil import make_repo

ATTRS = PosixAttrs(mode=0o100644, uid=0, gid=0)
MiB = 1 << 20
SIZE = 64 * MiB
PIECES = {0: b"head", 5 * MiB + 3: b"middle" * 1000, SIZE - 4: b"tail"}  # 3 small extents in 64 MiB


def _sparse_file(path) -> bytes:
    with open(path, "wb") as f:
        f.truncate(SIZE)
        for off, data in PIECES.items():
            f.seek(off)
            f.write(data)
    return _expected()


def _expected() -> bytes:
    buf = bytearray(SIZE)
    for off, data in PIECES.items():
        buf[off:off + len(data)] = data
    return bytes(buf)


def _allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def _holes_supported(tmp_path) -> bool:
    p = tmp_path / "probe"
    with open(p, "wb") as f:
        f.truncate(SIZE)
    return _allocated(p) < MiB


@pytest.fixture
def sparse_ok(tmp_path):
    if not _holes_supported(tmp_path):
        pytest.skip("this filesystem keeps no holes")


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_copy_sparse_copies_the_data_and_keeps_the_holes(tmp_path, sparse_ok, monkeypatch, kernel_copy):
    want = _sparse_file(tmp_path / "src")
    if not kernel_copy:  # another filesystem: copy_file_range refused, reads and writes instead
        monkeypatch.setattr(os, "copy_file_range", lambda *a: (_ for _ in ()).throw(OSError(errno.EXDEV, "x")))
    src = os.open(tmp_path / "src", os.O_RDONLY)
    dst = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        sparse.copy_sparse(src, dst, SIZE)
    finally:
        os.close(src)
        os.close(dst)
    assert (tmp_path / "dst").read_bytes() == want
    assert _allocated(tmp_path / "dst") < 4 * MiB
    # and a dense file is copied whole
    dense = os.urandom(3 * MiB + 5)
    (tmp_path / "d").write_bytes(dense)
    src, dst = os.open(tmp_path / "d", os.O_RDONLY), os.open(tmp_path / "d2", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        sparse.copy_sparse(src, dst, len(dense))
    finally:
        os.close(src)
        os.close(dst)
    assert (tmp_path / "d2").read_bytes() == dense


def test_a_store_copying_a_file_it_cannot_link_keeps_its_holes(tmp_path, sparse_ok):
    want = _sparse_file(tmp_path / "src")
    store = LocalStore(str(tmp_path / "store"))
    info = store.put_file("k", str(tmp_path / "src"))
    path = store._path("k")
    assert open(path, "rb").read() == want and info.etag == hashlib.md5(want).hexdigest()
    assert _allocated(path) < 4 * MiB
    # the writer's grain: a block of zeros is a hole, a block with one byte set is data
    blk = sparse.BLOCK
    data = bytes(blk) + b"\0" * (blk - 1) + b"x" + bytes(blk) + b"\1" + bytes(blk - 1) + bytes(100)
    fd = os.open(tmp_path / "w", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        sparse.pwrite_sparse(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    assert (tmp_path / "w").read_bytes() == data


def test_a_sparse_branch_file_changed_or_written_on_after_its_save_stays_sparse(tmp_path, sparse_ok):
    repo = make_repo(tmp_path)
    spool = Spool(repo, SpoolConfig(tmp_path / "cache", repo.name))
    try:
        sf = spool.open(1, "main", b"sp.bin", None, ATTRS, new=True)
        for off, data in PIECES.items():
            sf.write(off, data)
        e1 = sf.flush()  # the spool file becomes the object (a hard link): sparse
        assert _allocated(repo._store._path(e1.address)) < 4 * MiB
        sf.write(SIZE, b"+")  # written on after its save: copied first (copy-on-write)
        e2 = sf.flush()
        spool.release(1)
        assert repo.read("main", "sp.bin") == _expected() + b"+"
        assert _allocated(repo._store._path(e2.address)) < 4 * MiB
        assert spool.stats["cow_bytes"] == SIZE
        # opened again later and appended to: copied in from the store first
        sf = spool.open(2, "main", b"sp.bin", repo.get("main", "sp.bin"), ATTRS)
        sf.write(SIZE + 1, b"!")
        assert _allocated(sf.data_path) < 4 * MiB
        e3 = sf.flush()
        spool.release(2)
        assert repo.read("main", "sp.bin") == _expected() + b"+!"
        assert e3.etag == hashlib.md5(_expected() + b"+!").hexdigest()
        assert _allocated(repo._store._path(e3.address)) < 4 * MiB
        assert spool.stats["copy_in_bytes"] == SIZE + 1
    finally:
        spool.close()
