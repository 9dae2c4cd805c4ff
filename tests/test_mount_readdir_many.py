"""readdir replies a page of entries in one call (``Filesystem.accept_many`` and the patched
pyfuse3's ``readdir_reply_many``: no Python object per entry on the way out) and answers what the
per-entry path answers: the same inodes, lookup counts and attributes from the core; through a
real mount, a directory longer than one reply and one listing page lists the same names, inode
numbers and sizes either way (``LAKEFUSE_READDIR_MANY=0``: an entry at a time), and
``.lakefuse/stats`` says which path served."""

from __future__ import annotations

import json
import os

import pytest

from tests.mount_core_testutil import ino_of, readdir_page, seeded_repo, writable_core
from tests.mount_testutil import MountProc, needs_fuse

N = 2_500  # > one READDIRPLUS reply (~800 short names) and > one listing page (1,000)
FILES = {f"d/f{i:05d}": b"x" * (i % 7) for i in range(40)}
FILES["d/sub/y"] = b"y"


@pytest.fixture
def repo(tmp_path, request):
    with seeded_repo(tmp_path, "many", FILES, request) as r:
        yield r


def _accepted(fs, ino: int, many: bool) -> list[tuple]:
    fh = fs.opendir(ino)
    out = []
    try:
        entries = readdir_page(fs, fh, 0)
        attrs = fs.accept_many(fh, entries) if many else [fs.accept(fh, e) for e in entries]
        for e, a in zip(entries, attrs):
            node = fs.inodes.get(a.ino)
            out.append((e.name, e.offset, a.ino, a.mode, a.size, a.mtime_ns, a.nlink, a.uid, a.gid,
                        a.atime_ns, a.ctime_ns, a.entry_timeout, a.attr_timeout, node.nlookup))
    finally:
        fs.releasedir(fh)
    return out


@pytest.mark.parametrize("tree", ["v1", "main"])
def test_accept_many_is_accept_of_each(repo, tmp_path, tree):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with writable_core(repo, tmp_path / "a") as one, writable_core(repo, tmp_path / "b") as many:
        d1, d2 = ino_of(one, f"{tree}/d"), ino_of(many, f"{tree}/d")
        for _ in range(2):  # new nodes, then the same nodes again (lookup counts 1, then 2)
            want = _accepted(one, d1, many=False)
            assert _accepted(many, d2, many=True) == want
        assert len(want) == len(FILES) and want[-1][0] == b"sub"
        assert {w[-1] for w in want} == {2}


def _listing(path) -> list[tuple[str, int, int]]:
    with os.scandir(path) as it:
        return sorted((e.name, e.inode(), e.stat(follow_symlinks=False).st_size) for e in it)


@needs_fuse
def test_a_long_directory_lists_the_same_either_way(repo, tmp_path):
    one = repo.upload("main", "one", b"abc")
    repo.stage_many("main", ((f"big/e{i:05d}", one) for i in range(N)))
    repo.commit("main", "big")
    repo.create_tag("v2", "main")
    seen = {}
    for flag, path in (("1", "batched"), ("0", "per entry")):
        m = MountProc(repo.config.home, "many", tmp_path / f"mnt{flag}", env={"LAKEFUSE_READDIR_MANY": flag}).start()
        try:
            mp = m.mountpoint
            assert json.loads((mp / ".lakefuse" / "stats").read_text())["readdir"] == path
            for tree in ("v2", "main"):
                got = _listing(mp / tree / "big")
                assert [g[0] for g in got] == [f"e{i:05d}" for i in range(N)]
                assert all(size == 3 for _, _, size in got)
                for name, ino, _ in got[:: N // 10]:  # the listing's inode numbers are stat's
                    assert os.stat(mp / tree / "big" / name).st_ino == ino
                assert sorted(os.listdir(mp / tree / "big")) == [g[0] for g in got]  # listed again
                seen[(flag, tree)] = [g[0] for g in got]
        finally:
            m.stop()
    assert seen[("1", "v2")] == seen[("0", "v2")] == seen[("1", "main")] == seen[("0", "main")]
