"""S3 under injected faults (tests/faultproxy.py in front of the moto server): bounded, retried, verified."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from graveler.errors import CorruptedData, StoreUnavailable
from graveler.objects import read_verified
from graveler.objstore import StoreConfig, open_store
from graveler.config import DEFAULT_MAX_ATTEMPTS, DEFAULT_READ_TIMEOUT
from tests.faultproxy import Fault, FaultProxy

pytestmark = pytest.mark.s3


@pytest.fixture
def proxy(s3_endpoint):
    with FaultProxy(s3_endpoint) as p:
        yield p


@pytest.fixture
def store(proxy, s3_bucket, s3_config):
    cfg = StoreConfig(s3_endpoint_url=proxy.url, region=s3_config.region, max_attempts=3, connect_timeout=1,
                      read_timeout=1, multipart_threshold=s3_config.multipart_threshold,
                      multipart_chunksize=s3_config.multipart_chunksize)
    s = open_store(f"s3://{s3_bucket}/ns", cfg)
    yield s
    s.close()


def test_proxy_passes_everything_through(store, proxy):
    data = os.urandom(300_000)
    store.put("a/b", data)
    assert store.get("a/b") == data
    assert store.get_range("a/b", 10, 20) == data[10:30]
    assert [i.key for i in store.list("a/")] == ["a/b"]
    assert store.head("a/b").size == len(data)
    store.delete("a/b")
    assert proxy.requests >= 6 and proxy.faults == 0


def test_transient_errors_and_short_reads_are_retried(store, proxy):
    data = os.urandom(100_000)
    store.put("o", data)
    proxy.add(Fault("error", method="GET", status=503, times=2))
    assert store.get("o") == data
    proxy.add(Fault("short", method="GET", after=1000, times=1))
    assert store.get("o") == data
    proxy.add(Fault("latency", method="GET", delay=0.3, times=1))
    assert store.get_range("o", 0, 10) == data[:10]
    assert proxy.faults == 4


def test_an_answer_cut_inside_its_headers_is_retried_then_store_unavailable_never_a_result(store, proxy, tmp_path):
    """Found by a data engineer on a flaky network: a response cut inside its headers reads,
    to Python's HTTP client, as a complete one without them: a PUT "succeeded" with no ETag
    (a KeyError, a traceback from the CLI), a GET gave an empty body, a listing nothing.
    s3_answers refuses such an answer as a connection error: one cut is retried as a reset is
    (the call gives its right result), answers cut every time are StoreUnavailable after the
    store's attempts -- never a wrong result."""
    data = os.urandom(10_000)
    store.put("o", data)
    info = store.head("o")
    calls = (("PUT", lambda: store.put("p", data).etag, info.etag), ("GET", lambda: store.get("o"), data),
             ("HEAD", lambda: (store.head("o").size, store.head("o").etag), (info.size, info.etag)),
             ("GET", lambda: [i.key for i in store.list("o")], ["o"]),
             ("GET", lambda: store.get_range("o", 5, 10), data[5:15]),
             ("GET", lambda: store.get_to_file("o", str(tmp_path / "copy")).etag, info.etag))
    for method, call, want in calls:
        for lines in range(16):  # every cut once: before, between and after the headers that matter
            proxy.clear()
            proxy.add(Fault("headcut", method=method, after=lines, times=1))
            assert call() == want, (method, lines)
    refused = 0
    for method, call, _ in calls:  # every answer cut before its headers: refused, each call after 3 attempts
        proxy.clear()
        proxy.add(Fault("headcut", method=method, after=0))
        sent = proxy.requests
        with pytest.raises(StoreUnavailable, match="cut short") as e:
            call()
        assert "3 attempt(s)" in str(e.value) and proxy.requests - sent >= 3
        refused += 1
    assert refused == len(calls)
    proxy.clear()
    store.put("p", data)
    assert store.get("p") == data and [i.key for i in store.list("")] == ["o", "p"]


