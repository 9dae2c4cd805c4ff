"""The Graveler facade: repositories, branches, tags, staging, commit, diff, merge, revert,
reset, listing, upload / read, refs dump / restore, adopting a lakeFS metarange."""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from graveler import kv
from graveler.errors import (
    AlreadyExists,
    Conflict,
    DirtyBranch,
    InvalidArgument,
    MergeConflict,
    NotFound,
    NothingToCommit,
    PreconditionFailed,
    ReadOnlyRef,
)
from graveler.ident import TableHasher
from graveler.model import AddressType, DiffType, Entry, MergeStrategy
from graveler.objects import POSIX_MODE, POSIX_SYMLINK, PosixAttrs, new_data_address, split_full_address, user_metadata
from graveler.refs import Commit, RefType
from graveler.config import HOME_ENV, resolve_home
from graveler.sstable.reader import SSTable
from tests.graveler_testutil import contents, entry, make_graveler, make_repo
from tests.shared_paths import LAKEFS_FIXTURES

FIXTURES = LAKEFS_FIXTURES


@pytest.fixture
def repo(tmp_path):
    r = make_repo(tmp_path)
    yield r
    r.close()


def etags(repo, ref):
    return {k.decode(): v for k, v in contents(repo, ref).items()}


# --- repositories ---------------------------------------------------------------------


def test_home_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "envhome"))
    assert resolve_home(tmp_path / "given") == tmp_path / "given"
    assert resolve_home() == tmp_path / "envhome"
    monkeypatch.delenv(HOME_ENV)
    assert resolve_home() == Path("~/.local/share/lakefuse").expanduser()


def test_repository_lifecycle(tmp_path):
    g = make_graveler(tmp_path)
    r = g.create_repository("alpha", f"file://{tmp_path}/ns-a", default_branch="trunk", committer="ann")
    g.create_repository("beta", f"file://{tmp_path}/ns-b")
    assert [x.name for x in g.list_repositories()] == ["alpha", "beta"]
    assert g.kv.exists("alpha") and g.kv.names() == ["alpha", "beta"]
    c = r.get_commit("trunk")
    assert (c.message, c.committer, c.meta_range_id, c.generation, c.parents) == (
        "Repository created", "ann", "", 1, ()
    )
    assert [b.name for b in r.list_branches()] == ["trunk"]
    with pytest.raises(AlreadyExists):
        g.create_repository("alpha", f"file://{tmp_path}/ns-a")
    for bad in ["Alpha", "ab", "x_y"]:
        with pytest.raises(InvalidArgument):
            g.create_repository(bad, f"file://{tmp_path}/ns")
    with pytest.raises(InvalidArgument):
        g.create_repository("gamma", "relative/path")
    # another Graveler (another process, say) sees the same repository
    g2 = make_graveler(tmp_path)
    assert g2.repository("alpha").get_commit("trunk") == c
    g.delete_repository("beta")
    assert [x.name for x in g.list_repositories()] == ["alpha"]
    with pytest.raises(NotFound):
        g.repository("beta")
    with pytest.raises(NotFound):
        g.delete_repository("beta")
    g.close()


# --- branches and tags ------------------------------------------------------------------


def test_branches_and_tags(repo):
    repo.stage("main", "a", entry("a1"))
    c1 = repo.commit("main", "one")
    b = repo.create_branch("dev", "main")
    assert b.commit_id == c1.id
    with pytest.raises(AlreadyExists):
        repo.create_branch("dev")
    with pytest.raises(InvalidArgument):
        repo.create_branch("bad/name")
    with pytest.raises(NotFound):
        repo.create_branch("x", "nosuchref")
    repo.create_branch("old", "main~1")
    assert repo.get_branch("old").commit_id == c1.parents[0]
    assert [b.name for b in repo.list_branches()] == ["dev", "main", "old"]
    repo.stage("dev", "b", entry("b1"))
    repo.delete_branch("dev")
    assert [b.name for b in repo.list_branches()] == ["main", "old"]
    assert repo._staging.tokens_present() == set()  # dev's staging was dropped
    with pytest.raises(Conflict):
        repo.delete_branch("main")
    with pytest.raises(NotFound):
        repo.delete_branch("dev")

    t = repo.create_tag("v1", "main")
    assert t.commit_id == c1.id
    assert repo.resolve("v1").type is RefType.TAG
    with pytest.raises(AlreadyExists):
        repo.create_tag("v1", "old")
    with pytest.raises(InvalidArgument):
        repo.create_tag("v~1", "main")
    assert [t.name for t in repo.list_tags()] == ["v1"]
    assert etags(repo, "v1") == {"a": "a1"}
    repo.delete_tag("v1")
    with pytest.raises(NotFound):
        repo.delete_tag("v1")


def test_writes_to_read_only_refs(repo):
    repo.stage("main", "a", entry("a1"))
    c = repo.commit("main", "one")
    repo.create_tag("v1", "main")
    for ref in ["v1", c.id, c.id[:8], "main@", "main~1"]:
        with pytest.raises(ReadOnlyRef):
            repo.stage(ref, "x", entry("x"))
        with pytest.raises(ReadOnlyRef):
            repo.commit(ref, "m")
    with pytest.raises(NotFound):
        repo.stage("nobranch", "x", entry("x"))


# --- staging, reads, listing ------------------------------------------------------------


