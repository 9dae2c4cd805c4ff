#!/usr/bin/env python3
"""Object-store throughput: the local store and S3 (moto on loopback) against the raw disk.

The "disk" column is the physical limit: a plain ``open()`` write (with fsync,
as the local store does) and read of a file in the same directory.  Reads of a
file just written come from the page cache, for the disk and the stores alike.
The moto server runs in this process, so client and server share one GIL:
its figures are a floor for what a real S3 endpoint on loopback would give.

    /work/venv/bin/python scripts/bench/objstore.py
    /work/venv/bin/python scripts/bench/objstore.py --size-mib 64 --reps 5 --backends local
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Callable

MiB = 1 << 20


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_rate(reps: int, amount: float, fn: Callable[[int], object]) -> float:
    """Median of amount/seconds over ``reps`` runs of fn(rep)."""
    return statistics.median(amount / timed(lambda: fn(rep)) for rep in range(reps))


class Disk:
    """The physical limit: plain files through open()."""

    name = "disk"

    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, exist_ok=True)

    def _p(self, key: str) -> str:
        return os.path.join(self.root, key.replace("/", "_"))

    def put(self, key: str, data: bytes) -> None:
        with open(self._p(key), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def get(self, key: str) -> bytes:
        with open(self._p(key), "rb") as f:
            return f.read()

    def close(self) -> None:
        pass


def bench(store, args, big: bytes, small: bytes) -> dict[str, float]:
    n = args.small_count
    size_mib = len(big) / MiB
    out = {}
    out["put MiB/s"] = median_rate(args.reps, size_mib, lambda r: store.put(f"big/{r}", big))
    out["get MiB/s"] = median_rate(args.reps, size_mib, lambda r: store.get(f"big/{r}"))

    def put_small(rep: int) -> None:
        for i in range(n):
            store.put(f"small/{rep}/{i}", small)

    def get_small(rep: int) -> None:
        for i in range(n):
            store.get(f"small/{rep}/{i}")

    out["small put ops/s"] = median_rate(args.reps, n, put_small)
    out["small get ops/s"] = median_rate(args.reps, n, get_small)
    return out


def start_moto():
    from moto.server import ThreadedMotoServer
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    for name, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
                        "AWS_SHARED_CREDENTIALS_FILE": os.devnull}.items():
        os.environ[name] = value
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=32, help="size of the large object (default 32)")
    ap.add_argument("--small-kib", type=int, default=4, help="size of a small object (default 4)")
    ap.add_argument("--small-count", type=int, default=200, help="small objects per repetition (default 200)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions; medians are printed (default 3)")
    ap.add_argument("--backends", default="local,s3", help="comma-separated: local,s3 (default both)")
    ap.add_argument("--dir", default=None, help="scratch directory on the disk to measure (default: a temp dir)")
    args = ap.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    if not set(backends) <= {"local", "s3"}:
        ap.error("--backends takes local and/or s3")

    from graveler.objstore import LocalStore, StoreConfig
    big = os.urandom(args.size_mib * MiB)
    small = os.urandom(args.small_kib * 1024)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="objstore-bench-") as scratch:
        print(f"scratch: {scratch}; large object {args.size_mib} MiB, small {args.small_kib} KiB "
              f"x {args.small_count}, median of {args.reps}", flush=True)
        results["disk"] = bench(Disk(os.path.join(scratch, "disk")), args, big, small)
        if "local" in backends:
            results["local"] = bench(LocalStore(os.path.join(scratch, "local")), args, big, small)
        if "s3" in backends:
            from graveler.objstore.s3 import S3Store

            server, endpoint = start_moto()
            try:
                import boto3

                bucket = f"bench-{uuid.uuid4().hex[:12]}"
                boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
                store = S3Store(bucket, "", StoreConfig(s3_endpoint_url=endpoint, region="us-east-1"))
                results["s3 (moto)"] = bench(store, args, big, small)
                store.close()
            finally:
                server.stop()

    columns = list(results)
    metrics = list(results["disk"])
    width = 16
    print(f"{'':18}" + "".join(f"{c:>{width}}" for c in columns) + "".join(
        f"{c + '/disk':>{width}}" for c in columns[1:]))
    for m in metrics:
        disk = results["disk"][m]
        row = f"{m:18}" + "".join(f"{results[c][m]:>{width}.1f}" for c in columns)
        row += "".join(f"{results[c][m] / disk:>{width}.3g}" for c in columns[1:])
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
