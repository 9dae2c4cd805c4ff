"""A Spark job through a real mount: read Parquet from a commit's tree, write with Spark's own
file output committer into a branch tree, commit through the control file, read it back."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.mount_testutil import MountProc, needs_fuse

pytestmark = needs_fuse

REPO = "sparkmnt"

# Spark writes through Hadoop's local filesystem.  Its default (ChecksumFileSystem) adds a
# ".part-....crc" beside every file; RawLocalFileSystem writes the files alone.
RAW_LOCAL = {"fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem", "fs.file.impl.disable.cache": "true"}


def _cli(home, *args):
    r = subprocess.run([sys.executable, "-m", "lakefuse", "--home", str(home), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.slow
def test_spark_job_through_the_mount(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from graveler import Graveler, GravelerConfig

    home = tmp_path / "home"
    src = tmp_path / "src"
    src.mkdir()
    t = pa.table({"id": list(range(5000)), "grp": [i % 7 for i in range(5000)]})
    for i in range(3):
        pq.write_table(t.slice(i * 2000, 2000), src / f"part-{i}.parquet")
    _cli(home, "repo", "create", f"lakefs://{REPO}", "--storage", str(tmp_path / "ns"))
    _cli(home, "fs", "upload", "--recursive", "-s", str(src), f"lakefs://{REPO}/main/in")
    _cli(home, "commit", f"lakefs://{REPO}/main", "-m", "input")
    repo = Graveler(GravelerConfig.from_home(home)).repository(REPO)
    base = repo.get_commit("main").id

    mp = tmp_path / "mnt"
    with MountProc(home, REPO, mp, "--branch-timeout", "0.2") as m:
        df = spark.read.parquet(f"file://{mp}/{base}/in/")
        assert df.count() == 5000
        agg = df.groupBy("grp").agg(F.count("*").alias("n"), F.sum("id").alias("s")).orderBy("grp")
        writer = agg.coalesce(2).write.mode("overwrite")
        for k, v in RAW_LOCAL.items():
            writer = writer.option(k, v)
        writer.parquet(f"file://{mp}/main/out/")
        names = sorted(p.name for p in (mp / "main" / "out").iterdir())
        assert "_SUCCESS" in names and not any(n.endswith(".crc") or n.startswith(".") for n in names), names
        assert not (mp / "main" / "out" / "_temporary").exists()
        (mp / "main" / ".lakefuse" / "commit").write_text("spark job output\n")
        head = repo.get_commit("main")
        assert head.message == "spark job output" and head.parents == (base,)
        keys = sorted(it.path.decode() for it in repo.list(head.id, "out/", delimiter="")
                      if not it.path.endswith(b"/"))
        assert "out/_SUCCESS" in keys and all(k == "out/_SUCCESS" or k.endswith(".parquet") for k in keys), keys
        back = spark.read.parquet(f"file://{mp}/{head.id}/out/").orderBy("grp").collect()
        expected = agg.collect()
        assert [tuple(r) for r in back] == [tuple(r) for r in expected] and len(back) == 7
    assert "Traceback" not in m.log()
