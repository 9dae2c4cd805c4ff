"""Issue 7.2: a valid table under another table's name is CorruptedData, never served as that table."""

from __future__ import annotations

import shutil

import pytest

from graveler.config import GravelerConfig
from graveler.errors import CorruptedData
from graveler.home import Graveler
from graveler.objstore import open_store
from lakefuse.cli import main


def _two_ranges(tmp_path, storage: str | None = None, store_config=None):
    """A repository whose main and other branches have one range each; returns (graveler, repo, main's range
    ID, other's range ID)."""
    cfg = GravelerConfig(home=tmp_path / "home", store=store_config)
    g = Graveler(cfg)
    repo = g.create_repository("rep1", storage or f"file://{tmp_path}/ns")
    repo.upload("main", "a/1", b"1")
    repo.commit("main", "main")
    repo.create_branch("other", "main")
    repo.upload("other", "b/2", b"2")
    repo.commit("other", "other")
    r_main = repo._core.committed.list_ranges(repo.get_commit("main").meta_range_id)[0].id
    r_other = repo._core.committed.list_ranges(repo.get_commit("other").meta_range_id)[-1].id  # b/2's range
    assert r_main != r_other
    return g, repo, r_main, r_other


def test_range_copied_over_another_is_corrupted_data(tmp_path, capsys):
    g, repo, r_main, r_other = _two_ranges(tmp_path)
    g.close()
    ns = tmp_path / "ns" / "_lakefs"
    shutil.copy(ns / r_other, ns / r_main)
    home = str(tmp_path / "home")
    capsys.readouterr()
    rc = main(["fs", "ls", "-r", "lakefs://rep1/main/", "--home", home])
    res = capsys.readouterr()
    assert rc == 5, res  # it listed other's entries (b/2) with exit 0
    assert "b/2" not in res.out and r_main in res.err and "wrong name" in res.err
    assert len(res.err.strip().splitlines()) == 1
    capsys.readouterr()
    assert main(["fs", "cat", "lakefs://rep1/other/b/2", "--home", home]) == 0  # the other branch still reads
    assert capsys.readouterr().out == "2"


def _count_table_hashes(monkeypatch) -> list[str]:
    from graveler.committed import reader

    calls: list[str] = []
    real = reader.computed_table_id
    monkeypatch.setattr(reader, "computed_table_id", lambda t: calls.append(t.name) or real(t))
    return calls


def _new_process_view(monkeypatch):
    """What a new process of the home starts with: no table memo in memory (the one on disk stays)."""
    from graveler import cache

    monkeypatch.setattr(cache, "_memos", {})


def test_tables_written_here_are_never_hashed_again(tmp_path, monkeypatch):
    """The writer hashed the records itself: the home's memo knows its files, no process checks them again."""
    g, repo, r_main, _ = _two_ranges(tmp_path)
    g.close()
    calls = _count_table_hashes(monkeypatch)
    _new_process_view(monkeypatch)
    g = Graveler(GravelerConfig(home=tmp_path / "home"))
    for _ in range(3):
        assert [i.path for i in g.repository("rep1").list("main", delimiter="")] == [b"a/1"]
    assert calls == []
    g.close()


def test_a_table_is_hashed_once_per_file_and_home(tmp_path, monkeypatch):
    """Tables the home has not seen (another home wrote them) are checked once; later processes of the
    home trust the memo while the file is the one checked; a file rewritten, touched or copied over since
    is checked again."""
    import os

    g, repo, r_main, r_other = _two_ranges(tmp_path)
    g.close()
    shutil.rmtree(tmp_path / "home" / "table-memo")  # as if another home had written the namespace
    calls = _count_table_hashes(monkeypatch)
    for _ in range(2):
        _new_process_view(monkeypatch)
        g = Graveler(GravelerConfig(home=tmp_path / "home"))
        for _ in range(3):
            assert [i.path for i in g.repository("rep1").list("main", delimiter="")] == [b"a/1"]
        g.close()
    assert len(calls) == 2  # main's metarange and its range, once each, in the first process only
    # the same bytes written again (a new inode, a new ctime): checked again, once
    path = tmp_path / "ns" / "_lakefs" / r_main
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    # a touched file (mtime moved back to what it was: the ctime still moved) is checked again too
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    _new_process_view(monkeypatch)
    calls.clear()
    g = Graveler(GravelerConfig(home=tmp_path / "home"))
    assert [i.path for i in g.repository("rep1").list("main", delimiter="")] == [b"a/1"]
    assert calls == [f"_lakefs/{r_main}"]
    g.close()