def test_staging_over_committed(repo):
    repo.stage_many("main", [("a/1", entry("a1")), ("a/2", entry("a2")), ("b", entry("b1"))])
    assert repo.has_uncommitted("main")
    c1 = repo.commit("main", "one", metadata={"k": "v"})
    assert c1.metadata == {"k": "v"} and c1.generation == 2
    assert not repo.has_uncommitted("main")
    repo.stage("main", "a/1", entry("a1-new"))
    repo.delete("main", "b")
    repo.stage("main", "c", entry("c1"))
    assert etags(repo, "main") == {"a/1": "a1-new", "a/2": "a2", "c": "c1"}
    assert etags(repo, "main@") == {"a/1": "a1", "a/2": "a2", "b": "b1"}
    assert repo.get("main", "a/1").etag == "a1-new"
    assert repo.get("main@", "a/1").etag == "a1"
    with pytest.raises(NotFound):
        repo.get("main", "b")
    assert repo.get("main@", "b").etag == "b1"
    with pytest.raises(NotFound):
        repo.delete("main", "b")  # already deleted
    with pytest.raises(NotFound):
        repo.delete("main", "nothing")
    diff = [(d.type, d.key) for d in repo.diff_uncommitted("main")]
    assert diff == [(DiffType.CHANGED, b"a/1"), (DiffType.REMOVED, b"b"), (DiffType.ADDED, b"c")]
    assert [d.key for d in repo.diff_uncommitted("main", b"a/")] == [b"a/1"]  # (only the prefix's keys read)
    assert [d.key for d in repo.diff_uncommitted("main", b"b")] == [b"b"]
    top = [(x.path, x.is_prefix) for x in repo.list("main")]
    assert top == [(b"a/", True), (b"c", False)]
    assert [x.path for x in repo.list("main", "a/", start_after="a/1")] == [b"a/2"]
    for bad in ["", "../x", "a/./b", "a\x00"]:
        with pytest.raises(InvalidArgument):
            repo.stage("main", bad, entry("x"))
        with pytest.raises(InvalidArgument):
            repo.get("main", bad)


def test_delete_prefix(repo):
    repo.stage_many("main", [(f"d/{i:04d}", entry(str(i))) for i in range(2500)] + [("d0", entry("x")), ("e", entry("e"))])
    repo.commit("main", "base")
    repo.stage("main", "d/new", entry("n"))
    assert repo.delete_prefix("main", "d/", batch=700) == 2501
    assert etags(repo, "main") == {"d0": "x", "e": "e"}
    with pytest.raises(InvalidArgument):
        repo.delete_prefix("main", "")
    c = repo.commit("main", "rm -r d/")
    assert etags(repo, c.id) == {"d0": "x", "e": "e"}


def test_staged_noops_are_not_changes(repo):
    repo.stage("main", "a", entry("a1"))
    repo.commit("main", "one")
    repo.stage("main", "a", entry("a1"))  # same identity
    repo.delete("main", "zzz", must_exist=False)  # tombstone for nothing
    assert not repo.has_uncommitted("main")
    with pytest.raises(NothingToCommit):
        repo.commit("main", "noop")
    assert repo.get_branch("main").sealed_tokens == ()  # unsealed again
    assert repo._staging.tokens_present() == set()
    c = repo.commit("main", "empty", allow_empty=True)
    assert c.meta_range_id == repo.get_commit("main~1").meta_range_id


def test_nothing_to_commit(repo):
    with pytest.raises(NothingToCommit):
        repo.commit("main", "nothing")
    before = repo.get_branch("main")
    assert before.sealed_tokens == ()
    c = repo.commit("main", "empty", allow_empty=True)
    assert c.parents == (before.commit_id,) and c.meta_range_id == ""


def test_listing_large_directory_skip(repo):
    repo.stage_many("main", [(f"dir/{i:05d}", entry(str(i))) for i in range(3000)] + [("file", entry("f"))])
    repo.commit("main", "bulk")
    repo.stage_many("main", [(f"dir/{i:05d}x", entry("s" + str(i))) for i in range(0, 3000, 7)])
    repo.stage_many("main", [("dir2/a", entry("d2")), ("dir/00001", None)])
    top = [(x.path, x.is_prefix) for x in repo.list("main")]
    assert top == [(b"dir/", True), (b"dir2/", True), (b"file", False)]
    inner = [x.path for x in repo.list("main", "dir/")]
    assert len(inner) == 3000 - 1 + 429
    assert inner == sorted(inner) and b"dir/00001" not in inner
    # paging with start_after gives the same thing
    paged, after = [], b""
    while True:
        page = [x.path for x, _ in zip(repo.list("main", "dir/", start_after=after), range(500))]
        if not page:
            break
        paged += page
        after = page[-1]
    assert paged == inner


def test_list_ignores_other_branches_staging(repo):
    repo.create_branch("dev")
    repo.stage("dev", "x", entry("x"))
    assert etags(repo, "main") == {} and etags(repo, "dev") == {"x": "x"}


# --- commit and concurrency details -------------------------------------------------------


def test_writes_during_commit_go_to_next_commit(repo):
    repo.stage("main", "a", entry("a1"))
    real_apply = repo._committed.apply
    during = {}

    def apply(base, changes):
        # another writer arrives while the commit is being computed
        repo.stage("main", "b", entry("b1"))
        during["main"] = etags(repo, "main")
        return real_apply(base, changes)

    repo._committed.apply = apply
    try:
        c1 = repo.commit("main", "first")
    finally:
        del repo._committed.apply
    assert during["main"] == {"a": "a1", "b": "b1"}  # sealed + new token both readable
    assert etags(repo, "main@") == {"a": "a1"}
    assert etags(repo, "main") == {"a": "a1", "b": "b1"}
    c2 = repo.commit("main", "second")
    assert c2.parents == (c1.id,) and etags(repo, "main@") == {"a": "a1", "b": "b1"}


def test_commit_cas_lost_keeps_changes(tmp_path):
    repo = make_repo(tmp_path, commit_retries=3, commit_retry_seconds=0)
    repo.stage("main", "a", entry("a1"))
    real_apply = repo._committed.apply
    intruder = "f" * 16

    def apply(base, changes):
        out = real_apply(base, changes)
        # another committer seals under us on every try: our CAS must fail
        def add_sealed(txn):
            b = repo._refs.get_branch_txn(txn, "main")
            repo._refs.put_branch_txn(txn, replace(b, sealed_tokens=b.sealed_tokens + (intruder,)))
        repo._env.write(add_sealed)
        return out

    repo._committed.apply = apply
    try:
        with pytest.raises(PreconditionFailed):
            repo.commit("main", "doomed")
    finally:
        del repo._committed.apply
    # nothing lost: the change is still staged (in a sealed token) and readable
    b = repo.get_branch("main")
    assert len(b.sealed_tokens) == 4
    assert etags(repo, "main") == {"a": "a1"}
    assert repo.has_uncommitted("main")
    repo._env.write(lambda txn: repo._refs.put_branch_txn(
        txn, replace(b, sealed_tokens=tuple(t for t in b.sealed_tokens if t != intruder))))
    c = repo.commit("main", "finally")
    assert etags(repo, c.id) == {"a": "a1"}
    assert repo.get_branch("main").sealed_tokens == ()
    assert repo._staging.tokens_present() == set()
    repo.close()


