"""graveler.spark.export, S3 import/export, and retried tasks (real Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graveler.errors import InvalidArgument
from graveler.model import Entry
from graveler.objstore import open_store
from graveler.spark.export import export, read_success
from graveler.spark.importer import import_prefix
from tests.graveler_testutil import killed_mid_write, make_repo

ROOT = Path(__file__).resolve().parent.parent


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_export_full_then_incremental(spark, tmp_path):
    repo = make_repo(tmp_path)
    files = {f"t/part-{i:03d}.csv": f"{i}\n".encode() * (i + 1) for i in range(40)}
    files["readme.txt"] = b"hello"
    for k, v in files.items():
        repo.upload("main", k, v)
    repo.stage("main", "empty-dir/", Entry(address="data/none", size=0, etag="d41d8cd98f00b204e9800998ecf8427e"))
    c1 = repo.commit("main", "c1")
    dest = tmp_path / "export"

    r1 = export(spark, repo, "main", str(dest))
    assert r1.previous is None and r1.copied == len(files) and r1.deleted == 0
    got = tree(dest)
    success = json.loads(got.pop("_SUCCESS"))
    assert got == files and success["commit_id"] == c1.id and success["repository"] == repo.name

    unchanged = dest / "t/part-001.csv"
    before = unchanged.stat().st_mtime_ns
    repo.upload("main", "t/part-005.csv", b"changed")
    repo.delete("main", "t/part-006.csv")
    repo.upload("main", "t/new.csv", b"new")
    c2 = repo.commit("main", "c2")
    r2 = export(spark, repo, "main", str(dest))
    assert r2.previous == c1.id and (r2.copied, r2.deleted) == (2, 1)
    got = tree(dest)
    assert json.loads(got.pop("_SUCCESS"))["commit_id"] == c2.id
    expected = {k: repo.read("main", k) for k in (it.path.decode() for it in repo.list("main", delimiter=""))
                if not k.endswith("/")}
    assert got == expected
    assert unchanged.stat().st_mtime_ns == before  # not copied again

    # Back to c1 explicitly: incremental from c2 (the _SUCCESS) restores c1's tree.
    r3 = export(spark, repo, c1.id, str(dest))
    assert r3.previous == c2.id
    got = tree(dest)
    got.pop("_SUCCESS")
    assert got == files
    # --full onto that export of c1 (found by a docs tour: c2's files stayed, under a _SUCCESS naming the
    # commit): everything copied, and what the export there had that this commit lacks removed -- a file
    # no export of the repository wrote stays (a full export writes and deletes only what exports write)
    (dest / "not-ours.txt").write_bytes(b"someone else's")
    r4 = export(spark, repo, "main", str(dest), full=True)
    assert r4.previous is None and r4.copied == len(expected) and r4.deleted == 1  # (t/part-006.csv)
    got = tree(dest)
    assert json.loads(got.pop("_SUCCESS"))["commit_id"] == c2.id and got.pop("not-ours.txt") == b"someone else's"
    assert got == expected
    r5 = export(spark, repo, c1.id, str(dest), full=True)
    got = tree(dest)
    got.pop("_SUCCESS"), got.pop("not-ours.txt")
    assert got == files and r5.deleted == 1  # (t/new.csv)
    with pytest.raises(InvalidArgument):
        export(spark, repo, "main", repo.record.storage_namespace + "/exports")


def test_an_export_of_a_changed_or_missing_object_fails_without_success(spark, tmp_path):
    """An imported file changed behind the repository (same size, other bytes) or gone: the
    export checks every object against its entry -- size, and the MD5 of a plain etag -- and
    fails (CorruptedData, NotFound: exit 5, exit 3 in one line) with no _SUCCESS written. It
    used to copy the changed bytes and write _SUCCESS naming the commit (or die with a page
    of Spark traceback, exit 1). A healthy one exports, checked the same way."""
    from graveler.errors import CorruptedData

    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.txt").write_bytes(b"original\n")
    (src / "d" / "g.txt").write_bytes(b"kept\n")
    repo = make_repo(tmp_path)
    import_prefix(spark, repo, "main", str(src), "in/")
    ok = tmp_path / "ok"
    export(spark, repo, "main", str(ok))
    assert read_success(str(ok))["copied"] == 2 and (ok / "in/d/f.txt").read_bytes() == b"original\n"
    (src / "d" / "f.txt").write_bytes(b"tampered\n")  # the same size
    dest = tmp_path / "out"
    with pytest.raises(CorruptedData, match="in/d/f.txt"):
        try:
            export(spark, repo, "main", str(dest), full=True)
        except Exception as e:  # (Spark's wrapper of the task's error: what the CLI unwraps)
            from lakefuse.cli import _from_spark

            raise (_from_spark(e) or e) from None
    assert read_success(str(dest)) is None
    os.unlink(src / "d" / "f.txt")
    r = subprocess.run([sys.executable, "-m", "lakefuse", "--home", str(repo.config.home), "export",
                        f"lakefs://{repo.name}/main", str(tmp_path / "out2"), "--spark", "local[1]"],
                       capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert r.returncode == 3, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]  # (above it: Spark's own log of the failed task)
    assert last.startswith("lakefuse: ") and last.endswith("f.txt not found")
    assert "lakefuse: in/d/f.txt: " in last  # which file of the commit, not only its object's address
    assert read_success(str(tmp_path / "out2")) is None


def test_an_export_of_a_commit_holding_its_own_success_marker_is_refused(spark, tmp_path):
    """A data engineer's finding: a Spark job writing straight to a branch's root leaves
    _SUCCESS there; its export overwrote that file with the export's marker, said "2 copied"
    and exited 0. Refused now, before the destination is touched."""
    repo = make_repo(tmp_path)
    repo.upload("main", "_SUCCESS", b"")
    repo.upload("main", "part-0000.parquet", b"data")
    repo.commit("main", "a job's output")
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "_SUCCESS").write_text('{"commit_id": "an earlier export"}')
    with pytest.raises(InvalidArgument, match="holds _SUCCESS at its root"):
        export(spark, repo, "main", str(dest))
    assert (dest / "_SUCCESS").read_text() == '{"commit_id": "an earlier export"}'


@pytest.mark.s3
def test_s3_import_and_export(spark, tmp_path, s3_bucket, s3_client, s3_config):
    objs = {f"raw/{d}/{i:03d}.json": f'{{"i": {i}}}'.encode() for d in ("a", "b", "c") for i in range(30)}
    objs["raw/top.json"] = b"{}"
    for k, v in objs.items():
        s3_client.put_object(Bucket=s3_bucket, Key=k, Body=v)
    s3_client.put_object(Bucket=s3_bucket, Key="elsewhere/x", Body=b"not imported")
    repo = make_repo(tmp_path, store=s3_config)
    res = import_prefix(spark, repo, "main", f"s3://{s3_bucket}/raw", "in/", store_config=s3_config)
    assert res.imported == len(objs)
    e = repo.get("main", "in/a/000.json")
    assert e.address == f"s3://{s3_bucket}/raw/a/000.json"
    assert repo.read("main", "in/b/007.json") == b'{"i": 7}'
    out = f"s3://{s3_bucket}/exported"
    r = export(spark, repo, "main", out, store_config=s3_config)
    assert r.copied == len(objs)
    st = open_store(out, s3_config)
    try:
        assert {o.key for o in st.list()} == {k.replace("raw/", "in/", 1) for k in objs} | {"_SUCCESS"}
        assert st.get("in/c/029.json") == b'{"i": 29}'
    finally:
        st.close()
    assert read_success(out, s3_config)["commit_id"] == res.commit_id


@pytest.mark.slow
def test_retried_tasks_do_not_change_results(tmp_path):
    """local[2,3]: every task's first attempt fails after doing its work; results are unchanged."""
    env = dict(os.environ, LAKEFUSE_SPARK_FAULT="first-attempt", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "spark_faults_job.py"), str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["injected_failures"] > 0
    assert result["metarange_spark"] == result["metarange_local"]
    assert result["import_again_commit"] is None
    assert result["entries"] == result["expected_entries"]
    assert result["gc_deleted"] == result["gc_expected"]
    assert result["export_tree_ok"] is True


