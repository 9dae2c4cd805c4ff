"""The CLI on an S3 namespace when things go wrong: bad namespaces, damaged copies, a hung endpoint."""

from __future__ import annotations

import time

import pytest

from lakefuse.cli import main
from tests.faultproxy import Fault, FaultProxy

pytestmark = pytest.mark.s3


class Run:
    def __init__(self, home, capsysbinary):
        self.home = str(home)
        self.cap = capsysbinary

    def __call__(self, *args: str) -> tuple[int, bytes, list[str]]:
        self.cap.readouterr()
        rc = main([*args, "--home", self.home])
        res = self.cap.readouterr()
        return rc, res.out, [x for x in res.err.decode().splitlines() if x.strip()]


@pytest.fixture
def run(tmp_path, capsysbinary, s3_endpoint, monkeypatch):
    monkeypatch.setenv("LAKEFUSE_S3_ENDPOINT", s3_endpoint)
    return Run(tmp_path / "home", capsysbinary)


def test_repo_create_checks_the_namespace(run, s3_bucket, s3_client):
    rc, _, err = run("repo", "create", "lakefs://aaa", "--storage", "s3://no-such-bucket-here/ns")
    assert rc == 2 and len(err) == 1 and "bucket 'no-such-bucket-here' does not exist" in err[0], err
    rc, _, err = run("repo", "create", "lakefs://bbb", "--storage", "s3://Bad_Bucket!/ns")
    assert rc == 2 and len(err) == 1, err
    rc, out, err = run("repo", "list")
    assert rc == 0 and out == b"", (out, err)  # neither was created (they used to be, with exit 0)
    rc, _, err = run("repo", "create", "lakefs://ccc", "--storage", f"s3://{s3_bucket}/ns")
    assert rc == 0, err
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert not any("probe" in k for k in keys), keys  # the probe object was deleted


def _repo(run, bucket: str, tmp_path) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"hello\n")
    assert run("repo", "create", "lakefs://rrr", "--storage", f"s3://{bucket}/ns")[0] == 0
    assert run("fs", "upload", "lakefs://rrr/main/f", "-s", str(src))[0] == 0
    assert run("commit", "lakefs://rrr/main", "-m", "one")[0] == 0


def test_damaged_cache_copy_is_refetched_and_a_bad_store_copy_is_one_error(run, s3_bucket, s3_client, tmp_path):
    import diskcache

    _repo(run, s3_bucket, tmp_path)
    assert run("fs", "cat", "lakefs://rrr/main/f")[1] == b"hello\n"  # fills the disk tier
    with diskcache.Cache(str(tmp_path / "home" / "cache")) as c:
        keys = [k for k in c.iterkeys() if "/_lakefs/" in k]
        assert keys
        for k in keys:
            v = bytearray(c.get(k))
            v[len(v) // 2] ^= 0xFF
            c.set(k, bytes(v))
    r = _subprocess(run, "fs", "cat", "lakefs://rrr/main/f")
    assert r.returncode == 0 and r.stdout == b"hello\n", r.stderr  # evicted and fetched again (was exit 5)
    warnings = r.stderr.decode().splitlines()
    assert warnings and all("evicted it and fetched it again" in line for line in warnings), warnings
    assert run("fs", "cat", "lakefs://rrr/main/f") == (0, b"hello\n", [])  # the good copy is cached now
    # now the store's copies are bad too
    for k in keys:
        key = k.split(f"s3://{s3_bucket}/", 1)[1]
        body = bytearray(s3_client.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
        body[len(body) // 2] ^= 0xFF
        s3_client.put_object(Bucket=s3_bucket, Key=key, Body=bytes(body))
    with diskcache.Cache(str(tmp_path / "home" / "cache")) as c:
        c.clear()
    r = _subprocess(run, "fs", "cat", "lakefs://rrr/main/f")
    err = r.stderr.decode().splitlines()
    assert r.returncode == 5 and r.stdout == b"" and len(err) == 1, err  # was two WARNING lines and the error
    assert err[0].startswith("lakefuse: ") and "_lakefs/" in err[0]


def _subprocess(run, *args):
    """What a shell sees (logging goes to stderr as configured by the CLI, not to pytest)."""
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "lakefuse", *args, "--home", run.home], capture_output=True,
                          timeout=120, env=dict(os.environ))


def test_hung_endpoint_with_timeout_option(run, s3_bucket, s3_endpoint, tmp_path, monkeypatch):
    _repo(run, s3_bucket, tmp_path)
    import shutil

    shutil.rmtree(tmp_path / "home" / "cache")
    with FaultProxy(s3_endpoint) as proxy:
        monkeypatch.setenv("LAKEFUSE_S3_ENDPOINT", proxy.url)
        proxy.add(Fault("hang"))
        t0 = time.monotonic()
        rc, _, err = run("fs", "cat", "lakefs://rrr/main/f", "--timeout", "1", "--max-attempts", "2")
        elapsed = time.monotonic() - t0
        assert rc == 6 and len(err) == 1 and "did not answer within 1 s" in err[0], err
        assert elapsed < 8, elapsed
        monkeypatch.setenv("LAKEFUSE_S3_READ_TIMEOUT", "1")
        monkeypatch.setenv("LAKEFUSE_S3_MAX_ATTEMPTS", "1")
        t0 = time.monotonic()
        rc, _, err = run("fs", "cat", "lakefs://rrr/main/f")
        assert rc == 6 and time.monotonic() - t0 < 5, err
        proxy.clear()
        rc, out, _ = run("fs", "cat", "lakefs://rrr/main/f")
        assert rc == 0 and out == b"hello\n"  # recovers when the endpoint answers again
