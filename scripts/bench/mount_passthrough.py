#!/usr/bin/env python3
"""Cold sequential read of a big committed object of a local store: through the mount with
FUSE passthrough, through the mount without it (``LAKEFUSE_PASSTHROUGH=0``: every 1 MiB
read a FUSE request the daemon answers), and from the object file directly.

Each run mounts afresh and drops the object file's pages (posix_fadvise DONTNEED) before
each read; the three are read in a rotating order, ``--reps`` times; medians and same-run
ratios are printed as JSON. The mount's ``.lakefuse/stats`` must show the path it claims
(passthrough opens with it on, none with it off).

    .venv/bin/python scripts/bench/mount_passthrough.py              # 1 GiB, 5 runs
    .venv/bin/python scripts/bench/mount_passthrough.py --big-mib 256 --reps 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mount_read import MiB, LakefuseMount, drop_file_cache, log, big_file_repo, med, read_file, timed  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--work", default=None, help="a directory for the data (default: a temporary one, removed)")
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="lakefuse-bench-passthru-"))
    try:
        home = work / "home"
        obj = big_file_repo(work, args.big_mib, tag="v1")
        size = args.big_mib * MiB
        mp = work / "mnt"
        runs: dict[str, list[float]] = {"passthrough": [], "daemon": [], "direct": []}

        def through_mount(kind: str) -> float:
            env = {"LAKEFUSE_PASSTHROUGH": "1" if kind == "passthrough" else "0"}
            with LakefuseMount(home, "bench", mp, env=env) as m:
                drop_file_cache(obj)
                secs = timed(lambda: read_file(mp / "v1" / "big.bin"))
                st = m.stats()
                served = st.get("opens_passthrough", 0)
                if (kind == "passthrough") != (served > 0):
                    raise SystemExit(f"{kind}: the mount says passthrough {st.get('passthrough')!r}, "
                                     f"{served} passthrough opens")
            return size / secs

        def direct() -> float:
            drop_file_cache(obj)
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
            "passthrough_vs_direct": round(m["passthrough"] / m["direct"], 2),
            "daemon_vs_direct": round(m["daemon"] / m["direct"], 2),
            "passthrough_vs_daemon": round(m["passthrough"] / m["daemon"], 2),
        }
        print(json.dumps(out, indent=2))
        return 0
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
