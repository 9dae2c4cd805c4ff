"""Writable branch trees in the filesystem core, driven directly (no kernel): real LMDB, real store."""

from __future__ import annotations

import errno
import json
import os
import stat
import time

import pytest

from graveler.errors import InvalidArgument, NothingToCommit
from graveler.objects import POSIX_MODE, POSIX_RDEV, ROOT_MARKER, PosixAttrs
from lakefuse.mount.errors import errno_for
from lakefuse.mount.fs import FsConfig
from lakefuse.mount.inodes import ROOT_INO
from lakefuse.mount.spool import Spool, SpoolConfig
from lakefuse.mount.writes import RENAME_EXCHANGE, RENAME_NOREPLACE, Caller, SetAttr, WritableFilesystem
from tests.graveler_testutil import make_repo
from tests.mount_core_testutil import PERSISTENT_KVS, ino_of, readdir_all, seeded_repo, writable_core

ME = Caller(uid=1000, gid=100)




@pytest.fixture
def repo(tmp_path, request):
    files = {"data/a.csv": b"a,b\n1,2\n", "data/sub/x": b"x", "top": b"top"}
    with seeded_repo(tmp_path, "wrt", files, request) as r:
        yield r


@pytest.fixture
def fs(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as f:
        yield f



def fs_errno(fn, *args) -> int:
    with pytest.raises(Exception) as ei:
        fn(*args)
    return errno_for(ei.value)


def write_file(fs, parent: str, name: str, data: bytes, mode: int = 0o640) -> int:
    opened, attr = fs.create(ino_of(fs, parent), name.encode(), stat.S_IFREG | mode, os.O_WRONLY, ME)
    fs.write(opened.fh, 0, data)
    fs.flush(opened.fh)
    fs.release(opened.fh)
    return attr.ino


def read_path(fs, path: str) -> bytes:
    o = fs.open(ino_of(fs, path), os.O_RDONLY)
    try:
        return fs.read(o.fh, 0, 1 << 20)
    finally:
        fs.release(o.fh)


def control(fs, tree: str | None, name: str, data: bytes):
    base = f"{tree}/.lakefuse" if tree else ".lakefuse"
    o = fs.open(ino_of(fs, f"{base}/{name}"), os.O_WRONLY | os.O_TRUNC)
    try:
        fs.write(o.fh, 0, data)
        fs.flush(o.fh)
    finally:
        fs.release(o.fh)


def read_control(fs, tree, name) -> bytes:
    base = f"{tree}/.lakefuse" if tree else ".lakefuse"
    o = fs.open(ino_of(fs, f"{base}/{name}"), os.O_RDONLY)
    try:
        return fs.read(o.fh, 0, 1 << 20)
    finally:
        fs.release(o.fh)


@PERSISTENT_KVS
def test_create_write_close_stages_with_posix_attrs(fs, repo, kv_backend):
    write_file(fs, "main/data", "new.txt", b"hello")
    assert repo.read("main", "data/new.txt") == b"hello"
    pa = PosixAttrs.from_metadata(repo.get("main", "data/new.txt").metadata)
    assert (pa.mode, pa.uid, pa.gid) == (stat.S_IFREG | 0o640, 1000, 100)
    a = fs.getattr(ino_of(fs, "main/data/new.txt"))
    assert a.size == 5 and stat.S_IMODE(a.mode) == 0o640 and a.uid == 1000


def test_created_file_is_visible_before_close_and_reads_back(fs, repo):
    main = ino_of(fs, "main")
    opened, attr = fs.create(main, b"f", stat.S_IFREG | 0o644, os.O_RDWR, ME)
    # its entry is staged with its first save (the create's and the close's in one transaction)...
    assert not repo.exists("main", "f")
    # ...but the mount answers for it at once: a lookup or listing that reads the branch stages it first
    assert fs.lookup(main, b"f").ino == attr.ino
    assert repo.get("main", "f").size == 0 and fs.stats.counts["creates_settled"] == 1
    fs.write(opened.fh, 0, b"abc")
    assert fs.read(opened.fh, 0, 10) == b"abc"
    assert fs.getattr(attr.ino).size == 3
    o2 = fs.open(attr.ino, os.O_RDONLY)  # another handle reads what the first wrote
    assert fs.read(o2.fh, 0, 10) == b"abc"
    fs.release(o2.fh)
    assert repo.get("main", "f").size == 0  # not saved before close
    fs.flush(opened.fh)
    fs.release(opened.fh)
    assert repo.read("main", "f") == b"abc"


def test_create_write_close_is_one_staging_transaction_and_a_listing_shows_it_before(fs, repo):
    main = ino_of(fs, "main")
    d = fs.mkdir(main, b"d", 0o755, ME).ino
    before = repo.view("main").change_stamp()
    opened, attr = fs.create(d, b"f", stat.S_IFREG | 0o600, os.O_WRONLY, ME)
    fs.write(opened.fh, 0, b"abc")
    fs.flush(opened.fh)
    fs.release(opened.fh)
    assert repo.view("main").change_stamp() == before + 1  # one transaction: the create's and the close's
    assert repo.read("main", "d/f") == b"abc"
    assert PosixAttrs.from_metadata(repo.get("main", "d/f").metadata).mode == stat.S_IFREG | 0o600
    assert fs.getattr(d).mtime_ns == fs.getattr(attr.ino).mtime_ns or fs.getattr(d).mtime_ns > 0
    # created and not closed yet: a listing of its directory shows it (staged first), empty
    o2, a2 = fs.create(d, b"g", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    h = fs.opendir(d)
    fs.readdir_fill(h, 0)
    assert sorted(e.name for e in fs.readdir_fast(h, 0)) == [b"f", b"g"]
    fs.releasedir(h)
    assert repo.get("main", "d/g").size == 0
    fs.write(o2.fh, 0, b"xy")
    fs.flush(o2.fh)
    fs.release(o2.fh)
    assert repo.read("main", "d/g") == b"xy"
    # a file created and closed without a write (touch) is staged by its close
    o3, _ = fs.create(d, b"t", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    fs.flush(o3.fh)
    fs.release(o3.fh)
    assert repo.get("main", "d/t").size == 0


def test_fsync_flushes_the_object_beside_the_kv_commit_and_its_sync_and_returns_after_both(tmp_path):
    """fsync(2) of a new file: its object's flush (file and directory) runs beside the KV commit
    that stages it and the KV's sync, none waiting for another (one flush's time, not two); the
    fsync returns only once both are done, with the KV synced up to that commit. The same for
    an fsync of a file saved by an earlier close (what ``tar`` or ``rsync --fsync`` send)."""
    import threading

    from graveler.config import KVConfig

    repo = make_repo(tmp_path, "ovl", kv=KVConfig(map_size=1 << 24, sync=True))
    events: list[str] = []
    kv_synced = threading.Event()
    sync_object, stage, kv_sync = repo._store.sync_object, repo.stage_stamped, repo.sync

    def slow_sync_object(key):
        assert kv_synced.wait(10)  # neither the KV's commit nor its sync waited for the object's flush
        sync_object(key)
        events.append("object synced")

    def staging(*a, **kw):
        out = stage(*a, **kw)
        events.append("staged")
        return out

    def syncing():
        kv_sync()
        events.append("kv synced")
        kv_synced.set()

    repo._store.sync_object = slow_sync_object
    repo.stage_stamped = staging
    repo.sync = syncing
    sp = Spool(repo, SpoolConfig(tmp_path / "cache", repo.name))
    fs = WritableFilesystem(repo, FsConfig(uid=1000, gid=100), spool=sp)
    try:
        opened, _ = fs.create(ino_of(fs, "main"), b"f", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
        fs.write(opened.fh, 0, b"data")
        fs.fsync(opened.fh)
        assert events == ["staged", "kv synced", "object synced"]
        assert repo._env._synced_seq == repo._env._commit_seq and repo.read("main", "f") == b"data"
        # written again and closed (saved without a flush), then fsynced on the same descriptor
        fs.write(opened.fh, 4, b"more")
        fs.flush(opened.fh)
        events.clear()
        kv_synced.clear()
        fs.fsync(opened.fh)
        assert events == ["kv synced", "object synced"] and repo.read("main", "f") == b"datamore"
        fs.release(opened.fh)
        # ... and on a descriptor opened later (read-only)
        events.clear()
        kv_synced.clear()
        opened = fs.open(ino_of(fs, "main/f"), os.O_RDONLY)
        fs.fsync(opened.fh)
        assert events == ["kv synced", "object synced"]
        fs.release(opened.fh)
    finally:
        sp.close()


def test_a_request_or_write_on_one_branch_leaves_files_open_on_another_unstaged(fs, repo):
    """Found by a GC tour: a commit through ``other/.lakefuse/commit`` staged every file created on any
    branch and still open, empty (on main: the next CLI commit of main published them empty). A request
    or a write stages its own branch's pending creates only; the file is staged at its own close."""
    repo.create_branch("other", "main")
    opened, _ = fs.create(ino_of(fs, "main"), b"open.txt", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    fs.write(opened.fh, 0, b"half")
    other = ino_of(fs, "other")
    write_file(fs, "other", "o.txt", b"o")
    control(fs, "other", "commit", b"on other")
    fs.mkdir(other, b"d", stat.S_IFDIR | 0o755, ME)
    fs.unlink(other, b"o.txt")
    read_control(fs, "other", "status")
    assert repo.value_or_none("main", "open.txt") is None  # not staged empty behind its writer
    assert repo.read("other", "d/") == b"" and not repo.exists("other", "open.txt")
    fs.flush(opened.fh)
    fs.release(opened.fh)
    assert repo.read("main", "open.txt") == b"half"
    # healthy: a request of the file's own branch stages it (a commit there takes it, as documented)
    opened, _ = fs.create(ino_of(fs, "main"), b"second.txt", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    control(fs, "main", "commit", b"on main")
    assert repo.exists("main", "second.txt") and repo.read(repo.get_commit("main").id, "second.txt") == b""
    fs.release(opened.fh)


def test_a_create_needing_no_read_is_answered_without_a_thread_and_declines_otherwise(fs, repo):
    """create(fast=True) (what the adapter tries on the trio thread) makes the file when the
    kernel's lookup just found nothing in a directory whose marker this mount staged last;
    else it declines (None) and the create runs in a worker thread."""
    main = ino_of(fs, "main")
    d = fs.mkdir(main, b"d", 0o755, ME).ino
    assert fs.create(d, b"a", stat.S_IFREG | 0o644, os.O_WRONLY, ME, True) is None  # no lookup before it
    opened, _ = fs.create(d, b"a", stat.S_IFREG | 0o644, os.O_WRONLY, ME)  # (in a thread: its marker read)
    fs.flush(opened.fh)
    fs.release(opened.fh)
    assert fs.lookup_absent(d, b"b")  # the kernel's lookup: answered from memory
    got = fs.create(d, b"b", stat.S_IFREG | 0o600, os.O_WRONLY, ME, True)
    assert got is not None and fs.stats.counts["creates_inline"] == 1
    opened, attr = got
    assert fs.getattr(d).mtime_ns == attr.mtime_ns  # its directory's times moved with it
    fs.write(opened.fh, 0, b"bb")
    fs.flush(opened.fh)
    fs.release(opened.fh)
    assert repo.read("main", "d/b") == b"bb"
    assert PosixAttrs.from_metadata(repo.get("main", "d/b").metadata).mode == stat.S_IFREG | 0o600
    # a directory rename under way (its lock held exclusively): declined, the thread waits for it
    assert fs.lookup_absent(d, b"c")
    lock = fs.tree_lock(fs.inodes.get(d).tree)
    with lock.exclusive():
        assert fs.create(d, b"c", stat.S_IFREG | 0o644, os.O_WRONLY, ME, True) is None
    assert fs.stats.counts["creates_inline"] == 1


@pytest.mark.parametrize("save", ["close", "fsync"])
def test_after_a_save_the_directory_and_file_attributes_are_answered_without_a_read(fs, repo, save):
    """The kernel asks a directory's attributes again after each create in it, and the next
    create's lookup follows: after a file's save -- a close, or an fsync before it (each file
    of an fsync loop) -- both are answered from what the save staged (getattr_fast, lookup_absent),
    and the next create needs no thread."""
    main = ino_of(fs, "main")
    d = fs.mkdir(main, b"s" + save.encode(), 0o755, ME).ino
    for i in range(3):
        name = b"f%d" % i
        assert fs.lookup_absent(d, name)
        got = fs.create(d, name, stat.S_IFREG | 0o644, os.O_WRONLY, ME, bool(i))
        assert got is not None  # (from the second on: answered without a thread)
        opened, _ = got
        fs.write(opened.fh, 0, b"x" * (i + 1))
        if save == "fsync":
            fs.fsync(opened.fh)
        fs.flush(opened.fh)
        fs.release(opened.fh)
        dir_attr = fs.getattr_fast(d)
        assert dir_attr is not None and dir_attr.mtime_ns == fs.getattr(d).mtime_ns
        file_attr = fs.getattr_fast(fs.lookup(d, name).ino)
        assert file_attr is not None and file_attr.size == i + 1
    assert fs.stats.counts["creates_inline"] == 2
    assert [repo.read("main", f"s{save}/f{i}") for i in range(3)] == [b"x" * (i + 1) for i in range(3)]


def test_attributes_of_a_new_file_before_its_first_write_are_kept_in_memory_and_staged_at_its_close(fs, repo):
    """touch(1), or tar extracting an empty file: utimens / chown / chmod of a file just created
    (its create not staged yet) are answered without a thread (setattr_fast) and without staging
    anything; its close stages it once, with them."""
    main = ino_of(fs, "main")
    d = fs.mkdir(main, b"e", 0o755, ME).ino
    assert fs.lookup_absent(d, b"empty")  # the kernel's lookup, then its create: staged with the first save
    opened, attr = fs.create(d, b"empty", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    stamp = repo.change_stamp("main")
    a = fs.setattr_fast(attr.ino, SetAttr(mtime_ns=1_500_000_000_000_000_000, atime_ns=1_500_000_000_000_000_000))
    a = fs.setattr_fast(attr.ino, SetAttr(uid=7, gid=8))
    a = fs.setattr_fast(attr.ino, SetAttr(mode=0o600))
    assert a is not None and fs.stats.counts["setattrs_inline"] == 3
    assert stat.S_IMODE(a.mode) == 0o600 and (a.uid, a.gid) == (7, 8) and a.mtime_ns == 1_500_000_000_000_000_000
    assert fs.getattr(attr.ino) == a and a.size == 0
    assert repo.change_stamp("main") == stamp  # nothing staged: the create and its attributes wait for the close
    assert fs.pending(opened.fh)
    fs.flush(opened.fh)
    fs.release(opened.fh)
    assert repo.change_stamp("main") == stamp + 1  # one transaction: the create, with its attributes
    e = repo.get("main", "e/empty")
    pa = PosixAttrs.from_metadata(e.metadata)
    assert e.size == 0 and pa.mode == stat.S_IFREG | 0o600 and (pa.uid, pa.gid) == (7, 8)
    assert pa.mtime_ns == 1_500_000_000_000_000_000
    assert fs.getattr(attr.ino).mtime_ns == 1_500_000_000_000_000_000
    # a file that is neither new nor written: not in memory (the thread stages the change at once)
    o = fs.open(ino_of(fs, "main/top"), os.O_WRONLY)
    assert fs.setattr_fast(ino_of(fs, "main/top"), SetAttr(mode=0o600)) is None
    fs.release(o.fh)


@PERSISTENT_KVS
def test_overwrite_append_and_random_writes_on_committed_file(fs, repo, kv_backend):
    ino = ino_of(fs, "main/data/a.csv")
    o = fs.open(ino, os.O_WRONLY)
    assert fs.spool.get(ino).loaded is False  # lazy copy-in: nothing read yet
    fs.write(o.fh, 4, b"X")
    fs.write(o.fh, 8, b"3,4\n")
    fs.flush(o.fh)
    fs.release(o.fh)
    assert repo.read("main", "data/a.csv") == b"a,b\nX,2\n3,4\n"
    o = fs.open(ino, os.O_WRONLY | os.O_TRUNC)
    fs.write(o.fh, 0, b"new")
    fs.release(o.fh)  # release saves what flush did not
    assert repo.read("main", "data/a.csv") == b"new"


def test_truncate_without_open(fs, repo):
    ino = ino_of(fs, "main/top")
    a = fs.setattr(ino, SetAttr(size=1))
    assert a.size == 1 and repo.read("main", "top") == b"t"
    fs.setattr(ino, SetAttr(size=4))
    assert repo.read("main", "top") == b"t\0\0\0"


@pytest.mark.expect_log("a spool disk error is logged")
def test_spool_disk_errors_answer_their_errno(fs, repo):
    ino = ino_of(fs, "main/top")
    assert fs_errno(fs.setattr, ino, SetAttr(size=1 << 62)) in (errno.EFBIG, errno.EINVAL)
    assert repo.read("main", "top") == b"top"  # nothing changed


def test_chmod_chown_utimens_keep_the_object(fs, repo):
    ino = ino_of(fs, "main/top")
    addr = repo.get("main", "top").address
    a = fs.setattr(ino, SetAttr(mode=0o600, uid=7, gid=8, mtime_ns=1_600_000_000_000_000_000))
    assert stat.S_IMODE(a.mode) == 0o600 and (a.uid, a.gid) == (7, 8) and a.mtime_ns == 1_600_000_000_000_000_000
    e = repo.get("main", "top")
    assert e.address == addr
    pa = PosixAttrs.from_metadata(e.metadata)
    assert pa.mode == stat.S_IFREG | 0o600 and pa.mtime_ns == 1_600_000_000_000_000_000
    fs.setattr(ino, SetAttr(mode=0o644))  # mtime stays what utimens set
    assert fs.getattr(ino).mtime_ns == 1_600_000_000_000_000_000


@PERSISTENT_KVS
def test_a_branch_roots_mode_owner_and_times_are_kept_in_a_hidden_marker_and_committed(fs, repo, kv_backend):
    """cp -a, rsync -a and tar -x set the attributes of the directory they copy into: on a
    branch root they go into the marker "/" (hidden from listings), and a commit keeps them."""
    root = ino_of(fs, "main")
    before = fs.getattr(root)
    names = sorted(e.name for e, _ in readdir_all(fs, root))
    a = fs.setattr(root, SetAttr(mode=0o700, uid=7, gid=8, mtime_ns=1_500_000_000_000_000_000,
                                 atime_ns=1_500_000_000_000_000_001))
    assert (stat.S_IFMT(a.mode), stat.S_IMODE(a.mode), a.uid, a.gid) == (stat.S_IFDIR, 0o700, 7, 8)
    assert (a.mtime_ns, a.atime_ns, a.nlink) == (1_500_000_000_000_000_000, 1_500_000_000_000_000_001, before.nlink)
    pa = PosixAttrs.from_metadata(repo.get("main", ROOT_MARKER).metadata)
    assert (pa.mode, pa.uid, pa.gid) == (stat.S_IFDIR | 0o700, 7, 8)
    assert sorted(e.name for e, _ in readdir_all(fs, root)) == names  # "/" is no name in the root
    assert fs.getattr(root).mode == a.mode
    assert [attr.mode for e, attr in readdir_all(fs, ROOT_INO) if e.name == b"main"] == [a.mode]  # ls -l /mnt
    fs.setattr(root, SetAttr(mode=0o750))  # chmod alone: the rest stays
    a = fs.getattr(root)
    assert (stat.S_IMODE(a.mode), a.uid, a.mtime_ns) == (0o750, 7, 1_500_000_000_000_000_000)
    write_file(fs, "main", "new", b"n")  # an entry added: the root stays as set (its times are not kept up)
    assert fs.getattr(root).mtime_ns == 1_500_000_000_000_000_000
    assert fs_errno(fs.setattr, root, SetAttr(size=0)) == errno.EISDIR
    commit = repo.commit("main", "root attributes").id
    c = fs.getattr(ino_of(fs, commit))
    assert (stat.S_IMODE(c.mode), c.uid, c.gid, c.mtime_ns) == (0o750, 7, 8, 1_500_000_000_000_000_000)
    assert sorted(e.name for e, _ in readdir_all(fs, ino_of(fs, commit))) == sorted(names + [b"new"])
    assert fs.getattr(ino_of(fs, "v1")).uid == before.uid  # a tag made before: as it was


def test_a_root_marker_in_a_damaged_range_leaves_the_root_readable(tmp_path):
    """The root's marker sits in the first range: when that range is damaged the root's stat
    falls back to the defaults (its listing and the paths in that range answer EIO, the others
    read), rather than the tree becoming unreachable."""
    from graveler.committed.writer import RangeParams
    from tests.graveler_testutil import damage_range, make_graveler

    params = RangeParams(min_range_size=0, max_range_size=2048, raggedness=5)
    g = make_graveler(tmp_path, range_params=params)
    repo = g.create_repository("dmg", f"file://{tmp_path}/ns-dmg")
    keys = [f"d{i:02d}/f{j:02d}" for i in range(8) for j in range(8)]
    for k in keys:
        repo.upload("main", k, k.encode())
    with writable_core(repo, tmp_path / "cache") as fs:
        fs.setattr(ino_of(fs, "main"), SetAttr(mode=0o700, uid=7))
    commit = repo.commit("main", "root set").id
    infos, victim = damage_range(repo, tmp_path / "ns-dmg", 0)
    assert victim.min_key == ROOT_MARKER  # "/" sorts first
    g.close()
    g = make_graveler(tmp_path, range_params=params)  # (nothing of the range cached)
    repo = g.repository("dmg")
    try:
        with writable_core(repo, tmp_path / "cache2") as fs:
            a = fs.getattr(ino_of(fs, commit))
            assert stat.S_ISDIR(a.mode) and a.uid == 1000  # the defaults: the marker unreadable
            inside = [k for k in keys if k.encode() <= victim.max_key]
            outside = [k for k in keys if k.encode() > infos[1].min_key]
            assert inside and outside
            assert read_path(fs, f"{commit}/{outside[-1]}") == outside[-1].encode()
            with pytest.raises(Exception) as ei:
                read_path(fs, f"{commit}/{inside[0]}")
            assert errno_for(ei.value) == errno.EIO
    finally:
        g.close()


def test_a_close_moves_no_time_the_last_change_does(fs, repo):
    """ctime (and mtime, unless set) are the file's last change, as on ext4: a close saves the
    file without moving them (pjdfstest's unlink/00.t 29 once passed when a save crossed a second)."""
    main = ino_of(fs, "main")
    o, attr = fs.create(main, b"t", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    created = fs.getattr(attr.ino).ctime_ns
    fs.flush(o.fh)
    fs.release(o.fh)
    a = fs.getattr(ino_of(fs, "main/t"))
    assert a.ctime_ns == created and repo.get("main", "t").last_modified_ns == created
    o = fs.open(a.ino, os.O_WRONLY)
    fs.write(o.fh, 0, b"data")
    written = fs.getattr(a.ino)
    fs.flush(o.fh)
    fs.release(o.fh)
    a = fs.getattr(a.ino)
    assert (a.ctime_ns, a.mtime_ns) == (written.ctime_ns, written.mtime_ns) and written.ctime_ns > created
    assert repo.get("main", "t").last_modified_ns == written.ctime_ns
    a = fs.setattr(a.ino, SetAttr(mode=0o600))  # chmod: the ctime moves, the mtime stays
    assert a.ctime_ns > written.ctime_ns and a.mtime_ns == written.mtime_ns


@PERSISTENT_KVS
def test_mkdir_marker_rmdir_and_notempty(fs, repo, kv_backend):
    a = fs.mkdir(ino_of(fs, "main"), b"empty", stat.S_IFDIR | 0o750, ME)
    assert stat.S_IMODE(a.mode) == 0o750 and a.uid == 1000
    assert repo.exists("main", "empty/")
    names = [it.path for it in repo.list("main", "", delimiter="/")]
    assert b"empty/" in names
    assert fs.lookup(ino_of(fs, "main"), b"empty").ino == a.ino
    write_file(fs, "main/empty", "f", b"1")
    assert fs_errno(fs.rmdir, ino_of(fs, "main"), b"empty") == errno.ENOTEMPTY
    fs.unlink(ino_of(fs, "main/empty"), b"f")
    fs.rmdir(ino_of(fs, "main"), b"empty")
    assert not repo.exists("main", "empty/")
    assert fs_errno(fs.lookup, ino_of(fs, "main"), b"empty") == errno.ENOENT


@PERSISTENT_KVS
def test_unlinking_last_file_keeps_an_implicit_directory(fs, repo, kv_backend):
    fs.unlink(ino_of(fs, "main/data/sub"), b"x")
    assert repo.exists("main", "data/sub/")  # a marker keeps it
    fs.rmdir(ino_of(fs, "main/data"), b"sub")
    assert not any(p.startswith(b"data/sub") for p in (it.path for it in repo.list("main", "", delimiter="")))


def test_a_directory_removed_while_open_keeps_its_attributes_for_its_handle_with_no_links(fs, repo):
    """Found by a tour of the whole of POSIX: ``fstat`` of an open directory after its rmdir answered
    ENOENT; ext4 gives its attributes with ``nlink`` 0 (a listing is ENOENT: the kernel's own answer for
    a removed directory). Not open, the inode is stale (the kernel looks the name up again)."""
    main = ino_of(fs, "main")
    attr = fs.mkdir(main, b"gone", stat.S_IFDIR | 0o750, ME)
    fh = fs.opendir(attr.ino)
    try:
        assert fs.getattr(attr.ino).nlink == 2  # healthy: an open directory still there
        fs.rmdir(main, b"gone")
        st = fs.getattr(attr.ino)
        assert st.nlink == 0 and stat.S_ISDIR(st.mode) and stat.S_IMODE(st.mode) == 0o750 and st.uid == ME.uid
        fs.mkdir(main, b"gone", stat.S_IFDIR | 0o700, ME)  # a new directory of the name: another inode
        assert fs.getattr(attr.ino).nlink == 0 and fs.getattr(ino_of(fs, "main/gone")).nlink == 2
    finally:
        fs.releasedir(fh)
    assert fs_errno(fs.getattr, attr.ino) == errno.ESTALE


@pytest.mark.parametrize("how", ["unlinked", "renamed over"])
def test_descriptors_of_a_file_no_name_reaches_change_its_attributes_as_on_ext4(fs, repo, how):
    """Found by a tour of the whole of POSIX: fchmod, fchown, futimens and fsetxattr through a descriptor
    open for reading of a file unlinked (or renamed over) through the mount answered ESTALE (fgetxattr
    ENOENT or another file's ENODATA); the kernel retries ESTALE by name, never through a descriptor.
    The changes stay with the inode (fstat and fgetxattr show them), staged nowhere."""
    main = ino_of(fs, "main")
    write_file(fs, "main", "f", b"hello")
    ino = ino_of(fs, "main/f")
    fs.setxattr(ino, b"user.kept", b"1")
    o = fs.open(ino, os.O_RDONLY)
    try:
        if how == "unlinked":
            fs.unlink(main, b"f")
        else:
            write_file(fs, "main", "g", b"other")
            fs.rename(main, b"g", main, b"f", 0)
        st = fs.setattr(ino, SetAttr(mode=0o600, uid=1000, gid=1000, mtime_ns=2_000_000_000, atime_ns=1))
        assert (stat.S_IMODE(st.mode), st.uid, st.gid, st.mtime_ns, st.nlink) == (0o600, 1000, 1000, 2_000_000_000, 0)
        assert stat.S_IMODE(fs.getattr(ino).mode) == 0o600 and fs.getattr(ino).nlink == 0
        assert fs.getxattr(ino, b"user.kept") == b"1"
        fs.setxattr(ino, b"user.new", b"2")
        assert fs.getxattr(ino, b"user.new") == b"2" and b"user.new" in fs.listxattr(ino)
        assert fs.read(o.fh, 0, 100) == b"hello"
    finally:
        fs.release(o.fh)
    if how == "renamed over":  # the name's file is untouched
        g = repo.get("main", "f")
        assert repo.read("main", "f") == b"other" and "0o600" not in str(g.metadata)
        assert fs_errno(fs.getxattr, ino_of(fs, "main/f"), b"user.new") == errno.ENODATA
    else:
        assert not repo.exists("main", "f")
    assert fs_errno(fs.setattr, ino, SetAttr(mode=0o644)) == errno.ESTALE  # no descriptor left: stale
    # (healthy: an inode whose name changed behind the mount stays ESTALE: test_mount_shared_inode.py)


@pytest.mark.expect_log("a renewal that fails says so once")
def test_the_shared_empty_object_is_uploaded_again_before_gc_may_take_it(fs, repo, monkeypatch):
    """Found by a GC tour: a mount uploaded its empty object once and named it in every empty file,
    directory marker and symlink it made for as long as it ran. Once nothing named it and it was older
    than GC's minimum age, GC deleted it, and what the mount made afterwards named a missing object
    (``fs cat`` and export: not found). The mount uploads a new one once its own is ten minutes old, in
    a thread of its own (asked by a create or the stamp watch's round): no create waits for the store
    (found by an S3 tour: with the store down, creates failed EIO at the renewal; hung, each waited a
    whole bound), and one that fails keeps the old one in use."""
    from lakefuse.mount import emptyobj

    main = ino_of(fs, "main")
    fs.mkdir(main, b"d0", stat.S_IFDIR | 0o755, ME)
    fs.symlink(main, b"s0", b"d0", ME)
    first = repo.get("main", "d0/").address
    assert repo.get("main", "s0").address == first  # healthy: reused while young (no upload per entry)
    fs.unlink(main, b"s0")
    fs.rmdir(main, b"d0")  # nothing names it now
    now = [time.monotonic()]
    monkeypatch.setattr(emptyobj.time, "monotonic", lambda: now[0])
    empty = fs._writer().empty
    real_upload = empty._upload
    monkeypatch.setattr(empty, "_upload", lambda: (_ for _ in ()).throw(OSError("the store is away")))
    now[0] += emptyobj.EMPTY_MAX_AGE_S + 1  # the mount has run past the bound, and the store is away
    fs.mkdir(main, b"d1", stat.S_IFDIR | 0o755, ME)  # answered at once, with the old one
    assert repo.get("main", "d1/").address == first
    deadline = time.time() + 10
    while empty._renewing and time.time() < deadline:
        time.sleep(0.01)
    assert not empty._renewing and empty.entry().address == first  # kept in use; tried again later
    monkeypatch.setattr(empty, "_upload", real_upload)  # the store is back
    now[0] += emptyobj.RETRY_S + 1
    empty.tick()  # (the stamp watch's round)
    deadline = time.time() + 10
    while empty.entry().address == first and time.time() < deadline:
        time.sleep(0.01)
    repo._store.delete(first)  # what GC does to an unnamed object older than its --min-age
    fs.mkdir(main, b"d", stat.S_IFDIR | 0o755, ME)
    fs.symlink(main, b"s", b"d", ME)
    for key in ("d/", "s"):
        e = repo.get("main", key)
        assert e.address != first and repo._store.exists(e.address), key
    repo.commit("main", "after the sweep")
    assert repo.read("main", "d/") == b"" and repo.read("main", "s") == b""  # (export and fs cat read them)


@PERSISTENT_KVS
def test_rename_file_and_directory_without_copying(fs, repo, kv_backend):
    fs.empty_entry()  # the mount's one shared empty object (markers point at it)
    objects = sorted(o.key for o in repo._store.list("data/"))
    main = ino_of(fs, "main")
    fs.rename(ino_of(fs, "main/data"), b"a.csv", main, b"moved.csv", 0)
    assert repo.read("main", "moved.csv") == b"a,b\n1,2\n" and not repo.exists("main", "data/a.csv")
    fs.rename(main, b"data", main, b"renamed", 0)
    assert repo.read("main", "renamed/sub/x") == b"x"
    assert not any(it.path.startswith(b"data/") for it in repo.list("main", "", delimiter=""))
    assert sorted(o.key for o in repo._store.list("data/")) == objects
    assert read_path(fs, "main/renamed/sub/x") == b"x"


def test_a_directory_rename_takes_the_object_its_name_hides_along(fs, repo):
    """Keys ``obj`` and ``obj/child``: the directory wins and the object is hidden. After
    ``mv obj objm`` the old name is gone (POSIX): the hidden object moves with its directory
    (hidden at ``objm`` in turn), rather than showing up at ``obj`` as a file. An rmdir of
    such a directory, emptied, is ENOTEMPTY: its name would otherwise show the object."""
    repo.upload("main", "obj", b"hid")
    repo.upload("main", "obj/child", b"c")
    main = ino_of(fs, "main")
    assert stat.S_ISDIR(fs.lookup(main, b"obj").mode)
    fs.rename(main, b"obj", main, b"objm", 0)
    assert fs_errno(fs.lookup, main, b"obj") == errno.ENOENT
    assert stat.S_ISDIR(fs.lookup(main, b"objm").mode) and read_path(fs, "main/objm/child") == b"c"
    assert not repo.exists("main", "obj") and repo.read("main", "objm") == b"hid"
    fs.mkdir(main, b"plain", stat.S_IFDIR | 0o755, ME)  # (a directory hiding nothing moves as before)
    fs.rename(main, b"plain", main, b"plain2", 0)
    assert not repo.exists("main", "plain2") and fs_errno(fs.lookup, main, b"plain") == errno.ENOENT
    # emptied, the directory is not removed: its name would show the object (rm -r says "not empty")
    objm = ino_of(fs, "main/objm")
    fs.unlink(objm, b"child")
    assert fs_errno(fs.rmdir, main, b"objm") == errno.ENOTEMPTY
    assert stat.S_ISDIR(fs.lookup(main, b"objm").mode) and repo.read("main", "objm") == b"hid"
    fs.rmdir(main, b"plain2")  # (one hiding nothing goes)


@PERSISTENT_KVS
def test_rename_rules(fs, repo, kv_backend):
    main = ino_of(fs, "main")
    write_file(fs, "main", "f1", b"1")
    write_file(fs, "main", "f2", b"2")
    assert fs_errno(fs.rename, main, b"f1", main, b"f2", RENAME_NOREPLACE) == errno.EEXIST
    assert fs_errno(fs.rename, main, b"f1", main, b"f2", RENAME_EXCHANGE) == errno.EINVAL
    assert fs_errno(fs.rename, main, b"f1", main, b"data", 0) == errno.EISDIR
    assert fs_errno(fs.rename, main, b"data", main, b"f1", 0) == errno.ENOTDIR
    assert fs_errno(fs.rename, main, b"data", ino_of(fs, "main/data/sub"), b"in", 0) == errno.EINVAL
    assert fs_errno(fs.rename, main, b"f1", main, b".lakefuse", 0) == errno.EPERM
    fs.mkdir(main, b"d2", stat.S_IFDIR | 0o755, ME)
    write_file(fs, "main/d2", "x", b"x")
    assert fs_errno(fs.rename, main, b"data", main, b"d2", 0) == errno.ENOTEMPTY
    assert fs_errno(fs.rename, main, b"f1", ino_of(fs, "v1"), b"f1", 0) in (errno.EXDEV, errno.EROFS)
    fs.lookup(ROOT_INO, b"main")
    fs.rename(main, b"f1", main, b"f2", 0)  # replace
    assert repo.read("main", "f2") == b"1"


def test_rename_exdev_across_branches(fs, repo):
    repo.create_branch("dev")
    assert fs_errno(fs.rename, ino_of(fs, "main"), b"top", ino_of(fs, "dev"), b"top", 0) == errno.EXDEV


def test_symlink_and_readlink(fs, repo):
    a = fs.symlink(ino_of(fs, "main"), b"ln", b"data/a.csv", ME)
    assert stat.S_ISLNK(a.mode)
    assert fs.readlink(a.ino) == b"data/a.csv"
    assert PosixAttrs.from_metadata(repo.get("main", "ln").metadata).symlink == "data/a.csv"


def test_device_nodes_keep_type_and_rdev_through_chmod_rename_and_commit(fs, repo):
    main = ino_of(fs, "main")
    c = fs.mknod(main, b"null", stat.S_IFCHR | 0o666, ME, os.makedev(1, 3))
    b = fs.mknod(main, b"disk", stat.S_IFBLK | 0o660, ME, os.makedev(8, 17))
    assert stat.S_ISCHR(c.mode) and stat.S_IMODE(c.mode) == 0o666 and c.size == 0
    assert (os.major(c.rdev), os.minor(c.rdev)) == (1, 3) and (c.uid, c.gid) == (1000, 100)
    assert stat.S_ISBLK(b.mode) and b.rdev == os.makedev(8, 17)
    md = repo.get("main", "disk").metadata
    assert md[POSIX_MODE] == "60660" and md[POSIX_RDEV] == str(os.makedev(8, 17))
    assert POSIX_RDEV not in repo.get("main", "data/a.csv").metadata
    assert fs.mknod(main, b"fifo", stat.S_IFIFO | 0o600, ME, os.makedev(1, 3)).rdev == 0  # rdev: devices only
    assert POSIX_RDEV not in repo.get("main", "fifo").metadata
    a = fs.setattr(b.ino, SetAttr(mode=0o600, uid=7, gid=8))  # chmod, chown: type and rdev stay
    assert a.mode == stat.S_IFBLK | 0o600 and (a.uid, a.gid) == (7, 8) and a.rdev == os.makedev(8, 17)
    fs.rename(main, b"disk", ino_of(fs, "main/data"), b"sda1", 0)
    a = fs.lookup(ino_of(fs, "main/data"), b"sda1")
    assert a.mode == stat.S_IFBLK | 0o600 and a.rdev == os.makedev(8, 17) and a.uid == 7
    assert fs_errno(fs.mknod, main, b"null", stat.S_IFBLK | 0o600, ME, 0) == errno.EEXIST
    commit = repo.commit("main", "devices").id
    for tree in (commit[:10], "main"):
        a = fs.lookup(ino_of(fs, f"{tree}/data"), b"sda1")
        assert a.mode == stat.S_IFBLK | 0o600 and a.rdev == os.makedev(8, 17), tree
        a = fs.lookup(ino_of(fs, tree), b"null")
        assert a.mode == stat.S_IFCHR | 0o666 and a.rdev == os.makedev(1, 3), tree
    fs.unlink(main, b"null")
    assert not repo.exists("main", "null")
    assert fs_errno(fs.mknod, ino_of(fs, commit[:10]), b"d", stat.S_IFCHR | 0o600, ME, 0) == errno.EROFS


def test_link_mknod_reserved_and_erofs(fs, repo):
    main = ino_of(fs, "main")
    assert fs_errno(fs.link, ino_of(fs, "main/top"), main, b"hard") == errno.EPERM
    fifo = fs.mknod(main, b"fifo", stat.S_IFIFO | 0o640, ME)  # kept as an entry, like a symlink
    assert stat.S_ISFIFO(fifo.mode) and stat.S_IMODE(fifo.mode) == 0o640
    assert PosixAttrs.from_metadata(repo.get("main", "fifo").metadata).mode == stat.S_IFIFO | 0o640
    a = fs.mknod(main, b"reg", stat.S_IFREG | 0o600, ME)
    assert a.size == 0 and repo.exists("main", "reg")
    assert fs_errno(fs.create, ino_of(fs, "main/data"), b".lakefuse", 0o644, os.O_WRONLY, ME) == errno.EPERM
    assert fs_errno(fs.mkdir, ino_of(fs, "main/data"), b".lakefuse", 0o755, ME) == errno.EPERM
    v1 = ino_of(fs, "v1")
    assert fs_errno(fs.create, v1, b"n", 0o644, os.O_WRONLY, ME) == errno.EROFS
    assert fs_errno(fs.mkdir, v1, b"n", 0o755, ME) == errno.EROFS
    assert fs_errno(fs.unlink, v1, b"top") == errno.EROFS
    assert fs_errno(fs.open, ino_of(fs, "v1/top"), os.O_WRONLY) == errno.EROFS
    assert fs_errno(fs.setattr, ino_of(fs, "v1/top"), SetAttr(mode=0o600)) == errno.EROFS
    commit = repo.get_commit("main").id
    assert fs_errno(fs.create, ino_of(fs, commit[:10]), b"n", 0o644, os.O_WRONLY, ME) == errno.EROFS


@PERSISTENT_KVS
def test_unlink_open_file_detaches_it(fs, repo, kv_backend):
    opened, attr = fs.create(ino_of(fs, "main"), b"tmp", stat.S_IFREG | 0o644, os.O_RDWR, ME)
    fs.write(opened.fh, 0, b"data")
    fs.unlink(ino_of(fs, "main"), b"tmp")
    fs.write(opened.fh, 4, b"more")
    assert fs.read(opened.fh, 0, 100) == b"datamore"
    assert fs.getattr(attr.ino).nlink == 0 and fs.getattr(attr.ino).size == 8  # fstat: no name left
    fs.flush(opened.fh)
    fs.release(opened.fh)
    assert not repo.exists("main", "tmp")
    top = ino_of(fs, "main/top")
    o = fs.open(top, os.O_RDONLY)  # a committed file open for reading, then unlinked
    ctime = fs.getattr(top).ctime_ns
    time.sleep(0.01)
    fs.unlink(ino_of(fs, "main"), b"top")
    a = fs.getattr(top)
    assert (a.nlink, a.size) == (0, 3) and fs.read(o.fh, 0, 10) == b"top"
    assert a.ctime_ns > ctime  # its link count went: ext4 moves the ctime (found exploring: it stayed)
    fs.release(o.fh)
    assert fs_errno(fs.getattr, top) == errno.ESTALE  # closed: gone (the kernel looks the name up: ENOENT)


def test_mkdir_at_root_makes_a_branch_and_rmdir_is_eperm(fs, repo):
    """... and the kernel lets the mounting user try: a writable mount's root is 0755, its owner the
    mounting user (a non-root user's tour found it 0555: ``mkdir MOUNT/NEW`` was EACCES in the kernel,
    before the daemon, for anyone but root); a read-only mount's stays 0555."""
    from lakefuse.mount.fs import Filesystem

    root = fs.getattr(ROOT_INO)
    assert stat.S_ISDIR(root.mode) and stat.S_IMODE(root.mode) == 0o755 and root.uid == fs.config.uid
    assert stat.S_IMODE(Filesystem(repo, fs.config).getattr(ROOT_INO).mode) == 0o555
    fs.mkdir(ROOT_INO, b"feature", stat.S_IFDIR | 0o755, ME)
    assert repo.get_branch("feature").commit_id == repo.get_commit("main").id
    assert fs_errno(fs.mkdir, ROOT_INO, b"feature", 0o755, ME) == errno.EEXIST
    assert fs_errno(fs.rmdir, ROOT_INO, b"feature") == errno.EPERM


@pytest.mark.expect_log("a failed control request is logged as a warning")
@PERSISTENT_KVS
def test_commit_control_file(fs, repo, kv_backend):
    write_file(fs, "main", "c.txt", b"c")
    assert read_control(fs, "main", "status") == b"A c.txt\n"
    control(fs, "main", "commit", b"add c\n")
    out = json.loads(read_control(fs, "main", "commit"))
    assert out["ok"] and out["commit"]["id"] == repo.get_commit("main").id
    assert read_control(fs, "main", "status") == b""
    head = read_control(fs, "main", "head").decode().strip()
    assert head == out["commit"]["id"]
    with pytest.raises(NothingToCommit):
        control(fs, "main", "commit", b"nothing\n")
    assert json.loads(read_control(fs, "main", "commit"))["error_type"] == "NothingToCommit"
    with pytest.raises(InvalidArgument):
        control(fs, "main", "commit", b'{"broken')
    # the commit is readable by its ID
    assert read_path(fs, f"{head}/c.txt") == b"c"


def test_control_files_listed_and_immutable_trees_refuse(fs, repo):
    fh = fs.opendir(ino_of(fs, "main/.lakefuse"))
    fs.readdir_fill(fh, 0)
    names = [e.name for e in fs.readdir_fast(fh, 0)]
    fs.releasedir(fh)
    assert {b"head", b"log", b"commit", b"status", b"merge", b"reset", b"revert"} <= set(names)
    assert fs_errno(fs.lookup, ino_of(fs, "v1/.lakefuse"), b"commit") == errno.ENOENT
    assert fs_errno(fs.open, ino_of(fs, "main/.lakefuse/status"), os.O_WRONLY) == errno.EACCES
    control(fs, None, "branch", b"dev main")
    control(fs, None, "tag", b"v2 dev")
    assert repo.get_tag("v2").commit_id == repo.get_commit("main").id


@PERSISTENT_KVS
def test_writes_during_commit_go_to_the_next_one(fs, repo, kv_backend):
    opened, _ = fs.create(ino_of(fs, "main"), b"open.txt", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    fs.write(opened.fh, 0, b"unsaved")
    write_file(fs, "main", "saved.txt", b"saved")
    control(fs, "main", "commit", b"with an open file")
    c = repo.get_commit("main")
    # the open file is in the commit as it was last saved: empty (created, never closed)
    assert repo.read(c.id, "open.txt") == b"" and repo.read(c.id, "saved.txt") == b"saved"
    fs.flush(opened.fh)
    fs.release(opened.fh)
    assert repo.read("main", "open.txt") == b"unsaved"
    assert read_control(fs, "main", "status") == b"M open.txt\n"


def test_close_saves_without_a_sync_and_fsync_makes_it_durable(tmp_path):
    """ext4's contract: create(2) and close(2) stage by committed, unsynced KV transactions and
    adopt the object without an fsync (visible at once, kept if the daemon dies); fsync(2)
    of the file -- on the handle that wrote it, or on another descriptor after the close --
    syncs the object (file and directory) and every KV commit before it returns."""
    from graveler.config import KVConfig

    repo = make_repo(tmp_path, "dur", kv=KVConfig(map_size=1 << 24, sync=True))
    env = repo._env
    synced: list[str] = []
    sync_object = repo._store.sync_object
    repo._store.sync_object = lambda key: (synced.append(key), sync_object(key))[1]  # records, then syncs
    sp = Spool(repo, SpoolConfig(tmp_path / "cache", repo.name))
    fs = WritableFilesystem(repo, FsConfig(uid=1000, gid=100), spool=sp)
    try:
        root = ino_of(fs, "main")
        for name, data in (("empty", b""), ("full", b"data")):
            opened, _ = fs.create(root, name.encode(), stat.S_IFREG | 0o644, os.O_WRONLY, ME)
            assert not repo.exists("main", name)  # staged with its first save
            fs.lookup(root, name.encode())  # a lookup reaching the KV stages it first
            assert repo.exists("main", name) and env._synced_seq < env._commit_seq  # staged, not synced
            if data:
                fs.write(opened.fh, 0, data)
            fs.flush(opened.fh)
            assert env._synced_seq < env._commit_seq and synced == []  # close: saved, nothing synced
            assert repo.read("main", name) == data
            fs.fsync(opened.fh)
            assert env._synced_seq == env._commit_seq  # fsync: every KV commit durable
            fs.release(opened.fh)
        e = repo.get("main", "full")
        assert synced == [e.address]  # the object of the written file (the empty one has none)
        # a later write, closed; then fsync through a descriptor opened read-only after the close
        ino = ino_of(fs, "main/full")
        opened = fs.open(ino, os.O_WRONLY | os.O_TRUNC)
        fs.write(opened.fh, 0, b"newer")
        fs.flush(opened.fh)
        fs.release(opened.fh)
        e2 = repo.get("main", "full")
        assert env._synced_seq < env._commit_seq and synced == [e.address]
        ro = fs.open(ino, os.O_RDONLY)
        fs.fsync(ro.fh)
        fs.release(ro.fh)
        assert synced == [e.address, e2.address] and env._synced_seq == env._commit_seq
        # a metadata change (chmod) is committed unsynced too; fsync of its directory syncs it
        fs.setattr(ino, SetAttr(mode=0o600))
        assert env._synced_seq < env._commit_seq
        fs.fsyncdir()
        assert env._synced_seq == env._commit_seq
    finally:
        sp.close()
        repo.close()


@PERSISTENT_KVS
def test_stamp_watch_drops_the_kernels_caches_of_a_moved_branch(fs, repo, kv_backend):
    """The daemon's stamp watch (lakefuse.mount.watch): when a branch's change stamp moves behind
    the mount (another host, the CLI), the kernel's attributes and pages of every inode of that
    branch tree are dropped; a round where nothing moved, and immutable trees, drop nothing; a
    single change this mount made itself (through the kernel) drops nothing."""
    from lakefuse.mount.watch import StampWatch

    a = ino_of(fs, "main/data/a.csv")
    sub = ino_of(fs, "main/data/sub")
    tagged = ino_of(fs, "v1/data/a.csv")
    dropped: list[int] = []
    w = StampWatch(fs, dropped.append)
    assert w.poll_once() == 0 and not dropped
    repo.upload("main", "top", b"changed behind the mount")
    assert w.poll_once() > 0
    assert a in dropped and sub in dropped and tagged not in dropped
    dropped.clear()
    assert w.poll_once() == 0 and not dropped
    write_file(fs, "main/data", "mine.txt", b"through the mount")  # create and close: this mount's own
    w.poll_once()
    assert not dropped
    repo.delete("main", "data/sub/x")
    w.poll_once()
    assert sub in dropped


def test_names_a_request_took_away_go_each_one_whatever_the_kernel_answers(fs, repo):
    """The stamp watch drops the kernel's names of what a merge or reset took away (files, then
    the directories left with nothing): one name the kernel no longer has (ENOENT: dropped
    already in the same round, a file held open) must not keep the others (found reviewing the
    change: the first ENOENT ended the tree's drops, so ``mkdir`` of the directory stayed EEXIST)."""
    from lakefuse.mount.watch import StampWatch

    x = ino_of(fs, "main/data/sub/x")
    sub = ino_of(fs, "main/data/sub")
    data = ino_of(fs, "main/data")
    assert x and sub
    calls: list[tuple[int, bytes]] = []

    def entry(parent: int, name: bytes) -> None:
        calls.append((parent, name))
        if name == b"x":
            raise OSError(errno.ENOENT, "no such name in the kernel")

    w = StampWatch(fs, lambda ino: None, invalidate_entry=entry)
    repo.delete("main", "data/sub/x")
    w.poll_once()
    w.poke(branch="main", removed=[b"data/sub/x"])  # (no thread: the next round takes it)
    w.poll_once()
    assert calls == [(sub, b"x"), (data, b"sub")], calls  # data/ and top stay: they still exist


@pytest.mark.expect_log("a read that could not stage the new files says so once")
def test_a_full_kv_disk_fails_writes_with_enospc_and_reads_go_on(fs, repo, monkeypatch):
    """The refs database's disk full (LMDB's commit, or its redo log, says ENOSPC): a write
    answers ENOSPC, not EIO, and a read that first stages this mount's new files (a listing,
    a lookup) answers without them instead of failing: ``ls`` of the mount root and of the
    directory went EIO while one new file waited for its save."""
    from pathlib import Path

    import lmdb

    from graveler.errors import NoSpace
    from graveler.kv.lmdb import _wrap

    assert isinstance(_wrap(lmdb.Error("mdb_txn_commit: No space left on device"), Path("refs.lmdb")), NoSpace)
    assert errno_for(NoSpace("full")) == errno.ENOSPC
    opened, _ = fs.create(ino_of(fs, "main/data"), b"new.txt", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    fs.write(opened.fh, 0, b"pending")

    def full(*a, **k):
        raise NoSpace("refs.lmdb: cannot write its redo log: No space left on device")

    monkeypatch.setattr(repo, "stage_stamped", full)
    names = [e.name for e, _ in readdir_all(fs, ino_of(fs, "main/data")) if e.name not in (b".", b"..")]
    assert b"a.csv" in names and b"sub" in names
    assert [e.name for e, _ in readdir_all(fs, ino_of(fs, "/"))]  # the mount root lists
    data = ino_of(fs, "main/data")
    assert fs.lookup(data, b"a.csv").size == 8  # another name: found
    assert fs_errno(fs.lookup, data, b"new.txt") == errno.ENOSPC  # that very name: the error, never ENOENT
    assert fs_errno(fs.mkdir, ino_of(fs, "main/data"), b"d", 0o755, ME) == errno.ENOSPC
    monkeypatch.undo()
    fs.flush(opened.fh)
    fs.release(opened.fh)
    assert read_path(fs, "main/data/new.txt") == b"pending"


def test_listing_a_directory_gone_behind_the_mount_is_enoent_not_empty(fs, repo):
    """Found by a training-job exploration: a directory another mount renamed away, listed in the
    instant before the kernel learned of it, came back empty (3-7 listings in 50,000): a state
    the branch never had (`glob` saw an empty dataset). An empty listing of a branch directory
    that is no directory now is ENOENT; an empty directory made by mkdir, and the root of an
    empty branch, list empty as before."""
    from lakefuse.mount.errors import FsError

    d = ino_of(fs, "main/data/sub")
    fh = fs.opendir(d)
    repo.delete("main", "data/sub/x")  # another process (or host) takes the directory away
    with pytest.raises(FsError) as ei:
        fs.readdir_fill(fh, 0)
    assert ei.value.errno == errno.ENOENT
    fs.releasedir(fh)
    main = ino_of(fs, "main")
    e = fs.mkdir(main, b"empty", 0o755, ME).ino
    assert readdir_all(fs, e) == []
    repo.create_branch("bare", "main")  # (from main's commit: the three files, not the staged changes)
    for p in ("data/a.csv", "data/sub/x", "top"):
        repo.delete("bare", p)
    assert readdir_all(fs, ino_of(fs, "bare")) == []


@pytest.mark.parametrize("mode, uid, kept", [
    (0o4755, 1000, 0o755), (0o2755, 1000, 0o755), (0o6755, 1000, 0o755), (0o2745, 1000, 0o2745),
    (0o4755, 0, 0o4755), (0o755, 1000, 0o755)])
def test_an_unprivileged_open_with_o_trunc_clears_set_id_bits_as_ext4(repo, tmp_path, mode, uid, kept):
    """Found by a non-root user's tour: ``: > f`` (open with O_TRUNC, nothing written) kept a
    set-user-ID or group-executable set-group-ID file's bits, where ext4 clears them for any caller
    without CAP_FSETID (the kernel does it for ftruncate and writes, but leaves an atomic O_TRUNC
    open to the daemon); a set-group-ID bit without group-exec, and root's truncation, keep them."""
    with writable_core(repo, tmp_path / "cache") as fs:
        o, attr = fs.create(ino_of(fs, "main"), b"f", 0o644, os.O_WRONLY, ME)
        fs.write(o.fh, 0, b"old")
        fs.release(o.fh)
        fs.setattr(attr.ino, SetAttr(mode=mode))
        o = fs.open(attr.ino, os.O_WRONLY | os.O_TRUNC, False, uid)
        fs.release(o.fh)
        got = fs.getattr(attr.ino)
        assert (stat.S_IMODE(got.mode), got.size) == (kept, 0)
        assert stat.S_IMODE(PosixAttrs.from_metadata(repo.get("main", "f").metadata).mode) == kept


def test_entries_made_in_a_set_group_id_directory_take_its_group(repo, tmp_path):
    """As Linux's ``inode_init_owner``: a file, directory, symlink or FIFO made in a set-group-ID
    directory takes the directory's group (not the caller's), and a new subdirectory keeps the
    bit, so the group passes down; a set-group-ID file made there by a caller outside the group
    loses the bit. Found by a Linux user's tour (ext4 gave gid 4242 and mode 2755; the mount gave
    the caller's group and 755). Elsewhere the caller's group, as before."""
    with writable_core(repo, tmp_path / "cache") as fs:
        main = ino_of(fs, "main")
        d = fs.mkdir(main, b"shared", 0o775, ME).ino
        fs.setattr(d, SetAttr(mode=0o2775, gid=4242))
        made = {
            "file": fs.create(d, b"file", 0o644, os.O_WRONLY, ME),
            "sub": fs.mkdir(d, b"sub", 0o755, ME),
            "link": fs.symlink(d, b"link", b"file", ME),
            "fifo": fs.mknod(d, b"fifo", stat.S_IFIFO | 0o600, ME),
            "setgid": fs.create(d, b"setgid", 0o2755, os.O_WRONLY, ME),
            "setgid-noexec": fs.create(d, b"setgid-noexec", 0o2745, os.O_WRONLY, ME),
        }
        for name, got in made.items():
            if isinstance(got, tuple):
                fs.release(got[0].fh)
                got = got[1]
            attr = fs.getattr(got.ino)
            assert attr.gid == 4242, (name, attr.gid)
            assert attr.uid == 1000
        assert fs.getattr(made["sub"].ino).mode == stat.S_IFDIR | 0o2755
        assert fs.getattr(made["setgid"][1].ino).mode == stat.S_IFREG | 0o755  # (ME is not in group 4242)
        # without group-exec the bit stays (Linux's mode_strip_sgid; a non-root user's tour found it dropped)
        assert fs.getattr(made["setgid-noexec"][1].ino).mode == stat.S_IFREG | 0o2745
        deeper = fs.mkdir(made["sub"].ino, b"deeper", 0o700, ME)
        assert (fs.getattr(deeper.ino).gid, fs.getattr(deeper.ino).mode) == (4242, stat.S_IFDIR | 0o2700)
        plain = fs.mkdir(main, b"plain", 0o755, ME).ino
        o, attr = fs.create(plain, b"f", 0o2755, os.O_WRONLY, ME)
        fs.release(o.fh)
        assert (fs.getattr(attr.ino).gid, fs.getattr(attr.ino).mode) == (100, stat.S_IFREG | 0o2755)


def test_path_limits_494_bytes_for_a_file_493_for_a_directory_and_a_long_file_can_go(repo, tmp_path):
    """A branch path may have 494 bytes (the staging key limit), a directory's 493 (its marker
    adds a "/"). Found by a Linux user's tour: a file's path was refused past 493 too, so a
    494-byte file the CLI had uploaded could be stat'ed through the mount but not removed
    (ENAMETOOLONG), and `rm -rf` failed."""
    from graveler.staging import MAX_PATH_BYTES

    from lakefuse.mount.errors import FsError

    with writable_core(repo, tmp_path / "cache") as fs:
        main = ino_of(fs, "main")
        d = fs.mkdir(fs.mkdir(main, b"d" * 200, 0o755, ME).ino, b"a" * 254, 0o755, ME).ino
        base = "d" * 200 + "/" + "a" * 254 + "/"
        left = MAX_PATH_BYTES - len(base)
        repo.upload("main", base + "u" * left, b"uploaded")  # 494 bytes: the CLI's limit too
        assert fs.lookup(d, b"u" * left).size == 8
        fs.unlink(d, b"u" * left)
        assert repo.exists("main", base + "u" * left) is False
        o, _ = fs.create(d, b"c" * left, 0o644, os.O_WRONLY, ME)
        fs.release(o.fh)
        with pytest.raises(FsError) as e:
            fs.create(d, b"c" * (left + 1), 0o644, os.O_WRONLY, ME)
        assert e.value.errno == errno.ENAMETOOLONG
        with pytest.raises(FsError) as e:
            fs.mkdir(d, b"m" * left, 0o755, ME)
        assert e.value.errno == errno.ENAMETOOLONG
        fs.mkdir(d, b"m" * (left - 1), 0o755, ME)
        with pytest.raises(FsError) as e:
            fs.rename(d, b"m" * (left - 1), d, b"n" * left, 0)
        assert e.value.errno == errno.ENAMETOOLONG
        fs.rename(d, b"c" * left, d, b"r" * left, 0)
    assert repo.read("main", base + "r" * left) == b""


def test_a_commit_request_that_committed_is_not_failed_by_the_tree_read_after_it(repo, tmp_path, monkeypatch):
    """Found by an SRE cutting the KV's connections as a commit moved the head: the branch read
    that follows a control request (the tree's stamp) failed, and the write(2) that ran the
    commit answered EIO, though the commit was made and the read-back said "ok": true (a
    client's retry at close then ran a second request, whose failure replaced the read-back).
    The request's outcome stands; the tree is read again by the next request."""
    from graveler.errors import StoreUnavailable
    from lakefuse.mount.trees import Tree

    with writable_core(repo, tmp_path / "cache") as fs:
        main = ino_of(fs, "main")
        o, _ = fs.create(main, b"new", 0o644, os.O_WRONLY, ME)
        fs.write(o.fh, 0, b"data")
        fs.flush(o.fh)
        fs.release(o.fh)
        ctl = fs.open(ino_of(fs, "main/.lakefuse/commit"), os.O_WRONLY)
        real = Tree.repin

        def cut(self):
            raise StoreUnavailable("the KV's connection was cut")

        monkeypatch.setattr(Tree, "repin", cut)
        assert fs.write(ctl.fh, 0, b"after the cut\n") == len(b"after the cut\n")
        monkeypatch.setattr(Tree, "repin", real)
        fs.flush(ctl.fh)
        fs.release(ctl.fh)
        assert json.loads(fs.read(fs.open(ino_of(fs, "main/.lakefuse/commit"), os.O_RDONLY).fh, 0, 4096))["ok"]
    assert repo.get_commit("main").message == "after the cut" and repo.read("main", "new") == b"data"


def test_a_committed_path_too_long_to_stage_reads_and_refuses_writes_at_open(fs, repo, tmp_path):
    """Found by a tour of odd names: an import takes keys of any length into a commit, but a
    branch stages changes of paths of at most 494 bytes. ``echo more >> FILE`` on such a key was
    acknowledged, read back, and then never saved (retried for ever, the branch's commits refused
    meanwhile). The open for writing is refused (ENAMETOOLONG, as chmod and unlink there are):
    nothing is acknowledged that cannot be saved. Reading it stays as it was."""
    from graveler.spark.importer import import_records_local, imported_value
    from graveler.staging import MAX_PATH_BYTES

    src = tmp_path / "long.txt"
    src.write_bytes(b"imported\n")
    import hashlib
    key = "imp/" + "/".join(["d" * 100] * 5) + "/f.txt"
    short = "imp/short.txt"
    assert len(key) > MAX_PATH_BYTES
    val = imported_value(f"file://{src}", 9, hashlib.md5(b"imported\n").hexdigest(), 1)
    import_records_local(repo, "main", sorted([(key.encode(), val), (short.encode(), val)]), "imp/")
    ino = ino_of(fs, f"main/{key}")
    assert read_path(fs, f"main/{key}") == b"imported\n"
    for flags in (os.O_WRONLY | os.O_APPEND, os.O_RDWR, os.O_WRONLY | os.O_TRUNC):
        assert fs_errno(fs.open, ino, flags) == errno.ENAMETOOLONG
    assert fs_errno(fs.setattr, ino, SetAttr(size=0)) == errno.ENAMETOOLONG  # (truncate(2))
    assert read_path(fs, f"main/{key}") == b"imported\n" and not list(repo.diff_uncommitted("main"))
    o = fs.open(ino_of(fs, f"main/{short}"), os.O_WRONLY | os.O_APPEND)  # (a short key of the same import)
    fs.write(o.fh, 9, b"more\n")
    fs.flush(o.fh)
    fs.release(o.fh)
    assert repo.read("main", short) == b"imported\nmore\n"
    repo.commit("main", "the short one changed")  # (nothing left unsaved holds the branch's commits)


def test_a_readers_close_publishes_no_file_another_handle_is_writing(fs, repo):
    """Found by a concurrency tour: a ``cat`` of a file another process had open for writing staged
    the writer's half-written content at the reader's close -- over a newer upload made through the
    CLI meanwhile, which the other mounts and the CLI then lost until the writer closed. A reader's
    close publishes nothing while a writer holds the file; the writer's own close saves it."""
    w = fs.open(ino_of(fs, "main/top"), os.O_WRONLY | os.O_TRUNC)
    fs.write(w.fh, 0, b"half")
    repo.upload("main", "top", b"newer, by the CLI")  # (another client's save meanwhile)
    r = fs.open(ino_of(fs, "main/top"), os.O_RDONLY)
    assert fs.read(r.fh, 0, 100) == b"half"  # (a reader through the writer's mount sees the writer's bytes)
    if fs.pending(r.fh):
        fs.flush(r.fh)
    fs.release(r.fh)
    assert repo.read("main", "top") == b"newer, by the CLI"
    fs.write(w.fh, 4, b" and whole")
    fs.flush(w.fh)  # the writer's close: last close wins, as across hosts
    fs.release(w.fh)
    assert repo.read("main", "top") == b"half and whole"
    # a reader that is the last to close a file changed through it (fchmod of a read-only descriptor) saves it
    r = fs.open(ino_of(fs, "main/top"), os.O_RDONLY)
    fs.setattr(ino_of(fs, "main/top"), SetAttr(mode=0o100600), fh=r.fh)
    if fs.pending(r.fh):
        fs.flush(r.fh)
    fs.release(r.fh)
    from graveler.objects import PosixAttrs
    assert PosixAttrs.from_metadata(repo.get("main", "top").metadata).mode & 0o777 == 0o600


def test_an_mtime_set_through_a_descriptor_leaves_a_set_atime_and_so_does_a_write(fs, repo):
    """Found by a shell user's tour: GNU ``touch -m`` (an ``O_WRONLY`` open, then ``futimens`` with
    the atime left alone) moved an atime ``touch -a`` had set to the new mtime; ext4 keeps it, and
    keeps it across writes too (a write moves the mtime, not the atime)."""
    ino = ino_of(fs, "main/top")
    fs.setattr(ino, SetAttr(atime_ns=978_307_200_000_000_000))  # touch -a -d 2001-01-01
    w = fs.open(ino, os.O_WRONLY)
    a = fs.setattr(ino, SetAttr(mtime_ns=1_009_843_200_000_000_000), fh=w.fh)  # touch -m -d 2002-01-01
    assert (a.atime_ns, a.mtime_ns) == (978_307_200_000_000_000, 1_009_843_200_000_000_000)
    fs.flush(w.fh)
    fs.release(w.fh)
    a = fs.getattr(ino)
    assert (a.atime_ns, a.mtime_ns) == (978_307_200_000_000_000, 1_009_843_200_000_000_000)
    w = fs.open(ino, os.O_WRONLY | os.O_APPEND)
    fs.write(w.fh, 3, b"more")
    fs.flush(w.fh)
    fs.release(w.fh)
    a = fs.getattr(ino)
    assert a.atime_ns == 978_307_200_000_000_000 and a.mtime_ns > 1_700_000_000_000_000_000
