"""Refs: names, ref expressions, commits (IDs, generations), log, merge base, the LMDB helper."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest

from graveler import kv
from graveler.errors import AlreadyExists, AmbiguousRef, InvalidArgument, NotFound
from graveler.refs import (
    Branch,
    Commit,
    RefManager,
    RefType,
    parse_ref,
    unix_seconds,
    validate_branch_name,
    validate_repository_name,
    validate_tag_name,
)
from tests.graveler_testutil import backend_kv

# --- names ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["main", "dev-1", "feature_x", "a", "_x", "0abc", "Main"])
def test_branch_names_ok(name):
    assert validate_branch_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "-x", "a/b", "a..b", "a b", "a~1", "a^", "main@", "a:b", ".x", "x.lock", "é", "a\x00", "a$",
             "main\n"]  # (a regex's "$" matches before a final newline: found by fuzzing)
)
def test_branch_names_bad(name):
    with pytest.raises(InvalidArgument, match="branch name"):
        validate_branch_name(name)


@pytest.mark.parametrize("name", ["v1.0", "release-2024", "a_b", "x.y.z", "Tag+1", "ünï"])
def test_tag_names_ok(name):
    assert validate_tag_name(name) == name


@pytest.mark.parametrize(
    "name, reason",
    [
        ("", "empty"),
        ("-x", "start"),
        (".x", "start"),
        ("x.", "end"),
        ("x.lock", "end"),
        ("a..b", r"\.\."),
        ("a b", "space"),
        ("a\tb", "control"),
        ("a~1", "~"),
        ("a^", r"\^"),
        ("a@{1}", "@"),
        ("@", "@"),
        ("a:b", ":"),
        ("a?", r"\?"),
        ("a*", r"\*"),
        ("a[", r"\["),
        ("a\\b", r"\\"),
        ("a/b", "/"),
        ("a$", r"\$"),
        ("ab" * 32, "commit ID"),
        ("v1\n", "control"),
    ],
)
def test_tag_names_bad(name, reason):
    with pytest.raises(InvalidArgument, match=reason):
        validate_tag_name(name)


@pytest.mark.parametrize("name", ["abc", "my-repo", "r0-0", "a" * 63])
def test_repo_names_ok(name):
    assert validate_repository_name(name) == name


@pytest.mark.parametrize("name", ["ab", "-abc", "Abc", "a_b", "a" * 64, "a.b", "", "demo\n"])
def test_repo_names_bad(name):
    with pytest.raises(InvalidArgument, match="repository name"):
        validate_repository_name(name)


# --- ref expressions ----------------------------------------------------------------


def test_parse_ref():
    assert parse_ref("main").modifiers == ()
    r = parse_ref("main~2^2")
    assert r.base == "main" and r.modifiers == (("~", 2), ("^", 2))
    assert parse_ref("main~").modifiers == (("~", 1),)
    assert parse_ref("main^").modifiers == (("^", 1),)
    assert parse_ref("main^0").modifiers == (("^", 0),)
    assert parse_ref("main@").modifiers == (("@", 1),)
    for bad in ["", "~1", "main@~1", "main@1", "main~x", "ma in", "main$", "main~1@", "main~\u0663"]:
        with pytest.raises(InvalidArgument):
            parse_ref(bad)


# --- commits ------------------------------------------------------------------------


def test_commit_id_lakefs_vector():
    """lakeFS's own test vector (pkg/graveler/ref/manager_test.go)."""
    go_zero = datetime(1, 1, 1, tzinfo=timezone.utc)
    assert unix_seconds(go_zero) == -62135596800
    c = Commit.create("user1", "message1", "deadbeef123", ["deadbeef1", "deadbeef12"], 2, {"foo": "bar"}, go_zero)
    assert c.id == "2277b5abd2d3ba6b4d35c48a0e358b0c4bcf5cd6d891c67437fb4c4af0d2fd4b"
    assert Commit.from_bytes(c.to_bytes()) == c
    assert c.computed_id() == c.id


def test_unix_seconds_floor():
    assert unix_seconds(datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=timezone.utc)) == -1
    assert unix_seconds(datetime(1970, 1, 1, 0, 0, 1, 999999)) == 1


@pytest.fixture
def rm(tmp_path):
    backend = kv.open_backend(backend_kv(tmp_path), tmp_path)
    yield RefManager(backend.open("repo1"))
    backend.close("repo1")


