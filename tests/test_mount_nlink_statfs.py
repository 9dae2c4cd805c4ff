"""statfs reports the filesystem of the spool and caches; a directory's nlink is 2 + its
subdirectories (bounded: see lakefuse.mount.listing). The core driven directly (no kernel),
then a real mount."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from lakefuse.mount.fs import Filesystem, FsConfig
from lakefuse.mount.inodes import ROOT_INO
from lakefuse.mount.writes import Caller
from tests.graveler_testutil import damage_second_range, make_repo
from tests.mount_core_testutil import PERSISTENT_KVS, ino_of, readdir_all, seeded_repo, writable_core
from tests.mount_testutil import MountProc, lakefuse_cmd, needs_fuse

ME = Caller(uid=1000, gid=100)




@pytest.fixture
def repo(tmp_path, request):
    files = {
        "none/f": b"f",  # no subdirectory
        "one/sub/f": b"f",  # one
        "three/a/f": b"f", "three/b/deep/f": b"f", "three/c/f": b"f",
        "three/f": b"f",  # a file beside them: not counted
        "three/" + "x" * 300 + "/f": b"f",  # a name the mount does not show: not counted
    }
    with seeded_repo(tmp_path, "nlk", files, request) as r:
        yield r


@pytest.fixture
def fs(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache", readdir_page=2) as f:
        yield f



def nlink(fs, path: str) -> int:
    return fs.getattr(ino_of(fs, path)).nlink


def list_all(fs, ino: int) -> dict[bytes, object]:
    return {e.name: attr for e, attr in readdir_all(fs, ino)}


# ---------------------------------------------------------------------- core: statfs


def test_statfs_reports_the_spool_filesystem(fs, tmp_path):
    s = fs.statfs()
    st = os.statvfs(tmp_path / "cache" / "spool" / "nlk")
    assert (s.block_size, s.fragment_size, s.blocks, s.files) == (st.f_bsize, st.f_frsize, st.f_blocks, st.f_files)
    # free space and inodes as the spool's filesystem has them (other processes write there too)
    assert abs(s.blocks_free - st.f_bfree) * st.f_frsize < 64 << 20
    assert abs(s.blocks_avail - st.f_bavail) * st.f_frsize < 64 << 20
    assert abs(s.files_free - st.f_ffree) < 10_000 and s.files_avail <= s.files_free
    assert 0 < s.blocks_avail <= s.blocks_free <= s.blocks
    assert s.name_max == 255


def test_statfs_of_a_read_only_core_reports_its_cache_dir(repo, tmp_path):
    # the cache directory is not made yet: the filesystem it will be made on
    f = Filesystem(repo, FsConfig(read_only=True), space_dir=str(tmp_path / "not-yet" / "cache"))
    s = f.statfs()
    st = os.statvfs(tmp_path)
    assert (s.blocks, s.files, s.fragment_size) == (st.f_blocks, st.f_files, st.f_frsize)
    assert s.blocks_free > 0 and s.files_free > 0


# ---------------------------------------------------------------------- core: nlink


@pytest.mark.parametrize("ref", ["main", "v1", "commit"])
def test_directory_nlink_is_2_plus_subdirectories(fs, repo, ref):
    if ref == "commit":
        ref = repo.get_commit("v1").id
    assert nlink(fs, f"{ref}/none") == 2
    assert nlink(fs, f"{ref}/one") == 3
    assert nlink(fs, f"{ref}/one/sub") == 2
    assert nlink(fs, f"{ref}/three") == 5  # a, b, c; not the file f, not the hidden name
    assert nlink(fs, f"{ref}/three/b") == 3
    assert nlink(fs, ref) == 5  # the ref root: none, one, three
    # the mount root: its refs (main, v1)
    assert fs.getattr(ROOT_INO).nlink == 4
    assert fs.getattr_fast(ROOT_INO) is None  # counted at each ask: never answered without reading the refs


@PERSISTENT_KVS
def test_nlink_follows_mkdir_rmdir_rename_and_new_refs(fs, kv_backend):
    main = ino_of(fs, "main")
    fs.mkdir(ino_of(fs, "main/none"), b"d1", 0o755, ME)
    assert nlink(fs, "main/none") == 3 and nlink(fs, "main/none/d1") == 2
    fs.mkdir(ino_of(fs, "main/none"), b"d2", 0o755, ME)
    assert nlink(fs, "main/none") == 4
    fs.rename(ino_of(fs, "main/none"), b"d2", ino_of(fs, "main/one"), b"moved", 0)
    assert nlink(fs, "main/none") == 3 and nlink(fs, "main/one") == 4
    fs.rmdir(ino_of(fs, "main/none"), b"d1")
    assert nlink(fs, "main/none") == 2
    fs.mkdir(main, b"top", 0o755, ME)
    assert fs.getattr(main).nlink == 6
    assert nlink(fs, "v1") == 5  # the tag did not move
    fs.mkdir(ROOT_INO, b"feature", 0o755, ME)  # a new branch: a new subdirectory of the root
    assert fs.getattr(ROOT_INO).nlink == 5
    assert nlink(fs, "feature") == 5


@pytest.mark.parametrize("ref", ["main", "v1"])
def test_listed_directories_are_counted_when_stated(fs, ref):
    entries = list_all(fs, ino_of(fs, ref))
    three = entries[b"three"]
    # a listing hands its directories out uncounted: nlink 1, and the kernel may not keep it
    assert three.nlink == 1 and three.attr_timeout == 0.0 and three.uncounted
    assert fs.getattr_fast(three.ino) is None
    counted = fs.getattr(three.ino)
    assert counted.nlink == 5 and counted.attr_timeout > 0 and not counted.uncounted
    # listed again: the count the inode has (same tree state) is handed out, not the uncounted one
    again = list_all(fs, ino_of(fs, ref))[b"three"]
    assert again.nlink == 5 and again.attr_timeout > 0
    if ref == "v1":
        assert fs.getattr_fast(three.ino).nlink == 5
    roots = list_all(fs, ROOT_INO)
    assert set(roots) == {b"main", b"v1"}
    assert fs.getattr(roots[b"v1"].ino).nlink == 5


def test_a_directory_over_the_scan_limit_shows_nlink_1(repo, tmp_path):
    limit = FsConfig().nlink_scan
    assert limit == 256  # the figure docs/SEMANTICS.md gives
    for i in range(limit - 2):
        repo.upload("main", f"edge/f{i:04d}", b"f")
    repo.upload("main", "edge/d0/f", b"f")
    repo.upload("main", "edge/d1/f", b"f")
    for i in range(limit - 1):
        repo.upload("main", f"big/f{i:04d}", b"f")
    repo.upload("main", "big/d0/f", b"f")
    repo.upload("main", "big/d1/f", b"f")
    f = Filesystem(repo, FsConfig())
    assert nlink(f, "main/edge") == 4  # 256 names: counted
    assert nlink(f, "main/big") == 1  # 257 names: more than nlink_scan, not counted (Linux's "unknown")
    assert nlink(f, "main/big/d0") == 2
    small = Filesystem(repo, FsConfig(nlink_scan=3))
    assert nlink(small, "main/one") == 3 and nlink(small, "main/three") == 1  # the bound is a setting


def test_a_directory_whose_listing_fails_shows_nlink_1(tmp_path):
    """A damaged range: the directories whose listing reads it are stat'ed (nlink 1, not
    counted); reading their paths is what answers EIO."""
    from graveler.committed.writer import RangeParams

    r = make_repo(tmp_path, "dmg", range_params=RangeParams(min_range_size=0, max_range_size=2048, raggedness=5))
    for i in range(6):
        for j in range(8):
            r.upload("main", f"d{i}/s{j}/f", b"f")
    r.commit("main", "many ranges")
    _, victim = damage_second_range(r, tmp_path / "ns-dmg")
    f = Filesystem(r, FsConfig())
    hit = victim.min_key.split(b"/")[0].decode()
    assert nlink(f, "main") == 1 and nlink(f, f"main/{hit}") == 1
    clean = [i for i in range(6) if f"d{i}0".encode() <= victim.min_key or f"d{i}/".encode() > victim.max_key]
    assert clean
    for i in clean:
        assert nlink(f, f"main/d{i}") == 10  # its listing avoids the damaged range: counted
    r.close()


# ---------------------------------------------------------------------- a real mount

REPO = "nlrepo"


def cli(home, *args) -> str:
    r = subprocess.run(lakefuse_cmd(home, *args), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def mounted(tmp_path_factory):
    h = tmp_path_factory.mktemp("nlhome")
    src = tmp_path_factory.mktemp("nlsrc")
    for rel in ("none/f", "one/sub/f", "three/a/f", "three/b/deep/f", "three/c/f", "three/f"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(b"f")
    cli(h, "repo", "create", f"lakefs://{REPO}")
    cli(h, "fs", "upload", "--recursive", "-s", str(src), f"lakefs://{REPO}/main/")
    cli(h, "commit", f"lakefs://{REPO}/main", "-m", "base")
    cli(h, "tag", "create", f"lakefs://{REPO}/v1", f"lakefs://{REPO}/main")
    mp = tmp_path_factory.mktemp("nlmnt")
    m = MountProc(h, REPO, mp, "--branch-timeout", "0.5").start()
    yield h, mp
    m.stop()
    assert "Traceback" not in m.log(), m.log()


@needs_fuse
def test_statfs_of_a_mount_is_its_spool_filesystem(mounted):
    home, mp = mounted
    spool = home / "cache" / "spool" / REPO
    assert spool.is_dir()
    a, s, b = os.statvfs(spool), os.statvfs(mp), os.statvfs(spool)
    assert (s.f_bsize, s.f_frsize, s.f_blocks, s.f_files) == (a.f_bsize, a.f_frsize, a.f_blocks, a.f_files)
    # free blocks and inodes between the two reads of the spool's (other processes write on this disk)
    for field in ("f_bfree", "f_bavail", "f_ffree"):
        lo, hi = sorted((getattr(a, field), getattr(b, field)))
        slack = 16 << 20 if field != "f_ffree" else 1000
        slack = slack // a.f_frsize if field != "f_ffree" else slack
        assert lo - slack <= getattr(s, field) <= hi + slack, field
    assert s.f_namemax == 255
    # df shows the same disk (sizes in 1 KiB blocks: total exact, used and free within the slack)
    out = subprocess.run(["df", "-P", "-k", str(mp), str(spool)], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines()[1:]]
    assert rows[0][0] == f"lakefs://{REPO}" and rows[0][5] == str(mp)
    assert rows[0][1] == rows[1][1] and int(rows[0][1]) > 0
    assert abs(int(rows[0][3]) - int(rows[1][3])) < 64 * 1024  # available, KiB
    out = subprocess.run(["df", "-P", "-i", str(mp)], capture_output=True, text=True, check=True).stdout
    itotal, iused, ifree = (int(x) for x in out.splitlines()[1].split()[1:4])
    assert itotal == a.f_files and ifree > 0 and iused >= 0


@needs_fuse
def test_directory_nlink_on_a_mount(mounted):
    home, mp = mounted
    commit = os.getxattr(mp / "v1", "user.lakefs.commit").decode()
    for ref in ("main", "v1", commit):  # a branch, a tag, a commit (not listed at the root)
        t = mp / ref
        assert [os.stat(t / d).st_nlink for d in ("none", "one", "three", "three/b")] == [2, 3, 5, 3], ref
        assert os.stat(t).st_nlink == 5
        os.listdir(t)  # a listing's entries are counted when stat'ed, not shown as listed
        assert os.stat(t / "three").st_nlink == 5 and os.lstat(t / "none").st_nlink == 2
    assert os.stat(mp).st_nlink == 4  # main, v1
    # on the branch, through the kernel: its attribute caches are dropped by each change
    d = mp / "main" / "none"
    os.mkdir(d / "d1")
    assert os.stat(d).st_nlink == 3 and os.stat(d / "d1").st_nlink == 2
    os.mkdir(d / "d2")
    assert os.stat(d).st_nlink == 4
    os.rename(d / "d2", mp / "main" / "one" / "moved")
    assert os.stat(d).st_nlink == 3 and os.stat(mp / "main" / "one").st_nlink == 4
    os.rmdir(d / "d1")
    assert os.stat(d).st_nlink == 2
    assert os.stat(mp / "v1" / "none").st_nlink == 2 and os.stat(mp / "v1" / "one").st_nlink == 3
    os.mkdir(mp / "nlbranch")  # a branch: the root gains a subdirectory
    assert os.stat(mp).st_nlink == 5 and os.stat(mp / "nlbranch").st_nlink == 5
    # a subdirectory made by another process (the CLI): shown within the branch timeout
    cli(home, "fs", "upload", "-s", str(Path(__file__)), f"lakefs://{REPO}/main/none/cli/x.py")
    deadline = time.monotonic() + 5
    while os.stat(d).st_nlink != 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.stat(d).st_nlink == 3
    assert shutil.which("find") is None or subprocess.run(
        ["find", str(mp / "main"), "-type", "d"], capture_output=True, text=True, check=True
    ).stdout.count("\n") == 11  # main, none, none/cli, one, one/{sub,moved}, three, three/{a,b,b/deep,c}


def test_files_made_in_a_directory_do_not_count_it_again(fs, repo, monkeypatch):
    """The kernel asks a directory's attributes again after every create in it: the count of
    its subdirectories (a listing read) is kept across files made, saved and unlinked there,
    and read again after a mkdir, rmdir or directory rename through the mount, or when the
    stamp watch finds a change the mount did not make (the CLI, another host)."""
    import os as _os

    from lakefuse.mount import listing
    from lakefuse.mount.watch import StampWatch

    reads: list[bytes] = []
    real = listing.nlink
    monkeypatch.setattr(listing, "nlink", lambda f, tree, path, stamp=None: (reads.append(path), real(f, tree, path, stamp))[1])
    one = ino_of(fs, "main/one")
    assert fs.getattr(one).nlink == 3 and reads.count(b"one") == 1
    for i in range(5):
        o, _ = fs.create(one, f"f{i}".encode(), 0o644, _os.O_WRONLY | _os.O_CREAT, ME)
        fs.write(o.fh, 0, b"x")
        fs.flush(o.fh)
        fs.release(o.fh)
        assert fs.getattr(one).nlink == 3
    fs.unlink(one, b"f0")
    assert fs.getattr(one).nlink == 3 and reads.count(b"one") == 1  # five files and an unlink: no listing read
    fs.mkdir(one, b"d", 0o755, ME)
    assert fs.getattr(one).nlink == 4 and reads.count(b"one") == 2
    fs.rename(one, b"d", ino_of(fs, "main/none"), b"moved", 0)
    assert fs.getattr(one).nlink == 3 and nlink(fs, "main/none") == 3
    fs.rmdir(ino_of(fs, "main/none"), b"moved")
    assert nlink(fs, "main/none") == 2
    n = reads.count(b"one")
    repo.upload("main", "one/ext/f", b"behind the mount")
    StampWatch(fs, lambda ino: None).poll_once()
    assert fs.getattr(one).nlink == 4 and reads.count(b"one") == n + 1