def test_commit_retries_after_concurrent_move(repo):
    """The branch moves once (another commit lands): the commit re-reads and succeeds."""
    repo.stage("main", "a", entry("a1"))
    real_apply = repo._committed.apply
    calls = []

    def apply(base, changes):
        changes = list(changes)
        calls.append(base)
        if len(calls) == 1:
            # a concurrent merge-like move of the head, leaving sealed tokens alone
            b = repo.get_branch("main")
            mr, _ = real_apply(base, [(b"z", entry("z1").to_value())])
            c = Commit.create("other", "concurrent", mr, (b.commit_id,), 2)
            assert repo._env.write(lambda txn: repo._core.move_branch_txn(txn, "main", b.commit_id, b.sealed_tokens, c))
            repo._env.write(lambda txn: repo._refs.put_branch_txn(
                txn, b.__class__("main", c.id, repo.get_branch("main").staging_token, b.sealed_tokens)))
        return real_apply(base, changes)

    repo._committed.apply = apply
    try:
        c = repo.commit("main", "mine")
    finally:
        del repo._committed.apply
    assert len(calls) == 2 and c.generation == 3
    assert etags(repo, "main") == {"a": "a1", "z": "z1"}


# --- reset -------------------------------------------------------------------------------


def test_reset(repo):
    repo.stage_many("main", [("a/1", entry("a1")), ("a/2", entry("a2")), ("b", entry("b1"))])
    repo.commit("main", "base")
    repo.stage_many("main", [("a/1", entry("x")), ("a/3", entry("y")), ("b", None), ("c", entry("z"))])
    repo.reset("main", path="b")
    assert etags(repo, "main") == {"a/1": "x", "a/2": "a2", "a/3": "y", "b": "b1", "c": "z"}
    repo.reset("main", prefix="a/")
    assert etags(repo, "main") == {"a/1": "a1", "a/2": "a2", "b": "b1", "c": "z"}
    repo.reset("main")
    assert etags(repo, "main") == etags(repo, "main@")
    assert not repo.has_uncommitted("main")
    assert repo._staging.tokens_present() == set()
    with pytest.raises(InvalidArgument):
        repo.reset("main", path="a", prefix="b")


def test_reset_tree_is_the_path_and_its_subtree_in_one_transaction(repo):
    """What the mount's `reset` of a name needs: a file or a directory, never a half-reset in between."""
    repo.stage_many("main", [("d", entry("d0")), ("d/x", entry("x0")), ("dz", entry("z0"))])
    repo.commit("main", "base")
    repo.stage_many("main", [("d", entry("d1")), ("d/x", None), ("d/y", entry("y1")), ("dz", entry("z1"))])
    stamp = repo.change_stamp("main")
    writes = []
    real = repo._env.write
    repo._env.write = lambda fn, *a, **k: writes.append(1) or real(fn, *a, **k)
    try:
        repo.reset("main", tree="d")
    finally:
        repo._env.write = real
    assert len(writes) == 1  # one transaction for the path and its subtree
    assert etags(repo, "main") == {"d": "d0", "d/x": "x0", "dz": "z1"}  # "dz" is not under "d/"
    assert repo.change_stamp("main") != stamp
    with pytest.raises(InvalidArgument):
        repo.reset("main", path="d", tree="d")


def test_reset_path_in_sealed_token(repo):
    """A failed commit leaves sealed tokens; resetting a path in them overrides it."""
    repo.stage("main", "keep", entry("k0"))
    repo.commit("main", "base")
    repo.stage_many("main", [("keep", entry("k1")), ("new", entry("n1")), ("d/x", entry("dx"))])
    b = repo.get_branch("main")
    sealed = b.__class__("main", b.commit_id, "e" * 16, (b.staging_token,))
    repo._env.write(lambda txn: repo._refs.put_branch_txn(txn, sealed))
    assert etags(repo, "main") == {"keep": "k1", "new": "n1", "d/x": "dx"}
    repo.reset("main", path="keep")
    repo.reset("main", prefix="d/")
    repo.reset("main", path="new")
    assert etags(repo, "main") == {"keep": "k0"}
    assert not repo.has_uncommitted("main")


# --- diff, merge, revert ------------------------------------------------------------------


def test_diff_refs(repo):
    repo.stage_many("main", [("a", entry("a1")), ("b", entry("b1"))])
    c1 = repo.commit("main", "one")
    repo.stage_many("main", [("a", entry("a2")), ("b", None), ("c", entry("c1"))])
    c2 = repo.commit("main", "two")
    d = [(x.type, x.key) for x in repo.diff(c1.id, "main")]
    assert d == [(DiffType.CHANGED, b"a"), (DiffType.REMOVED, b"b"), (DiffType.ADDED, b"c")]
    assert [(x.type, x.key) for x in repo.diff("main", "main~1")] == [
        (DiffType.CHANGED, b"a"), (DiffType.ADDED, b"b"), (DiffType.REMOVED, b"c")
    ]
    assert list(repo.diff(c2.id, "main")) == []


def test_merge(repo):
    repo.stage_many("main", [("a", entry("a1")), ("b", entry("b1")), ("c", entry("c1"))])
    base = repo.commit("main", "base")
    repo.create_branch("dev")
    repo.stage_many("dev", [("a", entry("a-dev")), ("d", entry("d-dev"))])
    dev1 = repo.commit("dev", "dev work")
    repo.stage_many("main", [("b", entry("b-main")), ("c", None)])
    main1 = repo.commit("main", "main work")
    m = repo.merge("dev", "main", committer="merger")
    assert m.parents == (main1.id, dev1.id) and m.generation == 4 and m.committer == "merger"
    assert m.message == "Merge 'dev' into 'main'"
    assert m.metadata[".lakefs.merge.strategy"] == "default"
    assert etags(repo, "main") == {"a": "a-dev", "b": "b-main", "d": "d-dev"}
    assert etags(repo, "dev") == {"a": "a-dev", "b": "b1", "c": "c1", "d": "d-dev"}
    with pytest.raises(NothingToCommit):
        repo.merge("dev", "main")  # already merged
    # dest is an ancestor of the source: still a merge commit (lakeFS style)
    m2 = repo.merge("main", "dev")
    assert m2.parents == (dev1.id, m.id)
    assert etags(repo, "dev") == etags(repo, "main")
    assert repo._refs.find_merge_base(m.id, base.id).id == base.id


