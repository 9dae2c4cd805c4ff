"""Immutable trees answered from memory (lakefuse.mount.dircache): a directory of a commit or
tag whose whole listing was read answers lookups of its files (and of names it lacks) with
no KV read, the same attributes a fresh mount reads; a committed local file the kernel reads
itself (passthrough) opens without a thread. A branch directory's listing answers only while
the branch's stamp is the one it was read at, and known current: a change made behind the
mount, or through it, shows. The core driven directly, then a real mount."""

from __future__ import annotations

import errno
import json
import os
import stat
import time

import pytest

from graveler.objstore.cached_open import open_cached
from lakefuse.mount.errors import FsError
from lakefuse.mount.fs import Filesystem, FsConfig
from lakefuse.mount.trees import FRESH_NS
from lakefuse.mount.writes import Caller
from tests.mount_core_testutil import ino_of, readdir_all, readdir_page, seeded_repo, writable_core
from tests.mount_testutil import MountProc, needs_fuse

ME = Caller(uid=os.getuid(), gid=os.getgid())
FILES = {f"d/f{i:02d}": f"file {i}\n".encode() * (i + 1) for i in range(12)}
FILES.update({"d/sub/x": b"x", "d/ln": b"", "top": b"t"})


@pytest.fixture
def repo(tmp_path, request):
    with seeded_repo(tmp_path, "dcache", FILES, request) as r:
        yield r


def _fields(attr) -> tuple:
    return (attr.mode, attr.size, attr.mtime_ns, attr.uid, attr.gid, attr.nlink, attr.entry_timeout,
            attr.attr_timeout, attr.atime_ns, attr.ctime_ns)


