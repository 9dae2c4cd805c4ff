"""fallocate(2) on branch files (lakefuse.mount.falloc): the core against a native ext4/tmpfs
file given the same operations, and the util-linux ``fallocate`` tool through a real mount."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakefuse.mount import falloc
from lakefuse.mount.errors import errno_for
from lakefuse.mount.writes import Caller, SetAttr
from tests.mount_core_testutil import ino_of, seeded_repo, writable_core
from tests.mount_testutil import clean_mount, commit_and_read_back, empty_repo_on, needs_fuse

ME = Caller(uid=1000, gid=100)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
MODES = [0, falloc.KEEP_SIZE, falloc.PUNCH_HOLE | falloc.KEEP_SIZE, falloc.ZERO_RANGE,
         falloc.ZERO_RANGE | falloc.KEEP_SIZE]


def native_fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@pytest.fixture
def core(tmp_path, request):
    with seeded_repo(tmp_path, "fal", {"seed": b"0123456789" * 1000}, request) as repo:
        with writable_core(repo, tmp_path / "cache") as fs:
            yield fs, repo


ops = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 40_000), st.integers(1, 9_000)),
    st.tuples(st.just("truncate"), st.integers(0, 40_000), st.just(0)),
    st.tuples(st.sampled_from(MODES), st.integers(0, 40_000), st.integers(1, 20_000)),
    st.tuples(st.just("close"), st.just(0), st.just(0)),
), max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops)
def test_fallocate_modes_match_a_native_file(core, tmp_path, ops):
    """Random writes, truncates, closes and fallocate in every mode the mount takes, on a branch
    file (opened over a committed one: its content is copied in at the first change) and on a
    native file: same size and bytes after each step, and the saved object holds them."""
    fs, repo = core
    native = tmp_path / "native"
    native.write_bytes(repo.read("main", "seed"))
    nfd = os.open(native, os.O_RDWR)
    ino = ino_of(fs, "main/seed")
    o = fs.open(ino, os.O_RDWR)
    try:
        for i, (op, off, n) in enumerate(ops):
            if op == "write":
                data = bytes([i % 251 + 1]) * n
                assert fs.write(o.fh, off, data) == os.pwrite(nfd, data, off)
            elif op == "truncate":
                fs.setattr(ino, SetAttr(size=off), o.fh)
                os.ftruncate(nfd, off)
            elif op == "close":
                fs.flush(o.fh)
                fs.release(o.fh)
                o = fs.open(ino, os.O_RDWR)
            else:
                native_fallocate(nfd, op, off, n)
                fs.fallocate(o.fh, op, off, n)
            size = os.fstat(nfd).st_size
            assert fs.getattr(ino).size == size, (i, op, off, n)
            assert fs.read(o.fh, 0, size + 10) == os.pread(nfd, size + 10, 0), (i, op, off, n)
        fs.flush(o.fh)
    finally:
        fs.release(o.fh)
        os.close(nfd)
    assert repo.read("main", "seed") == native.read_bytes()


def test_modes_linux_refuses_are_refused_and_change_nothing(core):
    fs, repo = core
    o, attr = fs.create(ino_of(fs, "main"), b"f", stat.S_IFREG | 0o644, os.O_RDWR, ME)
    try:
        fs.write(o.fh, 0, b"abcdef")
        for mode, off, n, want in ((falloc.PUNCH_HOLE, 0, 2, errno.EOPNOTSUPP),  # a punch must keep the size
                                   (0x08, 0, 4096, errno.EOPNOTSUPP),  # FALLOC_FL_COLLAPSE_RANGE
                                   (0x20, 0, 4096, errno.EOPNOTSUPP),  # FALLOC_FL_INSERT_RANGE
                                   (falloc.PUNCH_HOLE | falloc.ZERO_RANGE | falloc.KEEP_SIZE, 0, 2, errno.EOPNOTSUPP),
                                   (0, 0, 0, errno.EINVAL), (0, -1, 5, errno.EINVAL)):
            with pytest.raises(Exception) as ei:
                fs.fallocate(o.fh, mode, off, n)
            assert errno_for(ei.value) == want, (mode, off, n)
        assert fs.read(o.fh, 0, 100) == b"abcdef"
        fs.flush(o.fh)
    finally:
        fs.release(o.fh)
    assert repo.read("main", "f") == b"abcdef"
    r = fs.open(ino_of(fs, "main/f"), os.O_RDONLY)  # a read-only handle: EBADF (the kernel's answer first)
    try:
        with pytest.raises(Exception) as ei:
            fs.fallocate(r.fh, 0, 0, 10)
        assert errno_for(ei.value) in (errno.EBADF, errno.EOPNOTSUPP)
    finally:
        fs.release(r.fh)


@needs_fuse
def test_the_fallocate_tool_through_the_mount(tmp_path, request):
    home, env = empty_repo_on(tmp_path, request, "local", "falrepo")
    with clean_mount(home, "falrepo", tmp_path / "mnt", "--cache-dir", str(tmp_path / "cache"), env=env) as mp:
        b = mp / "main"

        def tool(*args) -> subprocess.CompletedProcess:
            return subprocess.run(["fallocate", *args], capture_output=True, text=True)

        assert tool("-l", "1MiB", str(b / "pre")).returncode == 0
        assert os.stat(b / "pre").st_size == 1 << 20 and (b / "pre").read_bytes() == bytes(1 << 20)
        (b / "p").write_bytes(b"abcdefghij")
        assert tool("-p", "-o", "2", "-l", "3", str(b / "p")).returncode == 0  # punch a hole
        (b / "z").write_bytes(b"abcdefghij")
        assert tool("-z", "-o", "8", "-l", "6", str(b / "z")).returncode == 0  # zero range past the end
        (b / "k").write_bytes(b"abcdefghij")
        assert tool("-n", "-l", "100", str(b / "k")).returncode == 0  # keep size
        r = tool("-c", "-o", "0", "-l", "4096", str(b / "pre"))  # collapse range
        assert r.returncode != 0 and "not supported" in r.stderr, r.stderr
        fd = os.open(b / "posix", os.O_RDWR | os.O_CREAT, 0o644)
        os.posix_fallocate(fd, 0, 5000)
        os.close(fd)
        want = {"p": b"ab\0\0\0fghij", "z": b"abcdefgh" + bytes(6), "k": b"abcdefghij", "posix": bytes(5000)}
        for name, data in want.items():
            assert (b / name).read_bytes() == data, name
        commit_and_read_back(mp, "p", want["p"], "fallocate")
        head = (b / ".lakefuse" / "head").read_text().strip()
        assert {name: (mp / head / name).read_bytes() for name in want} == want