def test_merge_conflicts_and_strategies(repo):
    repo.stage_many("main", [("a", entry("a1")), ("b", entry("b1"))])
    repo.commit("main", "base")
    repo.create_branch("dev")
    repo.stage_many("dev", [("a", entry("a-dev")), ("b", None)])
    repo.commit("dev", "dev")
    repo.stage_many("main", [("a", entry("a-main")), ("b", entry("b-main"))])
    repo.commit("main", "main")
    head = repo.get_branch("main").commit_id
    with pytest.raises(MergeConflict) as ei:
        repo.merge("dev", "main")
    assert sorted(ei.value.keys) == [b"a", b"b"]
    assert repo.get_branch("main").commit_id == head
    repo.create_branch("main2", "main")
    m = repo.merge("dev", "main", strategy="dest-wins")
    assert etags(repo, "main") == {"a": "a-main", "b": "b-main"}
    assert m.metadata[".lakefs.merge.strategy"] == "dest-wins"
    repo.merge("dev", "main2", strategy=MergeStrategy.SOURCE_WINS)
    assert etags(repo, "main2") == {"a": "a-dev"}
    with pytest.raises(InvalidArgument):
        repo.merge("dev", "main", strategy="ours")


def test_directory_markers_changed_on_both_sides_merge_and_revert_without_conflict(repo):
    """Found by a data team lead's tour: a mount writes a directory's marker (``out/``: its
    attributes) whenever something inside changes, so two jobs writing different files into one
    directory on two branches conflicted on ``out/``, and a revert of an old load conflicted with
    a later load into the same directory. git keeps no directories: both are clean. Between two
    changes of a marker the one changed last wins, a change wins over a deletion; a file still
    conflicts."""
    def marker(tag: str, t: int) -> Entry:
        return Entry(address=f"data/m/{tag}", size=0, etag="d41d8cd98f00b204e9800998ecf8427e", last_modified_ns=t,
                     metadata={"tag": tag})

    repo.stage("main", "keep", entry("k"))
    repo.commit("main", "base")
    repo.create_branch("a")
    repo.create_branch("b")
    repo.stage_many("a", [("out/", marker("a", 10)), ("out/a.csv", entry("a"))])
    repo.commit("a", "job a")
    repo.stage_many("b", [("out/", marker("b", 20)), ("out/b.csv", entry("b"))])
    repo.commit("b", "job b")
    repo.merge("a", "main")
    repo.merge("b", "main")  # (both added out/, differently: the later one, b's, is kept)
    got = {it.path: it.entry for it in repo.list("main", delimiter="")}
    assert sorted(got) == [b"keep", b"out/", b"out/a.csv", b"out/b.csv"] and got[b"out/"].metadata == {"tag": "b"}
    repo.create_branch("c", "a")
    repo.stage("c", "out/", marker("c", 5))  # changed before b's: main keeps b's
    repo.commit("c", "c")
    repo.merge("c", "main")
    assert repo.get("main", "out/").metadata == {"tag": "b"}
    # a revert of a load whose directory a later load changed again
    repo.stage_many("main", [("loads/", marker("l1", 30)), ("loads/one", entry("one"))])
    c1 = repo.commit("main", "load one")
    repo.stage_many("main", [("loads/", marker("l2", 40)), ("loads/two", entry("two"))])
    repo.commit("main", "load two")
    repo.revert("main", c1.id)  # (c1 added loads/, and later it changed: a change over a deletion)
    assert "loads/one" not in etags(repo, "main") and "loads/two" in etags(repo, "main")
    assert repo.get("main", "loads/").metadata == {"tag": "l2"}
    # a file changed on both sides still conflicts
    repo.create_branch("d")
    repo.stage("d", "out/a.csv", entry("a-d"))
    repo.commit("d", "d")
    repo.stage("main", "out/a.csv", entry("a-main"))
    repo.commit("main", "main")
    with pytest.raises(MergeConflict) as ei:
        repo.merge("d", "main")
    assert ei.value.keys == [b"out/a.csv"]


def test_merge_refusals(repo):
    repo.stage("main", "a", entry("a1"))
    repo.commit("main", "base")
    repo.create_branch("dev")
    repo.stage("dev", "b", entry("b1"))
    repo.commit("dev", "dev")
    repo.stage("main", "dirty", entry("x"))
    with pytest.raises(DirtyBranch):
        repo.merge("dev", "main")
    repo.reset("main")
    repo.create_tag("t", "main")
    with pytest.raises(ReadOnlyRef):
        repo.merge("dev", "t")
    with pytest.raises(NotFound):
        repo.merge("nosuch", "main")
    # unrelated history
    lone = Commit.create("x", "lone", "", (), 1)
    repo._refs.put_commit(lone)
    with pytest.raises(Conflict, match="common ancestor"):
        repo.merge(lone.id, "main")
    # merging the source branch uses its committed head, not its staging
    repo.stage("dev", "staged-only", entry("s"))
    repo.merge("dev", "main")
    assert "staged-only" not in etags(repo, "main")


def test_revert(repo):
    repo.stage_many("main", [("a", entry("a1")), ("b", entry("b1"))])
    c1 = repo.commit("main", "one")
    repo.stage_many("main", [("a", entry("a2")), ("b", None), ("c", entry("c1"))])
    c2 = repo.commit("main", "two")
    repo.stage("main", "d", entry("d1"))
    repo.commit("main", "three")
    r = repo.revert("main", c2.id[:10])
    assert r.message == f"Revert {c2.id}" and r.parents[0] != c1.id
    assert etags(repo, "main") == {"a": "a1", "b": "b1", "d": "d1"}
    with pytest.raises(NothingToCommit):
        repo.revert("main", c2.id)  # already reverted: nothing left to undo
    # conflict with a later change
    repo.stage("main", "a", entry("a3"))
    repo.commit("main", "four")
    with pytest.raises(MergeConflict):
        repo.revert("main", c1.id)
    # merge commits need a parent number
    repo.create_branch("dev", "main~1")
    repo.stage("dev", "e", entry("e1"))
    repo.commit("dev", "dev")
    m = repo.merge("dev", "main")
    with pytest.raises(InvalidArgument, match="parent"):
        repo.revert("main", m.id)
    with pytest.raises(InvalidArgument):
        repo.revert("main", m.id, parent_number=3)
    repo.revert("main", m.id, parent_number=1)
    assert "e" not in etags(repo, "main")
    repo.stage("main", "x", entry("x"))
    with pytest.raises(DirtyBranch):
        repo.revert("main", "main~2")


