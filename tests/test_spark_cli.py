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
    rc, _, err = run(capsys, "--home", home, "import", str(src), "lakefs://clirepo/main")
    assert rc == 2 and "destination prefix" in err

    rc, o, err = run(capsys, "--home", home, "gc", "rules", "lakefs://clirepo", "--default-days", "7",
                     "--branch", "main=21")
    assert rc == 0 and json.loads(o) == {"default_retention_days": 7,
                                         "branches": [{"branch_id": "main", "retention_days": 21}]}
    rc, o, err = run(capsys, "--home", home, "gc", "mark", "lakefs://clirepo", "--dry-run")
    assert rc == 0 and "0 objects" in err and o == ""
    rc, o, err = run(capsys, "--home", home, "gc", "run", "lakefs://clirepo", "--json")
    assert rc == 0, err
    lines = [json.loads(x) for x in o.splitlines()]
    assert lines[0]["candidates"] == 0 and lines[1]["deleted"] == 0
    rc, o, _ = run(capsys, "--home", home, "gc", "runs", "lakefs://clirepo")
    assert rc == 0 and lines[0]["run_id"] in o
    rc, _, err = run(capsys, "--home", home, "gc", "sweep", "lakefs://clirepo", "nope")
    assert rc == 3 and "no complete report" in err

    dest = tmp_path / "out"
    rc, o, err = run(capsys, "--home", home, "export", "lakefs://clirepo/main", str(dest))
    assert rc == 0 and "12 copied" in o and "full" in o, err
    assert (dest / "raw/p1/4.txt").read_text() == "file 4"
    rc, o, _ = run(capsys, "--home", home, "export", "lakefs://clirepo/main", str(dest))
    assert rc == 0 and "0 copied, 0 deleted (incremental" in o


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
