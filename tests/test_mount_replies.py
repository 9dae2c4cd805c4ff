"""Deferred replies: a branch file's write, close (flush) and fsync are answered by the worker
thread that did them (``pyfuse3.Reply``, the vendored patch), not by the trio thread woken to
send the answer. The answers must be the ones the error boundary gives, every request answered
exactly once, and nothing left running when the mount ends."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from graveler import KVConfig
from lakefuse.mount.fuse import Operations
from lakefuse.mount.offload import BULK_WRITE_MIN, LOCAL_SAVE_THREADS, SAVE, WRITE, Offload, limits_for
from tests.mount_testutil import MountProc, is_mounted, needs_fuse, oversized_control_request, seeded_home


class FakeReply:
    """What a worker thread answers (pyfuse3.Reply's three calls), recorded."""

    def __init__(self):
        self.answers: list[tuple] = []
        self.done = threading.Event()

    def write(self, n):
        self.answers.append(("write", n))
        self.done.set()

    def ok(self):
        self.answers.append(("ok",))
        self.done.set()

    def error(self, code):
        self.answers.append(("error", code))
        self.done.set()


def _counted_jobs(seconds: float):
    """A job (argument i) that sleeps ``seconds``, the list of the i done, and [the most running at once]."""
    running, most, done = [0], [0], []
    lock = threading.Lock()

    def job(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(seconds)
        with lock:
            running[0] -= 1
        done.append(i)

    return job, done, most


def test_deferred_jobs_run_in_at_most_the_limit_s_threads_and_close_waits_for_every_one():
    off = Offload({WRITE: 2})
    job, done, most = _counted_jobs(0.01)
    for i in range(20):
        off.defer(WRITE, lambda i=i: job(i))
    off.close()  # the queued ones too, before it returns
    assert sorted(done) == list(range(20))
    assert most[0] <= 2
    assert not [t for t in threading.enumerate() if t.name.startswith("lakefuse-write")]


def test_a_local_store_saves_in_one_thread_and_an_fsync_waiting_on_the_disk_holds_up_no_save():
    """With a local store and an embedded KV, writes and closes (SAVE) are GIL-bound: at most
    LOCAL_SAVE_THREADS of them run at once; fsyncs (WRITE) have their own threads, so one waiting on the disk
    leaves the others' writes and closes going. An S3 store's saves (uploads) keep 8."""
    assert limits_for(False)[SAVE] == 8 and limits_for(True)[SAVE] == LOCAL_SAVE_THREADS == 1
    # (local: a local store and an embedded KV; a PostgreSQL commit waits on a server, as an upload)
    assert KVConfig().embedded and KVConfig(url="memory://x").embedded
    assert not KVConfig(url="postgresql://u@127.0.0.1/db").embedded and not KVConfig(url="postgres://h/d").embedded
    assert limits_for(True)[WRITE] == limits_for(False)[WRITE] == 8
    off = Offload(limits_for(True))
    disk = threading.Event()
    save, saved, most = _counted_jobs(0.005)
    try:
        for _ in range(3):
            off.defer(WRITE, lambda: disk.wait(30))  # fsyncs waiting on a slow disk
        for i in range(20):
            off.defer(SAVE, lambda i=i: save(i))
        deadline = time.monotonic() + 20
        while len(saved) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(saved) == list(range(20))  # all done while the fsyncs still wait
        assert most[0] <= LOCAL_SAVE_THREADS
    finally:
        disk.set()
        off.close()


@pytest.mark.expect_log("a job that raises is logged")
def test_a_deferred_job_that_raises_keeps_its_thread():
    off = Offload({WRITE: 1})
    done = []
    off.defer(WRITE, lambda: 1 / 0)  # (a job must not raise: logged, and the pool goes on)
    off.defer(WRITE, lambda: done.append(1))
    off.close()
    assert done == [1]


class _Fs:
    """The core calls a deferred handler makes, failing as asked."""

    def __init__(self, stats):
        self.stats = stats
        self.fail: BaseException | None = None

    def _maybe_fail(self):
        if self.fail is not None:
            raise self.fail

    def write(self, fh, off, data):
        self._maybe_fail()
        return len(data)

    def pending(self, fh):
        return fh != 0

    def bulky(self, fh, size):
        return False

    def flush(self, fh):
        self._maybe_fail()

    def fsync(self, fh):
        self._maybe_fail()


@pytest.mark.expect_log("an unexpected failure of a deferred write is logged with its traceback")
def test_deferred_handlers_answer_what_the_error_boundary_would():
    import trio

    from lakefuse.mount.errors import FsError, LogOnce
    from lakefuse.mount.stats import Stats

    fs = _Fs(Stats())
    ops = Operations.__new__(Operations)  # (the adapter's state a handler uses, without a core)
    ops.fs, ops.stats, ops.offload = fs, fs.stats, Offload()
    ops.log_once = LogOnce(logging.getLogger("test"))

    async def call(op, *args):
        r = FakeReply()
        got = await getattr(ops, op)(*args, r)
        if got is r:
            assert r.done.wait(10), f"{op}: never answered"
        return got is r, r.answers

    async def run():
        assert await call("write", 3, 0, b"abcd") == (True, [("write", 4)])
        assert await call("flush", 3) == (True, [("ok",)])
        assert await call("fsync", 3, False) == (True, [("ok",)])
        assert await call("flush", 0) == (False, [])  # nothing to save: pyfuse3 answers, no thread
        for exc, code in [(OSError(errno.EFBIG, "File too large"), errno.EFBIG), (FsError(errno.EROFS), errno.EROFS),
                          (RuntimeError("bug"), errno.EIO)]:
            fs.fail = exc
            for op, args in (("write", (3, 0, b"x")), ("flush", (3,)), ("fsync", (3, True))):
                assert await call(op, *args) == (True, [("error", code)]), (op, exc)
        fs.fail = None
        assert await call("write", 3, 5, b"after") == (True, [("write", 5)])

    trio.run(run)
    ops.offload.close()


REPO = "replies"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return seeded_home(tmp_path_factory, REPO)


@needs_fuse
@pytest.mark.parametrize("deferred", ["1", "0"])
def test_writes_closes_and_fsyncs_answer_the_same_either_way(home, tmp_path, deferred):
    m = MountProc(home, REPO, tmp_path / "mnt", env={"LAKEFUSE_DEFERRED_REPLIES": deferred}).start()
    try:
        mp = m.mountpoint
        stats = lambda: json.loads((mp / ".lakefuse" / "stats").read_text())  # noqa: E731
        assert stats()["deferred_replies"] == ("on" if deferred == "1" else "off")
        assert stats()["save_threads"] == "1"  # a local store, LMDB
        d = mp / "main" / f"w{deferred}"
        d.mkdir()
        for i in range(50):
            fd = os.open(d / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                assert os.write(fd, b"x" * i + b"\n") == i + 1
                if i % 10 == 0:
                    os.fsync(fd)
            finally:
                os.close(fd)
        assert all((d / f"f{i}").read_bytes() == b"x" * i + b"\n" for i in range(50))
        # a failed write and close reach the caller with their errno: a control request past
        # its limit (EFBIG on the write past 1 MiB, and again at close); nothing runs
        oversized_control_request(mp / "main" / ".lakefuse" / "commit", 3 << 20)
        st = stats()
        lat = st["latency"]
        assert lat["write"]["n"] >= 50 and lat["flush"]["n"] >= 50 and lat["fsync"]["n"] == 5
        # writes and closes in the save threads (50 writes, the 45 closes with a save left to do:
        # an fsync saved the other 5), fsyncs in the write threads
        assert st["thread_hops_save"] >= 95 and st["thread_hops_write"] >= 5
        # a large write goes to the bulk threads (small files' saves do not queue behind it), a
        # smaller one to the save thread; the file reads back whole either way
        bulk = st.get("thread_hops_bulk", 0)  # (the oversized request's large writes)
        big = os.urandom(BULK_WRITE_MIN)
        fd = os.open(d / "big", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            assert os.write(fd, big) == len(big)
            assert stats()["thread_hops_bulk"] == bulk + 1
            hops = stats()["thread_hops_save"]
            assert os.write(fd, big[:BULK_WRITE_MIN - 1]) == BULK_WRITE_MIN - 1
            assert stats()["thread_hops_save"] == hops + 1 and stats()["thread_hops_bulk"] == bulk + 1
        finally:
            os.close(fd)
        assert (d / "big").read_bytes() == big + big[:BULK_WRITE_MIN - 1]
        # a small write that first copies the saved file in, and the close that must hash it
        # again (written out of order), go there too: no small file's save queues behind them
        fd = os.open(d / "big", os.O_WRONLY)
        try:
            assert os.write(fd, b"Z") == 1
            assert stats()["thread_hops_bulk"] == bulk + 2
        finally:
            os.close(fd)
        assert stats()["thread_hops_bulk"] == bulk + 3
        assert (d / "big").read_bytes() == b"Z" + (big + big[:BULK_WRITE_MIN - 1])[1:]
        # a control request (a commit may take long) runs there too, never in the save thread
        saves, bulk = stats()["thread_hops_save"], stats()["thread_hops_bulk"]
        (mp / "main" / ".lakefuse" / "commit").write_text("through the bulk threads\n")
        assert json.loads((mp / "main" / ".lakefuse" / "commit").read_text())["ok"] is True
        assert stats()["thread_hops_bulk"] > bulk and stats()["thread_hops_save"] == saves
    finally:
        m.stop()
    assert "Traceback" not in m.log() and "dropped unanswered" not in m.log()


WRITER = r"""
import os, sys
d = sys.argv[1]
i = 0
while True:
    try:
        fd = os.open(f"{d}/s{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"y" * 4096)
        if i % 3 == 0:
            os.fsync(fd)
        os.close(fd)
    except OSError:
        sys.exit(0)  # the mount went away
    i += 1
"""


@needs_fuse
def test_sigterm_during_a_stream_of_writes_answers_them_and_exits_cleanly(home, tmp_path):
    """The mount ends while worker threads hold requests: each is finished and answered (or
    dropped with the session, never sent to a destroyed one) and the daemon exits 0."""
    m = MountProc(home, REPO, tmp_path / "mnt").start()
    writers = []
    try:
        d = m.mountpoint / "main" / "stream"
        d.mkdir()
        writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(d)]) for _ in range(3)]
        time.sleep(1.5)
        assert all(w.poll() is None for w in writers)
        m.proc.send_signal(signal.SIGTERM)
        assert m.proc.wait(30) == 0, m.log()
        for w in writers:
            assert w.wait(30) == 0
        assert not is_mounted(m.mountpoint)
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
        m.stop()
    log = m.log()
    assert "dropped unanswered" not in log and "Traceback" not in log, log
