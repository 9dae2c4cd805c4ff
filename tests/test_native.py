"""The compiled hot path against its pure-Python reference: same bytes, same records, same errors.

Both implementations are fed the same random records (shared prefixes, empty
and large values, 0xff bytes); blocks, files, IDs and decoded records must be
identical.  The real lakeFS fixtures and the byte-for-byte writer checks run on
both (``PySSTable`` / ``PySSTableWriter`` below, and the whole committed
layer under ``LAKEFUSE_PURE_PYTHON=1`` in a subprocess).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import google_crc32c
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from graveler import ident, native
from graveler.committed import fnv
from graveler.errors import CorruptedData
from graveler.model import Entry, Value, py_decode_value, py_encode_records, py_encode_value
from graveler.committed import kernel as committed_kernel
from graveler.committed import writer as committed_writer
from graveler import model
from graveler.sstable import _cblock, block
from graveler.sstable import kernel as sstable_kernel
from graveler.sstable.reader import BlockCache, SSTable
from graveler.sstable.writer import SSTableWriter, py_index_key
from tests.graveler_testutil import catalog_entries
from tests.shared_paths import LAKEFS_FIXTURES

_crecord = native.load("graveler._crecord")
_clru = native.load("graveler._clru")
_csha256 = native.load("graveler.sstable._csha256")
_cfnv = native.load("graveler.committed._cfnv")
REPO = Path(__file__).resolve().parents[1]
LAKEFS = LAKEFS_FIXTURES


class PySSTable(SSTable):
    kernel = sstable_kernel.reference


class CSSTable(SSTable):
    kernel = sstable_kernel.compiled


class PySSTableWriter(SSTableWriter):
    block_builder = block.PyBlockBuilder
    should_flush = staticmethod(block.py_should_flush)
    index_key = staticmethod(py_index_key)


class CSSTableWriter(SSTableWriter):
    block_builder = _cblock.BlockBuilder
    should_flush = staticmethod(_cblock.should_flush)
    index_key = staticmethod(_cblock.index_key_for)


def test_compiled_is_the_default():
    if os.environ.get("LAKEFUSE_PURE_PYTHON"):
        pytest.skip("this run selects the pure-Python reference")
    assert native.implementation() == "compiled"
    assert sstable_kernel.decode_block is _cblock.decode_block
    assert sstable_kernel.BlockBuilder is _cblock.BlockBuilder
    assert committed_kernel.MetaRangeWriter is committed_kernel.compiled.MetaRangeWriter


# -- records ------------------------------------------------------------------------------------

_prefixes = st.sampled_from([b"", b"a", b"data/", b"data/year=2024/", b"\xff", b"\xff\xff\x00", b"x" * 130, b"y" * 600])
_keys = st.builds(lambda p, s: p + s, _prefixes, st.binary(max_size=40))
_values = st.one_of(st.just(b""), st.binary(max_size=60), st.binary(min_size=120, max_size=300),
                    st.builds(lambda n, c: bytes([c]) * n, st.integers(0, 20_000), st.sampled_from([0, 0xFF, 0x61])))
_records = st.dictionaries(_keys, _values, max_size=200).map(lambda d: sorted(d.items()))


def _block_bytes(builder_cls, recs, interval, trailer):
    b = builder_cls(interval)
    sizes = []
    for k, v in recs:
        b.add(k + trailer, v)
        sizes.append((b.size, b.n_entries, b.last_key))
    return b.finish(), sizes


@settings(max_examples=300, deadline=None)
@given(recs=_records, interval=st.sampled_from([1, 2, 16, 1 << 31]), internal=st.booleans(),
       probes=st.lists(_keys, max_size=20))
def test_blocks_are_byte_identical_and_decode_the_same(recs, interval, internal, probes):
    trailer = b"\x01\0\0\0\0\0\0\0" if internal else b""
    py_bytes, py_sizes = _block_bytes(block.PyBlockBuilder, recs, interval, trailer)
    c_bytes, c_sizes = _block_bytes(_cblock.BlockBuilder, recs, interval, trailer)
    assert c_bytes == py_bytes
    assert c_sizes == py_sizes
    pyb = block.py_decode_block(py_bytes, "b", 0, internal)
    cb = _cblock.decode_block(c_bytes, "b", 0, internal)
    assert cb.keys == pyb.keys == [k for k, _ in recs]
    assert cb.values == pyb.values == [v for _, v in recs]
    assert cb.nbytes == pyb.nbytes == len(py_bytes)
    assert len(cb) == len(pyb) == len(recs)
    for i in range(len(recs)):
        assert cb.key_at(i) == recs[i][0] and cb.value_at(i) == recs[i][1]
    for p in probes + [k for k, _ in recs[::7]] + [k + b"\0" for k, _ in recs[::5]] + [b""]:
        assert cb.find(p) == pyb.find(p)
        assert cb.get(p) == pyb.get(p)
        i = pyb.find(p)
        assert list(cb.iter_from(i)) == list(pyb.iter_from(i))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), internal=st.booleans())
def test_damaged_blocks_never_decode_differently(data, internal):
    try:
        c = _cblock.decode_block(data, "d", 7, internal)
    except CorruptedData as e:
        assert e.offset == 7
        return
    # the compiled decoder also checks restart points, so it may refuse what the reference takes -- never the reverse
    p = block.py_decode_block(data, "d", 7, internal)
    assert (c.keys, c.values) == (p.keys, p.values)


@settings(max_examples=200, deadline=None)
@given(recs=_records, compression=st.booleans(), block_size=st.sampled_from([64, 512, 4096]),
       probes=st.lists(_keys, max_size=10))
def test_files_are_byte_identical_and_read_the_same(recs, compression, block_size, probes):
    files = []
    for cls in (PySSTableWriter, CSSTableWriter):
        w = cls(compression=compression, block_size=block_size)
        for k, v in recs:
            w.add(k, v)
        est = w.estimated_size()
        files.append((w.finish({"type": b"ranges", "estimated_size_bytes": str(est).encode()}), est))
    assert files[0] == files[1]
    data = files[0][0]
    py_t, c_t = PySSTable(data, block_cache=BlockCache()), CSSTable(data, block_cache=BlockCache())
    assert list(c_t) == list(py_t) == recs
    assert c_t.raw_properties == py_t.raw_properties
    assert c_t.data_block_handles() == py_t.data_block_handles()
    for k, v in recs[::3]:
        assert c_t.get(k) == py_t.get(k) == v
        assert list(c_t.seek_ge(k + b"\0")) == list(py_t.seek_ge(k + b"\0"))
    for p in probes + [b"", b"\xff" * 700]:
        assert c_t.get(p) == py_t.get(p)
        assert list(c_t.seek_ge(p)) == list(py_t.seek_ge(p))
    h_py, h_c = ident.TableHasher(), ident.TableHasher()
    h_py._h.update(ident.py_hasher_input([k for k, _ in recs], [v for _, v in recs]))
    h_c._h.update(_crecord.hasher_input([k for k, _ in recs], [v for _, v in recs]))
    assert h_c.finish({"type": "ranges"}) == h_py.finish({"type": "ranges"})


@settings(max_examples=100, deadline=None)
@given(recs=st.dictionaries(_keys, st.tuples(st.binary(max_size=40), _values), max_size=150),
       block_size=st.sampled_from([64, 4096]), probe=_keys)
def test_record_scans_decode_values_the_same(recs, block_size, probe):
    recs = sorted((k, Value(i, d)) for k, (i, d) in recs.items())
    w = CSSTableWriter(block_size=block_size)
    for k, v in recs:
        w.add(k, py_encode_value(v))
    data = w.finish()
    py_t, c_t = PySSTable(data, block_cache=BlockCache()), CSSTable(data, block_cache=BlockCache())
    got = list(c_t.seek_ge(probe, model.VALUE_DECODER))
    want = [(k, v) for k, v in recs if k >= probe]
    assert got == list(py_t.seek_ge(probe, py_decode_value)) == want
    assert list(c_t.seek_ge(probe, py_decode_value)) == want  # a decoder without a C entry point
    assert all(type(v) is Value for _, v in got)


@pytest.mark.parametrize("cls", [PySSTable, CSSTable], ids=["pure", "compiled"])
@pytest.mark.parametrize("name", ["range", "metarange", "ok1"])
def test_lakefs_fixtures_read_and_rewrite_byte_for_byte(cls, name):
    raw = (LAKEFS / f"{name}.sst").read_bytes()
    t = cls(raw, block_cache=BlockCache())
    recs = list(t)
    assert recs and [k for k, _ in recs] == sorted(k for k, _ in recs)
    for k, v in recs:
        assert t.get(k) == v
    w = (PySSTableWriter if cls is PySSTable else CSSTableWriter)()
    for k, v in recs:
        w.add(k, v)
    props = {k: t.raw_properties[k] for k in ("count", "min_key", "max_key", "type")}
    props["estimated_size_bytes"] = str(w.estimated_size()).encode()
    assert w.finish(props) == raw
    h = ident.TableHasher()
    h.add_many([k for k, _ in recs], [v for _, v in recs])
    if name == "range":
        assert h.finish({"type": "ranges"}).startswith("a83af763")


# -- record values, entries, identities, FNV ------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(identity=st.binary(max_size=100), data=st.one_of(st.binary(max_size=100), st.binary(min_size=8000, max_size=9000)))
def test_values_encode_and_decode_the_same(identity, data):
    v = Value(identity, data)
    raw = py_encode_value(v)
    assert _crecord.encode_value(v) == raw
    got = _crecord.decode_value(raw)
    assert got == py_decode_value(raw) == v
    assert type(got) is Value and got.identity == identity and got.data == data


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=40))
def test_malformed_values_fail_alike(raw):
    try:
        want = py_decode_value(raw, "n")
    except CorruptedData:
        with pytest.raises(CorruptedData) as ei:
            _crecord.decode_value(raw, "n")
        assert ei.value.name == "n"
        return
    assert _crecord.decode_value(raw, "n") == want


_entries = catalog_entries(30, lambda text: st.dictionaries(text, text, max_size=5))


@settings(max_examples=400, deadline=None)
@given(e=_entries)
def test_entries_encode_and_identify_the_same(e):
    assert e.to_proto_bytes() == e.py_to_proto_bytes()
    assert e.to_value() == e.py_to_value()
    assert model.entry_identity(e.size, e.etag, e.metadata, e.content_type) == \
        ident.py_entry_identity(e.size, e.etag, e.metadata, e.content_type)
    assert e.to_record() == _crecord.entry_record(e) == py_encode_value(e.py_to_value())
    assert Entry.from_value(e.to_value()) == e


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(_entries, st.builds(Value, st.binary(max_size=40), st.binary(max_size=300)),
                                 st.none()), max_size=8))
def test_record_batches_encode_the_same(values):
    """encode_records (staging's batch: Entries, Values, tombstones) writes what the reference writes."""
    want = py_encode_records(values)
    assert _crecord.encode_records(values) == want
    assert _crecord.encode_records(iter(values)) == want


def test_large_entries_and_sha256_match_hashlib():
    """An identity input past the compiled encoder's stack buffer, and its SHA-256 against hashlib's."""
    import hashlib

    md = {f"k{i:04d}-" + "é" * 40: "v" * (i % 300) for i in range(60)}
    e = Entry(address="x" * 5000, size=2**40, etag="t" * 1000, last_modified_ns=-1, metadata=md, content_type="c" * 900)
    assert e.to_value() == e.py_to_value()
    assert _crecord.encode_records([e, None, e]) == py_encode_records([e, None, e])
    for data in (b"", b"abc", bytes(range(256)) * 50):
        assert _crecord.sha256(data) == hashlib.sha256(data).digest()
    with pytest.raises(TypeError):
        _crecord.encode_records([Entry(address=1, size=1, etag="e")])


def test_entry_subclasses_encode_through_their_attributes():
    """The compiled encoders read Entry's slots directly only for Entry itself; a subclass's properties count."""

    class Upper(Entry):
        __slots__ = ()

        def __getattribute__(self, name):
            v = object.__getattribute__(self, name)
            return v.upper() if name == "etag" else v  # a new str on every read

    r = Upper(address="a", size=3, etag="etag", metadata={"k": "v"})
    plain = Entry(address="a", size=3, etag="ETAG", metadata={"k": "v"})
    assert r.to_value() == plain.to_value() == plain.py_to_value()
    assert _crecord.encode_records([r]) == [r.to_record()] == py_encode_records([plain])


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(_keys, max_size=50))
def test_fnv_and_hasher_input_are_the_same(keys):
    assert _cfnv.fnv1a64_batch(keys) == fnv.py_fnv1a64_batch(keys) == [fnv.py_fnv1a64(k) for k in keys]
    vals = [k[::-1] for k in keys]
    assert _crecord.hasher_input(keys, vals) == ident.py_hasher_input(keys, vals)


