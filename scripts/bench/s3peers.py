"""S3 servers and S3 mounts to measure lakefuse against, for the read benchmarks.

:func:`start_server` starts an S3 server on 127.0.0.1 (moto, or s3rver from npm, which serves
ranges natively); :class:`Peer` mounts a bucket prefix of it read-only with rclone or s3fs
(:func:`ensure_peers` installs them with apt when missing).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from mount_write import unmount, wait_mount  # (scripts/bench: sibling scripts)

PY = sys.executable


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_peers() -> list[str]:
    missing = [p for p in ("rclone", "s3fs") if shutil.which(p) is None]
    if missing:
        log(f"installing {' '.join(missing)} with apt")
        subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, capture_output=True)
    return [p for p in ("rclone", "s3fs") if shutil.which(p)]


class Peer:
    def __init__(self, kind: str, endpoint: str, bucket: str, prefix: str, mp: Path, work: Path, creds: dict):
        self.kind, self.endpoint, self.bucket, self.prefix, self.mp, self.work = kind, endpoint, bucket, prefix, mp, work
        self.key, self.secret = creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"]
        self.proc = None

    def __enter__(self):
        self.mp.mkdir(parents=True, exist_ok=True)
        if self.kind == "rclone":
            remote = (f":s3,provider=Other,endpoint='{self.endpoint}',access_key_id={self.key},"
                      f"secret_access_key={self.secret}:{self.bucket}/{self.prefix}")
            env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}  # rclone refuses one for http
            self.proc = subprocess.Popen(["rclone", "mount", remote, str(self.mp), "--read-only"], env=env,
                                         stdout=subprocess.DEVNULL, stderr=open(self.work / "rclone.log", "ab"))
        else:
            pw = self.work / "s3fs.passwd"
            pw.write_text(f"{self.key}:{self.secret}\n")
            pw.chmod(0o600)
            subprocess.run(["s3fs", f"{self.bucket}:/{self.prefix}", str(self.mp), "-o", f"url={self.endpoint}",
                            "-o", "use_path_request_style", "-o", f"passwd_file={pw}", "-o", "ro"], check=True)
        wait_mount(self.mp)
        return self

    def __exit__(self, *exc):
        unmount(self.mp)
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


S3RVER_VERSION = "3.7.1"


def start_server(kind: str, work: Path) -> tuple[subprocess.Popen, str, dict]:
    """An S3 server on 127.0.0.1: moto (Python; copies the whole object for every ranged GET) or
    s3rver (npm, on Debian's nodejs; serves ranges from its files), installed under ``work`` with npm
    when missing. Returns the process, its endpoint and the credentials it takes."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    if kind == "moto":
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        proc = subprocess.Popen([PY, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        prefix = work.parent / "npm"
        exe = prefix / "node_modules" / ".bin" / "s3rver"
        if not exe.exists():
            if shutil.which("npm") is None:
                raise RuntimeError("npm is missing (apt-get install nodejs npm)")
            log(f"installing s3rver {S3RVER_VERSION} with npm into {prefix}")
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix),
                            f"s3rver@{S3RVER_VERSION}"], check=True, capture_output=True)
        creds = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}
        data = work / "s3rver-data"
        data.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen([str(exe), "-d", str(data), "-a", "127.0.0.1", "-p", str(port), "-s",
                                 "--no-vhost-buckets"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, endpoint, creds