def test_an_export_never_writes_or_deletes_through_a_symlink_planted_in_its_destination(spark, tmp_path):
    """A security review's finding: a directory of the destination replaced by a symbolic link
    (by whoever can write the destination) sent a root export's files elsewhere, and an
    incremental export deleted a file there. Such an export is refused now, before it writes or
    deletes through the link; the target is untouched."""
    repo = make_repo(tmp_path)
    repo.upload("main", "ssh/authorized_keys", b"ssh-ed25519 AAAA exported\n")
    repo.upload("main", "ssh/other", b"other\n")
    repo.commit("main", "one")
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (outside / "other").write_bytes(b"victim data\n")
    (dest / "ssh").symlink_to(outside)
    with pytest.raises(InvalidArgument, match="symbolic link"):
        try:
            export(spark, repo, "main", str(dest), full=True)
        except Exception as e:  # (Spark's wrapper of the task's error: what the CLI unwraps)
            from lakefuse.cli import _from_spark

            raise (_from_spark(e) or e) from None
    assert sorted(p.name for p in outside.iterdir()) == ["other"]
    assert (outside / "other").read_bytes() == b"victim data\n"
    assert read_success(str(dest)) is None


def test_an_exports_writes_themselves_refuse_a_symlink_on_the_way(tmp_path):
    """The export's own writes and deletes open each directory below the destination without
    following a link (``NoFollowDest``): a link planted after any check, while the export runs,
    is refused where it is met, and the target is untouched. Before, a check of the path came
    first and the write then followed whatever the path was by then. Healthy trees (nested
    directories made on the way, a file rewritten, a link at a file's own name replaced, not
    followed; deletions pruning the directories they empty) are written as before."""
    from graveler.objstore import open_store
    from graveler.spark.export import NoFollowDest

    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (outside / "k").write_bytes(b"victim\n")
    out = NoFollowDest(open_store(str(dest)))
    out.put("a/b/c", b"one")
    out.put("a/b/c", b"two")
    src = tmp_path / "src.bin"
    src.write_bytes(b"\0" * 100_000 + b"end")
    out.put_file("a/big", str(src))
    (dest / "a" / "lnk").symlink_to(outside / "k")
    out.put("a/lnk", b"a file now")
    assert (dest / "a" / "b" / "c").read_bytes() == b"two" and (dest / "a" / "big").read_bytes() == src.read_bytes()
    assert not (dest / "a" / "lnk").is_symlink() and (outside / "k").read_bytes() == b"victim\n"
    out.delete("a/b/c")
    assert not (dest / "a" / "b").exists() and (dest / "a").is_dir()
    out.delete("no/such/file")
    (dest / "s").symlink_to(outside)
    (dest / "a" / "t").symlink_to(outside)
    for key in ("s/k", "s/new", "a/t/k", "a/t/deeper/k"):
        with pytest.raises(InvalidArgument, match="symbolic link"):
            out.put(key, b"through the link")
        with pytest.raises(InvalidArgument, match="symbolic link"):
            out.delete(key)
    assert sorted(p.name for p in outside.iterdir()) == ["k"] and (outside / "k").read_bytes() == b"victim\n"
    assert not [p for p in dest.rglob(".lakefuse-tmp-*")]