def _chain(rm: RefManager, n: int, parent: Commit | None = None, tag: str = "c") -> list[Commit]:
    out = []
    for i in range(n):
        parents = (parent.id,) if parent else ()
        gen = parent.generation + 1 if parent else 1
        c = Commit.create("t", f"{tag}{i}", "", parents, gen, {}, datetime.fromtimestamp(1_700_000_000 + i, timezone.utc))
        rm.put_commit(c)
        out.append(c)
        parent = c
    return out


def _merge_commit(rm: RefManager, left: Commit, right: Commit, msg: str = "m") -> Commit:
    c = Commit.create("t", msg, "", (left.id, right.id), max(left.generation, right.generation) + 1)
    rm.put_commit(c)
    return c


def test_resolve(rm):
    cs = _chain(rm, 4)
    env = rm.env
    env.write(lambda txn: rm.create_branch_txn(txn, "main", cs[-1].id))
    side = _chain(rm, 2, cs[1], "side")
    m = _merge_commit(rm, cs[-1], side[-1])
    env.write(lambda txn: rm.put_branch_txn(txn, Branch("main", m.id, "tok0000000000000", ("tok1111111111111",))))
    env.write(lambda txn: rm.create_tag_txn(txn, "v1", cs[0].id))

    r = rm.resolve("main")
    assert r.type is RefType.BRANCH and r.commit_id == m.id and r.branch == "main"
    assert r.tokens == ("tok0000000000000", "tok1111111111111") and not r.read_only
    r = rm.resolve("main@")
    assert r.type is RefType.COMMIT and r.commit_id == m.id and r.tokens == () and r.read_only
    assert rm.resolve("v1").type is RefType.TAG and rm.resolve("v1").commit_id == cs[0].id
    assert rm.resolve("main~1").commit_id == cs[-1].id
    assert rm.resolve("main^").commit_id == cs[-1].id
    assert rm.resolve("main^2").commit_id == side[-1].id
    assert rm.resolve("main^2~1").commit_id == side[0].id
    assert rm.resolve("main^2~2").commit_id == cs[1].id
    assert rm.resolve("main~4").commit_id == cs[0].id
    assert rm.resolve("main^0").commit_id == m.id
    assert rm.resolve(cs[2].id).commit_id == cs[2].id
    assert rm.resolve(cs[2].id.upper()).commit_id == cs[2].id
    assert rm.resolve(cs[2].id[:10]).type is RefType.COMMIT
    assert rm.resolve(cs[2].id[:10] + "~1").commit_id == cs[1].id
    with pytest.raises(NotFound):
        rm.resolve("main~5")
    with pytest.raises(NotFound, match="parent"):
        rm.resolve("main^3")
    with pytest.raises(NotFound):
        rm.resolve("nope")
    with pytest.raises(NotFound, match="at least 4 hex digits"):  # (a tour's wish: say why)
        rm.resolve(cs[0].id[:3])  # shorter than 4 hex digits is not a prefix
    with pytest.raises(NotFound, match=r"or commit\)$"):  # no hint where it cannot be the reason
        rm.resolve(cs[0].id[:3] + "z")
    with pytest.raises(InvalidArgument):
        rm.resolve("v1@")  # @ is for branches
    with pytest.raises(InvalidArgument):
        rm.resolve("main@~1")


def test_ambiguous_prefix(rm):
    seen: dict[str, Commit] = {}
    i = 0
    while True:  # find two commits sharing a 4-hex prefix
        c = Commit.create("t", f"m{i}", "", (), 1)
        i += 1
        if c.id[:4] in seen:
            rm.put_commit(c)
            rm.put_commit(seen[c.id[:4]])
            break
        seen[c.id[:4]] = c
    with pytest.raises(AmbiguousRef):
        rm.resolve(c.id[:4])
    assert rm.resolve(c.id[:20]).commit_id == c.id


def test_resolution_order(rm):
    """lakeFS's order: full commit ID, branch, tag, commit prefix."""
    a, b = _chain(rm, 2)
    rm.env.write(lambda txn: rm.create_branch_txn(txn, a.id[:8], b.id))  # a branch named like a prefix
    rm.env.write(lambda txn: rm.create_tag_txn(txn, a.id[:6], b.id))
    assert rm.resolve(a.id[:8]).type is RefType.BRANCH
    assert rm.resolve(a.id[:6]).type is RefType.TAG
    assert rm.resolve(a.id[:7]).commit_id == a.id
    rm.env.write(lambda txn: rm.create_branch_txn(txn, a.id, b.id))  # a branch named like a full ID
    assert rm.resolve(a.id).type is RefType.COMMIT and rm.resolve(a.id).commit_id == a.id