def test_log(repo):
    ids = [repo.get_branch("main").commit_id]
    for i in range(5):
        repo.stage("main", f"f{i}", entry(str(i)))
        ids.append(repo.commit("main", f"c{i}").id)
    assert [c.id for c in repo.log("main")] == ids[::-1]
    assert [c.message for c in repo.log("main", amount=2)] == ["c4", "c3"]
    assert [c.id for c in repo.log("main~3")] == ids[:3][::-1]
    assert repo.get_commit("main~5").message == "Repository created"


# --- data objects ---------------------------------------------------------------------------


def test_upload_and_read(repo, tmp_path):
    e = repo.upload("main", "d/bytes.bin", b"hello world", content_type="text/plain", metadata={"owner": "me"})
    assert e.address.startswith("data/") and e.address_type is AddressType.RELATIVE
    assert e.etag == "5eb63bbbe01eeed093cb22bb8f5acdc3" and e.size == 11  # md5
    assert e.content_type == "text/plain" and e.metadata == {"owner": "me"}
    src = tmp_path / "local.bin"
    src.write_bytes(os.urandom(300_000))
    e2 = repo.upload("main", "d/file.bin", str(src))
    e3 = repo.upload("main", "d/obj.bin", io.BytesIO(b"from a file object"))
    assert len({e.address, e2.address, e3.address}) == 3
    assert repo.read("main", "d/bytes.bin") == b"hello world"
    assert repo.read("main", "d/file.bin") == src.read_bytes()
    assert repo.read("main", "d/obj.bin") == b"from a file object"
    assert repo.read("main", "d/file.bin", offset=1000, length=10) == src.read_bytes()[1000:1010]
    c = repo.commit("main", "data")
    assert repo.read(c.id, "d/bytes.bin") == b"hello world"
    got = repo.get("main", "d/bytes.bin")
    assert got == e
    with pytest.raises(NotFound):
        repo.read("main", "nope")
    with pytest.raises(ReadOnlyRef):
        repo.upload(c.id, "x", b"x")
    assert len(list(repo._store.list("data/"))) == 3


def test_data_addresses_are_time_ordered():
    a = new_data_address(1_700_000_000_000_000_000)
    b = new_data_address(1_700_000_000_000_000_001)
    c = new_data_address(1_700_003_600_000_000_000)
    assert a.startswith("data/2023111422/") and c.startswith("data/2023111423/")
    assert a < b < c and len(a) == len(c)


def test_posix_metadata(repo):
    attrs = PosixAttrs(mode=0o120777, uid=1000, gid=100, symlink="../target")
    md = {**attrs.to_metadata(), "user-key": "v"}
    assert md[POSIX_MODE] == "120777" and md[POSIX_SYMLINK] == "../target"
    e = repo.upload("main", "link", b"", metadata=md)
    got = repo.get("main", "link")
    assert PosixAttrs.from_metadata(got.metadata) == attrs
    assert user_metadata(got.metadata) == {"user-key": "v"}
    assert PosixAttrs.from_metadata({}) == PosixAttrs()
    assert e.size == 0


