"""The mount's filesystem core, driven directly (no kernel), plus graveler.paths, graveler.view
and the errno table."""

from __future__ import annotations

import errno
import stat
import time

import pytest

from graveler import errors as gerrors
from graveler import paths
from graveler.errors import GravelerError, InvalidArgument, NotFound
from graveler.objects import PosixAttrs
from lakefuse.mount.errors import ERRNO_TABLE, FsError, errno_for
from lakefuse.mount.fs import FRESH_NS, Filesystem, FsConfig
from lakefuse.mount.inodes import ROOT_INO
from tests.graveler_testutil import make_repo
from tests.mount_core_testutil import readdir_all


@pytest.fixture
def repo(tmp_path):
    r = make_repo(tmp_path, "core")
    r.upload("main", "a/b/c.txt", b"hello c")
    r.upload("main", "a/x.txt", b"x")
    r.upload("main", "top.txt", b"top v1", metadata={"color": "blue"}, content_type="text/plain")
    r.commit("main", "one")
    r.create_tag("v1", "main")
    r.upload("main", "top.txt", b"top v2 longer")
    r.commit("main", "two")
    yield r
    r.close()


@pytest.fixture
def fs(repo):
    return Filesystem(repo, FsConfig(uid=1234, gid=5678, readdir_page=3))


def lookup_path(fs: Filesystem, path: str):
    ino = ROOT_INO
    attr = None
    for part in path.strip("/").split("/"):
        attr = fs.lookup(ino, part.encode())
        ino = attr.ino
    return attr


def listdir(fs: Filesystem, ino: int, start: int = 0, stop_after: int | None = None) -> list[tuple[bytes, int]]:
    """readdir as the adapter drives it: (name, next offset) pairs."""
    out = readdir_all(fs, ino, start, stop_after)
    assert all(attr.ino > ROOT_INO for _, attr in out)
    return [(e.name, e.offset) for e, _ in out]


def read_all(fs: Filesystem, ino: int) -> bytes:
    o = fs.open(ino, 0)
    try:
        out, off = b"", 0
        while chunk := fs.read(o.fh, off, 4):
            out += chunk
            off += len(chunk)
        return out
    finally:
        fs.release(o.fh)


# --- the errno table -------------------------------------------------------------------------


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_graveler_error_has_its_errno():
    classes = [GravelerError, *_all_subclasses(GravelerError)]
    assert len(classes) >= 12
    for cls in classes:
        if cls.__module__ != gerrors.__name__:
            continue  # a test's own subclass
        assert cls in ERRNO_TABLE, f"{cls.__name__} has no errno in lakefuse.mount.errors.ERRNO_TABLE"
        exc = cls.__new__(cls)
        assert errno_for(exc) == ERRNO_TABLE[cls]
    assert errno_for(NotFound("x")) == errno.ENOENT
    assert errno_for(gerrors.ReadOnlyRef("x")) == errno.EROFS
    assert errno_for(gerrors.CorruptedData("x")) == errno.EIO
    assert errno_for(FsError(errno.ENAMETOOLONG)) == errno.ENAMETOOLONG
    assert errno_for(RuntimeError("bug")) == errno.EIO


# --- paths --------------------------------------------------------------------------------------


def test_path_rule():
    assert paths.check_path("a/b") == b"a/b"
    for bad in ("", "a/../b", "./a", "a\x00b", b"\xff"):
        with pytest.raises(InvalidArgument):
            paths.check_path(bad)
    with pytest.raises(InvalidArgument):
        paths.check_path("abc", max_bytes=2)
    assert paths.fs_path_problem(b"a/b/c") is None
    assert paths.fs_path_problem(b"d/") is None  # a directory marker
    assert "empty" in paths.fs_path_problem(b"a//b")
    assert "empty" in paths.fs_path_problem(b"/a")
    assert "bytes" in paths.fs_path_problem(b"a/" + b"x" * 256)
    assert paths.fs_path_problem(b"a/" + b"x" * 255) is None
    assert "reserved" in paths.fs_path_problem(b"a/.lakefuse/x")
    assert paths.child_name(b"a", b"a/b/c") == b"b"
    assert paths.child_name(b"", b"a/b") == b"a"
    assert paths.join(b"", b"x") == b"x" and paths.join(b"a", b"x") == b"a/x"


