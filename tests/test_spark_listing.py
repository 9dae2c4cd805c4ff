"""Parallel listing by delimiter fan-out (graveler.spark.listing, importer.listing_df): the result is
the flat listing exactly, on a real moto S3 server and on the local store; the progress line."""

from __future__ import annotations

import io
import re

import pytest

from graveler.objstore import open_store
from graveler.spark.listing import Progress, fan_out, flat_listing, group_parts, list_parallel, listable

# Keys at every level (the root, deep, a lone deep chain), many siblings, names that sort around "/"
# ("a-b" < "a/" < "a0"), and non-ASCII.
KEYS = (
    ["top.txt", "z-last", "a-b", "a0", "a/x", "a/b/c/d/e/deep.bin", "lone/1/2/3/4/5/6/7/8/leaf", "é/日本.parquet"]
    + [f"d{i % 5}/s{i % 3}/f{i:04d}.csv" for i in range(150)]
    + [f"d{i % 5}/f{i:03d}" for i in range(20)]
    + [f"wide/p{i:03d}/x" for i in range(40)]
)


def _rows(objs) -> list[tuple]:
    return sorted((o.key, o.size, o.etag, round(o.mtime, 3)) for o in objs)


def _fill_s3(s3_client, bucket: str, root: str) -> None:
    for i, k in enumerate(KEYS):
        s3_client.put_object(Bucket=bucket, Key=f"{root}/{k}", Body=b"x" * (i % 7))
    # Not objects: folder markers (one of an otherwise empty "directory"), an empty segment, a dot segment.
    for k in ("empty/", "a/", "d1/s1/", "a//b", "dot/./x"):
        s3_client.put_object(Bucket=bucket, Key=f"{root}/{k}", Body=b"")
    s3_client.put_object(Bucket=bucket, Key="outside/not-listed", Body=b"x")  # beside the prefix


def _fill_local(root) -> None:
    for i, k in enumerate(KEYS):
        p = root / k
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * (i % 7))
    (root / "empty" / "deeper").mkdir(parents=True)  # empty sub-prefixes
    (root / "d2" / "nothing").mkdir()


@pytest.fixture
def s3_tree(s3_client, s3_bucket, s3_config):
    _fill_s3(s3_client, s3_bucket, "raw")
    store = open_store(f"s3://{s3_bucket}/raw", s3_config)
    yield store
    store.close()


@pytest.fixture
def local_tree(tmp_path):
    _fill_local(tmp_path / "src")
    return open_store(str(tmp_path / "src"))


@pytest.mark.parametrize("backend", ["s3", "local"])
@pytest.mark.parametrize("parts", [1, 2, 7, 40, 1000])
def test_list_parallel_equals_the_flat_listing(backend, parts, request):
    store = request.getfixturevalue(f"{backend}_tree")
    flat = flat_listing(store)
    assert {o.key for o in flat} == set(KEYS)  # markers, "a//b", "dot/./x" and the key beside the prefix left out
    got = list_parallel(store, min_parts=parts, threads=4)
    assert [o.key for o in got] == [o.key for o in flat]  # the same order: UTF-8 byte order, as S3 lists
    assert _rows(got) == _rows(flat)


def test_fan_out_is_breadth_first_and_keeps_the_keys_on_the_way(s3_tree):
    fo = fan_out(s3_tree, 3, threads=2)  # one delimited listing of the root: 11 prefixes
    assert fo.calls == 1 and fo.levels == 1 and "top.txt" in {o.key for o in fo.objects}
    assert fo.prefixes == sorted(fo.prefixes) and "wide/" in fo.prefixes and "empty/" in fo.prefixes
    fo = fan_out(s3_tree, 30, threads=2)  # then the level below, prefix by prefix, until 30 parts
    assert len(fo.prefixes) >= 30 and fo.levels == 2 and fo.calls <= 11
    assert {"a/x", "d0/f000", "top.txt"} <= {o.key for o in fo.objects}
    assert "lone/1/" in fo.prefixes or "lone/" in fo.prefixes
    fo = fan_out(s3_tree, 10_000, threads=3, max_levels=3)  # everything expanded down to level 3
    assert all(p.count("/") <= 3 for p in fo.prefixes) and "lone/1/2/" in fo.prefixes
    assert "a/b/c/d/e/deep.bin" not in {o.key for o in fo.objects}


