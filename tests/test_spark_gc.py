"""graveler.spark.gc: lakeFS's retention rules, mark and sweep, and the safety cases (real Spark, local[2])."""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import datetime, timedelta, timezone

import pytest

from graveler.errors import InvalidArgument, NotFound
from graveler.model import AddressType, Entry
from graveler.objects import new_data_address
from graveler.spark.gc import GCRules, active_commits, get_rules, list_runs, mark, set_rules, sweep
from tests.graveler_testutil import killed_mid_write, make_repo

NOW = datetime.now(timezone.utc)
DAY = timedelta(days=1)


def put_old(repo, data: bytes, age: timedelta) -> str:
    """An object under data/ as if uploaded ``age`` ago (slice name and mtime); returns its address."""
    t_ns = time.time_ns() - int(age.total_seconds() * 1e9)
    addr = new_data_address(t_ns)
    repo.store.put(addr, data)
    os.utime(os.path.join(repo.store.root, addr), ns=(t_ns, t_ns))
    return addr


def stage_old(repo, branch: str, path: str, data: bytes, age: timedelta) -> str:
    addr = put_old(repo, data, age)
    repo.stage(branch, path, Entry(address=addr, size=len(data), etag=hashlib.md5(data).hexdigest(),
                                   last_modified_ns=time.time_ns()))
    return addr


def exists(repo, addr: str) -> bool:
    return repo.store.exists(addr)


def test_rules_round_trip_and_active_commits(tmp_path):
    repo = make_repo(tmp_path)
    assert get_rules(repo) is None
    rules = GCRules(7, {"main": 14})
    set_rules(repo, rules)
    assert get_rules(repo) == rules
    assert json.loads(repo.store.get("_lakefs/retention/gc/rules.json"))["branches"] == [
        {"branch_id": "main", "retention_days": 14}]
    with pytest.raises(InvalidArgument):
        GCRules(-1)

    ids = []
    for i, age in enumerate((30, 20, 12, 10, 3)):
        repo.stage("main", f"f{i}", Entry(address=f"data/x/{i}", size=1, etag=str(i)))
        ids.append(repo.commit("main", f"c{i}", date=NOW - age * DAY).id)
    repo.create_branch("dev", ids[1])  # dev: default 7 days; head c1 (20 days)
    repo.stage("dev", "d", Entry(address="data/x/d", size=1, etag="d"))
    dev = repo.commit("dev", "d1", date=NOW - 25 * DAY).id  # a dev commit older than its parent's retention
    act = active_commits(repo, rules, NOW)
    # main (14 days): c4 (head), c3 and c2 (their children are within 14 days), c1 (20 d: the first one past
    # the threshold, its child c2 is 12 days old); not c0 (its child c1 is older than the threshold).
    # dev (7 days): its head only; c1 is also reached from dev, but main's longer retention decides.
    assert set(act) == {ids[4], ids[3], ids[2], ids[1], dev}
    assert set(active_commits(repo, None, NOW)) >= set(ids) | {dev}  # no rules: everything stays


def test_a_commit_that_was_a_head_within_the_retention_stays_active_whichever_walk_comes_first(tmp_path):
    """cX (10 days old) was main's head until m1 (now); branch stale grew from cX with commits
    5 days old. With a 1-day retention cX was main's head within it, so it stays active. The
    walks from the heads go in commit-ID order: when stale's came first it reached cX through
    an old child, and main's walk then stopped at cX without activating it -- GC deleted the
    object main~1 names (a helper saw fs cat fail after gc run). The order is forced here."""
    repo = make_repo(tmp_path)
    repo.stage("main", "x.txt", Entry(address="data/x/1", size=1, etag="1"))
    cx = repo.commit("main", "cX", date=NOW - 10 * DAY).id
    repo.create_branch("stale", cx)
    repo.stage("main", "x.txt", Entry(address="data/x/2", size=1, etag="2"))
    m1 = repo.commit("main", "m1", date=NOW).id
    # until stale's head sorts before main's (its walk first): about two tries, but m1's ID is random
    # (the repository's first commit has the real date) and a small one needs many (64 failed once in CI)
    for i in range(4096):
        repo.stage("stale", f"pad{i}", Entry(address=f"data/x/p{i}", size=1, etag="p"))
        head = repo.commit("stale", f"s{i}", date=NOW - 5 * DAY).id
        if head < m1:
            break
    assert head < m1
    act = active_commits(repo, GCRules(1), NOW)
    assert cx in act and m1 in act and head in act


