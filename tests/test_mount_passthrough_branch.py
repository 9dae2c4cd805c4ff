"""FUSE passthrough of branch files through a real mount: a read-only open of a branch file
no handle is writing is handed to the kernel (the object's file is the backing file), and
when the file then changes -- a writer on the same mount, a truncate, a reset, a change
behind the mount -- the next open reads the new bytes, never the old file's: the kernel
keeps an inode bound to one backing file while such an open lasts, so the name gets a new
inode (ESTALE, and the kernel's own retry) and the open reader keeps the version it opened.
Every open succeeds: the kernel's EIO for an open in another mode never reaches a caller."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import time

import pytest

from tests.mount_testutil import clean_mount, lakefuse_cmd, needs_fuse, seed_repo

pytestmark = needs_fuse

REPO = "ptb"
A = bytes(range(256)) * 4096 + b"tail of A"  # ~1 MiB, the committed version
B = b"B" * 300_001


def stats(mp) -> dict:
    return json.loads((mp / ".lakefuse" / "stats").read_text())


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("ptbhome")
    src = tmp_path_factory.mktemp("ptbsrc")
    (src / "in").mkdir()
    for name in ("w", "t", "d", "r", "c", "m", "x", *(f"o{i}" for i in range(5))):
        (src / "in" / name).write_bytes(A)
    seed_repo(h, REPO, src / "in")
    return h


@pytest.fixture(scope="module")
def mnt(home, tmp_path_factory):
    with clean_mount(home, REPO, tmp_path_factory.mktemp("ptbmnt"), "--branch-timeout", "0.2",
                     env={"LAKEFUSE_PASSTHROUGH": "1", "LAKEFUSE_BRANCH_PASSTHROUGH": "1"}) as mp:
        st = stats(mp)
        if st["passthrough"] != "on":
            pytest.skip(f"FUSE passthrough here: {st['passthrough']}")
        yield mp


def test_an_unchanged_branch_file_is_read_by_the_kernel(mnt):
    p = mnt / "main" / "in" / "x"
    before = stats(mnt)
    assert p.read_bytes() == A
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[-9:] == b"tail of A" and m[:256] == bytes(range(256))
    after = stats(mnt)
    assert after["opens_passthrough"] - before.get("opens_passthrough", 0) == 2
    assert after["requests"]["read"] - before["requests"]["read"] <= 2  # (stats itself)


def test_an_open_right_after_the_lookup_opens_the_entry_it_read_without_a_thread(mnt):
    # the lookup read the branch (its change stamp, the entry): the open that follows within
    # 50 ms needs no read of its own, and is answered on the daemon's event loop ("opens_inline");
    # five files, so that one slow moment of a loaded machine (> 50 ms between the two) does not decide
    before = stats(mnt)
    for i in range(5):
        assert (mnt / "main" / "in" / f"o{i}").read_bytes() == A
    after = stats(mnt)
    assert after["opens_passthrough"] - before.get("opens_passthrough", 0) == 5
    assert after.get("opens_inline", 0) - before.get("opens_inline", 0) >= 1


def test_a_writer_after_a_kernel_reader_gets_a_new_inode_and_new_opens_read_its_bytes(mnt):
    p = mnt / "main" / "in" / "w"
    before = stats(mnt)
    with open(p, "rb") as r:
        assert r.read(10) == A[:10]
        ino = os.fstat(r.fileno()).st_ino
        with open(p, "r+b") as w:  # no EIO: on a new inode
            w.seek(5)
            w.write(b"written")
        want = A[:5] + b"written" + A[12:]
        assert p.read_bytes() == want
        assert os.stat(p).st_ino != ino
        time.sleep(0.3)  # past the attribute timeout (0.2 s)
        st = os.fstat(r.fileno())
        assert st.st_ino == ino and st.st_nlink == 0  # as a file renamed over while open
        assert r.read() == A[10:]  # the reader keeps the version it opened
        with open(p, "wb") as w:  # O_TRUNC, while the first reader still holds the old inode
            w.write(B)
    assert p.read_bytes() == B
    after = stats(mnt)
    assert after["opens_stale"] - before.get("opens_stale", 0) >= 1
    assert "EIO" not in after.get("errors", {}), after.get("errors")


def test_truncate_by_path_while_a_kernel_reader_is_open(mnt):
    p = mnt / "main" / "in" / "t"
    with open(p, "rb") as r:
        assert r.read(3) == A[:3]
        os.truncate(p, 1000)
        assert p.read_bytes() == A[:1000]
        assert os.stat(p).st_size == 1000
        assert len(r.read()) == len(A) - 3
    assert p.read_bytes() == A[:1000]


def test_truncate_by_path_while_a_reader_the_daemon_serves_is_open(home, tmp_path):
    """Where the daemon serves a branch file's reads, a truncate(2) by path cuts the file the open
    reader reads, as on a local filesystem: one inode, the new size, ``nlink`` 1. Before, the
    truncate gave the name a new inode and answered the old size; the reader kept the old
    version (``nlink`` 0) where an ftruncate through a writer's descriptor cut it."""
    with clean_mount(home, REPO, tmp_path / "mnt", "--branch-timeout", "0.2",
                     env={"LAKEFUSE_BRANCH_PASSTHROUGH": "0"}) as mp:
        p = mp / "main" / "in" / "d"
        with open(p, "rb", buffering=0) as r:
            assert r.read(3) == A[:3]
            os.truncate(p, 1000)
            st, fst = os.stat(p), os.fstat(r.fileno())
            assert (fst.st_ino, fst.st_size, fst.st_nlink) == (st.st_ino, 1000, 1)
            assert r.read(len(A)) == A[3:1000]
        assert p.read_bytes() == A[:1000]