def test_iter_group_lists_a_run_of_prefixes_flat(local_tree):
    from graveler.spark.listing import common_dir, iter_group

    assert common_dir("d0/s0/", "d0/s2/") == "d0/" and common_dir("a/b/", "d1/") == ""
    assert common_dir("x/", "x/") == "x/"
    for group in (["d0/s0/", "d0/s2/"], ["a/b/", "d0/s1/", "lone/", "wide/p003/"], ["wide/p039/", "é/"], [""]):
        done = []
        got = [o.key for b, _ in iter_group(local_tree, group, lambda: done.append(1)) for o in b]
        assert got == [k for k in sorted(KEYS, key=str.encode) if any(k.startswith(p) for p in group)]
        assert len(done) == len(group)


def test_listable():
    assert all(listable(k) for k in ("a", "a/b", "a.b/..c", ".x/y", "é"))
    assert not any(listable(k) for k in ("", "a/", "/a", "a//b", "a/./b", "../a", "a/..", "a\x00b"))
    # names the mount cannot show (found by a security tour: imported, then hidden by the mount)
    assert not any(listable(k) for k in ("a/.lakefuse/commit", ".lakefuse", "a/" + "n" * 256, "é" * 128 + "/x"))
    assert all(listable(k) for k in ("a/.lakefusex", "a/" + "n" * 255, "é" * 127 + "/x"))


def test_group_parts():
    ps = [f"p{i:02d}/" for i in range(10)]
    for k in (1, 3, 4, 10, 50):
        g = group_parts(ps, k)
        assert [p for grp in g for p in grp] == ps and len(g) == min(k, 10)
        assert max(map(len, g)) - min(map(len, g)) <= 1
    assert group_parts([], 4) == []


def test_progress_line_plain_and_terminal():
    buf = io.StringIO()
    p = Progress("s3://b/raw", stream=buf, interval=0)
    p.add(prefixes_found=3)
    p.add(objects=1500, prefixes_done=2, skipped=2)
    p.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"listing s3://b/raw: 1,500 objects, 2/3 prefixes, [\d,]+ objects/s, "
                        r"2 keys skipped \(no object, or a name the mount cannot show\) in [\d.]+ s", lines[-1])
    quiet = io.StringIO()
    p = Progress("x", stream=quiet, interval=3600)  # rate-limited: only the final line
    for _ in range(100):
        p.add(objects=1)
    p.close()
    assert quiet.getvalue().count("\n") == 1 and "100 objects" in quiet.getvalue()
    tty = io.StringIO()
    p = Progress("x", stream=tty, terminal=True)  # rich, one line redrawn
    p.add(objects=7, prefixes_found=1, prefixes_done=1)
    p.close()
    assert "7 objects, 1/1 prefixes" in tty.getvalue()


@pytest.mark.parametrize("backend", ["s3", "local"])
def test_listing_df_equals_the_flat_listing(spark, backend, request, s3_bucket, s3_config, tmp_path):
    from graveler.spark.importer import listing_df, listing_job, materialize_listing

    store = request.getfixturevalue(f"{backend}_tree")
    uri = f"s3://{s3_bucket}/raw" if backend == "s3" else str(tmp_path / "src")
    cfg = s3_config if backend == "s3" else None
    flat = {(o.key, store.full_uri(o.key), o.size, o.etag) for o in flat_listing(store)}
    for min_tasks in (1, 12):
        rows = listing_df(spark, uri, cfg, min_tasks=min_tasks).collect()
        assert len(rows) == len(flat)
        assert {(r.key, r.address, r.size, r.etag) for r in rows} == flat
    buf = io.StringIO()
    prog = Progress(uri, stream=buf, interval=0)
    job = listing_job(spark, uri, cfg, min_tasks=4, progress=prog)
    df, n = materialize_listing(job, prog)
    try:
        assert n == len(flat) and job.tasks >= 1
        last = buf.getvalue().splitlines()[-1]
        assert last.startswith(f"listing {uri}: {len(flat):,} objects, ")
        m = re.search(r"([\d,]+)/([\d,]+) prefixes", last)
        assert m.group(1) == m.group(2)  # every known prefix listed
        if backend == "s3":  # each counted once, however the listing was split (a data engineer saw 1 of 3)
            assert " 5 keys skipped (no object" in last, last
    finally:
        df.unpersist()
