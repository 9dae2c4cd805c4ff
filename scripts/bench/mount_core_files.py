#!/usr/bin/env python3
"""A small file's cost in the mount core alone: no kernel, no FUSE, no thread hand-off.

Runs what the kernel sends for ``open(O_CREAT) + write 4 KiB + close`` straight into a
writable :class:`lakefuse.mount.fs.Filesystem` (the kernel's lookup, the create -- on the
trio thread's path when it needs no I/O --, the write, the flush and release, the directory's
getattr) over a local repository, and prints the CPU per file. Beside the daemon CPU per file
of ``scripts/bench/mount_write.py`` it tells what is the core's (Python of create, write and
save, the LMDB transaction, the object adoption) and what is the FUSE plumbing around it.
``--profile``: cProfile of the timed loop (deterministic call counts; its own overhead about
doubles the time). ``--sync``: the KV syncs as a daemon's does (each commit's ``fdatasync``).

    .venv/bin/python scripts/bench/mount_core_files.py --files 3000 [--profile] [--sync]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graveler import Graveler, GravelerConfig, KVConfig  # noqa: E402
from lakefuse.mount.attrs import Caller  # noqa: E402
from lakefuse.mount.fs import FsConfig  # noqa: E402
from lakefuse.mount.inodes import ROOT_INO  # noqa: E402
from lakefuse.mount.spool import Spool, SpoolConfig  # noqa: E402
from lakefuse.mount.writes import WritableFilesystem  # noqa: E402

WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--profile", action="store_true", help="cProfile the timed loop")
    ap.add_argument("--sync", action="store_true", help="the KV syncs as a daemon's does")
    ap.add_argument("--dir", default=None, help="where to make the repository (a temp dir)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lakefuse-bench-core-", dir=args.dir))
    try:
        g = Graveler(GravelerConfig(home=tmp / "home", kv=KVConfig(sync=args.sync)))
        repo = g.create_repository("bench", f"file://{tmp}/ns")
        spool = Spool(repo, SpoolConfig(tmp / "cache", "bench"))
        fs = WritableFilesystem(repo, FsConfig(uid=0, gid=0), spool=spool)
        me = Caller(uid=0, gid=0, umask=0o022)
        branch = fs.lookup(ROOT_INO, b"main").ino
        dirs = [fs.mkdir(branch, f"d{i}".encode(), 0o755, me).ino for i in range(10)]
        data = os.urandom(args.size)

        def one(i: int) -> None:
            d, name = dirs[i % 10], f"f{i}".encode()
            if not fs.lookup_absent(d, name):
                raise SystemExit(f"lookup of {name!r} was not answered from memory")
            got = fs.create(d, name, 0o644, WRITE, me, True) or fs.create(d, name, 0o644, WRITE, me)
            fh = got[0].fh
            fs.write(fh, 0, data)
            if fs.pending(fh):
                fs.flush(fh)
            fs.release(fh)
            fs.getattr_fast(d)

        warm = 300
        for i in range(warm):
            one(i)
        prof = cProfile.Profile() if args.profile else None
        inline0 = fs.stats.counts.get("creates_inline", 0)
        c0, m0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
        if prof:
            prof.enable()
        for i in range(warm, warm + args.files):
            one(i)
        if prof:
            prof.disable()
        c1, m1, t1 = time.process_time(), time.thread_time(), time.perf_counter()
        inline = fs.stats.counts.get("creates_inline", 0) - inline0
        n = args.files
        print(f"core: {(c1 - c0) * 1e6 / n:.0f} us CPU/file: {(m1 - m0) * 1e6 / n:.0f} in the calling thread, "
              f"{((c1 - c0) - (m1 - m0)) * 1e6 / n:.0f} in others (the spool pool making files ahead, the KV's "
              f"background sync); {(t1 - t0) * 1e6 / n:.0f} us wall/file; KV sync {'on' if args.sync else 'off'}; "
              f"creates without I/O {inline / n:.0%}")
        if prof:
            st = pstats.Stats(prof)
            st.sort_stats("tottime").print_stats(30)
            st.sort_stats("cumulative").print_stats(40)
        spool.close()
        repo.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
