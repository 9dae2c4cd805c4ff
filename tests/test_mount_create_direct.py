"""A branch file created write-only (cp, tar, ``open(..., "wb")``) is opened with direct I/O:
each write(2) is one WRITE request as before, but the kernel skips its page cache and with it
the ``getxattr security.capability`` it sends before every cached write (FUSE keeps no
"no security xattrs" flag). Readers see every byte at once, the file reads back the same after
the close and the commit, and a create that could need the kernel's set-id clearing (a set-id
mode) or that reads too (O_RDWR: mmap, read-back) keeps the page cache."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.mount_testutil import clean_mount, needs_fuse, seeded_home

pytestmark = needs_fuse

REPO = "cdirect"


@pytest.fixture(scope="module")
def mnt(tmp_path_factory):
    home = seeded_home(tmp_path_factory, REPO)
    # allow_other, and a mountpoint every user can reach: the set-ID test writes as another user
    top = Path(tempfile.mkdtemp(prefix="lakefuse-cdirect-"))
    try:
        top.chmod(0o755)
        with clean_mount(home, REPO, top / "mnt", "-o", "allow_other") as mp:
            yield mp
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _requests(mp) -> dict:
    return json.loads((mp / ".lakefuse" / "stats").read_text())["requests"]


def _write_file(path, flags: int, mode: int, pieces: list[bytes]) -> None:
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
    try:
        for p in pieces:
            assert os.write(fd, p) == len(p)
    finally:
        os.close(fd)


def test_a_write_only_create_sends_no_getxattr_per_write_and_reads_back_the_same(mnt):
    d = mnt / "main" / "wo"
    d.mkdir()
    pieces = [os.urandom(4096), os.urandom(10240), b"tail"]
    before = _requests(mnt)
    for i in range(10):
        _write_file(d / f"f{i}", os.O_WRONLY, 0o644, pieces)
    after = _requests(mnt)
    assert after.get("write", 0) - before.get("write", 0) == 30  # one request per write(2), as before
    assert after.get("getxattr", 0) - before.get("getxattr", 0) == 0
    want = b"".join(pieces)
    assert all((d / f"f{i}").read_bytes() == want for i in range(10))
    # a file created for reading and writing keeps the page cache: the kernel asks first
    before = _requests(mnt)
    _write_file(d / "rw", os.O_RDWR, 0o644, pieces)
    assert _requests(mnt).get("getxattr", 0) - before.get("getxattr", 0) >= 3
    assert (d / "rw").read_bytes() == want
    # committed: the same bytes from the commit's tree
    (mnt / "main" / ".lakefuse" / "commit").write_text("direct\n")
    commit = json.loads((mnt / "main" / ".lakefuse" / "commit").read_text())["commit"]["id"]
    assert (mnt / commit / "wo" / "f3").read_bytes() == want


def test_a_reader_open_during_a_write_only_create_sees_each_write(mnt):
    d = mnt / "main" / "seen"
    d.mkdir()
    wfd = os.open(d / "grow", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    rfd = os.open(d / "grow", os.O_RDONLY)
    try:
        got = b""
        for i in range(5):
            chunk = bytes([65 + i]) * 3000
            os.write(wfd, chunk)
            got += chunk
            assert os.pread(rfd, 1 << 20, 0) == got  # (no stale page of the reader's)
            assert os.fstat(rfd).st_size == len(got)
        with open(d / "grow", "rb") as f:  # a reader opened now, mapped
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            assert m[:] == got
            m.close()
    finally:
        os.close(wfd)
        os.close(rfd)
    assert (d / "grow").read_bytes() == got


def test_a_set_id_create_keeps_the_kernel_s_clearing_on_write(mnt):
    """A create with a set-user-ID mode is not direct I/O: a write by a process without
    CAP_FSETID clears the bit, as on ext4 (the kernel does it before a cached write)."""
    d = mnt / "main" / "sid"
    d.mkdir()
    os.chmod(d, 0o777)
    # (perl: the venv's Python is not readable by another user)
    script = "use Fcntl; sysopen(F, $ARGV[0], O_WRONLY|O_CREAT|O_EXCL, 04755) or die $!; syswrite(F, 'x') or die $!"
    r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                        "perl", "-e", script, str(d / "suid")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not os.stat(d / "suid").st_mode & stat.S_ISUID
    # the same on a native directory: what the kernel does for ext4
    nat = mnt.parent / "nat"
    nat.mkdir()
    os.chmod(nat, 0o777)
    r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                        "perl", "-e", script, str(nat / "suid")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not os.stat(nat / "suid").st_mode & stat.S_ISUID
