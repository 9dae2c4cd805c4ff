#!/usr/bin/env python3
"""Small files through a branch tree, this checkout against another one's code, alternating.

The small-file rows of ``scripts/bench/mount_write.py`` (create + write 4 KiB + close, from 1
process and from ``--writers`` processes) swing by 20-40% between runs on the shared 2-core
machines here -- and, on ext4 without a journal, with how many files were deleted in the last
minutes (a create's inode search skips those). A change worth a tenth is only seen side by side:
each pair mounts a fresh local repository with this checkout's daemon and one with the daemon of
``--baseline DIR`` (another checkout with its compiled modules: ``git worktree add DIR REV``, then,
when no ``.pyx`` file changed between the two, ``cp --parents graveler/*.so graveler/*/*.so DIR/``
from this checkout), in turns that start with the other one every pair, and times a loop of
``--seconds`` on each. Prints every pair, then the medians and the median of the pairs' ratios
(this / baseline), with the daemon's CPU per file. Without ``--baseline`` it times this checkout
alone (the spread of repeated runs). ``--fsync`` adds a third row: 1 process with an fsync before
each close (issue 20's fsync row; "ze" measured the KV's sync beside the object's flush with it, on
a journaled ext4 made on a loop device, as ``--dir`` there).

    .venv/bin/python scripts/bench/small_files_ab.py --baseline /tmp/base --pairs 5 --dir /srv
    .venv/bin/python scripts/bench/small_files_ab.py --baseline /tmp/base --pairs 4 --fsync --dir /mnt/ext4j
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mount_write as mw  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class Mount:
    """``lakefuse mount -f`` of a new local repository, running the code of checkout ``code``."""

    def __init__(self, work: Path, code: Path):
        self.home, self.mp, self.branch = work / "home", work / "mnt", work / "mnt" / "main"
        self.mp.mkdir(parents=True)
        # the code's own checkout is the working directory (``python -m`` puts it first on the path)
        env = {**os.environ, "PYTHONPATH": str(code)}
        subprocess.run([sys.executable, "-m", "lakefuse", "--home", str(self.home), "repo", "create",
                        "lakefs://bench"], check=True, capture_output=True, cwd=code, env=env)
        self.log = open(work / "mount.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lakefuse", "--home", str(self.home), "mount", "lakefs://bench", str(self.mp),
             "-f", "--cache-dir", str(work / "cache")], stdout=self.log, stderr=self.log, cwd=code, env=env)
        mw.wait_mount(self.mp, self.proc)

    def close(self) -> None:
        mw.unmount(self.mp, self.proc)
        self.log.close()


def loop(m: Mount, writers: int, seconds: float, fsync: bool = False) -> tuple[float, float]:
    """(files/s, daemon CPU microseconds per file) of create + write 4 KiB (+ fsync) + close for ``seconds``."""
    batch = (100 if fsync else 400) * writers
    if writers > 1:
        mw.small_files_parallel(m.branch / "warm", batch, writers)
    else:
        mw.small_files(m.branch / "warm", batch, fsync)
    n, k = 0, 0
    c0, t0 = mw.cpu_s(m.proc.pid), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        d = m.branch / f"r{k}"
        if writers > 1:
            mw.small_files_parallel(d, batch, writers)
        else:
            mw.small_files(d, batch, fsync)
        n, k = n + batch, k + 1
    dt, cpu = time.perf_counter() - t0, mw.cpu_s(m.proc.pid) - c0
    return n / dt, cpu * 1e6 / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default="", metavar="DIR", help="another checkout, its compiled modules built")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each timed loop")
    ap.add_argument("--writers", type=int, default=8, help="processes of the concurrent row")
    ap.add_argument("--dir", default=None, help="where to make the repositories (default: a temp dir)")
    ap.add_argument("--fsync", action="store_true", help="a third row: 1 process, an fsync before each close")
    ap.add_argument("--rows", default="", help="only these rows, comma-separated (1p, 8p, fsync)")
    args = ap.parse_args()
    if os.geteuid() != 0 and not shutil.which("fusermount3"):
        raise SystemExit("needs FUSE (fusermount3)")
    codes = {"this": ROOT}
    if args.baseline:
        base = Path(args.baseline).resolve()
        if not (base / "lakefuse" / "__init__.py").exists():
            raise SystemExit(f"{base} is not a lakefuse checkout")
        codes["base"] = base
    kinds = [("1p", 1, False), (f"{args.writers}p", args.writers, False)] + ([("fsync", 1, True)] if args.fsync else [])
    if args.rows:
        kinds = [k for k in kinds if k[0] in args.rows.split(",")] or \
            ap.error(f"--rows {args.rows!r} names none of {', '.join(k for k, _, _ in kinds)}")
    root = Path(tempfile.mkdtemp(prefix="lakefuse-bench-ab-", dir=args.dir))
    rows: dict[str, dict[str, list[tuple[float, float]]]] = {c: {k: [] for k, _, _ in kinds} for c in codes}
    try:
        for pair in range(args.pairs):
            order = list(codes) if pair % 2 == 0 else list(reversed(codes))
            for code in order:
                for kind, writers, fsync in kinds:
                    work = root / f"{code}-{pair}-{kind}"
                    m = Mount(work, codes[code])
                    try:
                        rate, cpu = loop(m, writers, args.seconds, fsync)
                    finally:
                        m.close()
                        shutil.rmtree(work, ignore_errors=True)
                    rows[code][kind].append((rate, cpu))
                    print(f"pair {pair}: {code:4s} {kind:5s}: {rate:7.0f} files/s, "
                          f"daemon CPU {cpu:5.0f} us/file", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out: dict = {}
    for code, by in rows.items():
        for kind, xs in by.items():
            out[f"{code}_{kind}_files_per_s"] = round(statistics.median(r for r, _ in xs))
            out[f"{code}_{kind}_cpu_us_per_file"] = round(statistics.median(c for _, c in xs))
            out[f"{code}_{kind}_runs"] = [round(r) for r, _ in xs]
    if "base" in rows:
        for kind, _, _ in kinds:
            ratios = [a[0] / b[0] for a, b in zip(rows["this"][kind], rows["base"][kind])]
            out[f"ratio_{kind}_this_vs_base"] = round(statistics.median(ratios), 2)
            out[f"ratio_{kind}_by_pair"] = [round(x, 2) for x in ratios]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