# -- selection -----------------------------------------------------------------------------------

def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_pure_python_is_selected_by_the_environment():
    r = _run("from graveler import native, model; from graveler.sstable import kernel as s;"
             "from graveler.committed import kernel as c;"
             "print(native.implementation(), s.selected.name, c.selected.name, s.decode_block.__module__,"
             " model.decode_value.__module__, c.MetaRangeWriter.__module__)",
             LAKEFUSE_PURE_PYTHON="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["pure-python", "pure-python", "pure-python", "graveler.sstable.block", "graveler.model",
                                "graveler.committed.writer"]


def test_a_missing_build_is_a_clear_import_error():
    r = _run("import sys; sys.modules['graveler.sstable._cblock'] = None; import graveler.sstable.reader",
             LAKEFUSE_PURE_PYTHON="")
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "is not built" in r.stderr and "LAKEFUSE_PURE_PYTHON=1" in r.stderr


@pytest.mark.skipif(bool(os.environ.get("LAKEFUSE_PURE_PYTHON")), reason="already the pure-Python run")
def test_fixture_and_committed_suites_pass_on_the_pure_python_reference():
    """The lakeFS fixture tests, the byte-for-byte writer tests and the committed layer, on the reference."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/test_sstable.py",
         "tests/test_committed.py", "tests/test_lru.py", "-k", "not s3 and not fuzz", "--hypothesis-seed=0"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "LAKEFUSE_PURE_PYTHON": "1"}, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_entry_metadata_in_protobufs_map_order():
    """upb writes a key that is a prefix of another after it; the compiled encoder must too."""
    e = Entry(address="a", size=1, etag="e", metadata={"": "", "0": "", "a": "1", "ab": "", "B": "x", "b": "2"})
    assert e.to_proto_bytes() == e.py_to_proto_bytes()
    assert Entry.from_value(e.to_value()) == e


# -- ranges: the compiled record loop of MetaRangeWriter -------------------------------------------

@settings(max_examples=300, deadline=None)
@given(a=_keys, b=_keys)
def test_index_keys_follow_pebble_like_the_reference(a, b):
    from graveler.sstable.writer import _index_key, separator

    assert _cblock.index_key_for(a, b) == _index_key(a, separator(a, b))


class _Dict:
    def __init__(self):
        self.files = {}

    def put(self, key, data):
        self.files[key] = data


@settings(max_examples=60, deadline=None)
@given(recs=st.dictionaries(_keys, _values, max_size=400).map(lambda d: sorted(d.items())),
       ragged=st.sampled_from([3, 50, 50_000]), max_size=st.sampled_from([2_000, 20_000, 20 << 20]),
       min_size=st.sampled_from([0, 1_000]), cuts=st.lists(st.integers(0, 400), max_size=4))
def test_range_writer_compiled_loop_writes_what_the_reference_writes(recs, ragged, max_size, min_size, cuts):
    from graveler.committed.writer import RangeParams

    params = RangeParams(min_range_size=min_size, max_range_size=max_size, raggedness=ragged)
    out = []
    for cls in (committed_writer.MetaRangeWriter, committed_kernel.compiled.MetaRangeWriter):
        store = _Dict()
        w = cls(store.put, params, {"k": "v"})
        bounds = sorted({0, len(recs), *[c for c in cuts if c <= len(recs)]})
        for lo, hi in zip(bounds, bounds[1:]):
            w.write_batch(recs[lo:hi])
        mr = w.close()
        out.append((mr, store.files, [(r.id, r.min_key, r.max_key, r.count, r.estimated_size) for r in w.ranges]))
    assert out[0] == out[1]


@settings(max_examples=40, deadline=None)
@given(recs=st.dictionaries(_keys, _values, max_size=400).map(lambda d: sorted(d.items())),
       ragged=st.sampled_from([3, 50]), max_size=st.sampled_from([2_000, 20 << 20]),
       min_size=st.sampled_from([0, 1_000]), cuts=st.lists(st.integers(0, 400), max_size=4))
def test_range_writer_over_arrow_buffers_writes_what_write_batch_writes(recs, ragged, max_size, min_size, cuts):
    import pyarrow as pa

    from graveler.committed.writer import RangeParams
    from graveler.spark.tables import binary_buffers

    params = RangeParams(min_range_size=min_size, max_range_size=max_size, raggedness=ragged)
    keys = pa.array([b"pad"] + [k for k, _ in recs], pa.binary())  # sliced below: the arrays have an offset
    values = pa.array([b""] + [v for _, v in recs], pa.binary())
    out = []
    for cls in (committed_writer.MetaRangeWriter, committed_kernel.compiled.MetaRangeWriter):
        for buffers in (False, True):
            store = _Dict()
            w = cls(store.put, params, {"k": "v"})
            bounds = sorted({0, len(recs), *[c for c in cuts if c <= len(recs)]})
            for lo, hi in zip(bounds, bounds[1:]):
                if buffers:
                    w.write_buffers(hi - lo, *binary_buffers(keys.slice(1 + lo, hi - lo)),
                                    *binary_buffers(values.slice(1 + lo, hi - lo)))
                else:
                    w.write_batch(recs[lo:hi])
            mr = w.close()
            out.append((mr, store.files, [(r.id, r.min_key, r.max_key, r.count, r.estimated_size) for r in w.ranges]))
    assert out[0] == out[1] == out[2] == out[3]


def test_range_writer_compiled_loop_refuses_unsorted_records():
    from graveler.committed.writer import RangeParams
    from graveler.errors import InvalidArgument

    for cls in (committed_writer.MetaRangeWriter, committed_kernel.compiled.MetaRangeWriter):
        w = cls(_Dict().put, RangeParams())
        w.write_batch([(b"a", b"1"), (b"c", b"2")])
        with pytest.raises(InvalidArgument):
            w.write_batch([(b"b", b"3")])
        with pytest.raises(InvalidArgument):
            w.write_batch([(b"d", b"3"), (b"d", b"4")])
    import pyarrow as pa

    from graveler.spark.tables import binary_buffers

    for cls in (committed_writer.MetaRangeWriter, committed_kernel.compiled.MetaRangeWriter):
        w = cls(_Dict().put, RangeParams())
        w.write_buffers(2, *binary_buffers(pa.array([b"a", b"c"])), *binary_buffers(pa.array([b"1", b"2"])))
        for keys in ([b"b"], [b"d", b"d"]):
            with pytest.raises(InvalidArgument):
                w.write_buffers(len(keys), *binary_buffers(pa.array(keys)), *binary_buffers(pa.array([b"v"] * len(keys))))


# -- mapped tables (issue 8: a large repository does not live in memory) ---------------------------

def test_local_store_and_disk_cache_map_large_tables(tmp_path):
    import mmap

    from graveler.cache import ImmutableCache
    from graveler.committed.reader import StoreSource, TableReader, verify_table
    from graveler.objstore import open_store

    store = open_store(str(tmp_path / "ns"))
    recs = [(b"k/%07d" % i, os.urandom(40)) for i in range(20_000)]
    w = SSTableWriter()
    for k, v in recs:
        w.add(k, v)
    data = w.finish()
    assert len(data) > 64 << 10
    from graveler.committed.reader import computed_table_id

    tid = computed_table_id(SSTable(data, block_cache=BlockCache()))
    store.put(f"_lakefs/{tid}", data)
    store.put("_lakefs/small", b"tiny")
    m = store.get_mapped(f"_lakefs/{tid}", min_size=0)
    assert isinstance(m, mmap.mmap) and m[:] == data
    assert isinstance(store.get_mapped(f"_lakefs/{tid}"), bytes)  # under the mapping threshold: read
    assert store.get_mapped("_lakefs/small", min_size=0)[:] == b"tiny"
    t = SSTable(m, "t1", block_cache=BlockCache())
    assert list(t) == recs and t.get(recs[777][0]) == recs[777][1]

    with ImmutableCache(store, str(tmp_path / "cache"), verify=verify_table) as cache:
        first = cache.get_mapped(f"_lakefs/{tid}")  # a miss: fetched, verified, cached
        assert first == data
        again = cache.get_mapped(f"_lakefs/{tid}")  # a hit on a file-backed entry: mapped
        assert isinstance(again, mmap.mmap) and again[:] == data
        assert cache.stats.snapshot()["fetches"] == 1
        reader = TableReader(cache)
        assert reader.open(tid).get(recs[5][0]) == recs[5][1]
    assert TableReader(StoreSource(store)).open(tid).get(recs[9][0]) == recs[9][1]


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["put", "get", "setdefault", "clear"]), st.integers(0, 6),
                              st.binary(max_size=12)), max_size=60), budget=st.integers(0, 40))
def test_compiled_lru_behaves_as_the_reference(ops, budget):
    from graveler.lru import PyLRU

    py, c = PyLRU(budget, len), _clru.LRU(budget, len)
    for op, k, v in ops:
        if op == "clear":
            py.clear()
            c.clear()
        else:
            assert getattr(c, op)(k, *([v] if op != "get" else [])) == getattr(py, op)(k, *([v] if op != "get" else []))
        assert list(c._d.items()) == list(py._d.items())
        assert (len(c), c.size_bytes, c.hits, c.misses) == (len(py), py.size_bytes, py.hits, py.misses)
        assert list(c.data) == list(py.data)


@pytest.mark.expect_log("a damaged cached copy is dropped and fetched again, with one warning")
def test_a_damaged_mapped_cache_entry_is_fetched_again(tmp_path):
    from graveler.cache import ImmutableCache
    from graveler.committed.reader import verify_table
    from graveler.objstore import open_store

    store = open_store(str(tmp_path / "ns"))
    w = SSTableWriter()
    for i in range(5000):
        w.add(b"k/%06d" % i, os.urandom(30))
    data = w.finish()
    from graveler.committed.reader import computed_table_id

    key = "_lakefs/" + computed_table_id(SSTable(data, block_cache=BlockCache()))
    store.put(key, data)
    with ImmutableCache(store, str(tmp_path / "cache"), verify=verify_table) as cache:
        cache.get_mapped(key)
        vals = list((tmp_path / "cache").rglob("*.val"))
        assert vals
        raw = bytearray(vals[0].read_bytes())
        raw[-30:] = bytes(30)
        vals[0].write_bytes(bytes(raw))
        again = cache.get_mapped(key)
        assert bytes(again) == data and cache.stats.snapshot()["verify_failures"] == 1


# -- the compiled table writer and apply kernel ----------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(recs=_records, compression=st.booleans(), block_size=st.sampled_from([64, 512, 4096]),
       props=st.dictionaries(st.sampled_from(["type", "min_key", "a", "zz"]), st.binary(max_size=20), max_size=3))
def test_table_builder_writes_what_the_reference_writes(recs, compression, block_size, props):
    """graveler.sstable._ctable.TableBuilder: the reference SSTableWriter's bytes and TableHasher's ID."""
    from graveler.sstable import _ctable

    ref = PySSTableWriter(compression=compression, block_size=block_size)
    h = ident.TableHasher()
    tb = _ctable.TableBuilder(compression=compression, block_size=block_size, hashed=True)
    for k, v in recs:
        ref.add(k, v)
        h.add(k, v)
        tb.add(k, v)
        assert tb.estimated_size() == ref.estimated_size()
    assert (tb.first_key, tb.last_key, tb.num_entries) == (ref.first_key, ref.last_key, ref.num_entries)
    str_props = {k: v.decode("latin-1") for k, v in props.items()}
    assert tb.digest(ident.enc_string_map(str_props)) == h.finish(str_props)
    assert tb.finish(props) == ref.finish(props)


def test_table_builder_refuses_unsorted_keys():
    from graveler.errors import InvalidArgument
    from graveler.sstable import _ctable

    tb = _ctable.TableBuilder()
    tb.add(b"b", b"1")
    for bad in (b"a", b"b"):
        with pytest.raises(InvalidArgument):
            tb.add(bad, b"2")
    with pytest.raises(InvalidArgument):
        tb.add_records([(b"c", b""), (b"c", b"")], 0, 0, 1 << 30, 0)


def test_sha256_state_saves_and_resumes():
    import hashlib

    data = bytes(range(256)) * 1000
    for cut in (0, 1, 63, 64, 65, 5000, len(data)):
        h = _csha256.Sha256()
        h.update(data[:cut])
        resumed = _csha256.Sha256(h.state())
        resumed.update(data[cut:])
        assert resumed.hexdigest() == hashlib.sha256(data).hexdigest()
        assert h.hexdigest(data[cut:]) == hashlib.sha256(data).hexdigest()  # hexdigest leaves h as it was
        assert h.copy().hexdigest() == hashlib.sha256(data[:cut]).hexdigest()
    with pytest.raises(ValueError):
        _csha256.Sha256(b"short")
    assert len(_csha256.Sha256().state()) == _csha256.SHA256_STATE_BYTES


_tree_keys = st.lists(st.integers(0, 1999), unique=True, max_size=40)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dels=_tree_keys, upds=_tree_keys, adds=_tree_keys, same=_tree_keys,
       ragged=st.sampled_from([40, 700, 10**9]), max_size=st.sampled_from([30_000, 20 << 20]),
       big=st.sampled_from([0, 1, 3]))
def test_apply_kernel_writes_what_the_reference_writes(tmp_path_factory, dels, upds, adds, same, ragged, max_size, big):
    """The compiled per-range apply against the pure-Python one: the same metarange ID and the same files,
    for deletions, updates, additions, and changes that keep a record's identity."""
    from graveler.committed.manager import CommittedManager, StoreSource
    from graveler.committed.writer import RangeParams
    from graveler.objstore import open_store

    def val(i, v):
        return Value(bytes([v]) * 32, b"data-%d-%d" % (i, v) + b"x" * (big * (i % 700)))

    base = [(b"tree/%05d" % i, val(i, 0)) for i in range(0, 4000, 2)]
    changes = {}
    for i in dels:
        changes[base[i][0]] = None
    for i in upds:
        changes[base[i][0]] = val(i, 1)
    for i in same:
        changes[base[i][0]] = Value(base[i][1].identity, b"other data, same identity")
    for i in adds:
        changes[b"tree/%05d" % (2 * i + 1)] = val(i, 2)
    params = RangeParams(raggedness=ragged, max_range_size=max_size)
    results = []
    for compiled in (False, True):
        root = tmp_path_factory.mktemp("kernel")
        store = open_store(str(root))
        m = CommittedManager(StoreSource(store), params)
        mr = m.write_metarange(base)
        if not compiled:
            m.writer_class = committed_writer.MetaRangeWriter  # the reference apply step
        new, stats = m.apply(mr, sorted(changes.items()))
        files = {k: store.get(k) for k in (i.key for i in store.list("_lakefs/"))}
        results.append((new, (stats.added, stats.removed, stats.changed), files))
    assert results[0] == results[1]


