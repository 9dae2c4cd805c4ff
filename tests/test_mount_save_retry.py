"""A file whose save failed because S3 was down: kept, retried, never committed empty.

A real mount over a moto S3 server reached through :class:`tests.faultproxy.FaultProxy`
(the store goes down by the proxy answering 503 to every object upload; no client is
patched).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import time
import types

import pytest

from graveler import Graveler, GravelerConfig, fences
from tests.faultproxy import Fault, FaultProxy
from tests.graveler_testutil import FAST_KV
from tests.mount_testutil import MountProc, lakefuse_cmd, needs_fuse



def staged_size(home, repo: str, key: str) -> int | None:
    g = Graveler(GravelerConfig(home=home, kv=FAST_KV))
    try:
        r = g.repository(repo)
        return r.get("main", key).size if r.exists("main", key) else None
    finally:
        g.close()


def store_down(monkeypatch, repo) -> list:
    """``repo``'s store refuses every object upload (StoreUnavailable) until ``monkeypatch.undo()``;
    the list returned grows by one each try."""
    from graveler.errors import StoreUnavailable

    tries: list[int] = []

    def down(*a, **k):
        tries.append(1)
        raise StoreUnavailable("store down (test)")

    monkeypatch.setattr(repo._store, "put_file", down)
    monkeypatch.setattr(repo._store, "adopt_file", down)
    return tries


@contextlib.contextmanager
def mount_behind_proxy(tmp_path, name: str, s3_endpoint, s3_config, s3_bucket):
    """A mount of a new S3 repository ``name`` whose store is reached through a FaultProxy (one
    attempt, 2 s bound): yields (proxy, mountpoint, MountProc)."""
    home = tmp_path / "home"
    g = Graveler(GravelerConfig(home=home, kv=FAST_KV, store=s3_config))
    g.create_repository(name, f"s3://{s3_bucket}/ns").commit("main", "empty", allow_empty=True)
    g.close()
    mp = tmp_path / "m"
    with FaultProxy(s3_endpoint) as proxy:
        env = {"LAKEFUSE_S3_ENDPOINT": proxy.url, "LAKEFUSE_S3_MAX_ATTEMPTS": "1", "LAKEFUSE_S3_READ_TIMEOUT": "2"}
        with MountProc(home, name, mp, "--cache-dir", str(tmp_path / "cache"), env=env) as m:
            yield proxy, mp, m


def saved_by_the_retry(home, name: str, key: str, size: int, m) -> None:
    """Wait (40 s at most) until the background retry has staged ``key`` at ``size`` bytes."""
    deadline = time.monotonic() + 40
    while staged_size(home, name, key) != size and time.monotonic() < deadline:
        time.sleep(0.2)
    assert staged_size(home, name, key) == size, m.log()


def committed(home, s3_config, name: str):
    """(repository, head commit of main) of ``name``; close it with ``.close()`` of the first."""
    g = Graveler(GravelerConfig(home=home, kv=FAST_KV, store=s3_config))
    r = g.repository(name)
    return g, r, r.get_commit(r.get_branch("main").commit_id)


def test_a_fresh_mount_creates_while_the_store_is_down(tmp_path, s3_endpoint, s3_config, s3_bucket):
    """Found by an S3 tour: the first create, mkdir or symlink of a mount (and one every ten minutes)
    uploaded the mount's shared empty object in the request: with the store down it was EIO at
    ``open`` (nothing spooled), hung it waited a whole bound each, one after another. The mount
    uploads it at start now and renews it in the background: a create answers at once, and the file's
    save is what waits for the store (kept in the spool, retried)."""
    home = tmp_path / "home"
    with mount_behind_proxy(tmp_path, "fresh", s3_endpoint, s3_config, s3_bucket) as (proxy, mp, m):
        main = mp / "main"
        down = proxy.add(Fault("error", method="PUT", path="/ns/data/", status=503))
        t0 = time.monotonic()
        os.mkdir(main / "d")  # nothing made on this mount before
        os.symlink("d", main / "link")
        f = open(main / "d" / "new.txt", "wb")
        assert time.monotonic() - t0 < 2  # no upload waited for
        f.write(b"written while the store is down")
        with pytest.raises(OSError) as ei:
            f.close()
        assert ei.value.errno == errno.EIO and down.hits > 0
        assert (main / "d" / "new.txt").read_bytes() == b"written while the store is down"
        proxy.clear()
        saved_by_the_retry(home, "fresh", "d/new.txt", len(b"written while the store is down"), m)
        (main / ".lakefuse" / "commit").write_text("after the store came back\n")
    g, r, head = committed(home, s3_config, "fresh")
    try:
        assert r.read(head.id, "d/new.txt") == b"written while the store is down"
        assert r.read(head.id, "d/") == b"" and r.read(head.id, "link") == b""
    finally:
        g.close()


@needs_fuse
@pytest.mark.s3
def test_failed_save_keeps_its_content_is_retried_and_blocks_the_commit_meanwhile(
        tmp_path, s3_endpoint, s3_config, s3_bucket):
    """Defect: a file whose close failed because S3 was down was left staged EMPTY, with no
    retry when the store came back, and the next commit silently published it empty. Now:
    reads through the mount show what was written; a commit meanwhile is refused (EIO)
    with a read-back naming the file; once the store answers, the background retry saves
    it (no further open or close) and the commit publishes the written content."""
    home = tmp_path / "home"
    data = os.urandom(300_000)
    with mount_behind_proxy(tmp_path, "retry", s3_endpoint, s3_config, s3_bucket) as (proxy, mp, m):
        main = mp / "main"
        (main / "before.txt").write_bytes(b"saved while the store answered")
        down = proxy.add(Fault("error", method="PUT", path="/ns/data/", status=503))
        f = open(main / "out.bin", "wb")
        f.write(data)
        with pytest.raises(OSError) as ei:
            f.close()  # the upload is refused: close reports it
        assert ei.value.errno == errno.EIO and down.hits > 0
        # created, its first save (which stages its create too) failed: nothing staged, not even empty
        assert staged_size(home, "retry", "out.bin") is None
        assert (main / "out.bin").read_bytes() == data  # the mount shows what was written
        assert os.stat(main / "out.bin").st_size == len(data)
        with pytest.raises(OSError) as ei:
            (main / ".lakefuse" / "commit").write_text("while the store is down\n")
        assert ei.value.errno == errno.EIO
        outcome = json.loads((main / ".lakefuse" / "commit").read_text())
        assert not outcome["ok"] and "commit refused" in outcome["error"] and "out.bin" in outcome["error"]
        hits = down.hits
        time.sleep(2.5)
        assert down.hits > hits  # retried in the background, without any open or close
        proxy.clear()  # the store is back
        saved_by_the_retry(home, "retry", "out.bin", len(data), m)
        (main / ".lakefuse" / "commit").write_text("after the store came back\n")
        assert (main / "out.bin").read_bytes() == data
        spool = json.loads((mp / ".lakefuse" / "stats").read_text())["spool"]
        assert spool["save_retries"] >= 2 and spool["uploads"] >= 2, spool
    g, r, head = committed(home, s3_config, "retry")
    try:
        assert r.read(head.id, "out.bin") == data
        assert r.read(head.id, "before.txt") == b"saved while the store answered"
        assert head.message == "after the store came back"
    finally:
        g.close()


@needs_fuse
@pytest.mark.s3
@pytest.mark.expect_log("the failed save and the recovery are logged")
def test_a_commit_made_elsewhere_is_refused_while_a_mount_holds_unsaved_writes_killed_or_not(
        tmp_path, s3_endpoint, s3_config, s3_bucket):
    """Found reviewing the retries: only a commit through the mount knew of its failed saves; the
    CLI's (another process, another mount, another host on a shared KV) published the file as the
    branch showed it. Now the mount notes its failing files in the KV: such a commit is refused
    (exit 4), naming the file and the mount, also after the daemon is killed (it then says to mount
    again); the next mount recovers the file and drops the note, and the commit takes the content."""
    home = tmp_path / "home"
    data = os.urandom(200_000)
    with mount_behind_proxy(tmp_path, "elsewhere", s3_endpoint, s3_config, s3_bucket) as (proxy, mp, m):
        main = mp / "main"
        (main / "before.txt").write_bytes(b"saved")
        proxy.add(Fault("error", method="PUT", path="/ns/data/", status=503))
        f = open(main / "out.bin", "wb")
        f.write(data)
        with pytest.raises(OSError):
            f.close()
        g, r, _ = committed(home, s3_config, "elsewhere")
        try:
            with pytest.raises(fences.UnsavedWrites) as ei:
                r.commit("main", "from another process")
            assert "out.bin" in str(ei.value) and f"pid {m.proc.pid} " in str(ei.value)
        finally:
            g.close()
        cli = subprocess.run(lakefuse_cmd(home, "commit", "lakefs://elsewhere/main", "-m", "by the CLI"),
                             capture_output=True, text=True, env={**os.environ, "LAKEFUSE_S3_ENDPOINT": s3_endpoint})
        assert cli.returncode == 4 and "commit refused" in cli.stderr and "out.bin" in cli.stderr, cli.stderr
        m.proc.send_signal(signal.SIGKILL)  # the daemon dies with the save still failing
        m.proc.wait(10)
    g, r, head = committed(home, s3_config, "elsewhere")
    try:
        with pytest.raises(fences.UnsavedWrites, match="its process is gone: mounting the repository again"):
            r.commit("main", "after the kill")
        assert head.message == "empty"
    finally:
        g.close()
    # mounted again (the store answers): its recovery stages what was written and drops the note
    env = {"LAKEFUSE_S3_ENDPOINT": s3_endpoint}
    with MountProc(home, "elsewhere", tmp_path / "m2", "--cache-dir", str(tmp_path / "cache"), env=env) as m2:
        assert (tmp_path / "m2" / "main" / "out.bin").read_bytes() == data, m2.log()
    g, r, _ = committed(home, s3_config, "elsewhere")
    try:
        assert r.unsaved_of("main") == []
        c = r.commit("main", "after the recovery")
        assert r.read(c.id, "out.bin") == data and r.read(c.id, "before.txt") == b"saved"
    finally:
        g.close()


@needs_fuse
@pytest.mark.s3
def test_a_save_whose_answer_was_cut_inside_its_headers_is_retried_and_blocks_the_commit(
        tmp_path, s3_endpoint, s3_config, s3_bucket):
    """Found by a data engineer on a flaky network: an upload's "200" cut short inside its
    headers (Python's HTTP client takes the closed connection for the end of them) came back
    without an ETag; the KeyError escaped as no store error, so the failed save was never
    retried and did not gate the commit: a commit through the mount published the file empty
    (a name listed earlier had staged it so) while the mount showed its 100 KB."""
    home = tmp_path / "home"
    data = os.urandom(100_000)
    with mount_behind_proxy(tmp_path, "cut", s3_endpoint, s3_config, s3_bucket) as (proxy, mp, m):
        main = mp / "main"
        (main / "rep").mkdir()
        cut = proxy.add(Fault("headcut", method="PUT", path="/ns/data/", after=1))
        f = open(main / "rep" / "rep.bin", "wb")
        f.write(data)
        assert "rep.bin" in os.listdir(main / "rep")  # (a listing that reaches the KV stages it, empty)
        with pytest.raises(OSError) as ei:
            f.close()
        assert ei.value.errno == errno.EIO and cut.hits > 0
        assert (main / "rep" / "rep.bin").read_bytes() == data
        with pytest.raises(OSError) as ei:
            (main / ".lakefuse" / "commit").write_text("while answers are cut\n")
        assert ei.value.errno == errno.EIO
        outcome = json.loads((main / ".lakefuse" / "commit").read_text())
        assert not outcome["ok"] and "rep/rep.bin" in outcome["error"], outcome
        proxy.clear()
        saved_by_the_retry(home, "cut", "rep/rep.bin", len(data), m)
        assert "cut short" in m.log() and "Traceback" not in m.log()
        (main / ".lakefuse" / "commit").write_text("after\n")
    g, r, head = committed(home, s3_config, "cut")
    try:
        assert r.read(head.id, "rep/rep.bin") == data
    finally:
        g.close()


@pytest.mark.expect_log("the failed save is logged as an error")
def test_a_failed_save_keeps_its_inode_and_content_until_a_retry_saves_it(tmp_path, monkeypatch):
    """Without a kernel: after the last close of a file whose save failed, the kernel may
    forget its inode; the mount keeps it (and the spool file) so a lookup finds the same
    inode and reads what was written; a reader's close does not fail for it; a commit of
    its branch is refused naming it (another branch commits); once the store answers, a
    retry saves it and the inode goes when the kernel has forgotten it."""
    import stat

    from graveler.errors import StoreUnavailable
    from lakefuse.mount.errors import FsError
    from lakefuse.mount.spool import Spool, SpoolConfig
    from lakefuse.mount.writes import Caller, WritableFilesystem
    from tests.graveler_testutil import make_repo
    from tests.mount_core_testutil import ino_of

    repo = make_repo(tmp_path)
    repo.create_branch("other")
    spool = Spool(repo, SpoolConfig(tmp_path / "cache", repo.name))
    fs = WritableFilesystem(repo, spool=spool)
    try:
        fs.create(ino_of(fs, "other"), b"x", stat.S_IFREG | 0o644, os.O_WRONLY, Caller(0, 0))[0]
        opened, attr = fs.create(ino_of(fs, "main"), b"f", stat.S_IFREG | 0o644, os.O_WRONLY, Caller(0, 0))
        fs.write(opened.fh, 0, b"precious")

        tries = store_down(monkeypatch, repo)
        with pytest.raises(StoreUnavailable):
            fs.flush(opened.fh)
        # noted for commits made elsewhere as soon as its close failed, before its release
        assert [r["files"] for r in repo.unsaved_of("main")] == [["f"]]
        fs.release(opened.fh)
        # the last close does not try again at once (a hung store held it, and every lookup that
        # settles the branch, for a whole round of attempts): the background retries, 1 s on
        assert len(tries) == 1
        fs.forget([(attr.ino, 1)])  # the kernel lets go of it
        assert ino_of(fs, "main/f") == attr.ino and fs.getattr(attr.ino).size == 8
        assert repo.get("main", "f").size == 0
        o = fs.open(attr.ino, os.O_RDONLY)
        assert fs.read(o.fh, 0, 100) == b"precious"
        fs.flush(o.fh)  # a reader's close: no error
        fs.release(o.fh)
        with pytest.raises(StoreUnavailable, match="commit refused.*: f "):
            fs.controls.execute("main", "commit", b"while down")
        fs.controls.execute("other", "commit", b"another branch commits")
        # a commit made elsewhere (the CLI, another mount or host) is refused too: the mount's record
        [rec] = repo.unsaved_of("main")
        assert rec["files"] == ["f"] and rec["count"] == 1 and "store down (test)" in rec["error"]
        with pytest.raises(fences.UnsavedWrites, match="commit refused.*1 file.*: f;"):
            repo.commit("main", "from elsewhere, while down")
        monkeypatch.undo()  # the store is back: the commit retries the save first, then commits
        c = fs.controls.execute("main", "commit", b"after the store came back")
        assert repo.read(c["commit"]["id"], "f") == b"precious" and not spool.failing()
        assert repo.unsaved_of("main") == []  # saved: the record went with it
        fs.forget([(attr.ino, 1)])
        with pytest.raises(FsError):  # saved and forgotten: the mount let go of it
            fs.inodes.get(attr.ino)
    finally:
        spool.close()


@pytest.mark.expect_log("the failed saves are logged as errors")
def test_a_commit_refused_for_failed_saves_waits_out_one_store_bound_not_one_per_file(tmp_path, monkeypatch):
    """Found by a data engineer on a flaky network: with the store hung, a commit through the
    mount retried every failed save one after another before refusing, each waiting out the
    store's bound (~27 s a file: 20 files written during an outage held the commit's write(2)
    for minutes). The first that finds the store still down ends the retries: the refusal
    names them all; once the store is back the commit saves them all, then commits."""
    import stat

    from graveler.errors import StoreUnavailable
    from lakefuse.mount.spool import Spool, SpoolConfig
    from lakefuse.mount.writes import Caller, WritableFilesystem
    from tests.graveler_testutil import make_repo
    from tests.mount_core_testutil import ino_of

    repo = make_repo(tmp_path)
    spool = Spool(repo, SpoolConfig(tmp_path / "cache", repo.name))
    fs = WritableFilesystem(repo, spool=spool)
    try:
        tries = store_down(monkeypatch, repo)
        for name in (b"a", b"b", b"c"):
            opened, _ = fs.create(ino_of(fs, "main"), name, stat.S_IFREG | 0o644, os.O_WRONLY, Caller(0, 0))
            fs.write(opened.fh, 0, b"content of " + name)
            with pytest.raises(StoreUnavailable):
                fs.flush(opened.fh)
            fs.release(opened.fh)
        assert len(tries) == 3
        with pytest.raises(StoreUnavailable, match=r"commit refused: the save of 3 file\(s\)") as e:
            fs.controls.execute("main", "commit", b"while down")
        assert len(tries) == 4 and all(n in str(e.value) for n in ("a", "b", "c"))
        monkeypatch.undo()
        c = fs.controls.execute("main", "commit", b"after the store came back")
        assert [repo.read(c["commit"]["id"], n) for n in ("a", "b", "c")] == [b"content of a", b"content of b",
                                                                             b"content of c"]
    finally:
        spool.close()


class _FailingFile:
    """A spool file whose save fails with ``failure`` (what :class:`SaveRetries` reads of one)."""

    def __init__(self, failure=None, handles: int = 1):
        from graveler.errors import StoreUnavailable

        self.failure = StoreUnavailable("down") if failure is None else failure
        self.key, self.branch, self.handles, self.tried = b"k", "main", handles, 0

    def flush(self):
        self.tried += 1
        raise self.failure


def _bare_retries(monkeypatch, files: list, set_unsaved):
    """A :class:`lakefuse.mount.retry.SaveRetries` alone (no spool): ``files`` failing, the KV's
    ``set_unsaved`` given."""
    import threading

    from lakefuse.mount.retry import SaveRetries

    r = SaveRetries()
    r.stats, r.dir, r.pin = {"save_retries": 0}, "/spool/x", None
    r._lock, r._files, r._retrier, r._stop = threading.Lock(), {}, None, threading.Event()
    r.repo = types.SimpleNamespace(set_unsaved=set_unsaved)
    monkeypatch.setattr(r, "failing", lambda branch=None: list(files), raising=False)
    return r


def test_retries_stop_at_the_first_outage_whatever_failed_before(monkeypatch):
    """Found reviewing the change: the rule looked at the last skipped file's old failure, so a
    file that had failed otherwise (a full disk) restarted the retries mid-way, each waiting out
    the store's bound again."""
    files = [_FailingFile(), _FailingFile(OSError(28, "full")), _FailingFile(), _FailingFile()]
    published = []  # what the mount notes in the KV for commits made elsewhere
    r = _bare_retries(monkeypatch, files, lambda writer, recs: published.append(recs))
    left = r.retry_saves("main", until_outage=True)
    assert [f.tried for f in files] == [1, 0, 0, 0] and left == files
    assert [(b, rec["count"], rec["error"]) for b, rec in published[-1].items()] == [("main", 4, "down")]
    assert [f.tried for f in files] == [1, 0, 0, 0]
    r.retry_saves("main")  # (the background round tries them all)
    assert [f.tried for f in files] == [2, 1, 1, 1]