def test_an_export_into_the_repositorys_namespace_is_refused_however_the_path_is_written(spark, tmp_path):
    """Found by a data engineer: ``file:///.../storage/REPO`` was refused as a destination, but the
    plain path of the same directory was taken, and the export overwrote a committed object
    (its key ``data/<hour>/<id>``, as the commit held it): "data object is 12 bytes but its entry
    says 9". Every spelling is refused now -- a plain path, one through ``..`` or a link, and a
    parent that holds the namespace -- before anything is written; a directory beside it is fine."""
    from graveler.spark.export import _overlap

    repo = make_repo(tmp_path)
    repo.upload("main", "precious.txt", b"precious\n")
    repo.commit("main", "one")
    ns_path = repo.record.storage_namespace[len("file://"):]
    (tmp_path / "link").symlink_to(ns_path)
    for dest in (ns_path, ns_path + "/", ns_path + "/sub", os.path.dirname(ns_path),
                 os.path.join(ns_path, "..", os.path.basename(ns_path)), str(tmp_path / "link")):
        assert _overlap(dest, repo.record.storage_namespace), dest
        with pytest.raises(InvalidArgument, match="outside the repository's storage namespace"):
            export(spark, repo, "main", dest)
    assert repo.read("main", "precious.txt") == b"precious\n"
    assert not _overlap(str(tmp_path / "beside"), repo.record.storage_namespace)
    assert not _overlap(ns_path + "-other", repo.record.storage_namespace)
    assert not _overlap("s3://b/p", "s3://b/pq") and _overlap("s3://b/p/q", "s3://b/p")
    assert not _overlap("s3://b/p", "s3://c/p") and not _overlap("s3://b/p", "file:///b/p")