def _one_range_tree(tmp_path, name, compiled=True):
    from graveler.committed.manager import CommittedManager, StoreSource
    from graveler.committed.writer import RangeParams
    from graveler.objstore import open_store

    store = open_store(str(tmp_path / name))
    m = CommittedManager(StoreSource(store), RangeParams(raggedness=10**9))
    if not compiled:
        m.writer_class = committed_writer.MetaRangeWriter
    base = [(b"k/%06d" % i, Value(bytes([i % 251]) * 32, b"v" * (40 + i % 90))) for i in range(20_000)]
    return store, m, m.write_metarange(base), base


def test_apply_resumes_from_a_checkpoint_and_writes_what_the_reference_writes(tmp_path):
    """A change far into a range: the blocks before the last checkpoint before it are copied, not re-read
    and re-hashed, and the result is byte for byte the reference's (and a from-scratch write's)."""
    runs = {}
    for compiled in (True, False):
        store, m, mr, base = _one_range_tree(tmp_path, f"t{compiled}", compiled)
        (info,) = m.list_ranges(mr)
        for at in (17_000, 5, 19_999):
            changes = [(base[at][0], Value(b"\x07" * 32, b"new")), (base[at][0] + b"+", Value(b"\x08" * 32, b"add"))]
            new, stats = m.apply(mr, changes)
            files = {i.key: store.get(i.key) for i in store.list("_lakefs/")}
            runs.setdefault(compiled, []).append((new, files, (stats.added, stats.changed)))
            if compiled:
                assert (stats.blocks_resumed > 0) == (at != 5), (at, stats)
                assert stats.blocks_carried > 0
    assert runs[True] == runs[False]
    # the resumed range equals its records written from scratch
    from graveler.committed.writer import RANGES_TYPE, TableWriter

    store, m, mr, base = _one_range_tree(tmp_path, "again")
    new, stats = m.apply(mr, [(base[15_000][0], None)])
    assert stats.blocks_resumed > 0
    (info,) = m.list_ranges(new)
    tw = TableWriter(RANGES_TYPE, builder=sstable_kernel.reference.TableBuilder)
    for k, raw in m.iter_range_raw(info):
        tw.add(k, raw)
    rid, data, rinfo = tw.finish()
    assert rid == info.id and rinfo == info and data == store.get("_lakefs/" + info.id)