def test_a_listed_immutable_directory_answers_lookups_from_memory(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as fs:
        d = ino_of(fs, "v1/d")
        # the lookup of d counted its subdirectories: a read of its whole listing, now held
        assert fs.dircache.get(fs.inodes.get(d).tree.key, b"d") is not None
        names = {e.name for e, _ in readdir_all(fs, d)}
        before = fs.stats.counts["lookups_memory"]
        with writable_core(repo, tmp_path / "cache2") as fresh:  # what a fresh mount reads, key by key
            fd = ino_of(fresh, "v1/d")
            for name in sorted(names - {b"sub"}):
                got = fs.lookup_fast(d, name)
                assert got is not None, name
                assert _fields(got) == _fields(fresh.lookup(fd, name)), name
                assert got.ino == fs.lookup(d, name).ino  # the same inode as the KV path gives
        # each name twice: lookup_fast, then the thread path, which answers from the listing too
        assert fs.stats.counts["lookups_memory"] - before == 2 * (len(names) - 1)
        assert fs.lookup_fast(d, b"sub") is None  # a directory: its link count needs a listing read
        with pytest.raises(FsError) as e:  # a name the listing lacks: a negative entry, kept as long
            fs.lookup_fast(d, b"nope")
        assert e.value.errno == errno.ENOENT and e.value.cache_timeout == FsConfig().immutable_timeout
        assert fs.lookup_fast(d, b"x" * 300) is None  # too long: the thread path says ENAMETOOLONG
        with pytest.raises(FsError) as e:
            fs.lookup(d, b"x" * 300)
        assert e.value.errno == errno.ENAMETOOLONG


def test_repeated_lookups_read_the_directory_once(repo, tmp_path):
    fs = Filesystem(repo, FsConfig(nlink_scan=3))  # more names than a link count reads: d is not held yet
    d = ino_of(fs, "v1/d")
    assert fs.dircache.get(fs.inodes.get(d).tree.key, b"d") is None
    fs.lookup(d, b"f00")  # a lone lookup reads one key
    assert fs.dircache.get(fs.inodes.get(d).tree.key, b"d") is None
    fs.lookup(d, b"f01")  # the second reads the listing: the rest come from memory
    assert fs.dircache.get(fs.inodes.get(d).tree.key, b"d") is not None
    assert fs.lookup_fast(d, b"f02").size == len(FILES["d/f02"])
    with pytest.raises(FsError):
        fs.lookup(d, b"missing")
    small = Filesystem(repo, FsConfig(readdir_page=3, nlink_scan=2))  # more names than a page: never held
    d = ino_of(small, "v1/d")
    for name in (b"f00", b"f01", b"f02"):
        small.lookup(d, name)
    assert small.dircache.get(small.inodes.get(d).tree.key, b"d") is None
    assert small.lookup_fast(d, b"f03") is None


def test_a_branch_directory_answers_from_memory_only_while_its_stamp_stands(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as fs:
        d = ino_of(fs, "main/d")
        readdir_all(fs, d)  # read whole, in one page, at the branch's stamp
        before = fs.stats.counts["lookups_memory"]
        with writable_core(repo, tmp_path / "cache2") as fresh:  # what a fresh mount reads, key by key
            fd = ino_of(fresh, "main/d")
            for name in (b"f00", b"f07", b"ln"):
                got = fs.lookup_fast(d, name)
                assert got is not None, name
                assert _fields(got) == _fields(fresh.lookup(fd, name)), name
                assert got.ino == fs.lookup(d, name).ino
        assert fs.stats.counts["lookups_memory"] - before >= 3
        assert fs.lookup_fast(d, b"sub") is None  # a directory: read
        fs.inodes.get(d).tree.repin()  # (the stamp known current again: a loaded machine takes > 50 ms above)
        with pytest.raises(FsError) as e:  # a name the listing lacks: not cached by the kernel
            fs.lookup_fast(d, b"nope")
        assert e.value.errno == errno.ENOENT and not e.value.cache_timeout
        repo.upload("main", "d/f00", b"changed behind the mount")  # another process
        repo.upload("main", "d/new", b"new")
        time.sleep(FRESH_NS / 1e9 + 0.01)  # the branch's stamp is no longer known current
        assert fs.lookup_fast(d, b"f00") is None and fs.lookup_fast(d, b"new") is None
        assert fs.lookup(d, b"f00").size == len(b"changed behind the mount")  # read: the new stamp
        assert fs.lookup(d, b"new").size == 3
        fs.lookup(d, b"f01")  # the second lookup that read at this stamp reads the listing again
        assert fs.lookup_fast(d, b"new").size == 3
        # the mount's own change moves the stamp: the listing no longer answers
        fs.unlink(d, b"f02")
        assert fs.lookup_fast(d, b"f02") is None
        with pytest.raises(FsError) as e:
            fs.lookup(d, b"f02")
        assert e.value.errno == errno.ENOENT


def _list_plain(fs, ino: int) -> list:
    """Every entry of directory ``ino`` as plain READDIR replies hand them out (numbered: no node)."""
    fh = fs.opendir(ino)
    out, off = [], 0
    try:
        while entries := readdir_page(fs, fh, off):
            fs.numbered(entries)
            out += entries
            off = entries[-1].offset
    finally:
        fs.releasedir(fh)
    return out


def test_a_branch_file_listed_plain_is_looked_up_from_memory_only_while_the_branch_stands(repo, tmp_path):
    """A branch directory too big to hold whole, listed by plain READDIR (names and numbers, no
    node): a listed file's first lookup is answered from what the listing read -- the attributes
    and inode number a fresh mount's lookup gives -- while the branch's stamp is the page's and
    known current; after a change behind the mount, or through it, the lookup reads the key."""
    with writable_core(repo, tmp_path / "cache", readdir_page=4) as fs:
        d = ino_of(fs, "main/d")
        listed = {e.name: e for e in _list_plain(fs, d)}
        assert b"f00" in listed and len(listed) > 4  # more than a page: never held whole
        assert fs.branch_dirs.get_at(fs.inodes.get(d).tree.key, b"d") is None
        before = fs.stats.counts.get("lookups_memory", 0)
        with writable_core(repo, tmp_path / "cache2") as fresh:
            fd = ino_of(fresh, "main/d")
            for name in (b"f00", b"f05", b"ln"):
                fs.inodes.get(d).tree.repin()  # the stamp known current (a slow machine took > 50 ms)
                got = fs.lookup_fast(d, name)
                assert got is not None, name
                assert _fields(got) == _fields(fresh.lookup(fd, name)), name
        assert fs.stats.counts["lookups_memory"] - before == 3
        assert fs.lookup_fast(d, b"sub") is None  # a directory: read
        assert fs.lookup_fast(d, b"nope") is None  # a name no listing held: read, not ENOENT
        # a change behind the mount: once the stamp is stale, nothing listed answers
        repo.upload("main", "d/f01", b"changed behind the mount")
        time.sleep(FRESH_NS / 1e9 + 0.01)
        assert fs.lookup_fast(d, b"f01") is None
        assert fs.lookup(d, b"f01").size == len(b"changed behind the mount")
        # listed again at the new stamp, then the mount's own change: the stamp moves, the key is read
        _list_plain(fs, d)
        fs.unlink(d, b"f02")
        assert fs.lookup_fast(d, b"f02") is None
        with pytest.raises(FsError) as e:
            fs.lookup(d, b"f02")
        assert e.value.errno == errno.ENOENT


def test_a_branch_listing_is_not_read_whole_where_the_branch_keeps_changing(repo, tmp_path):
    """Lookups that miss at a new stamp each time (a directory being written to) read keys, not
    the listing again and again."""
    with writable_core(repo, tmp_path / "cache") as fs:
        d = ino_of(fs, "main/d")  # (its link count read d's listing: held at that stamp)
        tree = fs.inodes.get(d).tree
        for i in range(4):
            repo.upload("main", f"d/w{i}", b"w")  # the stamp moves between the lookups
            fs.lookup(d, f"f0{i}".encode())
            held = fs.branch_dirs.get_at(tree.key, b"d")
            assert held is None or held[1] < tree.stamp  # not read again at the new stamp
        fs.lookup(d, b"f05")  # two at one stamp: read whole
        held = fs.branch_dirs.get_at(tree.key, b"d")
        assert held is not None and b"w3" in held[0]


def test_a_branch_directory_too_big_to_hold_is_not_read_whole_again_at_each_stamp(repo, tmp_path):
    fs = Filesystem(repo, FsConfig(readdir_page=3, nlink_scan=2))  # d has more names than a page
    d = ino_of(fs, "main/d")
    view = fs.inodes.get(d).tree.view
    pages = []
    real = view.list_page
    view.list_page = lambda *a, **k: pages.append(a) or real(*a, **k)  # counts the listing reads
    fs.lookup(d, b"f00")
    fs.lookup(d, b"f01")  # the second at one stamp: tries the whole listing, finds it too big
    assert len(pages) == 1
    for i in range(3):
        repo.upload("main", f"d/w{i}", b"w")  # a new stamp each time
        fs.lookup(d, b"f02")
        fs.lookup(d, b"f03")
    assert len(pages) == 1 and fs.lookup_fast(d, b"f04") is None
    assert fs.lookup(d, b"w2").size == 1


def test_a_file_created_and_not_yet_staged_is_never_missed_by_a_held_listing(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as fs:
        d = ino_of(fs, "main/d")
        readdir_all(fs, d)
        assert fs.lookup_fast(d, b"f00") is not None
        o, _ = fs.create(d, b"brand-new", 0o644, os.O_WRONLY | os.O_CREAT, ME)  # staged at its first save
        assert fs.lookup_fast(d, b"brand-new") is None  # not ENOENT: the thread path settles it
        assert fs.lookup(d, b"brand-new").size == 0
        fs.write(o.fh, 0, b"abc")
        fs.flush(o.fh)
        fs.release(o.fh)
        assert fs.lookup(d, b"brand-new").size == 3


def test_the_cache_is_bounded_and_dropped_with_its_tree(repo):
    fs = Filesystem(repo, FsConfig(dir_cache_names=len(FILES)))
    a, b = ino_of(fs, "v1/d"), ino_of(fs, "v1")
    readdir_all(fs, a)
    readdir_all(fs, b)
    assert fs.dircache.names <= len(FILES)
    key = fs.inodes.get(a).tree.key
    assert fs.dircache.get(key, b"") is not None and fs.dircache.get(key, b"d") is None  # the oldest went first
    fs.forget([(n.ino, n.nlookup) for n in fs.inodes.of_tree(key)])  # the kernel forgets the whole tree
    assert fs.dircache.get(key, b"") is None and len(fs.dircache) == 0


def test_committed_local_files_open_without_a_thread_for_passthrough(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as fs:
        f = ino_of(fs, "v1/d/f03")
        assert fs.open_fast(f, os.O_RDONLY, passthrough=False) is None  # the daemon reads it: the thread path
        assert fs.open_fast(f, os.O_RDWR, passthrough=True) is None  # EROFS comes from the thread path
        b = ino_of(fs, "main/d/f03")  # a branch file: inline only while its entry is known current
        time.sleep(FRESH_NS / 1e9 + 0.01)  # (the lookup just read it: wait until that is stale)
        assert fs.open_fast(b, os.O_RDONLY, passthrough=True) is None  # then its open reads the branch: the thread path
        assert fs.open_fast(ino_of(fs, "v1/d/ln"), os.O_RDONLY, passthrough=True) is None  # empty: nothing to hand over
        o = None
        for _ in range(2):  # the first open may find the object's path cold in the dentry cache
            o = fs.open_fast(f, os.O_RDONLY, passthrough=True)
            if o is not None:
                break
            fs.release(fs.open(f, os.O_RDONLY, True).fh)
        assert o is not None and o.keep_cache and o.backing_fd >= 0
        assert os.pread(o.backing_fd, 1 << 16, 0) == FILES["d/f03"]
        assert fs.read(o.fh, 0, 1 << 16) == FILES["d/f03"]
        assert fs.stats.counts["opens_inline"] == 1
        fs.release(o.fh)


def test_open_cached_opens_only_what_the_dentry_cache_holds(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    os.stat(p)
    fd = open_cached(str(p), os.O_RDONLY | os.O_CLOEXEC)
    if fd is None:
        pytest.skip("no openat2 with RESOLVE_CACHED here")
    try:
        assert os.read(fd, 10) == b"abc"
    finally:
        os.close(fd)
    assert open_cached(str(tmp_path / "missing"), os.O_RDONLY) is None  # the usual open says why


@needs_fuse
def test_a_mount_reads_a_tag_from_memory_and_passthrough(repo, tmp_path):
    home = repo.config.home
    m = MountProc(home, "dcache", tmp_path / "mnt").start()
    try:
        mp = m.mountpoint
        for name, data in FILES.items():
            assert (mp / "v1" / name).read_bytes() == data
        st = json.loads((mp / ".lakefuse" / "stats").read_text())
        n_files = len([n for n in FILES if n.startswith("d/f")])
        assert st["lookups_memory"] >= n_files - 2
        for name, data in FILES.items():  # the branch, unchanged: its directory is read whole once too
            assert (mp / "main" / name).read_bytes() == data
        st2 = json.loads((mp / ".lakefuse" / "stats").read_text())
        assert st2["lookups_memory"] - st["lookups_memory"] >= n_files - 2
        assert not (mp / "v1" / "d" / "nope").exists()
        # a fresh mount's attributes of the same tag: the same
        m2 = MountProc(home, "dcache", tmp_path / "mnt2").start()
        try:
            for name in FILES:
                a, b = os.stat(mp / "v1" / name), os.stat(m2.mountpoint / "v1" / name)
                assert (a.st_mode, a.st_size, a.st_mtime_ns, a.st_uid, a.st_gid, a.st_nlink) == \
                    (b.st_mode, b.st_size, b.st_mtime_ns, b.st_uid, b.st_gid, b.st_nlink), name
        finally:
            m2.stop()
        repo.upload("main", "d/f00", b"changed behind the mount")  # the branch tree shows it
        deadline = 50
        while (mp / "main" / "d" / "f00").read_bytes() != b"changed behind the mount" and deadline:
            import time

            time.sleep(0.1)
            deadline -= 1
        assert deadline, "the branch tree did not show the change within 5 s"
        assert (mp / "v1" / "d" / "f00").read_bytes() == FILES["d/f00"]
    finally:
        m.stop()


@pytest.mark.parametrize("scan", [256, 3])
def test_link_counts_of_listed_directories_come_from_memory_and_match(tmp_path, request, scan):
    files = {"t/a/f": b"f", "t/b/deep/f": b"f", "t/c/f": b"f", "t/f": b"f", "t/" + "x" * 300 + "/f": b"f",
             "t/h/" + "y" * 300: b"f", "t/h/z": b"z", "t/e/f": b"f"}
    with seeded_repo(tmp_path, "links", files, request) as r:
        fs, fresh = Filesystem(r, FsConfig(nlink_scan=scan)), Filesystem(r, FsConfig(nlink_scan=scan))
        t = ino_of(fs, "v1/t")
        subdirs = [(e.name, attr.ino) for e, attr in readdir_all(fs, t) if attr.is_dir]
        for name, ino in subdirs:
            readdir_all(fs, ino)  # the subdirectory's listing is held now
            got = fs.getattr_fast(ino)
            assert got is not None, name  # no KV read, no thread
            assert got.nlink == fresh.getattr(ino_of(fresh, "v1/t/" + name.decode())).nlink, name
        readdir_all(fs, ino_of(fs, "v1"))
        assert fs.getattr_fast(t).nlink == fresh.getattr(ino_of(fresh, "v1/t")).nlink


def test_a_held_directory_lists_from_memory_as_a_fresh_mount_does(repo):
    fs, fresh = Filesystem(repo, FsConfig()), Filesystem(repo, FsConfig(readdir_page=4, nlink_scan=2))
    d, fd = ino_of(fs, "v1/d"), ino_of(fresh, "v1/d")
    assert fs.dircache.get(fs.inodes.get(d).tree.key, b"d") is not None  # held by its lookup
    assert fresh.dircache.get(fresh.inodes.get(fd).tree.key, b"d") is None  # read page by page
    for start in (0, 1, 5, 13):  # from the start, and resuming at an offset (a seek)
        got = [(e.name, e.offset, _fields(a)) for e, a in readdir_all(fs, d, start)]
        want = [(e.name, e.offset, _fields(a)) for e, a in readdir_all(fresh, fd, start)]
        assert got == want and got


def test_a_stat_branch_directory_lists_from_memory_while_the_branch_stands(repo, tmp_path):
    """The link count of a branch directory reads its listing: held at the branch's stamp, so
    the readdir that follows (``find``: stat, open, getdents) reads nothing more -- and lists
    what a fresh mount lists -- until the branch moves."""
    with writable_core(repo, tmp_path / "cache") as fs, writable_core(repo, tmp_path / "cache2") as fresh:
        d = ino_of(fs, "main/d")
        fs.getattr(d)  # its link count: the listing read once, held
        view = fs.inodes.get(d).tree.view
        pages = []
        real = view.list_page
        view.list_page = lambda *a, **k: pages.append(a) or real(*a, **k)  # counts the listing reads
        got = [(e.name, e.offset, _fields(a)) for e, a in readdir_all(fs, d)]
        assert pages == []  # from memory
        want = [(e.name, e.offset, _fields(a)) for e, a in readdir_all(fresh, ino_of(fresh, "main/d"))]
        assert got == want and len(got) == len(FILES) - 1  # (top is not in d)
        assert fs.getattr(d).nlink == 3  # d and d/sub
        # a change behind the mount: once the stamp is stale, the readdir reads the listing
        repo.upload("main", "d/new", b"new")
        time.sleep(FRESH_NS / 1e9 + 0.01)
        names = [e.name for e, _ in readdir_all(fs, d)]
        assert b"new" in names and len(pages) == 1


def _accepted_many(fs, ino: int) -> dict:
    """name -> attributes of directory ``ino``'s entries, accepted a page at a time (accept_many:
    the batched readdir's path)."""
    fh = fs.opendir(ino)
    out, off = {}, 0
    try:
        while entries := readdir_page(fs, fh, off):
            out.update(zip((e.name for e in entries), fs.accept_many(fh, entries)))
            off = entries[-1].offset
    finally:
        fs.releasedir(fh)
    return out


@pytest.mark.parametrize("many", [False, True], ids=["accept", "accept_many"])
def test_a_held_listing_hands_each_node_its_own_attributes(repo, tmp_path, many):
    """Entries of a held branch listing are handed out by every readdir of it: a node made from
    one after the first node was forgotten gets its own attributes (the first node's number stays)."""
    def listed() -> dict:
        return _accepted_many(fs, d) if many else {e.name: a for e, a in readdir_all(fs, d)}

    with writable_core(repo, tmp_path / "cache") as fs:
        d = ino_of(fs, "main/d")
        fs.getattr(d)
        first = listed()[b"f03"]
        node = fs.inodes.get(first.ino)
        fs.forget([(first.ino, node.nlookup)])  # the kernel forgets it (the Attr object lives on)
        fs.inodes._gone.clear()  # (past the numbers kept for forgotten names: the name gets another)
        again = listed()[b"f03"]
        assert again.ino != first.ino and first.ino == node.ino and node.attr.ino == node.ino


def test_a_directory_renamed_while_listed_from_memory_lists_on_under_its_new_name(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as fs:
        d = ino_of(fs, "main/d")
        fs.getattr(d)
        fh = fs.opendir(d)
        try:
            first = readdir_page(fs, fh, 0)[:3]  # filled from the held listing
            names = [e.name for e in first]
            main = ino_of(fs, "main")
            fs.rename(main, b"d", main, b"e", 0)
            rest, off = [], first[-1].offset
            while entries := readdir_page(fs, fh, off):
                assert all(e.path.startswith(b"e/") for e in entries)  # read again under the new name
                rest += entries
                off = entries[-1].offset
        finally:
            fs.releasedir(fh)
        names += [e.name for e in rest]
        assert len(names) == len(set(names)) == len(FILES) - 1


def test_a_plain_listing_makes_no_attributes_and_a_later_ask_makes_the_right_ones(repo, tmp_path):
    """A plain READDIR needs a name's number and type only: a file's attributes are made when
    first asked (its lookup, a READDIRPLUS), the same a fresh mount's lookup gives."""
    with writable_core(repo, tmp_path / "cache") as fs, writable_core(repo, tmp_path / "cache2") as fresh:
        for tree in ("v1", "main"):
            d, fd = ino_of(fs, f"{tree}/d"), ino_of(fresh, f"{tree}/d")
            files = [e for e in _list_plain(fs, d) if e.kind.name == "FILE"]
            assert files and all(e.made is None and e.mode == e.attr.mode for e in files[1:])
            for e in files:
                want = fresh.lookup(fd, e.name)
                assert _fields(e.attr) == _fields(want) and stat.S_IFMT(e.mode) == stat.S_IFMT(want.mode), e.name
