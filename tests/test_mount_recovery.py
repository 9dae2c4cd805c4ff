"""After ``kill -9`` of the daemon, a file being written holds what was written to it.

The ext4 answer to a process kill: the next mount's spool recovery stages the bytes a
killed daemon had been given for a file whose close never returned (if the branch still
shows what that file last knew at its path), and ``lakefuse mount`` says on its terminal
what it recovered. Real mounts, a real local store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import lakefuse.mount.spool as spool_mod
from graveler.config import GravelerConfig
from graveler.errors import NotFound, StoreUnavailable
from graveler.home import Graveler
from graveler.objects import PosixAttrs
from lakefuse.mount.spool import RECOVERED_DIR, Spool, SpoolConfig
from tests.graveler_testutil import make_repo
from tests.mount_testutil import MountProc, force_unmount, lakefuse_cmd, needs_fuse

REPO = "rec"
MiB = 1 << 20

_WRITER = r"""
import os, sys
path, n, off = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
flags = os.O_WRONLY | (os.O_CREAT | os.O_TRUNC if off == 0 else 0)
fd = os.open(path, flags, 0o644)
data = bytes(range(256)) * (n // 256)
done = 0
while done < n:
    done += os.pwrite(fd, data[done:done + (1 << 20)], off + done)
print("written", flush=True)
sys.stdin.read()  # holds the file open (never closed: the daemon dies first)
"""


def pattern(n: int) -> bytes:
    return bytes(range(256)) * (n // 256)


class Writer:
    """A process that writes ``n`` bytes at ``off`` of a file through the mount and keeps
    it open: the daemon was given the bytes; no close or fsync returned."""

    def __init__(self, path: Path, n: int, off: int = 0):
        self.proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(n), str(off)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "written", self.proc.stderr.read()

    def end(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


def open_repo(home: Path):
    g = Graveler(GravelerConfig.from_home(home))
    return g, g.repository(REPO)


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    g = Graveler(GravelerConfig.from_home(h))
    r = g.create_repository(REPO, f"file://{h}/ns")
    r.upload("main", "old.bin", b"o" * (2 * MiB))
    r.upload("main", "raced.txt", b"committed version")
    r.commit("main", "base")
    g.close()
    return h


@needs_fuse
@pytest.mark.expect_log("the recovery is reported as a warning")
def test_kill_9_mid_write_then_remount_stages_what_was_written_and_says_so(home, tmp_path):
    """Defect: a file being written when the daemon was killed (``cp`` of a big file,
    kill -9, remount) was staged as 0 bytes, its written prefix only in
    ``spool/.../recovered/``; the next commit published it empty. Now: a new file and an
    existing file rewritten in place hold what was written before the kill, staged by
    the next mount, which names them on its terminal; a file another writer saved
    meanwhile keeps that newer version and the stale bytes stay in ``recovered/``."""
    mp, cache = tmp_path / "m", tmp_path / "cache"
    m = MountProc(home, REPO, mp, "--cache-dir", str(cache), "--branch-timeout", "0.2").start()
    writers = []
    try:
        writers.append(Writer(mp / "main" / "big.bin", 24 * MiB))  # cp of a big file, cut short
        writers.append(Writer(mp / "main" / "old.bin", MiB, off=MiB // 2))  # an existing file, rewritten in place
        writers.append(Writer(mp / "main" / "raced.txt", 4096))
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait(10)
    finally:
        for w in writers:
            w.end()
        m.stop()
    g, r = open_repo(home)
    try:
        # created, not saved: its create is staged with its first save (or empty, if the mount
        # staged it first for a read of the branch): nothing of what was written, until recovery
        assert not r.exists("main", "big.bin") or r.get("main", "big.bin").size == 0
        r.upload("main", "raced.txt", b"another writer's newer version")  # saved while the daemon was down
    finally:
        g.close()

    mp.mkdir(exist_ok=True)
    cmd = lakefuse_cmd(home, "mount", f"lakefs://{REPO}", str(mp), "--cache-dir", str(cache),
                       "--log", str(tmp_path / "d.log"))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    try:
        assert out.returncode == 0, out.stderr
        err = out.stderr
        assert "recovered main/big.bin: 25165824 bytes" in err, err
        assert "recovered main/old.bin: 2097152 bytes" in err, err
        assert "NOT recovered main/raced.txt" in err and "another version" in err, err
        assert (mp / "main" / "big.bin").read_bytes() == pattern(24 * MiB)
        old = (mp / "main" / "old.bin").read_bytes()
        assert old == b"o" * (MiB // 2) + pattern(MiB) + b"o" * (MiB // 2)
        assert (mp / "main" / "raced.txt").read_bytes() == b"another writer's newer version"
        (mp / "main" / ".lakefuse" / "commit").write_text("after the crash\n")
    finally:
        u = subprocess.run(lakefuse_cmd(home, "umount", str(mp)), capture_output=True, text=True, timeout=60)
        force_unmount(mp)
    assert u.returncode == 0, u.stderr
    g, r = open_repo(home)
    try:
        assert r.read("main", "big.bin") == pattern(24 * MiB)  # committed with what was written
        assert r.read("main", "raced.txt") == b"another writer's newer version"
    finally:
        g.close()
    (kept,) = [p for p in (cache / "spool" / REPO / RECOVERED_DIR).rglob("raced.txt")]
    assert kept.read_bytes() == pattern(4096)


def test_a_daemon_killed_during_a_copy_in_leaves_nothing_to_stage(tmp_path, monkeypatch):
    """False positive: a write to an existing file copies its saved content into the spool
    first; a daemon killed DURING that copy left a partial copy of the saved file, which
    recovery would stage as the file's content (truncating a healthy file). The copy is
    made under another name and renamed once whole; recovery ignores it."""
    repo = make_repo(tmp_path)
    repo.upload("main", "big", b"0123456789" * 10)
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    dead = Spool(repo, cfg)
    monkeypatch.setattr(spool_mod, "_COPY_CHUNK", 30)
    real_read = repo.read_entry
    seen = {}

    def read_entry(entry, off, n):
        if off > 0 and "report" not in seen:  # the daemon dies here, part way through the copy
            seen["data"] = sf.data_path.exists()
            os.close(dead._lock_fd)
            seen["report"] = Spool(repo, cfg).recover()
            raise StoreUnavailable("the daemon is gone")
        return real_read(entry, off, n)

    monkeypatch.setattr(repo, "read_entry", read_entry)
    sf = dead.open(1, "main", b"big", repo.get("main", "big"), PosixAttrs(mode=0o100644))
    with pytest.raises(StoreUnavailable):
        sf.write(50, b"X")
    monkeypatch.undo()
    assert seen["data"] is False and seen["report"].files == []
    assert repo.read("main", "big") == b"0123456789" * 10


@pytest.mark.expect_log("the recovery is reported as a warning")
def test_recovery_stages_a_file_renamed_while_written_at_its_new_name(tmp_path):
    """False positive: a file renamed while open (``mv`` of a file a program writes: the
    rename restages its entry with a new ctime), then the daemon killed: the branch shows
    at the new name another entry than the file was opened with, which recovery would take
    for another writer's save and keep the bytes out. The rename moves the expectation."""
    import stat

    from lakefuse.mount.writes import Caller, WritableFilesystem
    from tests.mount_core_testutil import ino_of

    repo = make_repo(tmp_path)
    repo.upload("main", "d/old", b"base content")
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    fs = WritableFilesystem(repo, spool=Spool(repo, cfg))
    me = Caller(uid=1000, gid=100)
    d = ino_of(fs, "main/d")
    opened, _ = fs.create(d, b"new", stat.S_IFREG | 0o644, os.O_WRONLY, me)
    fs.write(opened.fh, 0, b"written, never closed")
    existing = fs.open(ino_of(fs, "main/d/old"), os.O_WRONLY)
    fs.write(existing.fh, 0, b"BASE")
    fs.rename(d, b"new", d, b"renamed", 0)
    fs.rename(d, b"old", d, b"moved", 0)
    os.close(fs.spool._lock_fd)  # kill -9: nothing closed, nothing saved
    report = Spool(repo, cfg).recover()
    assert sorted((r.key, r.action) for r in report.files) == [("d/moved", "staged"), ("d/renamed", "staged")]
    assert repo.read("main", "d/renamed") == b"written, never closed"
    assert repo.read("main", "d/moved") == b"BASE content"
    assert not repo.exists("main", "d/new") and not repo.exists("main", "d/old")


@pytest.mark.expect_log("the kept file is reported as a warning")
def test_a_leftover_raced_at_staging_is_kept_as_a_file_of_its_own(tmp_path, monkeypatch):
    """Recovery hands a leftover to a local store (linked, not copied) before its
    compare-and-set; another writer saving the path in between makes that fail: the bytes
    kept in recovered/ must be a file of their own, not another name of the stored object."""
    repo = make_repo(tmp_path)
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    dead = Spool(repo, cfg)
    sf = dead.open(1, "main", b"f", None, PosixAttrs(mode=0o100644), new=True)
    sf.write(0, b"unsaved")
    os.close(dead._lock_fd)
    monkeypatch.setattr(repo, "stage_if", lambda *a, **k: False)  # lost the race to another writer
    report = Spool(repo, cfg).recover()
    (kept,) = report.kept
    assert "another version" in kept.reason and os.stat(kept.recovered_path).st_nlink == 1
    assert open(kept.recovered_path, "rb").read() == b"unsaved"


@pytest.mark.expect_log("the recovered file is reported as a warning")
def test_a_sparse_terabyte_saves_and_recovers_in_seconds(tmp_path):
    """A file written out of order is hashed when it is saved. ``truncate -s 1T`` with three
    bytes at its end is hashed by parts, holes unread (graveler.objects.file_etag): its close
    takes seconds, not the half hour an MD5 over a terabyte of zeros took (both save threads
    of a local store held meanwhile), and so does a killed daemon's recovery of such a file."""
    import stat
    import time

    from lakefuse.mount.writes import Caller, WritableFilesystem
    from tests.mount_core_testutil import ino_of

    repo = make_repo(tmp_path)
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    fs = WritableFilesystem(repo, spool=Spool(repo, cfg))
    me = Caller(uid=1000, gid=100)
    main = ino_of(fs, "main")
    size = (1 << 40) + 3
    t = time.monotonic()
    opened, _ = fs.create(main, b"huge", stat.S_IFREG | 0o644, os.O_WRONLY, me)
    fs.write(opened.fh, 1 << 40, b"END")
    fs.flush(opened.fh)
    fs.release(opened.fh)
    e = repo.get("main", "huge")
    assert e.size == size and e.etag.endswith("-8193") and time.monotonic() - t < 30
    assert repo.read_entry(e, 1 << 40, 3) == b"END" and repo.read_entry(e, 5 << 30, 8) == bytes(8)
    opened, _ = fs.create(main, b"huge2", stat.S_IFREG | 0o644, os.O_WRONLY, me)
    fs.write(opened.fh, 1 << 40, b"end")
    os.close(fs.spool._lock_fd)  # kill -9: nothing closed, nothing saved
    t = time.monotonic()
    report = Spool(repo, cfg).recover()
    # ("huge", saved, may still have had its spool name, which goes after the save: found saved, dropped)
    assert [(r.key, r.action) for r in report.files if r.action != "saved"] == [("huge2", "staged")]
    assert time.monotonic() - t < 30
    e2 = repo.get("main", "huge2")
    assert e2.size == size and e2.etag.endswith("-8193") and e2.etag != e.etag
    assert repo.read_entry(e2, 1 << 40, 3) == b"end"


def _dir_rename_core(tmp_path):
    from lakefuse.mount.writes import WritableFilesystem

    repo = make_repo(tmp_path)
    deep = "X/" + "y" * 200 + "/" + "z" * 200 + "/f"
    repo.upload("main", deep, b"deep")
    for i in range(4):
        repo.upload("main", f"X/f{i}", b"%d" % i)
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    return repo, cfg, WritableFilesystem(repo, spool=Spool(repo, cfg)), deep


def test_a_directory_rename_that_fails_leaves_nothing_for_recovery_to_replay(tmp_path):
    """Defect: a directory rename refused (a path below it would pass the limit) answered EINVAL
    and left its intent in the spool; after a kill -9 the next mount "finished" it, moving what
    the user had put at the old name since. Now: ENAMETOOLONG before anything is written, and
    the branch and the spool as they were."""
    import errno

    from lakefuse.mount.errors import errno_for
    from tests.mount_core_testutil import ino_of

    repo, cfg, fs, deep = _dir_rename_core(tmp_path)
    root = ino_of(fs, "main")
    before = sorted(it.path for it in repo.list("main", b"", delimiter=b""))
    with pytest.raises(Exception) as exc:
        fs.rename(root, b"X", root, b"n" * 100, 0)
    assert errno_for(exc.value) == errno.ENAMETOOLONG, exc.value
    assert sorted(it.path for it in repo.list("main", b"", delimiter=b"")) == before
    assert not list((tmp_path / "cache").rglob("*.intent"))
    repo.upload("main", "X/keep.txt", b"still at X")
    os.close(fs.spool._lock_fd)  # kill -9
    report = Spool(repo, cfg).recover()
    assert report.intents == []
    assert repo.read("main", "X/keep.txt") == b"still at X" and repo.read("main", deep) == b"deep"


def test_a_directory_rename_that_moved_no_key_leaves_nothing_to_finish_and_says_nothing(tmp_path, monkeypatch):
    """Found by an ETL team's tour with two mounts renaming one directory at once: the rename that
    lost (its batch moved no key: the other had taken them) logged an ERROR "failed after 0 keys
    moved: the next mount finishes it" and kept its intent, with nothing to finish. A rename that
    moved no key leaves no intent, and logs no error (the test fails on any ERROR line)."""
    import lakefuse.mount.renames as renames_mod
    from tests.mount_core_testutil import ino_of

    repo, cfg, fs, deep = _dir_rename_core(tmp_path)
    root = ino_of(fs, "main")

    def lost(repo_, branch, src, dst, batch, first, staged):
        staged(0)  # a batch's transaction that found nothing left to move
        raise NotFound(f"{src!r} is gone from branch {branch!r}")

    monkeypatch.setattr(renames_mod, "rename_prefix", lost)
    with pytest.raises(Exception):
        fs.rename(root, b"X", root, b"Y", 0)
    assert not list((tmp_path / "cache").rglob("*.intent"))


@pytest.mark.expect_log("the half-done rename is reported as an error")
def test_a_directory_rename_cut_short_after_a_batch_is_finished_by_the_next_mount(tmp_path, monkeypatch):
    """A rename whose KV fails between batches keeps its intent (the directory is half moved:
    recovery finishes it); one whose first transaction fails leaves none."""
    import lakefuse.mount.renames as renames_mod
    from tests.mount_core_testutil import ino_of

    monkeypatch.setattr(renames_mod, "DIR_RENAME_BATCH", 2)
    repo, cfg, fs, deep = _dir_rename_core(tmp_path)
    root = ino_of(fs, "main")
    orig, calls = repo.stage_many, []

    def failing(at):
        def stage_many(branch, items, *a, **kw):
            calls.append(len(items))
            if len(calls) == at:
                raise StoreUnavailable("the KV went away")
            return orig(branch, items, *a, **kw)
        return stage_many

    monkeypatch.setattr(repo, "stage_many", failing(1))
    with pytest.raises(StoreUnavailable):
        fs.rename(root, b"X", root, b"W", 0)
    assert not list((tmp_path / "cache").rglob("*.intent")) and repo.exists("main", deep)

    calls.clear()
    monkeypatch.setattr(repo, "stage_many", failing(2))
    with pytest.raises(StoreUnavailable):
        fs.rename(root, b"X", root, b"W", 0)
    assert len(list((tmp_path / "cache").rglob("*.intent"))) == 1
    monkeypatch.setattr(repo, "stage_many", orig)
    from graveler.fences import BranchBusy

    with pytest.raises(BranchBusy, match="cut short"):  # no commit takes the half-moved directory meanwhile
        repo.commit("main", "half a rename")
    os.close(fs.spool._lock_fd)  # kill -9
    from lakefuse.mount.writes import WritableFilesystem

    WritableFilesystem(repo, spool=Spool(repo, cfg)).writes.recover()  # the next mount
    assert sorted(it.path for it in repo.list("main", b"X/", delimiter=b"")) == []
    assert repo.read("main", "W" + deep[1:]) == b"deep"
    assert repo.fence_of("main") is None
    assert repo.exists(repo.commit("main", "the whole rename").id, "W" + deep[1:])


@pytest.mark.expect_log("the half-done rename is reported as an error")
@pytest.mark.parametrize("discard", ["reset", "delete and create"])
def test_a_cut_short_rename_that_was_discarded_is_not_replayed_by_the_next_mount(tmp_path, monkeypatch, discard):
    """Found by a multi-host tour: a rename cut short, then discarded (``branch reset``, or the
    branch deleted and made again), was replayed by the next mount of the host that made it:
    the discarded half-rename came back, on the new branch too. The next mount replays a rename
    only while its fence stands."""
    import lakefuse.mount.renames as renames_mod
    from tests.mount_core_testutil import ino_of

    monkeypatch.setattr(renames_mod, "DIR_RENAME_BATCH", 2)
    repo, cfg, fs, deep = _dir_rename_core(tmp_path)
    repo.commit("main", "X")
    root = ino_of(fs, "main")
    if discard == "delete and create":  # (main cannot be deleted: the same on another branch)
        repo.create_branch("dev", "main")
        root = ino_of(fs, "dev")
    branch = "dev" if discard == "delete and create" else "main"
    before = sorted(it.path for it in repo.list(branch, b"", delimiter=b""))
    orig, calls = repo.stage_many, []

    def stage_many(b, items, *a, **kw):
        calls.append(len(items))
        if len(calls) == 2:
            raise StoreUnavailable("the KV went away")
        return orig(b, items, *a, **kw)

    monkeypatch.setattr(repo, "stage_many", stage_many)
    with pytest.raises(StoreUnavailable):
        fs.rename(root, b"X", root, b"W", 0)
    monkeypatch.setattr(repo, "stage_many", orig)
    assert repo.fence_of(branch)["cut"] and len(list((tmp_path / "cache").rglob("*.intent"))) == 1
    if discard == "reset":
        repo.reset(branch)
    else:
        repo.delete_branch(branch)
        repo.create_branch(branch, "main")
    os.close(fs.spool._lock_fd)  # kill -9
    from lakefuse.mount.writes import WritableFilesystem

    WritableFilesystem(repo, spool=Spool(repo, cfg)).writes.recover()  # the next mount
    assert sorted(it.path for it in repo.list(branch, b"", delimiter=b"")) == before  # nothing came back
    assert not repo.has_uncommitted(branch) and repo.fence_of(branch) is None


def test_saved_versions_whose_names_the_pool_had_not_removed_are_dropped_as_saved(tmp_path, monkeypatch):
    """Found by an embedded-database user's tour: a daemon killed within a second of a few
    saves (before the pool's thread removed the names of the spool files a local store had
    taken as objects) left those names, and the next mount announced a saved -- even
    committed -- version as "NOT recovered ... another writer or host" and moved it into
    recovered/ as another name of the committed object: editing that "copy" changed the commit.
    Each save now notes itself in the journal before its name is left to the pool's thread."""
    repo = make_repo(tmp_path)
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    dead = Spool(repo, cfg)
    monkeypatch.setattr(dead.pool, "discard", lambda name, then: None)  # killed before the pool's thread ran
    sf = dead.open(1, "main", b"f.bin", None, PosixAttrs(mode=0o100644), new=True)
    sf.write(0, b"AAAA")
    assert sf.flush() is not None
    c1 = repo.commit("main", "c1")
    sf.truncate(0)  # printf BBBB > f.bin
    sf.write(0, b"BBBB")
    assert sf.flush() is not None
    left = [p for p in dead.dir.glob("*.data") if p.stat().st_nlink == 2]  # the store's objects' other names
    assert len(left) == 2  # (beside the pool's empty files made ahead)
    os.close(dead._lock_fd)
    report = Spool(repo, cfg).recover()
    assert [(r.key, r.action) for r in report.files] == [("f.bin", "saved")] * 2 and report.kept == []
    assert repo.read("main", "f.bin") == b"BBBB" and repo.read(c1.id, "f.bin") == b"AAAA"
    assert not any(p.exists() for p in left) and not (cfg.root / RECOVERED_DIR).exists()


@pytest.mark.expect_log("the kept file is reported as a warning")
def test_a_kept_leftover_the_store_took_as_an_object_is_kept_as_a_file_of_its_own(tmp_path, monkeypatch):
    """A leftover a local store had linked in as an object when the daemon died, its save not
    staged, and the branch showing another writer's version since: it is kept in recovered/ as a
    file of its own (it was moved there as another name of the stored object)."""
    repo = make_repo(tmp_path)
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    dead = Spool(repo, cfg)
    sf = dead.open(1, "main", b"f", None, PosixAttrs(mode=0o100644), new=True)
    sf.write(0, b"linked, never staged")

    def stage_stamped(*a, **k):
        raise StoreUnavailable("the daemon died between the object and its staging")

    monkeypatch.setattr(repo, "stage_stamped", stage_stamped)
    with pytest.raises(StoreUnavailable):
        sf.flush()
    monkeypatch.undo()
    assert [p for p in dead.dir.glob("*.data") if p.stat().st_nlink == 2]  # linked in as an object
    repo.upload("main", "f", b"another writer's")
    os.close(dead._lock_fd)
    report = Spool(repo, cfg).recover()
    (kept,) = report.kept
    assert "another version" in kept.reason and os.stat(kept.recovered_path).st_nlink == 1
    assert open(kept.recovered_path, "rb").read() == b"linked, never staged"
    assert repo.read("main", "f") == b"another writer's"


@pytest.mark.expect_log("the recoveries are reported as warnings")
def test_recovery_stages_a_killed_writers_file_with_the_attributes_it_had(tmp_path):
    """Found by a crash-consistency tester: a new file written but not closed came back 0644 and
    owned by the daemon's user (a user's 0600 file world-readable, and no longer theirs to write),
    and a chmod, chown, utimens or setxattr that had returned on a file open with unsaved writes
    was lost at a kill -9 (recovery took the attributes of the entry the file replaced). The spool's
    record of a file says what its next save stages besides the bytes; recovery stages that."""
    import stat

    from graveler.objects import PosixAttrs as PA
    from lakefuse.mount.attrs import SetAttr
    from lakefuse.mount.writes import Caller, WritableFilesystem
    from tests.mount_core_testutil import ino_of

    repo = make_repo(tmp_path)
    repo.upload("main", "d/old", b"saved content")
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    fs = WritableFilesystem(repo, spool=Spool(repo, cfg))
    user = Caller(uid=1000, gid=1000)
    d = ino_of(fs, "main/d")
    old_ino = ino_of(fs, "main/d/old")
    held = fs.open(old_ino, os.O_WRONLY | os.O_APPEND)
    fs.write(held.fh, 13, b" and more")
    fs.setattr(old_ino, SetAttr(mode=0o600, uid=1234, gid=4321, mtime_ns=10**18))
    fs.setxattr(old_ino, b"user.x", b"1")
    # last: nothing reads the branch after it (which would stage the new file, with its attributes)
    new, _ = fs.create(d, b"secret", stat.S_IFREG | 0o600, os.O_WRONLY | os.O_EXCL, user)  # (umask applied)
    fs.write(new.fh, 0, b"private")
    assert not repo.exists("main", "d/secret")
    os.close(fs.spool._lock_fd)  # kill -9: nothing closed, nothing saved
    report = Spool(repo, cfg).recover()
    assert sorted((r.key, r.action) for r in report.files) == [("d/old", "staged"), ("d/secret", "staged")]
    secret = repo.get("main", "d/secret")
    assert repo.read("main", "d/secret") == b"private"
    pa = PA.from_metadata(secret.metadata)
    assert (pa.mode, pa.uid, pa.gid) == (stat.S_IFREG | 0o600, 1000, 1000)
    old = repo.get("main", "d/old")
    assert repo.read("main", "d/old") == b"saved content and more"
    pa = PA.from_metadata(old.metadata)
    assert (pa.mode, pa.uid, pa.gid, pa.mtime_ns) == (stat.S_IFREG | 0o600, 1234, 4321, 10**18)
    assert old.metadata[xattrs_key(b"user.x")] == "t:1"


def xattrs_key(name: bytes) -> str:
    from lakefuse.mount.xattrs import key_of

    return key_of(name)