def test_a_reader_opened_while_the_daemon_serves_another_reads_through_the_daemon(mnt):
    p = mnt / "main" / "in" / "m"
    with open(p, "r+b") as w:
        w.write(b"M" * 10)
        w.flush()
        with open(p, "rb") as r1:  # the file is being written: the daemon serves this reader
            assert r1.read(10) == b"M" * 10
            w.close()  # saved
            before = stats(mnt)
            with open(p, "rb") as r2:  # the inode still has a daemon-served open: so does this one
                assert r2.read() == b"M" * 10 + A[10:]
            assert stats(mnt)["opens_daemon"] > before["opens_daemon"]
    before = stats(mnt)
    assert p.read_bytes() == b"M" * 10 + A[10:]  # none left: to the kernel again
    assert stats(mnt)["opens_passthrough"] > before["opens_passthrough"]


def _control(mp, branch: str, name: str, request: str) -> dict:
    (mp / branch / ".lakefuse" / name).write_text(request + "\n")
    out = json.loads((mp / branch / ".lakefuse" / name).read_text())
    assert out["ok"], out
    return out


def test_reset_and_commit_while_a_kernel_reader_is_open(mnt):
    p = mnt / "main" / "in" / "r"
    p.write_bytes(B)  # staged over the committed A
    with open(p, "rb") as r:
        assert r.read(5) == B[:5]
        _control(mnt, "main", "reset", "in/r")
        assert p.read_bytes() == A  # the committed version, not the kernel's file of B
        assert r.read() == B[5:]
    p.write_bytes(B)
    with open(p, "rb") as r:
        assert r.read(5) == B[:5]
        _control(mnt, "main", "commit", "r is B")
        assert p.read_bytes() == B  # a commit changes no file's bytes
        assert r.read() == B[5:]
    assert (mnt / "main~1" / "in" / "r").read_bytes() == A


def test_a_change_behind_the_mount_while_a_kernel_reader_is_open(mnt, home, tmp_path):
    p = mnt / "main" / "in" / "c"
    src = tmp_path / "c"
    src.write_bytes(B)
    with open(p, "rb") as r:
        assert r.read(5) == A[:5]
        subprocess.run(lakefuse_cmd(home, "fs", "upload", "-s", str(src), f"lakefs://{REPO}/main/in/c"),
                       check=True, capture_output=True)
        deadline = time.monotonic() + 30
        while True:  # the mount learns of it within its branch timeout (0.2 s) and its watch
            got = p.read_bytes()
            if got == B:
                break
            assert got == A, "neither version"
            assert time.monotonic() < deadline, "the change never showed"
            time.sleep(0.1)
        assert r.read() == A[5:]  # the open reader keeps what it opened
    assert p.read_bytes() == B