# --- views --------------------------------------------------------------------------------------


def test_view_stat_and_pages(repo):
    repo.upload("main", "x", b"1")
    repo.upload("main", "x-1", b"2")
    repo.upload("main", "x/y", b"3")
    repo.upload("main", "d/", b"")  # a directory marker
    v = repo.view("main")
    st = v.stat(b"x")
    assert st.value is not None and st.is_dir  # both, found past "x-1"
    assert v.stat(b"x-1").is_dir is False
    assert v.stat(b"d").is_dir and v.stat(b"d").marker is not None
    assert not v.stat(b"nope").exists
    names = []
    after = b""
    while True:
        page = v.list_page(b"", after, 2)
        names += [it.path for it in page]
        if len(page) < 2:
            break
        after = page[-1].path
    assert names == [b"a/", b"d/", b"top.txt", b"x", b"x-1", b"x/"]
    # immutable views never move
    t = repo.view("v1")
    assert not t.is_branch and t.change_stamp() == 0
    assert t.stat(b"x").exists is False


def test_branch_view_follows_commits(repo):
    v = repo.view("main")
    before = v.commit_id
    s0 = v.change_stamp()
    repo.upload("main", "new.txt", b"n")
    assert v.change_stamp() != s0
    assert v.stat(b"new.txt").value is not None  # staged writes are seen live
    repo.commit("main", "three")
    assert v.stat(b"new.txt").value is not None  # the view re-pins after the commit drops the token
    assert v.commit_id != before
    with pytest.raises(NotFound):
        repo.view("nope")


def test_view_open_reads_the_object(repo):
    v = repo.view("v1")
    e = v.stat(b"a/b/c.txt").entry
    with v.open(e) as r:
        assert r.size == 7
        assert r.read(0, 5) == b"hello"
        assert r.read(6, 100) == b"c"
        assert r.read(7, 10) == b""


# --- the core -----------------------------------------------------------------------------------


def test_root_lists_branches_and_tags(fs, repo):
    repo.create_branch("dev")
    assert [n for n, _ in listdir(fs, ROOT_INO)] == [b"dev", b"main", b"v1"]
    attr = lookup_path(fs, "main")
    assert stat.S_ISDIR(attr.mode) and attr.uid == 1234 and attr.gid == 5678
    assert stat.S_IMODE(attr.mode) == 0o555


def test_directories_show_0555_size_0_and_the_commit_date(fs, repo):
    """Directories of an immutable tree: mode 0555, size 0, mtime the commit's date (a branch: its head's)."""
    for ref, path in (("v1", "v1/a/b"), ("v1", "v1/a"), ("main", "main/a")):
        attr = lookup_path(fs, path)
        assert stat.S_ISDIR(attr.mode) and attr.size == 0, path
        assert attr.mtime_ns == int(repo.get_commit(ref).creation_date.timestamp()) * 1_000_000_000, path
    assert stat.S_IMODE(lookup_path(fs, "v1/a").mode) == 0o555


def test_ref_expressions_reach_trees(fs, repo):
    c1 = repo.get_commit("v1").id
    for ref in ("main~1", "v1", c1, c1[:10], "main^", "main@"):
        attr = lookup_path(fs, f"{ref}/top.txt")
        expect = b"top v1" if ref != "main@" else b"top v2 longer"
        assert attr.size == len(expect), ref
        assert read_all(fs, attr.ino) == expect
    for bad in ("nope", "main~9", "v1^3", "a b", "\xff"):
        with pytest.raises(FsError) as ei:
            fs.lookup(ROOT_INO, bad.encode("utf-8", "surrogateescape"))
        assert ei.value.errno == errno.ENOENT


