#!/usr/bin/env python3
"""Benchmark of graveler's committed storage (issue: lakeFS-compatible committed storage).

Builds an N-entry commit (default 1,000,000 entries with ~100-byte deep-path keys)
in a local storage namespace behind the on-disk cache, then measures build rate,
cold and warm random gets, full scans, a 1-key apply (against the same on a
10,000-entry commit), a 10-key diff, a merge of 1,000 changes per side spread over
the keys, and the hourly-ingest pattern; the apply, the merge and the first get ever
beside their same-run floors (writing and fsyncing the files, SHA-256 of what the
table IDs hash).  The same
random gets and scan run through RocksDB itself (rocksdict) over the same records,
in the same process, as the native anchor; the table shows ours / RocksDB's.

    .venv/bin/python scripts/bench/committed.py            # full size
    .venv/bin/python scripts/bench/committed.py -n 100000  # quicker
    LAKEFUSE_PURE_PYTHON=1 .venv/bin/python scripts/bench/committed.py   # the pure-Python reference
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from graveler import native  # noqa: E402
from graveler.cache import CheckMemo, ImmutableCache  # noqa: E402
from graveler.committed.manager import CommittedManager, StoreSource, verify_table  # noqa: E402
from graveler.committed.writer import RangeParams  # noqa: E402
from graveler.model import Entry, MergeStrategy, encode_records, encode_value, py_encode_records  # noqa: E402
from graveler.objstore import open_store  # noqa: E402
from graveler.sstable.reader import BlockCache  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from floors import hash_floor, write_floor  # noqa: E402

TEAMS = ["ads", "search", "payments", "ml-features", "growth", "infra", "risk", "maps"]
TABLES = ["events", "sessions", "clicks", "impressions", "labels", "embeddings"]


def make_key(i: int) -> bytes:
    r = random.Random(i)
    team, table = TEAMS[i % len(TEAMS)], TABLES[(i // 8) % len(TABLES)]
    return (
        f"datasets/{team}/{table}/year=2024/month={(i // 7919) % 12 + 1:02d}/day={(i // 311) % 28 + 1:02d}/"
        f"hour={i % 24:02d}/part-{i % 10000:05d}-{r.getrandbits(64):016x}.c000.snappy.parquet"
    ).encode()


def make_entry(i: int, version: int = 0) -> Entry:
    return Entry(
        address=f"data/gk{i:012x}/ck{version:08x}{i:016x}", size=1000 + i % 100000, etag=f"{i * 2654435761 % 2**128:032x}",
        last_modified_ns=1_700_000_000_000_000_000 + i * 1_000_000_000, content_type="application/octet-stream",
    )


def make_value(i: int, version: int = 0):
    return make_entry(i, version).to_value()


def hourly_key(day: int, hour: int, j: int) -> bytes:
    return f"input/2024/06/{day:02d}/{hour:02d}:00/events-{j:06d}.json.gz".encode()


class Namespace:
    """A storage namespace and a manager over it.

    A local namespace is read in place (as graveler does: the disk tier exists for
    remote stores); ``--disk-cache`` puts the on-disk cache in front anyway.
    """

    def __init__(self, root: str, params: RangeParams, disk_cache: bool):
        self.root = root
        os.makedirs(os.path.join(root, "ns"), exist_ok=True)
        self.store = open_store(os.path.join(root, "ns"))
        self.params = params
        self.disk_cache = disk_cache
        self.memo_dir = os.path.join(root, "table-memo")  # what a home keeps (<home>/table-memo)
        self.fresh()

    def fresh(self, forget: bool = False, keep_empty: bool = False) -> CommittedManager:
        """A manager as a new process gets it: empty caches (disk tier, open tables, decoded blocks) and a
        new handle on the home's table memo (``forget``: an empty memo too, as for tables never seen;
        ``keep_empty``: the empty memo made by the last ``forget``, as it is)."""
        memo_dir = self.memo_dir
        if forget:  # a memo of its own, empty (the home's keeps what it knows, checkpoints included)
            memo_dir = os.path.join(self.root, "table-memo-empty")
            if not keep_empty:
                shutil.rmtree(memo_dir, ignore_errors=True)
        memo = CheckMemo(memo_dir)
        if self.disk_cache:
            cache_dir = os.path.join(self.root, "cache")
            shutil.rmtree(cache_dir, ignore_errors=True)
            source = ImmutableCache(self.store, cache_dir, max_bytes=4 << 30, verify=verify_table, memo=memo)
        else:
            source = StoreSource(self.store)
        self.mgr = CommittedManager(source, self.params, block_cache=BlockCache(1 << 30), memo=memo)
        return self.mgr


def id_input_bytes(props) -> int:
    """About how many bytes a table's ID hashes (``len(key) key | len(value) value |`` per record), from its
    properties: the raw key and value sizes (the 8-byte trailer of each stored key, which the ID input does
    not have, stands for the decimal lengths and separators it has)."""
    return int(props["rocksdb.raw.key.size"]) + int(props["rocksdb.raw.value.size"])


def timed(fn, *a, **kw):
    t = time.perf_counter()
    r = fn(*a, **kw)
    return r, time.perf_counter() - t


def med(xs):
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--entries", type=int, default=1_000_000)
    ap.add_argument("--gets", type=int, default=50_000, help="random gets per warm measurement")
    ap.add_argument("--cold-gets", type=int, default=2_000)
    ap.add_argument("--repeat", type=int, default=3, help="repetitions for medians")
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--files-per-hour", type=int, default=2_000)
    ap.add_argument("--no-rocksdb", action="store_true")
    ap.add_argument("--disk-cache", action="store_true", help="put the on-disk cache tier in front of the local store")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed after)")
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="lakefuse-bench-")
    rows: list[tuple[str, str, str]] = []

    def row(name, ours, anchor=""):
        rows.append((name, ours, anchor))
        print(f"  {name}: {ours} {anchor}", flush=True)

    try:
        n = args.entries
        print(f"generating {n:,} keys ...", flush=True)
        # Only the keys are kept (sorted, for sampling gets); records are made again whenever they are written,
        # so the harness does not hold a million record objects while graveler is measured.
        (order, gen_s) = timed(lambda: sorted((make_key(i), i) for i in range(n)))
        keys = [k for k, _ in order]
        idx = [i for _, i in order]
        del order

        def records(step: int = 1, version: int = 0):
            """The tree's records in key order (every ``step``-th), values made on the fly."""
            return ((keys[j], make_value(idx[j], version)) for j in range(0, n, step))

        print(f"  (making the keys: {n / gen_s:,.0f} keys/s)")
        ns = Namespace(root, RangeParams(), args.disk_cache)
        m = ns.mgr

        # -- entry encoding + identity: Entry -> stored record value (protobuf, sha256 identity, framing),
        # in one call per batch as Repository.stage_many does (encode_records); one entry at a time
        # (encode_value(e.to_value()), as per-entry callers do) and the pure-Python reference beside it.
        ents = [make_entry(i) for i in range(min(n, 200_000))]
        enc, enc_one, enc_py = [], [], []
        for _ in range(args.repeat):
            _, s = timed(lambda: encode_records(ents))
            enc.append(len(ents) / s)
            _, s = timed(lambda: [encode_value(e.to_value()) for e in ents])
            enc_one.append(len(ents) / s)
            _, s = timed(lambda: py_encode_records(ents[:20_000]))
            enc_py.append(min(len(ents), 20_000) / s)
        row("entry encoding + identity", f"{med(enc):,.0f} entries/s",
            f"| one at a time {med(enc_one):,.0f}/s | pure-Python reference {med(enc_py):,.0f}/s, "
            f"compiled/pure = {med(enc) / med(enc_py):.1f}")
        del ents

        # -- build
        recs = list(records())  # made beforehand: the build rate is graveler's, not make_value's
        mr, build_s = timed(m.write_metarange, recs)
        del recs
        ranges = m.list_ranges(mr)
        row("build 1 commit", f"{n / build_s:,.0f} entries/s ({len(ranges)} ranges, {build_s:.1f} s)")

        rnd = random.Random(42)

        # -- gets, cold then warm
        cold_rates = []
        for _ in range(args.repeat):
            m = ns.fresh()
            sample = rnd.sample(keys, args.cold_gets)
            _, s = timed(lambda: [m.get(mr, k) for k in sample])
            cold_rates.append(len(sample) / s)
        firsts = []
        for rep in range(max(args.repeat, 3)):
            m = ns.fresh()
            _, s = timed(m.get, mr, keys[rnd.randrange(n)])
            firsts.append(s)
        first_s = med(firsts)
        row("get, cold (empty disk+memory caches)", f"{med(cold_rates):,.0f} gets/s over {args.cold_gets:,} gets; "
            f"first get {first_s * 1000:.1f} ms (median of {len(firsts)})")
        # The same first get when the home has never seen the tables: the metarange and the range are checked
        # against their IDs first (every record read and hashed: what the table memo saves every later process).
        # (The memo's directory exists beforehand, as a home's does: the get opens it as a new process would.)
        # Beside it, the same run's floor: SHA-256 (hashlib) over as many bytes as the range's ID hashes.
        unchecked = []
        for rep in range(max(args.repeat, 3)):
            ns.fresh(forget=True).reader.memo._db  # an empty memo, made
            m = ns.fresh(forget=True, keep_empty=True)
            k = keys[rnd.randrange(n)]
            info = next(r for r in ranges if r.max_key >= k)
            _, s = timed(m.get, mr, k)
            props = m.reader.open(info.id).properties
            id_bytes = id_input_bytes(props)
            unchecked.append((s, info.estimated_size, hash_floor(id_bytes), id_bytes))
        s_med = med([x[0] for x in unchecked])
        mb = sum(x[1] for x in unchecked) / len(unchecked) / 1e6
        row("get, first ever (tables checked against their IDs)", f"{s_med * 1000:.0f} ms for a range of {mb:.1f} MB "
            f"on average (median of {len(unchecked)}); later processes: the first get above",
            f"| same run: SHA-256 over the {med([x[3] for x in unchecked]) / 1e6:.0f} MB its ID hashes "
            f"{med([x[2] for x in unchecked]) * 1000:.0f} ms; get/that, median of the per-get ratios = "
            f"{med([x[0] / x[2] for x in unchecked]):.2f}")
        m = ns.fresh()
        _ = sum(1 for _ in m.iterator(mr))  # warm every block
        warm = []
        for _ in range(args.repeat):
            sample = rnd.sample(keys, min(args.gets, n))
            _, s = timed(lambda: [m.get(mr, k) for k in sample])
            warm.append(len(sample) / s)
        ours_warm = med(warm)

        # -- scans
        scans_cold, scans_warm = [], []
        for _ in range(args.repeat):
            m = ns.fresh()
            _, s = timed(lambda: sum(1 for _ in m.iterator(mr)))
            scans_cold.append(n / s)
            _, s = timed(lambda: sum(1 for _ in m.iterator(mr)))
            scans_warm.append(n / s)

        # -- RocksDB anchor over the same records
        rocks_get = rocks_scan = None
        if not args.no_rocksdb:
            import rocksdict

            dbdir = os.path.join(root, "rocksdb")
            db = rocksdict.Rdict(dbdir, rocksdict.Options(raw_mode=True))
            wb = rocksdict.WriteBatch(raw_mode=True)
            for k, v in records():
                wb.put(k, encode_value(v))
            db.write(wb)
            del wb
            db.flush()
            rg, rs = [], []
            for _ in range(args.repeat):
                sample = rnd.sample(keys, min(args.gets, n))
                _, s = timed(lambda: [db.get(k) for k in sample])
                rg.append(len(sample) / s)
                _, s = timed(lambda: sum(1 for _ in db.items()))
                rs.append(n / s)
            rocks_get, rocks_scan = med(rg), med(rs)
            db.close()
        row("get, warm", f"{ours_warm:,.0f} gets/s",
            f"| RocksDB {rocks_get:,.0f}/s, ours/RocksDB = {ours_warm / rocks_get:.2f}" if rocks_get else "")
        row("scan, cold caches", f"{med(scans_cold):,.0f} entries/s")
        row("scan, warm", f"{med(scans_warm):,.0f} entries/s",
            f"| RocksDB {rocks_scan:,.0f}/s, ours/RocksDB = {med(scans_warm) / rocks_scan:.2f}" if rocks_scan else "")

        # -- apply of one changed key: 1M vs 10k
        def apply_one(mgr, base, key, version):
            w0, r0 = mgr.tables_written, mgr.tables_read
            (new, stats), s = timed(mgr.apply, base, [(key, make_value(0, version))])
            return new, stats, s, mgr.tables_written - w0, mgr.tables_read - r0

        m = ns.fresh()
        big_times, small_times, floors, hashes, sizes, skipped, rehashed = [], [], [], [], [], [], []
        stores = []  # per apply: seconds storing its new range file (write + fsync + rename, on the put thread)
        store_put = m.source.put

        def timed_put(key, data):
            t = time.perf_counter()
            store_put(key, data)
            stores[-1] = max(stores[-1], time.perf_counter() - t)  # the range's (the metarange's is small)

        m.source.put = timed_put
        reps = max(args.repeat, 7)
        # Each apply's floors are measured right after it (under the same load): writing, fsyncing and keeping
        # a new file of its range's size (kept, as the apply's range file is: both grow the page cache), and
        # SHA-256 over the record bytes it re-hashed; from bytes made beforehand (no memory churned between).
        pool = os.urandom(64 << 20)
        kept: list[str] = []
        for rep in range(reps):
            k = keys[rnd.randrange(n)]
            stores.append(0.0)
            new, stats, s, written, read = apply_one(m, mr, k, rep + 1)
            big_times.append(s)
            info = next(r for r in m.list_ranges(new) if r.max_key >= k)
            sizes.append(info.estimated_size)
            skipped.append(stats.blocks_resumed / max(1, stats.blocks_resumed + stats.blocks_carried))
            # the record bytes the range ID had to be hashed over again: those after the skipped blocks
            props = m.reader.open(info.id).properties
            rehashed.append(int(id_input_bytes(props) * (1 - skipped[-1])))
            floors.append(write_floor(root, sizes[-1], keep=kept, pool=pool))
            hashes.append(hash_floor(rehashed[-1], pool=pool))
        # the write floor as measured before: each file removed at once (the next one reuses its page cache)
        recycled = [write_floor(root, size, pool=pool) for size in sizes]
        for path in kept:
            os.unlink(path)
        del pool
        m.source.put = store_put
        small_n = 10_000
        small_recs = list(records(max(1, n // small_n)))[:small_n]
        small_mr = m.write_metarange(small_recs)
        for rep in range(reps):
            k = small_recs[rnd.randrange(len(small_recs))][0]
            _, _, s, _, _ = apply_one(m, small_mr, k, rep + 1)
            small_times.append(s)
        ratio = med(big_times) / med(small_times)
        row("apply 1 changed key", f"{med(big_times) * 1000:.0f} ms on {n:,} (median of {reps}); files written "
            f"{written} ({stats.ranges_written} range + 1 metarange), files read {read}; "
            f"{med(small_times) * 1000:.0f} ms on 10,000: ratio {ratio:.2f}",
            f"| of which storing the new range file (write+fsync+rename): median {med(stores) * 1000:.0f} ms "
            f"({min(stores) * 1000:.0f}-{max(stores) * 1000:.0f}), the rest (read, merge, encode, hash): median "
            f"{med([t - p for t, p in zip(big_times, stores)]) * 1000:.0f} ms "
            f"| the touched range: median {med(sizes) / 1e6:.1f} MB, {med(skipped) * 100:.0f}% of its blocks skipped "
            f"through a checkpoint; same run, right after each apply: writing+fsyncing a new file of its size, "
            f"kept {med(floors) * 1000:.0f} ms ({min(floors) * 1000:.0f}-{max(floors) * 1000:.0f}), "
            f"SHA-256 over the record bytes after the skipped blocks {med(hashes) * 1000:.0f} ms; "
            f"apply/(both), median of the per-apply ratios = "
            f"{med([t / (f + h) for t, f, h in zip(big_times, floors, hashes)]):.2f} "
            f"| (the write floor with each file removed at once, reusing the page cache the last one freed: "
            f"{med(recycled) * 1000:.0f} ms; apply/(that + SHA-256) = "
            f"{med([t / (f + h) for t, f, h in zip(big_times, recycled, hashes)]):.2f})")

        # -- diff of two commits differing in 10 keys
        changed = sorted(rnd.sample(keys, 10))
        other, _ = m.apply(mr, [(k, make_value(1, 99)) for k in changed])
        d_times, d_reads = [], []
        for _ in range(args.repeat):
            m = ns.fresh()
            r0 = m.tables_read
            d, s = timed(lambda: list(m.diff(mr, other)))
            assert [x.key for x in d] == changed
            d_times.append(s)
            d_reads.append(m.tables_read - r0)
        row("diff, 10 keys apart", f"{med(d_times) * 1000:.0f} ms, files read {med(d_reads):.0f} "
            f"(2 metaranges + differing ranges) of {2 + 2 * len(ranges)} (cold caches)")

        # -- merge of 1,000 changes on each side spread over the keys (every range touched on both sides), in the
        # process that made both sides (warm caches); source wins where both changed a key. Beside it, the same
        # run's floors: writing+fsyncing (and keeping) new files of the sizes it wrote, and SHA-256 over the
        # record bytes of the ranges it wrote.
        m = ns.fresh()
        pool = os.urandom(64 << 20)
        kept = []
        mtimes, mfloors, mhashes, mfiles, mbytes = [], [], [], [], []
        for rep in range(args.repeat):
            sides = []
            for mul, add, version in ((997, rep, 40 + rep), (991, 5 + rep, 50 + rep)):
                picks = sorted({keys[(i * mul + add) % n] for i in range(1000)})
                sides.append(m.apply(mr, [(k, make_value(1, version)) for k in picks])[0])
            left, right = sides
            dest_ids = {r.id for r in m.list_ranges(right)}
            (merged, mstats), s = timed(m.merge, mr, left, right, MergeStrategy.SOURCE_WINS)
            mtimes.append(s)
            new_ranges = [r for r in m.list_ranges(merged) if r.id not in dest_ids]
            files = [r.estimated_size - 8 for r in new_ranges] + [m.reader.open(merged).size]
            mfiles.append(len(files))
            mbytes.append(sum(files))
            mfloors.append(write_floor(root, files, keep=kept, pool=pool))
            mhashes.append(sum(hash_floor(id_input_bytes(m.reader.open(r.id).properties), pool=pool)
                               for r in new_ranges))
        for path in kept:
            os.unlink(path)
        del pool
        row("merge, 1,000 changes per side spread", f"{med(mtimes) * 1000:.0f} ms (median of {len(mtimes)}; "
            f"{min(mtimes) * 1000:.0f}-{max(mtimes) * 1000:.0f}); wrote {med(mfiles):.0f} files, "
            f"{med(mbytes) / 1e6:.1f} MB ({len(ranges)} ranges in the tree)",
            f"| same run: writing+fsyncing new files of those sizes, kept {med(mfloors) * 1000:.0f} ms, SHA-256 "
            f"over the records of the ranges written {med(mhashes) * 1000:.0f} ms; merge/(both), median of the "
            f"per-merge ratios = {med([t / (f + h) for t, f, h in zip(mtimes, mfloors, mhashes)]):.2f}")

        # -- hourly ingest: a commit an hour over the base
        m = ns.fresh()
        base_hourly = m.write_metarange(sorted((hourly_key(1 + i // (24 * 2000), (i // 2000) % 24, i % 2000),
                                                make_value(i)) for i in range(n)))
        cur = base_hourly
        shares, parent_shares, hour_times, byte_shares = [], [], [], []
        for h in range(args.hours):
            changes = [(hourly_key(28, h, j), make_value(j, h)) for j in range(args.files_per_hour)]
            parent_ranges = {r.id for r in m.list_ranges(cur)}
            (new, stats), s = timed(m.apply, cur, changes)
            new_infos = m.list_ranges(new)
            new_ranges = [r.id for r in new_infos]
            reused = sum(1 for r in new_ranges if r in parent_ranges)
            byte_shares.append(sum(r.estimated_size for r in new_infos if r.id in parent_ranges)
                               / sum(r.estimated_size for r in new_infos))
            shares.append(reused / len(new_ranges))
            parent_shares.append(sum(1 for r in parent_ranges if r in set(new_ranges)) / len(parent_ranges))
            hour_times.append(s)
            cur = new
        row("hourly ingest, 24 commits", f"ranges of each new commit shared with its parent: median "
            f"{med(shares) * 100:.1f}% (min {min(shares) * 100:.1f}%); parent's ranges carried over unchanged: "
            f"median {med(parent_shares) * 100:.1f}%; bytes of each new commit in reused ranges: median "
            f"{med(byte_shares) * 100:.2f}%; commit apply {med(hour_times) * 1000:.0f} ms")

        print("\nlakefuse committed storage (%s hot path), %s entries, %d cores"
              % (native.implementation(), f"{n:,}", os.cpu_count() or 0))
        w = max(len(r[0]) for r in rows)
        for name, ours, anchor in rows:
            print(f"| {name.ljust(w)} | {ours} {anchor}")
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
