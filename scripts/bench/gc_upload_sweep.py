#!/usr/bin/env python3
"""What GC's sweep of killed writers' open multipart uploads (graveler.objstore.s3_uploads) costs
on an S3 namespace, against the least a client can do: list the uploads and abort each.

On a moto server on 127.0.0.1 (over HTTP, as every S3 test here), ``--uploads`` open uploads
of one small part each under the namespace (and as many outside it, which both must leave
alone) are aborted, ``--reps`` times each way, alternately, from a fresh set each time:

* the sweep: ``sweep_uploads(store, cutoff, now=+2 h)`` -- every upload's parts listed first
  (its last activity: a writer that is alive keeps its upload);
* the floor: one boto3 paginator over ``list_multipart_uploads`` of the prefix and one
  ``abort_multipart_upload`` per upload, as many at once as the sweep's threads, no check at
  all (what a lifecycle rule does server-side, client-side).

Prints the medians (uploads aborted per second) and the ratio (the sweep's time / the
floor's): the price of the last-activity check, one ``list_parts`` per upload.

    .venv/bin/python scripts/bench/gc_upload_sweep.py                  # 300 uploads, 3 reps
    .venv/bin/python scripts/bench/gc_upload_sweep.py --uploads 1000 --reps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import s3peers  # noqa: E402  (the bench's S3 servers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=300, help="open uploads under the namespace per repetition")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    import boto3

    from graveler.objstore import StoreConfig, open_store
    from graveler.objstore.s3_uploads import THREADS, sweep_uploads

    with tempfile.TemporaryDirectory(prefix="gc-upload-sweep-") as tmp:
        srv, endpoint, creds = s3peers.start_server("moto", Path(tmp))
        try:
            os.environ.update({**creds, "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
            client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
            client.create_bucket(Bucket="bench")
            store = open_store("s3://bench/ns", StoreConfig(s3_endpoint_url=endpoint, region="us-east-1"))

            def fill(rep: int) -> None:
                def one(i: int) -> None:
                    for key in (f"ns/data/r{rep}/u{i:06d}", f"outside/r{rep}/u{i:06d}"):
                        up = client.create_multipart_upload(Bucket="bench", Key=key)["UploadId"]
                        client.upload_part(Bucket="bench", Key=key, UploadId=up, PartNumber=1, Body=b"p" * 100)

                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(one, range(args.uploads)))

            def floor() -> int:
                def abort(up) -> None:
                    client.abort_multipart_upload(Bucket="bench", Key=up["Key"], UploadId=up["UploadId"])

                n = 0
                with ThreadPoolExecutor(THREADS) as pool:
                    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket="bench", Prefix="ns/"):
                        ups = page.get("Uploads") or ()
                        list(pool.map(abort, ups))
                        n += len(ups)
                return n

            def ours() -> int:
                res = sweep_uploads(store, cutoff=time.time() + 60, now=time.time() + 7200)
                assert res.failed == 0
                return res.files

            times: dict[str, list[float]] = {"sweep": [], "floor": []}
            for rep in range(args.reps):
                for name, fn in (("sweep", ours), ("floor", floor)) if rep % 2 == 0 else (("floor", floor),
                                                                                         ("sweep", ours)):
                    fill(len(times["sweep"]) + len(times["floor"]))
                    t0 = time.perf_counter()
                    n = fn()
                    times[name].append(time.perf_counter() - t0)
                    assert n == args.uploads, f"{name} aborted {n} of {args.uploads}"
            left = client.list_multipart_uploads(Bucket="bench").get("Uploads") or ()
            assert all(u["Key"].startswith("outside/") for u in left), "an upload outside the namespace went"
            store.close()
        finally:
            srv.terminate()
            srv.wait(10)
    s, f = statistics.median(times["sweep"]), statistics.median(times["floor"])
    print(f"open multipart uploads on moto, {args.uploads} under the namespace (as many outside), "
          f"medians of {args.reps}:")
    print(f"  sweep (parts listed, then aborted)  {s:7.3f} s  {args.uploads / s:8.0f} uploads/s")
    print(f"  floor (list + abort, no check)      {f:7.3f} s  {args.uploads / f:8.0f} uploads/s")
    print(f"  ratio (sweep / floor time)          {s / f:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