def test_a_multipart_completion_whose_answer_is_lost_counts_as_done_when_its_object_is_there(store, proxy, tmp_path):
    """Completing a multipart upload twice fails the second time (NoSuchUpload), the first having done
    it. A cut answer to it is not sent again; one that does not come in time botocore sends again
    (found by an S3 tour: a 300 MB ``cp`` failed its close with EIO, the object stored, and the
    retry uploaded it all again). Either way the object there with the upload's parts' ETag and size
    is the upload's: the put succeeds. A completion that did not happen still fails."""
    src = tmp_path / "big"
    src.write_bytes(data := os.urandom(6 << 20))  # (over the fixture's 5 MiB multipart threshold)
    proxy.add(Fault("headcut", method="POST", path="uploadId", after=0, times=1))
    proxy.add(Fault("error", method="POST", path="uploadId", status=500))  # (what a second one would meet)
    assert store.put_file("cut", str(src)).size == len(data)
    assert proxy.faults == 1 and store.get("cut") == data
    proxy.clear()
    proxy.add(Fault("hang", method="POST", path="uploadId", after=1, times=1, delay=5))  # done, answer late
    posts = proxy.requests
    info = store.put_file("late", str(src))
    assert store.get("late") == data and info.etag == store.head("late").etag and proxy.requests - posts >= 3
    proxy.clear()
    proxy.add(Fault("error", method="POST", path="uploadId", status=503))  # healthy check: not done, not there
    with pytest.raises(StoreUnavailable):
        store.put_file("never", str(src))
    proxy.clear()
    assert not store.exists("never")
    store.put_file("big", str(src))
    assert store.get("big") == data


def test_corrupted_body_is_refetched_then_refused(store, proxy):
    """botocore checks S3's checksum of the body: a damaged transfer is fetched again, a damaged copy refused."""
    data = os.urandom(50_000)
    store.put("o", data)
    proxy.add(Fault("corrupt", method="GET", after=777, times=1))
    assert store.get("o") == data
    proxy.add(Fault("corrupt", method="GET", after=777))
    with pytest.raises(CorruptedData, match="checksum"):
        store.get("o")


def test_object_without_s3_checksum_is_caught_by_the_md5(store, proxy, s3_endpoint, s3_bucket):
    """An object written without a checksum (older clients, lakeFS imports): graveler's MD5 check catches it."""
    import boto3
    import botocore.config

    data = os.urandom(50_000)
    raw = boto3.client("s3", endpoint_url=s3_endpoint, config=botocore.config.Config(
        request_checksum_calculation="when_required"))
    raw.put_object(Bucket=s3_bucket, Key="ns/plain", Body=data)
    raw.close()
    md5 = hashlib.md5(data).hexdigest()
    proxy.add(Fault("corrupt", method="GET", after=777, times=1))  # one damaged transfer: fetched again
    assert read_verified(store, "plain", len(data), md5) == data
    proxy.add(Fault("corrupt", method="GET", after=777))  # every one: the copy is damaged
    with pytest.raises(CorruptedData, match="etag"):
        read_verified(store, "plain", len(data), md5)
    proxy.clear()
    assert read_verified(store, "plain", len(data), md5) == data


@pytest.mark.parametrize("after", [0, 100], ids=["before-headers", "mid-body"])
def test_hung_endpoint_fails_within_the_configured_bound(store, proxy, after):
    store.put("o", os.urandom(10_000))
    proxy.add(Fault("hang", method="GET", after=after))
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable, match="did not answer within 1 s"):
        store.get("o")
    elapsed = time.monotonic() - t0
    assert elapsed < store.config.worst_case_seconds + 3, elapsed  # ~3 attempts x 1 s, not minutes


def test_default_bounds_fail_a_cli_within_about_30_seconds(monkeypatch):
    for name in ("LAKEFUSE_S3_CONNECT_TIMEOUT", "LAKEFUSE_S3_READ_TIMEOUT", "LAKEFUSE_S3_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)
    cfg = StoreConfig()
    assert (cfg.read_timeout, cfg.max_attempts) == (DEFAULT_READ_TIMEOUT, DEFAULT_MAX_ATTEMPTS)
    assert cfg.max_attempts * cfg.read_timeout <= 30  # a server that accepts and never answers
    assert cfg.worst_case_seconds < 45  # nothing answers at all
    monkeypatch.setenv("LAKEFUSE_S3_READ_TIMEOUT", "2.5")
    monkeypatch.setenv("LAKEFUSE_S3_MAX_ATTEMPTS", "2")
    cfg = StoreConfig()
    assert (cfg.read_timeout, cfg.max_attempts) == (2.5, 2)
    short = cfg.with_timeout(1)
    assert (short.read_timeout, short.connect_timeout, short.max_attempts) == (1, 1, 2)
    monkeypatch.setenv("LAKEFUSE_S3_MAX_ATTEMPTS", "many")
    from graveler.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="LAKEFUSE_S3_MAX_ATTEMPTS"):
        StoreConfig()