def _unwrapped(fn):
    try:
        return fn()
    except Exception as e:  # (Spark's wrapper of the task's error: what the CLI unwraps)
        from lakefuse.cli import _from_spark

        raise (_from_spark(e) or e) from None


def test_paths_that_go_from_directory_to_file_and_commits_a_directory_cannot_hold(spark, tmp_path):
    """Found by a data engineer: an incremental export where ``p/inner.txt`` became a file ``p``
    died with a traceback (IsADirectoryError, exit 1) whenever a copy ran before the deletion, and
    every run after it failed the same way; a commit of both ``k`` and ``k/x`` gave four
    tracebacks. The deletions run first now (``p`` is free when its copy comes), and what a local
    directory cannot hold is one InvalidArgument naming the path (exit 2)."""
    repo = make_repo(tmp_path)
    repo.upload("main", "p/inner.txt", b"inner\n")
    repo.upload("main", "q", b"a file first\n")
    repo.upload("main", "keep", b"kept\n")
    repo.commit("main", "one")
    dest = tmp_path / "dest"
    export(spark, repo, "main", str(dest), partitions=4)
    repo.delete("main", "p/inner.txt")
    repo.upload("main", "p", b"a file now\n")
    repo.delete("main", "q")
    repo.upload("main", "q/under", b"a directory now\n")
    c2 = repo.commit("main", "two")
    for _ in range(2):  # (again: nothing left in the way)
        r = export(spark, repo, "main", str(dest), partitions=4)
        assert r.previous is not None and r.commit_id == c2.id
    got = tree(dest)
    assert json.loads(got.pop("_SUCCESS"))["commit_id"] == c2.id
    assert got == {"p": b"a file now\n", "q/under": b"a directory now\n", "keep": b"kept\n"}
    # both k and k/x: a local directory cannot hold them
    repo.upload("main", "k", b"file\n")
    repo.upload("main", "k/x", b"below\n")
    repo.commit("main", "three")
    with pytest.raises(InvalidArgument, match="cannot hold both"):
        _unwrapped(lambda: export(spark, repo, "main", str(tmp_path / "dest2"), full=True))


def test_a_key_no_destination_can_hold_is_refused_before_the_destination_changes(spark, tmp_path):
    """Found by a security review: a commit holding the key ``/abs`` (a lakeFS repository's, or an
    upload to ``main//abs``) failed the export only after it had marked a complete export at the
    destination incomplete (its ``_SUCCESS`` gone). Refused first now, naming the key; the next
    commit without it exports from that complete export."""
    repo = make_repo(tmp_path)
    repo.upload("main", "ok.txt", b"ok\n")
    c1 = repo.commit("main", "one")
    dest = tmp_path / "dest"
    export(spark, repo, "main", str(dest))
    repo.upload("main", "/abs", b"abs\n")
    repo.commit("main", "two")
    with pytest.raises(InvalidArgument, match="holds the key '/abs'.*empty path segment"):
        _unwrapped(lambda: export(spark, repo, "main", str(dest)))
    assert json.loads((dest / "_SUCCESS").read_bytes())["commit_id"] == c1.id and not (dest / "_INCOMPLETE").exists()
    repo.delete("main", "/abs")
    repo.upload("main", "new.txt", b"new\n")
    c3 = repo.commit("main", "three")
    r = export(spark, repo, "main", str(dest))
    assert r.previous == c1.id and (r.copied, r.deleted) == (1, 0)
    got = tree(dest)
    assert json.loads(got.pop("_SUCCESS"))["commit_id"] == c3.id and got == {"ok.txt": b"ok\n", "new.txt": b"new\n"}


