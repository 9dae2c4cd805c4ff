#!/usr/bin/env python3
"""The daemon's memory after listing one directory of each of many commits, with and without
the inode bound (``LAKEFUSE_MAX_INODES``, lakefuse.mount.trim).

A repository of ``--files`` files (``--dir-files`` per directory, entries with ~240 bytes of
metadata each, as real ones carry) gets ``--commits`` commits, each changing one file; a fresh
mount then lists one directory of each commit (``ls``), and the daemon's anonymous and
file-backed resident memory (``RssAnon``, ``RssFile`` of /proc/PID/status) and its inode count
(``.lakefuse/stats``) are printed, once unbounded (``LAKEFUSE_MAX_INODES=0``) and once with
``--bound``, in the same run. The kernel holds every listed name, so an unbounded daemon keeps
an inode for each; the bound asks the kernel to drop names of files of the oldest commit trees.

    .venv/bin/python scripts/bench/mount_memory.py                     # 600 commits, bound 50,000
    .venv/bin/python scripts/bench/mount_memory.py --commits 200 --bound 20000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mount_write import unmount, wait_mount  # noqa: E402  (scripts/bench: sibling scripts)


def make_repo(home: Path, ns: Path, files: int, per_dir: int, commits: int) -> list[str]:
    from graveler import Graveler, GravelerConfig
    from graveler.model import Entry

    g = Graveler(GravelerConfig(home=home))
    r = g.create_repository("mem", f"file://{ns}")
    now = time.time_ns()

    def entry(i: int, v: int = 0) -> Entry:
        return Entry(address=f"data/x/{i}-{v}", size=10, etag=f"{i:024x}{v:08x}", last_modified_ns=now,
                     metadata={"user.pad": os.urandom(120).hex()})

    r.stage_many("main", [(f"big/d{i // per_dir:03d}/f{i:05d}", entry(i)) for i in range(files)])
    r.commit("main", "base")
    ids = []
    for k in range(commits):
        r.stage("main", "big/d000/v.txt", entry(10 ** 6, k))
        ids.append(r.commit("main", f"c{k}").id)
    g.close()
    return ids


def status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def run(work: Path, ids: list[str], bound: int, directory: str) -> dict:
    mp, cache = work / "mnt", work / f"cache-{bound}"
    mp.mkdir(exist_ok=True)
    env = {**os.environ, "LAKEFUSE_MAX_INODES": str(bound)}
    proc = subprocess.Popen([sys.executable, "-m", "lakefuse", "--home", str(work / "home"), "mount", "lakefs://mem",
                             str(mp), "-f", "--cache-dir", str(cache)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(work / f"mount-{bound}.log", "wb"))
    try:
        wait_mount(mp, proc)
        t0 = time.perf_counter()
        for cid in ids:
            os.listdir(mp / cid / directory)  # (as ls: the kernel keeps every name it listed)
            [os.stat(mp / cid / directory / n) for n in os.listdir(mp / cid / directory)]
        seconds = time.perf_counter() - t0
        time.sleep(1.0)  # (a round of the stamp watch)
        stats = json.loads((mp / ".lakefuse" / "stats").read_bytes())
        return {"bound": bound, "seconds": round(seconds, 1), "inodes": stats["inodes"],
                "handed_back": stats.get("inodes_handed_back", 0), **status(proc.pid)}
    finally:
        unmount(mp, proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=600)
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--dir-files", type=int, default=500)
    ap.add_argument("--bound", type=int, default=50_000)
    ap.add_argument("--workdir", help="where to put the data (default: a temp dir, removed)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakefuse-mem-", dir=args.workdir))
    try:
        ids = make_repo(work / "home", work / "ns", args.files, args.dir_files, args.commits)
        rows = [run(work, ids, 0, "big/d030"), run(work, ids, args.bound, "big/d030")]
        for r in rows:
            print(f"  bound {r['bound'] or 'none':>8}: {r['inodes']:>8,} inodes ({r['handed_back']:,} handed back), "
                  f"RssAnon {r['RssAnon'] / 1e6:,.0f} MB, RssFile {r['RssFile'] / 1e6:,.0f} MB, listing {r['seconds']} s")
        print(f"  RssAnon bounded / unbounded: {rows[1]['RssAnon'] / rows[0]['RssAnon']:.2f}")
        print(json.dumps({"commits": args.commits, "rows": rows}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
