"""Spool recovery at mount start never takes HEALTHY state for a dead daemon's leftovers.

``Spool.recover`` (run by every ``lakefuse mount`` before it answers) moves what a
killed daemon left in ``<cache>/spool/<repo>/`` to ``recovered/`` and reports it as
unsaved work, and finishes the directory renames it left half done. Each test here
builds a state made by ORDINARY use -- a live mount, a mount starting at the same
moment, a save that close/fsync acknowledged, a clean unmount, another repository
of the same name sharing the cache directory -- and checks that recovery leaves it
alone: telling a user that saved work is lost (or re-running an operation on a
repository it never belonged to) is as bad as losing it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import lakefuse.mount.spool as spool_mod
from graveler.config import GravelerConfig
from graveler.errors import StoreUnavailable
from graveler.home import Graveler
from graveler.objects import PosixAttrs
from lakefuse.mount.spool import RECOVERED_DIR, Spool, SpoolConfig
from lakefuse.mount.writes import WritableFilesystem
from tests.graveler_testutil import make_repo
from tests.mount_testutil import MountProc, needs_fuse

ATTRS = PosixAttrs(mode=0o100644, uid=0, gid=0)
REPO = "data"


# ------------------------------------------------------------------ helpers


def open_home(home: Path) -> Graveler:
    return Graveler(GravelerConfig.from_home(home))


def spool_root(cache: Path, repo: str = REPO) -> Path:
    return cache / "spool" / repo


def spool_data(cache: Path, repo: str = REPO) -> list[Path]:
    """The content files of every mount instance (recovered/ excluded; not the empty ones a
    live mount made ahead for new files: lakefuse.mount.spoolpool)."""
    root = spool_root(cache, repo)
    return sorted(p for p in root.glob("*/*.data") if p.parent.name != RECOVERED_DIR and _holds_bytes(p))


def _holds_bytes(p: Path) -> bool:
    try:
        return p.stat().st_size > 0
    except FileNotFoundError:
        return False


def recovered(cache: Path, repo: str = REPO) -> list[Path]:
    d = spool_root(cache, repo) / RECOVERED_DIR
    return sorted(p for p in d.rglob("*") if p.is_file()) if d.exists() else []


def mount(home: Path, repo: str, mp: Path, cache: Path) -> MountProc:
    return MountProc(home, repo, mp, "--cache-dir", str(cache), "--branch-timeout", "0.2")


def read_eventually(path: Path, want: bytes, timeout: float = 3.0) -> bytes:
    deadline = time.monotonic() + timeout
    got = b""
    while time.monotonic() < deadline:
        try:
            got = path.read_bytes()
        except FileNotFoundError:
            got = b"<missing>"
        if got == want:
            break
        time.sleep(0.1)
    return got


def kill_9(m: MountProc) -> None:
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait(10)


_HOLDER = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
os.write(fd, sys.argv[2].encode())
print("written", flush=True)
sys.stdin.read()  # holds the file open until told
os.close(fd)
print("closed", flush=True)
"""


class Holder:
    """A process that writes a file through the mount and keeps it open (not saved)
    until :meth:`close`. Not this process: its fork+exec of another mount daemon
    would close an inherited descriptor -- a FUSE flush, which saves the file."""

    def __init__(self, path: Path, data: bytes):
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), data.decode()],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "written"

    def close(self) -> None:
        if self.proc.poll() is None:
            out, _ = self.proc.communicate("", timeout=30)
            assert out.strip() == "closed"


def no_unsaved_warning(m: MountProc) -> None:
    log = m.log()
    assert "unsaved" not in log and "Traceback" not in log, log


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    """home1: repositories ``data`` and ``other``; home2: ANOTHER repository also named ``data``."""
    out = {}
    for h, names in (("home1", (REPO, "other")), ("home2", (REPO,))):
        home = tmp_path_factory.mktemp(h)
        g = open_home(home)
        for name in names:
            r = g.create_repository(name, f"file://{home}/ns-{name}")
            r.upload("main", "dir/x.txt", f"{h} {name} x".encode())
            r.upload("main", "keep/a.txt", f"{h} {name} a".encode())
            r.upload("main", "keep/empty", b"")
            r.upload("main", "untouched/y.txt", f"{h} {name} y".encode())
            r.commit("main", "base")
        g.close()
        out[h] = home
    return out


# ------------------------------------------------------------------ real mounts