@pytest.fixture
def gc_repo(tmp_path):
    """A repository whose history exercises every rule; returns (repo, {name: address}, external path)."""
    repo = make_repo(tmp_path)
    set_rules(repo, GCRules(7))
    a = {}
    ext = tmp_path / "external" / "imported.bin"
    ext.parent.mkdir()
    ext.write_bytes(b"imported, outside the namespace")
    os.utime(ext, (time.time() - 40 * 86400,) * 2)
    a["K"] = stage_old(repo, "main", "keep", b"K", 20 * DAY)
    a["X"] = stage_old(repo, "main", "x", b"X", 20 * DAY)
    repo.stage("main", "imported", Entry(address=f"file://{ext}", size=10, etag="e", address_type=AddressType.FULL))
    repo.commit("main", "c1", date=NOW - 20 * DAY)
    repo.delete("main", "x")
    repo.delete("main", "imported")
    a["Y"] = stage_old(repo, "main", "y", b"Y", 15 * DAY)
    repo.commit("main", "c2", date=NOW - 15 * DAY)
    repo.delete("main", "y")
    a["Z"] = stage_old(repo, "main", "z", b"Z", 10 * DAY)
    repo.commit("main", "c3", date=NOW - 10 * DAY)  # the first commit past the 7-day threshold: active
    repo.delete("main", "z")
    a["W"] = stage_old(repo, "main", "w", b"W", 2 * DAY)
    repo.commit("main", "c4", date=NOW - 2 * DAY)
    a["S"] = stage_old(repo, "main", "staged", b"S", 5 * DAY)  # staged, never committed
    a["O"] = put_old(repo, b"orphan", 3 * DAY)  # referenced by nothing: uncommitted garbage
    a["young"] = put_old(repo, b"young orphan", timedelta(hours=2))  # too young to be a candidate
    repo.store.put("other/outside-data", b"not under data/")
    os.utime(os.path.join(repo.store.root, "other/outside-data"), (time.time() - 40 * 86400,) * 2)
    return repo, a, ext


def test_mark_dry_run_then_mark_and_sweep(spark, gc_repo):
    repo, a, ext = gc_repo
    dry = mark(spark, repo, dry_run=True, collect=True)
    # Y only in c2 (expired), X only in c1 (expired), O referenced by nothing.
    assert dry.addresses == sorted([a["X"], a["Y"], a["O"]])
    assert dry.report_prefix is None and dry.candidates == 3 and dry.bytes == 1 + 1 + len(b"orphan")
    assert list_runs(repo) == []
    assert all(exists(repo, x) for x in a.values())

    m = mark(spark, repo)
    assert m.candidates == 3 and m.report_prefix == f"_lakefs/retention/gc/{m.run_id}/"
    summary = json.loads(repo.store.get(m.report_prefix + "summary.json"))
    assert summary["candidates"] == 3 and summary["refs"]["branches"]["main"] == repo.get_commit("main").id
    assert [r["run_id"] for r in list_runs(repo)] == [m.run_id]
    parts = [o.key for o in repo.store.list(m.report_prefix + "deleted/")]
    assert parts and all(k.endswith(".parquet") for k in parts)

    dry_sweep = sweep(spark, repo, m.run_id, dry_run=True)
    assert (dry_sweep.deleted, dry_sweep.kept) == (3, 0) and all(exists(repo, x) for x in a.values())
    s = sweep(spark, repo, m.run_id)
    assert (s.deleted, s.kept, s.failed) == (3, 0, 0)
    gone = {a["X"], a["Y"], a["O"]}
    for name, addr in a.items():
        assert exists(repo, addr) == (addr not in gone), name
    assert ext.read_bytes().startswith(b"imported")  # outside the namespace: never touched
    assert repo.store.exists("other/outside-data")  # outside data/: never listed
    for path in ("keep", "w", "staged"):
        assert repo.read("main", path)
    assert repo.read("main~1", "z") == b"Z"  # c3 is retained
    with pytest.raises(NotFound):
        sweep(spark, repo, "no-such-run")
    # run again: swept already -- nothing deleted or counted again (it counted 3 deletions again)
    again = sweep(spark, repo, m.run_id)
    assert (again.deleted, again.kept, again.failed) == (0, 0, 0) and again.swept_before is not None
    assert json.loads(repo.store.get(m.report_prefix + "swept.json"))["deleted"] == 3