def test_tree_listing_and_attrs(fs, repo):
    main = lookup_path(fs, "main")
    assert [n for n, _ in listdir(fs, main.ino)] == [b"a", b"top.txt"]
    a = fs.lookup(main.ino, b"a")
    assert [n for n, _ in listdir(fs, a.ino)] == [b"b", b"x.txt"]
    top = fs.lookup(main.ino, b"top.txt")
    assert stat.S_ISREG(top.mode) and stat.S_IMODE(top.mode) == 0o444
    assert top.entry_timeout == fs.config.branch_timeout
    v1top = lookup_path(fs, "v1/top.txt")
    assert v1top.attr_timeout == fs.config.immutable_timeout
    with pytest.raises(FsError) as ei:
        fs.lookup(main.ino, b"missing")
    assert ei.value.errno == errno.ENOENT and ei.value.cache_timeout == 0
    v1 = lookup_path(fs, "v1")
    with pytest.raises(FsError) as ei:
        fs.lookup(v1.ino, b"missing")
    assert ei.value.cache_timeout == fs.config.immutable_timeout  # immutable: negative entries are cached
    with pytest.raises(FsError) as ei:
        fs.lookup(top.ino, b"x")
    assert ei.value.errno == errno.ENOTDIR
    with pytest.raises(FsError) as ei:
        fs.lookup(main.ino, b"n" * 256)
    assert ei.value.errno == errno.ENAMETOOLONG


def test_path_rule_in_trees(fs, repo):
    entry = repo.get("main", "a/x.txt")
    items = [("odd//name", entry), ("long/" + "y" * 256, entry), ("x", entry), ("x/y", entry),
             ("x-1", entry), ("m/", entry), ("m/in.txt", entry), ("e/", entry)]
    repo.stage_many("main", items)
    main = lookup_path(fs, "main")
    names = [n for n, _ in listdir(fs, main.ino)]
    # "x" is shadowed by the directory "x"; "e/" alone makes an empty directory; odd//name shows
    # "odd" (a directory) but not its empty-named child; the over-long name is hidden. Entries come
    # in key order, a directory at the place of "name/" (so "x-1" before the directory "x")
    assert names == [b"a", b"e", b"long", b"m", b"odd", b"top.txt", b"x-1", b"x"]
    x = fs.lookup(main.ino, b"x")
    assert stat.S_ISDIR(x.mode)
    assert [n for n, _ in listdir(fs, x.ino)] == [b"y"]
    assert listdir(fs, fs.lookup(main.ino, b"e").ino) == []
    assert [n for n, _ in listdir(fs, fs.lookup(main.ino, b"m").ino)] == [b"in.txt"]
    assert listdir(fs, fs.lookup(main.ino, b"odd").ino) == []
    assert listdir(fs, fs.lookup(main.ino, b"long").ino) == []
    with pytest.raises(FsError):
        fs.lookup(main.ino, b".lakefuse2")


def test_directory_marker_attributes(fs, repo):
    e = repo.get("main", "a/x.txt")
    md = PosixAttrs(mode=0o40750, uid=7, gid=8, mtime_ns=1_000_000_000_123).to_metadata()
    from dataclasses import replace

    repo.stage("main", "mk/", replace(e, metadata=md))
    main = lookup_path(fs, "main")
    a = fs.lookup(main.ino, b"mk")
    assert stat.S_ISDIR(a.mode) and stat.S_IMODE(a.mode) == 0o750 and (a.uid, a.gid) == (7, 8)
    assert a.mtime_ns == 1_000_000_000_123
    # beside a name that sorts between "mk" and "mk/" (the odd-names tour: "x" beside "x.csv"), on the
    # branch and in a commit of it
    repo.stage("main", "mk-1", e)
    repo.stage("main", "mk.csv", e)
    a = fs.lookup(main.ino, b"mk")
    assert stat.S_IMODE(a.mode) == 0o750 and (a.uid, a.gid, a.mtime_ns) == (7, 8, 1_000_000_000_123)
    c = repo.commit("main", "markers")
    a = fs.lookup(lookup_path(fs, c.id).ino, b"mk")
    assert stat.S_IMODE(a.mode) == 0o750 and (a.uid, a.gid, a.mtime_ns) == (7, 8, 1_000_000_000_123)


