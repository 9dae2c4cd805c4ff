"""``lakefuse import | gc | export`` (in-process, on the session's Spark) and a spark-submit entry."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lakefuse.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    o = capsys.readouterr()
    return rc, o.out, o.err


def test_cli_import_gc_export(spark, tmp_path, capsys):
    home = str(tmp_path / "home")
    assert run(capsys, "--home", home, "repo", "create", "lakefs://clirepo", "--storage", str(tmp_path / "ns"))[0] == 0
    src = tmp_path / "src"
    for i in range(12):
        (src / f"p{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"p{i % 3}" / f"{i}.txt").write_text(f"file {i}")

    rc, o, err = run(capsys, "--home", home, "import", str(src), "lakefs://clirepo/main/raw/", "--json",
                     "--spark", "local[2]")
    assert rc == 0, err
    res = json.loads(o)
    assert res["imported"] == 12 and res["commit_id"]
    assert re.search(rf"listing {re.escape(str(src))}: 12 objects, (\d+)/\1 prefixes, [\d,]+ objects/s in ", err), err
    rc, o, _ = run(capsys, "--home", home, "import", str(src), "lakefs://clirepo/main/raw/")
    assert rc == 0 and "no commit (the tree is unchanged)" in o
    # a mistyped or empty source would have emptied the prefix (exit 0, a commit): refused, nothing changes
    head = run(capsys, "--home", home, "show", "lakefs://clirepo/main", "--json")[1]
    rc, _, err = run(capsys, "--home", home, "import", str(src) + "-typo", "lakefs://clirepo/main/raw/")
    assert rc == 3 and "not found" in err
    (tmp_path / "empty").mkdir()
    rc, _, err = run(capsys, "--home", home, "import", str(tmp_path / "empty"), "lakefs://clirepo/main/raw/")
    assert rc == 3 and "nothing to import" in err
    assert run(capsys, "--home", home, "show", "lakefs://clirepo/main", "--json")[1] == head
    rc, _, err = run(capsys, "--home", home, "import", str(src), "lakefs://clirepo/main")
    assert rc == 2 and "destination prefix" in err
    # a source in a repository's storage namespace (found by a GC tour: that repository's GC deleted the
    # objects the import named) or holding one is refused before Spark starts; nothing changes
    assert run(capsys, "--home", home, "repo", "create", "lakefs://other", "--storage", str(tmp_path / "ns2"))[0] == 0
    (tmp_path / "f").write_text("f")
    assert run(capsys, "--home", home, "fs", "upload", "lakefs://other/main/f", "--source", str(tmp_path / "f"))[0] == 0
    for bad, whose in ((tmp_path / "ns2" / "data", "other"), (tmp_path / "ns2", "other"), (tmp_path, "clirepo"),
                       (tmp_path / "ns", "clirepo")):
        rc, _, err = run(capsys, "--home", home, "import", str(bad), "lakefs://clirepo/main/raw/")
        assert rc == 2 and f"storage namespace of repository '{whose}'" in err, (bad, err)
    assert run(capsys, "--home", home, "show", "lakefs://clirepo/main", "--json")[1] == head
    # a path relative to the working directory, as `fs upload --source` takes one (found by a data
    # engineer: it passed the check here, then Spark refused "unsupported store URI 'src'")
    assert run(capsys, "--home", home, "branch", "create", "lakefs://clirepo/rel", "--source", "main")[0] == 0
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc, o, err = run(capsys, "--home", home, "import", "src", "lakefs://clirepo/rel/rel/", "--json")
    finally:
        os.chdir(cwd)
    assert rc == 0 and json.loads(o)["imported"] == 12, err

    rc, o, err = run(capsys, "--home", home, "gc", "rules", "lakefs://clirepo", "--default-days", "7",
                     "--branch", "main=21")
    assert rc == 0 and json.loads(o) == {"default_retention_days": 7,
                                         "branches": [{"branch_id": "main", "retention_days": 21}]}
    rc, o, err = run(capsys, "--home", home, "gc", "mark", "lakefs://clirepo", "--dry-run")
    assert rc == 0 and "0 objects" in err and o == "" and "warning" not in err
    rc, o, err = run(capsys, "--home", home, "gc", "mark", "lakefs://clirepo", "--dry-run", "--min-age", "0.1")
    assert rc == 0 and "warning: --min-age 0.1 is under 0.2 hours" in err, err  # (a concurrency tour)
    rc, o, err = run(capsys, "--home", home, "gc", "run", "lakefs://clirepo", "--json")
    assert rc == 0, err
    lines = [json.loads(x) for x in o.splitlines()]
    assert lines[0]["candidates"] == 0 and lines[1]["deleted"] == 0
    rc, o, _ = run(capsys, "--home", home, "gc", "runs", "lakefs://clirepo")
    assert rc == 0 and lines[0]["run_id"] in o
    rc, _, err = run(capsys, "--home", home, "gc", "sweep", "lakefs://clirepo", "nope")
    assert rc == 3 and "no complete report" in err
    # a local namespace moved away: refused, not a report written into a new empty directory (a GC tour)
    assert run(capsys, "--home", home, "repo", "create", "lakefs://gone", "--storage", str(tmp_path / "gone"))[0] == 0
    os.rename(tmp_path / "gone", tmp_path / "gone.moved")
    for cmd in (("gc", "run", "lakefs://gone", "--min-age", "0"), ("gc", "sweep", "lakefs://gone", "any")):
        rc, _, err = run(capsys, "--home", home, *cmd)
        assert rc == 3 and "is not there" in err and not (tmp_path / "gone").exists(), err

    dest = tmp_path / "out"
    rc, o, err = run(capsys, "--home", home, "export", "lakefs://clirepo/main", str(dest))
    assert rc == 0 and "12 copied" in o and "full" in o, err
    assert (dest / "raw/p1/4.txt").read_text() == "file 4"
    os.chdir(tmp_path)  # DEST relative to here, as import's SOURCE (it was refused once Spark had started)
    try:
        rc, o, _ = run(capsys, "--home", home, "export", "lakefs://clirepo/main", "out")
    finally:
        os.chdir(cwd)
    assert rc == 0 and "0 copied, 0 deleted (incremental" in o

    # a dirty branch is refused before the source is listed (a listing can take an hour), not after
    (tmp_path / "one.txt").write_text("staged")
    assert run(capsys, "--home", home, "fs", "upload", "lakefs://clirepo/main/one.txt",
               "--source", str(tmp_path / "one.txt"))[0] == 0
    rc, _, err = run(capsys, "--home", home, "import", str(src), "lakefs://clirepo/main/raw/")
    assert rc == 4 and "uncommitted changes" in err and "listing" not in err, err


@pytest.mark.slow
def test_spark_submit_entry(tmp_path):
    """scripts/spark_gc.py under spark-submit (its own JVM), on the venv's interpreter."""
    home = str(tmp_path / "home")
    py = sys.executable
    assert main(["--home", home, "repo", "create", "lakefs://subrepo", "--storage", str(tmp_path / "ns")]) == 0
    env = dict(os.environ, PYSPARK_PYTHON=py, PYSPARK_DRIVER_PYTHON=py)
    submit = Path(py).parent / "spark-submit"
    p = subprocess.run([str(submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                        str(ROOT / "scripts" / "spark_gc.py"), "mark", "lakefs://subrepo", "--home", home,
                        "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["candidates"] == 0 and res["report_prefix"].startswith("_lakefs/retention/gc/")


def test_cli_gc_dry_runs_print_the_counts_of_the_real_runs(spark, tmp_path, capsys):
    """``gc mark --dry-run`` and ``gc sweep --dry-run`` print the counts (and the mark its addresses) that
    the real mark and sweep then report and act on."""
    import re
    import time

    from graveler import Graveler, GravelerConfig
    from graveler.model import Entry
    from graveler.objects import new_data_address

    home = str(tmp_path / "home")
    assert run(capsys, "--home", home, "repo", "create", "lakefs://gcrepo", "--storage", str(tmp_path / "ns"))[0] == 0
    g = Graveler(GravelerConfig.from_home(home))
    try:
        repo = g.repository("gcrepo")
        old = time.time_ns() - 3 * 86400 * 10**9
        addrs = []
        for i in range(7):  # 0-2 committed (live), 3-6 orphans; 6 is too young to collect
            t = old + i if i < 6 else time.time_ns()
            a = new_data_address(t)
            repo.store.put(a, b"x" * (i + 1))
            os.utime(os.path.join(repo.store.root, a), ns=(t, t))
            addrs.append(a)
        for i in range(3):
            repo.stage("main", f"f{i}", Entry(address=addrs[i], size=i + 1, etag=str(i)))
        repo.commit("main", "live")
    finally:
        g.close()
    expect = sorted(addrs[3:6])
    stale = tmp_path / "ns" / os.path.dirname(addrs[3]) / (".lakefuse-tmp-" + "e" * 32)  # a killed writer's
    stale.write_bytes(b"partial")
    os.utime(stale, ns=(old, old))

    rc, o, err = run(capsys, "--home", home, "gc", "mark", "lakefs://gcrepo", "--dry-run")
    assert rc == 0, err
    dry = re.search(r"dry run: (\d+) objects \((\d+) bytes\) would be deleted", err)
    assert dry and o.split() == expect
    rc, o, err = run(capsys, "--home", home, "gc", "mark", "lakefs://gcrepo")
    assert rc == 0, err
    real = re.search(r"run (\S+): (\d+) objects \((\d+) bytes\) to delete", o)
    assert real and real.group(2, 3) == dry.group(1, 2) == ("3", str(4 + 5 + 6))
    run_id = real.group(1)

    rc, o, err = run(capsys, "--home", home, "gc", "sweep", "lakefs://gcrepo", run_id, "--dry-run")
    assert rc == 0, err
    dry_sweep = re.search(r": (\d+) would be deleted, (\d+) kept \(live again\), (\d+) failed", o)
    assert dry_sweep and all(os.path.exists(tmp_path / "ns" / a) for a in addrs)
    assert "; 1 stale temp file (7 bytes) would be removed" in o and stale.exists()
    rc, o, err = run(capsys, "--home", home, "gc", "sweep", "lakefs://gcrepo", run_id)
    assert rc == 0, err
    swept = re.search(r": (\d+) deleted, (\d+) kept \(live again\), (\d+) failed", o)
    assert swept and swept.groups() == dry_sweep.groups() == ("3", "0", "0")
    assert "; 1 stale temp file (7 bytes) removed" in o and not stale.exists()
    assert [a for a in addrs if not os.path.exists(tmp_path / "ns" / a)] == expect


def test_the_sweep_line_names_what_killed_writers_left_on_each_store():
    """The sweep's line says stale temp files removed (a local namespace), stale multipart
    uploads aborted (S3), would-be in a dry run, and nothing when there were none."""
    from graveler.spark.gc import SweepResult
    from lakefuse.cli.spark_cmds import _temps

    local = SweepResult("r", 0, 0, 0, False, temp_files=2, temp_bytes=1234)
    s3 = SweepResult("r", 0, 0, 0, False, temp_files=1, temp_bytes=5000, temp_kind="multipart upload")
    assert _temps(local, "removed") == "; 2 stale temp files (1,234 bytes) removed"
    assert _temps(s3, "removed") == "; 1 stale multipart upload (5,000 bytes) aborted"
    assert _temps(s3, "would be removed") == "; 1 stale multipart upload (5,000 bytes) would be aborted"
    assert _temps(SweepResult("r", 0, 0, 0, False), "removed") == ""


def test_a_sweep_whose_deletes_failed_exits_6(tmp_path, capsys, monkeypatch):
    """Found by a fault-injection exploration: `gc run` and `gc sweep` exited 1 when the store
    refused some deletes, a code the README does not list. The store's failure is exit 6, as
    every other; a sweep that deleted all it had to is 0. (The sweep itself is replaced here:
    its deletes under faults are test_spark_gc's.)"""
    from graveler.spark import gc
    from lakefuse.cli import spark_cmds

    home = str(tmp_path / "home")
    assert run(capsys, "--home", home, "repo", "create", "lakefs://swp", "--storage", str(tmp_path / "ns"))[0] == 0
    monkeypatch.setattr(spark_cmds, "_spark", lambda args: None)
    for failed, code in ((2, 6), (0, 0)):
        monkeypatch.setattr(gc, "sweep", lambda spark, repo, run_id, dry_run=False, failed=failed: gc.SweepResult(
            run_id=run_id, deleted=1, kept=0, failed=failed, dry_run=dry_run, swept_before=None))
        rc, o, err = run(capsys, "--home", home, "gc", "sweep", "lakefs://swp", "r1")
        assert rc == code and f"{failed} failed" in o, (rc, o, err)


@pytest.mark.expect_log("the paths left out are logged as a warning too")
def test_cli_import_leaves_out_paths_a_branch_cannot_change_and_says_what_it_skipped(spark, tmp_path, capsys):
    """Found by a tour of odd names: an import took a 3,819-byte path into a commit, where nothing
    could then change or delete it (a branch stages paths of at most 494 bytes: the mount took
    ``>>`` on it and never saved it), and the keys it skipped were counted only on the progress
    line. Such paths stay out, counted and named; the summary and ``--json`` say what was skipped."""
    home = str(tmp_path / "home")
    assert run(capsys, "--home", home, "repo", "create", "lakefs://longrepo", "--storage", str(tmp_path / "ns"))[0] == 0
    src = tmp_path / "src"
    deep = src.joinpath(*["d" * 200] * 3)  # a 600-byte path, every segment fine
    deep.mkdir(parents=True)
    (deep / "f.txt").write_text("deep")
    (src / "ok.txt").write_text("ok")
    (src / "sub").mkdir()
    (src / "sub" / "fine.txt").write_text("fine")
    (src / ".lakefuse").mkdir()  # (a name the mount keeps for its control files: skipped, as before)
    (src / ".lakefuse" / "x").write_text("x")
    rc, o, err = run(capsys, "--home", home, "import", str(src), "lakefs://longrepo/main/in/", "--spark", "local[2]")
    assert rc == 0, err
    assert "imported 2 objects" in o and "1 key(s) left out, their paths over 494 bytes" in o, o
    assert "; 1 key(s) skipped: folder markers" in o, o
    rc, o, err = run(capsys, "--home", home, "import", str(src), "lakefs://longrepo/main/in2/", "--json",
                     "--spark", "local[2]")
    res = json.loads(o)
    assert rc == 0 and res["imported"] == 2 and res["skipped_too_long"] == 1 and res["skipped"] == 1, res
    assert res["too_long_examples"] == [str((deep / "f.txt").relative_to(src))]
    ls = run(capsys, "--home", home, "fs", "ls", "-r", "lakefs://longrepo/main/in/", "--json")[1]
    assert sorted(json.loads(line)["path"] for line in ls.splitlines()) == ["in/ok.txt", "in/sub/fine.txt"], ls
