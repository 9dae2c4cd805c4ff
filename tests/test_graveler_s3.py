"""A repository whose storage namespace is on S3 (moto over HTTP), end to end."""

from __future__ import annotations

import pytest

from graveler.cache import ImmutableCache
from graveler import Graveler
from graveler.config import GravelerConfig

pytestmark = pytest.mark.s3


def test_repository_on_s3_reads_tables_through_the_disk_tier(s3_bucket, s3_config, s3_client, tmp_path):
    g = Graveler(GravelerConfig.from_home(tmp_path / "home", store=s3_config))
    repo = g.create_repository("s3-repo", f"s3://{s3_bucket}/ns")
    assert isinstance(repo._committed.source, ImmutableCache)
    for i in range(50):
        repo.upload("main", f"tables/t/part-{i:03d}.csv", f"row,{i}\n".encode(), content_type="text/csv")
    c1 = repo.commit("main", "first load")
    repo.create_branch("dev", "main")
    repo.upload("dev", "tables/t/part-007.csv", b"changed\n")
    repo.delete("dev", "tables/t/part-008.csv")
    repo.commit("dev", "change on dev")
    merged = repo.merge("dev", "main")
    assert [c.id for c in repo.log("main", amount=3)][1] == c1.id and merged.parents[0] == c1.id
    assert repo.read("main", "tables/t/part-007.csv") == b"changed\n"
    assert not repo.exists("main", "tables/t/part-008.csv")
    assert repo.read("main~1", "tables/t/part-008.csv") == b"row,8\n"
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket, Prefix="ns/")["Contents"]]
    assert any(k.startswith("ns/_lakefs/") for k in keys) and any(k.startswith("ns/data/") for k in keys)
    # A second process-like reader with a fresh home reads the same namespace over HTTP.
    g2 = Graveler(GravelerConfig.from_home(tmp_path / "home2", store=s3_config))
    r2 = g2.create_repository("s3-repo", f"s3://{s3_bucket}/ns", bare=True)
    r2.restore_refs(repo.dump_refs())
    assert [i.path for i in r2.list("main", "tables/t/", "")] == [i.path for i in repo.list("main", "tables/t/", "")]
    assert r2._committed.source.stats.snapshot()["misses"] >= 1
    g.close()
    g2.close()
