"""graveler.spark: parallel metarange writing, import, entries_df / diff_df (real Spark, local[2])."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from graveler.committed.kernel import fnv1a64_batch
from graveler.committed.writer import RangeParams
from graveler.errors import DirtyBranch, InvalidArgument
from graveler.model import AddressType
from graveler.objstore import open_store
from graveler.spark.diff import diff_df
from graveler.spark.entries import entries_df, namespace_of
from graveler.spark.importer import (
    encode_listing,
    import_listing,
    import_prefix,
    import_records_local,
)
from graveler.spark.tables import (
    RECORD_SCHEMA,
    Namespace,
    read_metarange,
    write_metarange,
    write_metarange_local,
)
from tests.graveler_testutil import entry, make_repo

# Small ranges so that a few thousand records make many ranges: ~1 hash break per 61 keys,
# and a 6 KiB size guard that closes some ranges between hash breaks.
SMALL = RangeParams(max_range_size=6 * 1024, raggedness=61)


def _keys(n: int, seed: int = 7) -> list[str]:
    rnd = random.Random(seed)
    words = ["a", "b", "data", "Zeta", "é", "日本", "x-y", "0", "~"]
    out = set()
    while len(out) < n:
        depth = rnd.randint(1, 4)
        out.add("/".join(rnd.choice(words) + str(rnd.randint(0, 999)) for _ in range(depth)) + ".parquet")
    return sorted(out)


def _listing(n: int, seed: int = 7) -> tuple[list, list[tuple[bytes, bytes]]]:
    """Listing rows (key, address, size, etag, last_modified) and their encoded records."""
    rows = []
    for i, k in enumerate(_keys(n, seed)):
        us = 1_700_000_000_000_000 + i * 1_000_003
        rows.append((k, f"s3://bucket/src/{k}", 100 + i, f"{i:032x}", datetime.fromtimestamp(us / 1e6, tz=timezone.utc)))
    recs = encode_listing("", [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                          [r[3] for r in rows], [int(round(r[4].timestamp() * 1e6)) for r in rows])
    return rows, recs


def test_same_metarange_id_for_1_3_8_partitions(spark, tmp_path):
    _, recs = _listing(4000)
    store = open_store(str(tmp_path / "single"))
    expected = write_metarange_local(store, recs, SMALL)
    ranges = read_metarange(store, expected)
    # The fixture is meaningful: many ranges, some closed by the size guard (not at a hash break).
    hashes = dict(zip((k for k, _ in recs), fnv1a64_batch([k for k, _ in recs])))
    by_size = [r for r in ranges if hashes[r.max_key] % SMALL.raggedness != 0]
    assert len(ranges) > 40 and len(by_size) >= 3, (len(ranges), len(by_size))

    shuffled = recs[:]
    random.Random(1).shuffle(shuffled)  # listing order is not trusted
    for parts in (1, 3, 8):
        ns = Namespace(f"file://{tmp_path}/ns{parts}")
        df = spark.createDataFrame(shuffled, RECORD_SCHEMA).repartition(parts)
        res = write_metarange(df, ns, SMALL, partitions=parts)
        assert res.metarange_id == expected, parts
        assert res.parts == parts and res.records == len(recs) and res.ranges == len(ranges)
        # Every range file the single-process writer made exists, byte for byte, in the Spark namespace.
        other = ns.open()
        for r in ranges[:: max(1, len(ranges) // 10)]:
            assert other.get(f"_lakefs/{r.id}") == store.get(f"_lakefs/{r.id}")


def test_same_metarange_id_default_params_and_min_range_size(spark, tmp_path):
    _, recs = _listing(1500, seed=3)
    for params in (RangeParams(), RangeParams(min_range_size=2048, max_range_size=8192, raggedness=31)):
        store = open_store(str(tmp_path / f"s-{params.min_range_size}"))
        expected = write_metarange_local(store, recs, params)
        ns = Namespace(f"file://{tmp_path}/p-{params.min_range_size}")
        res = write_metarange(spark.createDataFrame(recs[::-1], RECORD_SCHEMA), ns, params, partitions=3)
        assert res.metarange_id == expected


def test_binary_key_order_is_byte_order(spark, tmp_path):
    # Spark must sort keys as unsigned bytes: "é" (0xC3...) after "z", "~" (0x7E) after "Z".
    keys = ["z", "é", "~", "Z", "a/b", "a", "a0", "日本/x"]
    recs = [(k.encode(), b"\x02v\x02d") for k in keys]
    params = RangeParams(raggedness=2)
    store = open_store(str(tmp_path / "s"))
    expected = write_metarange_local(store, recs, params)
    res = write_metarange(spark.createDataFrame(recs, RECORD_SCHEMA), Namespace(f"file://{tmp_path}/p"), params,
                          partitions=4)
    assert res.metarange_id == expected


def test_duplicate_keys_are_a_clear_error(spark, tmp_path):
    recs = [(b"a", b"\x02v\x02d"), (b"b", b"\x02v\x02d"), (b"a", b"\x02w\x02e")]
    with pytest.raises(InvalidArgument, match="duplicate key b'a'"):
        write_metarange(spark.createDataFrame(recs, RECORD_SCHEMA), Namespace(f"file://{tmp_path}/p"),
                        RangeParams(), partitions=1)


def _tree(root, files: dict[str, bytes]) -> None:
    for k, v in files.items():
        p = root / k
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(v)


def test_import_prefix_replaces_destination_and_is_idempotent(spark, tmp_path):
    repo = make_repo(tmp_path, range_params=SMALL)
    repo.upload("main", "raw/old.txt", b"old")  # under the destination: replaced
    repo.upload("main", "other/keep.txt", b"keep")  # outside: kept
    repo.commit("main", "before")
    src = tmp_path / "source"
    files = {f"d{i % 7}/sub{i % 3}/f{i:04d}.csv": f"row {i}\n".encode() for i in range(300)}
    files["top.txt"] = b"top level"
    _tree(src, files)

    res = import_prefix(spark, repo, "main", str(src), "raw/")
    assert res.commit_id is not None and res.imported == len(files)
    c = repo.get_commit("main")
    assert c.id == res.commit_id and c.meta_range_id == res.metarange_id
    assert c.metadata["lakefuse.import.prefix"] == "raw/"
    listed = {it.path.decode(): it.entry for it in repo.list("main", delimiter="")}
    assert set(listed) == {"other/keep.txt"} | {"raw/" + k for k in files}
    for k, data in list(files.items())[:20]:
        e = listed["raw/" + k]
        assert e.address_type == AddressType.FULL and e.address.startswith("file://")
        assert repo.read("main", "raw/" + k) == data  # zero-copy: read from the source directory
        assert e.size == len(data)
    assert repo.read("main", "other/keep.txt") == b"keep"

    # The same import again: the same tree, no new commit.
    again = import_prefix(spark, repo, "main", str(src), "raw/", partitions=3)
    assert again.commit_id is None and again.metarange_id == res.metarange_id
    assert repo.get_commit("main").id == c.id


def test_import_listing_equals_single_process(spark, tmp_path):
    rows, recs = _listing(2500, seed=11)
    repo_a = make_repo(tmp_path, "repo-a", range_params=SMALL)
    repo_b = make_repo(tmp_path, "repo-b", range_params=SMALL)
    df = spark.createDataFrame(rows, "key string, address string, size long, etag string, last_modified timestamp")
    ra = import_listing(repo_a, "main", df.repartition(5), "in/", partitions=8)
    rb = import_records_local(repo_b, "main", [(b"in/" + k, v) for k, v in recs], "in/")
    assert ra.metarange_id == rb.metarange_id and ra.imported == len(rows)
    # The single-process path over the Arrow batch (sorted by Arrow, written over its buffers): the same tree.
    import pyarrow as pa

    from graveler.spark.importer import encode_listing_batch

    repo_c = make_repo(tmp_path, "repo-c", range_params=SMALL)
    batch = encode_listing_batch("in/", pa.table({c: [r[i] for r in rows[::-1]] for i, c in
                                                  enumerate(("key", "address", "size", "etag", "last_modified"))}))
    rc = import_records_local(repo_c, "main", batch, "in/")
    assert rc.metarange_id == rb.metarange_id and rc.imported == len(rows) and rc.records == len(rows)
    e = repo_a.get("main", "in/" + rows[0][0])
    assert e.address == rows[0][1] and e.etag == rows[0][3] and e.address_type == AddressType.FULL
    assert e.last_modified_ns == int(round(rows[0][4].timestamp() * 1e6)) * 1000


def test_import_refuses_a_dirty_branch(spark, tmp_path):
    repo = make_repo(tmp_path)
    repo.stage("main", "x", entry("x"))
    df = spark.createDataFrame([], "key string, address string, size long, etag string, last_modified timestamp")
    with pytest.raises(DirtyBranch):
        import_listing(repo, "main", df, "in/")
    with pytest.raises(InvalidArgument):
        import_listing(repo, "main", df, "../x/")


def test_import_listing_refuses_what_staging_refuses(spark, tmp_path):
    """A data engineer's finding: a listing DataFrame made by hand committed a key with a ".."
    segment (no export could write it), a negative size (every read failed), a folder marker
    naming an object; an empty one emptied the prefix. Each is refused now, nothing committed."""
    from datetime import datetime, timezone

    from graveler.errors import NotFound

    repo = make_repo(tmp_path)
    repo.stage("main", "in/keep", entry("keep"))
    repo.commit("main", "base")
    head = repo.get_commit("main").id
    schema = "key string, address string, size long, etag string, last_modified timestamp"
    now = datetime.now(timezone.utc)
    good = ("ok.txt", f"file://{tmp_path}/ok.txt", 3, "e" * 32, now)
    for bad, match in ((("in/../escape.txt", "file:///x", 3, "e" * 32, now), "not an object key"),
                       (("neg.txt", "file:///x", -5, "e" * 32, now), "negative size"),
                       (("dir/", "file:///x", 7, "e" * 32, now), "folder marker")):
        with pytest.raises(Exception, match=match):
            import_listing(repo, "main", spark.createDataFrame([good, bad], schema), "in/")
        assert repo.get_commit("main").id == head
    with pytest.raises(NotFound, match="listing is empty"):
        import_listing(repo, "main", spark.createDataFrame([], schema), "in/")
    assert repo.get_commit("main").id == head and repo.exists("main", "in/keep")


def test_entries_df_runs_of_ranges_in_a_few_tasks(spark, tmp_path):
    repo = make_repo(tmp_path, range_params=SMALL)
    for i in range(400):
        repo.stage("main", f"k/{i:04d}", entry(f"e{i}"))
    repo.commit("main", "c1")
    mr = repo.get_commit("main").meta_range_id
    nranges = len(read_metarange(namespace_of(repo).open(), mr))
    df = entries_df(spark, repo, "main")
    tasks = min(nranges, 4 * spark.sparkContext.defaultParallelism)
    assert nranges > 3 and df.rdd.getNumPartitions() == tasks
    rows = df.collect()
    assert len(rows) == 400
    assert [r.key for r in rows] == [f"k/{i:04d}" for i in range(400)]  # the commit's order, across tasks
    assert list(df.columns) == ["key", "address", "etag", "last_modified", "size", "range_id", "user_metadata",
                                "address_type"]
    got = {r.key: r for r in rows}
    for it in repo.list("main", delimiter=""):
        r = got[it.path.decode()]
        assert (r.address, r.etag, r.size, r.address_type) == (it.entry.address, it.entry.etag, it.entry.size,
                                                               "RELATIVE")


def test_diff_df_matches_diff_and_reads_only_differing_ranges(spark, tmp_path):
    repo = make_repo(tmp_path, range_params=SMALL)
    for i in range(600):
        repo.stage("main", f"k/{i:04d}", entry(f"e{i}"))
    c1 = repo.commit("main", "c1")
    repo.stage("main", "k/0005", entry("changed"))
    repo.delete("main", "k/0300")
    repo.stage("main", "k/0300a", entry("added"))
    c2 = repo.commit("main", "c2")
    expected = {(d.type.value, d.key.decode()) for d in repo.diff(c1.id, c2.id)}
    assert expected == {("changed", "k/0005"), ("removed", "k/0300"), ("added", "k/0300a")}

    # Ranges present on both sides are never opened: remove their files and diff still works.
    store = namespace_of(repo).open()
    left = {r.id for r in read_metarange(store, c1.meta_range_id)}
    right = {r.id for r in read_metarange(store, c2.meta_range_id)}
    common = left & right
    assert len(common) >= 5
    for rid in common:
        store.delete(f"_lakefs/{rid}")
    rows = diff_df(spark, repo, c1.id, c2.id).collect()
    assert rows == sorted(rows, key=lambda r: r.key.encode())  # one task: in key order
    assert {(r.diff_type, r.key) for r in rows} == expected
    ch = next(r for r in rows if r.diff_type == "changed")
    assert ch.left.etag == "e5" and ch.right.etag == "changed"
    rm = next(r for r in rows if r.diff_type == "removed")
    assert rm.right is None and rm.left.etag == "e300"


def test_diff_df_equals_the_single_process_diff_over_many_ranges(spark, tmp_path):
    """Changes spread over every range, added keys at range boundaries, removals of whole runs, user
    metadata, a change of the address only (same identity: no difference): diff_df's rows are
    repo.diff's, entry by entry, for 1 task and for many."""
    from graveler.model import Entry, encode_value
    from graveler.spark.diff import segments

    rnd = random.Random(5)
    repo = make_repo(tmp_path, range_params=SMALL)
    left = {f"p/{i:05d}".encode(): Entry(f"data/a{i}", i, f"e{i}", 1_700_000_000_000_000_000 + i)
            for i in range(0, 6000, 2)}
    right = dict(left)
    for k in list(left):
        r = rnd.random()
        if r < 0.03:
            del right[k]
        elif r < 0.06:
            right[k] = Entry(f"data/b{k.decode()}", 7, "new", 5, metadata={"m": "v", "é": "日"})
        elif r < 0.08:
            right[k] = Entry(f"data/moved/{k.decode()}", left[k].size, left[k].etag, left[k].last_modified_ns)
    for i in range(1, 6000, 97):
        right[f"p/{i:05d}".encode()] = Entry(f"data/n{i}", 1, "added", 0)
    for i in range(3000, 3400, 2):  # a removed run: whole ranges gone
        right.pop(f"p/{i:05d}".encode(), None)
    mrs = []
    for side in (left, right):
        recs = [(k, encode_value(v.to_value())) for k, v in sorted(side.items())]
        mrs.append(write_metarange_local(repo.store, recs, SMALL))
    c1 = repo.commit_metarange("main", mrs[0], "left")
    c2 = repo.commit_metarange("main", mrs[1], "right")
    expected = {d.key.decode(): d for d in repo.diff(c1.id, c2.id)}
    assert len(expected) > 350
    store = namespace_of(repo).open()
    lr, rr = read_metarange(store, mrs[0]), read_metarange(store, mrs[1])
    segs = segments(lr, rr)
    assert len(segs) > 5 and len(lr) > 50
    for tasks in (1, 7):
        rows = diff_df(spark, repo, c1.id, c2.id, tasks=tasks).collect()
        assert len(rows) == len(expected)
        for r in rows:
            d = expected[r.key]
            assert r.diff_type == d.type.value
            for side, val in (("left", d.left), ("right", d.right)):
                got = getattr(r, side)
                if val is None:
                    assert got is None
                    continue
                e = Entry.from_value(val)
                assert (got.address, got.etag, got.size, dict(got.user_metadata or {}), got.address_type) == (
                    e.address, e.etag, e.size, e.metadata, "RELATIVE")
                lm = got.last_modified
                assert (int(round(lm.timestamp() * 1e6)) if lm else 0) == e.last_modified_ns // 1000
                infos = lr if side == "left" else rr
                assert any(i.id == got.range_id and i.min_key <= r.key.encode() <= i.max_key for i in infos)


