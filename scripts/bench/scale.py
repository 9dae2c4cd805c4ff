#!/usr/bin/env python3
"""What a 100M-entry repository costs, from per-range costs measured here (README "Scale on paper").

Builds an N-entry commit (default 1,000,000 entries, the keys and entries of
scripts/bench/committed.py, lakeFS's default range parameters) in a local namespace and
measures per range: entries, file bytes, metarange bytes per range record, the cost of
writing, cold-scanning and GC-decoding one range (the live addresses of its entries,
sorted, as the Spark mark's tasks extract them).  Then it writes a metarange *shaped like
the target's*: the N-entry commit's real ranges plus synthetic range records (same key
lengths, IDs of absent files) up to the target's range count, and measures on it what
depends on the metarange's size directly: its file size, a commit of 1 change (apply of
one key: one real range rewritten + the whole metarange written) and the first get (a
new process; the home never saw the tables, so both files are hashed against their IDs).
The per-range costs are per entry x the mean range length, counted by the writer's break
rule over --sample-keys keys (the built commit has too few ranges for a tight mean).
The rest is extrapolated linearly in the range count: a cold scan (one process, and
split over N executors), and the GC mark on N executors = live-set extraction
(ranges x per-range cost / N) + an anti-join of the stored objects against the live
set (per-object cost of pyarrow's hash anti-join on one core here, / N; the Spark mark
sort-merges in the JVM, which this does not measure).  Executors are assumed to be
this machine's cores with no Spark overhead: a floor, not a forecast.

    .venv/bin/python scripts/bench/scale.py                       # 1M measured, 100M target
    .venv/bin/python scripts/bench/scale.py -n 2000000 --target 1000000000 --executors 16 128
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

from committed import Namespace, make_key, make_value  # noqa: E402
from graveler import model  # noqa: E402
from graveler.committed.kernel import MetaRangeWriter  # noqa: E402
from graveler.committed.writer import RangeParams, table_key  # noqa: E402
from graveler.model import AddressType, RangeInfo  # noqa: E402
from graveler.spark.tables import iter_range_records  # noqa: E402


def timed(fn, *a):
    t = time.perf_counter()
    r = fn(*a)
    return r, time.perf_counter() - t


def live_addresses(values: list[bytes], rid: str, pa):
    """A block's entry addresses, sorted: the executor side of the GC mark's live set (compiled decoder)."""
    import pyarrow.compute as pc

    if model.entry_columns is None:
        from graveler.model import Entry, decode_value

        return pa.array(sorted(Entry.from_value(decode_value(v, rid)).address for v in values), pa.string())
    (ao, ad, *_rest) = model.entry_columns(values, rid, int(AddressType.RELATIVE))
    addr = pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(ao), pa.py_buffer(ad)])
    return addr.take(pc.sort_indices(addr))


def synthetic_metarange(ns: Namespace, real: list[RangeInfo], total: int, params: RangeParams) -> str:
    """A metarange of ``total`` range records: the real ones, then synthetic ones after them (keys of the
    same length, counts and sizes of the real mean; their IDs name no file and are never opened)."""
    rnd = random.Random(7)
    klen = int(statistics.mean(len(r.max_key) for r in real))
    cnt = int(statistics.mean(r.count for r in real))
    size = int(statistics.mean(r.estimated_size for r in real))
    w = MetaRangeWriter(lambda k, d: ns.store.put(k, d), params, None)
    for r in real:
        w.copy_range(r)
    for i in range(total - len(real)):
        base = f"zz-synthetic/{i:09d}/"
        pad = max(1, klen - len(base))
        lo = (base + "0" + rnd.randbytes(pad).hex()[:pad - 1]).encode()  # random: compresses as real keys do
        hi = (base + "f" + rnd.randbytes(pad).hex()[:pad - 1]).encode()
        w.copy_range(RangeInfo(hashlib.sha256(rnd.randbytes(16)).hexdigest(), lo, hi,
                               int(cnt * rnd.uniform(0.5, 1.5)), int(size * rnd.uniform(0.5, 1.5))))
    return w.close()


def entries_per_range(params: RangeParams, sample: int, bytes_per_entry: float) -> float:
    """Mean entries per range by the writer's break rule (a key whose FNV-1a hash is 0 modulo the
    raggedness ends a range; so does reaching the size limit) over ``sample`` keys of the same shape:
    many more ranges than the built commit has, for a tighter mean."""
    from graveler.committed.kernel import fnv1a64_batch

    ranges, count = 0, 0
    limit = params.max_range_size / bytes_per_entry
    step = 1_000_000
    for lo in range(0, sample, step):
        ks = sorted(make_key(i) for i in range(lo, min(sample, lo + step)))
        for h in fnv1a64_batch(ks):
            count += 1
            if h % params.raggedness == 0 or count >= limit:
                ranges += 1
                count = 0
    return sample / max(ranges, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--entries", type=int, default=1_000_000, help="entries of the measured commit")
    ap.add_argument("--target", type=int, default=100_000_000, help="entries of the repository on paper")
    ap.add_argument("--executors", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--garbage", type=float, default=0.5, help="stored objects not live, per live entry (GC)")
    ap.add_argument("--sample-keys", type=int, default=5_000_000,
                    help="keys over which the break rule's mean range length is counted")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    import pyarrow as pa

    root = args.dir or tempfile.mkdtemp(prefix="lakefuse-bench-scale-")
    n, target = args.entries, args.target
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; measuring a {n:,}-entry commit",
          flush=True)
    try:
        params = RangeParams()
        ns = Namespace(root, params, disk_cache=False)
        order = sorted((make_key(i), i) for i in range(n))
        keys = [k for k, _ in order]
        idx = [i for _, i in order]
        del order
        recs = [(keys[j], make_value(idx[j])) for j in range(n)]
        mr, build_s = timed(ns.mgr.write_metarange, recs)
        del recs
        ranges = ns.mgr.list_ranges(mr)
        nr = len(ranges)
        files = [os.path.getsize(os.path.join(ns.store.root, table_key(r.id))) for r in ranges]
        mr_bytes = os.path.getsize(os.path.join(ns.store.root, table_key(mr)))
        built_per_range = n / nr
        bytes_per_entry = sum(files) / n
        per_range_entries = entries_per_range(params, args.sample_keys, bytes_per_entry)
        per_range_bytes = bytes_per_entry * per_range_entries
        scale = per_range_entries / built_per_range  # the per-range costs below: per entry x the mean range
        # The per-range costs.
        write_s = build_s / nr * scale
        scans = []
        for _ in range(args.repeat):
            m = ns.fresh()
            _, s = timed(lambda: sum(1 for _ in m.iterator(mr)))
            scans.append(s / nr * scale)
        scan_s = statistics.median(scans)
        gcs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            for r in ranges:
                for _k, vals in iter_range_records(ns.store, r.id):
                    live_addresses(vals, r.id, pa)
            gcs.append((time.perf_counter() - t0) / nr * scale)
        gc_s = statistics.median(gcs)
        # Anti-join per stored object, one core (pyarrow hash join), at the measured size.
        live = pa.table({"address": pa.array([f"data/gk{i:012x}/ck{0:08x}{i:016x}" for i in range(n)])})
        stored = pa.table({"address": pa.array([f"data/gk{i:012x}/ck{0:08x}{i:016x}"
                                                for i in range(int(n * (1 + args.garbage)))])})
        joins = []
        for _ in range(args.repeat):
            res, s = timed(lambda st=stored, lv=live: st.join(lv, keys="address", join_type="left anti"))
            joins.append(s / stored.num_rows)
        assert res.num_rows == stored.num_rows - n
        join_s = statistics.median(joins)
        del live, stored
        print(f"  measured: {nr} ranges of {built_per_range:,.0f} entries on average; by the break rule over "
              f"{args.sample_keys:,} keys {per_range_entries:,.0f} entries and {per_range_bytes / 1e6:.1f} MB per "
              f"range; metarange {mr_bytes:,} B ({mr_bytes / nr:.0f} B per range record); per range: write "
              f"{write_s * 1000:.0f} ms, cold scan {scan_s * 1000:.0f} ms, GC live-set extraction "
              f"{gc_s * 1000:.0f} ms; anti-join {join_s * 1e9:.0f} ns per stored object", flush=True)

        # The target's metarange, measured directly.
        tr = math.ceil(target / per_range_entries)
        big, mk_s = timed(synthetic_metarange, ns, ranges, tr, params)
        big_bytes = os.path.getsize(os.path.join(ns.store.root, table_key(big)))
        rnd = random.Random(42)
        applies, firsts, firsts_known = [], [], []
        for rep in range(max(args.repeat, 3)):
            m = ns.fresh()
            j = rnd.randrange(n)
            (_new, _st), s = timed(m.apply, big, [(keys[j], make_value(idx[j], rep + 1))])
            applies.append(s)
            ns.fresh(forget=True).reader.memo._db  # an empty table memo: the home never saw the tables
            m = ns.fresh(forget=True, keep_empty=True)
            _, s = timed(m.get, big, keys[rnd.randrange(n)])
            firsts.append(s)
            m = ns.fresh()
            _, s = timed(m.get, big, keys[rnd.randrange(n)])
            firsts_known.append(s)
        apply_s, first_s, first_known_s = (statistics.median(x) for x in (applies, firsts, firsts_known))
        print(f"  target metarange: {tr:,} range records, {big_bytes:,} B (written in {mk_s:.2f} s)", flush=True)

        cmd = "scripts/bench/scale.py"
        rows = [
            ("ranges", f"{tr:,}", f"{per_range_entries:,.0f} entries per range",
             f"the break rule counted over {args.sample_keys / 1e6:g}M keys; target / that"),
            ("range files, total", f"{tr * per_range_bytes / 1e9:,.1f} GB", f"{per_range_bytes / 1e6:.1f} MB per range",
             "extrapolated"),
            ("metarange size", f"{big_bytes / 1e6:.2f} MB", f"{big_bytes / tr:.0f} B per range record",
             "measured: a metarange of that many records written"),
            ("commit of 1 change", f"{apply_s * 1000:.0f} ms", "one range rewritten + the whole metarange",
             "measured on the target-shaped metarange (median)"),
            ("first get, new home (tables hashed)", f"{first_s * 1000:.0f} ms", "metarange + one range checked",
             "measured on the target-shaped metarange (median)"),
            ("first get, later process", f"{first_known_s * 1000:.0f} ms", "the table memo knows both files",
             "measured on the target-shaped metarange (median)"),
            ("build (write every range), 1 process", f"{tr * write_s / 60:,.1f} min",
             f"{write_s * 1000:.0f} ms per range", "extrapolated: ranges x per-range"),
            ("cold scan, 1 process", f"{tr * scan_s / 60:,.1f} min", f"{scan_s * 1000:.0f} ms per range",
             "extrapolated: ranges x per-range"),
        ]
        stored = target * (1 + args.garbage)
        for e in args.executors:
            rows.append((f"cold scan, {e} executors", f"{tr * scan_s / e:,.0f} s", f"{scan_s * 1000:.0f} ms per range",
                         "extrapolated, no Spark overhead"))
        for e in args.executors:
            mark = (tr * gc_s + stored * join_s) / e
            rows.append((f"GC mark, {e} executors ({stored / 1e6:,.0f}M stored)", f"{mark:,.0f} s",
                         f"{gc_s * 1000:.0f} ms per range + {join_s * 1e9:.0f} ns per stored object",
                         "extrapolated, no Spark overhead"))
        print()
        print(f"A {target / 1e6:,.0f}M-entry repository, from a measured {n / 1e6:g}M-entry commit "
              f"(`{cmd} -n {n} --target {target}`; load average {os.getloadavg()[0]:.1f}):")
        print()
        print("| what | cost | per-range input | how |")
        print("|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