def test_an_incremental_export_cut_short_goes_on_from_the_same_previous_export(spark, tmp_path):
    """Found by a data engineer: an incremental export that failed part-way had removed _SUCCESS, so
    its run again was a full export, which keeps what the diff removes -- and wrote a _SUCCESS
    naming the new commit over a file that commit does not hold. _INCOMPLETE now names the previous
    export while one runs; the run again goes on from it."""
    repo = make_repo(tmp_path)
    repo.upload("main", "a", b"a\n")
    repo.upload("main", "zz.txt", b"removed next\n")
    c1 = repo.commit("main", "one")
    dest = tmp_path / "dest"
    export(spark, repo, "main", str(dest))
    repo.delete("main", "zz.txt")
    repo.upload("main", "b", b"b\n")
    c2 = repo.commit("main", "two")
    # as a run cut short leaves it: _SUCCESS removed, _INCOMPLETE naming c1 as its previous
    st = open_store(str(dest))
    st.put("_INCOMPLETE", json.dumps({"commit_id": c2.id, "repository": repo.name,
                                      "storage_namespace": repo.record.storage_namespace,
                                      "previous": c1.id}).encode())
    st.delete("_SUCCESS")
    r = export(spark, repo, "main", str(dest))
    assert r.previous == c1.id and r.deleted == 1
    got = tree(dest)
    assert json.loads(got.pop("_SUCCESS"))["previous"] == c1.id
    assert got == {"a": b"a\n", "b": b"b\n"}  # no zz.txt, no _INCOMPLETE


def _killed_export_write(dest: Path, key: str, tmp_path: Path) -> Path:
    """The temp file the export's own writer (NoFollowDest) killed mid-copy leaves in ``dest``."""
    fifo = tmp_path / (key.replace("/", "_") + ".fifo")
    return killed_mid_write(
        "import sys; from graveler.objstore import open_store; from graveler.spark.export import NoFollowDest; "
        "NoFollowDest(open_store(sys.argv[1])).put_file(sys.argv[2], sys.argv[3])",
        [str(dest), key, str(fifo)], dest / os.path.dirname(key), fifo)


def test_an_export_run_again_after_one_was_killed_removes_the_temp_files_of_its_copies(spark, tmp_path):
    """An export killed mid-copy left `.lakefuse-tmp-*` files in the user's destination for good
    (hidden, but taking their space; GC sweeps only the repository's namespace). The run that goes on from the cut-short
    one removes them; an export onto a complete destination leaves alone whatever is there."""
    repo = make_repo(tmp_path)
    repo.upload("main", "d/a", b"a\n")
    repo.upload("main", "b", b"b\n")
    repo.commit("main", "one")
    dest = tmp_path / "dest"
    export(spark, repo, "main", str(dest))
    theirs = dest / "d" / ".lakefuse-tmp-not-ours"  # (not the temp form: somebody else's file)
    theirs.write_bytes(b"keep")
    healthy = _killed_export_write(dest, "d/x", tmp_path)  # a complete destination: left as it is
    export(spark, repo, "main", str(dest))
    assert healthy.exists() and theirs.exists()
    healthy.unlink()
    repo.upload("main", "d/c", b"c\n")
    c2 = repo.commit("main", "two")
    st = open_store(str(dest))  # as a killed run to c2 leaves it: _INCOMPLETE, two copies under way
    st.put("_INCOMPLETE", json.dumps({"commit_id": c2.id, "repository": repo.name,
                                      "storage_namespace": repo.record.storage_namespace,
                                      "previous": json.loads(st.get("_SUCCESS"))["commit_id"]}).encode())
    st.delete("_SUCCESS")
    left = [_killed_export_write(dest, "d/c", tmp_path), _killed_export_write(dest, "b", tmp_path)]
    r = export(spark, repo, "main", str(dest))
    assert r.commit_id == c2.id
    assert not any(p.exists() for p in left)
    got = tree(dest)
    assert json.loads(got.pop("_SUCCESS"))["commit_id"] == c2.id
    assert got == {"b": b"b\n", "d/a": b"a\n", "d/c": b"c\n", "d/.lakefuse-tmp-not-ours": b"keep"}