@needs_fuse
def test_second_mount_and_other_repository_leave_a_live_mounts_spool_alone(homes, tmp_path):
    """False positive: the spool file of a LIVE daemon (a file open and written, not yet
    closed) taken for a dead daemon's leftover by a second mount of the same repository,
    or by a mount of another repository, sharing the cache directory."""
    h, cache = homes["home1"], tmp_path / "cache"
    with mount(h, REPO, tmp_path / "a", cache) as a:
        f = Holder(tmp_path / "a" / "main" / "live.txt", b"unsaved but live")  # in A's spool, not saved yet
        try:
            (live,) = spool_data(cache)
            with mount(h, REPO, tmp_path / "b", cache) as b, mount(h, "other", tmp_path / "c", cache) as c:
                assert spool_data(cache) == [live] and live.read_bytes() == b"unsaved but live"
                assert recovered(cache) == [] and recovered(cache, "other") == []
                f.close()  # A saves it; B sees it
                assert read_eventually(tmp_path / "b" / "main" / "live.txt", b"unsaved but live") == b"unsaved but live"
                no_unsaved_warning(b)
                no_unsaved_warning(c)
        finally:
            f.close()
        no_unsaved_warning(a)
    assert spool_data(cache) == [] and recovered(cache) == []


@needs_fuse
def test_acknowledged_save_is_not_reported_lost_when_the_key_changed_before_remount(homes, tmp_path):
    """False positive: a file whose fsync RETURNED SUCCESS (uploaded and staged), whose
    spool copy was still on disk when the daemon was killed, reported as unsaved work
    (moved to recovered/, listed in REPORT.json) because the branch shows NEWER content
    at its key by the time of the next mount -- or re-staged over that newer write.
    The spool copy outlives the save when the store copies instead of taking the file
    over (S3, or a --cache-dir on another filesystem than a local store: here /dev/shm)."""
    h = homes["home1"]
    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the local store")
    cache = Path(tempfile.mkdtemp(prefix="lakefuse-spool-", dir="/dev/shm"))
    mp = tmp_path / "m"
    try:
        m = mount(h, REPO, mp, cache).start()
        fds = []
        try:
            for name, data in (("acked-then-newer.txt", b"version 1"), ("acked.txt", b"saved as is")):
                fd = os.open(mp / "main" / name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                fds.append(fd)
                os.write(fd, data)
                os.fsync(fd)  # acknowledged: uploaded and staged, durable
            assert len(spool_data(cache)) == 2  # the spool copies are still there (the store copied them)
            kill_9(m)  # before the last close: the copies stay behind
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            m.stop()
        g = open_home(h)
        try:
            g.repository(REPO).upload("main", "acked-then-newer.txt", b"version 2, written later")
        finally:
            g.close()
        with mount(h, REPO, mp, cache) as m2:
            no_unsaved_warning(m2)
        assert recovered(cache) == [], [p.read_bytes() for p in recovered(cache)]
        assert spool_data(cache) == []
        g = open_home(h)
        try:
            r = g.repository(REPO)
            assert r.read("main", "acked-then-newer.txt") == b"version 2, written later"
            assert r.read("main", "acked.txt") == b"saved as is"
        finally:
            g.close()
    finally:
        shutil.rmtree(cache, ignore_errors=True)


@needs_fuse
@pytest.mark.expect_log("the repository's own leftover is reported as a warning")
def test_leftovers_of_a_same_named_repository_of_another_home_are_not_taken(homes, tmp_path):
    """False positive: two lakefuse homes each with a repository named ``data`` share one
    --cache-dir (so one spool/data/ directory). A dead daemon of home2's ``data`` left an
    unfinished directory rename and an unsaved file; the mount of home1's ``data`` must
    not run that rename on ITS repository (moving healthy data), nor judge or report
    the file against the wrong repository. home2's next mount recovers them."""
    cache = tmp_path / "cache"
    g2 = open_home(homes["home2"])
    try:
        repo2 = g2.repository(REPO)
        cfg = SpoolConfig(cache, REPO)
        dead = Spool(repo2, cfg)
        dead.begin_intent({"op": "rename_dir", "branch": "main", "src": "dir", "dst": "moved"})
        sf = dead.open(1, "main", b"keep/new.txt", None, ATTRS, new=True)
        sf.write(0, b"home2's unsaved work")
        os.close(dead._lock_fd)  # kill -9 of home2's daemon
        leftover = sf.data_path

        g1 = open_home(homes["home1"])
        try:
            before = {it.path: it.entry.etag for it in g1.repository(REPO).list("main", delimiter="")}
        finally:
            g1.close()
        with mount(homes["home1"], REPO, tmp_path / "m", cache) as m:
            no_unsaved_warning(m)
            assert "interrupted rename" not in m.log()
        g1 = open_home(homes["home1"])
        try:
            after = {it.path: it.entry.etag for it in g1.repository(REPO).list("main", delimiter="")}
        finally:
            g1.close()
        assert after == before  # home1's repository untouched
        assert leftover.read_bytes() == b"home2's unsaved work" and recovered(cache) == []

        # home2's own next mount takes them over
        live = Spool(repo2, cfg)
        report = live.recover()
        assert [(r.key, r.action) for r in report.files] == [("keep/new.txt", "staged")]
        assert repo2.read("main", "keep/new.txt") == b"home2's unsaved work"
        assert report.intents == [{"op": "rename_dir", "branch": "main", "src": "dir", "dst": "moved"}]
        live.close()
    finally:
        g2.close()


@needs_fuse
def test_clean_unmount_leaves_nothing_for_the_next_mount_to_recover(homes, tmp_path):
    """False positive: the spool of a mount that was CLEANLY unmounted (files written and
    closed, an existing file rewritten with O_TRUNC, a file created and closed without a
    write) found and reported by the next mount."""
    h, cache, mp = homes["home1"], tmp_path / "cache", tmp_path / "m"
    with mount(h, REPO, mp, cache) as m:
        (mp / "main" / "clean.txt").write_bytes(b"written and closed")
        (mp / "main" / "keep" / "a.txt").write_bytes(b"rewritten")  # O_TRUNC of an existing file
        (mp / "main" / "touched").touch()
    no_unsaved_warning(m)
    assert [p for p in spool_root(cache).iterdir()] == []  # the instance directory went with the mount
    with mount(h, REPO, mp, cache) as m2:
        assert (mp / "main" / "clean.txt").read_bytes() == b"written and closed"
        assert (mp / "main" / "keep" / "a.txt").read_bytes() == b"rewritten"
    no_unsaved_warning(m2)
    assert recovered(cache) == []


@needs_fuse
def test_killed_mount_with_untouched_empty_or_saved_files_reports_nothing(homes, tmp_path):
    """False positive: a daemon killed while files were open that hold NOTHING unsaved --
    a file created with no write, an existing file opened for writing and not written,
    an empty file opened with O_TRUNC (empty spool file == its empty entry), a file
    written and fsynced -- and the next mount reporting any of them as lost work."""
    h, cache, mp = homes["home1"], tmp_path / "cache", tmp_path / "m"
    m = mount(h, REPO, mp, cache).start()
    fds = []
    try:
        main = mp / "main"
        fds.append(os.open(main / "created-no-write", os.O_CREAT | os.O_WRONLY, 0o644))
        fds.append(os.open(main / "untouched" / "y.txt", os.O_RDWR))
        fds.append(os.open(main / "keep" / "empty", os.O_WRONLY | os.O_TRUNC))
        fd = os.open(main / "fsynced.txt", os.O_CREAT | os.O_WRONLY, 0o644)
        fds.append(fd)
        os.write(fd, b"fsynced")
        os.fsync(fd)
        kill_9(m)
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        m.stop()
    with mount(h, REPO, mp, cache) as m2:
        # created, neither written nor closed: its create (staged with its first save) never was
        assert not (mp / "main" / "created-no-write").exists()
        assert (mp / "main" / "untouched" / "y.txt").read_bytes() == b"home1 data y"
        assert (mp / "main" / "keep" / "empty").read_bytes() == b""
        assert (mp / "main" / "fsynced.txt").read_bytes() == b"fsynced"
    no_unsaved_warning(m2)
    assert recovered(cache) == [] and spool_data(cache) == []


# ------------------------------------------------------------------ without a kernel


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path)