def test_full_address(repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_bytes(b"imported")
    e = Entry(address=f"file://{outside}/f.txt", size=8, etag="x", address_type=AddressType.FULL)
    repo.stage("main", "imported", e)
    assert repo.read("main", "imported") == b"imported"
    assert split_full_address("s3://bucket/a/b") == ("s3://bucket", "a/b")
    assert split_full_address("file:///d/s/f") == ("file:///d/s", "f")
    with pytest.raises(InvalidArgument):
        split_full_address("nope")


# --- refs dump / restore, lakeFS metaranges --------------------------------------------------


def test_refs_dump_restore(tmp_path):
    g = make_graveler(tmp_path)
    ns = f"file://{tmp_path}/ns"
    r = g.create_repository("orig", ns)
    r.upload("main", "a", b"A")
    c1 = r.commit("main", "one", metadata={"k": "v"})
    r.create_branch("dev")
    r.upload("dev", "b", b"B")
    r.commit("dev", "two")
    r.merge("dev", "main")
    r.create_tag("v1", "main~1")
    r.upload("main", "staged", b"S")  # staging is not part of a dump
    manifest = r.dump_refs()
    expect = {"a": r.get("main@", "a").etag, "b": r.get("dev", "b").etag}
    raw = r._store.get("_lakefs/refs_manifest.json")
    assert raw.startswith(b'{\n  "branches_meta_range_id": ')
    assert set(manifest) == {"branches_meta_range_id", "commits_meta_range_id", "tags_meta_range_id"}
    recs = list(r._committed.iterator(manifest["commits_meta_range_id"]))
    assert [k.decode() for k, _ in recs] == sorted(c.id for c in r._refs.list_commits())
    # lose the LMDB files entirely, restore from the namespace alone
    g.close()
    shutil.rmtree(tmp_path / "home")
    g2 = make_graveler(tmp_path)
    r2 = g2.create_repository("orig", ns, bare=True)
    assert r2.list_branches() == []
    r2.restore_refs()
    assert [b.name for b in r2.list_branches()] == ["dev", "main"]
    assert r2.get_tag("v1").commit_id == c1.id
    assert r2.get_commit("main").parents[1] == r2.get_commit("dev").id
    assert etags(r2, "main") == expect
    assert r2.read("main", "b") == b"B"
    assert [c.message for c in r2.log("main")] == ["Merge 'dev' into 'main'", "one", "Repository created"]
    with pytest.raises(Conflict):
        r2.restore_refs(manifest)
    g2.close()


def test_restore_rejects_tampered_commit(tmp_path):
    g = make_graveler(tmp_path)
    r = g.create_repository("orig", f"file://{tmp_path}/ns")
    r.stage("main", "a", entry("a"))
    r.commit("main", "one")
    from graveler.model import Value
    from graveler.refsdump import _metadata

    commits = sorted(r._refs.list_commits(), key=lambda c: c.id)
    bad = commits[0].__class__(**{**{f: getattr(commits[0], f) for f in commits[0].__slots__}, "message": "forged"})
    recs = [(c.id.encode(), Value(c.id.encode(), c.to_bytes())) for c in [bad] + commits[1:]]
    recs.sort()
    manifest = r.dump_refs()
    manifest["commits_meta_range_id"] = r._committed.write_metarange(recs, _metadata("commit"))
    r2 = g.create_repository("bare", f"file://{tmp_path}/ns", bare=True)
    from graveler.errors import CorruptedData

    with pytest.raises(CorruptedData, match="does not match"):
        r2.restore_refs(manifest)
    g.close()


def test_restore_refuses_an_incomplete_or_inconsistent_dump(tmp_path):
    """Found by a lakeFS user's exploration: a dump without its root commit restored (exit 0)
    and `log` failed later; a branch record keyed "other" that named branch main silently put
    main on the wrong commit; a branch named "bad name~1" restored and no command could name
    it; a branch on a commit the dump lacks was "not found" (exit 3). Each is CorruptedData
    now, nothing restored; the healthy dump still restores."""
    from graveler.errors import CorruptedData
    from graveler.model import Value
    from graveler.proto import graveler_pb2
    from graveler.refsdump import _metadata

    g = make_graveler(tmp_path)
    r = g.create_repository("orig", f"file://{tmp_path}/ns")
    r.stage("main", "a", entry("a"))
    c1 = r.commit("main", "one")
    manifest = r.dump_refs()
    commits = sorted(r._refs.list_commits(), key=lambda c: c.id)
    root = [c for c in commits if not c.parents][0]

    def branches(*recs):
        return r._committed.write_metarange(sorted(
            (key.encode(), Value(cid.encode(), graveler_pb2.BranchData(id=name, commit_id=cid).SerializeToString()))
            for key, name, cid in recs), _metadata("branch"))

    no_root = [(c.id.encode(), Value(c.id.encode(), c.to_bytes())) for c in commits if c is not root]
    cases = {
        "names parent": {"commits_meta_range_id": r._committed.write_metarange(no_root, _metadata("commit"))},
        "keyed 'other' names branch 'main'": {"branches_meta_range_id": branches(("main", "main", root.id),
                                                                                 ("other", "main", c1.id))},
        "invalid branch name": {"branches_meta_range_id": branches(("bad name~1", "bad name~1", c1.id),
                                                                   ("main", "main", c1.id))},
        "names commit 0000": {"branches_meta_range_id": branches(("main", "main", "0000" * 16))},
    }
    for i, (match, change) in enumerate(cases.items()):
        bare = g.create_repository(f"bare{i}", f"file://{tmp_path}/ns", bare=True)
        with pytest.raises(CorruptedData, match=match):
            bare.restore_refs({**manifest, **change})
        assert bare.list_branches() == [] and bare._refs.count_commits() == 0  # nothing restored
    ok = g.create_repository("whole", f"file://{tmp_path}/ns", bare=True)
    ok.restore_refs(manifest)
    assert ok.get_commit("main").id == c1.id
    g.close()


def test_a_dump_keeps_the_tags_lakeFS_allows_and_each_is_reached_by_its_name(tmp_path):
    """Found by a lakeFS power user's exploration: a dump holding a tag lakeFS's own rule allows
    (``release/1.0``) was refused as corrupted (exit 5), as new tags are stricter. Such tags
    restore, list and resolve by their exact name (``v~old``'s before reading ``~``); one lakeFS
    refuses (a space) is still CorruptedData; and a new tag may not be named so, nor with 64 hex
    digits (a full commit ID wins: the tag could never be reached)."""
    from graveler.errors import CorruptedData, InvalidArgument
    from graveler.model import Value
    from graveler.proto import graveler_pb2
    from graveler.refsdump import _metadata

    g = make_graveler(tmp_path)
    r = g.create_repository("orig", f"file://{tmp_path}/ns")
    r.stage("main", "a", entry("a"))
    c1 = r.commit("main", "one")
    r.stage("main", "b", entry("b"))
    c2 = r.commit("main", "two")
    r.create_tag("v", c2.id)
    manifest = r.dump_refs()

    def tags(*names):
        return r._committed.write_metarange(sorted(
            (n.encode(), Value(c1.id.encode(), graveler_pb2.TagData(id=n, commit_id=c1.id).SerializeToString()))
            for n in names), _metadata("tag"))

    lakefs_only = ["release/1.0", "v~old", "a@b", "cost$", "v"]
    ok = g.create_repository("whole", f"file://{tmp_path}/ns", bare=True)
    ok.restore_refs({**manifest, "tags_meta_range_id": tags(*lakefs_only)})
    assert sorted(t.name for t in ok.list_tags()) == sorted(lakefs_only)
    for name in lakefs_only:
        assert ok.resolve(name).commit_id == c1.id, name
    assert ok.resolve("v~1").commit_id != c1.id  # no tag of that name: the expression on tag v
    assert ok.resolve("main~1").commit_id == c1.id
    for bad in ("bad name", "x^1", "a..b", "ends/"):
        bare = g.create_repository(f"bare{abs(hash(bad)) % 1000}", f"file://{tmp_path}/ns", bare=True)
        with pytest.raises(CorruptedData, match="lakeFS's rule"):
            bare.restore_refs({**manifest, "tags_meta_range_id": tags(bad)})
        assert bare.list_tags() == []
    for new in ("release/2.0", "w~old", c2.id, "ab" * 32):
        with pytest.raises(InvalidArgument):
            r.create_tag(new, c1.id)
    g.close()


def _table_id(path: Path) -> str:
    t = SSTable(path.read_bytes(), str(path))
    h = TableHasher()
    for k, v in t:
        h.add(k, v)
    props = {k: v.decode() for k, v in t.raw_properties.items() if k == "type"}
    return h.finish(props)


def test_adopt_lakefs_metarange(tmp_path):
    """A real lakeFS metarange and range, adopted as a commit; RELATIVE addresses resolve
    against the namespace."""
    g = make_graveler(tmp_path)
    nsdir = tmp_path / "lakefs-ns"
    r = g.create_repository("lake", f"file://{nsdir}")
    range_id = _table_id(FIXTURES / "range.sst")
    assert range_id.startswith("a83af763") and range_id.endswith("3d0e")
    mr_id = _table_id(FIXTURES / "metarange.sst")
    (nsdir / "_lakefs").mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "range.sst", nsdir / "_lakefs" / range_id)
    shutil.copy(FIXTURES / "metarange.sst", nsdir / "_lakefs" / mr_id)
    (nsdir / "fdf87fcf9ec849f98514ddb7e041ad56").write_bytes(b"yes\n")  # the etag in the fixture is its MD5
    with pytest.raises(NotFound):
        r.commit_metarange("main", "0" * 64, "bad")
    c = r.commit_metarange("main", mr_id, "adopt lakeFS metarange", metadata={"source": "lakefs"})
    assert c.meta_range_id == mr_id and c.generation == 2
    assert [(x.path, x.entry.size) for x in r.list("main", "a/b/c/")] == [(b"a/b/c/no", 11), (b"a/b/c/yes", 4)]
    assert [x.path for x in r.list("main")] == [b"a/"]
    assert r.read("main", "a/b/c/yes") == b"yes\n"
    # and the usual operations work on top of it
    r.upload("main", "a/b/c/new", b"new")
    r.delete("main", "a/b/c/no")
    c2 = r.commit("main", "on top")
    assert [x.path for x in r.list(c2.id, delimiter="")] == [b"a/b/c/new", b"a/b/c/yes"]
    r.stage("main", "dirty", entry("d"))
    with pytest.raises(DirtyBranch):
        r.commit_metarange("main", mr_id, "again")
    g.close()


