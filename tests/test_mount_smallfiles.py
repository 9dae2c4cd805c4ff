"""What a small file's close costs, and what the mount answers without reading (no kernel).

A create + write + close through a branch tree is about six FUSE requests; the mount answers
those it can from what it knows on the trio thread: a lookup in a directory it made and alone
changed (its names are known), a directory's attributes after a create in it (the create
staged them), and a create after the kernel's lookup does not look again. Each of these holds
only while every change since was this mount's own: a change made elsewhere (another process,
the CLI) is seen at the next request that reads the branch's stamp, or after
:data:`lakefuse.mount.fs.FRESH_NS` at most. The LMDB side: a close's staging commits without a
sync, a background thread syncs within ``KVConfig.sync_interval``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import time

import pytest

from graveler import kv
from graveler.objects import PosixAttrs
from lakefuse.mount.attrs import Caller
from lakefuse.mount.errors import FsError
from lakefuse.mount.fs import FRESH_NS
from lakefuse.mount.trees import DEFER_NS, HOLE_NS
from tests.graveler_testutil import make_repo
from tests.mount_core_testutil import ino_of, writable_core

ME = Caller(uid=1000, gid=100, umask=0o022)
WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


@pytest.fixture
def repo(tmp_path):
    r = make_repo(tmp_path, "small")
    yield r
    r.close()


def _save(fs, parent: int, name: bytes, data: bytes) -> None:
    """What the kernel sends for open(O_CREAT) + write + close."""
    if not fs.lookup_absent(parent, name):
        with pytest.raises(FsError):
            fs.lookup(parent, name)
    o, _ = fs.create(parent, name, 0o644, WRITE, ME)
    fs.write(o.fh, 0, data)
    fs.flush(o.fh)
    fs.release(o.fh)


def test_lookups_in_a_directory_the_mount_made_need_no_read_until_another_writer_changes_it(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as fs:
        main = ino_of(fs, "main")
        d = fs.mkdir(main, b"d", 0o755, ME).ino
        assert fs.lookup_absent(d, b"a")  # a directory this mount just made: empty, known
        _save(fs, d, b"a", b"first")
        assert not fs.lookup_absent(d, b"a")  # a name it holds: looked up for real
        assert fs.lookup(d, b"a").size == 5
        assert fs.lookup_absent(d, b"b")
        assert not fs.lookup_absent(main, b"zzz")  # the branch root: not made by this mount

        repo.upload("main", "d/b", b"made elsewhere")  # another writer (the stamp moves)
        fs.lookup(main, b"d")  # the next request that reads the stamp sees a change it did not make
        assert not fs.lookup_absent(d, b"b") and not fs.lookup_absent(d, b"c")
        assert fs.lookup(d, b"b").size == len(b"made elsewhere")

        time.sleep(HOLE_NS / 1e9 + 0.05)  # a change no save of this mount explains: another writer's
        fs.lookup(main, b"d")  # (settled at the next stamp read: the mount knows again what it makes)
        d2 = fs.mkdir(main, b"d2", 0o755, ME).ino
        assert fs.lookup_absent(d2, b"x")
        repo.upload("main", "d2/x", b"elsewhere again")
        time.sleep(FRESH_NS / 1e9 + 0.01)  # no request read the stamp: known for FRESH_NS at most
        assert not fs.lookup_absent(d2, b"x")
        assert fs.lookup(d2, b"x").size == len(b"elsewhere again")


def test_a_directory_s_attributes_after_a_create_in_it_are_those_staged(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as fs:
        main = ino_of(fs, "main")
        d = fs.mkdir(main, b"d", 0o750, ME).ino
        before = fs.getattr(d)
        time.sleep(0.002)
        _save(fs, d, b"f", b"x" * 4096)
        fast = fs.getattr_fast(d)  # answered from what the create staged: no read
        assert fast is not None and fast.mtime_ns > before.mtime_ns
        marker = repo.get("main", "d/")  # what the branch holds is what was answered
        pa = PosixAttrs.from_metadata(marker.metadata)
        assert fast.mtime_ns == pa.mtime_ns and stat.S_IMODE(fast.mode) == 0o750

        # a change this mount did not make (a chmod by the CLI): read again at the next request
        md = {**marker.metadata, **PosixAttrs(mode=stat.S_IFDIR | 0o700).to_metadata()}
        repo.stage("main", "d/", dataclasses.replace(marker, metadata=md))
        with pytest.raises(FsError):
            fs.lookup(main, b"nothing")  # a request that reads the stamp (not d's attributes)
        assert fs.getattr_fast(d) is None
        assert stat.S_IMODE(fs.getattr(d).mode) == 0o700


def test_saves_in_a_directory_carry_its_marker_as_staged_last_and_a_change_made_elsewhere(repo, tmp_path):
    """A save stages its directory's marker (new mtime) from the marker this mount staged last,
    without reading it while every change since is the mount's own; a marker changed elsewhere
    (a chmod by the CLI) is read again, and the next save keeps that change."""
    with writable_core(repo, tmp_path / "cache") as fs:
        main = ino_of(fs, "main")
        d = fs.mkdir(main, b"d", 0o750, ME).ino
        last = 0
        for i in range(3):
            time.sleep(0.002)
            _save(fs, d, f"f{i}".encode(), b"x")
            pa = PosixAttrs.from_metadata(repo.get("main", "d/").metadata)
            assert stat.S_IMODE(pa.mode) == 0o750 and (pa.uid, pa.gid) == (ME.uid, ME.gid)
            assert pa.mtime_ns > last
            last = pa.mtime_ns
        marker = repo.get("main", "d/")
        md = {**marker.metadata, **PosixAttrs(mode=stat.S_IFDIR | 0o700, uid=7).to_metadata()}
        repo.stage("main", "d/", dataclasses.replace(marker, metadata=md))
        time.sleep(FRESH_NS / 1e9 + 0.01)  # past what the mount takes as current without a read
        _save(fs, d, b"g", b"y")
        pa = PosixAttrs.from_metadata(repo.get("main", "d/").metadata)
        assert stat.S_IMODE(pa.mode) == 0o700 and pa.uid == 7 and pa.mtime_ns > last
        assert stat.S_IMODE(fs.getattr(d).mode) == 0o700


def test_a_create_after_a_lookup_does_not_look_again_but_a_name_made_meanwhile_is_seen(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as fs:
        main = ino_of(fs, "main")
        d = fs.mkdir(main, b"d", 0o755, ME).ino
        assert fs.lookup_absent(d, b"x")  # the kernel's lookup: nothing there
        repo.upload("main", "d/x/inner", b"a directory made elsewhere meanwhile")
        fs.lookup(main, b"d")  # (any request that reads the stamp)
        with pytest.raises(FsError) as e:  # the create looks again: the stamp moved
            fs.create(d, b"x", 0o644, WRITE | os.O_EXCL, ME)
        assert e.value.errno == errno.EEXIST


def test_an_unsynced_commit_is_synced_within_the_sync_interval(tmp_path):
    """durable=False: visible at once, not synced by its commit (LMDB opened MDB_NOSYNC, the
    redo log not flushed); a background thread checkpoints it within ``sync_interval``; a
    durable write syncs before it returns."""
    p = tmp_path / "s" / "refs.lmdb"
    e = kv.open_env(p, kv.KVConfig(map_size=1 << 20, sync=True, sync_interval=0.2))
    try:
        e.write(lambda t: t.put(kv.STAGING, b"a", b"1"), durable=False)
        assert e._synced_seq < e._commit_seq
        with e.read() as txn:
            assert txn.get(kv.STAGING, b"a") == b"1"
        deadline = time.monotonic() + 10
        while e._synced_seq < e._commit_seq and time.monotonic() < deadline:
            time.sleep(0.05)
        assert e._synced_seq == e._commit_seq
        e.write(lambda t: t.put(kv.STAGING, b"b", b"2"), durable=False)
        e.write(lambda t: t.put(kv.STAGING, b"c", b"3"))  # durable: this and every commit before
        assert e._synced_seq == e._commit_seq
    finally:
        kv.close_env(p)


def test_concurrent_saves_reporting_out_of_order_are_the_mounts_own_and_drop_no_caches(repo, tmp_path):
    """Saves sharing a group-committed transaction report their stamps out of order: each still
    counts as this mount's own, so the stamp watch drops nothing (a drop made 8 writers slower
    than 1: every inode's attributes asked again, every directory's links counted again)."""
    from concurrent.futures import ThreadPoolExecutor

    from lakefuse.mount.watch import StampWatch

    with writable_core(repo, tmp_path / "cache") as fs:
        main = ino_of(fs, "main")
        dropped: list[int] = []
        watch = StampWatch(fs, dropped.append)
        (tree,) = fs.branch_trees()
        s = tree.stamp
        tree.own_change(s + 2)  # reported before s + 1
        assert tree.watched == s
        tree.own_change(s + 1)
        assert tree.watched == s + 2 and not tree.own_ahead

        dirs = [fs.mkdir(main, f"w{w}".encode(), 0o755, ME).ino for w in range(8)]
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda w: [_save(fs, dirs[w], b"f%d" % i, b"x" * 100) for i in range(40)], range(8)))
        assert tree.watched == repo.change_stamp("main")
        watch.poll_once()
        assert tree.foreign == 0 and not dropped

        with tree.own_saving():  # a save under way: one unexplained stamp may be its, for DEFER_NS
            repo.upload("main", "elsewhere", b"made by another writer")
            watch.poll_once()
            assert tree.foreign == 0
            time.sleep(DEFER_NS / 1e9 + 0.01)
            watch.poll_once()  # still unexplained: another writer's
            assert tree.foreign == 1 and dropped
            repo.upload("main", "elsewhere2", b"again")
            repo.upload("main", "elsewhere3", b"and again")
            watch.poll_once()  # more unexplained stamps than saves under way: another writer's at once
            assert tree.foreign == 2
        repo.upload("main", "elsewhere4", b"again")
        watch.poll_once()  # no save of this mount under way: another writer's at once
        assert tree.foreign == 3


def test_attributes_from_an_entry_as_made_are_those_of_its_stored_value():
    """A save's attributes come from the entry (and marker) it just made, not decoded back from
    the stored record: the two must agree, for every kind of entry."""
    from graveler.model import Entry
    from lakefuse.mount.attrs import AttrRules, FsConfig

    class Tree:
        immutable, mtime_ns = False, 5

    for writable in (True, False):
        rules = AttrRules(FsConfig(uid=3, gid=4), writable)
        for md in ({}, PosixAttrs(mode=0o100640, uid=1, gid=2).to_metadata(),
                   {**PosixAttrs(mode=0o100600, mtime_ns=7, atime_ns=9).to_metadata(), "user.x": "y"},
                   PosixAttrs(mode=stat.S_IFLNK | 0o777, symlink="abc").to_metadata(),
                   PosixAttrs(mode=stat.S_IFCHR | 0o600, rdev=259).to_metadata()):
            for modified in (0, 1_700_000_000_123_456_789):
                e = Entry("data/x", 12, "etag", modified, dict(md))
                assert rules.entry_attr(e, Tree) == rules.file_attr(e.to_value(), Tree)
        pa = PosixAttrs(mode=stat.S_IFDIR | 0o750, uid=1, gid=2, mtime_ns=11)
        marker = Entry("data/y", 0, "etag", 12, {"user.a": "b", **pa.to_metadata()})
        decoded = rules.tree_dir_attr(Tree, b"d", marker.to_value())
        rules.marker_made(marker.to_value(), marker, pa)
        assert rules.tree_dir_attr(Tree, b"d", marker.to_value()) == decoded