def test_a_record_of_unsaved_writes_is_put_once_per_change_and_again_each_retry_round(monkeypatch):
    """Found reviewing "zd": a failed close put the same record twice (the handle's flush, then
    its release). A note saying what the last record said puts nothing; each retry round puts
    it again (the KV may have been away), and a change is put at once."""
    files = [_FailingFile(), _FailingFile()]
    published = []
    r = _bare_retries(monkeypatch, files, lambda writer, recs: published.append(recs))
    r.note_unsaved()
    assert [rec["count"] for rec in published[-1].values()] == [2]
    n = len(published)
    r.note_unsaved()
    r.note_unsaved()
    assert len(published) == n
    r.retry_saves("main")
    assert len(published) == n + 1
    files.pop()
    r.note_unsaved()
    assert len(published) == n + 2 and published[-1]["main"]["count"] == 1
    files.clear()
    r.note_unsaved()
    assert published[-1] == {"main": None}  # (saved: the record goes)
    r.note_unsaved()
    assert len(published) == n + 3


@pytest.mark.expect_log("the failed saves are logged as errors")
def test_a_failed_save_follows_a_rename_and_an_unlink_ends_it(tmp_path, monkeypatch):
    """A file whose save failed, then renamed (``mv``): the mount's own rename is no other
    writer's save, so the retry stages the content at the new name (not given up to
    recovered/). One unlinked meanwhile: nothing is left to save; its retry ends and the
    mount lets go of it."""
    import stat

    from graveler.errors import StoreUnavailable
    from lakefuse.mount.spool import Spool, SpoolConfig
    from lakefuse.mount.writes import Caller, WritableFilesystem
    from tests.graveler_testutil import make_repo
    from tests.mount_core_testutil import ino_of

    repo = make_repo(tmp_path)
    spool = Spool(repo, SpoolConfig(tmp_path / "cache", repo.name))
    fs = WritableFilesystem(repo, spool=spool)
    try:
        main = ino_of(fs, "main")
        made = {}
        for name in (b"moved", b"gone"):
            opened, attr = fs.create(main, name, stat.S_IFREG | 0o644, os.O_WRONLY, Caller(0, 0))
            fs.write(opened.fh, 0, b"content of " + name)
            made[name] = (opened.fh, attr.ino)

        store_down(monkeypatch, repo)
        for fh, _ in made.values():
            with pytest.raises(StoreUnavailable):
                fs.flush(fh)
            fs.release(fh)
        assert len(spool.failing()) == 2
        fs.rename(main, b"moved", main, b"renamed", 0)
        fs.unlink(main, b"gone")
        assert [sf.key for sf in spool.failing()] == [b"renamed"]
        monkeypatch.undo()
        assert spool.retry_saves() == []
        assert repo.read("main", "renamed") == b"content of moved" and not repo.exists("main", "gone")
        assert not (tmp_path / "cache" / "spool" / repo.name / "recovered").exists()
        assert spool.open_files() == []
    finally:
        spool.close()


