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


def test_a_branch_made_again_after_a_delete_is_another_branch_to_its_old_views_and_writers(repo):
    """A view of a branch follows that branch, never a later branch of its name (a data team
    lead's tour: a mount's tree of a deleted branch showed the one made again, and wrote into
    it); a staging write given the old branch's birth is NotFound there. A branch made by an
    older version (no birth kept) is one birth, None."""
    repo.stage("main", "a", entry("a"))
    repo.commit("main", "a")
    repo.create_branch("dev")
    repo.stage("dev", "d", entry("d"))
    view, born = repo.view("dev"), repo.branch_born("dev")
    assert view.born == born is not None and view.stat(b"d").value is not None
    repo.stage_stamped("dev", [("e", entry("e"))], born=born)  # (its own branch: staged)
    repo.delete_branch("dev")
    repo.create_branch("dev")
    assert repo.branch_born("dev") not in (None, born)
    with pytest.raises(NotFound, match="made again"):
        view.refresh()
    with pytest.raises(NotFound, match="made again"):
        repo.stage_stamped("dev", [("late", entry("late"))], born=born)
    assert not repo.exists("dev", "late")
    with pytest.raises(NotFound, match="made again"):
        repo.stage_if("dev", "late", entry("late"), None, born=born)
    repo.stage_stamped("dev", [("now", entry("now"))], born=repo.branch_born("dev"))
    assert repo.view("dev").stat(b"now").value is not None


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


def test_stat_reads_no_staged_delete_past_the_keys_it_asks_about(repo, monkeypatch):
    """A stat of a name followed by many staged deletes (a directory emptied from its end) reads
    none of them: the staging read stops where the name's own keys end, as the committed read
    does. (It walked them all, one stat per unlink: quadratic.)"""
    from graveler.staging import StagingManager

    repo.stage_many("main", [(f"d/f{i:04d}", entry(f"e{i}")) for i in range(1000)])
    repo.commit("main", "many")
    repo.stage_many("main", [(f"d/f{i:04d}", None) for i in range(1, 1000)])  # all but the first
    read = [0]
    real = StagingManager.scan_txn
    monkeypatch.setattr(StagingManager, "scan_txn",
                        lambda self, *a, **k: (lambda out: (read.__setitem__(0, read[0] + len(out)), out)[1])(
                            real(self, *a, **k)))
    v = repo.view("main")
    st = v.stat(b"d/f0000")
    assert st.value is not None and not st.is_dir and read[0] <= 1
    assert v.stat(b"d/f0500").value is None  # a staged delete still hides its committed key
    assert [it.path for it in v.list_page(b"d/", b"", 10)] == [b"d/f0000"]


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


def test_a_listing_of_a_healthy_directory_does_not_open_the_damaged_range_after_it(tmp_path):
    """A listing reads its records a batch at a time, past the directory's last name: never into
    a range that starts after the directory's keys (a damaged one fails only its own directories)."""
    from graveler.committed.writer import RangeParams

    r = make_repo(tmp_path, "damaged", range_params=RangeParams(min_range_size=0, max_range_size=1024,
                                                                raggedness=5))
    r.stage_many("main", [(f"d{i:02d}/f{j:02d}", entry(f"e{i}-{j}")) for i in range(12) for j in range(3)])
    r.commit("main", "many ranges")
    infos = r._committed.list_ranges(r.get_commit("main").meta_range_id)
    # a range that starts a directory, after one that ends the directory before it
    top = [k[: k.index(b"/") + 1] for k in (i.min_key for i in infos)]
    picks = [n for n in range(1, len(infos)) if infos[n].min_key.endswith(b"/f00") and top[n] != top[n - 1]]
    assert picks, "no range starts at a directory (range breaks moved: change the keys)"
    victim = infos[picks[0]]
    path = tmp_path / "ns-damaged" / "_lakefs" / victim.id
    data = bytearray(path.read_bytes())
    data[10:40] = b"\x00" * 30
    path.write_bytes(bytes(data))
    v = r.view("main")
    broken = top[picks[0]]
    healthy = b"d%02d/" % (int(broken[1:3]) - 1)  # the directory just before: in healthy ranges
    assert [it.path for it in v.list_page(healthy, b"", 1000)] == [healthy + b"f%02d" % j for j in range(3)]
    with pytest.raises(CorruptedData):
        v.list_page(broken, b"", 1000)


@pytest.mark.parametrize("staged", [False, True], ids=["committed", "staged_over_committed"])
def test_list_page_pages_through_every_directory_as_a_naive_listing_does(repo, staged):
    """A branch's listing (its staging over its commit: once the staging has nothing more ahead
    the commit's records come a batch at a time) paged with any page size, against the listing
    computed from the branch's keys."""
    import random

    rnd = random.Random(7)
    keys = {f"d{rnd.randrange(6)}/{'s%d/' % rnd.randrange(3) if rnd.random() < 0.3 else ''}"
            f"f{rnd.randrange(10_000):05d}".encode() for _ in range(1500)}
    keys |= {b"d1", b"d1.x", b"top"}  # a file beside its directory's name, one sorting between
    repo.stage_many("main", ((k, entry(k.decode())) for k in sorted(keys)))
    repo.commit("main", "base")
    if staged:  # adds and deletes in staging, some inside directories the listing skips with a seek
        gone = set(rnd.sample(sorted(keys), 200))
        added = {f"d{rnd.randrange(7)}/f{rnd.randrange(10_000):05d}x".encode() for _ in range(150)}
        repo.stage_many("main", [(k, None) for k in sorted(gone)] + [(k, entry("n" + k.decode())) for k in added])
        keys = (keys - gone) | added
    view = repo.view("main")

    def naive(prefix: bytes) -> list[tuple[bytes, bool]]:
        out: dict[bytes, bool] = {}
        for k in sorted(keys):
            if k.startswith(prefix):
                i = k.find(b"/", len(prefix))
                out.setdefault(k[: i + 1] if i >= 0 else k, i >= 0)
        return list(out.items())

    dirs = [b""] + sorted({k[: i + 1] for k in keys for i in range(len(k)) if k[i:i + 1] == b"/"})
    for prefix in dirs:
        want = naive(prefix)
        for limit in (1, 7, 1000):
            got, after = [], b""
            while True:
                page = view.list_page(prefix, after, limit)
                got += [(it.path, it.is_prefix) for it in page]
                if len(page) < limit:
                    break
                after = page[-1].path
            assert got == want, (prefix, limit)


@pytest.mark.parametrize("committed", [False, True])
def test_stat_of_a_directory_gives_its_marker_when_a_sibling_sorts_between_it_and_its_slash(repo, committed):
    """Found by a tour of odd names: a directory ``d`` beside ``d-1`` or ``d.txt`` (bytes below
    ``/``, as ``x`` beside ``x.csv``) was shown with the default attributes, its marker (the
    mode, owner and mtime chmod/chown/touch staged) never read: stat sought past the sibling and
    kept only that the directory exists."""
    mark = entry("marker")
    repo.stage_many("main", [("d/", mark), ("d/f", entry("f")), ("d-1", entry("sib")), ("d.txt", entry("t")),
                             ("e/", mark), ("e/f", entry("f"))])
    if committed:
        repo.commit("main", "c")
    v = repo.view("main")
    for name in (b"d", b"e"):  # (e: no sibling in between, as before)
        st = v.stat(name)
        assert st.is_dir and st.value is None and st.marker is not None, (name, st)
        assert st.marker == repo.get("main", name.decode() + "/").to_value()
    assert v.stat(b"d-1").value is not None and not v.stat(b"d-1").is_dir