@pytest.mark.expect_log("the failed abort is a warning")
def test_a_multipart_upload_whose_abort_failed_is_aborted_once_the_store_answers(store, proxy, s3_bucket,
                                                                                s3_client, tmp_path):
    """An administrator's finding: an upload that failed while the store was going away left its
    multipart upload in the bucket (its abort failed too): parts billed, never listed. The abort
    is tried again after the next upload that succeeds."""
    src = tmp_path / "big"
    src.write_bytes(os.urandom(3 * store.config.multipart_chunksize))
    proxy.add(Fault("error", method="PUT", path="partNumber=2", status=500))  # a part that never goes
    proxy.add(Fault("error", method="DELETE", path="uploadId", status=503))  # and the abort neither
    fd = os.open(src, os.O_RDONLY)
    try:
        with pytest.raises(StoreUnavailable):
            store._multipart_upload("big", fd, src.stat().st_size)
    finally:
        os.close(fd)
    assert len(s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])) == 1
    proxy.clear()
    store.put("small", b"the store answers again")
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def test_a_range_answered_for_another_range_is_refused_not_served(store, proxy):
    """Found by a fault-injection exploration: a ranged GET answered with another range (a broken
    cache or proxy; its Content-Range honest, its length right) was taken as the bytes asked for
    and kept in the mount's data cache. Only the total and the length were compared; now the
    Content-Range must start and end where the request did (StoreUnavailable: EIO, exit 6).
    Healthy ranges, a range past the object's end (cut to it) and whole-object streams pass."""
    data = os.urandom(300_000)
    store.put("o", data)
    assert store.get_range("o", 100_000, 1000) == data[100_000:101_000]
    assert store.get_range_sized("o", 299_000, 5000) == (data[299_000:], len(data))  # cut at the end
    with store.open_stream("o", 1000) as s:
        assert s.read(len(data)) == data[1000:]
    for call in (lambda: store.get_range("o", 100_000, 1000),
                 lambda: store.get_range_sized("o", 100_000, 1000),
                 lambda: store.open_stream("o", 100_000, 1000).read(1000)):
        proxy.add(Fault("reranged", method="GET", path="/o", after=4096, times=1))
        with pytest.raises(StoreUnavailable, match="asked for bytes 100000-100999"):
            call()
    assert store.get_range("o", 100_000, 1000) == data[100_000:101_000]


def test_a_body_that_stalls_takes_the_configured_attempts_not_three(proxy, s3_bucket, s3_config):
    """Found by a fault-injection exploration: a body that stalled midway was retried three times
    whatever --max-attempts said (`--timeout 3 --max-attempts 1`: 9.8 s and three GETs, reported as
    "1 attempt(s)"). A body now gets the store's attempts, so one read's bound is theirs."""
    for attempts in (1, 2):
        cfg = StoreConfig(s3_endpoint_url=proxy.url, region=s3_config.region, max_attempts=attempts,
                          connect_timeout=1, read_timeout=1)
        s = open_store(f"s3://{s3_bucket}/ns", cfg)
        s.put("stall", os.urandom(100_000))
        proxy.clear()
        before = proxy.requests
        proxy.add(Fault("hang", method="GET", path="/stall", after=1000))
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable):
            s.get("stall")
        elapsed = time.monotonic() - t0
        proxy.release()
        proxy.clear()
        assert proxy.requests - before == attempts and elapsed < attempts * 1.0 + 1.5, (attempts, elapsed)
        s.close()


def test_a_put_damaged_on_the_way_fails_and_is_not_kept(store, proxy, s3_bucket, s3_endpoint):
    """Found by a fault-injection exploration: a PUT body damaged on the way to a store that checks
    no checksum of it (moto) was stored, and `fs upload`, a part of a multipart upload, or a commit's
    tables succeeded with their data gone. The ETag the store answers (the MD5 of what it kept)
    is compared with the MD5 sent: StoreUnavailable, the damaged object deleted; healthy uploads,
    single and multipart, pass."""
    import boto3

    raw = boto3.client("s3", endpoint_url=s3_endpoint)
    data = os.urandom(300_000)
    store.put("ok", data)
    assert store.get("ok") == data
    for how in ("put", "put_file", "part"):
        path = None
        if how != "put":
            path = f"{os.environ.get('TMPDIR', '/tmp')}/lakefuse-damaged-{os.getpid()}-{how}"
            with open(path, "wb") as f:
                f.write(data * (60 if how == "part" else 1))  # past the 8 MiB threshold: parts
        proxy.add(Fault("corrupt_sent", method="PUT", after=777, times=1))
        with pytest.raises(StoreUnavailable, match="other bytes than were sent"):
            if how == "put":
                store.put("bad", data)
            else:
                store.put_file("bad", path)
        keys = [o["Key"] for o in raw.list_objects_v2(Bucket=s3_bucket, Prefix="ns/bad").get("Contents", [])]
        assert keys == [], (how, keys)
        if path:
            store.put_file("good-" + how, path)  # the same file, not damaged: stored
            assert store.head("good-" + how).size == os.path.getsize(path)
            os.unlink(path)
    raw.close()