_SPREAD_BASE = [(b"k/%06d" % i, Value(bytes([i % 251]) * 32, b"v" * (40 + i % 90))) for i in range(20_000)]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.tuples(st.integers(0, 19_999), st.sampled_from(["del", "upd", "same", "add"])),
                      min_size=1, max_size=10),
       max_size=st.sampled_from([20 << 20, 500_000]))
@example(picks=[(68, "del"), (426, "del")], max_size=20 << 20)  # no runs at all: every later block shifted
def test_runs_of_carried_blocks_write_what_the_reference_writes(tmp_path_factory, picks, max_size):
    """Changes spread over a range of 20,000 records: whatever the compiled apply carries over (blocks
    alone or in runs, resumed from checkpoints), every file is byte for byte what the reference apply
    writes, also when a size-based break falls among them; so is a second apply on the result."""
    _apply_both_ways(tmp_path_factory, picks, max_size)


def test_unchanged_blocks_after_a_change_go_over_in_compiled_runs(tmp_path_factory):
    """A change in the middle of a range: the blocks after it, once the layout realigns, go over in runs
    (no Python object per record), and the files are still the reference's. (Not every change has runs:
    a size change early in the range can shift every later block, which then is rewritten; the property
    test above covers those.)"""
    assert _apply_both_ways(tmp_path_factory, [(5000, "del"), (11000, "upd")], 20 << 20) > 0


