"""What reaches the disk when, through a real mount: the daemon's sync calls, counted with strace.

ext4's contract (docs/SEMANTICS.md, "Durability"): close(2) saves a file without flushing
it anywhere (visible to every reader, kept if the daemon dies); fsync(2) returns only once
the object file and the KV are on disk; a commit syncs the store's filesystem before its
record lands. strace attaches to the daemon (all its threads) and prints every fsync,
fdatasync, syncfs and sync_file_range with the path of its descriptor (``-y``) and its end
time (``-ttt -T``), which the test compares with the moment the program's call returned.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from graveler.config import GravelerConfig
from graveler.home import Graveler
from tests.mount_testutil import MountProc, lakefuse_cmd, needs_fuse

pytestmark = [needs_fuse, pytest.mark.skipif(shutil.which("strace") is None, reason="no strace (scripts/setup.sh)")]

REPO = "durable"
_LINE = re.compile(r"^\d+\s+(?P<t>\d+\.\d+) (?P<call>fsync|fdatasync|syncfs|sync_file_range)\((?P<fd>\d+)<(?P<path>[^>]*)>"
                   r".*= (?P<rc>-?\d+).*<(?P<dur>\d+\.\d+)>$")

_RESUMED = re.compile(r"^\d+\s+\d+\.\d+ <\.\.\. \w+ resumed>(?P<rest>.*)$")


class SyncTrace:
    """strace of every sync call of one process (and its threads) into a file."""

    def __init__(self, pid: int, out: Path):
        self.out = out
        self.proc = subprocess.Popen(["strace", "-f", "-ttt", "-T", "-y", "-qq", "-e",
                                      "trace=fsync,fdatasync,syncfs,sync_file_range,sync", "-p", str(pid),
                                      "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not self._attached(pid):
            time.sleep(0.05)
        assert self._attached(pid), "strace did not attach"

    @staticmethod
    def _attached(pid: int) -> bool:
        tasks = os.listdir(f"/proc/{pid}/task")
        return all(_tracer(pid, t) != 0 for t in tasks)

    def calls(self) -> list[tuple[float, str, str]]:
        """(end time, call, path) of every completed sync call so far (a call another thread's
        interrupted in the trace, ``<unfinished ...>`` then ``<... resumed>``, taken whole)."""
        out = []
        unfinished: dict[str, str] = {}
        for line in self.out.read_text().splitlines():
            pid = line.split(" ", 1)[0]
            if line.endswith("<unfinished ...>"):
                unfinished[pid] = line[: -len("<unfinished ...>")].rstrip()
                continue
            r = _RESUMED.match(line)
            if r and pid in unfinished:
                line = unfinished.pop(pid) + r.group("rest")
            m = _LINE.match(line)
            if m and m.group("rc") == "0":
                out.append((float(m.group("t")) + float(m.group("dur")), m.group("call"), m.group("path")))
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(10)


def _tracer(pid: int, tid: str) -> int:
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        for line in f:
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    return 0


def _between(calls, t0: float, t1: float):
    return [(call, path) for t, call, path in calls if t0 <= t <= t1]


def _kv_synced(during) -> bool:
    """The KV's commits so far are on disk: LMDB's redo log flushed, or a checkpoint (which
    flushes data.mdb and then records itself)."""
    return any(c == "fdatasync" and re.search(r"/redo\.[0-9a-f]+\.log$", p) for c, p in during) or (
        any(c == "fdatasync" and p.endswith("data.mdb") for c, p in during)
        and any(c == "fdatasync" and p.endswith("redo.ckpt.tmp") for c, p in during))


def _checkpoint_only(during) -> bool:
    """Every call of ``during`` is one a background checkpoint makes (data.mdb, its record, the
    directory), and a checkpoint's record is among them."""
    return all(p.endswith(("data.mdb", "redo.ckpt.tmp", "refs.lmdb")) for c, p in during) and any(
        p.endswith("redo.ckpt.tmp") for c, p in during)


def test_close_flushes_nothing_fsync_and_commit_reach_the_disk_first(tmp_path):
    """close: no flush at all -- not the object, not its directory, not LMDB (its commit is in
    the page cache and its record in the redo log, unflushed: graveler.kv.lmdb_redo), unless a
    background checkpoint falls in the window; fsync: the object file, its directory and the
    KV's redo log are synced before the call returns; fsync on a descriptor opened after the
    close syncs what the close saved; a commit syncfs()es the store before it returns; so does
    unmount."""
    home = tmp_path / "home"
    store = tmp_path / "store"
    subprocess.run(lakefuse_cmd(home, "repo", "create", f"lakefs://{REPO}", "--storage", f"file://{store}"),
                   check=True, capture_output=True)
    mp = tmp_path / "mnt"
    with MountProc(home, REPO, mp, "--cache-dir", str(tmp_path / "cache")) as m:
        trace = SyncTrace(m.proc.pid, tmp_path / "strace.txt")
        try:
            (mp / "main" / "first").write_bytes(b"")  # the mount's shared empty object: put (durably) once
            f = mp / "main" / "a.bin"
            t0 = time.time()
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, b"x" * 4096)
            t_write = time.time()
            os.close(fd)  # close: saved, nothing flushed
            t_close = time.time()
            time.sleep(0.3)
            during_close = _between(trace.calls(), t0, t_close)
            assert not during_close or _checkpoint_only(during_close), during_close
            with open(f, "rb") as r:  # visible at once, with its content
                assert r.read() == b"x" * 4096

            # fsync on a descriptor opened after the close: the object close saved goes to disk
            fd = os.open(f, os.O_RDONLY)
            t1 = time.time()
            os.fsync(fd)
            t2 = time.time()
            os.close(fd)
            time.sleep(0.3)
            addr = Graveler(GravelerConfig.from_home(home)).repository(REPO).get("main", "a.bin").address
            obj = str(store / addr)
            during_fsync = _between(trace.calls(), t1, t2)
            assert ("fsync", obj) in during_fsync, (obj, during_fsync)
            assert ("fsync", os.path.dirname(obj)) in during_fsync, during_fsync
            assert _kv_synced(during_fsync), during_fsync

            # fdatasync on the writing handle: the new content's object, before the call returns
            fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
            os.write(fd, b"y" * 100)
            t3 = time.time()
            os.fdatasync(fd)
            t4 = time.time()
            os.close(fd)
            time.sleep(0.3)
            addr2 = Graveler(GravelerConfig.from_home(home)).repository(REPO).get("main", "a.bin").address
            assert addr2 != addr
            during = _between(trace.calls(), t3, t4)
            assert ("fsync", str(store / addr2)) in during, during
            assert _kv_synced(during), during

            # a commit syncs the store's filesystem before its record lands (and before it returns)
            t5 = time.time()
            (mp / "main" / ".lakefuse" / "commit").write_text("durable\n")
            t6 = time.time()
            time.sleep(0.3)
            during = _between(trace.calls(), t5, t6)
            syncfs_at = [t for t, c, p in trace.calls() if c == "syncfs" and t5 <= t <= t6]
            assert syncfs_at, during
            assert _kv_synced(during), during
            assert t_write < t_close  # (the clock moved: the windows above are real)

            # unmount: the store's filesystem and the KV are synced before the daemon exits
            t7 = time.time()
            m.stop()
            trace.proc.wait(30)  # strace ends with the daemon
            after = [(c, p) for t, c, p in trace.calls() if t >= t7]
            assert ("syncfs", str(store)) in after, after
        finally:
            if trace.proc.poll() is None:
                trace.stop()
    assert "Traceback" not in m.log(), m.log()
