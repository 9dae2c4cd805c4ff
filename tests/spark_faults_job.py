"""Run by test_spark_export.test_retried_tasks_do_not_change_results in its own process.

Spark in ``local[2,3]`` (3 attempts per task) with LAKEFUSE_SPARK_FAULT=first-attempt:
every task's first attempt fails after it has done its work (written its range
files, report part, copies).  Runs each job once and prints one JSON line of
results for the test to check.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from graveler.committed.writer import RangeParams
from graveler.model import Entry
from graveler.objects import new_data_address
from graveler.objstore import open_store
from graveler.spark.entries import entries_df
from graveler.spark.export import export
from graveler.spark.gc import GCRules, mark, set_rules, sweep
from graveler.spark.importer import import_prefix
from graveler.spark.session import SparkConfig, get_session
from graveler.spark.tables import RECORD_SCHEMA, Namespace, write_metarange, write_metarange_local
from tests.graveler_testutil import make_repo

PARAMS = RangeParams(max_range_size=4096, raggedness=23)


def failed_tasks(sc) -> int:
    st = sc.statusTracker()
    n = 0
    for job in st.getJobIdsForGroup(None):
        info = st.getJobInfo(job)
        for sid in info.stageIds if info else ():
            si = st.getStageInfo(sid)
            n += si.numFailedTasks if si else 0
    return n


def main(tmp: Path) -> dict:
    assert os.environ.get("LAKEFUSE_SPARK_FAULT") == "first-attempt"
    spark = get_session(SparkConfig(master="local[2,3]", app_name="lakefuse-faults", shuffle_partitions=3))
    out: dict = {}
    try:
        rnd = random.Random(5)
        recs = sorted({(f"k/{rnd.randrange(10**6):07d}/{i}".encode(), b"\x02v\x04dd") for i in range(1500)})
        store = open_store(str(tmp / "single"))
        out["metarange_local"] = write_metarange_local(store, recs, PARAMS)
        shuffled = recs[:]
        rnd.shuffle(shuffled)
        res = write_metarange(spark.createDataFrame(shuffled, RECORD_SCHEMA).repartition(3),
                              Namespace(f"file://{tmp}/spark"), PARAMS, partitions=3)
        out["metarange_spark"] = res.metarange_id

        repo = make_repo(tmp, range_params=PARAMS)
        src = tmp / "src"
        for i in range(120):
            p = src / f"d{i % 4}" / f"f{i:03d}"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"x" * i)
        first = import_prefix(spark, repo, "main", str(src), "in/")
        again = import_prefix(spark, repo, "main", str(src), "in/")
        out["import_again_commit"] = again.commit_id
        out["entries"] = sorted(r.key for r in entries_df(spark, repo, "main").collect())
        out["expected_entries"] = sorted(f"in/d{i % 4}/f{i:03d}" for i in range(120))
        assert first.commit_id

        # GC: one orphan three days old is the only candidate.
        t_ns = time.time_ns() - 3 * 86400 * 10**9
        addr = new_data_address(t_ns)
        repo.store.put(addr, b"orphan")
        os.utime(os.path.join(repo.store.root, addr), ns=(t_ns, t_ns))
        repo.stage("main", "kept", Entry(address=repo.upload("main", "tmp", b"k").address, size=1,
                                         etag=hashlib.md5(b"k").hexdigest()))
        set_rules(repo, GCRules(7))
        m = mark(spark, repo, now=datetime.now(timezone.utc) + timedelta(seconds=1))
        s = sweep(spark, repo, m.run_id)
        out["gc_deleted"] = s.deleted
        out["gc_expected"] = 1 if not repo.store.exists(addr) and m.candidates == 1 else -1

        dest = tmp / "export"
        export(spark, repo, "main", str(dest))
        exported = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
        out["export_tree_ok"] = exported == {f"in/d{i % 4}/f{i:03d}" for i in range(120)} | {"_SUCCESS"} and all(
            (dest / f"in/d{i % 4}/f{i:03d}").read_bytes() == b"x" * i for i in range(120))
        out["injected_failures"] = failed_tasks(spark.sparkContext)
    finally:
        spark.stop()
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
