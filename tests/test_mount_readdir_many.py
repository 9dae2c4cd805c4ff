"""readdir replies a page of entries in one call (``Filesystem.accept_many`` and the patched
pyfuse3's ``readdir_reply_many``: no Python object per entry on the way out) and answers what the
per-entry path answers: the same inodes, lookup counts and attributes from the core; through a
real mount, a directory longer than one reply and one listing page lists the same names, inode
numbers and sizes every way (``LAKEFUSE_READDIR_MANY=0``: an entry at a time;
``LAKEFUSE_READDIR_PLAIN=0``: READDIRPLUS only, where by default the kernel asks for plain
READDIR past the first reply of a listing nothing stats), and ``.lakefuse/stats`` says which
path served."""

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


def _names_and_numbers(path) -> list[tuple[str, int]]:
    """Each entry's name and d_ino, nothing stat'ed (the kernel sees no use for READDIRPLUS past
    the first reply: plain READDIR where the mount lets it)."""
    with os.scandir(path) as it:
        return sorted((e.name, e.inode()) for e in it)


MODES = (  # LAKEFUSE_READDIR_MANY, LAKEFUSE_READDIR_PLAIN -> what .lakefuse/stats says
    ("1", "1", "batched, plain where the kernel asks"),
    ("1", "0", "batched"),
    ("0", "1", "per entry"),
)


@needs_fuse
def test_a_long_directory_lists_the_same_either_way(repo, tmp_path):
    one = repo.upload("main", "one", b"abc")
    repo.stage_many("main", ((f"big/e{i:05d}", one) for i in range(N)))
    repo.commit("main", "big")
    repo.create_tag("v2", "main")
    seen = {}
    for many, plain, path in MODES:
        m = MountProc(repo.config.home, "many", tmp_path / f"mnt{many}{plain}",
                      env={"LAKEFUSE_READDIR_MANY": many, "LAKEFUSE_READDIR_PLAIN": plain}).start()
        try:
            mp = m.mountpoint

            def stats():
                return json.loads((mp / ".lakefuse" / "stats").read_text())

            assert stats()["readdir"] == path
            for tree in ("v2", "main"):
                before = stats()["inodes"]
                got = _names_and_numbers(mp / tree / "big")
                assert [g[0] for g in got] == [f"e{i:05d}" for i in range(N)]
                made = stats()["inodes"] - before
                # READDIRPLUS hands the kernel every entry (a node each); plain READDIR none past
                # its first reply (~800 names)
                assert made < N // 2 if plain == "1" and many == "1" else made >= N
                memory = stats().get("lookups_memory", 0)
                for name, ino in got:  # every listed inode number is the one stat shows
                    st = os.stat(mp / tree / "big" / name)
                    assert (st.st_ino, st.st_size) == (ino, 3)
                if tree == "v2" and plain == "1" and many == "1":
                    # a commit's files listed plain: their lookups answered from what the listing read
                    assert stats()["lookups_memory"] - memory >= N - 1000
                if tree == "main" and plain == "1" and many == "1":
                    # a branch's too, while its stamp stands and is known current (within 50 ms of
                    # a read of it: each lookup that reads confirms it, so most of them here)
                    assert stats()["lookups_memory"] - memory >= N // 10
                assert sorted(os.listdir(mp / tree / "big")) == [g[0] for g in got]  # listed again
                seen[(many, plain, tree)] = got
            plain_entries = stats().get("readdir_plain_entries", 0)
            assert plain_entries >= N if plain == "1" and many == "1" else plain_entries == 0
        finally:
            m.stop()
    names = [[g[0] for g in got] for got in seen.values()]
    assert all(n == names[0] for n in names)


@needs_fuse
def test_times_stat_cannot_carry_and_owners_no_file_can_have_leave_every_listing_working(repo, tmp_path):
    """``touch -d 2300-01-01`` (or ``1600-01-01``) of a file, a directory or a branch root made
    the listing of its directory fail with EIO -- on the branch, in every commit holding it, at
    the mount root -- because the batched readdir reply could not carry a time past 64-bit
    nanoseconds; an owner past 32 bits in metadata another client wrote did the same. A time is
    now clamped to that range as ext4 clamps one past its own, and such an owner counts as unset;
    the daemon logs no traceback (``clean_mount``)."""
    import subprocess

    from graveler.objects import POSIX_MTIME, POSIX_UID, TIME_NS_MAX, TIME_NS_MIN
    from tests.mount_testutil import clean_mount

    repo.upload("main", "d/foreign", b"x", metadata={POSIX_UID: str(1 << 40), POSIX_MTIME: str(10**20)})
    with clean_mount(repo.config.home, "many", tmp_path / "mnt") as mp:
        d = mp / "main" / "d"
        for when, path in (("2300-01-01", d / "f00000"), ("1600-01-01", d / "f00001"), ("2300-01-01", d / "sub"),
                           ("2300-01-01", mp / "main")):
            subprocess.run(["touch", "-d", when, str(path)], check=True)
        want = sorted(FILES_IN_D + ["foreign"])

        def listed(path) -> list[str]:
            r = subprocess.run(["ls", "-l", "--time-style=+%s", str(path)], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            return sorted(line.split()[-1] for line in r.stdout.splitlines()[1:])

        assert {"main", "v1"} <= set(listed(mp))
        assert listed(d) == want
        times = {n: os.stat(d / n).st_mtime_ns for n in ("f00000", "f00001", "sub", "foreign")}
        assert times == {"f00000": TIME_NS_MAX, "f00001": TIME_NS_MIN, "sub": TIME_NS_MAX, "foreign": TIME_NS_MAX}
        assert os.stat(mp / "main").st_mtime_ns == TIME_NS_MAX
        assert os.stat(d / "foreign").st_uid == os.getuid()  # the mount's owner: the stored one is unset
        assert os.stat(d / "f00002").st_mtime_ns < TIME_NS_MAX  # an ordinary file keeps its own time
        (mp / "main" / ".lakefuse" / "commit").write_text("times at the ends")
        commit = mp / "main~0" / "d"
        assert listed(commit) == want
        assert {n: os.stat(commit / n).st_mtime_ns for n in times} == times


FILES_IN_D = sorted({p.split("/")[1] for p in FILES if p.startswith("d/")})