def test_readdir_offsets_are_stable(fs, repo):
    repo.stage_many("main", [(f"big/f{i:03d}", repo.get("main", "a/x.txt")) for i in range(25)])
    big = lookup_path(fs, "main/big")
    full = listdir(fs, big.ino)
    assert [n for n, _ in full] == [f"f{i:03d}".encode() for i in range(25)]
    assert [o for _, o in full] == list(range(1, 26))
    # resuming at any offset (a seekdir) gives the rest, whatever pages were read before (on a branch
    # numbered anew, above every offset the handle handed out: an offset held never names another entry)
    for k in (0, 1, 2, 3, 4, 7, 24, 25):
        assert [n for n, _ in listdir(fs, big.ino, start=k)] == [n for n, _ in full[k:]]
    # one handle, read a bit, seek back, read again
    fh = fs.opendir(big.ino)
    try:
        fs.readdir_fill(fh, 0)
        first = fs.readdir_fast(fh, 0)
        fs.readdir_fill(fh, 10)
        assert fs.readdir_fast(fh, 10)[0].name == b"f010"
        fs.readdir_fill(fh, 2)
        assert fs.readdir_fast(fh, 2)[0].name == b"f002"
        assert first[0].name == b"f000"
    finally:
        fs.releasedir(fh)


def test_forget_bounds_the_inode_table(fs, repo):
    repo.stage_many("main", [(f"many/f{i:03d}", repo.get("main", "a/x.txt")) for i in range(50)])
    many = lookup_path(fs, "main/many")
    base = len(fs.inodes)
    inos = []
    for i in range(50):
        inos.append(fs.lookup(many.ino, f"f{i:03d}".encode()).ino)
    assert len(fs.inodes) == base + 50
    assert fs.lookup(many.ino, b"f000").ino == inos[0]  # same inode while the kernel knows it
    fs.forget([(inos[0], 2)] + [(ino, 1) for ino in inos[1:]])
    assert len(fs.inodes) == base
    fh = fs.opendir(many.ino)
    fs.releasedir(fh)
    fs.forget([(many.ino, 1)])


def test_an_open_after_a_change_behind_the_mount_has_the_kernel_ask_for_the_new_size(fs, repo):
    """Found by a training-job exploration: a file replaced behind the mount (`fs upload` of a
    larger version) and opened before the kernel's attributes timed out was read by the old
    size: the first 100,000 bytes of the 150,000-byte version, no error (the daemon's read path;
    a mapping past the old size died of SIGBUS). An open that finds the file changed since the
    kernel took its attributes has them dropped (attributes only: the open's own thread may);
    an open of an unchanged file, or one whose size and time the kernel has, drops nothing."""
    stale: list[int] = []
    fs.kernel_attrs_stale = stale.append
    top = lookup_path(fs, "main/top.txt")
    assert top.size == len(b"top v2 longer")
    for _ in range(2):
        fs.release(fs.open(top.ino, 0).fh)
    assert stale == []  # unchanged: nothing to drop
    for data in (b"a larger version than before", b"small"):
        repo.upload("main", "top.txt", data)  # another process's change: the kernel knows the old size
        o = fs.open(top.ino, 0)
        assert fs.read(o.fh, 0, 100) == data
        fs.release(o.fh)
        assert stale == [top.ino] and fs.stats.snapshot()["opens_attrs_refreshed"] >= 1
        stale.clear()
        assert fs.getattr(top.ino).size == len(data)  # (what the kernel asks next)
        fs.release(fs.open(top.ino, 0).fh)
        assert stale == []


def test_an_open_overtaken_by_a_newer_version_serves_the_version_the_inode_shows(fs, repo, monkeypatch):
    """Found by an ML engineer's tour (a reader on a second mount while another mount rewrote the
    file): between an open's read of the node and its count, another thread's stat took a newer
    version into the node, so the handle served the older object while the kernel was told the
    newer size -- reads cut or padded at it, mmap readers killed by SIGBUS (~1.5% of reads). The
    open notices and opens again; the version a stat took while the file is open is a new inode."""
    top = lookup_path(fs, "main/top.txt")
    opens = fs.__class__._open_object
    raced = []

    def open_object(self, tree, path, entry):
        got = opens(self, tree, path, entry)
        if not raced:  # (the first try only) another thread's stat, right after this open read the node
            raced.append(entry.size)
            repo.upload("main", "top.txt", b"a newer, longer version")
            assert fs.getattr(top.ino).size == len(b"a newer, longer version")
        return got

    monkeypatch.setattr(fs.__class__, "_open_object", open_object)
    o = fs.open(top.ino, 0)
    try:
        assert raced == [len(b"top v2 longer")]
        assert fs.read(o.fh, 0, 100) == b"a newer, longer version"  # what the inode shows, not v2
        assert fs.getattr(top.ino).size == len(b"a newer, longer version")
        assert fs.stats.snapshot()["opens_moved_retried"] == 1
        # the other side: while it is open, a newer version is the name's new inode, this one stays
        repo.upload("main", "top.txt", b"newest")
        assert fs.getattr(top.ino).size == len(b"a newer, longer version")
        assert fs.read(o.fh, 0, 100) == b"a newer, longer version"
        assert lookup_path(fs, "main/top.txt").ino != top.ino
    finally:
        fs.release(o.fh)