def test_branch_and_tag_records(rm):
    (c,) = _chain(rm, 1)
    rm.env.write(lambda txn: rm.create_branch_txn(txn, "main", c.id))
    with pytest.raises(AlreadyExists):
        rm.env.write(lambda txn: rm.create_branch_txn(txn, "main", c.id))
    with pytest.raises(NotFound):
        rm.env.write(lambda txn: rm.create_branch_txn(txn, "dev", "0" * 64))
    rm.env.write(lambda txn: rm.create_tag_txn(txn, "v1", c.id))
    with pytest.raises(AlreadyExists):
        rm.env.write(lambda txn: rm.create_tag_txn(txn, "v1", c.id))
    assert [t.name for t in rm.list_tags()] == ["v1"]
    rm.env.write(lambda txn: rm.delete_tag_txn(txn, "v1"))
    with pytest.raises(NotFound):
        rm.env.write(lambda txn: rm.delete_tag_txn(txn, "v1"))
    b = rm.get_branch("main")
    assert len(b.staging_token) == 16 and b.sealed_tokens == ()
    assert Branch.from_bytes(b.to_bytes()) == b


def test_damaged_ref_records_are_corrupted_data_and_healthy_ones_read(rm):
    """Found by fuzzing the refs database: a branch record naming another branch or holding no
    commit ID was taken as it read (listed as 'dew', or "commit not found", exit 3); a branch or
    commit key that is not UTF-8 escaped as UnicodeDecodeError; a commit dated beyond year 9999
    (or with nanoseconds out of range) as ValueError/OSError in every reader; a repository record
    under a damaged key made the repository vanish from `repo list`. Each is CorruptedData now;
    the records ordinary use writes still read."""
    from graveler.errors import CorruptedData
    from graveler.kv.base import BRANCHES, COMMITS, REPO
    from graveler.proto import graveler_pb2
    from graveler.refs import RepositoryRecord

    (c,) = _chain(rm, 1)
    rm.env.write(lambda txn: rm.create_branch_txn(txn, "main", c.id))
    rec = RepositoryRecord("repo1", "file:///ns", "main", datetime.now(timezone.utc))
    rm.env.write(lambda txn: rm.put_repository_txn(txn, rec))
    healthy = (rm.get_branch("main"), rm.list_branches(), list(rm.list_commits()), rm.get_repository())
    assert healthy[0].commit_id == c.id and [b.name for b in healthy[1]] == ["main"] and healthy[2] == [c]

    def put(table, key, value):
        rm.env.write(lambda txn: txn.put(table, key, value))

    def drop(table, key):
        rm.env.write(lambda txn: txn.delete(table, key))

    good = rm.get_branch("main")
    for name, pb in (("names dew", graveler_pb2.BranchData(id="dew", commit_id=c.id, staging_token="t")),
                     ("not a commit ID", graveler_pb2.BranchData(id="dev", commit_id="g" + c.id[1:],
                                                                 staging_token="t"))):
        put(BRANCHES, b"dev", pb.SerializeToString())
        with pytest.raises(CorruptedData, match="damaged branch record"):
            rm.get_branch("dev")
        with pytest.raises(CorruptedData, match="damaged branch record"):
            rm.list_branches()
        drop(BRANCHES, b"dev")
    put(BRANCHES, b"d\xffv", good.to_bytes())
    with pytest.raises(CorruptedData):
        rm.list_branches()
    drop(BRANCHES, b"d\xffv")

    for seconds, nanos, match in ((1 << 40, 0, "out of range"), (-(1 << 62), 0, "out of range"),
                                  (1_700_000_000, 2_000_000_000, "nanoseconds")):
        pb = c.to_proto()
        pb.creation_date.seconds, pb.creation_date.nanos = seconds, nanos
        put(COMMITS, c.id.encode(), pb.SerializeToString(deterministic=True))
        with pytest.raises(CorruptedData, match=match):
            rm.get_commit(c.id)
        with pytest.raises(CorruptedData, match=match):
            list(rm.list_commits())
    put(COMMITS, c.id.encode(), c.to_bytes())
    put(COMMITS, b"\xff" + c.id.encode()[1:], c.to_bytes())
    with pytest.raises(CorruptedData, match="keyed"):
        list(rm.list_commits())
    drop(COMMITS, b"\xff" + c.id.encode()[1:])

    with rm.env.read() as txn:  # (the record's bytes, moved under a damaged key)
        raw = txn.get(REPO, b"record")
    drop(REPO, b"record")
    with pytest.raises(NotFound):  # no record at all: a create that never finished, not damage
        rm.get_repository()
    put(REPO, b"reco\x01d", raw)
    with pytest.raises(CorruptedData, match="damaged repository record"):
        rm.get_repository()
    drop(REPO, b"reco\x01d")
    with pytest.raises(CorruptedData):
        RepositoryRecord.from_bytes(b"[" * 100_000 + b"]" * 100_000)
    put(REPO, b"record", raw)
    assert (rm.get_branch("main"), rm.list_branches(), list(rm.list_commits()), rm.get_repository()) == healthy