def test_a_mount_starting_while_another_recovers_keeps_its_spool(repo, tmp_path, monkeypatch):
    """False positive: a mount STARTING at the same moment as another one's recovery
    (two units of one repository started together) has made its instance directory but
    not yet locked it: the recovery must not take that live, empty directory for a dead
    one and delete it (every later write of the starting mount would fail)."""
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    recovering = Spool(repo, cfg)
    from lakefuse.mount import recovery as recovery_mod  # (where the instance directory is made and locked)

    real_flock = recovery_mod.fcntl.flock
    state = {"armed": False, "report": None}

    def flock(fd, op):
        if state["armed"]:
            state["armed"] = False
            state["report"] = recovering.recover()  # runs right before the starting mount's lock
        return real_flock(fd, op)

    monkeypatch.setattr(recovery_mod.fcntl, "flock", flock)
    state["armed"] = True
    starting = Spool(repo, cfg)
    monkeypatch.undo()
    assert state["report"] is not None and state["report"].files == []
    assert starting.dir.is_dir()
    sf = starting.open(1, "main", b"f", None, ATTRS, new=True)
    sf.write(0, b"after start")
    assert recovering.recover().files == []  # and later it is still a live mount's
    sf.flush()
    starting.release(1)
    assert repo.read("main", "f") == b"after start"
    starting.close()
    recovering.close()


