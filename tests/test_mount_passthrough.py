"""FUSE passthrough through a real mount: read-only opens of committed objects of a local
store are handed to the kernel (the object file is the backing file), so their reads never
reach the daemon; ``LAKEFUSE_PASSTHROUGH=0`` (or a kernel / pyfuse3 without it) leaves them
to the daemon, with the same bytes. ``.lakefuse/stats`` says which path served the opens."""

from __future__ import annotations

import json
import mmap
import os
import random

import pytest

from graveler import Graveler, GravelerConfig
from tests.graveler_testutil import FAST_KV
from tests.mount_testutil import MountProc, is_mounted, needs_fuse

pytestmark = needs_fuse

BIG = random.Random(19).randbytes(5 * 1024 * 1024 + 123)  # several MiB, not a multiple of a page
SMALL = b"a small file, read whole at open by the daemon path\n"


def stats(mp) -> dict:
    return json.loads((mp / ".lakefuse" / "stats").read_text())


@pytest.fixture(scope="module")
def repo_home(tmp_path_factory):
    base = tmp_path_factory.mktemp("passthru")
    home = base / "home"
    g = Graveler(GravelerConfig(home=home, kv=FAST_KV))
    r = g.create_repository("demo", f"file://{base}/ns")
    r.upload("main", "data/big.bin", BIG)
    r.upload("main", "data/small.txt", SMALL)
    r.commit("main", "first")
    r.create_tag("v1", "main")
    g.close()
    return base, home


def _mount(repo_home, name: str, env: dict | None = None) -> MountProc:
    base, home = repo_home
    return MountProc(home, "demo", base / name, env=env).start()


def _check_reads(path) -> None:
    """The exact bytes: whole, at random offsets and sizes, and through mmap."""
    assert path.read_bytes() == BIG
    rnd = random.Random(7)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(64):
            off = rnd.randrange(len(BIG) + 10)
            n = rnd.choice([1, 4095, 4096, 65536, 1 << 20])
            assert os.pread(fd, n, off) == BIG[off:off + n]
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
            assert len(m) == len(BIG)
            for _ in range(32):
                off = rnd.randrange(len(BIG))
                assert m[off:off + 5000] == BIG[off:off + 5000]
            assert m[-4096:] == BIG[-4096:]
    finally:
        os.close(fd)


def test_passthrough_serves_committed_reads_without_the_daemon(repo_home):
    m = _mount(repo_home, "mnt-on", env={"LAKEFUSE_PASSTHROUGH": "1"})  # whatever the environment says
    mp = m.mountpoint
    try:
        before = stats(mp)
        state = before["passthrough"]
        if state.startswith("unavailable (the kernel") or os.geteuid() != 0:  # it needs CAP_SYS_ADMIN
            pytest.skip(f"FUSE passthrough here: {state}, euid {os.geteuid()}")
        assert state == "on", f"passthrough {state}: scripts/setup.sh builds the pyfuse3 that has it"
        reads = before["requests"].get("read", 0)
        for tree in ("v1", "main~0"):  # a tag, a commit
            _check_reads(mp / tree / "data" / "big.bin")
        # two open files of one inode at once share its backing file (the kernel requires it)
        a = open(mp / "v1" / "data" / "big.bin", "rb")
        b = open(mp / "v1" / "data" / "big.bin", "rb")
        with a, b:
            b.seek(len(BIG) - 100)
            assert a.read(100) == BIG[:100] and b.read() == BIG[-100:]
        assert (mp / "v1" / "data" / "small.txt").read_bytes() == SMALL
        after = stats(mp)
        # every read above went to the object file in the kernel: not one reached the daemon
        # (the reads counted are the two of .lakefuse/stats itself)
        assert after["requests"].get("read", 0) - reads <= 2, after["requests"]
        opened = after.get("opens_passthrough", 0) - before.get("opens_passthrough", 0)
        assert opened >= 6, after
        assert after["passthrough"] == "on"
        # a branch file is the daemon's by default: one inode for its readers and writers (with
        # LAKEFUSE_BRANCH_PASSTHROUGH=1 the kernel's too: tests/test_mount_passthrough_branch.py)
        asked = os.environ.get("LAKEFUSE_BRANCH_PASSTHROUGH", "").strip() in ("1", "on", "true", "yes")
        assert after["branch_passthrough"] == ("on" if asked else "off")
        _check_reads(mp / "main" / "data" / "big.bin")
        last = stats(mp)
        if asked:
            assert last["opens_passthrough"] > after["opens_passthrough"]
        else:
            assert last["opens_passthrough"] == after["opens_passthrough"]
            assert last["opens_daemon"] > after.get("opens_daemon", 0)
    finally:
        m.stop()
    assert not is_mounted(mp)


def test_branch_passthrough_off_leaves_branch_files_to_the_daemon(repo_home):
    m = _mount(repo_home, "mnt-branch-off", env={"LAKEFUSE_PASSTHROUGH": "1", "LAKEFUSE_BRANCH_PASSTHROUGH": "0"})
    mp = m.mountpoint
    try:
        before = stats(mp)
        if before["passthrough"] != "on":
            pytest.skip(f"FUSE passthrough here: {before['passthrough']}")
        assert before["branch_passthrough"] == "off"
        _check_reads(mp / "main" / "data" / "big.bin")
        after = stats(mp)
        assert after.get("opens_passthrough", 0) == 0 and after["opens_daemon"] > before.get("opens_daemon", 0)
        assert after["requests"]["read"] - before["requests"].get("read", 0) > 5  # the daemon read them
        _check_reads(mp / "v1" / "data" / "big.bin")  # commits' files still go to the kernel
        assert stats(mp)["opens_passthrough"] > 0
    finally:
        m.stop()
    assert not is_mounted(mp)


def test_passthrough_off_falls_back_to_the_daemon(repo_home):
    """... and ``branch_passthrough`` asked for says it is off too (it said "on" beside
    "passthrough": "off", as a non-root user's tour found)."""
    m = _mount(repo_home, "mnt-off", env={"LAKEFUSE_PASSTHROUGH": "0", "LAKEFUSE_BRANCH_PASSTHROUGH": "1"})
    mp = m.mountpoint
    try:
        before = stats(mp)
        assert before["passthrough"] == "off" and before["branch_passthrough"].startswith("off")
        _check_reads(mp / "v1" / "data" / "big.bin")
        assert (mp / "v1" / "data" / "small.txt").read_bytes() == SMALL
        after = stats(mp)
        assert after.get("opens_passthrough", 0) == 0
        assert after["opens_daemon"] - before.get("opens_daemon", 0) >= 3
        assert after["requests"]["read"] - before["requests"].get("read", 0) > 5  # the daemon read them
    finally:
        m.stop()
    assert not is_mounted(mp)