def _apply_both_ways(tmp_path_factory, picks, max_size) -> int:
    """Applies ``picks`` (then a second spread of changes) compiled and with the reference writer; asserts
    the same IDs, counts and files; returns how many blocks the compiled applies carried in runs."""
    from graveler.committed.manager import CommittedManager, StoreSource
    from graveler.committed.writer import RangeParams
    from graveler.objstore import open_store

    first, second = {}, {}
    for i, op in picks:
        k = _SPREAD_BASE[i][0]
        if op == "del":
            first[k] = None
        elif op == "upd":
            first[k] = Value(b"\x07" * 32, b"new")
        elif op == "same":
            first[k] = Value(_SPREAD_BASE[i][1].identity, b"same identity")
        else:
            first[k + b"+"] = Value(b"\x08" * 32, b"added")
        second[_SPREAD_BASE[(i * 7919) % 20_000][0]] = Value(b"\x09" * 32, b"again")
    params = RangeParams(raggedness=10**9, max_range_size=max_size)
    results, runs = [], 0
    for compiled in (True, False):
        store = open_store(str(tmp_path_factory.mktemp("runs")))
        m = CommittedManager(StoreSource(store), params)
        if not compiled:
            m.writer_class = committed_writer.MetaRangeWriter
        mr = m.write_metarange(_SPREAD_BASE)
        one, stats1 = m.apply(mr, sorted(first.items()))
        two, stats2 = m.apply(one, sorted(second.items()))
        if compiled:
            runs = stats1.blocks_in_runs + stats2.blocks_in_runs
        files = {i.key: store.get(i.key) for i in store.list("_lakefs/")}
        results.append((one, two, (stats1.added, stats1.removed, stats1.changed), files))
    assert results[0] == results[1]
    return runs