@pytest.mark.s3
def test_an_s3_export_run_again_after_one_was_killed_aborts_the_uploads_of_its_copies(spark, tmp_path, s3_bucket,
                                                                                       s3_client, s3_config):
    """On S3 a copy killed mid-upload leaves an open multipart upload (its parts billed, in no
    listing) where a local destination keeps a temp file: the run that goes on from the cut-short
    one aborts those under the destination; an export onto a complete destination leaves open
    uploads alone (somebody else's may be under way), as one outside the destination."""
    repo = make_repo(tmp_path, store=s3_config)
    repo.upload("main", "a", b"a\n")
    repo.commit("main", "one")
    out = f"s3://{s3_bucket}/exported"
    export(spark, repo, "main", out, store_config=s3_config)

    def open_upload(key: str) -> None:  # a copy killed after its first part
        up = s3_client.create_multipart_upload(Bucket=s3_bucket, Key=key)["UploadId"]
        s3_client.upload_part(Bucket=s3_bucket, Key=key, UploadId=up, PartNumber=1, Body=b"p" * 100)

    def open_keys() -> list[str]:
        return sorted(u["Key"] for u in s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads") or ())

    open_upload("exported/theirs")
    open_upload("elsewhere/x")
    time.sleep(1.1)  # (the parts before this run's start, by the clock's second)
    export(spark, repo, "main", out, store_config=s3_config)
    assert open_keys() == ["elsewhere/x", "exported/theirs"]  # a complete destination: left alone
    repo.upload("main", "b", b"b\n")
    c2 = repo.commit("main", "two")
    st = open_store(out, s3_config)  # as a killed run to c2 leaves it: _INCOMPLETE, a copy under way
    st.put("_INCOMPLETE", json.dumps({"commit_id": c2.id, "repository": repo.name,
                                      "storage_namespace": repo.record.storage_namespace,
                                      "previous": json.loads(st.get("_SUCCESS"))["commit_id"]}).encode())
    st.delete("_SUCCESS")
    open_upload("exported/b")
    time.sleep(1.1)
    r = export(spark, repo, "main", out, store_config=s3_config)
    assert r.commit_id == c2.id
    assert open_keys() == ["elsewhere/x"]
    assert sorted(o.key for o in st.list()) == ["_SUCCESS", "a", "b"]
    st.close()


@pytest.mark.parametrize("from_previous", [True, False], ids=["incremental", "full"])
def test_an_export_cut_short_then_run_to_a_newer_commit_undoes_what_it_copied(spark, tmp_path, from_previous):
    """Found by a lakeFS user's tour: a run toward c1 killed part-way, then the branch moved to c2
    and the export ran again: only the difference from the previous export (or, with none, c2's
    objects) was applied, so what the killed run had copied of c1 stayed -- a file c1 added and c2
    deleted, a file c1 changed and c2 changed back -- under a _SUCCESS naming c2. The difference
    from c1 is applied too now, and a further cut short run keeps the list (``partial``)."""
    repo = make_repo(tmp_path)
    repo.upload("main", "case", b"changed\n")
    repo.upload("main", "keep", b"kept\n")
    p = repo.commit("main", "p")
    dest = tmp_path / "dest"
    if from_previous:
        export(spark, repo, "main", str(dest))
    repo.upload("main", "case", b"C1C1C1C\n")
    repo.upload("main", "only-c1", b"c1\n")
    c1 = repo.commit("main", "c1")
    # as the run to c1 left it when killed: some of c1 copied, _SUCCESS gone, _INCOMPLETE naming c1
    dest.mkdir(exist_ok=True)
    (dest / "case").write_bytes(b"C1C1C1C\n")
    (dest / "only-c1").write_bytes(b"c1\n")
    st = open_store(str(dest))
    st.put("_INCOMPLETE", json.dumps({"commit_id": c1.id, "repository": repo.name,
                                      "storage_namespace": repo.record.storage_namespace,
                                      "previous": p.id if from_previous else None}).encode())
    st.delete("_SUCCESS")
    repo.upload("main", "case", b"changed\n")
    repo.delete("main", "only-c1")
    repo.upload("main", "new", b"c2\n")
    c2 = repo.commit("main", "c2")
    r = export(spark, repo, "main", str(dest))
    assert r.commit_id == c2.id
    got = tree(dest)
    assert json.loads(got.pop("_SUCCESS"))["commit_id"] == c2.id
    assert got == {"case": b"changed\n", "keep": b"kept\n", "new": b"c2\n"}


def test_a_destination_with_sparks_empty_success_file_is_exported_to(spark, tmp_path):
    """Found by a data engineer: a directory holding the empty _SUCCESS that Spark and Hadoop jobs
    write was "malformed _SUCCESS" (exit 5), even with --full, whose help says it copies whatever
    the destination's _SUCCESS. An empty one is no export's: a full export, and ours replaces it."""
    repo = make_repo(tmp_path)
    repo.upload("main", "a", b"a\n")
    c1 = repo.commit("main", "one")
    for full in (False, True):
        dest = tmp_path / f"dest{full}"
        dest.mkdir()
        (dest / "_SUCCESS").write_bytes(b"")
        r = export(spark, repo, "main", str(dest), full=full)
        assert r.previous is None and json.loads((dest / "_SUCCESS").read_bytes())["commit_id"] == c1.id
    (tmp_path / "destTrue" / "_SUCCESS").write_bytes(b"{not json")
    assert export(spark, repo, "main", str(tmp_path / "destTrue"), full=True).copied == 1  # --full reads none


def test_an_export_makes_links_again_keeps_modes_and_mtimes_and_skips_what_no_object_stands_for(
        spark, tmp_path, s3_bucket, s3_config):
    """Found by a tour of odd names: an export wrote every symbolic link as an empty regular file
    (counted as copied), and set no mode or mtime. A local destination now gets the link again
    (its target as the commit has it, dangling or not), each file's permission bits and mtime;
    FIFOs, sockets and devices -- and links on S3, which has none -- are skipped and counted.
    An incremental export turns a file into a link and back."""
    from graveler.objects import PosixAttrs

    repo = make_repo(tmp_path)
    repo.upload("main", "bin/run.sh", b"#!/bin/sh\n", metadata=PosixAttrs(mode=0o100755, mtime_ns=1_400_000_000_123_456_789).to_metadata())
    repo.upload("main", "plain.txt", b"plain")  # (no POSIX metadata: 0644, its mtime the export's)
    empty = repo.get("main", "plain.txt")
    from dataclasses import replace
    for key, attrs in (("link", PosixAttrs(mode=0o120777, symlink="bin/run.sh")),
                       ("dangling", PosixAttrs(mode=0o120777, symlink="/nonexistent/x")),
                       ("fifo", PosixAttrs(mode=0o010644)), ("dev", PosixAttrs(mode=0o020600, rdev=0x0103))):
        repo.stage("main", key, replace(empty, size=0, etag="d41d8cd98f00b204e9800998ecf8427e",
                                        address=repo.put_object(b"").address, metadata=attrs.to_metadata()))
    repo.commit("main", "links and modes")
    dest = tmp_path / "export"
    r = export(spark, repo, "main", str(dest))
    assert (r.copied, r.links, r.skipped) == (2, 2, 2), r
    assert os.readlink(dest / "link") == "bin/run.sh" and (dest / "link").read_bytes() == b"#!/bin/sh\n"
    assert os.readlink(dest / "dangling") == "/nonexistent/x"
    assert not (dest / "fifo").exists() and not (dest / "dev").exists()
    st = (dest / "bin" / "run.sh").stat()
    assert oct(st.st_mode & 0o7777) == oct(0o755) and st.st_mtime_ns == 1_400_000_000_123_456_789
    assert oct((dest / "plain.txt").stat().st_mode & 0o7777) == oct(0o644)
    assert json.loads((dest / "_SUCCESS").read_text())["links"] == 2
    # incremental: a link becomes a file and a file a link
    repo.upload("main", "link", b"now a file")
    repo.stage("main", "plain.txt", replace(repo.get("main", "dangling")))
    repo.commit("main", "swap")
    r = export(spark, repo, "main", str(dest))
    assert (dest / "link").read_bytes() == b"now a file" and not (dest / "link").is_symlink()
    assert os.readlink(dest / "plain.txt") == "/nonexistent/x"
    # S3: no links there -- skipped, counted, never an empty object in their place
    out = f"s3://{s3_bucket}/exp"
    r = export(spark, repo, "main", out, store_config=s3_config)
    st3 = open_store(out, s3_config)
    try:
        keys = {o.key for o in st3.list()}
    finally:
        st3.close()
    assert keys == {"_SUCCESS", "bin/run.sh", "link"} and (r.links, r.skipped) == (0, 4), (keys, r)