def test_branch_attrs_follow_the_change_stamp(fs, repo):
    top = lookup_path(fs, "main/top.txt")
    assert fs.getattr(top.ino).size == len(b"top v2 longer")
    fast = fs.getattr_fast(top.ino)  # the stamp was read just now: answered from memory, or not
    assert fast is None or fast.size == len(b"top v2 longer")
    time.sleep(FRESH_NS / 1e9 + 0.01)
    assert fs.getattr_fast(top.ino) is None  # a branch node is checked against the stamp
    o = fs.open(top.ino, 0)
    assert not o.keep_cache  # the node's first open: no page cache of it to keep yet
    fs.release(o.fh)
    o = fs.open(top.ino, 0)
    assert o.keep_cache  # unchanged since the last open: the kernel keeps what it cached
    fs.release(o.fh)
    repo.upload("main", "top.txt", b"3")
    assert fs.getattr(top.ino).size == 1
    o = fs.open(top.ino, 0)
    assert not o.keep_cache  # the content changed since the last open: drop the page cache
    assert fs.read(o.fh, 0, 100) == b"3"
    fs.release(o.fh)
    o = fs.open(top.ino, 0)
    assert o.keep_cache
    fs.release(o.fh)
    repo.delete("main", "top.txt")
    with pytest.raises(FsError) as ei:
        fs.getattr(top.ino)
    assert ei.value.errno == errno.ENOENT
    # immutable trees are served from memory
    v1top = lookup_path(fs, "v1/top.txt")
    assert fs.getattr_fast(v1top.ino).size == len(b"top v1")
    assert fs.open(v1top.ino, 0).keep_cache


def test_writes_are_erofs(fs):
    top = lookup_path(fs, "v1/top.txt")
    for ino in (top.ino, lookup_path(fs, "main/top.txt").ino, ROOT_INO):
        with pytest.raises(FsError) as ei:
            fs.check_writable(ino)
        assert ei.value.errno == errno.EROFS
    import os

    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC):
        with pytest.raises(FsError) as ei:
            fs.open(top.ino, flags)
        assert ei.value.errno == errno.EROFS


def test_xattrs(fs, repo):
    top = lookup_path(fs, "v1/top.txt")
    names = fs.listxattr(top.ino)
    assert set(names) == {b"user.lakefs.commit", b"user.lakefs.etag", b"user.lakefs.physical_address",
                          b"user.lakefs.content_type", b"user.lakefs.meta.color"}
    e = repo.get("v1", "top.txt")
    assert fs.getxattr(top.ino, b"user.lakefs.etag") == e.etag.encode()
    assert fs.getxattr(top.ino, b"user.lakefs.commit") == repo.get_commit("v1").id.encode()
    assert fs.getxattr(top.ino, b"user.lakefs.meta.color") == b"blue"
    assert fs.getxattr(top.ino, b"user.lakefs.content_type") == b"text/plain"
    assert fs.getxattr(top.ino, b"user.lakefs.physical_address").decode().endswith(e.address)
    a = lookup_path(fs, "v1/a")
    assert fs.listxattr(a.ino) == [b"user.lakefs.commit"]
    with pytest.raises(FsError) as ei:
        fs.getxattr(top.ino, b"user.other")
    assert ei.value.errno == errno.ENODATA


