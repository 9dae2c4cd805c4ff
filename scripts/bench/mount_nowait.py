#!/usr/bin/env python3
"""Warm re-read of a big file of a branch tree whose object file is in the page cache, FUSE
passthrough off: every read a FUSE request the daemon answers, either on the trio thread
(``preadv2(RWF_NOWAIT)`` from the page cache: inline reads, the default) or through a worker
thread (``LAKEFUSE_INLINE_READS=0``); against reading the object file directly (warm).

Each run mounts afresh (the kernel holds none of the mount's pages), reads the object file
once to warm its pages, then reads ``<mnt>/main/big.bin`` in 1 MiB reads; the three are
read in a rotating order, ``--reps`` times; medians and same-run ratios are printed as JSON.
The mount's ``.lakefuse/stats`` must show the path it claims (inline reads with it on, none
with it off).

    .venv/bin/python scripts/bench/mount_nowait.py              # 1 GiB, 5 runs
    .venv/bin/python scripts/bench/mount_nowait.py --big-mib 256 --reps 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mount_read import MiB, LakefuseMount, log, make_big, med, read_file, timed  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default=None, help="a directory for the data (default: a temporary one, removed)")
    args = ap.parse_args()

    from graveler import Graveler, GravelerConfig

    work = Path(args.work or tempfile.mkdtemp(prefix="lakefuse-bench-nowait-"))
    try:
        home = work / "home"
        g = Graveler(GravelerConfig(home=home))
        r = g.create_repository("bench", f"file://{work}/ns")
        src = work / "big.src"
        log(f"generating {args.big_mib} MiB in {work}")
        make_big(src, args.big_mib)
        entry = r.upload("main", "big.bin", str(src))
        src.unlink()
        r.commit("main", "big")
        g.close()
        obj = work / "ns" / entry.address
        size = args.big_mib * MiB
        mp = work / "mnt"
        runs: dict[str, list[float]] = {"inline": [], "thread": [], "direct": []}
        served: dict[str, list[str]] = {"inline": [], "thread": []}

        def through_mount(kind: str) -> float:
            env = {"LAKEFUSE_PASSTHROUGH": "0", "LAKEFUSE_INLINE_READS": "1" if kind == "inline" else "0"}
            with LakefuseMount(home, "bench", mp, env=env) as m:
                read_file(obj)  # the object file's pages: warm
                before = m.stats()
                secs = timed(lambda: read_file(mp / "main" / "big.bin"))
                st = m.stats()
            inline = st.get("reads_inline", 0) - before.get("reads_inline", 0)
            thread = st.get("reads_thread", 0) - before.get("reads_thread", 0)
            served[kind].append(f"{inline} inline / {thread} thread")
            if (kind == "inline") != (inline > thread) or inline + thread == 0:
                raise SystemExit(f"{kind}: the mount says inline reads {st.get('inline_reads')!r}, "
                                 f"{inline} reads inline, {thread} in a thread")
            return size / secs

        def direct() -> float:
            read_file(obj)
            return size / timed(lambda: read_file(obj))

        kinds = list(runs)
        for rep in range(args.reps):
            for kind in kinds[rep % 3:] + kinds[:rep % 3]:
                runs[kind].append(through_mount(kind) if kind != "direct" else direct())
            log(f"run {rep + 1}: " + ", ".join(f"{k} {runs[k][-1] / 1e6:.0f} MB/s" for k in kinds))
        m = {k: med(v) for k, v in runs.items()}
        out = {
            "big_mib": args.big_mib,
            "reps": args.reps,
            **{f"{k}_MBps": round(v / 1e6, 1) for k, v in m.items()},
            **{f"{k}_runs_MBps": [round(x / 1e6) for x in v] for k, v in runs.items()},
            "inline_vs_direct": round(m["inline"] / m["direct"], 2),
            "thread_vs_direct": round(m["thread"] / m["direct"], 2),
            "inline_vs_thread": round(m["inline"] / m["thread"], 2),
            "reads_served": served,
        }
        print(json.dumps(out, indent=2))
        return 0
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
