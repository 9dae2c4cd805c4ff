"""graveler.tree: renames restage entries (same physical addresses) in bounded transactions."""

from __future__ import annotations

import pytest

from graveler.errors import InvalidArgument, NotFound
from graveler.tree import rename_path, rename_prefix
from tests.graveler_testutil import make_repo


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path)


def addresses(repo, ref, prefix=b""):
    return {it.path: it.entry.address for it in repo.list(ref, prefix, delimiter="")}


def test_rename_path_keeps_the_object(repo):
    e = repo.upload("main", "a/x", b"data")
    rename_path(repo, "main", b"a/x", b"b/y")
    assert repo.get("main", "b/y").address == e.address and not repo.exists("main", "a/x")
    with pytest.raises(NotFound):
        rename_path(repo, "main", b"a/x", b"c")


def test_rename_prefix_moves_committed_and_staged_keys_without_copying(repo):
    for i in range(7):
        repo.upload("main", f"src/f{i}", b"%d" % i)
    repo.upload("main", "src/sub/deep", b"d")
    repo.commit("main", "base")
    repo.upload("main", "src/staged", b"s")
    repo.upload("main", "src-sibling", b"not moved")
    before = addresses(repo, "main", b"src/")
    objects_before = sorted(o.key for o in repo._store.list("data/"))
    calls = []
    orig = repo.stage_many
    repo.stage_many = lambda b, items: calls.append(len(items)) or orig(b, items)
    n = rename_prefix(repo, "main", b"src", b"dst/inner", batch=3)
    del repo.stage_many
    assert n == 9 and max(calls) <= 6 and len(calls) == 3
    after = addresses(repo, "main")
    assert {p: a for p, a in after.items() if p.startswith(b"dst/inner/")} == {
        b"dst/inner/" + p[4:]: a for p, a in before.items()
    }
    assert not any(p.startswith(b"src/") for p in after) and b"src-sibling" in after
    assert sorted(o.key for o in repo._store.list("data/")) == objects_before  # no object written


def test_interrupted_rename_finishes_when_run_again(repo):
    for i in range(10):
        repo.upload("main", f"s/{i}", b"x")
    orig = repo.stage_many
    state = {"n": 0}

    def flaky(b, items):
        state["n"] += 1
        if state["n"] == 2:
            raise RuntimeError("crash between batches")
        return orig(b, items)

    repo.stage_many = flaky
    with pytest.raises(RuntimeError):
        rename_prefix(repo, "main", b"s", b"t", batch=4)
    del repo.stage_many
    half = addresses(repo, "main")
    assert len(half) == 10  # every key at its old or its new path
    rename_prefix(repo, "main", b"s", b"t", batch=4)
    assert sorted(addresses(repo, "main")) == sorted(b"t/%d" % i for i in range(10))


def test_rename_prefix_refuses_bad_targets(repo):
    repo.upload("main", "a/b", b"x")
    with pytest.raises(InvalidArgument):
        rename_prefix(repo, "main", b"a", b"a/b/c")
    with pytest.raises(NotFound):
        rename_prefix(repo, "main", b"nothing", b"x")
    assert rename_prefix(repo, "main", b"a", b"a") == 0


def test_rename_prefix_refuses_a_path_past_the_limit_before_it_stages_anything(repo):
    from graveler.errors import PathTooLong
    from graveler.staging import MAX_PATH_BYTES

    deep = b"s/" + b"y" * 200 + b"/" + b"z" * 200 + b"/f"
    repo.upload("main", "s/a", b"a")
    repo.stage_many("main", [(deep, repo.get_value("main", b"s/a"))])
    before = addresses(repo, "main")
    calls = []
    grow = MAX_PATH_BYTES - len(deep) + 1  # one byte too many for the deepest key
    with pytest.raises(PathTooLong, match="makes a path of"):
        rename_prefix(repo, "main", b"s", b"s" * (1 + grow), batch=1, first=[(b"other", None)], staged=calls.append)
    assert calls == [] and addresses(repo, "main") == before  # nothing staged, the first batch's extras neither
    # one byte less fits; the extras go with the first batch, each batch is reported
    n = rename_prefix(repo, "main", b"s", b"s" * grow, batch=1, first=[(b"s/a-marker", None)], staged=calls.append)
    assert n == 2 and calls == [1, 1]
    assert sorted(addresses(repo, "main")) == sorted([b"s" * grow + b"/a", b"s" * grow + deep[1:]])