def test_imported_value_is_the_library_encoding():
    """The import's hand-built record value equals Entry(...).to_value() encoded, over odd inputs."""
    from graveler.model import Entry, encode_value
    from graveler.spark.importer import imported_value

    rnd = random.Random(3)
    for _ in range(2000):
        addr = "".join(rnd.choice("aé/日x:") for _ in range(rnd.randint(0, 300)))
        size = rnd.choice([0, 1, 127, 128, 2**31, 2**40, rnd.randint(0, 2**62)])
        etag = "".join(rnd.choice("0af-") for _ in range(rnd.randint(0, 40)))
        ns = rnd.choice([0, 1, 999_999_999, 10**9, -5, -1_500_000_000, rnd.randint(-2**62, 2**62)])
        e = Entry(address=addr, size=size, etag=etag, last_modified_ns=ns, address_type=AddressType.FULL)
        assert imported_value(addr, size, etag, ns) == encode_value(e.to_value()), (addr, size, etag, ns)


def test_commit_metarange_expected_head(tmp_path):
    """The import's commit is a compare-and-set on the head its tree was computed from."""
    from graveler.errors import PreconditionFailed

    repo = make_repo(tmp_path)
    repo.stage("main", "a", entry("a"))
    c1 = repo.commit("main", "c1")
    repo.stage("main", "b", entry("b"))
    c2 = repo.commit("main", "c2")
    with pytest.raises(PreconditionFailed):
        repo.commit_metarange("main", c1.meta_range_id, "stale", expected_head=c1.id)
    assert repo.get_commit("main").id == c2.id and not repo.has_uncommitted("main")
    c3 = repo.commit_metarange("main", c1.meta_range_id, "ok", expected_head=c2.id)
    assert c3.parents == (c2.id,)


