"""An open directory listing of a branch tree goes on, entry by entry, when a directory
above it (or the directory itself) is renamed mid-listing: no entry twice, none skipped,
and every entry handed out after the rename answers under the new path.

Real mount; the listing is read with ``getdents64(2)`` and a small buffer, so the kernel
asks the daemon again and again from the offset reached. The directory has more entries
than one page the daemon reads from graveler (``FsConfig.readdir_page``, 1,000), so the
listing needs a second page after the rename."""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

import pytest

from graveler import Graveler, GravelerConfig
from tests.graveler_testutil import FAST_KV
from tests.mount_testutil import MountProc, needs_fuse

pytestmark = needs_fuse

REPO = "lsrepo"
N = 1_300  # more than one page of 1,000 names
SYS_GETDENTS64 = {"x86_64": 217, "aarch64": 61}.get(os.uname().machine)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def getdents(fd: int, size: int) -> list[str]:
    """One ``getdents64`` call with a ``size``-byte buffer: the names it returned ([]: the end)."""
    buf = ctypes.create_string_buffer(size)
    n = _libc.syscall(SYS_GETDENTS64, fd, buf, size)
    if n < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    raw = buf.raw[:n]
    names, pos = [], 0
    while pos < n:
        _ino, _off, reclen = struct.unpack_from("<QqH", raw, pos)
        name = raw[pos + 19:pos + reclen].split(b"\0", 1)[0].decode()
        if name not in (".", ".."):
            names.append(name)
        pos += reclen
    return names


def name(i: int) -> str:
    return f"entry-{i:05d}-with-a-name-long-enough-to-fill-small-buffers.txt"


@pytest.fixture(scope="module")
def mnt(tmp_path_factory):
    base = tmp_path_factory.mktemp("lsren")
    home = base / "home"
    g = Graveler(GravelerConfig(home=home, kv=FAST_KV))
    try:
        r = g.create_repository(REPO, f"file://{base}/ns")
        for d in ("a", "b", "c"):
            for i in range(N):
                r.upload("main", f"{d}/top/sub/{name(i)}", f"{d}{i}\n".encode())
        r.commit("main", "three listings")
        for d in ("a", "b"):  # one more staged beside the committed ones: the listing merges both
            r.upload("main", f"{d}/top/sub/{name(N)}", f"{d}{N}\n".encode())
    finally:
        g.close()
    mp = base / "mnt"
    m = MountProc(home, REPO, mp, "--branch-timeout", "0.2").start()
    yield mp / "main"
    m.stop()
    assert "Traceback" not in m.log(), m.log()


@pytest.mark.skipif(SYS_GETDENTS64 is None, reason="getdents64 number unknown on this machine")
@pytest.mark.parametrize("src,moved,dst", [
    # an ancestor renamed to a name after the old one ("a/top" -> "a/up"), and the listed
    # directory itself to a name before its old one ("b/top/sub" -> "b/top/SUB")
    ("a/top", "a/up", "a/up/sub"),
    ("b/top/sub", "b/top/SUB", "b/top/SUB"),
])
def test_a_listing_goes_on_after_a_rename_of_its_directory_or_an_ancestor(mnt, src, moved, dst):
    tag = src[0]
    want = [name(i) for i in range(N + 1)]
    fd = os.open(mnt / src.split("/")[0] / "top" / "sub", os.O_RDONLY | os.O_DIRECTORY)
    try:
        got = []
        while len(got) < 40:  # a few small reads: the daemon has its first page read
            got += getdents(fd, 512)
        os.rename(mnt / src, mnt / moved)
        while True:  # then as glibc's readdir reads (32 KiB at a time)
            more = getdents(fd, 32768)
            if not more:
                break
            got += more
    finally:
        os.close(fd)
    twice = sorted({n for n in got if got.count(n) > 1})
    assert not twice, f"{len(twice)} entries listed twice, e.g. {twice[:3]}"
    assert got == want, f"{len(set(want) - set(got))} entries missing, e.g. {sorted(set(want) - set(got))[:3]}"
    # what the listing handed out after the rename answers under the new path, with its content
    for i in (0, 39, 41, 500, 999, 1000, 1001, N):
        p = mnt / dst / name(i)
        assert os.stat(p).st_size == len(f"{tag}{i}\n")
        assert p.read_bytes() == f"{tag}{i}\n".encode()
    assert not (mnt / src).exists()