def test_a_record_the_kv_refused_is_put_within_a_second_of_its_return_not_at_the_saves_pace(monkeypatch, caplog):
    """("zd"'s list) A record of unsaved writes the KV refused (the KV down at the failing
    close) waited for the next retry round of the saves -- up to 30 s after the KV was back,
    while a commit elsewhere could publish the file's old version. It is put again each
    second, apart from the saves' rounds, and the warning is said once per outage. A removal
    refused after the last save went through is retried the same way (the retry thread ended
    with the saves, and the stale record refused commits elsewhere until the next note)."""
    from graveler.errors import StoreUnavailable
    from lakefuse.mount import retry

    monkeypatch.setattr(retry, "RETRY_FIRST_S", 60.0)  # (no round of the saves in this test)
    monkeypatch.setattr(retry, "NOTE_RETRY_S", 0.05)
    f = _FailingFile(handles=0)
    published, refusals = [], [3]

    def set_unsaved(writer, recs):
        if refusals[0]:
            refusals[0] -= 1
            raise StoreUnavailable("kv down (test)")
        published.append(recs)

    r = _bare_retries(monkeypatch, [f], set_unsaved)
    try:
        r.note_unsaved()  # (refused: it starts the retry thread)
        assert published == [] and r._unsaved_owed and r._retrier is not None
        deadline = time.monotonic() + 10
        while not published and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [rec["count"] for rec in published[0].values()] == [1] and not r._unsaved_owed
        assert f.tried == 0  # (the saves' own round is not due yet)
        time.sleep(0.2)
        assert len(published) == 1  # (nothing owed: nothing put again between rounds)
        warned = [rec.getMessage() for rec in caplog.records]
        assert sum("could not note" in m for m in warned) == 1 and sum("noted the unsaved" in m for m in warned) == 1
    finally:
        r._stop.set()
    # the record's removal refused once the last save went through: the thread goes on until it
    # goes in (it ended with the saves, and the stale record refused commits elsewhere)
    monkeypatch.setattr(retry, "RETRY_FIRST_S", 0.1)
    r2 = _bare_retries(monkeypatch, [], set_unsaved)
    r2._unsaved_said = {"main": (["k"], 1, "down")}  # (its record was put; its files are saved now)
    published.clear()
    refusals[0] = 3
    try:
        r2.note_unsaved()
        assert published == [] and r2._unsaved_owed
        deadline = time.monotonic() + 10
        while (r2._retrier is not None or not published) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert published == [{"main": None}] and not r2._unsaved_owed and r2._retrier is None
    finally:
        r2._stop.set()
