#!/usr/bin/env python3
"""Emptying a large directory through a branch tree: ``rm -rf`` and a reverse-order unlink loop
of a directory of ``--files`` names the CLI put there (committed, no directory marker: as an
import or ``fs upload`` leaves it), beside the same work on a native directory, in the same run.

Before 2026-11-30 ("u" in the README) each unlink read the directory from its start past every
name removed before it: quadratic (4,000 names took 16 s). Printed: names per second for each
size and order, the ratio against native, and how the time per name grows from the smallest
size to the largest (about 1 when linear).

    .venv/bin/python scripts/bench/mount_unlink.py --files 1000,4000,16000 --reps 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mount_read as mr  # noqa: E402  (the bench's mount helpers)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def fill(d: Path, n: int) -> None:
    d.mkdir(parents=True)
    for i in range(n):
        (d / f"f{i:07d}").write_bytes(b"x")


def reverse_unlink(d: Path) -> None:
    for name in sorted(os.listdir(d), reverse=True):
        os.unlink(d / name)
    os.rmdir(d)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", default="1000,4000,16000", help="directory sizes, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.files.split(",")]
    work = Path(tempfile.mkdtemp(prefix="lakefuse-bench-unlink-", dir=args.dir))
    from graveler import Graveler, GravelerConfig

    try:
        home = work / "home"
        g = Graveler(GravelerConfig(home=home))
        repo = g.create_repository("unlink", f"file://{work}/ns")
        src = work / "src"
        for n in sizes:
            fill(src / f"s{n}", n)
        per_name: dict[tuple[str, int], float] = {}
        with mr.LakefuseMount(home, "unlink", work / "mnt") as m:
            for n in sizes:
                for order, fn in (("rm -rf", lambda d: subprocess.run(["rm", "-rf", str(d)], check=True)),
                                  ("reverse", reverse_unlink)):
                    ours, native = [], []
                    for r in range(args.reps):
                        name = f"d{n}-{order.split()[0]}-{r}"
                        for p in sorted((src / f"s{n}").iterdir()):  # what `fs upload` stages, then a commit
                            repo.upload("main", f"{name}/{p.name}", b"x")
                        repo.commit("main", f"{name}")
                        time.sleep(1.2)  # (the mount's branch timeout: it sees the commit)
                        ours.append(timed(lambda: fn(m.mp / "main" / name)))
                        nat = work / "native" / name
                        fill(nat, n)
                        native.append(timed(lambda: fn(nat)))
                    o, nv = statistics.median(ours), statistics.median(native)
                    per_name[(order, n)] = o / n
                    print(f"{order:8s} {n:7,d} names: lakefuse {n / o:9,.0f}/s ({o:6.2f} s), native {n / nv:9,.0f}/s, "
                          f"ratio {nv / o:.3f}", flush=True)
        for order in ("rm -rf", "reverse"):
            a, b = per_name[(order, sizes[0])], per_name[(order, sizes[-1])]
            print(f"{order}: time per name at {sizes[-1]:,} against {sizes[0]:,}: {b / a:.2f}x (1 when linear)")
        g.close()
    finally:
        mr.unmount(work / "mnt")
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
