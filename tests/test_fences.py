"""A change of a branch made in several transactions is whole in every commit (graveler.fences)."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from graveler import fences
from graveler.fences import BranchBusy, new_fence
from graveler.kv.base import REPO
from graveler.tree import rename_prefix
from tests.graveler_testutil import entry, make_repo


@pytest.fixture
def repo(tmp_path):
    r = make_repo(tmp_path)
    yield r
    r.close()


def _tree(repo, ref: str) -> list[str]:
    return sorted(it.path.decode() for it in repo.list(ref, delimiter=""))


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.expect_log("a commit's wait for a fence is said once")
def test_a_commit_during_a_rename_of_many_batches_waits_for_all_of_it(repo, caplog):
    """Found by a data team lead's tour: a CLI commit made while a mount renamed a directory of
    60,000 files (two transactions) held 10,000 of them under the old name and 50,000 under the
    new one. The rename fences the branch before its second batch; a commit from any thread or
    process waits for the fence to go, and takes the whole rename."""
    repo.stage_many("main", [(f"src/f{i}", entry(f"f{i}")) for i in range(7)])
    repo.commit("main", "seven files")
    done: list = []
    started = threading.Event()

    def commit() -> None:
        started.set()
        done.append(repo.commit("main", "during the rename"))

    waiter = threading.Thread(target=commit)

    def staged(n: int) -> None:
        if not waiter.is_alive() and not done:  # after the first batch
            assert repo.fence_of("main")["what"] == "the rename of a directory"
            waiter.start()
            started.wait()
            time.sleep(0.3)
            assert waiter.is_alive() and not done  # waiting for the fence

    assert rename_prefix(repo, "main", b"src", b"dst", batch=2, staged=staged) == 7
    waiter.join(30)
    assert done and repo.fence_of("main") is None
    assert len([r for r in caplog.records if "waiting for the rename of a directory" in r.getMessage()]) == 1
    assert _tree(repo, done[0].id) == [f"dst/f{i}" for i in range(7)]
    # one batch is one transaction: no fence at all
    calls = []
    orig = repo.fence
    repo.fence = lambda *a: calls.append(a) or orig(*a)
    try:
        rename_prefix(repo, "main", b"dst", b"one", batch=100)
    finally:
        repo.fence = orig
    assert calls == []


@pytest.mark.expect_log("a commit's wait for a live fence is said")
def test_a_fence_whose_process_is_gone_or_cut_short_refuses_at_once_until_reset(repo, monkeypatch):
    repo.stage("main", "a", entry("a"))
    repo.commit("main", "a")
    repo.stage("main", "b", entry("b"))
    repo.fence("main", {**new_fence("the rename of a directory", src="x", dst="y"), "pid": _dead_pid()})
    t0 = time.monotonic()
    with pytest.raises(BranchBusy, match="cut short.*branch reset") as ei:
        repo.commit("main", "b")
    assert ei.value.gone and time.monotonic() - t0 < 5  # not waited for
    repo.reset("main")  # discards what the change left, and its fence
    assert repo.fence_of("main") is None
    repo.stage("main", "b", entry("b"))
    assert _tree(repo, repo.commit("main", "b").id) == ["a", "b"]
    # a live process's fence: waited for, then refused
    monkeypatch.setattr(fences, "FENCE_WAIT_S", 0.3)
    repo.stage("main", "c", entry("c"))
    repo.fence("main", new_fence("the rename of a directory", src="x", dst="y"))
    with pytest.raises(BranchBusy, match="still going after") as ei:
        repo.commit("main", "c")
    assert not ei.value.gone
    # deleting the branch removes it: a branch made again is whole
    repo.create_branch("dev")
    repo.fence("dev", new_fence("the rename of a directory", src="x", dst="y"))
    repo.delete_branch("dev")
    repo.create_branch("dev")
    assert repo.fence_of("dev") is None


def test_a_rename_cut_short_is_refused_at_once_and_finished_by_running_it_again(repo):
    """The mount's recovery runs an interrupted rename again: it moves what is left and removes
    the fence the first run left (marked cut short, so commits meanwhile fail at once)."""
    repo.stage_many("main", [(f"src/f{i}", entry(f"f{i}")) for i in range(6)])
    repo.commit("main", "six")
    orig = repo.stage_many
    calls = []

    def failing(branch, items, *a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("the KV went away")
        return orig(branch, items, *a, **kw)

    repo.stage_many = failing
    try:
        with pytest.raises(OSError):
            rename_prefix(repo, "main", b"src", b"dst", batch=2)
    finally:
        repo.stage_many = orig
    assert repo.fence_of("main")["cut"] is True
    with pytest.raises(BranchBusy, match="cut short") as ei:
        repo.commit("main", "half")
    assert ei.value.gone
    assert rename_prefix(repo, "main", b"src", b"dst", batch=2) == 4  # (2 had moved)
    assert repo.fence_of("main") is None
    assert _tree(repo, repo.commit("main", "whole").id) == [f"dst/f{i}" for i in range(6)]


@pytest.mark.expect_log("a commit's wait for a fence is said")
def test_a_fence_of_another_hosts_dead_process_is_taken_for_cut_short_once_it_makes_no_progress(repo, monkeypatch):
    """Found by a multi-host tour: a rename's process killed on another host left a fence this
    host cannot check, so every commit waited the whole minute and was told the rename was
    "still going". The renamer counts its transactions in the fence; a waiter that sees the
    count stand still for STALL_S (by its own clock: no two hosts' clocks compared) takes it for
    cut short, and says what to do, naming the repository."""
    monkeypatch.setattr(fences, "STALL_S", 0.3)
    repo.stage("main", "a", entry("a"))
    repo.commit("main", "a")
    repo.stage("main", "b", entry("b"))
    repo.fence("main", {**new_fence("the rename of a directory", src="x", dst="y"), "host": "another-host", "beat": 7})
    t0 = time.monotonic()
    with pytest.raises(BranchBusy, match="no progress for 0.3s") as ei:
        repo.commit("main", "b")
    assert ei.value.gone and 0.3 <= time.monotonic() - t0 < 10
    assert f"lakefuse branch reset lakefs://{repo.name}/main" in str(ei.value)
    # a fence whose count moves is waited for: the commit goes through once it is removed
    fence = {**new_fence("the rename of a directory", src="x", dst="y"), "host": "another-host", "beat": 0}
    repo.fence("main", fence)

    def progress() -> None:
        for n in range(1, 8):
            time.sleep(0.1)
            repo.fence("main", {**fence, "beat": n})
        repo.fence("main", None)

    t = threading.Thread(target=progress)
    t.start()
    assert repo.commit("main", "b after the rename")
    t.join()


def test_unsaved_writes_of_a_mount_refuse_commits_of_their_branch_from_anywhere_until_gone(repo):
    """A commit made outside the mount (the CLI, another mount or host) while a mount retries
    files whose saves failed would publish them without what was written: the mount's record
    refuses it at once, naming the files and the mount; other branches commit; once the record
    goes (saved, or taken over by a recovery) the same commit goes through."""
    repo.create_branch("other")
    repo.stage("main", "a", entry("a"))
    repo.stage("other", "o", entry("o"))
    files = [f"big/f{i:02d}.bin" for i in range(12)]
    repo.set_unsaved("w1", {"main": fences.new_unsaved(files, 12, "store down (test)", spool="/cache/spool/x")})
    assert [r["count"] for r in repo.unsaved_of("main")] == [12] and repo.unsaved_of("other") == []
    t0 = time.monotonic()
    with pytest.raises(fences.UnsavedWrites) as ei:
        repo.commit("main", "while a mount retries")
    msg = str(ei.value)
    assert time.monotonic() - t0 < 5 and "commit refused" in msg and "big/f00.bin" in msg and "and 2 more" in msg
    assert "big/f11.bin" not in msg and "store down (test)" in msg and "/cache/spool/x" in msg and "pid " in msg
    assert "damaged" not in msg  # (a record made by ordinary use reads as what it is)
    assert _tree(repo, repo.get_branch("main").commit_id) == []  # nothing committed; what was staged stays
    assert _tree(repo, "main") == ["a"]
    assert _tree(repo, repo.commit("other", "another branch").id) == ["o"]
    # another writer's record, and removing one writer's leaves the other's
    repo.set_unsaved("w2", {"main": fences.new_unsaved(["c"], 1, "kv down")})
    repo.set_unsaved("w1", {"main": None})
    with pytest.raises(fences.UnsavedWrites, match="1 file.*: c;"):
        repo.commit("main", "w2 still")
    assert repo.drop_unsaved_of("w2") == 1 and repo.drop_unsaved_of("w2") == 0
    assert _tree(repo, repo.commit("main", "saved").id) == ["a"]
    # a record on a branch that is gone is not put; deleting a branch removes its records
    repo.set_unsaved("w1", {"gone": fences.new_unsaved(["x"], 1, "e")})
    assert repo.unsaved_of("gone") == []
    repo.create_branch("dev")
    repo.set_unsaved("w1", {"dev": fences.new_unsaved(["x"], 1, "e")})
    repo.delete_branch("dev")
    repo.create_branch("dev")
    assert repo.unsaved_of("dev") == []
    assert repo.list_branches()  # (the repository record is found beside such rows)


def test_unsaved_writes_of_a_gone_process_say_so_and_a_full_reset_discards_them(repo):
    repo.stage("main", "a", entry("a"))
    repo.set_unsaved("w1", {"main": {**fences.new_unsaved(["f"], 1, "store down"), "pid": _dead_pid()}})
    with pytest.raises(fences.UnsavedWrites, match="its process is gone: mounting the repository again"):
        repo.commit("main", "a")
    repo.reset("main")  # the branch's uncommitted changes discarded, and the record with them
    assert repo.unsaved_of("main") == []
    repo.stage("main", "a", entry("a"))
    assert _tree(repo, repo.commit("main", "a").id) == ["a"]


def test_a_damaged_unsaved_record_refuses_the_commit_saying_it_is_damaged_and_reset_clears_it(repo):
    """A record of unsaved writes that does not decode still refuses the commit (it may stand for
    real unsaved files), and says that it is damaged and how to clear it -- not "0 file(s) of pid ?";
    a healthy record beside it is named as usual."""
    repo.stage("main", "a", entry("a"))
    repo.set_unsaved("w1", {"main": fences.new_unsaved(["f"], 1, "store down")})
    repo._env.write(lambda txn: txn.put(REPO, fences.unsaved_key("main", "w2"), b"\xff{not json"))
    with pytest.raises(fences.UnsavedWrites) as ei:
        repo.commit("main", "a")
    msg = str(ei.value)
    assert "cannot be read (damaged" in msg and "0 file(s)" not in msg and "1 file(s)" in msg, msg
    assert "lakefuse branch reset lakefs://" in msg
    repo.reset("main")
    assert repo.unsaved_of("main") == []
    repo.stage("main", "a", entry("a"))
    assert _tree(repo, repo.commit("main", "a").id) == ["a"]
