"""Checks that refuse data, held to healthy data made by ordinary use.

A check that calls a healthy repository damaged is as bad as one that serves damaged bytes. Two families:

* the table-ID check (a range or metarange file must hash to the ID in its name, once per file version,
  remembered in ``<home>/table-memo``): tables written by lakeFS, by many commits at scale (ranges over
  20 MiB, rewrites resumed from checkpoints, blocks carried verbatim), by the import and Spark writers,
  empty trees, large user metadata, the S3 disk tier, files touched / chmod'ed / copied by a backup tool,
  a memo another version or home wrote, checkpoints recorded for another version of a file;
* the cache checks (``ImmutableCache`` verifies fills and hits, the mount's ``DataCache`` checks each
  chunk's CRC): processes filling one key at once, eviction racing readers, a process killed mid-fill,
  empty objects, objects at and around chunk boundaries, objects larger than the cache.

Each test builds the healthy data through graveler's API and asserts it is accepted; where cheap, the
damaged variant is still refused.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import diskcache
import pytest

from graveler import cache as gcache
from graveler.committed import checkpoints
from graveler.committed import manager as cmanager
from graveler.committed.kernel import fnv1a64
from graveler.committed.reader import computed_table_id, verify_table
from graveler.committed.writer import METARANGES_TYPE, RANGES_TYPE, TableWriter
from graveler.config import CacheConfig, GravelerConfig, RangeParams
from graveler.errors import CorruptedData
from graveler.home import Graveler
from graveler.model import Entry
from graveler.objstore import LocalStore, open_store
from graveler.objstore.chunked import DataCache
from graveler.sstable.reader import BlockCache, SSTable
from graveler.sstable import kernel as sstable_kernel
from graveler.sstable.writer import SSTableWriter
from tests.graveler_testutil import FAST_KV, entry, make_graveler
from tests.shared_paths import LAKEFS_FIXTURES

KiB = 1 << 10
MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]  # the checkout: subprocesses import graveler from here


# -- helpers ----------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _own_memos(monkeypatch):
    """The memos of this test's homes live and die with it, not in the process-wide registry."""
    monkeypatch.setattr(gcache, "_memos", {})


def _count_table_hashes(monkeypatch) -> list[str]:
    """Every table-ID check from now on (the name of the file hashed)."""
    from graveler.committed import reader

    calls: list[str] = []
    real = reader.computed_table_id
    monkeypatch.setattr(reader, "computed_table_id", lambda t: calls.append(t.name) or real(t))
    return calls


def _new_process_view(monkeypatch) -> None:
    """What a new process of the home starts with: no table memo in memory (the one on disk stays)."""
    monkeypatch.setattr(gcache, "_memos", {})


def _another_home_view(monkeypatch, home: Path) -> None:
    """A home that has never seen the namespace (another machine, a restored backup): nothing remembered."""
    shutil.rmtree(home / "table-memo", ignore_errors=True)
    _new_process_view(monkeypatch)


def _apply_stats(monkeypatch) -> list:
    """The ApplyStats of every apply (commit, merge) from now on."""
    seen: list = []
    real = cmanager.CommittedManager.apply

    def apply(self, *a, **kw):
        out = real(self, *a, **kw)
        seen.append(out[1])
        return out

    monkeypatch.setattr(cmanager.CommittedManager, "apply", apply)
    return seen


def _tables(ns: Path) -> set[str]:
    return {f"_lakefs/{p.name}" for p in (ns / "_lakefs").iterdir()}


def _read_every_commit(repo) -> int:
    """List every commit's whole tree (opens every range of every metarange); returns the records seen."""
    n = 0
    for c in repo.log(repo.default_branch, first_parent=False):
        for _ in repo.iter_committed(c.id):
            n += 1
    return n


_PURE_AUDIT = r"""
import os, sys
from graveler import native
from graveler.committed.reader import verify_table
assert native.PURE_PYTHON
d = sys.argv[1]
names = sorted(os.listdir(d))
for name in names:
    with open(os.path.join(d, name), "rb") as f:
        verify_table("_lakefs/" + name, f.read())
print(len(names))
"""