@pytest.mark.skipif(sstable_kernel.compiled is None, reason="the compiled layer is not built")
def test_a_malformed_block_with_a_good_checksum_is_refused(tmp_path):
    """A range stored uncompressed (its ID is its records', so it is accepted under the range's name), then
    one data block made malformed (an entry overrunning it) with its CRC recomputed: the ID check refuses
    the table (CorruptedData) and no record of it is served."""
    import functools

    from graveler.committed.manager import CommittedManager, StoreSource
    from graveler.committed.writer import RANGES_TYPE, RangeParams, TableWriter, table_key
    from graveler.objstore import open_store
    from graveler.sstable.format import mask_crc

    params = RangeParams(raggedness=10**9)
    store = open_store(str(tmp_path / "ns"))
    m = CommittedManager(StoreSource(store), params)
    mr = m.write_metarange(_SPREAD_BASE[:2000])
    (info,) = m.list_ranges(mr)
    tw = TableWriter(RANGES_TYPE, builder=functools.partial(sstable_kernel.compiled.TableBuilder, False))
    for k, raw in m.iter_range_raw(info):
        tw.add(k, raw)
    rid, data, _ = tw.finish()
    assert rid == info.id
    store.put(table_key(info.id), bytes(data))
    assert CommittedManager(StoreSource(store), params).get(mr, info.max_key) is not None  # healthy: accepted
    data = bytearray(data)
    h = SSTable(bytes(data)).data_block_handles()[3]
    assert data[h.offset + h.size] == 0 and data[h.offset] == 0  # uncompressed; the first entry shares nothing
    data[h.offset + 2:h.offset + 4] = b"\xff\x7f"  # its value length (a 2-byte varint here): 16,383 bytes
    crc = mask_crc(google_crc32c.extend(google_crc32c.value(bytes(data[h.offset:h.offset + h.size])), b"\0"))
    data[h.offset + h.size + 1:h.offset + h.size + 5] = crc.to_bytes(4, "little")
    store.put(table_key(info.id), bytes(data))
    with pytest.raises(CorruptedData, match="malformed block"):
        CommittedManager(StoreSource(store), params).get(mr, info.max_key)
    with pytest.raises(CorruptedData, match="malformed block"):
        SSTable(bytes(data)).records_digest()