@pytest.mark.lmdb_only
def test_env_is_shared_not_reopened(tmp_path):
    r = make_repo(tmp_path)
    assert kv.open_env(r._env.path) is r._env
    r.close()


def test_a_branch_named_as_a_full_commit_id_is_refused(repo):
    """A ref of 64 hex digits resolves as a commit ID: a branch of that name was made, listed, and
    could never be reached (its directory showed the commit). Refused now; shorter hex names,
    which lakeFS allows, stay allowed."""
    c = repo.commit("main", "base", allow_empty=True)
    for name in (c.id, "ab" * 32):
        with pytest.raises(InvalidArgument, match="64 hex digits"):
            repo.create_branch(name)
    repo.create_branch("ab" * 31)
    assert "ab" * 31 in {b.name for b in repo.list_branches()}


def test_a_negative_size_is_refused_when_staged_and_damage_when_read(tmp_path):
    """Found by fuzzing: an entry of size -5 was staged, listed as "-5 B", and `fs cat` blamed the
    caller ("bad byte range", exit 2). Staging refuses it (InvalidArgument); a stored one is
    CorruptedData (exit 5); size 0 is an entry like any other."""
    from graveler.errors import CorruptedData, InvalidArgument
    from graveler.model import Entry, Value, py_entry_proto

    assert Entry.from_proto_bytes(py_entry_proto("data/x", 0, "e", 0, {}, 0, "")).size == 0
    with pytest.raises(CorruptedData, match="size -5"):
        Entry.from_proto_bytes(py_entry_proto("data/x", -5, "e", 0, {}, 0, ""))
    with pytest.raises(CorruptedData, match="size -5"):
        Entry.from_value(Value(b"id", py_entry_proto("data/x", -5, "e", 0, {}, 0, "")))
    g = make_graveler(tmp_path)
    r = g.create_repository("neg", f"file://{tmp_path}/ns")
    with pytest.raises(InvalidArgument, match="size -5"):
        r.stage("main", "neg", Entry("data/nothing", -5, "d41d8cd98f00b204e9800998ecf8427e"))
    r.stage("main", "empty", Entry("data/nothing", 0, "d41d8cd98f00b204e9800998ecf8427e"))
    assert r.get("main", "empty").size == 0
    g.close()


def _criss_cross(r, f_x: str = "f1", g_y: str = "g1", k: tuple[str, str] | None = None):
    """The criss-cross history of a lakeFS power user's exploration: x and y fork from B (f, g at
    "0"), x commits X1 (f), y commits Y1 (g), then each merges the other's first commit (MX = X1+Y1,
    MY = Y1+X1: X1 and Y1 are both best merge bases of what follows), then x commits X2 (f again)
    and y commits Y2 (h). ``k``: X1 and Y1 also set key k, each its own value (MX keeps x's,
    MY y's)."""
    from graveler.model import MergeStrategy

    r.stage("main", "f", entry("f0"))
    r.stage("main", "g", entry("g0"))
    if k:
        r.stage("main", "k", entry("k0"))
    r.commit("main", "B")
    r.create_branch("x", "main")
    r.create_branch("y", "main")
    r.stage("x", "f", entry(f_x))
    if k:
        r.stage("x", "k", entry(k[0]))
    x1 = r.commit("x", "X1")
    r.stage("y", "g", entry(g_y))
    if k:
        r.stage("y", "k", entry(k[1]))
    y1 = r.commit("y", "Y1")
    r.create_branch("x1", x1.id)
    r.merge("y", "x", strategy=MergeStrategy.DEST_WINS)
    r.merge("x1", "y", strategy=MergeStrategy.DEST_WINS)
    r.stage("x", "f", entry("f2"))
    r.commit("x", "X2")
    r.stage("y", "h", entry("h1"))
    r.commit("y", "Y2")
    return x1, y1


def test_a_criss_cross_merge_takes_git_s_virtual_base_not_one_base_of_two(tmp_path):
    """Found by a git/lakeFS power user's exploration: with two best merge bases (X1, Y1) the merge
    took the newer one, Y1, where f is still "0": f changed on both sides, a conflict git merges
    cleanly (f=2 g=1 h=1 through a virtual base, X1 and Y1 merged). Now both bases are found
    (``find_merge_bases``) and merged into a virtual base; what the bases disagree on stays as
    their own base had it, so a real disagreement is still a conflict; one base is as before."""
    from graveler.errors import MergeConflict

    r = make_repo(tmp_path)
    x1, y1 = _criss_cross(r)
    x, y = r.get_commit("x"), r.get_commit("y")
    assert {c.id for c in r._refs.find_merge_bases(x.id, y.id)} == {x1.id, y1.id}
    assert r._refs.find_merge_bases(x1.id, x.id) == [r._refs.get_commit(x1.id)]  # an ancestor: itself alone
    r.create_branch("x-again", x.id)
    r.merge("y", "x")
    want = {b"f": "f2", b"g": "g1", b"h": "h1"}
    assert contents(r, "x") == want
    r.merge("x-again", "y")  # the other way round: the same tree
    assert contents(r, "y") == want

    r2 = make_repo(tmp_path, "repo2")
    _criss_cross(r2, k=("kx", "ky"))  # MX kept kx, MY ky: the sides disagree on k since the bases did
    with pytest.raises(MergeConflict) as e:
        r2.merge("y", "x")
    assert e.value.keys == [b"k"]  # f, g and h merge as before