def test_listing_batch_is_the_library_encoding():
    """The compiled encode of a listing's Arrow buffers (the import's tasks) equals Entry(...).to_value()
    encoded, over odd inputs, sliced and chunked arrays, and null last-modified times; bad keys are a clear error."""
    import pyarrow as pa

    from graveler.model import Entry, encode_value
    from graveler.spark.importer import encode_listing_batch

    rnd = random.Random(5)
    n = 3000
    keys = [f"k{i:05d}/" + "".join(rnd.choice("aé/日x:") for _ in range(rnd.randint(0, 30))) + "z" for i in range(n)]
    addrs = ["".join(rnd.choice("aé/日x:") for _ in range(rnd.randint(0, 300))) for _ in range(n)]
    sizes = [rnd.choice([0, 1, 127, 128, 2**31, 2**40, rnd.randint(0, 2**62)]) for _ in range(n)]
    etags = ["".join(rnd.choice("0af-") for _ in range(rnd.randint(0, 40))) for _ in range(n)]
    mtimes = [rnd.choice([None, 0, 1, 999_999, -5, -1_500_000, rnd.randint(-2**52, 2**52)]) for _ in range(n)]
    tbl = pa.table({"key": keys, "address": addrs, "size": pa.array(sizes, pa.int64()), "etag": etags,
                    "last_modified": pa.array(mtimes, pa.int64()).cast(pa.timestamp("us", tz="UTC"))})
    tbl = pa.concat_tables([tbl.slice(0, 1000), tbl.slice(1000)])  # two chunks
    for part in (tbl, tbl.slice(17, 2000), tbl.slice(1500).to_batches()[0]):
        got = encode_listing_batch("dst/", part)
        d = part.to_pydict()
        want = [encode_value(Entry(address=a, size=s, etag=e, last_modified_ns=(m or 0) * 1000,
                                   address_type=AddressType.FULL).to_value())
                for a, s, e, m in zip(d["address"], d["size"], d["etag"],
                                      part.column("last_modified").cast(pa.int64()).to_pylist())]
        assert got.column("key").to_pylist() == [b"dst/" + k.encode() for k in d["key"]]
        assert got.column("value").to_pylist() == want
    for bad in ("", "/abs", "a\x00b"):
        t1 = tbl.slice(0, 2).set_column(0, "key", pa.array(["ok", bad]))
        with pytest.raises(InvalidArgument, match="invalid listed key|not an object key"):
            encode_listing_batch("", t1)
    # a time whose nanoseconds do not fit int64 (past 2262) is refused, not wrapped around
    far = pa.array([0, 2**62], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    with pytest.raises(InvalidArgument, match="out of range"):
        encode_listing_batch("", tbl.slice(0, 2).set_column(4, "last_modified", far))


def test_entry_columns_compiled_equal_protobuf():
    """entries_df's compiled decoder (graveler._centries) gives the protobuf reference's columns, over odd
    entries (metadata, content types, negative and absent times, every address type); malformed values
    and protobufs are CorruptedData."""
    import pyarrow as pa

    from graveler.errors import CorruptedData
    from graveler.model import Entry, encode_value
    from graveler.spark.entries import _c_entry_arrays, _py_entry_arrays

    rnd = random.Random(1)
    keys, vals = [], []
    for i in range(3000):
        md = {} if rnd.random() < 0.8 else {"a": "b", "x" * rnd.randint(0, 3): "é"}
        e = Entry(address="".join(rnd.choice("aé/日x:") for _ in range(rnd.randint(0, 50))),
                  size=rnd.choice([0, 5, 2**40]), etag=rnd.choice(["", "abc"]),
                  last_modified_ns=rnd.choice([0, 1, 999, -1, -1001, 10**18, -10**18, 1_700_000_000_123_456_789]),
                  metadata=md, address_type=rnd.choice(list(AddressType)), content_type=rnd.choice(["", "text/x"]))
        keys.append(f"k{i:06d}/é".encode())
        vals.append(encode_value(e.to_value()))
    want, wid = _py_entry_arrays(keys, vals, "rid", pa)
    got, gid = _c_entry_arrays(keys, vals, "rid", pa)
    for w, g in zip(want, got):
        assert w.equals(g), (w.type, w.to_pylist()[:3], g.to_pylist()[:3])
    assert pa.array(wid, pa.binary()).equals(gid)
    for bad in (b"\x40abc", vals[0][:-1], encode_value((b"i" * 32, b"\x0a\x05ab")), encode_value((b"", b"\x0a\x02\xff\xfe"))):
        with pytest.raises(CorruptedData):
            _c_entry_arrays([b"k"], [bad], "rid", pa)


def test_gc_live_addresses_compiled_equal_reference():
    """The GC mark's live addresses by the compiled decoder and Arrow compute equal relative_address over
    protobuf, for every address type, addresses inside and outside the namespace, and non-ASCII roots."""
    import pyarrow as pa

    from graveler.model import Entry, encode_value
    from graveler.spark.gc import _c_live_addresses, _py_live_addresses

    rnd = random.Random(2)
    ns = "file:///tmp/ns-é/x"
    vals = []
    for i in range(3000):
        a = rnd.choice([f"data/ab/c{i}", f"x/data/{i}", f"{ns}/data/q{i}", f"{ns}/other", "s3://b/data/z",
                        "data/é://x", f"{ns}data/y", ""])
        vals.append(encode_value(Entry(address=a, size=1, etag="e", address_type=rnd.choice(list(AddressType)))
                                 .to_value()))
    want = _py_live_addresses(vals, "rid", ns, pa)
    assert len(want) > 500 and want.equals(_c_live_addresses(vals, "rid", ns, pa))
