#!/usr/bin/env python3
"""Benchmark of graveler's refs, staging and version-control operations.

On a branch whose head holds N entries (default 1,000,000; the base commit is
built through the committed layer and adopted, as a bulk import would do):
staging writes/s (one writer, one transaction per write and batched), merged
listing (staging over committed) entries/s, commit time for 1 / 1,000 / 100,000
staged changes, a merge of two branches with 1,000 changes each spread over the
key space, and `log` over 10,000 commits.  The physical anchor for staging writes
is a bare LMDB put loop in the same process (same library, same disk); for commits
and merges it is writing+fsyncing new files of the sizes the operation wrote.

    .venv/bin/python scripts/bench/refs.py
    .venv/bin/python scripts/bench/refs.py -n 100000 --log-commits 2000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from graveler import Graveler, native  # noqa: E402
from graveler.model import Entry  # noqa: E402
from graveler.config import GravelerConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from floors import tree_files, write_floor  # noqa: E402


def key(i: int) -> bytes:
    return (f"datasets/events/year=2024/month={i % 12 + 1:02d}/day={i % 28 + 1:02d}/"
            f"part-{i:08d}-5f0c7e2a.c000.snappy.parquet").encode()


def entry(i: int, version: int = 0) -> Entry:
    return Entry(address=f"data/gk{i:012x}/v{version}", size=1000 + i % 5000, etag=f"{(i * 31 + version):032x}",
                 last_modified_ns=1_700_000_000_000_000_000 + i)


def timed(fn, *a, **kw):
    t = time.perf_counter()
    r = fn(*a, **kw)
    return r, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--entries", type=int, default=1_000_000)
    ap.add_argument("--unbatched", type=int, default=3_000, help="single-write transactions to time")
    ap.add_argument("--batched", type=int, default=100_000, help="writes to time in batches of 1,000")
    ap.add_argument("--log-commits", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each commit and merge row")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="lakefuse-bench-refs-")
    rows = []

    def row(name, text):
        rows.append((name, text))
        print(f"  {name}: {text}", flush=True)

    try:
        n = args.entries
        g = Graveler(GravelerConfig.from_home(os.path.join(root, "home")))
        repo = g.create_repository("bench", f"file://{root}/ns")
        print(f"building a {n:,}-entry base commit ...", flush=True)
        recs = [(key(i), entry(i).to_value()) for i in range(n)]
        recs.sort()
        mr = repo.write_metarange(recs)
        repo.commit_metarange("main", mr, "import base")

        # -- staging writes
        lmdb_rate = None
        import lmdb

        env = lmdb.open(os.path.join(root, "anchor.lmdb"), map_size=1 << 32)
        vals = [entry(i, 1).to_value() for i in range(args.unbatched)]
        t = time.perf_counter()
        for i, v in enumerate(vals):
            with env.begin(write=True) as txn:
                txn.put(key(i), v.identity + v.data)
        lmdb_rate = len(vals) / (time.perf_counter() - t)
        env.close()
        repo.create_branch("writes", "main")
        _, s = timed(lambda: [repo.stage("writes", key(i), vals[i]) for i in range(len(vals))])
        row("staging, one write per transaction", f"{len(vals) / s:,.0f} writes/s | bare LMDB put+commit "
            f"{lmdb_rate:,.0f}/s, ours/LMDB = {len(vals) / s / lmdb_rate:.2f}")
        batch = [(key(i), entry(i, 2).to_value()) for i in range(args.batched)]
        t = time.perf_counter()
        for lo in range(0, len(batch), 1000):
            repo.stage_many("writes", batch[lo:lo + 1000])
        s = time.perf_counter() - t
        row("staging, batches of 1,000", f"{len(batch) / s:,.0f} writes/s")

        # -- merged listing
        _, s = timed(lambda: sum(1 for _ in repo.list("writes", b"", b"")))
        row("merged listing (staging over committed), flat", f"{n / s:,.0f} entries/s ({n:,} entries, "
            f"{args.batched:,} staged)")
        _, s = timed(lambda: sum(1 for _ in repo.list("writes", b"datasets/events/", b"/")))
        row("listing one directory level (common prefixes)", f"{s * 1000:.1f} ms")

        # -- commits of 1, 1,000, 100,000 changes; a merge of 1,000 changes per side spread over the key
        # space. Each is timed `reps` times on fresh branches (new values each time, so no file is reused)
        # beside the physical floor: writing+fsyncing new files of the sizes the operation wrote.
        ns_dir = os.path.join(root, "ns")

        def timed_writes(fn, *a):
            before = tree_files(ns_dir)
            _, s = timed(fn, *a)
            sizes = [size for p, size in tree_files(ns_dir).items() if p not in before]
            return s, sizes

        def report(name, times, sizes_each):
            floors = [write_floor(root, sizes) for sizes in sizes_each]
            files = statistics.median(len(x) for x in sizes_each)
            mb = statistics.median(sum(x) for x in sizes_each) / 1e6
            row(name, f"{statistics.median(times) * 1000:,.0f} ms (median of {len(times)}); wrote {files:.0f} "
                f"files, {mb:.1f} MB; writing+fsyncing new files of those sizes, same run: "
                f"{statistics.median(floors) * 1000:,.0f} ms, ours/that = "
                f"{statistics.median(times) / statistics.median(floors):.1f}")

        for count in (1, 1_000, 100_000):
            step = max(1, n // count)
            times, sizes_each = [], []
            for rep in range(args.reps):
                b = f"c{count}-{rep}"
                repo.create_branch(b, "main")
                repo.stage_many(b, [(key(i * step), entry(i * step, 10 + rep).to_value()) for i in range(count)])
                s, sizes = timed_writes(repo.commit, b, f"{count} changes")
                times.append(s)
                sizes_each.append(sizes)
            report(f"commit of {count:,} staged change(s)", times, sizes_each)

        times, sizes_each = [], []
        for rep in range(args.reps):
            left, right = f"left-{rep}", f"right-{rep}"
            repo.create_branch(left, "main")
            repo.create_branch(right, "main")
            repo.stage_many(left, [(key((i * 997 + rep) % n), entry(i, 20 + rep).to_value()) for i in range(1000)])
            repo.commit(left, "left")
            repo.stage_many(right, [(key((i * 991 + 5 + rep) % n), entry(i, 30 + rep).to_value())
                                    for i in range(1000)])
            repo.commit(right, "right")
            s, sizes = timed_writes(repo.merge, left, right, "source-wins")
            times.append(s)
            sizes_each.append(sizes)
        report("merge, 1,000 changes on each side, spread", times, sizes_each)

        # -- log over many commits
        small = g.create_repository("history", f"file://{root}/ns-history")
        t = time.perf_counter()
        for i in range(args.log_commits):
            small.stage("main", b"counter", entry(i).to_value())
            small.commit("main", f"commit {i}")
        build_s = time.perf_counter() - t
        times = []
        for _ in range(3):
            got, s = timed(lambda: sum(1 for _ in small.log("main")))
            times.append(s)
        row(f"log of {got:,} commits", f"{statistics.median(times) * 1000:,.0f} ms "
            f"({got / statistics.median(times):,.0f} commits/s); making them: "
            f"{args.log_commits / build_s:,.0f} commits/s")

        print(f"\nlakefuse refs and staging ({native.implementation()} hot path), {n:,}-entry branch, "
              f"{os.cpu_count()} cores")
        w = max(len(r[0]) for r in rows)
        for name, text in rows:
            print(f"| {name.ljust(w)} | {text}")
        g.close()
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
