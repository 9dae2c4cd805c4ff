#!/usr/bin/env python3
"""Benchmark of ``fsck``: a repository of N objects in C commits checked whole.

Prints the median time of ``Repository.fsck`` with no object checks (refs and every table),
with ``exist`` (one head per object) and with ``md5`` (every object read and hashed), and beside
each its physical anchor measured in the same run: reading every table file of the namespace
(for the tables), stat-ing every object file (exist) and reading + MD5-ing every object file with
hashlib (md5), page cache warm in both.

    .venv/bin/python scripts/bench/fsck.py
    .venv/bin/python scripts/bench/fsck.py -n 100000 --commits 20 --reps 5
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from graveler import Graveler, GravelerConfig  # noqa: E402


def timed(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=20_000, help="objects (default 20,000)")
    ap.add_argument("--commits", type=int, default=10, help="commits, each changing n/commits objects")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="lakefuse-bench-fsck-")
    try:
        g = Graveler(GravelerConfig(home=os.path.join(d, "home")))
        ns = os.path.join(d, "ns")
        repo = g.create_repository("bench-fsck", f"file://{ns}")
        per = max(1, args.n // args.commits)
        for c in range(args.commits):
            repo.stage_many("main", [(f"part={i % 50:02d}/obj-{i:07d}", repo.put_object(os.urandom(512)))
                                     for i in range(c * per, (c + 1) * per)])
            repo.commit("main", f"commit {c}")
        tables = [os.path.join(ns, "_lakefs", f) for f in os.listdir(os.path.join(ns, "_lakefs")) if len(f) == 64]
        objects = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(ns, "data")) for f in fs]

        def read_all(paths):
            for p in paths:
                with open(p, "rb") as f:
                    f.read()

        def md5_all(paths):
            for p in paths:
                with open(p, "rb") as f:
                    hashlib.md5(f.read()).hexdigest()

        rows = []
        for mode, anchor, what in (("none", lambda: read_all(tables), f"read {len(tables)} table files"),
                                   ("exist", lambda: [os.stat(p) for p in objects], f"stat {len(objects)} objects"),
                                   ("md5", lambda: md5_all(objects), f"read+MD5 {len(objects)} objects")):
            rep = repo.fsck(mode)
            assert rep.healthy, rep.problems
            t = timed(lambda: repo.fsck(mode), args.reps)
            a = timed(anchor, args.reps)
            rows.append((mode, t, a, what, rep))
        print(f"fsck of {args.n:,} objects in {args.commits} commits ({len(tables)} tables), medians of {args.reps}:")
        for mode, t, a, what, rep in rows:
            extra = f", {rep.objects:,} objects" if mode != "none" else ""
            print(f"  --objects {mode:5s}: {t * 1000:8,.0f} ms ({rep.metaranges} metaranges, {rep.ranges} ranges{extra}) "
                  f"| anchor ({what}): {a * 1000:,.0f} ms | ratio {t / a:,.1f}x")
        g.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
