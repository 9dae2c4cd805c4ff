#!/usr/bin/env python3
"""Benchmark of graveler.spark (issue: Spark pipelines), each job beside its single-process path.

On one Spark master (default local[2]), in one run:

* import of N listing entries (Parquet listing -> one commit): entries/s, Spark vs the
  single-process writer over the same listing, and whether the metarange IDs are identical;
  where the Spark time goes (input + break-key pass, range writing, metarange);
* entries_df scan of the imported commit: entries/s, vs iterating the commit in this process;
* diff_df of the imported commit and a changed one (every range differs), vs repo.diff in this
  process with the entries decoded;
* listing of --list-objects objects of an S3 prefix (moto in its own process): the Spark
  delimiter fan-out (graveler.spark.listing) and 8 threads of this process vs one flat listing;
* GC mark over S stored / L live objects: the live set is the entries of a real L-entry commit
  (read from its ranges by the executors), the stored objects are an inventory DataFrame
  (as with an S3 Inventory report: S data/ objects, L of them live); the seconds of each phase;
  and a mark that lists a real namespace of --gc-files small files by hourly slice;
* GC sweep of --gc-sweep objects on S3 (a moto server on 127.0.0.1 started here, in this
  process; the objects are put into its backend directly, as setup): deletes/s of the sweep
  of a mark's report, vs DeleteObjects calls of 1,000 keys from one process over as many objects;
* export of E objects to a local directory: objects/s, vs a copy loop in this process.

    .venv/bin/python scripts/bench/spark.py                       # defaults (see --help)
    .venv/bin/python scripts/bench/spark.py --import 1000000 10000000 --gc-stored 10000000 --gc-live 5000000

Figures are medians of --repeat runs where a run is cheap enough to repeat; the machine is
shared: compare the same-run ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from graveler import Graveler, GravelerConfig, KVConfig  # noqa: E402
from graveler.model import Entry, encode_value  # noqa: E402
from graveler.objects import new_data_address  # noqa: E402
from graveler.spark.entries import entries_df  # noqa: E402
from graveler.spark.export import export  # noqa: E402
from graveler.spark.gc import GCRules, mark, set_rules, sweep  # noqa: E402
from graveler.spark.importer import encode_listing_batch, import_listing, import_records_local  # noqa: E402
from graveler.spark.session import SparkConfig, get_session  # noqa: E402
from graveler.spark.tables import write_metarange_local  # noqa: E402

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}
TEAMS = ["ads", "search", "payments", "ml-features", "growth", "infra", "risk", "maps"]


def listing_table(n: int, seed: int = 0):
    import pyarrow as pa

    keys = [f"{TEAMS[i % 8]}/events/date=2024-{(i // 50000) % 12 + 1:02d}-{(i // 2000) % 28 + 1:02d}/"
            f"part-{(i * 2654435761 + seed) % 2**32:08x}-{i:09d}.snappy.parquet" for i in range(n)]
    return pa.table({
        "key": pa.array(keys, pa.string()),
        "address": pa.array([f"s3://landing-bucket/raw/{k}" for k in keys], pa.string()),
        "size": pa.array([1000 + i % 100000 for i in range(n)], pa.int64()),
        "etag": pa.array([f"{(i * 0x9E3779B97F4A7C15) % 2**128:032x}" for i in range(n)], pa.string()),
        "last_modified": pa.array([1_700_000_000_000_000 + i * 1000 for i in range(n)],
                                  pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    })


def tree_cpu() -> float:
    """CPU seconds used so far by this process and its descendants (the JVM, its Python workers): on a
    shared machine a job's CPU time moves less than its wall time."""
    kids: dict[int, list[tuple[int, int]]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kids.setdefault(int(st[1]), []).append((int(d), sum(int(x) for x in st[11:15])))
    t = os.times()
    total, todo = (t.user + t.system + t.children_user + t.children_system) * os.sysconf("SC_CLK_TCK"), [os.getpid()]
    while todo:
        for pid, ticks in kids.get(todo.pop(), ()):
            total += ticks
            todo.append(pid)
    return total / os.sysconf("SC_CLK_TCK")


class Bench:
    def __init__(self, args):
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="lakefuse-bench-spark-", dir=args.tmp))
        self.g = Graveler(GravelerConfig(home=self.tmp / "home", kv=KVConfig(map_size=1 << 34, sync=False)))
        if args.gc_sweep:  # the AWS environment must be in place before the JVM and its workers start
            os.environ.update(S3_ENV)
            for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
                os.environ.pop(k, None)
        self.spark = get_session(SparkConfig(master=args.master, app_name="lakefuse-bench",
                                             shuffle_partitions=args.shuffle_partitions,
                                             extra=(("spark.driver.memory", args.driver_memory),)))
        self.rows: list[tuple[str, str, str, str]] = []
        self.nrepo = 0

    def repo(self, tag: str):
        self.nrepo += 1
        name = f"b{self.nrepo}-{tag}"
        return self.g.create_repository(name, f"file://{self.tmp}/ns-{name}")

    def report(self, what: str, spark: str, single: str, ratio: str) -> None:
        self.rows.append((what, spark, single, ratio))
        print(f"  {what}: spark {spark} | single {single} | {ratio}", flush=True)

    # ---------------------------------------------------------------- import + scan
    def bench_import(self, n: int) -> None:
        import pyarrow.parquet as pq

        path = self.tmp / f"listing-{n}.parquet"
        t = listing_table(n)
        pq.write_table(t, path)
        print(f"import of {n:,} listing entries (Parquet listing, {path.stat().st_size >> 20} MiB)", flush=True)
        times, cpus, res = [], [], None
        for _ in range(self.args.repeat):
            repo = self.repo("imp")
            df = self.spark.read.parquet(str(path))
            t0, c0 = time.monotonic(), tree_cpu()
            res = import_listing(repo, "main", df, "in/", partitions=self.args.partitions)
            times.append(time.monotonic() - t0)
            cpus.append(tree_cpu() - c0)
        spark_s = statistics.median(times)
        single_s = None
        if n <= self.args.single_max:
            repo1 = self.repo("imp1")
            t0, c0 = time.monotonic(), tree_cpu()
            tbl = pq.read_table(path)
            enc = encode_listing_batch("in/", tbl)  # the compiled codec, as the Spark tasks run it
            t_enc = time.monotonic() - t0
            # Sorted by Arrow and written over the buffers, as the Spark tasks do (no Python tuple per record).
            single = import_records_local(repo1, "main", enc, "in/")
            single_s = time.monotonic() - t0
            single_cpu = tree_cpu() - c0
            same = single.metarange_id == res.metarange_id
            print(f"    single: encode {t_enc:.1f} s, sort+write {single_s - t_enc:.1f} s; {single_cpu:.1f} CPU s",
                  flush=True)
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in res.seconds.items())
        print(f"    spark phases: {phases}; {res.ranges} ranges, {res.parts} parts; "
              f"{statistics.median(cpus):.1f} CPU s (median; the JVM and its Python workers)",
              flush=True)
        self.report(f"import {n:,} entries", f"{n / spark_s:,.0f} entries/s ({spark_s:.1f} s)",
                    f"{n / single_s:,.0f} entries/s ({single_s:.1f} s)" if single_s else "-",
                    (f"x{single_s / spark_s:.2f}, IDs {'identical' if same else 'DIFFER'}") if single_s else "-")
        if single_s and not same:
            raise SystemExit("metarange IDs differ")
        self.scan_repo = repo
        self.scan_n = n

    def bench_scan(self) -> None:
        repo, n = self.scan_repo, self.scan_n
        print(f"entries_df scan of a {n:,}-entry commit", flush=True)
        times = []
        for _ in range(self.args.repeat):
            t0 = time.monotonic()
            cnt = entries_df(self.spark, repo, "main").where("size >= 0").count()
            times.append(time.monotonic() - t0)
            assert cnt == n
        s = statistics.median(times)
        t0 = time.monotonic()
        k = 0
        for _, v in repo.iter_committed("main"):
            Entry.from_value(v)
            k += 1
        single = time.monotonic() - t0
        self.report(f"entries_df scan {n:,}", f"{n / s:,.0f} entries/s ({s:.1f} s)",
                    f"{n / single:,.0f} entries/s ({single:.1f} s)", f"x{single / s:.2f}")

    def bench_diff(self) -> None:
        """diff_df against the single-process diff (repo.diff, entries decoded) of the same two commits: the
        imported commit and one with every 37th entry changed, every 101st removed, every 53rd key added
        beside one (so every range differs)."""
        from graveler.spark.diff import diff_df

        repo, n = self.scan_repo, self.scan_n
        c1 = repo.get_commit("main")
        t0 = time.monotonic()
        recs = []
        for i, (k, v) in enumerate(repo.iter_committed("main")):
            if i % 101 == 0:
                continue
            if i % 37 == 0:
                v = dataclasses.replace(Entry.from_value(v), etag="changed").to_value()
            recs.append((k, encode_value(v)))
            if i % 53 == 0:
                recs.append((k + b".new", encode_value(Entry(f"s3://x/{i}", 1, "added", 1).to_value())))
        mr = write_metarange_local(repo.store, recs, repo.config.range_params)
        c2 = repo.commit_metarange("main", mr, "changed")
        del recs
        print(f"diff of a {n:,}-entry commit and its change (built in {time.monotonic() - t0:.1f} s)", flush=True)
        times = []
        for _ in range(max(3, self.args.repeat)):  # cheap: at least 3, the median
            t0 = time.monotonic()
            cnt = diff_df(self.spark, repo, c1.id, c2.id).where("key is not null").count()
            times.append(time.monotonic() - t0)
        s = statistics.median(times)
        t0 = time.monotonic()
        k = 0
        for d in repo.diff(c1.id, c2.id):
            if d.left is not None:
                Entry.from_value(d.left)
            if d.right is not None:
                Entry.from_value(d.right)
            k += 1
        single = time.monotonic() - t0
        assert cnt == k, (cnt, k)
        self.report(f"diff_df {n:,} ({k:,} diffs)", f"{n / s:,.0f} entries/s ({s:.1f} s)",
                    f"{n / single:,.0f} entries/s ({single:.1f} s)", f"x{single / s:.2f}")

    # ---------------------------------------------------------------- S3 listing (import's first step)
    def moto(self) -> str:
        """A moto S3 server in its own process (its own GIL), on a free loopback port."""
        import socket
        import subprocess

        if getattr(self, "_moto", None) is None:
            with socket.socket() as sk:
                sk.bind(("127.0.0.1", 0))
                port = sk.getsockname()[1]
            moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
            self._moto = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
            self.moto_url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit("moto_server did not start")
                    time.sleep(0.2)
        return self.moto_url

    def bench_listing(self, n: int) -> None:
        """Listing n objects of an S3 prefix (moto in its own process): one flat listing against the
        delimiter fan-out, in Spark tasks (listing_job) and on threads of this process (list_parallel)."""
        from concurrent.futures import ThreadPoolExecutor

        import boto3

        from graveler.objstore import StoreConfig, open_store
        from graveler.spark.importer import listing_job, materialize_listing
        from graveler.spark.listing import Progress, flat_listing, list_parallel

        url = self.moto()
        cfg = StoreConfig(s3_endpoint_url=url, region="us-east-1")
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        bucket = f"list-{n}"
        client.create_bucket(Bucket=bucket)
        keys = [f"{TEAMS[i % 8]}/events/date=2024-{(i // 5000) % 12 + 1:02d}-{(i // 200) % 28 + 1:02d}/"
                f"part-{i:09d}.parquet" for i in range(n)] + [f"top-{i}.txt" for i in range(10)]
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=f"raw/{k}", Body=b"x"), keys))
        print(f"S3 listing of {len(keys):,} objects (moto, own process; put in {time.monotonic() - t0:.0f} s)",
              flush=True)
        uri = f"s3://{bucket}/raw"
        store = open_store(uri, cfg)
        flat_t, par_t, spark_t = [], [], []
        for _ in range(self.args.repeat):
            t0 = time.monotonic()
            flat = flat_listing(store)
            flat_t.append(time.monotonic() - t0)
            t0 = time.monotonic()
            par = list_parallel(store, min_parts=32, threads=8, progress=Progress(uri, interval=2))
            par_t.append(time.monotonic() - t0)
            t0 = time.monotonic()
            prog = Progress(uri, interval=2)
            job = listing_job(self.spark, uri, cfg, progress=prog)
            df, cnt = materialize_listing(job, prog)
            spark_t.append(time.monotonic() - t0)
            got = {r.key for r in df.select("key").collect()}
            df.unpersist()
            assert [o.key for o in par] == [o.key for o in flat] and got == set(keys) and cnt == len(keys)
        f, p, sp = (statistics.median(x) for x in (flat_t, par_t, spark_t))
        m = len(keys)
        print(f"    fan-out: {job.fan_out.calls} delimited listings, {len(job.fan_out.prefixes)} parts in "
              f"{job.tasks} tasks; threads: {m / p:,.0f} objects/s", flush=True)
        self.report(f"list {m:,} S3 objects (fan-out)", f"{m / sp:,.0f} objects/s ({sp:.1f} s)",
                    f"{m / f:,.0f} objects/s ({f:.1f} s, flat)", f"x{f / sp:.2f}")
        self.report(f"list {m:,} S3 objects (threads)", f"{m / p:,.0f} objects/s ({p:.1f} s, 8 threads)",
                    f"{m / f:,.0f} objects/s ({f:.1f} s, flat)", f"x{f / p:.2f}")
        store.close()
        client.close()

    # ---------------------------------------------------------------- gc
    def bench_gc(self, stored: int, live: int) -> None:
        from pyspark.sql import functions as F

        print(f"gc mark over {stored:,} stored / {live:,} live objects (inventory listing)", flush=True)
        repo = self.repo("gc")
        old_ns = 1_600_000_000 * 10**9
        t0 = time.monotonic()
        # The live commit: `live` entries whose RELATIVE addresses are data/ objects (not written: an inventory
        # stands for the listing), committed with the single-process writer.
        addr = [f"data/2020091312/{old_ns + i:019d}{i:016x}" for i in range(stored)]
        recs = [(f"t/{i:010d}".encode(), encode_value(Entry(addr[2 * i], 100, f"{i:032x}", old_ns).to_value()))
                for i in range(live)]
        mr = write_metarange_local(repo.store, recs, repo.config.range_params)
        repo.commit_metarange("main", mr, "live")
        del recs
        build = time.monotonic() - t0
        set_rules(repo, GCRules(7))
        inv = self.spark.range(0, stored, 1, max(2, stored // 500_000)).select(
            F.concat(F.lit("data/2020091312/"), F.lpad((F.col("id") + F.lit(old_ns)).cast("string"), 19, "0"),
                     F.lpad(F.lower(F.hex("id")), 16, "0")).alias("address"),
            F.lit(100).cast("long").alias("size"),
            F.lit(datetime(2020, 9, 13, 12, tzinfo=timezone.utc)).alias("last_modified"))
        times, cpus, m = [], [], None
        for _ in range(self.args.repeat):
            t0, c0 = time.monotonic(), tree_cpu()
            m = mark(self.spark, repo, inventory=inv, dry_run=self.args.gc_dry_run)
            times.append(time.monotonic() - t0)
            cpus.append(tree_cpu() - c0)
        expect = stored - live if stored >= 2 * live else None
        assert expect is None or m.candidates == expect, (m.candidates, expect)
        s = statistics.median(times)
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in m.phases.items())
        print(f"    (built the {live:,}-entry commit in {build:.1f} s; phases: {phases}; {m.ranges_read} ranges)",
              flush=True)
        print(f"    mark runs: {', '.join(f'{t:.1f} s' for t in times)} wall; "
              f"{', '.join(f'{c:.1f} s' for c in cpus)} CPU (driver, JVM and workers)", flush=True)
        # The single-process anchor: the same anti-join as Python sets over the same addresses.
        t0 = time.monotonic()
        livec = {Entry.from_value(v).address for _, v in repo.iter_committed("main")}
        cand = sum(1 for a in addr if a not in livec)
        single = time.monotonic() - t0
        assert cand == m.candidates
        self.report(f"gc mark {stored:,}/{live:,}", f"{s:.1f} s ({m.candidates:,} candidates)",
                    f"{single:.1f} s (python set)", f"x{single / s:.2f}")

    def bench_gc_files(self, files: int) -> None:
        print(f"gc mark listing a real namespace of {files:,} files in hourly slices", flush=True)
        repo = self.repo("gcf")
        base = time.time_ns() - 10 * 86400 * 10**9
        addrs = []
        for i in range(files):
            t = base + (i % 48) * 3600 * 10**9 + i
            a = new_data_address(t)
            p = os.path.join(repo.store.root, a)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(b"x")
            os.utime(p, ns=(t, t))
            addrs.append(a)
        recs = [(f"f/{i:09d}".encode(), encode_value(Entry(a, 1, "x", base).to_value()))
                for i, a in enumerate(addrs[::2])]
        repo.commit_metarange("main", write_metarange_local(repo.store, recs, repo.config.range_params), "live")
        t0 = time.monotonic()
        m = mark(self.spark, repo, dry_run=True)
        s = time.monotonic() - t0
        assert m.candidates == files - len(recs)
        self.report(f"gc mark listing {files:,} files", f"{s:.1f} s ({files / s:,.0f} objects/s)", "-", "-")

    def bench_sweep(self, n: int) -> None:
        """The sweep's deletes/s against S3 (moto), beside bulk deletes from one process."""
        import logging
        import subprocess

        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends
        from moto.server import ThreadedMotoServer

        from graveler.objstore import StoreConfig

        print(f"gc sweep of {n:,} objects on S3 (moto on 127.0.0.1)", flush=True)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # in this process: its backend
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        store_cfg = StoreConfig(s3_endpoint_url=endpoint, region="us-east-1")
        g = Graveler(GravelerConfig(home=self.tmp / "home-s3", kv=KVConfig(map_size=1 << 30, sync=False),
                                    store=store_cfg))
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        bucket = "bench-sweep"
        backend.create_bucket(bucket, "us-east-1")
        base = 1_600_000_000 * 10**9

        def populate(prefix: str) -> list[str]:
            # Straight into moto's backend: a PUT through its HTTP server takes ~10 ms here.
            addrs = [new_data_address(base + i * 10**6) for i in range(n)]
            for a in addrs:
                backend.put_object(bucket, f"{prefix}/{a}", b"x")
            return addrs

        try:
            repo = g.create_repository("sweep", f"s3://{bucket}/ns")
            addrs = populate("ns")
            from pyspark.sql import functions as F

            inv = self.spark.createDataFrame([(a,) for a in addrs], "address string").select(
                "address", F.lit(1).cast("long").alias("size"),
                F.lit(datetime(2020, 9, 13, 12, tzinfo=timezone.utc)).alias("last_modified"))
            m = mark(self.spark, repo, inventory=inv)
            assert m.candidates == n, (m.candidates, n)
            t0 = time.monotonic()
            r = sweep(self.spark, repo, m.run_id)
            s = time.monotonic() - t0
            assert (r.deleted, r.kept, r.failed) == (n, 0, 0), r
            left = sum(1 for k in backend.get_bucket(bucket).keys if k.startswith("ns/data/"))
            assert left == 0, left
            # One process, in a child (the moto server shares this one's GIL): DeleteObjects of 1,000 keys.
            keys = self.tmp / "sweep-keys.txt"
            keys.write_text("\n".join(populate("single")))
            code = ("import sys, time\nfrom graveler.objstore import open_store, StoreConfig\n"
                    f"st = open_store('s3://{bucket}/single', StoreConfig(s3_endpoint_url='{endpoint}', "
                    "region='us-east-1'))\n"
                    f"keys = open(r'{keys}').read().split()\n"
                    "t0 = time.monotonic()\nbad = st.delete_many(keys)\n"
                    "print(time.monotonic() - t0, len(bad))\n")
            out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))).stdout.split()
            single, bad = float(out[0]), int(out[1])
            assert bad == 0 and not any(k.startswith("single/") for k in backend.get_bucket(bucket).keys)
            phases = ", ".join(f"{k} {v:.1f} s" for k, v in r.phases.items())
            print(f"    (mark {m.seconds:.1f} s; sweep {r.seconds:.1f} s: {phases})", flush=True)
            self.report(f"gc sweep {n:,} on moto", f"{n / s:,.0f} deletes/s ({s:.1f} s)",
                        f"{n / single:,.0f} deletes/s ({single:.1f} s)", f"x{single / s:.2f}")
        finally:
            g.close()
            server.stop()

    # ---------------------------------------------------------------- export
    def bench_export(self, n: int) -> None:
        print(f"export of {n:,} objects (4 KiB each) to a local directory", flush=True)
        repo = self.repo("exp")
        data = os.urandom(4096)
        etag = hashlib.md5(data).hexdigest()
        recs = []
        for i in range(n):
            a = new_data_address()
            repo.store.put(a, data)
            recs.append((f"e/{i % 100:02d}/{i:08d}.bin".encode(),
                         encode_value(Entry(a, len(data), etag, time.time_ns()).to_value())))
        repo.commit_metarange("main", write_metarange_local(repo.store, recs, repo.config.range_params), "objs")
        dest = self.tmp / "export-spark"
        t0 = time.monotonic()
        r = export(self.spark, repo, "main", str(dest), partitions=self.args.partitions)
        s = time.monotonic() - t0
        assert r.copied == n
        # The single-process path: the same copies in one loop.
        from graveler.objstore import open_store

        out = open_store(str(self.tmp / "export-single"))
        t0 = time.monotonic()
        for k, v in repo.iter_committed("main"):
            out.put(k.decode(), repo.store.get(Entry.from_value(v).address))
        single = time.monotonic() - t0
        self.report(f"export {n:,} objects", f"{n / s:,.0f} objects/s ({s:.1f} s)",
                    f"{n / single:,.0f} objects/s ({single:.1f} s)", f"x{single / s:.2f}")

    def close(self) -> None:
        if getattr(self, "_moto", None) is not None:
            self._moto.terminate()
            self._moto.wait()
        self.spark.stop()
        self.g.close()
        if not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--import", dest="imports", type=int, nargs="*", default=[1_000_000],
                    help="listing sizes to import (default 1,000,000)")
    ap.add_argument("--single-max", type=int, default=2_000_000, help="skip the single-process import above this")
    ap.add_argument("--list-objects", type=int, default=30_000,
                    help="S3 objects (moto) to list flat vs by delimiter fan-out (0: skip)")
    ap.add_argument("--gc-stored", type=int, default=2_000_000)
    ap.add_argument("--gc-live", type=int, default=1_000_000)
    ap.add_argument("--gc-files", type=int, default=50_000, help="files for the real-listing mark (0: skip)")
    ap.add_argument("--gc-dry-run", action="store_true", help="mark without writing the report")
    ap.add_argument("--gc-sweep", type=int, default=200_000, help="objects the S3 (moto) sweep deletes (0: skip)")
    ap.add_argument("--export", type=int, default=100_000, help="objects to export (0: skip)")
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--shuffle-partitions", type=int, default=4)
    ap.add_argument("--driver-memory", default="4g", help="the JVM heap (local mode runs executors in the driver)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--tmp", default=None, help="where to put the namespaces (default: the system temp dir)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if args.list_objects:  # before Spark starts: the executors inherit the environment
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                          AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                          AWS_EC2_METADATA_DISABLED="true")
    b = Bench(args)
    print(f"master {args.master}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    try:
        for n in args.imports:
            b.bench_import(n)
        if args.imports:
            b.bench_scan()
            b.bench_diff()
        if args.list_objects:
            b.bench_listing(args.list_objects)
        if args.gc_stored:
            b.bench_gc(args.gc_stored, args.gc_live)
        if args.gc_files:
            b.bench_gc_files(args.gc_files)
        if args.gc_sweep:
            b.bench_sweep(args.gc_sweep)
        if args.export:
            b.bench_export(args.export)
    finally:
        b.close()
    print()
    print(f"{'what':<34} {'spark':<40} {'single process':<36} ratio")
    for r in b.rows:
        print(f"{r[0]:<34} {r[1]:<40} {r[2]:<36} {r[3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
