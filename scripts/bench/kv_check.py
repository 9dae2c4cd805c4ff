"""What the pre-open check of a refs database costs (graveler.lmdb_file), beside opening it.

Builds a refs database by ordinary use (an upload's staging in batches of 1,000, then
its commit, repeated), then times, medians of --reps:
  - the quick path: the check of a file as long as its meta page counts;
  - the proof of a short file: reading the whole free list (the worst case: every
    page past the end must be looked up; here all of it is read);
  - opening the environment with graveler.kv (check + LMDB open + named databases);
  - a raw ``lmdb.open`` of the same file (the peer: no check at all).

    .venv/bin/python scripts/bench/kv_check.py [--entries 200000] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lmdb  # noqa: E402

from graveler import Graveler, GravelerConfig, KVConfig, kv  # noqa: E402
from graveler.kv import lmdb_file  # noqa: E402
from graveler.model import Entry  # noqa: E402


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000, help="entries staged and committed (in rounds of 50,000)")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-kv-check-"))
    g = Graveler(GravelerConfig(home=root / "home", kv=KVConfig(sync=False)))
    repo = g.create_repository("bench", f"file://{root}/ns")
    done = 0
    while done < args.entries:
        n = min(50_000, args.entries - done)
        items = [(f"r{done // 50_000}/w{i:07d}", Entry(address=f"data/{done + i:032x}", size=16,
                                                         etag=f"{done + i:032x}", last_modified_ns=1))
                 for i in range(n)]
        for s in range(0, n, 1000):
            repo.stage_many("main", items[s:s + 1000])
        repo.commit("main", f"round {done}")
        done += n
    g.close()
    path = root / "home" / "repos" / "bench" / "refs.lmdb"
    data = path / "data.mdb"
    fd = os.open(data, os.O_RDONLY)
    meta = lmdb_file.newest(lmdb_file.read_metas(fd))
    size = os.fstat(fd).st_size
    free: set[int] = set(range(meta.last_pg + 1))
    lmdb_file._free_list(fd, meta, size, free)
    free_pages = meta.last_pg + 1 - len(free)

    quick = median_ms(lambda: lmdb_file.check(fd), args.reps)
    proof = median_ms(lambda: lmdb_file._free_list(fd, meta, size, set(range(meta.last_pg + 2, meta.last_pg + 3))),
                      args.reps)
    os.close(fd)

    def graveler_open():
        kv.open_env(path, KVConfig(sync=False), create=False)
        kv.close_env(path)

    def raw_open():
        env = lmdb.open(str(path), max_dbs=len(kv.TABLES) + 2, sync=False)
        for name in kv.TABLES:
            env.open_db(name.encode())
        env.close()

    opened = median_ms(graveler_open, args.reps)
    raw = median_ms(raw_open, args.reps)
    print(f"refs database: {size / 1e6:.1f} MB, {meta.last_pg + 1} pages, {free_pages} on the free list "
          f"({args.entries} entries committed)")
    print(f"check, file long enough (quick path):   {quick:8.3f} ms")
    print(f"check, short file (whole free list read): {proof:8.3f} ms")
    print(f"open with graveler.kv (check included):   {opened:8.3f} ms")
    print(f"raw lmdb.open + named dbs (no check):     {raw:8.3f} ms   ratio open/raw {opened / raw:.2f}")


if __name__ == "__main__":
    main()
