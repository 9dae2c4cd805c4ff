#!/usr/bin/env python3
"""S3 cold sequential reads through the mount, parallel parts on and off, in the same run.

On each S3 server (moto: copies the whole object for every GET; s3rver: serves ranges from its
files), one object of ``--big-mib`` MiB imported into a repository and read cold through a tag,
alternating in every repetition: the mount with one stream per reader (``LAKEFUSE_S3_LANES=1``,
what the mount did before parallel parts), the mount with its default lanes, one boto3 streaming
GET of the object, and ``rclone mount``. Prints the medians, the same-run ratios the issue asks
for (vs rclone >= 2, vs one boto3 GET >= 0.7), and the mount's ``store_streams`` /
``store_parts`` counts (``gets_<row>_runs``: the GETs of each read -- a handful where the window
was undone to one stream). On 2 cores the S3 server takes one, so what the daemon spends decides
the ratio: each mount row also gives the daemon's CPU seconds per GiB during the timed read
(``cpu_<row>_s_per_GiB``, all its threads) and after it until the unmount (``cpu_after_<row>_s``:
the whole file's MD5 check, which the unmount cuts short: ``daemon_exited_before_next_read``
says no daemon outlived its row). ``--baseline DIR`` adds rows ``base_one_stream`` /
``base_parts``: the same mounts running the code of another checkout (e.g. ``/work/main``),
alternated with this one's in every repetition -- a before/after in the same run.

    .venv/bin/python scripts/bench/s3_parts_ab.py --big-mib 1024 --reps 3
    .venv/bin/python scripts/bench/s3_parts_ab.py --big-mib 1024 --reps 3 --baseline /work/main
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mount_read as mr  # noqa: E402  (the bench's helpers: mounts)
import s3peers  # noqa: E402  (S3 servers and peers)

MiB = mr.MiB


def bench(server: str, work: Path, big_mib: int, reps: int, lanes: str = "", baseline: str = "") -> dict:
    import boto3

    from graveler import Graveler, GravelerConfig
    from graveler.model import AddressType, Entry
    from graveler.objstore import StoreConfig

    work.mkdir(parents=True, exist_ok=True)
    srv, endpoint, creds = s3peers.start_server(server, work)
    env = {**creds, "AWS_DEFAULT_REGION": "us-east-1", "LAKEFUSE_S3_ENDPOINT": endpoint,
           "AWS_EC2_METADATA_DISABLED": "true"}
    os.environ.update(env)
    res: dict = {"server": server}
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"])
        s3.create_bucket(Bucket="bench")
        big = work / "big.bin"
        mr.make_big(big, big_mib)
        from boto3.s3.transfer import TransferConfig

        s3.upload_file(str(big), "bench", "plain/big.bin", Config=TransferConfig(multipart_threshold=1 << 40))
        big.unlink()
        etag = s3.head_object(Bucket="bench", Key="plain/big.bin")["ETag"].strip('"')
        size = big_mib * MiB
        home = work / "home"
        g = Graveler(GravelerConfig(home=home, store=StoreConfig(s3_endpoint_url=endpoint, region="us-east-1")))
        r = g.create_repository("bench", "s3://bench/ns")
        r.stage("main", "big.bin", Entry("s3://bench/plain/big.bin", size, etag, time.time_ns(),
                                         address_type=AddressType.FULL))
        r.commit("main", "imported")
        r.create_tag("v1", "main")
        g.close()
        shutil.rmtree(home / "cache", ignore_errors=True)
        mp = work / "mnt"
        n = [0]
        variants = [v for v in lanes.split(",") if v]
        mounts = ["one_stream", "parts", *(f"lanes{v}" for v in variants)]
        if baseline:
            mounts += ["base_one_stream", "base_parts"]
        rows: dict[str, list[float]] = {**{k: [] for k in mounts}, "direct": [], "rclone": []}
        cpu: dict[str, list[float]] = {k: [] for k in mounts}
        cpu_after: dict[str, list[float]] = {k: [] for k in mounts}
        gets: dict[str, list[int]] = {k: [] for k in mounts}  # GETs per read: few parts = a window undone
        stats = {}
        exited = [True]

        def mount_read(row: str, lanes: str | None, code: str = "") -> None:
            n[0] += 1
            extra_env = {**env, **({"LAKEFUSE_S3_LANES": lanes} if lanes else {}), **({"PYTHONPATH": code} if code else {})}
            with mr.LakefuseMount(home, "bench", mp, extra_env, ["--cache-dir", str(work / f"cache{n[0]}")]) as m:
                pid = m.pid()
                c0 = mr.cpu_seconds(pid)
                t = mr.timed(lambda: mr.read_file(mp / "v1" / "big.bin"))
                c1 = mr.cpu_seconds(pid)
                st = m.stats()
                stats[row] = {k: st.get(k) for k in ("store_gets", "store_streams", "store_parts", "s3_lanes",
                                                     "reads_awaited", "reads_thread")}
                gets[row].append(st.get("store_gets") or 0)
                cpu_after[row].append(mr.cpu_seconds(pid) - c1)
            exited[0] = exited[0] and not mr.alive(pid)  # its MD5 check never overlaps the next timed read
            shutil.rmtree(work / f"cache{n[0]}", ignore_errors=True)
            rows[row].append(size / t / 1e6)
            cpu[row].append((c1 - c0) / (size / (1 << 30)))

        def direct() -> None:
            body = s3.get_object(Bucket="bench", Key="plain/big.bin")["Body"]
            while body.read(MiB):
                pass

        have_rclone = shutil.which("rclone") is not None
        for rep in range(reps):
            mount_read("one_stream", "1")
            mount_read("parts", None)
            for v in variants:
                mount_read(f"lanes{v}", v)
            if baseline:
                mount_read("base_one_stream", "1", baseline)
                mount_read("base_parts", None, baseline)
            rows["direct"].append(size / mr.timed(direct) / 1e6)
            if have_rclone:
                pmp = work / "mnt-rclone"
                with s3peers.Peer("rclone", endpoint, "bench", "plain", pmp, work, creds):
                    rows["rclone"].append(size / mr.timed(lambda: mr.read_file(pmp / "big.bin")) / 1e6)
            mr.log(f"{server} rep {rep}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rows.items() if v)
                   + " | cpu s/GiB " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in cpu.items() if v))
        for k, v in rows.items():
            if v:
                res[f"{k}_MBps"] = round(mr.med(v), 1)
                res[f"{k}_runs"] = [round(x) for x in v]
        for k in mounts:
            res[f"ratio_{k}_vs_direct"] = round(mr.med(rows[k]) / mr.med(rows["direct"]), 3)
            if rows["rclone"]:
                res[f"ratio_{k}_vs_rclone"] = round(mr.med(rows[k]) / mr.med(rows["rclone"]), 3)
            res[f"cpu_{k}_s_per_GiB"] = round(mr.med(cpu[k]), 2)
            res[f"cpu_after_{k}_s"] = round(mr.med(cpu_after[k]), 2)
            res[f"gets_{k}_runs"] = gets[k]
        res["ratio_parts_vs_one_stream"] = round(mr.med(rows["parts"]) / mr.med(rows["one_stream"]), 3)
        if baseline:
            res["ratio_parts_vs_base_parts"] = round(mr.med(rows["parts"]) / mr.med(rows["base_parts"]), 3)
        res["daemon_exited_before_next_read"] = exited[0]
        res["stats"] = stats
    finally:
        srv.terminate()
        srv.wait(10)
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--big-mib", type=int, default=1024)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--s3-servers", default="moto,s3rver")
    p.add_argument("--workdir", default=None)
    p.add_argument("--lanes", default="", help="more variants: $LAKEFUSE_S3_LANES values, comma-separated")
    p.add_argument("--baseline", default="", metavar="DIR",
                   help="also mount with the code of another checkout (rows base_*), alternated with this one's")
    args = p.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="s3-parts-ab-"))
    out = {"load": os.getloadavg(), "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
    try:
        for server in args.s3_servers.split(","):
            out[server] = bench(server, work / server, args.big_mib, args.reps, args.lanes,
                                os.path.abspath(args.baseline) if args.baseline else "")
            mr.log(json.dumps(out[server], indent=1))
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    out["load_after"] = os.getloadavg()
    out["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
