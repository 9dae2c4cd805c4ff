"""The write spool (lakefuse.mount.spool), without a kernel: real LMDB, real local store."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import pytest

from graveler.errors import StoreUnavailable
from graveler.objects import PosixAttrs
from lakefuse.mount import sidecar
from lakefuse.mount.spool import Spool, SpoolConfig
from tests.graveler_testutil import make_repo
from tests.mount_testutil import MountProc, needs_fuse, write_across_spool_removal

ATTRS = PosixAttrs(mode=0o100644, uid=0, gid=0)


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path)


@pytest.fixture
def spool(repo, tmp_path):
    sp = Spool(repo, SpoolConfig(tmp_path / "cache", repo.name))
    yield sp
    sp.close()


def test_new_file_is_staged_on_flush_and_spool_copy_dropped_on_release(repo, spool):
    sf = spool.open(1, "main", b"a/new.txt", None, ATTRS, new=True)
    sf.write(0, b"hello ")
    sf.write(6, b"world")
    assert sf.read(0, 100) == b"hello world"
    assert not repo.exists("main", "a/new.txt")  # nothing staged before close/fsync
    e = sf.flush()
    assert e is not None and repo.read("main", "a/new.txt") == b"hello world"
    assert PosixAttrs.from_metadata(repo.get("main", "a/new.txt").metadata).mode == 0o100644
    data = sf.data_path
    spool.release(1)
    assert not data.exists() and spool.get(1) is None
    # a reader of another handle that took the spool file just before that last close reads what
    # was saved (it met the closed descriptor: TypeError, answered EIO -- a stress test's finding)
    assert sf.read(0, 100) == b"hello world" and sf.read(6, 3) == b"wor"


def test_saved_spool_files_lose_their_names_in_the_pools_thread_and_a_later_name_is_never_taken(repo, spool):
    """Found measuring small files on this machine's ext4 (no journal): a create in the spool
    directory, slow after many deletes, held the directory while the save's unlink of an adopted
    spool file's name waited for it, spinning. The pool's thread, which makes the creates, removes
    those names now: within about a second even when nothing else happens, and a file written
    again after its save takes a new name, which the removal still to come never touches."""
    import time

    names = []
    for i in range(3):
        sf = spool.open(10 + i, "main", f"n{i}".encode(), None, ATTRS, new=True)
        sf.write(0, b"x" * (i + 1))
        names.append(sf.data_path)
        assert sf.flush() is not None and spool.stats["adopted"] == i + 1
        spool.release(10 + i)
    t = time.monotonic()
    while any(p.exists() for p in names) and time.monotonic() - t < 5:
        time.sleep(0.02)
    assert not any(p.exists() for p in names) and time.monotonic() - t < 3
    sf = spool.open(20, "main", b"again", None, ATTRS, new=True)
    sf.write(0, b"one")
    first = sf.data_path
    sf.flush()  # adopted: its name is to go
    sf.write(3, b" two")  # copy-on-write: a spool file with a name again
    assert sf.data_path != first
    spool.pool.reap()
    assert not first.exists() and sf.data_path.exists() and sf.read(0, 10) == b"one two"
    assert sf.flush() is not None and repo.read("main", "again") == b"one two"
    spool.release(20)


def test_empty_new_file_is_staged(repo, spool):
    sf = spool.open(1, "main", b"empty", None, ATTRS, new=True)
    sf.flush()
    spool.release(1)
    assert repo.get("main", "empty").size == 0


def test_lazy_copy_in_only_on_first_write(repo, spool):
    repo.upload("main", "f", b"0123456789")
    base = repo.get("main", "f")
    sf = spool.open(7, "main", b"f", base, ATTRS)
    assert not sf.loaded and sf.read(2, 3) == b"234" and spool.stats["copy_in_bytes"] == 0
    assert sf.flush() is None  # nothing changed: nothing uploaded
    sf.write(4, b"XY")
    assert sf.loaded and spool.stats["copy_in_bytes"] == 10
    # a second handle of the same inode reads what the first wrote
    other = spool.open(7, "main", b"f", base, ATTRS)
    assert other is sf and other.read(0, 100) == b"0123XY6789"
    sf.flush()
    assert repo.read("main", "f") == b"0123XY6789"
    spool.release(7)
    spool.release(7)


def test_truncate_to_zero_never_reads_the_base(repo, spool):
    repo.upload("main", "big", b"x" * 100_000)
    sf = spool.open(2, "main", b"big", repo.get("main", "big"), ATTRS)
    sf.truncate(0)
    assert spool.stats["copy_in_bytes"] == 0
    sf.write(0, b"new")
    sf.truncate(5)
    assert sf.read(0, 10) == b"new\0\0"
    sf.flush()
    spool.release(2)
    assert repo.read("main", "big") == b"new\0\0"


def test_attribute_only_change_restages_the_same_object(repo, spool):
    e0 = repo.upload("main", "f", b"abc")
    sf = spool.open(3, "main", b"f", repo.get("main", "f"), ATTRS)
    sf.set_attrs(PosixAttrs(mode=0o100600, uid=5, gid=6, mtime_ns=123))
    e1 = sf.flush()
    spool.release(3)
    assert e1.address == e0.address and spool.stats["uploads"] == 0
    got = PosixAttrs.from_metadata(repo.get("main", "f").metadata)
    assert (got.mode, got.uid, got.gid, got.mtime_ns) == (0o100600, 5, 6, 123)


def test_writes_during_and_after_flush_are_not_lost(repo, spool):
    sf = spool.open(4, "main", b"g", None, ATTRS, new=True)
    sf.write(0, b"one")
    sf.flush()
    sf.write(3, b"two")
    assert sf.dirty
    spool.release(4)  # last close saves what the earlier flush did not
    assert repo.read("main", "g") == b"onetwo"


def test_rename_and_unlink_while_open(repo, spool):
    sf = spool.open(5, "main", b"old", None, ATTRS, new=True)
    sf.write(0, b"x")
    sf.move("main", b"new")
    assert sidecar.read(sf.data_path)["key"] == "new"  # the record recovery reads (the spool's journal)
    sf.flush()
    assert repo.read("main", "new") == b"x" and not repo.exists("main", "old")
    sf.write(1, b"y")
    spool.detach(5)
    sf.write(2, b"z")  # still writable, but saved nowhere
    assert sf.flush() is None
    spool.release(5)
    assert repo.read("main", "new") == b"x"


def test_failed_upload_keeps_the_file_dirty_and_spooled(repo, spool, monkeypatch):
    sf = spool.open(6, "main", b"h", None, ATTRS, new=True)
    sf.write(0, b"precious")

    def boom(*a, **k):
        raise StoreUnavailable("store down")

    monkeypatch.setattr(repo._store, "put_file", boom)
    monkeypatch.setattr(repo._store, "adopt_file", boom)
    with pytest.raises(StoreUnavailable):
        sf.flush()
    assert sf.dirty and not repo.exists("main", "h")
    monkeypatch.undo()
    sf.flush()
    spool.release(6)
    assert repo.read("main", "h") == b"precious"


@pytest.mark.expect_log("recovered spool files are reported as warnings")
def test_recovery_after_a_crash(repo, tmp_path):
    """A killed daemon's leftovers: a saved copy is dropped; unsaved bytes are staged at their
    key (what ext4 shows after a process kill) if the branch still shows what that file last
    knew there, else kept in recovered/ (another writer's newer save is never put under)."""
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    repo.upload("main", "dir/old", b"committed version")
    repo.upload("main", "dir/raced", b"committed version")
    repo.commit("main", "base")
    dead = Spool(repo, cfg)
    saved = dead.open(1, "main", b"dir/saved", None, ATTRS, new=True)
    saved.write(0, b"safe")
    saved.flush()  # acknowledged: staged (the spool file became the stored object)
    # the daemon dies between staging and dropping the spool's name of the file (and its
    # sidecar, as it was written when the spool file was made)
    os.link(repo._store._path(saved.saved.address), saved.data_path)
    acked, saved.saved = saved.saved, None
    saved._write_sidecar()
    saved.saved = acked
    lost = dead.open(2, "main", b"dir/unsaved", None, ATTRS, new=True)
    lost.write(0, b"never closed")
    old = dead.open(3, "main", b"dir/old", repo.get("main", "dir/old"), ATTRS)
    old.write(0, b"COMMITTED")  # an existing file rewritten in place, never closed
    raced = dead.open(4, "main", b"dir/raced", repo.get("main", "dir/raced"), ATTRS)
    raced.write(0, b"stale")
    intent = dead.begin_intent({"op": "rename", "branch": "main", "src": "a/", "dst": "b/"})
    assert intent.exists()
    os.close(dead._lock_fd)  # what kill -9 does to the flock: it goes away
    repo.upload("main", "dir/raced", b"another writer's newer version")  # saved after the crash

    live = Spool(repo, cfg)
    report = live.recover()
    assert {(r.key, r.action) for r in report.files} == {
        ("dir/saved", "saved"), ("dir/unsaved", "staged"), ("dir/old", "staged"), ("dir/raced", "kept")}
    assert repo.read("main", "dir/unsaved") == b"never closed"
    assert repo.read("main", "dir/old") == b"COMMITTED version"
    assert repo.read("main", "dir/raced") == b"another writer's newer version"  # not put under
    kept = report.kept[0]
    assert open(kept.recovered_path, "rb").read() == b"staletted version"
    assert kept.recovered_path.endswith("main/dir/raced") and "another version" in kept.reason
    rep = json.loads(open(os.path.join(report.directory, "REPORT.json")).read())
    assert {(f["key"], f["action"]) for f in rep["files"]} == {
        ("dir/unsaved", "staged"), ("dir/old", "staged"), ("dir/raced", "kept")}
    lines = report.lines()
    # (which does not claim a kill: a save still failing at a clean unmount leaves the same)
    assert any(line.startswith("recovered main/dir/unsaved: 12 bytes the previous mount left unsaved")
               for line in lines), lines
    assert any(line.startswith("NOT recovered main/dir/raced") for line in lines), lines
    assert report.intents == [{"op": "rename", "branch": "main", "src": "a/", "dst": "b/"}]
    assert not dead.dir.exists()
    assert repo.read("main", "dir/saved") == b"safe"
    # a second recovery finds nothing; a live mount's spool is never taken
    other = Spool(repo, cfg)
    f = other.open(1, "main", b"busy", None, ATTRS, new=True)
    f.write(0, b"in use")
    assert live.recover().files == []
    assert f.data_path.exists()
    other.close()
    live.close()


def test_flush_hands_the_spool_file_to_a_local_store_and_later_writes_copy_on_write(repo, spool, monkeypatch):
    """On a local store the spool file becomes the object (linked, not copied) and its spool
    names go (nothing left on disk); the handle keeps reading that file through its
    descriptor, and a later write never modifies that stored object: only then is the
    file copied (in the kernel, nothing read through the store), and the MD5 computed
    while it was written carries on for an append (no second read pass)."""
    sf = spool.open(8, "main", b"cow", None, ATTRS, new=True)
    sf.write(0, b"first ")
    sf.write(6, b"version")
    spool_path = sf.data_path
    ino = os.stat(spool_path).st_ino
    e1 = sf.flush()
    obj1 = repo._store._path(e1.address)
    spool.pool.reap()  # (the names go in the pool's thread)
    assert os.stat(obj1).st_ino == ino and os.stat(obj1).st_nlink == 1  # the same file, no copy
    assert not spool_path.exists() and spool.release_is_inline(8)
    umask = os.umask(0o022)
    os.umask(umask)
    assert os.stat(obj1).st_mode & 0o777 == 0o666 & ~umask  # the mode any put gives
    assert spool.stats["adopted"] == 1 and spool.stats["cow_bytes"] == 0
    assert e1.etag == hashlib.md5(b"first version").hexdigest()  # hashed while written
    assert sf.read(0, 100) == b"first version" and not sf.dirty
    e1b = sf.flush()  # an fsync with nothing new: no copy
    assert e1b is None and spool.stats["cow_bytes"] == 0

    def no_store_read(*a, **k):
        raise AssertionError("the saved object was read back through the store")

    def no_rehash(*a, **k):
        raise AssertionError("the file was hashed again")

    monkeypatch.setattr(repo, "read_entry", no_store_read)
    monkeypatch.setattr(repo._store, "_etag", no_rehash)
    sf.write(13, b", appended")  # after fsync, the same handle writes on: copy-on-write, locally
    assert spool.stats["cow_bytes"] == 13 and spool.stats["copy_in_bytes"] == 0
    assert not spool_path.exists() and sf.data_path != spool_path  # (a new name: the old one may still be going)
    assert os.stat(sf.data_path).st_ino != ino and sidecar.read(sf.data_path)["key"] == "cow"  # a spool file again
    assert sf.read(0, 100) == b"first version, appended"
    assert open(obj1, "rb").read() == b"first version"
    e2 = sf.flush()
    assert e2.etag == hashlib.md5(b"first version, appended").hexdigest()  # hashing carried on
    monkeypatch.undo()
    assert e2.address != e1.address and repo.read("main", "cow") == b"first version, appended"
    sf.set_attrs(PosixAttrs(mode=0o100600, uid=0, gid=0))
    e3 = sf.flush()  # only attributes changed: the same object, restaged
    assert e3.address == e2.address and spool.stats["uploads"] == 2
    sf.truncate(0)  # nothing of the object needs copying
    sf.write(0, b"new")
    assert spool.stats["cow_bytes"] == 13
    assert open(repo._store._path(e2.address), "rb").read() == b"first version, appended"
    e4 = sf.flush()
    spool.release(8)
    assert not spool_path.exists() and repo.read("main", "cow") == b"new"
    assert open(repo._store._path(e4.address), "rb").read() == b"new"
    assert open(obj1, "rb").read() == b"first version" and repo.read_entry(e1) == b"first version"


def test_large_writes_are_hashed_beside_them_and_the_close_waits_for_the_digest(repo, spool, monkeypatch):
    """1 MiB writes in order (hashed in the hashing thread, lakefuse.mount.md5stream) and a small
    tail: the close's etag is the content's MD5, never read back; a write elsewhere drops the
    running hash and the store hashes the file once at the close."""

    def no_rehash(*a, **k):
        raise AssertionError("the file was hashed again")

    data = os.urandom(5 * (1 << 20)) + b"tail"
    sf = spool.open(9, "main", b"big", None, ATTRS, new=True)
    for off in range(0, len(data), 1 << 20):
        sf.write(off, data[off:off + (1 << 20)])
    monkeypatch.setattr(repo._store, "_etag", no_rehash)
    e = sf.flush()
    monkeypatch.undo()
    assert e.etag == hashlib.md5(data).hexdigest() and e.size == len(data)
    spool.release(9)
    sf = spool.open(10, "main", b"holes", None, ATTRS, new=True)
    sf.write(1 << 20, data[:1 << 20])
    sf.write(0, data[1 << 20:2 << 20])  # not in order: hashed once, at the close
    e = sf.flush()
    assert e.etag == hashlib.md5(data[1 << 20:2 << 20] + data[:1 << 20]).hexdigest()
    spool.release(10)
    assert repo.read("main", "big") == data


def test_an_s3_upload_from_the_spool_takes_the_md5_computed_while_written(tmp_path, s3_config, s3_bucket, monkeypatch):
    """On S3 the close uploads the spool file without hashing it again when it was written in
    order (its MD5 computed while written), and hashes it once when it was not."""
    from graveler import objects
    from tests.graveler_testutil import make_graveler

    repo = make_graveler(tmp_path, store=s3_config).create_repository("s3spool", f"s3://{s3_bucket}/ns")
    spool = Spool(repo, SpoolConfig(tmp_path / "cache", repo.name))
    hashed = []
    real = objects.md5_file
    monkeypatch.setattr(objects, "md5_file", lambda p: hashed.append(p) or real(p))
    data = os.urandom(3 << 20)
    sf = spool.open(1, "main", b"inorder", None, ATTRS, new=True)
    for off in range(0, len(data), 1 << 20):
        sf.write(off, data[off:off + (1 << 20)])
    e = sf.flush()
    assert hashed == [] and e.etag == hashlib.md5(data).hexdigest() and e.size == len(data)
    spool.release(1)
    sf = spool.open(2, "main", b"holes", None, ATTRS, new=True)
    sf.write(5, b"tail")
    sf.write(0, b"head!")
    e = sf.flush()
    assert len(hashed) == 1 and e.etag == hashlib.md5(b"head!tail").hexdigest()
    spool.release(2)
    assert repo.read("main", "inorder") == data and repo.read("main", "holes") == b"head!tail"
    spool.close()


def test_a_spool_another_user_could_write_is_refused(repo, tmp_path):
    """Recovery stages what it finds in the spool as a dead mount's unsaved work: a spool
    directory another user made (a --cache-dir under /tmp) or may write would let that user
    put files into the branch. Refused; a private one, or one under a sticky /tmp-like
    directory, is used."""
    import pwd
    import stat as st_

    from graveler.errors import InvalidArgument

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by everyone, no sticky bit
    with pytest.raises(InvalidArgument, match="which another user owns or may rewrite"):
        Spool(repo, SpoolConfig(shared, repo.name))
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o777 | st_.S_ISVTX)  # as /tmp: fine, the spool below is this user's own
    Spool(repo, SpoolConfig(sticky, repo.name)).close()
    planted = tmp_path / "planted"
    (planted / "spool" / repo.name).mkdir(parents=True)
    if os.geteuid() == 0:  # another user's spool directory
        nobody = pwd.getpwnam("nobody")
        os.chown(planted / "spool" / repo.name, nobody.pw_uid, nobody.pw_gid)
    else:
        (planted / "spool" / repo.name).chmod(0o777)
    with pytest.raises(InvalidArgument, match="another user's or writable by others"):
        Spool(repo, SpoolConfig(planted, repo.name))


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a symbolic link of another user (needs root)")
def test_a_spool_reached_through_another_users_link_is_refused(repo, tmp_path):
    """Found by a security review: under a sticky /tmp-like --cache-dir, another user's symbolic
    link named ``spool`` pointing at a directory of root's passed the check (it followed the
    link); that user then pointed the link at a directory of theirs and replaced the mount's
    spool files: root's writes were served and committed with their bytes. Such a link is
    refused, and nothing is made where it points; the same link owned by this user is used."""
    import pwd
    import stat as st_

    from graveler.errors import InvalidArgument

    nobody = pwd.getpwnam("nobody")
    cache = tmp_path / "sticky"
    cache.mkdir()
    cache.chmod(0o777 | st_.S_ISVTX)
    target = tmp_path / "roots"
    target.mkdir(mode=0o755)
    (cache / "spool").symlink_to(target)
    os.lchown(cache / "spool", nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(InvalidArgument, match="symbolic link another user owns"):
        Spool(repo, SpoolConfig(cache, repo.name))
    assert list(target.iterdir()) == []  # nothing made where the link points
    os.lchown(cache / "spool", 0, 0)  # this user's link: only this user may point it elsewhere
    Spool(repo, SpoolConfig(cache, repo.name)).close()
    assert (target / repo.name).is_dir()
    linked_cache = tmp_path / "linked-cache"  # a --cache-dir that is itself this user's link
    linked_cache.symlink_to(cache)
    Spool(repo, SpoolConfig(linked_cache, repo.name)).close()


@needs_fuse
def test_a_spool_directory_removed_under_the_mount_is_made_again_and_nothing_written_is_lost(repo, tmp_path):
    """Found by an operator's tour: with the mount's spool directory removed (``rm -rf`` of the
    cache directory's spool/), every close failed EINVAL ("source file vanished"), those files
    were never saved, and new files failed EIO once the ready-made spool files ran out. Open
    files keep their content in their descriptors: a save copies from there; and the directory
    (its lock and journal) is made again for the files made after."""
    cache = tmp_path / "cache"
    m = MountProc(repo.config.home, repo.name, tmp_path / "mnt", "--cache-dir", str(cache)).start()
    try:
        (m.mountpoint / "main" / "warm.txt").write_bytes(b"warm")
        write_across_spool_removal(m.mountpoint / "main", cache, 60)
        assert repo.read("main", "held.bin") == b"before after"
        assert [repo.read("main", f"n{i}") for i in (0, 59)] == [b"n0", b"n59"]
        assert len([p for p in (cache / "spool" / repo.name).iterdir() if p.is_dir() and not p.name.startswith(".")]) >= 1
        (m.mountpoint / "main" / ".lakefuse" / "commit").write_text("after the removal")
        assert repo.read("main~0", "n59") == b"n59" and not repo.has_uncommitted("main")
    finally:
        m.stop()
    assert "was removed while mounted; made again" in m.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
@pytest.mark.expect_log("a leftover that waits is reported as a warning")
def test_a_leftover_the_full_store_cannot_take_waits_and_no_commit_publishes_it_empty(tmp_path, monkeypatch, caplog):
    """Found by an operator's tour: a file whose save failed because the local store's disk was
    full was, after a restart with the disk still full, moved to ``recovered/`` ("NOT recovered")
    and the records refusing commits went with the dead mount: the next routine commit published
    the file as the branch showed it, 0 bytes. Now it waits in the spool, commits of its branch
    stay refused (from anywhere), and the live mount stages it when the store takes it again."""
    import subprocess

    from graveler.fences import UnsavedWrites
    from lakefuse.mount import recovery

    ns = tmp_path / "ns-full"
    ns.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(ns)], check=True)
    try:
        repo = make_repo(tmp_path, "full")
        repo.upload("main", "big.bin", b"")  # what the create through the mount staged
        cfg = SpoolConfig(tmp_path / "cache", repo.name)  # (another disk than the store's: the save copies)
        dead = Spool(repo, cfg)
        data = os.urandom(5 << 20)
        sf = dead.open(1, "main", b"big.bin", repo.get("main", "big.bin"), ATTRS)
        sf.write(0, data)  # never saved: the store's disk is full (then the daemon stops)
        os.close(dead._lock_fd)
        filler = ns / "filler"
        with open(filler, "wb", buffering=0) as f:  # (unbuffered: nothing left to write at close)
            with pytest.raises(OSError):
                while True:
                    f.write(b"\0" * (1 << 20))
        live = Spool(repo, cfg)
        report = live.recover()
        assert [(r.key, r.action) for r in report.files] == [("big.bin", "waiting")]
        assert any(line.startswith("NOT recovered yet main/big.bin") and "refused" in line
                   for line in report.lines()), report.lines()
        assert sf.data_path.exists() and repo.read("main", "big.bin") == b""
        with pytest.raises(UnsavedWrites):
            repo.commit("main", "nightly")  # (was: committed, big.bin empty)
        # healthy: the next round once the store has room stages it, and commits go through
        monkeypatch.setattr(recovery, "RETRY_S", 0.0)
        retry = recovery.RecoveryRetry(live.recover)
        retry.after(report)
        retry.tick()  # the store still full: it waits again
        deadline = time.monotonic() + 10
        while retry._busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert repo.read("main", "big.bin") == b"" and sf.data_path.exists()
        waits = [r for r in caplog.records if r.levelno >= logging.WARNING and "big.bin" in r.getMessage()
                 and "wait in" in r.getMessage()]
        assert len(waits) == 1, waits  # said once, not at every round (every 30 s, for as long as it waits)
        filler.unlink()
        retry.tick()
        while repo.read("main", "big.bin") != data and time.monotonic() < deadline:
            time.sleep(0.05)
        assert repo.read("main", "big.bin") == data and not dead.dir.exists()
        repo.commit("main", "nightly")
        retry.tick()  # nothing waits any more: no round
        assert not retry._busy
        live.close()
        repo.close()
    finally:
        subprocess.run(["umount", "-l", str(ns)], check=False)