def test_log(rm):
    base = _chain(rm, 3)
    side = _chain(rm, 2, base[0], "s")
    m = _merge_commit(rm, base[-1], side[-1])
    assert [c.id for c in rm.log(m.id)] == [m.id, base[2].id, base[1].id, base[0].id]
    assert [c.id for c in rm.log(m.id, amount=2)] == [m.id, base[2].id]
    full = list(rm.log(m.id, first_parent=False))
    assert len(full) == 6 and full[0].id == m.id and full[-1].id == base[0].id
    assert len({c.id for c in full}) == 6
    dates = [c.creation_date for c in full]
    assert dates == sorted(dates, reverse=True)  # (a child of its parent's time before it: base[0], s0)


def test_the_full_log_is_by_creation_date_as_lakefs_and_git_show_it(rm):
    """Found by a refs tour: the full log went by generation, so after a merge of a 5-commit side
    branch, the branch's own newest commit came 6th of 8 (304th of 367 in a bigger one) and
    ``log -n 2`` missed it. lakeFS's log (and git's) is by date, newest first; lakeFS breaks ties
    by the higher commit ID."""
    def at(msg, parents, gen, t):
        c = Commit.create("t", msg, "", parents, gen, {}, datetime.fromtimestamp(1_700_000_000 + t, timezone.utc))
        rm.put_commit(c)
        return c

    root = at("root", (), 1, 0)
    side, p = [], root
    for i in range(5):
        p = at(f"side{i + 1}", (p.id,), p.generation + 1, 10 + i)
        side.append(p)
    main1 = at("main1", (root.id,), 2, 100)
    merge = at("merge", (main1.id, side[-1].id), 7, 200)
    got = [c.message for c in rm.log(merge.id, first_parent=False)]
    assert got == ["merge", "main1", "side5", "side4", "side3", "side2", "side1", "root"]
    assert [c.message for c in rm.log(merge.id, first_parent=False, amount=2)] == ["merge", "main1"]
    a, b = at("tie-a", (root.id,), 2, 300), at("tie-b", (root.id,), 2, 300)  # (one time: the higher ID first)
    tip = at("both", (a.id, b.id), 3, 400)
    got = [c.id for c in rm.log(tip.id, first_parent=False)][1:3]
    assert got == sorted([a.id, b.id], reverse=True)


def test_log_long(rm):
    cs = _chain(rm, 1500)
    assert [c.id for c in rm.log(cs[-1].id)] == [c.id for c in reversed(cs)]
    assert sum(1 for _ in rm.list_commits()) == 1500


def test_merge_base(rm):
    #   a0 - a1 - a2 - a3      (left)
    #          \         \
    #           b0 - b1 - m    (right: b1 merged with a3)
    a = _chain(rm, 4, tag="a")
    b = _chain(rm, 2, a[1], "b")
    assert rm.find_merge_base(a[3].id, b[1].id).id == a[1].id
    assert rm.find_merge_base(b[1].id, a[3].id).id == a[1].id
    assert rm.find_merge_base(a[3].id, a[3].id).id == a[3].id
    assert rm.find_merge_base(a[3].id, a[1].id).id == a[1].id  # ancestor
    m = _merge_commit(rm, b[1], a[3])
    a4 = _chain(rm, 1, a[3], "a4")[0]
    assert rm.find_merge_base(a4.id, m.id).id == a[3].id
    (lone,) = _chain(rm, 1, tag="lone")
    assert rm.find_merge_base(lone.id, a[3].id) is None
    assert rm.is_ancestor(a[1].id, m.id) and not rm.is_ancestor(m.id, a[1].id)
    assert not rm.is_ancestor(b[0].id, a4.id)