def test_info_files(fs, repo):
    head = lookup_path(fs, "main/.lakefuse/head")
    assert read_all(fs, head.ino) == (repo.get_commit("main").id + "\n").encode()
    log_ = lookup_path(fs, "v1/.lakefuse/log")
    lines = read_all(fs, log_.ino).decode().splitlines()
    assert [ln.split(" ", 1)[0] for ln in lines] == [c.id for c in repo.log("v1")]
    assert lines[0].endswith("one")
    import json

    stats = json.loads(read_all(fs, lookup_path(fs, ".lakefuse/stats").ino))
    assert stats["repository"] == "core" and stats["lookups"] >= 1
    assert [n for n, _ in listdir(fs, lookup_path(fs, "main/.lakefuse").ino)] == [b"head", b"log"]
    with pytest.raises(FsError):
        lookup_path(fs, "main/a/.lakefuse")  # reserved below the tree root: nothing there


@pytest.mark.expect_log("a missing object is logged when it is answered EIO")
def test_missing_object_is_eio_but_stat_works(fs, repo, tmp_path):
    e = repo.get("v1", "a/x.txt")
    (tmp_path / "ns-core" / e.address).unlink()
    attr = lookup_path(fs, "v1/a/x.txt")
    assert attr.size == 1
    with pytest.raises(FsError) as ei:
        fs.open(attr.ino, 0)
    assert ei.value.errno == errno.EIO


def test_statfs(fs):
    s = fs.statfs()
    assert s.name_max == 255 and s.files >= 1


def test_cli_help(capsys):
    from lakefuse.cli import build_parser

    for cmd, words in ((["mount", "--help"], ("--cache-dir", "--cache-size", "-f", "allow_other", "main~1")),
                       (["umount", "--help"], ("--lazy", "MOUNTPOINT"))):
        with pytest.raises(SystemExit):
            build_parser().parse_args(cmd)
        out = capsys.readouterr().out
        for w in words:
            assert w in out, (cmd, w)


