"""The multipart uploads a killed S3 writer leaves open, aborted by GC's sweep
(graveler.objstore.s3_uploads), on the moto server over HTTP.

(moto reports every upload as started in 2010: the sweep's judgement rests on when the
upload's newest part came, which moto reports truly -- as S3 reports both.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from graveler.objstore import open_store
from graveler.objstore.s3_uploads import sweep_uploads
from tests.graveler_testutil import kill_when

pytestmark = pytest.mark.s3
MiB = 1 << 20
HOUR = 3600.0


def _open_upload(client, bucket: str, key: str, size: int) -> str:
    """A multipart upload of ``key`` with one part of ``size`` bytes sent, never completed."""
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"p" * size)
    return upload_id


def _open_keys(client, bucket: str) -> list[str]:
    return sorted(u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads") or ())


def test_open_uploads_under_the_namespace_last_active_before_the_cutoff_are_aborted(s3_config, s3_bucket,
                                                                                     s3_client):
    """Uploads under the store's prefix whose newest part came before the cutoff (and an hour
    before now) are aborted, their parts counted; one outside the prefix, one whose part came
    after the cutoff (a writer that may be alive) and every upload younger than an hour stay;
    a dry run only counts; a second sweep finds nothing."""
    store = open_store(f"s3://{s3_bucket}/repo-ns", s3_config)
    _open_upload(s3_client, s3_bucket, "repo-ns/data/a", 1000)
    _open_upload(s3_client, s3_bucket, "repo-ns/data/sub/b", 2000)
    _open_upload(s3_client, s3_bucket, "repo-ns-other/c", 3000)  # (shares the prefix's letters only)
    _open_upload(s3_client, s3_bucket, "elsewhere/d", 4000)
    now = time.time()
    later = now + 2 * HOUR  # (the parts an hour old and more)

    assert sweep_uploads(store, cutoff=now + 60).files == 0  # parts seconds old: a writer may be alive
    assert sweep_uploads(store, cutoff=now - 60, now=later).files == 0  # parts after the cutoff

    dry = sweep_uploads(store, cutoff=now + 60, dry_run=True, now=later)
    assert (dry.files, dry.bytes, dry.failed) == (2, 3000, 0)
    assert len(_open_keys(s3_client, s3_bucket)) == 4

    done = sweep_uploads(store, cutoff=now + 60, now=later)
    assert (done.files, done.bytes, done.failed) == (2, 3000, 0)
    assert _open_keys(s3_client, s3_bucket) == ["elsewhere/d", "repo-ns-other/c"]
    assert sweep_uploads(store, cutoff=now + 60, now=later).files == 0
    store.close()


def test_a_writer_killed_mid_upload_leaves_an_open_upload_the_sweep_aborts(s3_endpoint, s3_config, s3_bucket,
                                                                            s3_client, tmp_path):
    """A real put_file of a file in parts, in another process, killed with SIGKILL while a part
    hangs on its way (a proxy holds it): the upload stays open with the parts sent, invisible to
    listings and to the store's own abort; the sweep run later aborts it and leaves no upload."""
    from dataclasses import replace

    from tests.faultproxy import Fault, FaultProxy

    src = tmp_path / "big.bin"
    src.write_bytes(b"z" * (4 * s3_config.multipart_chunksize))
    with FaultProxy(s3_endpoint) as proxy:
        proxy.add(Fault("hang", method="PUT", path="partNumber=3"))
        cfg = replace(s3_config, s3_endpoint_url=proxy.url, transfer_concurrency=1)
        code = ("import sys; from graveler.objstore import StoreConfig, open_store; "
                "cfg = StoreConfig(**eval(sys.argv[1])); "
                "open_store(sys.argv[2], cfg).put_file('data/big.bin', sys.argv[3])")
        fields = {k: getattr(cfg, k) for k in ("s3_endpoint_url", "region", "max_attempts", "connect_timeout",
                                                 "read_timeout", "multipart_threshold", "multipart_chunksize",
                                                 "transfer_concurrency")}
        child = subprocess.Popen([sys.executable, "-c", code, repr(fields), f"s3://{s3_bucket}/ns", str(src)],
                                 cwd=Path(__file__).resolve().parents[1])

        def two_parts_sent() -> bool:  # the upload open with two parts sent, the third held
            ups = s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads") or ()
            return bool(ups) and len(s3_client.list_parts(Bucket=s3_bucket, Key=ups[0]["Key"],
                                                          UploadId=ups[0]["UploadId"]).get("Parts") or ()) >= 2

        try:
            kill_when(child, two_parts_sent, "the upload never got its parts", timeout=60, poll=0.05)
        finally:
            proxy.release()
    assert _open_keys(s3_client, s3_bucket) == ["ns/data/big.bin"]
    store = open_store(f"s3://{s3_bucket}/ns", s3_config)
    assert [o.key for o in store.list()] == []  # (no object: nothing else would ever find the parts)
    res = sweep_uploads(store, cutoff=time.time() + 60, now=time.time() + 2 * HOUR)
    assert (res.files, res.bytes, res.failed) == (1, 2 * s3_config.multipart_chunksize, 0)
    assert _open_keys(s3_client, s3_bucket) == []
    store.close()


def test_an_unreachable_store_is_counted_as_failed_not_raised(s3_config, s3_bucket):
    """The sweep is best effort: a store that cannot be listed is one failure, never an error
    (the GC run whose deletes are done goes on)."""
    from dataclasses import replace

    cfg = replace(s3_config, s3_endpoint_url="http://127.0.0.1:9", max_attempts=1, connect_timeout=1)
    store = open_store(f"s3://{s3_bucket}/ns", cfg)
    res = sweep_uploads(store, cutoff=time.time(), now=time.time() + 2 * HOUR)
    assert (res.files, res.failed) == (0, 1)
    store.close()