def test_a_key_both_merge_bases_added_apart_is_in_the_virtual_base_so_a_deletion_of_it_conflicts(tmp_path):
    """Found by a git/lakeFS power user's differential fuzz against git: p and q each add f their
    own way (B, C) and merge each other's first commit keeping their own (criss-cross), then p
    deletes f. Merging q into p brought f=C back, exit 0: the virtual base left f out (the
    bases' own base has none), so q's f looked like an addition. git's virtual base keeps such a
    path (with content of its own): modify/delete, a conflict -- ours now too; where both sides
    still agree the merge stays clean."""
    from graveler.errors import MergeConflict
    from graveler.model import MergeStrategy

    def history(name: str, p_last: str | None, q_last: str | None):
        r = make_repo(tmp_path, name)
        r.stage("main", "base", entry("0"))
        r.commit("main", "B")
        r.create_branch("p", "main")
        r.create_branch("q", "main")
        r.stage("p", "f", entry("B"))
        p1 = r.commit("p", "p1")
        r.stage("q", "f", entry("C"))
        q1 = r.commit("q", "q1")
        r.create_branch("p1", p1.id)
        r.create_branch("q1", q1.id)
        r.merge("q1", "p", strategy=MergeStrategy.DEST_WINS)  # p keeps B
        r.merge("p1", "q", strategy=MergeStrategy.DEST_WINS)  # q keeps C
        for b, last in (("p", p_last), ("q", q_last)):
            if last != "keep":
                r.stage(b, "f", None if last is None else entry(last))
                r.stage(b, "other-" + b, entry(b))
                r.commit(b, f"{b}2")
        return r

    r = history("deleted", None, "keep")
    with pytest.raises(MergeConflict) as e:
        r.merge("q", "p")
    assert e.value.keys == [b"f"] and not r.exists("p", "f")
    r = history("both-deleted", None, None)  # both sides gave it up: clean, and it stays gone
    r.merge("q", "p")
    assert not r.exists("p", "f") and r.exists("p", "other-q")
    r = history("both-same", "D", "D")  # both made it the same: clean
    r.merge("q", "p")
    assert contents(r, "p")[b"f"] == "D"
    r = history("apart", "keep", "keep")  # still B against C: a conflict, as before
    with pytest.raises(MergeConflict):
        r.merge("q", "p")


@pytest.mark.parametrize("op", ["commit", "reset", "delete_branch", "merge"])
def test_a_head_move_that_succeeded_is_reported_so_when_its_staging_cleanup_fails(tmp_path, caplog, op):
    """Found by an SRE cutting the KV's connections as a commit moved the head: the cleanup of
    the sealed staging rows failed after the transaction that moved the head, so a commit that
    had been made was reported failed (exit 6; the control file's read-back "ok": false, a
    retry "nothing to commit"), and its rows stayed for good (15,000 piled up; `kv copy`
    copied them as staged entries). Now the operation stands and says so; the rows left are
    orphans, which the next head move removes -- and only those: every branch keeps its own."""
    from graveler.errors import StoreUnavailable

    r = make_repo(tmp_path)
    r.create_branch("keep", "main")
    r.stage("keep", "k", entry("k"))  # another branch's staged change: never an orphan
    r.create_branch("side", "main")
    r.stage("side", "s", entry("s"))
    r.stage("main", "a", entry("a"))
    core = r._core
    before = core.staging.tokens_present()
    real = core.staging.drop_many

    def cut(tokens):
        raise StoreUnavailable("the KV's connection was cut")

    core.staging.drop_many = cut
    try:
        if op == "commit":
            assert r.commit("main", "one").message == "one"
        elif op == "reset":
            r.reset("main")
        elif op == "delete_branch":
            r.delete_branch("side")
        else:
            core.staging.drop_many = real
            r.commit("main", "base")
            r.stage("main", "a", entry("a"))  # a staged no-op: the merge seals it, and drops it after
            r.commit("side", "s")
            core.staging.drop_many = cut
            assert r.merge("side", "main").parents
    finally:
        core.staging.drop_many = real
    assert "staged rows stay for now" in caplog.text
    orphans = core.staging.tokens_present() - {t for b in r.list_branches() for t in b.tokens}
    assert orphans  # (left by the cut)
    r.stage("main", "b", entry("b"))
    r.commit("main", "two")  # the next head move removes them
    present = core.staging.tokens_present()
    assert not present - {t for b in r.list_branches() for t in b.tokens}
    assert r.get_branch("keep").staging_token in present and r.exists("keep", "k")
    assert before  # (there were staged rows to begin with)


def test_a_revert_conflict_says_later_commits_only_for_a_commit_in_the_branch_history(tmp_path):
    """Found by a git power user's tour: reverting a commit of another branch whose paths this
    branch holds otherwise conflicted (rightly) with "later commits changed them again", though the
    commit is not in this branch's history at all; that hint is kept for a commit that is."""
    from graveler.errors import MergeConflict

    r = make_repo(tmp_path)
    r.stage("main", "a", entry("A1"))
    r.commit("main", "one")
    r.create_branch("dev", "main")
    r.stage("dev", "a", entry("DEV"))
    dev = r.commit("dev", "dev changes a")
    r.stage("main", "a", entry("A2"))
    mine = r.commit("main", "main changes a")
    r.stage("main", "a", entry("A3"))
    r.commit("main", "main changes a again")
    with pytest.raises(MergeConflict) as e:
        r.revert("main", dev.id)
    assert e.value.keys == [b"a"] and "not in this branch's history" in str(e.value)
    with pytest.raises(MergeConflict) as e:
        r.revert("main", mine.id)
    assert "later commits changed them again" in str(e.value)
