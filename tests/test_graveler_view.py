"""graveler's side of the mount: Repository.view, per-branch change stamps, and failures that
must stay inside the error tree (every one a GravelerError)."""

from __future__ import annotations

import pytest

from graveler.errors import CorruptedData, GravelerError, InvalidArgument, NotFound, StoreUnavailable
from graveler.kv import TAGS
from tests.graveler_testutil import damage_second_range, entry, make_repo


@pytest.fixture
def repo(tmp_path):
    r = make_repo(tmp_path, "stamps")
    yield r
    r.close()


def test_change_stamp_moves_with_every_change_of_its_branch(repo):
    stamps = []

    def changed(op) -> bool:
        before = repo.change_stamp("main")
        op()
        after = repo.change_stamp("main")
        stamps.append(after)
        return after != before

    assert repo.change_stamp("nope") == 0
    assert changed(lambda: repo.stage("main", "a", entry("a")))
    assert changed(lambda: repo.stage_many("main", [("b", entry("b")), ("c", entry("c"))]))
    assert changed(lambda: repo.delete("main", "c"))
    assert changed(lambda: repo.commit("main", "one"))
    assert changed(lambda: repo.stage("main", "d", entry("d")))
    assert changed(lambda: repo.reset("main", path="d"))
    repo.create_branch("dev")
    assert not changed(lambda: repo.stage("dev", "x", entry("x")))  # another branch
    assert not changed(lambda: repo.commit("dev", "dev"))
    assert not changed(lambda: repo.create_tag("v1", "main"))
    assert changed(lambda: repo.merge("dev", "main"))
    assert changed(lambda: repo.reset("main"))
    assert stamps == sorted(stamps)  # never goes back
    s = repo.change_stamp("dev")
    repo.delete_branch("dev")
    assert repo.change_stamp("dev") > s
    repo.create_branch("dev")
    assert repo.change_stamp("dev") > s + 1


def test_view_is_the_repositorys_read_handle(repo):
    repo.stage("main", "a/b", entry("b"))
    v = repo.view("main")
    assert v.is_branch and v.branch == "main"
    assert v.stat(b"a").is_dir and v.stat(b"a/b").value is not None
    assert [it.path for it in v.list_page(b"", b"", 10)] == [b"a/"]
    with pytest.raises(NotFound):
        repo.view("nope")
    with pytest.raises(InvalidArgument):
        repo.view("main~x")


def test_upload_of_a_missing_source_is_not_found(repo, tmp_path):
    with pytest.raises(NotFound, match="not found"):
        repo.upload("main", "x", str(tmp_path / "no-such-file"))
    with pytest.raises(InvalidArgument):
        repo.upload("main", "x", str(tmp_path))  # a directory


def test_list_item_of_a_prefix_has_no_entry(repo):
    repo.stage("main", "d/x", entry("x"))
    (item,) = list(repo.list("main"))
    assert item.is_prefix
    with pytest.raises(InvalidArgument):
        item.entry


def test_damaged_tag_record_is_corrupted_data(repo):
    repo.create_tag("v1", "main")
    env = repo._env
    env.write(lambda txn: txn.put(TAGS, b"v1", b"\xff\xff\xff not a protobuf"))
    for call in (repo.list_tags, lambda: repo.resolve("v1"), lambda: repo.get_tag("v1")):
        with pytest.raises(CorruptedData):
            call()


@pytest.mark.parametrize("damage", ["commit id not hex", "commit id short", "another name", "no name"])
def test_a_damaged_tag_record_that_still_parses_is_corrupted_data(repo, damage):
    """protobuf parses many damaged byte strings without an error: a tag record whose
    commit ID lost a hex digit, or whose id names another tag, was taken as it read --
    a tag listed under another name, "commit not found" (exit 3), or the damage copied
    into a refs dump. Healthy tags (made here, or restored from a lakeFS dump) pass."""
    from graveler.proto import graveler_pb2

    c = repo.create_tag("v1", "main").commit_id
    repo.create_tag("v2", "main")
    assert [t.name for t in repo.list_tags()] == ["v1", "v2"] and repo.resolve("v1").commit_id == c
    bad = {"commit id not hex": ("v1", "g" + c[1:]), "commit id short": ("v1", c[:-1]),
           "another name": ("v9", c), "no name": ("", c)}[damage]
    raw = graveler_pb2.TagData(id=bad[0], commit_id=bad[1]).SerializeToString()
    repo._env.write(lambda txn: txn.put(TAGS, b"v1", raw))
    for call in (repo.list_tags, lambda: repo.resolve("v1"), lambda: repo.get_tag("v1")):
        with pytest.raises(CorruptedData, match=r"damaged tag record.* in v1$"):
            call()
    assert repo.resolve("v2").commit_id == c  # the other tag is healthy


def test_repository_deletion_failure_is_store_unavailable(tmp_path, monkeypatch):
    import shutil

    from tests.graveler_testutil import make_graveler

    g = make_graveler(tmp_path)
    g.create_repository("gone", f"file://{tmp_path}/ns")

    def fail(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(shutil, "rmtree", fail)
    with pytest.raises(StoreUnavailable):
        g.delete_repository("gone")
    assert issubclass(StoreUnavailable, GravelerError)


def test_stat_reads_a_few_staged_entries_not_a_batch(repo, monkeypatch):
    """stat answers from one to three entries: its staging read starts small (4), where a
    listing's starts at 64 -- a create in a directory of many staged files is not a scan."""
    from graveler.staging import StagingManager

    repo.stage_many("main", [(f"d/f{i:03d}", entry(f"e{i}")) for i in range(200)])
    limits: list[int | None] = []
    real = StagingManager.scan
    monkeypatch.setattr(StagingManager, "scan",
                        lambda self, token, start=b"", limit=None, end=None, guard=None:
                        (limits.append(limit), real(self, token, start, limit, end, guard))[1])
    v = repo.view("main")
    st = v.stat(b"d/f100")
    assert st.value is not None and not st.is_dir and limits == [4]
    limits.clear()
    assert v.stat(b"d").is_dir and limits == [4]
    limits.clear()
    assert len(v.list_page(b"d/", b"", 100)) == 100 and limits[0] == 64


def test_stat_of_a_healthy_path_does_not_open_the_damaged_range_after_it(tmp_path):
    """A path's stat asks what comes right after it (is it also a directory?): the metarange
    says the next range starts past anything under ``path/``, so that range is not opened,
    and a damaged one fails only the paths it holds."""
    from graveler.committed.writer import RangeParams

    r = make_repo(tmp_path, "damaged", range_params=RangeParams(min_range_size=0, max_range_size=1024,
                                                                raggedness=5))
    r.stage_many("main", [(f"d{i:02d}/f{j:02d}", entry(f"e{i}-{j}")) for i in range(8) for j in range(8)])
    r.commit("main", "many ranges")
    infos, victim = damage_second_range(r, tmp_path / "ns-damaged")
    v = r.view("main")
    before = infos[0].max_key  # the last key of the healthy range just before the damaged one
    st = v.stat(before)
    assert st.value is not None and not st.is_dir
    with pytest.raises(CorruptedData):
        v.stat(victim.min_key)
    after = infos[2].min_key
    assert v.stat(after).value is not None
