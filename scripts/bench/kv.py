#!/usr/bin/env python3
"""Refs and staging on LMDB and on PostgreSQL, side by side in one run.

For each KV backend (LMDB under a home; PostgreSQL: a throwaway cluster started for
the run, fsync, full page writes and synchronous commit ON, so a durable write is
really on disk before it is acknowledged):

* staged writes/s by 1 and by ``--procs`` writer processes (each running ``--threads``
  writer threads, as a mount daemon serves concurrent closes): one ``Repository.stage``
  per object, acknowledged durable, batched with concurrent writers by group commit;
* the mount's save of a closed file (``Repository.stage_stamped``, not durable: the mount's KV
  flush comes later) from one thread, without and with the check that the branch is still the
  one the file was opened on (``born``: one more KV read in the transaction), alternating;
* KV point gets/s (``Store.get`` of a staged key: one statement on PostgreSQL) and
  ``Repository.get`` of staged paths/s, by 1 and by ``--procs`` processes;
* a recursive listing of a branch of ``--list-entries`` committed entries with 10% of
  them staged over it (entries/s);
* commit of 1 / 10,000 / ``--list-entries`` staged changes (seconds);
* cross-host visibility (PostgreSQL only): two ``lakefuse mount -f`` daemons with separate
  ``$LAKEFUSE_HOME`` on the same server; B stats a name (not there yet), then a file of that
  name is written and closed through A, and ``os.stat`` is polled on B (every 2 ms) until it
  appears: from close() returning on A to B seeing it; p50 / p99 over ``--samples``.

Figures are medians over ``--reps``. Peers printed beside them: LMDB measured in the same
run, and lakeFS's sizing guide for its PostgreSQL KV (7,595 writes/s and 10,852 reads/s on
a dedicated 8-vCPU RDS instance). Targets for PostgreSQL on a 2-core machine: staged
writes >= 8,000/s with 8 writer processes, KV point gets >= 11,000/s (both a server's
aggregate throughput, as lakeFS's figures are: the 8-process rows; one process doing one
get at a time measures a round trip's latency instead), commit of 100k staged <= 3 s,
cross-host visibility p99 <= 1 s.

    .venv/bin/python scripts/bench/kv.py
    .venv/bin/python scripts/bench/kv.py --quick
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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from graveler import Graveler, GravelerConfig, kv  # noqa: E402
from graveler.model import Entry  # noqa: E402
from graveler.repository import ANY_BIRTH  # noqa: E402

LAKEFS_WRITES = 7_595  # lakeFS sizing guide, PostgreSQL KV on a dedicated 8-vCPU RDS instance
LAKEFS_READS = 10_852
TARGETS = {"writes": 8_000, "gets": 11_000, "commit": 3.0, "p99": 1.0}


def entry(i: int, version: int = 0) -> Entry:
    return Entry(address=f"data/gk{i:012x}/v{version}", size=1000 + i % 5000, etag=f"{(i * 31 + version):032x}",
                 last_modified_ns=1_700_000_000_000_000_000 + i)


def path(i: int) -> str:
    return f"datasets/events/day={i % 28 + 1:02d}/part-{i:08d}.parquet"


def graveler(home: str, url: str) -> Graveler:
    return Graveler(GravelerConfig.from_home(home, kv_url=url))


# -- worker processes -------------------------------------------------------------------


def worker(spec: dict) -> None:
    """One process of a concurrent phase: set up, say ``ready``, wait for ``go``, work for
    ``seconds``, print ``{"ops": n, "s": elapsed}``."""
    g = graveler(spec["home"], spec["url"])
    repo = g.repository(spec["repo"])
    branch, mode, threads = spec["branch"], spec["mode"], spec["threads"]
    if mode == "stage":
        def op_factory(t):
            n = [0]
            base = spec["id"] * 10_000_000 + t * 1_000_000

            def op():
                n[0] += 1
                repo.stage(branch, f"w/{base + n[0]:09d}", entry(base + n[0]))
            return op
    elif mode in ("save", "saveborn"):
        born = repo.branch_born(branch) if mode == "saveborn" else ANY_BIRTH

        def op_factory(t):
            n = [0]
            base = spec["id"] * 10_000_000 + t * 1_000_000

            def op():
                n[0] += 1
                repo.stage_stamped(branch, [(f"s/{base + n[0]:09d}", entry(base + n[0]))], False, born)
            return op
    else:
        staged = [item.path for item in repo.list(branch, "w/", "")][:20_000]
        if not staged:
            raise SystemExit("no staged paths to read")
        if mode == "kvget":
            store = g.kv.open(spec["repo"], create=False)
            token = repo.get_branch(branch).staging_token
            keys = [token.encode() + b"\0" + p for p in staged]

            def op_factory(t):
                i = [t * 7919]

                def op():
                    i[0] += 1
                    if store.get(kv.STAGING, keys[i[0] % len(keys)]) is None:
                        raise SystemExit("a staged key is missing")
                return op
        else:
            def op_factory(t):
                i = [t * 7919]

                def op():
                    i[0] += 1
                    repo.get(branch, staged[i[0] % len(staged)])
                return op
    ops = [op_factory(t) for t in range(threads)]
    counts = [0] * threads
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    cpu0 = time.process_time()
    deadline = start + spec["seconds"]
    ends = [0.0] * threads

    def run(t):
        op = ops[t]
        n = 0
        while time.perf_counter() < deadline:
            op()
            n += 1
        counts[t] = n
        ends[t] = time.perf_counter()

    ths = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    pg = sys.modules.get("graveler.kv.postgres")
    retries = pg.PgStore.stats_retries if pg else 0
    print(json.dumps({"ops": sum(counts), "s": max(ends) - start, "retries": retries,
                      "cpu": time.process_time() - cpu0}), flush=True)
    g.close()


def concurrent(spec: dict, procs: int) -> float:
    """Ops/s of ``procs`` worker processes doing ``spec`` at once (all start together)."""
    ps = []
    for i in range(procs):
        s = json.dumps({**spec, "id": i})
        ps.append(subprocess.Popen([sys.executable, __file__, "--worker", s], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, cwd=ROOT))
    try:
        for p in ps:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"worker failed before starting: {line!r}")
        for p in ps:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in ps:
            results.append(json.loads(p.stdout.readline()))
            p.wait(60)
            if p.returncode:
                raise RuntimeError(f"worker exited with {p.returncode}")
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()
    concurrent.retries = sum(r["retries"] for r in results)
    concurrent.cpu_per_op = sum(r["cpu"] for r in results) / max(1, sum(r["ops"] for r in results))
    return sum(r["ops"] for r in results) / max(r["s"] for r in results)


# -- the phases of one backend ----------------------------------------------------------------


def median_rate(fn, reps: int) -> float:
    return statistics.median(fn() for _ in range(reps))


def bench_backend(name: str, url: str, root: Path, args, out: dict) -> None:
    home = root / f"home-{name}"
    g = graveler(str(home), url)
    repo = g.create_repository("bench", f"file://{root}/ns-{name}")
    res = out[name] = {}

    def row(key, value, text):
        res[key] = value
        print(f"  [{name}] {text}", flush=True)

    base = {"home": str(home), "url": url, "repo": "bench", "seconds": args.seconds}
    for procs in (1, args.procs):
        rates, cpus = [], []
        for rep in range(args.reps):
            b = f"w{procs}-{rep}"
            repo.create_branch(b, "main")
            rates.append(concurrent({**base, "branch": b, "mode": "stage", "threads": args.threads}, procs))
            cpus.append(concurrent.cpu_per_op)
        row(f"stage{procs}", statistics.median(rates),
            f"staged writes, {procs} process(es) x {args.threads} threads: {statistics.median(rates):,.0f}/s "
            f"(client CPU {statistics.median(cpus) * 1e6:,.0f} µs a write)")
    plain, checked = [], []
    for rep in range(args.reps):  # (alternating: the pair shares the machine's moment)
        for mode, acc in (("save", plain), ("saveborn", checked)):
            b = f"{mode}-{rep}"
            repo.create_branch(b, "main")
            acc.append(concurrent({**base, "branch": b, "mode": mode, "threads": 1}, 1))
    row("save1", statistics.median(plain), f"the mount's save, 1 thread: {statistics.median(plain):,.0f}/s")
    row("saveborn1", statistics.median(checked),
        f"the same with the birth check: {statistics.median(checked):,.0f}/s "
        f"({statistics.median(c / p for c, p in zip(checked, plain)):.2f} of without, median of the pairs)")
    b = f"w{args.procs}-0"
    for mode, label in (("kvget", "KV point gets (Store.get)"), ("repoget", "Repository.get of staged paths")):
        for procs in (1, args.procs):
            r = median_rate(lambda: concurrent({**base, "branch": b, "mode": mode, "threads": 1}, procs), args.reps)
            row(f"{mode}{procs}", r, f"{label}, {procs} process(es): {r:,.0f}/s")

    # commits of 1 / 10k / N staged changes; the N-entry commit on top of an empty main then
    # carries the listing: N committed entries with 10% staged over them
    n = args.list_entries
    for count in (1, 10_000, n):
        times = []
        for rep in range(args.reps):
            b = f"c{count}-{rep}"
            repo.create_branch(b, "main")
            items = [(path(i), entry(i, rep)) for i in range(count)]
            for lo in range(0, count, 1000):
                repo.stage_many(b, items[lo:lo + 1000])
            t = time.perf_counter()
            repo.commit(b, f"{count} changes")
            times.append(time.perf_counter() - t)
        row(f"commit{count}", statistics.median(times),
            f"commit of {count:,} staged change(s): {statistics.median(times):.3f} s")
    b = f"c{n}-0"
    over = [(path(i), entry(i, 99)) for i in range(0, n, 10)]
    for lo in range(0, len(over), 1000):
        repo.stage_many(b, over[lo:lo + 1000])
    times = []
    for _ in range(args.reps):
        t = time.perf_counter()
        got = sum(1 for _ in repo.list(b, "", ""))
        times.append(time.perf_counter() - t)
    assert got == n, got
    r = n / statistics.median(times)
    row("list", r, f"listing {n:,} entries ({len(over):,} staged over committed): {r:,.0f} entries/s")
    g.close()


def visibility(url: str, root: Path, samples: int) -> list[float] | str:
    """Seconds from close() on host A to os.stat() succeeding on host B, per sample."""
    sys.path.insert(0, str(ROOT))
    from tests.mount_testutil import FUSE_AVAILABLE, MountProc, lakefuse_cmd

    if not FUSE_AVAILABLE:
        return "no /dev/fuse or fusermount3 here"
    env = {**os.environ, "LAKEFUSE_KV": url}
    ha, hb = root / "host-a", root / "host-b"
    subprocess.run(lakefuse_cmd(ha, "repo", "create", "lakefs://vis", "--storage", f"file://{root}/ns-vis",
                                "--allow-local-storage"), check=True,  # both "hosts" are this machine
                   capture_output=True, env=env, cwd=ROOT)
    ma, mb = root / "mnt-a", root / "mnt-b"
    a = MountProc(ha, "vis", ma, log_dir=root, env={"LAKEFUSE_KV": url})
    b = MountProc(hb, "vis", mb, log_dir=root, env={"LAKEFUSE_KV": url})
    lat: list[float] = []
    try:
        a.start()
        b.start()
        (ma / "main" / "vis").mkdir()
        deadline = time.monotonic() + 30
        while not (mb / "main" / "vis").exists():
            if time.monotonic() > deadline:
                return "host B never saw host A's directory within 30 s"
            time.sleep(0.01)
        for i in range(samples):
            target = mb / "main" / "vis" / f"f{i}"
            try:  # B looks first (a reader waiting for the file): its kernel may now cache "no such file"
                os.stat(target)
                return f"host B saw f{i} before host A wrote it"
            except FileNotFoundError:
                pass
            with open(ma / "main" / "vis" / f"f{i}", "wb") as f:
                f.write(b"x" * 100)
            t = time.perf_counter()  # close returned: A acknowledged the write
            while True:
                try:
                    os.stat(target)
                    break
                except FileNotFoundError:
                    if time.perf_counter() - t > 10:
                        break
                    time.sleep(0.002)
            lat.append(time.perf_counter() - t)
    finally:
        a.stop()
        b.stop()
    return lat


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short run: 1 rep, 1 s phases, 20k-entry listing")
    ap.add_argument("--procs", type=int, default=8, help="writer / reader processes of the concurrent rows")
    ap.add_argument("--threads", type=int, default=8, help="writer threads per writer process")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each throughput phase")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--list-entries", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=50, help="cross-host visibility samples")
    ap.add_argument("--backends", default="lmdb,postgres")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if args.quick:
        args.reps, args.seconds, args.list_entries, args.samples = 1, 1.0, 20_000, 20
    from tests.pg_testutil import PgCluster, unavailable_reason

    root = Path(tempfile.mkdtemp(prefix="lakefuse-bench-kv-"))
    os.chmod(root, 0o755)
    out: dict = {}
    cluster = None
    try:
        backends = args.backends.split(",")
        vis: list[float] | str = "not run"
        for name in backends:
            if name == "lmdb":
                print("LMDB ...", flush=True)
                bench_backend("lmdb", "lmdb", root, args, out)
            elif name == "postgres":
                why = unavailable_reason()
                if why:
                    print(f"PostgreSQL skipped: {why}")
                    continue
                cluster = PgCluster(durable=True)
                print("PostgreSQL (throwaway cluster, fsync on, synchronous_commit on) ...", flush=True)
                bench_backend("postgres", cluster.url, root, args, out)
                vis = visibility(cluster.url, root, args.samples)
                if isinstance(vis, list):
                    print(f"  [postgres] cross-host visibility: p50 {pct(vis, 50) * 1000:.0f} ms, "
                          f"p99 {pct(vis, 99) * 1000:.0f} ms", flush=True)
        report(args, out, vis)
        return 0
    finally:
        if cluster is not None:
            cluster.destroy()
        shutil.rmtree(root, ignore_errors=True)


def report(args, out: dict, vis) -> None:
    lm, pg = out.get("lmdb", {}), out.get("postgres", {})
    p = args.procs
    print(f"\nlakefuse KV backends, {os.cpu_count()} cores (load average now {os.getloadavg()[0]:.1f}: other jobs "
          f"share them); medians of {args.reps}; writers: processes x {args.threads} threads; PostgreSQL "
          "durable (fsync, synchronous_commit on)")

    def ratio(key):
        return f"{pg[key] / lm[key]:.2f}" if key in pg and key in lm and lm[key] else "-"

    def fmt(d, key, unit):
        if key not in d:
            return "-"
        return f"{d[key]:,.3f} s" if unit == "s" else f"{d[key]:,.0f}/s"

    def verdict(key, target, higher=True):
        if key not in pg:
            return ""
        ok = pg[key] >= target if higher else pg[key] <= target
        return f"target {'>=' if higher else '<='} {target:,}{'' if higher else ' s'}: {'met' if ok else 'NOT met'}"

    rows = [
        ("staged writes, 1 process", "stage1", "/s", "", ""),
        (f"staged writes, {p} processes", f"stage{p}", "/s", f"lakeFS guide {LAKEFS_WRITES:,}/s",
         verdict(f"stage{p}", TARGETS["writes"])),
        ("the mount's save, 1 thread", "save1", "/s", "", ""),
        ("the same with the birth check", "saveborn1", "/s", "one more KV read in the save's transaction", ""),
        ("KV point gets, 1 process", "kvget1", "/s", "one get at a time: a round trip's latency (the targets and "
         "lakeFS's figures are a server's aggregate throughput)", ""),
        (f"KV point gets, {p} processes", f"kvget{p}", "/s", f"lakeFS guide {LAKEFS_READS:,}/s",
         verdict(f"kvget{p}", TARGETS["gets"])),
        ("Repository.get staged, 1 process", "repoget1", "/s", "", ""),
        (f"Repository.get staged, {p} processes", f"repoget{p}", "/s", "", ""),
        (f"listing {args.list_entries:,} entries", "list", "/s", "", ""),
        ("commit of 1 staged", "commit1", "s", "", ""),
        ("commit of 10,000 staged", "commit10000", "s", "", ""),
        (f"commit of {args.list_entries:,} staged", f"commit{args.list_entries}", "s", "",
         verdict(f"commit{args.list_entries}", TARGETS["commit"], higher=False) if args.list_entries >= 100_000
         else "(target is for 100,000)"),
    ]
    w = max(len(r[0]) for r in rows)
    print(f"| {'':{w}} | {'LMDB':>12} | {'PostgreSQL':>12} | PG/LMDB | peer / target")
    for label, key, unit, peer, target in rows:
        print(f"| {label:{w}} | {fmt(lm, key, unit):>12} | {fmt(pg, key, unit):>12} | {ratio(key):>7} | "
              f"{'; '.join(x for x in (peer, target) if x)}")
    if isinstance(vis, list) and vis:
        p99 = pct(vis, 99)
        print(f"| {'cross-host visibility':{w}} | {'n/a':>12} | p50 {pct(vis, 50) * 1000:,.0f} ms, p99 "
              f"{p99 * 1000:,.0f} ms over {len(vis)} samples | target p99 <= 1 s: "
              f"{'met' if p99 <= TARGETS['p99'] else 'NOT met'}")
    else:
        print(f"| {'cross-host visibility':{w}} | {'n/a':>12} | {vis}")


if __name__ == "__main__":
    raise SystemExit(main())