@pytest.mark.expect_log("a dead mount's leftover is reported as a warning")
def test_pid_in_an_instance_name_never_decides_liveness(repo, tmp_path, monkeypatch):
    """False positive (PID reuse): liveness is the instance's flock, not the pid in its
    name. A live mount whose name carries a pid that no longer runs is left alone; a
    dead one whose name carries a running pid (reused) is recovered."""
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    monkeypatch.setattr(spool_mod.os, "getpid", lambda: 999_999_999)  # no such process
    live = Spool(repo, cfg)
    monkeypatch.setattr(spool_mod.os, "getpid", lambda: 1)  # init: always running
    dead = Spool(repo, cfg)
    monkeypatch.undo()
    assert live.dir.name.startswith("999999999-") and dead.dir.name.startswith("1-")
    lf = live.open(1, "main", b"live", None, ATTRS, new=True)
    lf.write(0, b"live data")
    df = dead.open(1, "main", b"dead", None, ATTRS, new=True)
    df.write(0, b"dead data")
    os.close(dead._lock_fd)
    report = Spool(repo, cfg).recover()
    assert [(r.key, r.action) for r in report.files] == [("dead", "staged")]
    assert lf.data_path.read_bytes() == b"live data"
    live.close()


def test_finished_rename_intent_is_a_no_op(repo, tmp_path):
    """False positive: a directory rename that COMPLETED (the daemon died before deleting
    its intent record) run again at the next mount must not touch the branch: its
    source is gone, the moved files stay where they are."""
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    repo.upload("main", "moved/f", b"moved earlier")
    dead = Spool(repo, cfg)
    dead.begin_intent({"op": "rename_dir", "branch": "main", "src": "src", "dst": "moved"})
    os.close(dead._lock_fd)
    fs = WritableFilesystem(repo, spool=Spool(repo, cfg))
    report = fs.recover()
    assert len(report.intents) == 1
    assert repo.read("main", "moved/f") == b"moved earlier" and not repo.exists("main", "src/f")
    fs.spool.close()


def test_failed_copy_in_is_not_reported_as_unsaved_work(repo, tmp_path, monkeypatch):
    """False positive: a write to an existing file whose copy-in of the stored content
    failed part way (the store stopped answering: the write returned an error, nothing
    was written by the user) leaves a PARTIAL copy of the saved file; after a crash it
    must not be presented in recovered/ as unsaved work (a truncated copy of a healthy file)."""
    cfg = SpoolConfig(tmp_path / "cache", repo.name)
    repo.upload("main", "big", b"0123456789" * 10)
    base = repo.get("main", "big")
    dead = Spool(repo, cfg)
    monkeypatch.setattr(spool_mod, "_COPY_CHUNK", 30)
    calls = {"n": 0}
    real_read = repo.read_entry

    def read_entry(entry, off, n):
        calls["n"] += 1
        if calls["n"] > 1:
            raise StoreUnavailable("store down")
        return real_read(entry, off, n)

    monkeypatch.setattr(repo, "read_entry", read_entry)
    sf = dead.open(1, "main", b"big", base, ATTRS)
    with pytest.raises(StoreUnavailable):
        sf.write(50, b"X")
    monkeypatch.undo()
    os.close(dead._lock_fd)  # the daemon dies with the file still open
    report = Spool(repo, cfg).recover()
    assert report.kept == [] and repo.read("main", "big") == b"0123456789" * 10
