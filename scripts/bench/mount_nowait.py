#!/usr/bin/env python3
"""Warm re-read of a big file of a branch tree whose object file is in the page cache, FUSE
passthrough off: every read a FUSE request the daemon answers, either on the trio thread
(``preadv2(RWF_NOWAIT)`` from the page cache: inline reads, the default) or through a worker
thread (``LAKEFUSE_INLINE_READS=0``); against reading the object file directly (warm), and
against pyfuse3's own ceiling: a minimal pyfuse3 file system (started here) whose reads return a
prebuilt 1 MiB buffer at once, with the same kernel read-ahead window.

Each run mounts afresh (the kernel holds none of the mount's pages), reads the object file
once to warm its pages, then reads ``<mnt>/main/big.bin`` in 1 MiB reads, then (the
mount's pages of it dropped, read-ahead off) 4 KiB at ``--random-reads`` random pages, each
one a FUSE request; the three are
read (and the ceiling's file) in a rotating order, ``--reps`` times; medians and same-run ratios are printed as JSON.
The mount's ``.lakefuse/stats`` must show the path it claims (inline reads with it on, none
with it off).

    .venv/bin/python scripts/bench/mount_nowait.py              # 1 GiB, 5 runs
    .venv/bin/python scripts/bench/mount_nowait.py --big-mib 256 --reps 3
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mount_read import (MiB, LakefuseMount, is_mounted, log, big_file_repo, med, read_file,  # noqa: E402
                        timed, unmount)


def serve_ceiling(mountpoint: str, size: int) -> None:
    """The minimal pyfuse3 file system: one file ``big`` of ``size`` bytes, every read a slice
    of one prebuilt 1 MiB buffer (no I/O, no thread): what pyfuse3 and the kernel carry."""
    import pyfuse3
    import trio

    block = os.urandom(MiB)

    class Ops(pyfuse3.Operations):
        async def getattr(self, inode, ctx=None):
            e = pyfuse3.EntryAttributes()
            e.st_ino = inode
            e.attr_timeout = e.entry_timeout = 300
            if inode == pyfuse3.ROOT_INODE:
                e.st_mode, e.st_nlink = stat.S_IFDIR | 0o755, 2
            else:
                e.st_mode, e.st_nlink, e.st_size = stat.S_IFREG | 0o644, 1, size
            return e

        async def lookup(self, parent_inode, name, ctx=None):
            if name != b"big":
                raise pyfuse3.FUSEError(errno.ENOENT)
            return await self.getattr(2)

        async def open(self, inode, flags, ctx):
            return pyfuse3.FileInfo(fh=inode)

        async def read(self, fh, off, n):
            n = max(0, min(n, size - off))
            return block if n == MiB else block[:n]

    pyfuse3.init(Ops(), mountpoint, {"fsname=ceiling"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


def set_read_ahead(mp: Path, kib: int = 4096) -> None:
    """The window lakefuse's daemon sets for its mount (MountConfig.read_ahead_kb)."""
    st = os.stat(mp)
    with open(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb", "w") as f:
        f.write(str(kib))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--random-reads", type=int, default=20000, help="4 KiB random reads per run (read-ahead off)")
    ap.add_argument("--work", default=None, help="a directory for the data (default: a temporary one, removed)")
    ap.add_argument("--serve-ceiling", metavar="MOUNTPOINT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_ceiling:
        serve_ceiling(args.serve_ceiling, args.big_mib * MiB)
        return 0

    work = Path(args.work or tempfile.mkdtemp(prefix="lakefuse-bench-nowait-"))
    try:
        home = work / "home"
        obj = big_file_repo(work, args.big_mib)
        size = args.big_mib * MiB
        mp = work / "mnt"
        runs: dict[str, list[float]] = {"inline": [], "thread": [], "direct": [], "ceiling": [],
                                        "random_inline": [], "random_thread": [], "random_direct": []}
        served: dict[str, list[str]] = {"inline": [], "thread": []}

        offsets = random.Random(5).sample(range(size // 4096), args.random_reads)

        def random_reads(path: Path, drop: bool = True) -> float:
            """4 KiB preads at distinct random pages, read-ahead off: through the mount each one a
            FUSE request (per second)."""
            fd = os.open(path, os.O_RDONLY)
            try:
                if drop:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the mount's pages of it: gone
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                return len(offsets) / timed(lambda: [os.pread(fd, 4096, i * 4096) for i in offsets])
            finally:
                os.close(fd)

        def check_served(kind: str, before: dict, st: dict, least: int) -> str:
            inline = st.get("reads_inline", 0) - before.get("reads_inline", 0)
            thread = st.get("reads_thread", 0) - before.get("reads_thread", 0)
            if (kind == "inline") != (inline > thread) or inline + thread < least:
                raise SystemExit(f"{kind}: the mount says inline reads {st.get('inline_reads')!r}, "
                                 f"{inline} reads inline, {thread} in a thread (at least {least} expected)")
            return f"{inline} inline / {thread} thread"

        def through_mount(kind: str) -> float:
            env = {"LAKEFUSE_PASSTHROUGH": "0", "LAKEFUSE_INLINE_READS": "1" if kind == "inline" else "0"}
            path = mp / "main" / "big.bin"
            with LakefuseMount(home, "bench", mp, env=env) as m:
                read_file(obj)  # the object file's pages: warm
                before = m.stats()
                secs = timed(lambda: read_file(path))
                st = m.stats()
                served[kind].append(check_served(kind, before, st, size // MiB))
                rate = random_reads(path)
                served[kind].append(check_served(kind, st, m.stats(), int(len(offsets) * 0.9)))
            runs[f"random_{kind}"].append(rate)
            return size / secs

        def direct() -> float:
            read_file(obj)
            secs = timed(lambda: read_file(obj))
            runs["random_direct"].append(random_reads(obj, drop=False))  # warm
            return size / secs

        def ceiling() -> float:
            cmp = work / "ceiling"
            cmp.mkdir(exist_ok=True)
            proc = subprocess.Popen([sys.executable, __file__, "--serve-ceiling", str(cmp), "--big-mib",
                                     str(args.big_mib)], stdin=subprocess.DEVNULL)
            try:
                deadline = time.monotonic() + 30
                while not is_mounted(cmp) or not (cmp / "big").exists():  # it lists nothing: no readdir
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit("the pyfuse3 ceiling file system did not mount")
                    time.sleep(0.1)
                set_read_ahead(cmp)
                return size / timed(lambda: read_file(cmp / "big"))
            finally:
                unmount(cmp)
                proc.wait(30)

        kinds = ["inline", "thread", "direct", "ceiling"]
        do = {"inline": lambda: through_mount("inline"), "thread": lambda: through_mount("thread"),
              "direct": direct, "ceiling": ceiling}
        for rep in range(args.reps):
            for kind in kinds[rep % 4:] + kinds[:rep % 4]:
                runs[kind].append(do[kind]())
            log(f"run {rep + 1}: " + ", ".join(f"{k} {runs[k][-1] / 1e6:.0f} MB/s" for k in kinds))
        m = {k: med(v) for k, v in runs.items()}
        out = {
            "big_mib": args.big_mib,
            "reps": args.reps,
            **{f"{k}_MBps": round(m[k] / 1e6, 1) for k in kinds},
            **{f"{k}_runs_MBps": [round(x / 1e6) for x in runs[k]] for k in kinds},
            "random_4k_reads": args.random_reads,
            **{f"{k}_per_s": round(m[k]) for k in runs if k.startswith("random_")},
            **{f"{k}_runs_per_s": [round(x) for x in runs[k]] for k in runs if k.startswith("random_")},
            "inline_vs_direct": round(m["inline"] / m["direct"], 2),
            "thread_vs_direct": round(m["thread"] / m["direct"], 2),
            "inline_vs_thread": round(m["inline"] / m["thread"], 2),
            "inline_vs_pyfuse3_ceiling": round(m["inline"] / m["ceiling"], 2),
            "thread_vs_pyfuse3_ceiling": round(m["thread"] / m["ceiling"], 2),
            "random_inline_vs_thread": round(m["random_inline"] / m["random_thread"], 2),
            "random_inline_vs_direct": round(m["random_inline"] / m["random_direct"], 2),
            "reads_served": served,
        }
        print(json.dumps(out, indent=2))
        return 0
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