def _pure_python_audit(ns: Path) -> int:
    """Every table file of a local namespace checked against its name by the pure-Python reference (an
    independent implementation of the hash); returns how many."""
    env = dict(os.environ, LAKEFUSE_PURE_PYTHON="1")
    res = subprocess.run([sys.executable, "-c", _PURE_AUDIT, str(ns / "_lakefs")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def _key(i: int) -> str:
    return f"d/{i:06d}"


def _bulk_entries(n: int, meta_bytes: int, seed: int = 1) -> list[tuple[str, Entry]]:
    """``n`` entries (as an upload of many objects stages them) whose user metadata makes each record
    about ``meta_bytes`` of incompressible text. Keys at a lakeFS hash break are left out, so one range
    grows to the 20 MiB size guard (as a run of big records does in real use)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        k = _key(i)
        if fnv1a64(k.encode()) % RangeParams().raggedness == 0:
            continue
        md = {"blob": rnd.randbytes(meta_bytes // 2).hex(), "owner": f"user{i % 7}"}
        out.append((k, Entry(f"data/x/{i}", i, f"{i:032x}", 1_700_000_000_000_000_000 + i, md)))
    return out


def _replace_keeping_content(path: Path, how: str) -> None:
    """What a backup tool, an rsync or an admin does to a file without changing its bytes."""
    st = path.stat()
    if how == "chmod":
        os.chmod(path, 0o444)
        os.chmod(path, st.st_mode & 0o777)
    elif how == "touch-same-mtime":
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime as it was; the ctime moves
    elif how == "copy-back":  # cp -p elsewhere and back (a restore): new inode, same mtime
        tmp = path.with_name(path.name + ".restore")
        shutil.copy2(path, tmp)
        os.replace(tmp, path)
    elif how == "hardlink":  # a snapshot tool linking the file into a backup tree: the link count (ctime) moves
        os.link(path, path.with_name(path.name + ".snap"))
        os.unlink(path.with_name(path.name + ".snap"))
    else:
        raise AssertionError(how)


# == 1. the table-ID check ================================================================================


def _lakefs_ids() -> tuple[str, str, str]:
    rng = computed_table_id(SSTable((LAKEFS_FIXTURES / "range.sst").read_bytes(), "range.sst"))
    mr = computed_table_id(SSTable((LAKEFS_FIXTURES / "metarange.sst").read_bytes(), "metarange.sst"))
    ok1 = computed_table_id(SSTable((LAKEFS_FIXTURES / "ok1.sst").read_bytes(), "ok1.sst"))
    return rng, mr, ok1


needs_fixtures = pytest.mark.skipif(not (LAKEFS_FIXTURES / "range.sst").exists(),
                                    reason="the lakeFS fixtures are not beside the checkout")


@needs_fixtures
def test_lakefs_written_tables_pass_the_id_check(tmp_path, monkeypatch):
    """Files lakeFS wrote (Pebble) hash to the IDs lakeFS gave them: the real metarange names its range by
    exactly the ID we compute, and a home that adopts them reads them after checking each once."""
    rng, mr, ok1 = _lakefs_ids()
    mr_table = SSTable((LAKEFS_FIXTURES / "metarange.sst").read_bytes(), "metarange.sst")
    from graveler.model import RangeInfo, decode_value

    assert [RangeInfo.from_value(decode_value(v, "m"), "m").id for _, v in mr_table] == [rng]  # lakeFS's ID
    for name, tid in (("range.sst", rng), ("metarange.sst", mr), ("ok1.sst", ok1)):
        verify_table(f"_lakefs/{tid}", (LAKEFS_FIXTURES / name).read_bytes())

    g = make_graveler(tmp_path)
    ns = tmp_path / "lakefs-ns"
    repo = g.create_repository("lake", f"file://{ns}")
    (ns / "_lakefs").mkdir(parents=True, exist_ok=True)
    shutil.copy(LAKEFS_FIXTURES / "range.sst", ns / "_lakefs" / rng)
    shutil.copy(LAKEFS_FIXTURES / "metarange.sst", ns / "_lakefs" / mr)
    repo.commit_metarange("main", mr, "adopt lakeFS's tree")
    g.close()

    _another_home_view(monkeypatch, tmp_path / "home")
    calls = _count_table_hashes(monkeypatch)
    g = make_graveler(tmp_path)
    assert [i.path for i in g.repository("lake").list("main", delimiter="")] == [b"a/b/c/no", b"a/b/c/yes"]
    assert sorted(calls) == sorted([f"_lakefs/{rng}", f"_lakefs/{mr}"])  # checked, and passed
    g.close()

    # the damaged variant: lakeFS's other range copied over this one is still refused
    shutil.copy(LAKEFS_FIXTURES / "ok1.sst", ns / "_lakefs" / rng)
    _new_process_view(monkeypatch)
    g = make_graveler(tmp_path)
    with pytest.raises(CorruptedData, match="wrong name"):
        list(g.repository("lake").list("main", delimiter=""))
    g.close()


@needs_fixtures
@pytest.mark.s3
def test_lakefs_written_tables_pass_through_the_s3_disk_tier(tmp_path, monkeypatch, s3_bucket, s3_config):
    """The same files in an S3 namespace: verified on fill, on hits the memo does not know, and on hits
    after the memo is gone; never counted as damaged."""
    rng, mr, _ = _lakefs_ids()
    st = open_store(f"s3://{s3_bucket}/ns", s3_config)
    st.put(f"_lakefs/{rng}", (LAKEFS_FIXTURES / "range.sst").read_bytes())
    st.put(f"_lakefs/{mr}", (LAKEFS_FIXTURES / "metarange.sst").read_bytes())
    cfg = GravelerConfig(home=tmp_path / "home", kv=FAST_KV, store=s3_config)
    g = Graveler(cfg)
    g.create_repository("lake", f"s3://{s3_bucket}/ns").commit_metarange("main", mr, "adopt")
    g.close()
    shutil.rmtree(tmp_path / "home" / "cache")
    for phase in ("cold cache", "warm cache", "warm cache, memo gone"):
        if phase.endswith("memo gone"):
            shutil.rmtree(tmp_path / "home" / "table-memo", ignore_errors=True)  # (small tables: never in it)
        _new_process_view(monkeypatch)
        g = Graveler(cfg)
        repo = g.repository("lake")
        assert [i.path for i in repo.list("main", delimiter="")] == [b"a/b/c/no", b"a/b/c/yes"], phase
        disk = repo.cache_stats()["table_disk_cache"]
        assert disk["verify_failures"] == 0, (phase, disk)
        assert (disk["hits"] > 0) == (phase != "cold cache"), (phase, disk)
        g.close()
    st.close()


def test_many_commits_at_scale_every_table_hashes_to_its_name(tmp_path, monkeypatch):
    """A big upload (one range over 20 MiB, several checkpoint intervals) and many commits that rewrite
    it from checkpoints and carry blocks verbatim, a branch and a merge: in a home that has never seen the
    namespace every table is checked when first opened and passes, and the pure-Python reference agrees
    about every file. (The writer remembers its own files unchecked: a wrong ID would surface only later,
    in another home or after a backup touched the files -- as a healthy repository refused.)"""
    stats = _apply_stats(monkeypatch)
    g = make_graveler(tmp_path)
    ns = tmp_path / "ns"
    repo = g.create_repository("big", f"file://{ns}")
    items = _bulk_entries(14_000, 2 * KiB)
    n = len(items)
    repo.stage_many("main", items)
    repo.commit("main", "big upload")
    for step, i in enumerate([n // 3, n // 2, 5, n - 3, (2 * n) // 3, n // 2 + 1]):
        repo.stage("main", _key(i), entry(f"edit{step}"))
        repo.commit("main", f"edit {step}")
    repo.create_branch("dev", "main")
    repo.stage("dev", _key(n // 4), entry("dev"))
    repo.delete("dev", _key(n // 5))
    repo.commit("dev", "on dev")
    repo.stage("main", _key(n - 10), entry("main"))
    repo.commit("main", "on main")
    repo.merge("dev", "main")
    sizes = [p.stat().st_size for p in (ns / "_lakefs").iterdir()]
    assert max(sizes) > 20 * MiB, sizes
    assert sum(s.blocks_resumed for s in stats) > 64 and sum(s.blocks_carried for s in stats) > 0, stats
    g.close()

    _another_home_view(monkeypatch, tmp_path / "home")
    calls = _count_table_hashes(monkeypatch)
    g = make_graveler(tmp_path)
    assert _read_every_commit(g.repository("big")) > 9 * n
    assert sorted(calls) == sorted(_tables(ns))  # every table file checked once, none refused
    g.close()
    assert _pure_python_audit(ns) == len(sizes)


def test_large_user_metadata_entries_pass(tmp_path, monkeypatch):
    """Entries whose user metadata is far larger than a 4 KiB block (one record per block, a block of
    MiBs): uploaded, committed, changed, and read in a home that never saw them."""
    g = make_graveler(tmp_path)
    ns = tmp_path / "ns"
    repo = g.create_repository("meta", f"file://{ns}")
    rnd = random.Random(3)
    for i, size in enumerate([100, 5 * KiB, 200 * KiB, 3 * MiB]):
        repo.upload("main", f"m/{i}", f"object {i}".encode(),
                    metadata={"notes": rnd.randbytes(size // 2).hex(), "k": "v" * (size // 3)})
    repo.commit("main", "big metadata")
    repo.upload("main", "m/2", b"changed", metadata={"notes": "x" * (1 * MiB)})
    repo.commit("main", "changed")
    g.close()
    _another_home_view(monkeypatch, tmp_path / "home")
    calls = _count_table_hashes(monkeypatch)
    g = make_graveler(tmp_path)
    repo = g.repository("meta")
    assert repo.read("main", "m/3") == b"object 3" and repo.read("main", "m/2") == b"changed"
    assert len(repo.get("main", "m/3").metadata["notes"]) == 3 * MiB
    _read_every_commit(repo)
    assert sorted(calls) == sorted(_tables(ns))
    g.close()
    assert _pure_python_audit(ns) == len(_tables(ns))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure"])
def test_empty_tables_pass(tmp_path, monkeypatch, compiled):
    """The empty tree: the initial commit's metarange "" (no file), the file an all-deleting commit writes
    (a metarange with no ranges), and an empty range (no writer of ours makes one, another might)."""
    if compiled and sstable_kernel.compiled is None:
        pytest.skip("the compiled modules are not loaded (LAKEFUSE_PURE_PYTHON=1)")
    builder = (sstable_kernel.compiled if compiled else sstable_kernel.reference).TableBuilder
    for kind in (RANGES_TYPE, METARANGES_TYPE):
        tid, data, _ = TableWriter(kind, {}, builder).finish()
        verify_table(f"_lakefs/{tid}", data)
        with pytest.raises(CorruptedData):  # the damaged variant: another type's empty table under its name
            other = METARANGES_TYPE if kind == RANGES_TYPE else RANGES_TYPE
            verify_table(f"_lakefs/{TableWriter(other, {}, builder).finish()[0]}", data)
    if not compiled:
        return
    g = make_graveler(tmp_path)
    ns = tmp_path / "ns"
    repo = g.create_repository("empty", f"file://{ns}")
    assert repo.get_commit("main").meta_range_id == ""
    repo.stage("main", "a", entry("a"))
    repo.commit("main", "one")
    repo.delete("main", "a")
    c = repo.commit("main", "all deleted")
    assert c.meta_range_id and (ns / "_lakefs" / c.meta_range_id).exists()
    g.close()
    _another_home_view(monkeypatch, tmp_path / "home")
    calls = _count_table_hashes(monkeypatch)
    g = make_graveler(tmp_path)
    repo = g.repository("empty")
    for ref, want in (("main", []), ("main~1", [b"a"]), ("main~2", [])):
        assert [i.path for i in repo.list(ref, delimiter="")] == want, ref
    assert f"_lakefs/{c.meta_range_id}" in calls
    g.close()


@pytest.mark.s3
def test_empty_and_small_tables_through_the_s3_disk_tier(tmp_path, monkeypatch, s3_bucket, s3_config):
    """Tables small enough to live in the disk tier's database (no file, so no fingerprint: checked on
    every open) and the empty metarange: every open passes."""
    cfg = GravelerConfig(home=tmp_path / "home", kv=FAST_KV, store=s3_config)
    g = Graveler(cfg)
    repo = g.create_repository("small", f"s3://{s3_bucket}/ns")
    repo.upload("main", "a", b"a")
    repo.commit("main", "one")
    repo.delete("main", "a")
    repo.commit("main", "all deleted")
    g.close()
    for _ in range(2):
        _new_process_view(monkeypatch)
        g = Graveler(cfg)
        repo = g.repository("small")
        assert list(repo.list("main", delimiter="")) == []
        assert repo.read("main~1", "a") == b"a"
        assert repo.cache_stats()["table_disk_cache"]["verify_failures"] == 0
        g.close()


@pytest.mark.parametrize("how", ["chmod", "touch-same-mtime", "copy-back", "hardlink"])
def test_backup_tool_touching_table_files_means_checked_again_and_passing(tmp_path, monkeypatch, how):
    """Same bytes, new ctime (or inode): the memo no longer vouches for the file, so it is hashed again,
    and it passes."""
    g = make_graveler(tmp_path)
    ns = tmp_path / "ns"
    repo = g.create_repository("bak", f"file://{ns}")
    repo.stage_many("main", _bulk_entries(3000, 2 * KiB))  # a range over the 4 MiB mapping threshold
    repo.commit("main", "upload")
    g.close()
    tables = sorted(_tables(ns))
    calls = _count_table_hashes(monkeypatch)
    _new_process_view(monkeypatch)
    g = make_graveler(tmp_path)
    _read_every_commit(g.repository("bak"))
    g.close()
    assert calls == []  # written here: remembered
    for t in tables:
        _replace_keeping_content(ns / t, how)
    _new_process_view(monkeypatch)
    g = make_graveler(tmp_path)
    _read_every_commit(g.repository("bak"))
    assert sorted(calls) == tables  # each checked again, once, and passed
    g.close()


@pytest.mark.s3
@pytest.mark.expect_log("a damaged cached copy is dropped and fetched again, with one warning")
def test_backup_tool_touching_the_s3_disk_tier_means_verified_again_and_passing(tmp_path, monkeypatch,
                                                                                 s3_bucket, s3_config):
    cfg = GravelerConfig(home=tmp_path / "home", kv=FAST_KV, store=s3_config)
    g = Graveler(cfg)
    repo = g.create_repository("bak", f"s3://{s3_bucket}/ns")
    repo.stage_many("main", _bulk_entries(300, 2 * KiB))  # ~600 KiB: a cached file, not a database row
    repo.commit("main", "upload")
    g.close()
    cache_files = [p for p in (tmp_path / "home" / "cache").rglob("*.val")]
    assert cache_files
    for how in ("chmod", "copy-back"):
        for p in cache_files:
            _replace_keeping_content(p, how)
        calls = _count_table_hashes(monkeypatch)
        _new_process_view(monkeypatch)
        g = Graveler(cfg)
        repo = g.repository("bak")
        assert len(list(repo.list("main", delimiter=""))) == 300
        disk = repo.cache_stats()["table_disk_cache"]
        assert disk["verify_failures"] == 0 and disk["misses"] == 0, disk  # served from disk, after a check
        assert calls, how
        g.close()
    # the damaged variant: a flipped byte in a cached file is caught, evicted and fetched again
    p = max(cache_files, key=lambda p: p.stat().st_size)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    monkeypatch.setattr(gcache, "_memos", {})
    g = Graveler(cfg)
    repo = g.repository("bak")
    assert len(list(repo.list("main", delimiter=""))) == 300
    assert repo.cache_stats()["table_disk_cache"]["verify_failures"] == 1
    g.close()


def test_import_written_tables_pass(tmp_path, monkeypatch):
    """The import path's single-process writer (FULL addresses, tables put if absent, no memo entry):
    read in the home afterwards, every table checked and passing."""
    from graveler.spark.importer import encode_listing, import_records_local

    g = make_graveler(tmp_path, range_params=RangeParams(max_range_size=64 * KiB, raggedness=97))
    ns = tmp_path / "ns"
    repo = g.create_repository("imp", f"file://{ns}")
    repo.upload("main", "kept/x", b"x")
    repo.commit("main", "before")
    keys = [f"k{i:05d}/part.parquet" for i in range(4000)]
    recs = encode_listing("in/", keys, [f"s3://bucket/src/{k}" for k in keys], list(range(4000)),
                          [f"{i:032x}" for i in range(4000)], [1_700_000_000_000_000 + i for i in range(4000)])
    res = import_records_local(repo, "main", recs, "in/", source="s3://bucket/src/")
    assert res.commit_id
    g.close()
    _another_home_view(monkeypatch, tmp_path / "home")
    calls = _count_table_hashes(monkeypatch)
    g = make_graveler(tmp_path, range_params=RangeParams(max_range_size=64 * KiB, raggedness=97))
    assert _read_every_commit(g.repository("imp")) == 4001 + 1
    assert sorted(calls) == sorted(_tables(ns)) and len(calls) > 10
    g.close()


@pytest.mark.slow
def test_spark_written_tables_pass(spark, tmp_path, monkeypatch):
    """Ranges written by Spark tasks (three parts, user metadata in their properties) and the driver's
    metarange, adopted as a commit: every table checked in the home and passing."""
    from graveler.spark.importer import encode_listing
    from graveler.spark.tables import RECORD_SCHEMA, Namespace, write_metarange

    params = RangeParams(max_range_size=16 * KiB, raggedness=61)
    g = make_graveler(tmp_path, range_params=params)
    ns = tmp_path / "ns"
    repo = g.create_repository("spk", f"file://{ns}")
    keys = [f"p{i % 13}/f{i:05d}" for i in range(3000)]
    recs = encode_listing("", keys, [f"s3://b/{k}" for k in keys], [i for i in range(3000)],
                          [f"{i:032x}" for i in range(3000)], [1_700_000_000_000_000] * 3000)
    df = spark.createDataFrame(recs, RECORD_SCHEMA).repartition(3)
    res = write_metarange(df, Namespace(f"file://{ns}"), params, partitions=3, metadata={"writer": "spark"})
    assert res.parts == 3 and res.ranges > 10
    repo.commit_metarange("main", res.metarange_id, "from spark")
    g.close()
    _another_home_view(monkeypatch, tmp_path / "home")
    calls = _count_table_hashes(monkeypatch)
    g = make_graveler(tmp_path, range_params=params)
    assert _read_every_commit(g.repository("spk")) == 3000
    assert sorted(calls) == sorted(_tables(ns))
    g.close()


# -- the memo: another version's, another home's ------------------------------------------------------------


def _foreign_memo_values():
    """Values another lakefuse version might keep under a memo key: not this version's fingerprint."""
    mod = types.ModuleType("lakefuse_future_memo")

    class Fingerprint(tuple):
        pass

    Fingerprint.__module__ = mod.__name__
    Fingerprint.__qualname__ = "Fingerprint"
    mod.Fingerprint = Fingerprint
    return mod, {"an int": 7, "a dict": {"dev": 1}, "a 4-tuple": (1, 2, 3, 4), "a string": "checked",
                 "an unknown class": Fingerprint((1, 2, 3, 4, 5))}


@pytest.mark.parametrize("what", ["an int", "a dict", "a 4-tuple", "a string", "an unknown class"])
def test_memo_written_by_another_version_never_fails_a_read(tmp_path, monkeypatch, caplog, what):
    """A home used by two lakefuse versions (a mount of one, a CLI of another): an entry this version
    cannot read -- an unexpected value, a class it does not have -- means "not known as checked", never a
    failed read. (It failed every read of the repository: TypeError / ModuleNotFoundError.)"""
    g = make_graveler(tmp_path)
    ns = tmp_path / "ns"
    repo = g.create_repository("memo", f"file://{ns}")
    repo.stage_many("main", _bulk_entries(3000, 2 * KiB))
    repo.commit("main", "upload")
    g.close()
    mod, values = _foreign_memo_values()
    db = diskcache.Cache(str(tmp_path / "home" / "table-memo"))
    sys.modules[mod.__name__] = mod
    try:
        keys = list(db.iterkeys())
        assert len(keys) >= len(_tables(ns))  # a fingerprint per table file, and checkpoint facts
        for k in keys:
            db.set(k, values[what])  # file entries and the "facts:" ones alike
    finally:
        del sys.modules[mod.__name__]
        db.close()
    _new_process_view(monkeypatch)
    calls = _count_table_hashes(monkeypatch)
    g = make_graveler(tmp_path)
    repo = g.repository("memo")
    _read_every_commit(repo)
    assert sorted(calls) == sorted(_tables(ns))  # checked again, all passing
    repo.stage("main", _key(2000), entry("edit"))  # a rewrite consults the checkpoint facts too
    repo.commit("main", "edit")
    assert repo.get("main", _key(2000)).etag == "edit"
    mr = repo.get_commit("main~1").meta_range_id
    rng = repo._committed.list_ranges(mr)[0].id
    g.close()
    # the damaged variant: with the memo forgetting, a table under another's name is still refused
    shutil.copy(ns / "_lakefs" / mr, ns / "_lakefs" / rng)
    _new_process_view(monkeypatch)
    g = make_graveler(tmp_path)
    with pytest.raises(CorruptedData, match="wrong name"):
        list(g.repository("memo").iter_committed("main~1"))
    g.close()


def test_memo_directory_shared_by_two_homes(tmp_path, monkeypatch):
    """Two homes whose memo is one directory (a shared home directory, a symlink): each remembers by its
    own files' fingerprints, so both read their repositories -- and one home adopting the other's
    namespace tree reads it too."""
    shared = tmp_path / "shared-memo"
    shared.mkdir()
    homes = [tmp_path / "h1", tmp_path / "h2"]
    counts = []
    for i, h in enumerate(homes):
        h.mkdir()
        (h / "table-memo").symlink_to(shared, target_is_directory=True)
        g = Graveler(GravelerConfig(home=h, kv=FAST_KV))
        repo = g.create_repository("same", f"file://{tmp_path}/ns{i}")
        items = _bulk_entries(800, 2 * KiB, seed=i)
        counts.append(len(items))
        repo.stage_many("main", items)
        repo.commit("main", "upload")
        g.close()
    for _ in range(2):
        for i, h in enumerate(homes):
            _new_process_view(monkeypatch)
            g = Graveler(GravelerConfig(home=h, kv=FAST_KV))
            assert sum(1 for _ in g.repository("same").list("main", delimiter="")) == counts[i]
            g.close()
    g = Graveler(GravelerConfig(home=homes[0], kv=FAST_KV))
    mr0 = g.repository("same").get_commit("main").meta_range_id
    g.close()
    _new_process_view(monkeypatch)
    g = Graveler(GravelerConfig(home=homes[1], kv=FAST_KV))
    other = g.create_repository("other", f"file://{tmp_path}/ns0")
    other.commit_metarange("main", mr0, "adopt the first home's tree")
    assert sum(1 for _ in other.list("main", delimiter="")) == counts[0]
    g.close()


# -- checkpoints recorded for another version of a file ----------------------------------------------------


def _biggest_range(ns: Path) -> str:
    return max((ns / "_lakefs").iterdir(), key=lambda p: p.stat().st_size).name


def _uncompressed_twin(data: bytes, name: str) -> bytes:
    """The same table (same records, same properties: same ID) written without compression: another
    version of the file, as another writer (an older lakeFS, another tool) may lay it out."""
    t = SSTable(data, name, block_cache=BlockCache(0))
    props = {k: v for k, v in t.raw_properties.items() if not k.startswith("rocksdb.")}
    w = SSTableWriter(compression=False)
    for k, v in t:
        w.add(k, v)
    return w.finish(props)


def _forged_facts(blob: bytes, params: RangeParams, size: int, how: str) -> bytes:
    cps, raw = checkpoints.unpack(sstable_kernel.compiled, blob, params, size)
    from graveler.sstable import _ctable

    n, head = _ctable.CHECKPOINT_BYTES, _ctable.CHECKPOINT_HEAD
    out = bytearray(raw)
    for at in range(0, len(raw), n):
        c, off, entries, rk, rv, crc = head.unpack_from(raw, at)
        if how == "offsets":
            off += 1
        elif how == "crcs":
            crc ^= 0x5A5A5A5A
        head.pack_into(out, at, c, off, entries, rk, rv, crc)
    return checkpoints.pack(sstable_kernel.compiled, params, size, bytes(out))


@pytest.mark.parametrize("variant", ["another layout of the file", "offsets of another file",
                                     "crcs of another file"])
def test_checkpoints_of_another_file_version_are_not_used(tmp_path, monkeypatch, variant):
    """Checkpoints are facts about a range ID, recorded for the file our writer made. A healthy file of
    that ID laid out otherwise (or checkpoints that do not fit the file) must not be resumed from: the
    rewrite starts from the first block and the result is what a from-scratch write gives."""
    stats = _apply_stats(monkeypatch)
    params = RangeParams()
    g = make_graveler(tmp_path)
    ns = tmp_path / "ns"
    repo = g.create_repository("ckpt", f"file://{ns}")
    repo.stage_many("main", _bulk_entries(3000, 2 * KiB))
    repo.commit("main", "upload")
    rid = _biggest_range(ns)
    memo = gcache.shared_memo(str(tmp_path / "home" / "table-memo"))
    blob = memo.get_facts(rid)
    assert checkpoints.unpack(sstable_kernel.compiled, blob, params, (ns / "_lakefs" / rid).stat().st_size) is not None
    path = ns / "_lakefs" / rid
    if variant == "another layout of the file":
        twin = _uncompressed_twin(path.read_bytes(), rid)
        assert twin != path.read_bytes() and len(twin) != path.stat().st_size
        verify_table(f"_lakefs/{rid}", twin)  # healthy: it hashes to its name
        os.chmod(path, 0o644)
        path.write_bytes(twin)
    else:
        memo.put_facts(rid, _forged_facts(blob, params, path.stat().st_size, variant.split()[0]))
    g.close()
    _new_process_view(monkeypatch)
    g = make_graveler(tmp_path)
    repo = g.repository("ckpt")
    stats.clear()
    repo.stage("main", _key(2900), entry("late change"))
    c = repo.commit("main", "change deep in the range")
    assert stats[-1].blocks_resumed == 0, stats
    expected = cmanager.CommittedManager(cmanager.StoreSource(LocalStore(str(tmp_path / "scratch")))) \
        .write_metarange(repo.iter_committed(c.id))
    assert c.meta_range_id == expected
    g.close()
    assert _pure_python_audit(ns) == len(_tables(ns))


def test_checkpoints_of_the_file_are_used(tmp_path, monkeypatch):
    """The control for the test above: the genuine checkpoints are resumed from, with the same result."""
    stats = _apply_stats(monkeypatch)
    g = make_graveler(tmp_path)
    ns = tmp_path / "ns"
    repo = g.create_repository("ckpt", f"file://{ns}")
    repo.stage_many("main", _bulk_entries(3000, 2 * KiB))
    repo.commit("main", "upload")
    repo.stage("main", _key(2900), entry("late change"))
    c = repo.commit("main", "change deep in the range")
    assert stats[-1].blocks_resumed > 0
    expected = cmanager.CommittedManager(cmanager.StoreSource(LocalStore(str(tmp_path / "scratch")))) \
        .write_metarange(repo.iter_committed(c.id))
    assert c.meta_range_id == expected
    g.close()


# == 2. the cache checks ==================================================================================


def _small_ranges_repo(tmp_path: Path, n: int = 1200) -> tuple[Path, list[str]]:
    """A local repository whose ranges are a few hundred KiB each; returns (namespace, table keys)."""
    g = make_graveler(tmp_path, range_params=RangeParams(max_range_size=256 * KiB))
    ns = tmp_path / "ns"
    repo = g.create_repository("small", f"file://{ns}")
    repo.stage_many("main", _bulk_entries(n, 2 * KiB))
    repo.commit("main", "upload")
    g.close()
    return ns, sorted(_tables(ns))


_TABLE_READER = r"""
import json, logging, sys
from graveler.cache import CheckMemo, ImmutableCache
from graveler.committed.reader import verify_table
from graveler.objstore import LocalStore

root, cache_dir, memo_dir, bound, rounds, *keys = sys.argv[1:]
warnings = []
class Catch(logging.Handler):
    def emit(self, r):
        warnings.append(r.getMessage())
logging.getLogger().addHandler(Catch(logging.WARNING))
store = LocalStore(root)
want = {k: store.get(k) for k in keys}
cache = ImmutableCache(store, cache_dir, max_bytes=int(bound), verify=verify_table, memo=CheckMemo(memo_dir))
print("ready", flush=True)
r = 0
while rounds == "forever" or r < int(rounds):
    for k in keys:
        buf, fp = cache.get_immutable(k)
        assert bytes(buf) == want[k], k
        if rounds == "forever":
            cache.evict(k)
    r += 1
print(json.dumps({"stats": cache.stats.snapshot(), "warnings": warnings}), flush=True)
"""


def _spawn(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_disk_tier_shared_by_processes_filling_and_evicting_at_once(tmp_path):
    """Two processes start on a cold cache directory at once, fill the same tables and, the bound holding
    about two of them, evict each other's files while the other reads: every read is the table, and no
    copy is ever judged damaged."""
    ns, keys = _small_ranges_repo(tmp_path)
    assert len(keys) >= 6
    total = sum((ns / k).stat().st_size for k in keys)
    procs = [_spawn(_TABLE_READER, ns, tmp_path / "cache", tmp_path / "memo", total // 3, 12, *keys)
             for _ in range(2)]
    results = [_finish(p) for p in procs]
    for res in results:
        assert res["stats"]["verify_failures"] == 0 and res["warnings"] == [], res
        assert res["stats"]["misses"] > len(keys)  # eviction did happen under the readers
    assert sum(r["stats"]["hits"] for r in results) > 0


def test_disk_tier_left_by_a_killed_process_mid_fill(tmp_path):
    """A process filling the disk tier killed (SIGKILL) at random moments, several times: what it left is
    read as healthy (no copy judged damaged) and every table is served."""
    ns, keys = _small_ranges_repo(tmp_path)
    rnd = random.Random(5)
    for _ in range(4):
        p = _spawn(_TABLE_READER, ns, tmp_path / "cache", tmp_path / "memo", 64 * MiB, "forever", *keys)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.05 + rnd.random() * 0.2)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    res = _finish(_spawn(_TABLE_READER, ns, tmp_path / "cache", tmp_path / "memo", 64 * MiB, 2, *keys))
    assert res["stats"]["verify_failures"] == 0 and res["warnings"] == [], res


_CHUNK_READER = r"""
import json, logging, random, signal, sys
from graveler.objstore import LocalStore
from graveler.objstore.chunked import ChunkedReader, DataCache

root, key, size, etag, cache_dir, bound, chunk, rounds, seed = sys.argv[1:]
size, chunk = int(size), int(chunk)
warnings = []
class Catch(logging.Handler):
    def emit(self, r):
        warnings.append(r.getMessage())
logging.getLogger().addHandler(Catch(logging.WARNING))
store = LocalStore(root)
want = store.get(key)
cache = DataCache(cache_dir, int(bound))
rnd = random.Random(int(seed))
print("ready", flush=True)
r = 0
while rounds == "forever" or r < int(rounds):
    rd = ChunkedReader(store, key, size, store.full_uri(key), etag, cache, chunk_size=chunk)
    if r % 2:  # sequential, as cat does (read-ahead fills the cache from other threads)
        got = b"".join(rd.read(o, 100_000) for o in range(0, size, 100_000))
        assert got == want
    else:  # random reads straddling chunk boundaries
        for _ in range(40):
            o = rnd.randrange(0, size)
            n = rnd.choice([1, chunk - 1, chunk, chunk + 1, 3 * chunk])
            assert rd.read(o, n) == want[o:o + n]
    rd.close()
    r += 1
print(json.dumps({"stats": cache.stats(), "warnings": warnings}), flush=True)
"""


def _local_object(tmp_path: Path, size: int) -> tuple[Path, str, Entry]:
    g = make_graveler(tmp_path)
    ns = tmp_path / "objns"
    repo = g.create_repository("obj", f"file://{ns}")
    e = repo.upload("main", "blob", random.Random(size).randbytes(size))
    g.close()
    return ns, e.address, e


def test_data_cache_shared_by_processes_filling_and_evicting_at_once(tmp_path):
    """The mount's chunk cache: two processes read one object through one cold cache directory at once
    (sequentially with read-ahead, and at random offsets across chunk boundaries), the bound holding a
    few chunks: every read is right, no chunk is judged damaged."""
    chunk = 64 * KiB
    ns, key, e = _local_object(tmp_path, 40 * chunk + 123)
    procs = [_spawn(_CHUNK_READER, ns, key, e.size, e.etag, tmp_path / "dcache", 12 * chunk, chunk, 6, s)
             for s in (1, 2)]
    results = [_finish(p) for p in procs]
    for res in results:
        assert res["stats"]["damaged"] == 0 and res["warnings"] == [], res
        assert res["stats"]["misses"] > 40  # chunks were evicted under the readers
    assert sum(r["stats"]["hits"] for r in results) > 0


def test_data_cache_left_by_a_killed_process_mid_fill(tmp_path):
    chunk = 256 * KiB
    ns, key, e = _local_object(tmp_path, 24 * chunk)
    rnd = random.Random(9)
    for i in range(4):
        p = _spawn(_CHUNK_READER, ns, key, e.size, e.etag, tmp_path / "dcache", 4 * MiB, chunk, "forever", i)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.05 + rnd.random() * 0.2)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    res = _finish(_spawn(_CHUNK_READER, ns, key, e.size, e.etag, tmp_path / "dcache", 64 * MiB, chunk, 3, 7))
    assert res["stats"]["damaged"] == 0 and res["warnings"] == [], res
    assert res["stats"]["hits"] > 0


@pytest.mark.s3
@pytest.mark.expect_log("a damaged cached chunk is fetched again, with one warning")
def test_objects_at_chunk_boundaries_through_the_mount_cache(tmp_path, s3_bucket, s3_config):
    """Objects of 0, 1, 8 MiB - 1, 8 MiB, 8 MiB + 1 and 16 MiB (0 mod the 8 MiB chunk) bytes, uploaded
    and read as the mount reads them (View.open with the data cache), cold and warm, whole and at the
    boundaries, plus one cache bounded below a chunk (the object larger than the cache): always the
    object, nothing judged damaged. The damaged variant: a flipped byte in a cached chunk is caught."""
    chunk = 8 * MiB
    sizes = [0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk]
    cfg = GravelerConfig(home=tmp_path / "home", kv=FAST_KV, store=s3_config)
    g = Graveler(cfg)
    repo = g.create_repository("chunks", f"s3://{s3_bucket}/ns")
    blobs = {}
    for s in sizes:
        blobs[f"o{s}"] = random.Random(s).randbytes(s)
        repo.upload("main", f"o{s}", blobs[f"o{s}"])
    repo.commit("main", "objects")
    view = repo.view("main")
    caches = {"bounded": DataCache(str(tmp_path / "dc"), 64 * MiB),
              "below a chunk": DataCache(str(tmp_path / "dc-small"), chunk // 2)}
    for label, dc in caches.items():
        for warm in (False, True):
            for path, want in blobs.items():
                e = repo.get("main", path)
                assert repo.read("main", path) == want  # a whole read: size and MD5 checked
                rd = view.open(e, dc)
                try:
                    assert rd.read(0, len(want) + 10) == want, (label, path)
                    for o in (chunk - 1, chunk, chunk + 1, len(want) - 1, len(want), len(want) + 5):
                        if o >= 0:
                            assert rd.read(o, 2) == want[o:o + 2], (label, path, o)
                finally:
                    rd.close()
            st = dc.stats()
            assert st["damaged"] == 0, (label, st)
            if warm and label == "bounded":
                assert st["hits"] > 0
    assert caches["below a chunk"].volume() < chunk  # no chunk of 8 MiB was kept
    # the damaged variant
    dc = caches["bounded"]
    vals = sorted((tmp_path / "dc").rglob("*.val"), key=lambda p: p.stat().st_size)
    victim = vals[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0x10
    victim.write_bytes(bytes(data))
    for path, want in blobs.items():
        rd = view.open(repo.get("main", path), dc)
        assert rd.read(0, len(want)) == want
        rd.close()
    assert dc.stats()["damaged"] == 1
    for dc in caches.values():
        dc.close()
    g.close()


@pytest.mark.s3
def test_range_over_20_mib_through_the_s3_disk_tier(tmp_path, monkeypatch, s3_bucket, s3_config):
    """A range over 20 MiB in an S3 namespace (a multipart object): filled and verified, then hit
    (memory-mapped, remembered by its fingerprint), then hit with the memo gone; and a home whose disk
    tier is smaller than the range (never cached, fetched and verified at each open)."""
    cfg = GravelerConfig(home=tmp_path / "home", kv=FAST_KV, store=s3_config)
    g = Graveler(cfg)
    repo = g.create_repository("big", f"s3://{s3_bucket}/ns")
    items = _bulk_entries(14_000, 2 * KiB)
    repo.stage_many("main", items)
    repo.commit("main", "big upload")
    repo.stage("main", _key(9000), entry("edit"))
    repo.commit("main", "edit")
    g.close()
    small = GravelerConfig(home=tmp_path / "home", kv=FAST_KV, store=s3_config,
                           cache=CacheConfig(disk_bytes=4 * MiB, disk_dir=str(tmp_path / "small-cache")))
    shutil.rmtree(tmp_path / "home" / "cache")
    shutil.rmtree(tmp_path / "home" / "table-memo")
    with open_store(f"s3://{s3_bucket}/ns", s3_config) as st:
        big = [o.key for o in st.list("_lakefs/") if o.size > 20 * MiB]
    assert big  # a range over 20 MiB (a multipart object in S3)
    for label, c in (("cold", cfg), ("warm", cfg), ("memo gone", cfg), ("bound below", small),
                     ("bound below again", small)):
        if label == "memo gone":
            shutil.rmtree(tmp_path / "home" / "table-memo")
        _new_process_view(monkeypatch)
        calls = _count_table_hashes(monkeypatch)
        g = Graveler(c)
        repo = g.repository("big")
        assert sum(1 for _ in repo.list("main", delimiter="")) == len(items)
        assert sum(1 for _ in repo.list("main~1", delimiter="")) == len(items)
        disk = repo.cache_stats()["table_disk_cache"]
        assert disk["verify_failures"] == 0, (label, disk)
        checked_big = [k for k in big if k in calls]
        if label == "warm":  # hits on files the memo knows: not hashed again
            assert disk["misses"] == 0 and checked_big == [], (label, disk, calls)
        else:  # filled (verified), hit with nothing remembered (verified), or never cached (fetched, verified)
            assert checked_big == big, (label, disk, calls)
        if label.startswith("bound below"):
            assert disk["misses"] >= len(big), (label, disk)
        g.close()