def test_a_sweep_run_again_after_failures_deletes_and_counts_only_what_is_left(spark, gc_repo):
    repo, a, _ = gc_repo
    m = mark(spark, repo)
    # an earlier sweep that deleted one and failed for two (recorded as a failing sweep records it)
    repo.store.delete(a["O"])
    repo.store.put(m.report_prefix + "swept.json", json.dumps(
        {"run_id": m.run_id, "swept": "earlier", "deleted": 1, "kept": 0, "failed": 2}).encode())
    s = sweep(spark, repo, m.run_id)
    assert (s.deleted, s.kept, s.failed, s.swept_before) == (2, 0, 0, None)
    assert not any(exists(repo, a[n]) for n in ("X", "Y", "O"))
    assert json.loads(repo.store.get(m.report_prefix + "swept.json"))["deleted"] == 3
    assert sweep(spark, repo, m.run_id).swept_before is not None


def test_branch_created_or_staged_during_the_run_keeps_its_objects(spark, gc_repo):
    repo, a, _ = gc_repo
    m = mark(spark, repo)
    assert m.candidates == 3
    # Between mark and sweep: a branch at the expired commit c1 revives X; Y's object is staged again.
    c1 = list(repo.log("main"))[-2]
    assert c1.message == "c1"
    repo.create_branch("revive", c1.id)
    repo.stage("main", "y-again", Entry(address=a["Y"], size=1, etag=hashlib.md5(b"Y").hexdigest()))
    s = sweep(spark, repo, m.run_id)
    assert (s.deleted, s.kept) == (1, 2)
    assert exists(repo, a["X"]) and exists(repo, a["Y"]) and not exists(repo, a["O"])
    assert repo.read("revive", "x") == b"X"
    # The next mark sees them as live.
    assert mark(spark, repo, dry_run=True, collect=True).addresses == []


def test_no_rules_keeps_every_commit(spark, gc_repo):
    repo, a, _ = gc_repo
    repo.store.delete("_lakefs/retention/gc/rules.json")
    assert mark(spark, repo, dry_run=True, collect=True).addresses == [a["O"]]
    # A minimum age of 0 makes the young orphan a candidate too.
    assert mark(spark, repo, dry_run=True, collect=True, min_age=timedelta(0)).addresses == sorted(
        [a["O"], a["young"]])


def test_commits_made_while_the_mark_runs_keep_their_objects_after_another_commit_follows(spark, gc_repo,
                                                                                          monkeypatch):
    """Found by a data engineer running GC beside a mount that commits: what was staged when the
    mark read the refs was committed before it read them again, and another commit followed;
    the first commit was neither a head nor staging any more, so its objects -- which the rules
    keep (committed now: within any retention) -- were deleted and the commit's files unreadable
    (12 of them in one run). The mark and the sweep now find the active commits again."""
    import graveler.spark.gc as gc

    repo, a, _ = gc_repo
    made = {}
    real = gc.live_df

    def live_then_commits(*args, **kw):  # (after the first read of the refs, before the second)
        out = real(*args, **kw)
        if not made:
            repo.commit("main", "the staged file")  # S, staged 5 days ago: committed now
            made["c"] = repo.get_commit("main").id
            repo.delete("main", "staged")
            repo.commit("main", "and gone again")
        return out

    monkeypatch.setattr(gc, "live_df", live_then_commits)
    m = mark(spark, repo, collect=True)
    monkeypatch.setattr(gc, "live_df", real)
    assert a["S"] not in m.addresses
    assert sorted(m.addresses) == sorted([a["X"], a["Y"], a["O"]])
    sweep(spark, repo, m.run_id)
    assert repo.read(made["c"], "staged") == b"S"


def test_a_commit_on_a_branch_from_an_expired_commit_between_mark_and_sweep_keeps_its_objects(spark, gc_repo):
    """The expired c1 (X only there) is made active again between mark and sweep by a branch from
    it whose new commit deletes x: c1 is that commit's parent within the retention. The sweep
    deleted X (it looked for new heads' trees only, and the new head's tree has no x)."""
    repo, a, _ = gc_repo
    m = mark(spark, repo)
    c1 = [c for c in repo.log("main") if c.message == "c1"][0]
    repo.create_branch("restore", c1.id)
    repo.delete("restore", "x")
    repo.commit("restore", "drop x again")
    s = sweep(spark, repo, m.run_id)
    assert exists(repo, a["X"]) and repo.read("restore~1", "x") == b"X"
    assert s.kept >= 1


def _killed_writer_temp(repo, tmp_path, name: str) -> str:
    """The temp file a LocalStore.put_file killed mid-copy leaves in the namespace."""
    key = new_data_address(time.time_ns())
    return str(killed_mid_write(
        "import sys; from graveler.objstore.local import LocalStore; "
        "LocalStore(sys.argv[1]).put_file(sys.argv[2], sys.argv[3])",
        [repo.store.root, key, str(tmp_path / f"{name}.fifo")],
        os.path.dirname(os.path.join(repo.store.root, key)), tmp_path / f"{name}.fifo"))


