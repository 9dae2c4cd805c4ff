"""The committed manager: ranges, metaranges, get, iterators, apply, diff, merge."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graveler.committed.manager import EMPTY_METARANGE_ID, CommittedManager, StoreSource
from graveler.committed.writer import RangeParams, table_key
from graveler.errors import CorruptedData, InvalidArgument, MergeConflict, NotFound
from graveler.model import DiffType, Entry, MergeStrategy, Value
from graveler.objstore import open_store
from graveler.sstable.reader import SSTable
from tests.test_sstable import LAKEFS


class CountingSource(StoreSource):
    """A store-backed source that counts fetches and writes, by key."""

    def __init__(self, store):
        super().__init__(store)
        self.gets: list[str] = []
        self.puts: list[str] = []

    def get(self, key):
        self.gets.append(key)
        return super().get(key)

    def get_immutable(self, key):
        self.gets.append(key)
        return super().get_immutable(key)

    def put(self, key, data):
        self.puts.append(key)
        super().put(key, data)


def value(i: int, version: int = 0) -> Value:
    return Entry(address=f"data/obj-{i}-{version}", size=i + version, etag=f"{i:08x}{version:08x}",
                 last_modified_ns=1_700_000_000 * 10**9).to_value()


def key(i: int) -> bytes:
    return b"input/2024/%02d/%02d/part-%07d.parquet" % (i % 12 + 1, i % 28 + 1, i)


SMALL = RangeParams(raggedness=64)


@pytest.fixture
def store(tmp_path):
    return open_store(f"file://{tmp_path}/ns")


def manager(store, params=SMALL):
    return CommittedManager(CountingSource(store), params)


def build(m, n, params=SMALL):
    recs = sorted((key(i), value(i)) for i in range(n))
    return m.write_metarange(recs), recs


def test_write_read_get_and_seek(store):
    m = manager(store)
    mr, recs = build(m, 3000)
    ranges = m.list_ranges(mr)
    assert len(ranges) > 10  # raggedness 64 splits 3000 keys many times
    assert sum(r.count for r in ranges) == 3000
    assert list(m.iterator(mr)) == recs
    for k, v in recs[::97]:
        assert m.get(mr, k) == v
    assert m.get(mr, b"absent") is None
    assert m.get(mr, b"\xff") is None
    start = recs[1500][0] + b"\x00"
    assert [k for k, _ in m.iterator(mr, start)] == [k for k, _ in recs[1501:]]
    # every range file is a real table of type "ranges" in the namespace's _lakefs/ folder
    t = SSTable(store.get(table_key(ranges[0].id)))
    assert t.get_property("type") == b"ranges"
    assert SSTable(store.get(table_key(mr))).get_property("type") == b"metaranges"


def test_get_reads_two_tables_cold(store):
    m = manager(store)
    mr, recs = build(m, 3000)
    fresh = manager(store)
    assert fresh.get(mr, recs[2000][0]) == recs[2000][1]
    assert len(fresh.source.gets) == 2  # the metarange and one range


def test_iterator_opens_only_the_ranges_it_enters(store):
    m = manager(store)
    mr, recs = build(m, 3000)
    fresh = manager(store)
    it = fresh.iterator(mr, recs[2999][0])
    assert next(it)[0] == recs[2999][0]
    assert len(fresh.source.gets) == 2


def test_range_ids_do_not_depend_on_batching(store, tmp_path):
    recs = sorted((key(i), value(i)) for i in range(2000))
    a = manager(store).write_metarange(recs)
    other = open_store(f"file://{tmp_path}/other")
    w = manager(other).new_writer()
    # feed in uneven slices, as separate Spark partitions would
    from graveler.model import encode_value

    for lo, hi in [(0, 1), (1, 700), (700, 701), (701, 2000)]:
        w.write_batch([(k, encode_value(v)) for k, v in recs[lo:hi]])
    assert w.close() == a


def test_max_range_size_forces_breaks(store):
    m = manager(store, RangeParams(raggedness=10**9, max_range_size=8192))
    mr, recs = build(m, 2000)
    ranges = m.list_ranges(mr)
    assert len(ranges) > 5
    assert all(r.estimated_size < 8192 + 4096 for r in ranges)
    assert list(m.iterator(mr)) == recs


def test_apply_one_change_writes_one_range_and_one_metarange(store):
    m = manager(store)
    mr, recs = build(m, 5000)
    src = m.source
    before = len(src.puts)
    k = recs[2500][0]
    new, stats = m.apply(mr, [(k, value(2500, 1))])
    assert len(src.puts) - before == 2
    assert stats.changed == 1 and stats.ranges_written == 1
    assert stats.ranges_reused == len(m.list_ranges(mr)) - 1
    assert m.get(new, k) == value(2500, 1)
    assert m.get(mr, k) == recs[2500][1]  # the base is unchanged


def test_apply_add_delete_and_noop(store):
    m = manager(store)
    mr, recs = build(m, 1000)
    changes = [(b"\x00first", value(1, 9)), (recs[10][0], None), (recs[20][0], recs[20][1]), (b"\xffzz", value(2, 9))]
    new, stats = m.apply(mr, changes)
    assert (stats.added, stats.removed, stats.changed) == (2, 1, 0)
    want = dict(recs)
    del want[recs[10][0]]
    want[b"\x00first"] = value(1, 9)
    want[b"\xffzz"] = value(2, 9)
    assert list(m.iterator(new)) == sorted(want.items())
    # deleting everything gives the empty tree; a no-op keeps the same ID
    empty, _ = m.apply(mr, [(k, None) for k, _ in recs])
    assert list(m.iterator(empty)) == []
    same, stats = m.apply(mr, [(recs[0][0], recs[0][1])])
    assert same == mr and stats.changes == 0


def test_apply_rejects_unsorted_changes(store):
    m = manager(store)
    mr, recs = build(m, 100)
    with pytest.raises(InvalidArgument):
        m.apply(mr, [(b"b", None), (b"a", None)])


def test_empty_metarange(store):
    m = manager(store)
    assert list(m.iterator(EMPTY_METARANGE_ID)) == []
    assert m.get(EMPTY_METARANGE_ID, b"x") is None
    new, stats = m.apply(EMPTY_METARANGE_ID, [(b"a", value(1))])
    assert list(m.iterator(new)) == [(b"a", value(1))]
    assert [d.type for d in m.diff(EMPTY_METARANGE_ID, new)] == [DiffType.ADDED]


def test_diff_reads_only_the_differing_ranges(store):
    m = manager(store)
    mr, recs = build(m, 5000)
    changed_keys = [recs[i][0] for i in (10, 2500, 4990)]
    new, _ = m.apply(mr, [(k, value(7, 7)) for k in changed_keys])
    fresh = manager(store)
    d = list(fresh.diff(mr, new))
    assert [r.key for r in d] == changed_keys and all(r.type is DiffType.CHANGED for r in d)
    # two metaranges + at most one differing range per side per changed key
    assert len(fresh.source.gets) <= 2 + 2 * len(changed_keys)


def test_merge_three_way(store):
    m = manager(store)
    base, recs = build(m, 2000)
    k = [r[0] for r in recs]
    source, _ = m.apply(base, sorted([(k[1], value(1, 1)), (k[2], None), (k[3], value(3, 3)),
                                      (b"new-s", value(5, 5))]))
    dest, _ = m.apply(base, sorted([(k[4], value(4, 4)), (k[3], value(3, 3)), (b"new-d", value(6, 6))]))
    merged, _ = m.merge(base, source, dest)
    want = dict(recs)
    want.update({k[1]: value(1, 1), k[3]: value(3, 3), k[4]: value(4, 4), b"new-s": value(5, 5), b"new-d": value(6, 6)})
    del want[k[2]]
    assert list(m.iterator(merged)) == sorted(want.items())


def test_merge_conflicts_and_strategies(store):
    m = manager(store)
    base, recs = build(m, 500)
    k = [r[0] for r in recs]
    source, _ = m.apply(base, sorted([(k[1], value(1, 1)), (k[2], None)]))
    dest, _ = m.apply(base, sorted([(k[1], value(1, 2)), (k[2], value(2, 2))]))
    with pytest.raises(MergeConflict) as ei:
        m.merge(base, source, dest)
    assert ei.value.keys == sorted([k[1], k[2]])
    s, _ = m.merge(base, source, dest, MergeStrategy.SOURCE_WINS)
    assert m.get(s, k[1]) == value(1, 1) and m.get(s, k[2]) is None
    d, _ = m.merge(base, source, dest, MergeStrategy.DEST_WINS)
    assert m.get(d, k[1]) == value(1, 2) and m.get(d, k[2]) == value(2, 2)


def test_merge_reuses_dest_when_only_dest_changed(store):
    m = manager(store)
    base, recs = build(m, 2000)
    dest, _ = m.apply(base, [(recs[5][0], value(5, 5))])
    before = len(m.source.puts)
    merged, stats = m.merge(base, base, dest)
    assert merged == dest and stats.ranges_written == 0
    assert len(m.source.puts) - before == 1  # the (same) metarange, rewritten idempotently


def test_reads_the_real_lakefs_metarange(store):
    rid = "a83af763ba098c15369d9d6d723731eb9ce18b8dfac4f88c6f1287e772393d0e"
    store.put(table_key(rid), (LAKEFS / "range.sst").read_bytes())
    mr_bytes = (LAKEFS / "metarange.sst").read_bytes()
    from graveler.ident import TableHasher

    h = TableHasher()
    for k_, v_ in SSTable(mr_bytes):
        h.add(k_, v_)
    mr_id = h.finish({"type": "metaranges"})
    store.put(table_key(mr_id), mr_bytes)
    m = manager(store)
    got = dict(m.iterator(mr_id))
    assert sorted(got) == [b"a/b/c/no", b"a/b/c/yes"]
    e = Entry.from_value(m.get(mr_id, b"a/b/c/yes"))
    assert e.size == 4 and e.address == "fdf87fcf9ec849f98514ddb7e041ad56"
    # and our writer, fed the same records, produces the very same range ID
    new = m.write_metarange(sorted(got.items()))
    assert [r.id for r in m.list_ranges(new)] == [rid]


def test_missing_and_corrupt_tables(store):
    m = manager(store)
    with pytest.raises(NotFound):
        m.get("0" * 64, b"x")
    mr, recs = build(m, 300)
    r = m.list_ranges(mr)[0]
    data = bytearray(store.get(table_key(r.id)))
    data[10] ^= 0x55
    store.put(table_key(r.id), bytes(data))
    fresh = manager(store)
    with pytest.raises(CorruptedData):
        fresh.get(mr, r.max_key)


# -- model-based: apply / diff / merge against dicts -----------------------------------------

keys_st = st.sampled_from([b"k%03d" % i for i in range(60)])
changes_st = st.dictionaries(keys_st, st.one_of(st.none(), st.integers(0, 3)), max_size=25)


def _vals(d):
    return {k: (None if v is None else value(int(k[1:]), v + 1)) for k, v in d.items()}


def _apply(model, ch):
    out = dict(model)
    for k, v in ch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base_ch=changes_st, src_ch=changes_st, dst_ch=changes_st)
def test_model_apply_diff_merge(tmp_path_factory, base_ch, src_ch, dst_ch):
    root = tmp_path_factory.mktemp("ns")
    store = open_store(f"file://{root}")
    m = CommittedManager(StoreSource(store), RangeParams(raggedness=4))
    bc, sc, dc = _vals(base_ch), _vals(src_ch), _vals(dst_ch)
    base_model = _apply({}, bc)
    base, _ = m.apply(EMPTY_METARANGE_ID, sorted(bc.items()))
    assert dict(m.iterator(base)) == base_model
    src_model, dst_model = _apply(base_model, sc), _apply(base_model, dc)
    src, _ = m.apply(base, sorted(sc.items()))
    dst, _ = m.apply(base, sorted(dc.items()))
    assert dict(m.iterator(src)) == src_model
    # diff against the model
    d = {r.key: r for r in m.diff(src, dst)}
    for k in set(src_model) | set(dst_model):
        a, b = src_model.get(k), dst_model.get(k)
        if a == b:
            assert k not in d
        elif a is None:
            assert d[k].type is DiffType.ADDED
        elif b is None:
            assert d[k].type is DiffType.REMOVED
        else:
            assert d[k].type is DiffType.CHANGED
    # merge against the three-way table
    conflicts = []
    want = dict(dst_model)
    for k in set(base_model) | set(src_model) | set(dst_model):
        b, s, t = base_model.get(k), src_model.get(k), dst_model.get(k)
        if s == b or s == t:
            continue
        if t == b:
            if s is None:
                want.pop(k, None)
            else:
                want[k] = s
        else:
            conflicts.append(k)
    if conflicts:
        with pytest.raises(MergeConflict) as ei:
            m.merge(base, src, dst)
        assert sorted(ei.value.keys) == sorted(conflicts)
    else:
        merged, _ = m.merge(base, src, dst)
        assert dict(m.iterator(merged)) == want
    shutil.rmtree(root, ignore_errors=True)


# -- the same over S3 (moto over HTTP), through the on-disk cache --------------------------------


@pytest.mark.s3
def test_committed_over_s3_through_the_cache(s3_bucket, s3_config, tmp_path):
    from graveler.cache import ImmutableCache
    from graveler.committed.manager import verify_table

    store = open_store(f"s3://{s3_bucket}/repo-ns", s3_config)
    cache = ImmutableCache(store, str(tmp_path / "cache"), max_bytes=64 << 20, verify=verify_table)
    m = CommittedManager(cache, SMALL)
    mr, recs = build(m, 1500)
    new, stats = m.apply(mr, [(recs[700][0], value(700, 1))])
    assert stats.ranges_written == 1
    # a second manager with an empty disk cache reads everything back over HTTP
    cache2 = ImmutableCache(store, str(tmp_path / "cache2"), max_bytes=64 << 20, verify=verify_table)
    m2 = CommittedManager(cache2, SMALL)
    assert list(m2.iterator(mr)) == recs
    assert m2.get(new, recs[700][0]) == value(700, 1)
    assert [d.key for d in m2.diff(mr, new)] == [recs[700][0]]
    assert cache2.stats.snapshot()["misses"] >= 2
    # the files are where lakeFS puts them
    assert any(o.key == table_key(mr) for o in store.list("_lakefs/"))


def test_diff_inside_a_big_range_skips_identical_blocks(store):
    m = manager(store, RangeParams(raggedness=10**9))  # one big range
    mr, recs = build(m, 6000)
    assert len(m.list_ranges(mr)) == 1
    picks = [recs[i][0] for i in (3, 2999, 5998)]
    new, _ = m.apply(mr, [(picks[0], value(1, 1)), (picks[1], None), (picks[2], value(2, 2))])
    from graveler.committed import diff as diff_mod

    seen = []
    orig = diff_mod._RangeCursor.skip_block

    def spy(self):
        seen.append(1)
        orig(self)

    diff_mod._RangeCursor.skip_block = spy
    try:
        d = list(diff_mod.py_diff(m.reader, m.list_ranges(mr), m.list_ranges(new)))  # the reference
    finally:
        diff_mod._RangeCursor.skip_block = orig
    assert [(r.type, r.key) for r in d] == [
        (DiffType.CHANGED, picks[0]), (DiffType.REMOVED, picks[1]), (DiffType.CHANGED, picks[2])]
    blocks = len(SSTable(store.get(table_key(m.list_ranges(mr)[0].id))).data_block_handles())
    # Blocks before the first change are skipped on both sides; after a change, the rewrite realigns
    # with the old block boundaries whenever Pebble's flush rule lands on one again.
    assert len(seen) >= blocks // 2
    it = m.diff(mr, new)  # the compiled walk, when it runs, skips the same blocks and finds the same records
    assert list(it) == d
    if hasattr(it, "blocks_skipped"):
        assert 2 * it.blocks_skipped == len(seen)  # (the spy counts both sides)
    # and against a tree written from scratch (block boundaries differ): same answer
    want = dict(recs)
    want[picks[0]] = value(1, 1)
    del want[picks[1]]
    want[picks[2]] = value(2, 2)
    fresh = m.write_metarange(sorted(want.items()))
    assert fresh == new  # the same records give the same files and IDs, whichever way they were written
    assert store.get(table_key(m.list_ranges(new)[0].id)) == SSTable(store.get(table_key(
        m.list_ranges(fresh)[0].id))).buf
    assert [(r.type, r.key) for r in m.diff(mr, fresh)] == [(r.type, r.key) for r in d]


_BIG = sorted((key(i), value(i)) for i in range(3000))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.tuples(st.integers(0, 2999), st.sampled_from(["del", "upd", "add"])), max_size=8),
    ragged=st.sampled_from([10**9, 700]),
    max_size=st.sampled_from([20 << 20, 60_000]),
)
def test_apply_writes_what_a_from_scratch_write_would(tmp_path_factory, picks, ragged, max_size):
    """Every range apply writes is byte-identical to writing its records from scratch.

    (Whole metaranges may differ from a from-scratch write: like lakeFS, apply copies
    untouched ranges by ID, so size-based boundaries after a change do not move.)
    """
    root = tmp_path_factory.mktemp("canon")
    store = open_store(str(root))
    params = RangeParams(raggedness=ragged, max_range_size=max_size)
    m = CommittedManager(StoreSource(store), params)
    base = m.write_metarange(_BIG)
    model = dict(_BIG)
    changes = {}
    for i, op in picks:
        k = key(i)
        if op == "del":
            changes[k] = None
            model.pop(k, None)
        elif op == "upd":
            changes[k] = value(i, 1 + i % 5)
            model[k] = changes[k]
        else:
            k = k + b".new"
            changes[k] = value(i, 7)
            model[k] = changes[k]
    new, _ = m.apply(base, sorted(changes.items()))
    assert dict(m.iterator(new)) == model
    from graveler.committed.writer import RANGES_TYPE, TableWriter

    for info in m.list_ranges(new):
        tw = TableWriter(RANGES_TYPE)
        for k, raw in m.iter_range_raw(info):
            tw.add(k, raw)
        rid, data, rinfo = tw.finish()
        assert rid == info.id and rinfo == info
        assert data == store.get(table_key(info.id))
    if max_size > 10**6 and all(op != "del" for _, op in picks):
        # with hash-only breaks and no deleted range ends, the whole tree equals a from-scratch write
        scratch = CommittedManager(StoreSource(open_store(str(root / "scratch"))), params)
        assert scratch.write_metarange(sorted(model.items())) == new
    shutil.rmtree(root, ignore_errors=True)


class SlowSource(CountingSource):
    """Puts take a while (so the background ones overlap the writing) and can fail on the n-th put;
    ``events`` records each put's start and end, in order."""

    def __init__(self, store, fail_at: int | None = None):
        super().__init__(store)
        self.events: list[tuple[str, str]] = []
        self.fail_at = fail_at

    def put(self, key, data):
        self.events.append(("start", key))
        time.sleep(0.005)
        if self.fail_at is not None and len(self.puts) + 1 == self.fail_at:
            self.puts.append(key)
            raise OSError(28, "No space left on device")
        super().put(key, data)
        self.events.append(("end", key))


