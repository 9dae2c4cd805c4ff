"""A release with work (a spool file to save, a control request to run) leaves the trio thread.

pyfuse3 runs every handler on one trio thread: a release that uploads a file or runs a
commit inline would stall every other request of the mount. These tests drive the FUSE
adapter (:class:`lakefuse.mount.fuse.Operations`) over a writable core under trio, with a
store call that waits until the test lets it go, and ask other requests meanwhile.
"""

from __future__ import annotations

import os
import stat
import threading

import pytest
import trio

from lakefuse.mount.fuse import Operations
from lakefuse.mount.inodes import ROOT_INO
from lakefuse.mount.writes import Caller
from tests.mount_core_testutil import seeded_repo, writable_core

ME = Caller(uid=1000, gid=100)
HOLD = 10.0  # seconds the slow store call waits at most (the old inline release waited all of it)


@pytest.fixture
def repo(tmp_path):
    with seeded_repo(tmp_path, "rel", {"data/a.csv": b"a,b\n1,2\n"}, tag=False) as r:
        yield r


@pytest.fixture
def fs(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as f:
        yield f


def _slow(monkeypatch, repo, method: str):
    """``repo.<method>`` waits (in whatever thread calls it) until ``go`` is set."""
    entered, go = threading.Event(), threading.Event()
    real = getattr(repo, method)

    def slow(*args, **kw):
        entered.set()
        assert go.wait(HOLD), f"{method} was held {HOLD} s: the release blocked the trio thread"
        return real(*args, **kw)

    monkeypatch.setattr(repo, method, slow)
    return entered, go


def _hold_release_and_ask_others(fs, fh: int, entered: threading.Event, go: threading.Event) -> list[str]:
    ops = Operations(fs)
    answered: list[str] = []

    async def run():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ops.release, fh)
            with trio.fail_after(HOLD):
                await trio.to_thread.run_sync(entered.wait)  # the release is inside the slow store call
                main = await ops.lookup(ROOT_INO, b"main")
                answered.append("lookup")
                await ops.getattr(main.st_ino)
                answered.append("getattr")
                fh2 = (await ops.opendir(ROOT_INO, None))
                await ops.releasedir(fh2)
                answered.append("opendir")
            assert not go.is_set()  # all answered while the release still waited
            go.set()
        answered.append("released")

    trio.run(run)
    return answered


def test_a_slow_upload_at_release_holds_no_other_request(fs, repo, monkeypatch):
    """The last close of a written file whose flush never ran (or failed) saves it at
    release: the upload waits on the store while lookups and listings are answered."""
    main = fs.lookup(ROOT_INO, b"main").ino
    opened, _ = fs.create(main, b"slow.bin", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    fs.write(opened.fh, 0, b"x" * 1000)
    assert fs.release_pending(opened.fh)
    entered, go = _slow(monkeypatch, repo, "put_object")
    assert _hold_release_and_ask_others(fs, opened.fh, entered, go) == ["lookup", "getattr", "opendir", "released"]
    assert repo.read("main", "slow.bin") == b"x" * 1000


def test_a_slow_commit_at_release_holds_no_other_request(fs, repo, monkeypatch):
    """A control request written without a flush runs at release: the commit waits on the
    store while other requests are answered."""
    repo.upload("main", "new", b"n")
    main = fs.lookup(ROOT_INO, b"main").ino
    info = fs.lookup(main, b".lakefuse").ino
    ino = fs.lookup(info, b"commit").ino
    opened = fs.open(ino, os.O_WRONLY)
    fs.write(opened.fh, 0, b"held commit")  # no newline: the request waits for flush or release
    assert fs.release_pending(opened.fh)
    entered, go = _slow(monkeypatch, repo, "commit")
    assert _hold_release_and_ask_others(fs, opened.fh, entered, go) == ["lookup", "getattr", "opendir", "released"]
    assert next(iter(repo.log("main", amount=1))).message == "held commit"


def test_a_release_without_work_stays_on_the_trio_thread(fs):
    """Closing a read-only object handle only drops buffers: no thread is asked for."""
    main = fs.lookup(ROOT_INO, b"main").ino
    data = fs.lookup(main, b"data").ino
    ino = fs.lookup(data, b"a.csv").ino
    opened = fs.open(ino, os.O_RDONLY)
    assert not fs.release_pending(opened.fh)
    fs.release(opened.fh)