def test_the_sweep_removes_temp_files_of_killed_writers_older_than_the_cutoff(spark, gc_repo, tmp_path):
    """A writer killed between writing its temp file and renaming it into place (a daemon or a
    Spark task killed mid-upload) left the temp file for good: listings skip it and nothing
    removed it. The sweep removes those last written before the run's cutoff; a younger one (a
    writer that may be alive) and every object stay; a dry run only counts."""
    repo, a, _ = gc_repo
    stale = _killed_writer_temp(repo, tmp_path, "stale")
    young = _killed_writer_temp(repo, tmp_path, "young")
    old = time.time() - 3 * 86400
    os.utime(stale, (old, old))
    objects = sorted(o.key for o in repo.store.list())
    assert not any(".lakefuse-tmp-" in k for k in objects)  # (never listed: never a GC candidate)
    m = mark(spark, repo)
    dry = sweep(spark, repo, m.run_id, dry_run=True)
    assert (dry.temp_files, dry.temp_bytes) == (1, os.path.getsize(stale))
    assert os.path.exists(stale) and os.path.exists(young)
    s = sweep(spark, repo, m.run_id)
    assert (s.deleted, s.failed, s.temp_files) == (3, 0, 1)
    assert not os.path.exists(stale) and os.path.exists(young)
    gone = {a["X"], a["Y"], a["O"]}
    assert all(exists(repo, x) == (x not in gone) for x in a.values())
    # a --min-age 0 run still leaves a temp file written within the hour alone
    m0 = mark(spark, repo, min_age=timedelta(0))
    assert sweep(spark, repo, m0.run_id).temp_files == 0 and os.path.exists(young)


@pytest.mark.s3
def test_the_sweep_of_an_s3_namespace_aborts_the_uploads_of_killed_writers(spark, tmp_path, s3_bucket, s3_client,
                                                                           s3_config, monkeypatch):
    """On S3 a writer killed mid-upload leaves an open multipart upload (its parts billed, in no
    listing) instead of a temp file: the sweep of a GC run on an S3 namespace aborts those under
    the namespace last active before the run's cutoff, counts them (``temp_kind``), and leaves
    one outside the namespace alone; a dry run only counts. (moto's uploads all look started in
    2010 and the parts here are seconds old: the sweep's clock is moved two hours on, so that the
    hour every upload is given has passed -- the cutoff is the mark's, as in any run.)"""
    from graveler.objstore import s3_uploads
    from tests.graveler_testutil import make_graveler

    g = make_graveler(tmp_path, store=s3_config)
    repo = g.create_repository("s3gc", f"s3://{s3_bucket}/ns")
    repo.store.put("data/kept", b"kept")
    repo.stage("main", "kept", Entry(address="data/kept", size=4, etag=hashlib.md5(b"kept").hexdigest()))
    repo.commit("main", "c1")
    set_rules(repo, GCRules(7))
    up = s3_client.create_multipart_upload(Bucket=s3_bucket, Key="ns/data/killed")["UploadId"]
    s3_client.upload_part(Bucket=s3_bucket, Key="ns/data/killed", UploadId=up, PartNumber=1, Body=b"k" * 5000)
    other = s3_client.create_multipart_upload(Bucket=s3_bucket, Key="elsewhere/x")["UploadId"]
    s3_client.upload_part(Bucket=s3_bucket, Key="elsewhere/x", UploadId=other, PartNumber=1, Body=b"o" * 10)
    time.sleep(1.1)  # (the parts before the mark's cutoff, by the clock's second)
    m = mark(spark, repo, min_age=timedelta(0))
    assert sweep(spark, repo, m.run_id, dry_run=True).temp_files == 0  # within the hour: a writer may be alive

    class Later:
        @staticmethod
        def time():
            return time.time() + 2 * 3600

    monkeypatch.setattr(s3_uploads, "time", Later)
    dry = sweep(spark, repo, m.run_id, dry_run=True)
    assert (dry.temp_files, dry.temp_bytes, dry.temp_kind) == (1, 5000, "multipart upload")
    assert len(s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads") or ()) == 2
    s = sweep(spark, repo, m.run_id)
    assert (s.temp_files, s.temp_kind, s.failed) == (1, "multipart upload", 0)
    left = s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads") or ()
    assert [u["Key"] for u in left] == ["elsewhere/x"]
    assert repo.store.get("data/kept") == b"kept"
    g.close()