def getdents_offsets(fd: int, size: int) -> list[tuple[str, int]]:
    """:func:`getdents` with each entry's ``d_off`` (what ``telldir`` gives after it)."""
    buf = ctypes.create_string_buffer(size)
    n = _libc.syscall(SYS_GETDENTS64, fd, buf, size)
    if n < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    raw, out, pos = buf.raw[:n], [], 0
    while pos < n:
        _ino, off, reclen = struct.unpack_from("<QqH", raw, pos)
        out.append((raw[pos + 19:pos + reclen].split(b"\0", 1)[0].decode(), off))
        pos += reclen
    return out


@pytest.mark.skipif(SYS_GETDENTS64 is None, reason="getdents64 number unknown on this machine")
@pytest.mark.parametrize("size", [300, 1024, 4000])
def test_a_listing_read_in_small_pieces_while_the_directory_changes_skips_and_repeats_nothing(mnt, size):
    """Found by a tour of the whole of POSIX: read with a buffer under 4 KiB (the kernel asks again from
    an offset inside its last reply) while names around the position were created and removed, the
    listing of a directory of over a page skipped or repeated entries that were there all along (60 of
    1,300 with 1 KiB). Every name there throughout is listed once, none twice; one created or removed
    meanwhile may or may not be (POSIX)."""
    d = mnt / "c" / "top" / "sub"
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    removed, added = set(), set()
    try:
        got = []
        while True:
            more = getdents(fd, size)
            if not more:
                break
            got += more
            if len(got) % 3 == 0 or len(removed) > 300:
                continue
            i = int(got[-1][6:11])  # entry-NNNNN-...: names just before and just after the position
            for j in (i - 12, i + 6):
                if 0 <= j < N and j not in removed:
                    os.unlink(d / name(j))
                    removed.add(j)
            extra = f"entry-{i:05d}-{size}-a-new-one"
            (d / extra).write_bytes(b"new")
            added.add(extra)
    finally:
        os.close(fd)
        for j in removed:
            (d / name(j)).write_bytes(f"c{j}\n".encode())
        for extra in added:
            os.unlink(d / extra)
    twice = sorted({n for n in got if got.count(n) > 1})
    assert not twice, f"{len(twice)} entries listed twice, e.g. {twice[:3]}"
    kept = {name(i) for i in range(N)} - {name(j) for j in removed}  # (c: no staged one beside)
    missing = sorted(kept - set(got))
    assert not missing, f"{len(missing)} entries there throughout were skipped, e.g. {missing[:3]}"
    assert set(got) <= kept | {name(j) for j in removed} | added and len(removed) > 20


@pytest.mark.skipif(SYS_GETDENTS64 is None, reason="getdents64 number unknown on this machine")
def test_seekdir_to_a_cookie_telldir_gave_goes_on_after_that_entry_while_the_directory_changes(mnt):
    """``telldir`` cookies (an entry's ``d_off``) of a listing read in small pieces: ``seekdir`` to an
    earlier one goes on with the entry after it, also after names were added meanwhile."""
    d = mnt / "c" / "top" / "sub"
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        seq = []
        while more := getdents_offsets(fd, 700):
            seq += [(n, off) for n, off in more if n not in (".", "..")]
        assert [n for n, _ in seq] == [name(i) for i in range(N)]
        for k in (5, 300, 999, 1000, 1001, 1250, 17):
            (d / f"entry-{k:05d}-zz-added").write_bytes(b"x")  # after the entry: not to be skipped to
            os.lseek(fd, seq[k][1], os.SEEK_SET)
            first = [n for n, _ in getdents_offsets(fd, 700) if n not in (".", "..")][0]
            assert first in (seq[k + 1][0], f"entry-{k:05d}-zz-added"), (k, first)
    finally:
        os.close(fd)
        for k in (5, 300, 999, 1000, 1001, 1250, 17):
            (d / f"entry-{k:05d}-zz-added").unlink(missing_ok=True)