def test_mount_help_says_cache_dir_holds_the_write_spool(capsys):
    """--cache-dir is not only for S3 caches: it holds the write spool, which bounds the
    size of a file being written on every store, local ones too."""
    from lakefuse.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["mount", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    cache_dir = out[out.index("--cache-dir DIR"):out.index("--cache-size BYTES")]
    assert "DIR/spool/REPO" in cache_dir and "local" in cache_dir and "free space" in cache_dir, cache_dir
    cache_size = out[out.index("--cache-size BYTES"):]
    assert "not the spool" in cache_size[:400], cache_size[:400]


def test_unreachable_store_is_eio_and_recovers(tmp_path):
    """A remote store that stops answering: reads are EIO (the store's bounded retries are
    its own), the core keeps serving, and reads work again once the store is back."""
    from graveler.errors import StoreUnavailable
    from graveler.objstore import LocalStore
    from graveler.objstore.base import ObjectStore
    from tests.graveler_testutil import make_graveler

    class Flaky(ObjectStore):  # not a LocalStore: read through chunks, as S3 is
        down = False

        def __init__(self, uri):
            self.inner = LocalStore(uri[len("file://"):])
            self.uri = uri

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def get_range(self, key, start, length):
            if Flaky.down and key.startswith("data/"):
                raise StoreUnavailable("connection refused (test)")
            return self.inner.get_range(key, start, length)

        get = lambda self, k: self.inner.get(k)  # noqa: E731
        put = lambda self, k, d: self.inner.put(k, d)  # noqa: E731
        put_file = lambda self, k, p, md5=None: self.inner.put_file(k, p, md5)  # noqa: E731
        get_to_file = lambda self, k, p: self.inner.get_to_file(k, p)  # noqa: E731
        head = lambda self, k: self.inner.head(k)  # noqa: E731
        delete = lambda self, k: self.inner.delete(k)  # noqa: E731
        list = lambda self, prefix="", start_after="": self.inner.list(prefix, start_after)  # noqa: E731
        full_uri = lambda self, k: self.inner.full_uri(k)  # noqa: E731

    g = make_graveler(tmp_path)
    g.store_factory = Flaky
    r = g.create_repository("flaky", f"file://{tmp_path}/ns")
    r.upload("main", "f.txt", b"data")
    r.commit("main", "one")
    fs = Filesystem(r, FsConfig())
    attr = lookup_path(fs, "main/f.txt")
    Flaky.down = True
    o = fs.open(attr.ino, 0)
    with pytest.raises(StoreUnavailable):  # the adapter answers EIO (errno table)
        fs.read(o.fh, 0, 10)
    assert errno_for(StoreUnavailable("x")) == errno.EIO
    Flaky.down = False
    assert fs.read(o.fh, 0, 10) == b"data"
    fs.release(o.fh)
    g.close()


def test_sequential_reads_fetch_ahead_in_one_call(fs, repo):
    data = bytes(range(256)) * 20_000  # 5 MB
    repo.upload("main", "seq.bin", data)
    attr = lookup_path(fs, "main/seq.bin")
    o = fs.open(attr.ino, 0)
    chunk = 128 * 1024
    out, off, calls = [], 0, 0
    while off < len(data):
        piece = fs.read_fast(o.fh, off, chunk)
        if piece is None:
            piece = fs.read(o.fh, off, chunk)
            calls += 1
        out.append(piece)
        off += len(piece)
    fs.release(o.fh)
    assert b"".join(out) == data
    assert calls <= len(data) // (1 << 20) + 3  # about one thread call per MiB, not per 128 KiB
    o = fs.open(attr.ino, 0)  # random reads are exact
    assert fs.read(o.fh, 3_000_001, 10) == data[3_000_001:3_000_011]
    fs.release(o.fh)


@pytest.mark.expect_log("every failure at the boundary is logged")
def test_error_boundary_answers_every_failure_with_an_errno(fs):
    """pyfuse3 ends its loop on anything that is not FUSEError: the boundary turns every
    failure into one (graveler's through the table, a local file's OSError by its errno,
    anything else EIO) and the handler keeps working afterwards."""
    import trio
    from pyfuse3 import FUSEError

    from lakefuse.mount.fuse import Operations

    ops = Operations(fs)
    cases = [(NotFound("x"), errno.ENOENT), (OSError(errno.EFBIG, "File too large"), errno.EFBIG),
             (OSError(errno.EPERM, "no"), errno.EIO), (RuntimeError("bug"), errno.EIO),
             (FsError(errno.EROFS), errno.EROFS)]

    async def run():
        for exc, code in cases:
            def boom(*a, exc=exc):
                raise exc

            fs.getattr_fast = boom
            with pytest.raises(FUSEError) as ei:
                await ops.getattr(ROOT_INO)
            assert ei.value.errno == code, exc
        del fs.getattr_fast
        assert (await ops.getattr(ROOT_INO)).st_ino == ROOT_INO

    trio.run(run)


def test_stats_latency_quantiles_are_within_a_bucket_of_the_truth():
    from lakefuse.mount.stats import Stats

    st = Stats()
    for _ in range(97):
        st.done("read", 100_000)  # 100 us
    for _ in range(3):
        st.done("read", 10_000_000)  # 10 ms
    st.done("lookup", 1)  # the smallest bucket
    lat = st.snapshot()["latency"]
    assert 100 <= lat["read"]["p50_us"] <= 100 * 1.19 and 10_000 <= lat["read"]["p99_us"] <= 10_000 * 1.19
    assert lat["read"]["n"] == 100 and lat["lookup"]["n"] == 1 and lat["lookup"]["p99_us"] <= 0.01


def test_a_daemon_without_cap_sys_admin_says_passthrough_is_off_from_the_start(fs, monkeypatch):
    """Found by an administrator's tour: a user's daemon said "passthrough": "on" until its first
    open of a commit's file was refused (then "off", and a raw libfuse line in its log). The
    kernel refuses passthrough opens without CAP_SYS_ADMIN: such a daemon says so at once, and
    does not try; with the capability (root), it is on."""
    import pyfuse3

    import lakefuse.mount.fuse as fuse

    if not hasattr(pyfuse3, "passthrough_open"):
        pytest.skip("pyfuse3 without passthrough")
    monkeypatch.setattr(fuse, "_cap_sys_admin", lambda: False)
    ops = fuse.Operations(fs, passthrough=True)
    assert not ops.enable_passthrough and "CAP_SYS_ADMIN" in fs.stats.get("passthrough")
    monkeypatch.setattr(fuse, "_cap_sys_admin", lambda: True)
    assert fuse.Operations(fs, passthrough=True).enable_passthrough and fs.stats.get("passthrough") == "on"
    with open("/proc/self/status") as f:  # (the parse: root here has it, a process without it does not)
        cap = int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)
    assert fuse._cap_sys_admin() == bool(cap >> 21 & 1)