def test_memo_failures_mean_checking_again(tmp_path, caplog):
    """A memo that cannot be opened or written forgets (tables are hashed again), with one warning; it never
    fails a read."""
    from graveler.cache import CheckMemo

    (tmp_path / "memo").write_text("a file where the memo's directory should be")
    memo = CheckMemo(str(tmp_path / "memo"))
    fp = (1, 2, 3, 4, 5)
    memo.remember("file:///x/_lakefs/t", fp)
    assert memo.checked("file:///x/_lakefs/t", fp)  # this process remembers
    assert not memo.checked("file:///x/_lakefs/t", None) and not memo.checked("file:///x/_lakefs/u", fp)
    memo.put_facts("t", b"blob")
    assert memo.get_facts("t") == b"blob"
    assert sum("table check memo" in r.getMessage() for r in caplog.records) == 1  # one warning, not one per call
    assert not CheckMemo(str(tmp_path / "memo")).checked("file:///x/_lakefs/t", fp)
    ok = CheckMemo(str(tmp_path / "ok"))
    ok.remember("file:///x/_lakefs/t", fp)
    assert CheckMemo(str(tmp_path / "ok")).checked("file:///x/_lakefs/t", fp)  # another process of the home
    assert not CheckMemo(str(tmp_path / "ok")).checked("file:///x/_lakefs/t", (1, 2, 3, 4, 6))


def _fds_on(path) -> int:
    import os

    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
        except OSError:
            pass
    return n


def test_the_memo_keeps_one_connection_whatever_threads_use_it(tmp_path):
    """Found by a tour of a long-running mount: every commit's range writer (a thread of its own)
    opened an SQLite connection to the memo and left its files open: 1,283 descriptors after 600
    commits. Threads that come and go now share the memo's one connection."""
    from concurrent.futures import ThreadPoolExecutor

    from graveler.cache import CheckMemo

    memo = CheckMemo(str(tmp_path / "memo"))
    memo.remember("file:///x/_lakefs/first", (1, 2, 3, 4, 5))
    for i in range(60):  # as commits do: a writer pool per commit, gone after it
        with ThreadPoolExecutor(1) as pool:
            pool.submit(memo.remember, f"file:///x/_lakefs/t{i}", (1, 2, 3, 4, i)).result()
    other = CheckMemo(str(tmp_path / "memo"))  # healthy: what they remembered is there for another process
    assert all(other.checked(f"file:///x/_lakefs/t{i}", (1, 2, 3, 4, i)) for i in range(60))
    other.close()
    assert _fds_on(tmp_path / "memo") <= 6  # (one connection: the database, its WAL, its shared memory)
    memo.close()
    assert _fds_on(tmp_path / "memo") == 0