def test_merge_base_is_best_in_criss_cross(rm):
    """Both tips also reach the old root directly (as second parents): lakeFS's check
    at marking time would answer the root; the best common ancestor is x."""
    (y,) = _chain(rm, 1, tag="y")
    (x,) = _chain(rm, 1, y, "x")
    a = _chain(rm, 3, x, "a")
    b = _chain(rm, 3, x, "b")
    left = _merge_commit(rm, a[-1], y, "L")
    right = _merge_commit(rm, b[-1], y, "R")
    assert rm.find_merge_base(left.id, right.id).id == x.id
    assert rm.find_merge_base(right.id, left.id).id == x.id
    assert [c.id for c in rm.find_merge_bases(left.id, right.id)] == [x.id]  # y is x's ancestor: no better


# --- the LMDB helper ----------------------------------------------------------------


@pytest.mark.lmdb_only
def test_env_registry_and_growth(tmp_path):
    p = tmp_path / "e.lmdb"
    env = kv.open_env(p, kv.KVConfig(map_size=1 << 16, sync=False))
    assert kv.open_env(p) is env  # once per process
    big = b"x" * 4000

    def fill(txn):
        for i in range(200):
            txn.put(kv.STAGING, b"k%05d" % i, big)

    env.write(fill)  # 800 KB into a 64 KiB map: grows
    with env.read() as txn:
        assert txn.get(kv.STAGING, b"k00199") == big
    assert env.stat()["staging"] == 200
    kv.close_env(p)
    env2 = kv.open_env(p)
    assert env2 is not env
    with env2.read() as txn:
        assert txn.get(kv.STAGING, b"k00000") == big
    kv.close_env(p)


@pytest.mark.lmdb_only
def test_env_threads(tmp_path):
    p = tmp_path / "t.lmdb"
    env = kv.open_env(p, kv.KVConfig(map_size=1 << 16, sync=False))
    errors = []

    def writer(t):
        try:
            for i in range(100):
                env.write(lambda txn: txn.put(kv.STAGING, b"%d-%05d" % (t, i), b"v" * 2000))
                with env.read() as txn:
                    assert txn.get(kv.STAGING, b"%d-%05d" % (t, i)) is not None
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert env.stat()["staging"] == 800
    kv.close_env(p)


def test_prefix_successor():
    assert kv.prefix_successor(b"a/") == b"a0"
    assert kv.prefix_successor(b"a\xff") == b"b"
    assert kv.prefix_successor(b"\xff\xff") is None
    assert kv.prefix_successor(b"") is None


def test_change_stamp_counts_every_change_from_concurrent_stagers(tmp_path, kv_backend):
    """Every staged write adds exactly 1 to the branch's change stamp, also when concurrent
    stagers share a transaction (group commit) or race on a server; readers in and out of a
    transaction agree."""
    import threading

    from tests.graveler_testutil import make_repo

    repo = make_repo(tmp_path)
    src = tmp_path / "f"
    src.write_bytes(b"x")
    entry = repo.upload("main", "seed", str(src))
    start = repo.change_stamp("main")

    def stager(t):
        for i in range(25):
            repo.stage("main", f"t{t}/{i}", entry)

    threads = [threading.Thread(target=stager, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert repo.change_stamp("main") == start + 100
    core = repo._core
    with core.env.read() as txn:
        assert core.refs.stamp_txn(txn, "main") == start + 100


@pytest.mark.parametrize("expr", ["main..dev", "main?x=1", "a:b", "v*", "x[1]", "a\\b", "main..dev~1"])
def test_ref_syntax_no_branch_tag_or_commit_can_have_is_invalid_not_not_found(expr):
    """Found by a git user's tour: `log lakefs://repo/main..dev` was "not found" (exit 3): a range,
    or a character no branch, tag (lakeFS's rule too) or commit ID holds, is bad input (exit 2)."""
    with pytest.raises(InvalidArgument, match="invalid ref"):
        parse_ref(expr)


@pytest.mark.parametrize("expr", ["v1.0", "release-2024_01", "v1.0.1~2", "main@", "abcd12^2"])
def test_ref_expressions_with_dots_and_modifiers_still_parse(expr):
    assert parse_ref(expr).base