def test_checkpoints_that_do_not_fit_are_not_used(tmp_path):
    """Damaged, foreign (other parameters, another file size) or misplaced checkpoints: a rewrite from the
    first block, never a wrong ID."""
    from graveler.committed import checkpoints
    from graveler.committed.writer import RangeParams

    fmt = sstable_kernel.compiled
    store, m, mr, base = _one_range_tree(tmp_path, "t")
    (info,) = m.list_ranges(mr)
    blob = m.reader.memo.get_facts(info.id)
    size = len(store.get("_lakefs/" + info.id))
    params = RangeParams(raggedness=10**9)
    assert checkpoints.unpack(fmt, blob, params, size) is not None
    assert checkpoints.unpack(fmt, blob[:-1] + bytes([blob[-1] ^ 1]), params, size) is None
    assert checkpoints.unpack(fmt, blob[:100] + bytes([blob[100] ^ 1]) + blob[101:], params, size) is None
    assert checkpoints.unpack(fmt, blob, RangeParams(), size) is None
    assert checkpoints.unpack(fmt, blob, params, size + 1) is None
    assert checkpoints.unpack(fmt, b"", params, size) is None
    change = [(base[17_000][0], Value(b"\x07" * 32, b"new"))]
    want, _ = m.apply(mr, change)
    # checkpoints recorded for a file laid out otherwise (the CRC bytes they name differ): not used
    cps, raw = checkpoints.unpack(fmt, blob, params, size)
    bad = [cp[:5] + (cp[5] ^ 1,) + cp[6:] for cp in cps]
    m.reader.memo.put_facts(info.id, checkpoints.pack(fmt, params, size, b"".join(
        fmt.CHECKPOINT_HEAD.pack(*cp[:6]) + cp[6] for cp in bad)))
    got, stats = m.apply(mr, change)
    assert got == want and stats.blocks_resumed == 0


def test_each_layer_chooses_once_and_committed_knows_no_table_bytes():
    """The compiled/reference choice is made in one module per layer, and committed/ reaches table bytes
    only through the sstable layer's kernel API (``_crange.pxd``), never its block internals."""
    import re

    root = REPO / "graveler"
    choosers = sorted(str(p.relative_to(REPO)) for p in root.rglob("*.py") if "PURE_PYTHON" in p.read_text())
    assert choosers == ["graveler/committed/kernel.py", "graveler/lru.py", "graveler/model.py",
                        "graveler/native.py", "graveler/sstable/kernel.py"]
    for p in (root / "committed").glob("*.py*"):
        text = p.read_text()
        assert not re.search(r"sstable\._cblock|\._core\b|_compiled\b", text), p
        for m in re.finditer(r"from graveler\.sstable\.(\w+) cimport", text):
            assert m.group(1) in ("_crange", "_ctable"), (p, m.group(0))
    assert "graveler.model" not in (root / "sstable" / "reader.py").read_text()
