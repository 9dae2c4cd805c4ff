#!/usr/bin/env python3
"""What GC's sweep of killed writers' temp files (graveler.objstore.local_temp) adds to a sweep
of a local namespace, against GNU find doing the same walk in the same run.

A namespace of ``--objects`` empty objects under ``data/<hour>/`` (``--hours`` directories, as
new_data_address lays them out) with ``--stale`` temp files three days old is walked by
``sweep_temp_files(..., dry_run=True)`` and by ``find ROOT -type f -name '.lakefuse-tmp-*' -mmin
+60``, alternately, ``--reps`` times each (the page cache warm: the sweep runs after the mark
has listed the same directories). Both must find the same files. Prints the medians and the
ratio (ours / find's time).

    .venv/bin/python scripts/bench/gc_temp_sweep.py                      # 200,000 objects
    .venv/bin/python scripts/bench/gc_temp_sweep.py --objects 1000000 --hours 2000
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from graveler.objstore.local import TMP_PREFIX as TMP  # noqa: E402
from graveler.objstore.local_temp import sweep_temp_files  # noqa: E402


def build(root: Path, objects: int, hours: int, stale: int) -> None:
    old = time.time() - 3 * 86400
    per = -(-objects // hours)
    for h in range(hours):
        d = root / "data" / f"2026{h:06d}"
        d.mkdir(parents=True)
        for i in range(min(per, objects - h * per)):
            os.close(os.open(d / f"{i:019d}{h:016x}", os.O_CREAT | os.O_WRONLY, 0o644))
    for k in range(stale):
        p = root / "data" / f"2026{(k * 7) % hours:06d}" / f"{TMP}{k:032x}"
        p.write_bytes(b"partial")
        os.utime(p, (old, old))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=200_000)
    ap.add_argument("--hours", type=int, default=400, help="data/<hour>/ directories")
    ap.add_argument("--stale", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp", help="where the namespace is built")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakefuse-tempsweep-", dir=a.dir))
    try:
        t0 = time.monotonic()
        build(work / "ns", a.objects, a.hours, a.stale)
        print(f"namespace: {a.objects:,} objects in {a.hours} directories, {a.stale} stale temp files "
              f"(built in {time.monotonic() - t0:.1f} s)")
        cmd = ["find", str(work / "ns"), "-type", "f", "-name", TMP + "*", "-mmin", "+60"]
        ours, theirs = [], []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            res = sweep_temp_files(str(work / "ns"), time.time(), dry_run=True)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            found = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()
            theirs.append(time.perf_counter() - t0)
            if res.files != len(found) or res.files != a.stale:
                print(f"MISMATCH: the sweep found {res.files}, find {len(found)}, built {a.stale}")
                return 1
        mo, mt = statistics.median(ours), statistics.median(theirs)
        print(f"sweep_temp_files: median {mo * 1000:.1f} ms ({a.objects / mo:,.0f} objects/s); "
              f"find: median {mt * 1000:.1f} ms; ratio (ours/find) {mo / mt:.2f}")
        print(f"  ours {[round(x * 1000, 1) for x in ours]} ms; find {[round(x * 1000, 1) for x in theirs]} ms")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