@pytest.mark.expect_log("a memo locked by another process is skipped, once")
def test_a_memo_locked_elsewhere_is_skipped_not_waited_for(tmp_path, monkeypatch, caplog):
    """Found by a tour with a low descriptor limit: the memo's write retried a database it could not
    use forever, at 100% CPU, and the commit that wrote a table hung. A memo that does not answer
    within its bound is skipped (it is an optimisation: the table is checked again), one warning."""
    import sqlite3
    import time

    from graveler.cache import CheckMemo

    monkeypatch.setattr(CheckMemo, "DB_TIMEOUT_S", 0.2)
    memo = CheckMemo(str(tmp_path / "memo"))
    memo.remember("file:///x/_lakefs/a", (1, 2, 3, 4, 5))
    lock = sqlite3.connect(str(tmp_path / "memo" / "cache.db"), isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # another process holding the database
    try:
        start = time.monotonic()
        for i in range(3):
            memo.remember(f"file:///x/_lakefs/b{i}", (1, 2, 3, 4, i))
        assert time.monotonic() - start < 5
        assert memo.checked("file:///x/_lakefs/b1", (1, 2, 3, 4, 1))  # this process remembers
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert sum("table check memo" in r.getMessage() for r in caplog.records) == 1
    memo.remember("file:///x/_lakefs/c", (1, 2, 3, 4, 5))  # the database is back: used again
    assert CheckMemo(str(tmp_path / "memo")).checked("file:///x/_lakefs/c", (1, 2, 3, 4, 5))


@pytest.mark.expect_log("the memo refused is said once")
@pytest.mark.parametrize("how", ["another user's", "writable by others"])
def test_a_memo_another_user_may_write_is_never_opened(tmp_path, caplog, how):
    """Found by a tour as a non-root user's admin: root running lakefuse on a user's home
    (``--home``) opened its table-check memo, a diskcache that unpickles what its rows say: the
    user planted a row that ran ``id`` as root. A memo directory another user owns or may write
    is not opened now (one warning; tables are checked again); a memo that is this user's --
    0700 as made now, or 0755 as older versions left it -- is used as before."""
    import os
    import pickle

    import diskcache

    from graveler.cache import CheckMemo

    ran = tmp_path / "ran"
    memo_dir = tmp_path / "memo"
    planted = diskcache.Cache(str(memo_dir))
    planted.set("file:///x/_lakefs/t", _Planted(str(ran)))  # a row diskcache unpickles on read
    planted.close()
    assert pickle.loads(pickle.dumps(_Planted(str(tmp_path / "proof")))) is None and (tmp_path / "proof").exists()
    if how == "another user's":
        for p in (memo_dir, *memo_dir.iterdir()):
            os.chown(p, 4242, 4242)
    else:
        memo_dir.chmod(0o777)
    memo = CheckMemo(str(memo_dir))
    assert not memo.checked("file:///x/_lakefs/t", (1, 2, 3, 4, 5)) and not ran.exists()
    memo.remember("file:///x/_lakefs/u", (1, 2, 3, 4, 5))
    assert memo.checked("file:///x/_lakefs/u", (1, 2, 3, 4, 5))  # this process's own memo
    assert sum("table check memo" in r.getMessage() for r in caplog.records) == 1
    for mode in (0o700, 0o755):  # healthy: this user's, whatever mode an older version made it with
        mine = tmp_path / f"mine{mode:o}"
        mine.mkdir(mode=mode)
        mine.chmod(mode)
        CheckMemo(str(mine)).remember("file:///x/_lakefs/t", (1, 2, 3, 4, 5))
        assert CheckMemo(str(mine)).checked("file:///x/_lakefs/t", (1, 2, 3, 4, 5))
    assert sum("table check memo" in r.getMessage() for r in caplog.records) == 1


class _Planted:
    """An object whose unpickling makes file ``path`` (what a planted row could do instead)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (_touch, (self.path,))


def _touch(path: str) -> None:
    open(path, "w").close()


@pytest.mark.s3
def test_s3_wrong_table_in_the_store_is_corrupted_and_not_cached(tmp_path, s3_bucket, s3_config):
    g, repo, r_main, r_other = _two_ranges(tmp_path, f"s3://{s3_bucket}/ns", s3_config)
    g.close()
    shutil.rmtree(tmp_path / "home" / "cache")
    st = open_store(f"s3://{s3_bucket}/ns", s3_config)
    st.put(f"_lakefs/{r_main}", st.get(f"_lakefs/{r_other}"))
    g = Graveler(GravelerConfig(home=tmp_path / "home", store=s3_config))
    repo = g.repository("rep1")
    with pytest.raises(CorruptedData, match="wrong name"):
        list(repo.list("main", delimiter=""))
    assert repo.read("other", "b/2") == b"2"  # what does not need the damaged range still reads
    g.close()
    st.close()