def _put_threads():
    return [t for t in threading.enumerate() if t.name.startswith("graveler-put")]


def _table_types(store):
    return [SSTable(store.get(k)).properties["type"] for k in (o.key for o in store.list("_lakefs/"))]


def test_background_range_puts_all_end_before_the_metarange_is_put(store):
    src = SlowSource(store)
    m = CommittedManager(src, SMALL)
    mr, recs = build(m, 3000)
    assert len(m.list_ranges(mr)) > 5
    starts = [i for i, (what, k) in enumerate(src.events) if what == "start" and k == table_key(mr)]
    ends = [i for i, (what, k) in enumerate(src.events) if what == "end" and k != table_key(mr)]
    assert len(starts) == 1 and len(ends) == len(m.list_ranges(mr))
    assert max(ends) < starts[0]  # every range durable before the metarange naming them is written
    assert list(m.iterator(mr)) == recs
    assert not _put_threads()


def test_a_failed_range_put_fails_the_write_and_no_metarange_is_put(store):
    src = SlowSource(store, fail_at=3)
    m = CommittedManager(src, SMALL)
    with pytest.raises(OSError, match="No space left"):
        build(m, 3000)
    assert set(_table_types(store)) <= {"ranges"}
    assert not _put_threads()


def test_a_merge_conflict_found_mid_write_stops_the_background_puts(store):
    m = manager(store)
    base, recs = build(m, 3000)
    k = [r[0] for r in recs]
    # source changes keys all over (many ranges written before the conflict at the end is met)
    source, _ = m.apply(base, [(k[i], value(i, 1)) for i in range(0, 3000, 50)])
    dest, _ = m.apply(base, [(k[2999], value(2999, 2))])
    source, _ = m.apply(source, [(k[2999], value(2999, 1))])
    with pytest.raises(MergeConflict):
        m.merge(base, source, dest)
    assert not _put_threads()
