#!/usr/bin/env python3
"""The fault and bad-input probe of issue 7, end to end, as a user and a failing machine meet lakefuse.

Every probe runs the real CLI (``python -m lakefuse``) in a subprocess against a
fresh home: local namespaces on disk, S3 namespaces on a moto server on
127.0.0.1 (through ``tests/faultproxy.py`` where a probe needs a hung or dying
endpoint).  It damages or provokes one thing, records what the command did
(exit code, lines on stderr, time), then checks that nothing else was lost:
the repository's other object still reads back byte for byte and its history
is intact.  Output: one table, ``probe | expected | observed | data lost``.

    .venv/bin/python scripts/bench/faults.py               # every probe (~2-4 minutes)
    .venv/bin/python scripts/bench/faults.py -k lmdb -k s3  # probes whose name contains a word
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

KEEP = b"this object must survive every probe\n"
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
          "AWS_EC2_METADATA_DISABLED": "true"}


class Lab:
    """Temp directories, the moto server, and the CLI."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="lakefuse-faults-"))
        self._moto = None
        self.s3_url: str | None = None
        self._n = 0

    def close(self) -> None:
        if self._moto is not None:
            self._moto.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def dir(self, name: str) -> Path:
        self._n += 1
        d = self.tmp / f"{self._n:02d}-{name}"
        d.mkdir()
        return d

    # -- S3 ------------------------------------------------------------------------------
    def s3(self) -> str:
        if self._moto is None:
            import logging

            from moto.server import ThreadedMotoServer

            os.environ.update(S3_ENV)
            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self._moto.start()
            host, port = self._moto.get_host_and_port()
            self.s3_url = f"http://{host}:{port}"
        return self.s3_url

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.s3(), region_name="us-east-1")

    def bucket(self) -> str:
        name = f"probe-{random.getrandbits(40):010x}"
        self.client().create_bucket(Bucket=name)
        return name

    # -- the CLI -------------------------------------------------------------------------
    def run(self, home: Path | None, *args, endpoint: str | None = None, timeout: float = 120,
            stdout=subprocess.PIPE, extra_env: dict | None = None) -> tuple[int, bytes, str, float]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFUSE_")}
        env.update(S3_ENV)
        if endpoint or self.s3_url:
            env["LAKEFUSE_S3_ENDPOINT"] = endpoint or self.s3_url
        env.update(extra_env or {})
        argv = [sys.executable, "-m", "lakefuse", *args, *(["--home", str(home)] if home is not None else [])]
        t0 = time.monotonic()
        try:
            r = subprocess.run(argv, stdout=stdout, stderr=subprocess.PIPE, env=env, cwd=ROOT, timeout=timeout)
        except subprocess.TimeoutExpired:
            return -999, b"", f"still running after {timeout:g} s (killed)", time.monotonic() - t0
        return r.returncode, r.stdout or b"", (r.stderr or b"").decode("utf-8", "replace"), time.monotonic() - t0

    def ok(self, home: Path, *args, **kw) -> bytes:
        rc, out, err, _ = self.run(home, *args, **kw)
        if rc != 0:
            raise RuntimeError(f"setup step `lakefuse {' '.join(map(str, args))}` failed ({rc}): {err.strip()}")
        return out

    def repo(self, name: str = "probe", storage: str | None = None, files: dict[str, bytes] | None = None,
             commits: int = 1) -> Path:
        """A home with repository ``name``: keep.txt plus ``files``, committed ``commits`` times."""
        d = self.dir(name)
        home = d / "home"
        self.ok(home, "repo", "create", f"lakefs://{name}", *(["--storage", storage] if storage else []))
        src = d / "src"
        src.mkdir()
        for i, (path, data) in enumerate({"keep.txt": KEEP, **(files or {})}.items()):
            f = src / f"f{i}"
            f.write_bytes(data)
            self.ok(home, "fs", "upload", f"lakefs://{name}/main/{path}", "-s", str(f))
        for i in range(commits):
            if i:
                f = src / f"c{i}"
                f.write_bytes(b"%d" % i)
                self.ok(home, "fs", "upload", f"lakefs://{name}/main/c{i}", "-s", str(f))
            self.ok(home, "commit", f"lakefs://{name}/main", "-m", f"commit {i}")
        return home

    def physical(self, home: Path, uri: str) -> str:
        return json.loads(self.ok(home, "fs", "stat", uri, "--json"))["physical_address"]

    def lost(self, home: Path, name: str = "probe") -> bool:
        """Whether the probe cost anything beyond what it damaged: keep.txt and the log must still read."""
        rc, out, _, _ = self.run(home, "fs", "cat", f"lakefs://{name}/main/keep.txt")
        rc2, log, _, _ = self.run(home, "log", f"lakefs://{name}/main")
        return rc != 0 or out != KEEP or rc2 != 0 or b"commit 0" not in log


def local_path(uri: str) -> Path:
    return Path(unquote(urlsplit(uri).path))


def outcome(rc: int, err: str, seconds: float | None = None) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    s = f"exit {rc}" if rc != -999 else err
    if rc != -999:
        s += f", {len(lines)} line{'s' if len(lines) != 1 else ''}"
        if any("Traceback" in x for x in lines):
            s += " (traceback)"
    if seconds is not None:
        s += f", {seconds:.1f} s"
    return s


# ---------------------------------------------------------------------------------------------- probes

PROBES = []


def probe(name: str, expected: str):
    def deco(fn):
        PROBES.append((name, expected, fn))
        return fn
    return deco


def _damage_object(lab: Lab, how: str) -> tuple[str, bool]:
    home = lab.repo(files={"f.txt": b"hello\n"})
    p = local_path(lab.physical(home, "lakefs://probe/main/f.txt"))
    if how == "empty":
        p.write_bytes(b"")
    elif how == "flip":
        p.write_bytes(b"jello\n")
    elif how == "symlink":
        other = p.parent / "other"
        other.write_bytes(b"other!")
        p.unlink()
        p.symlink_to(other)
    rc, out, err, _ = lab.run(home, "fs", "cat", "lakefs://probe/main/f.txt")
    return outcome(rc, err) + (f", printed {len(out)} bytes" if out else ""), lab.lost(home)


@probe("data: object emptied (local), fs cat", "exit 5, nothing printed")
def p_empty(lab):
    return _damage_object(lab, "empty")


@probe("data: object bit-flipped (local), fs cat", "exit 5, nothing printed")
def p_flip(lab):
    return _damage_object(lab, "flip")


@probe("data: object replaced by a symlink, fs cat", "exit 5, nothing printed")
def p_symlink(lab):
    return _damage_object(lab, "symlink")


@probe("data: S3 object cut 20 MB -> 10 MB, fs cat", "exit 5")
def p_s3_cut(lab):
    bucket = lab.bucket()
    d = lab.dir("s3cut")
    big = d / "big"
    big.write_bytes(os.urandom(20 << 20))
    home = lab.repo("probe", f"s3://{bucket}/ns")
    lab.ok(home, "fs", "upload", "lakefs://probe/main/big", "-s", str(big))
    uri = lab.physical(home, "lakefs://probe/main/big")
    key = uri.split("/", 3)[3]
    lab.client().put_object(Bucket=bucket, Key=key, Body=big.read_bytes()[: 10 << 20])
    rc, out, err, _ = lab.run(home, "fs", "cat", "lakefs://probe/main/big")
    return outcome(rc, err) + f", printed {len(out) >> 20} MiB", lab.lost(home)


@probe("table: a valid range copied over another range, fs ls -r", "exit 5")
def p_swapped_range(lab):
    from graveler import Graveler
    from graveler.config import GravelerConfig

    home = lab.repo(files={"a/1": b"1"})
    lab.ok(home, "branch", "create", "lakefs://probe/other", "-s", "main")
    f = home.parent / "x"
    f.write_bytes(b"x")
    lab.ok(home, "fs", "upload", "lakefs://probe/other/b/2", "-s", str(f))
    lab.ok(home, "commit", "lakefs://probe/other", "-m", "other")
    g = Graveler(GravelerConfig(home=home))
    repo = g.repository("probe")
    main_ranges = repo.list_ranges("main")
    other_ranges = repo.list_ranges("other")
    ns = local_path(repo.storage_namespace) / "_lakefs"
    g.close()
    victim = next(r.id for r in main_ranges if r.min_key <= b"a/1" <= r.max_key)
    intruder = next(r.id for r in other_ranges if r.min_key <= b"b/2" <= r.max_key)
    shutil.copy(ns / intruder, ns / victim)
    rc, out, err, _ = lab.run(home, "fs", "ls", "-r", "lakefs://probe/main/")
    obs = outcome(rc, err) + (", listed the other range's entries" if b"b/2" in out else "")
    # lost: anything outside the damaged range (the other branch's new object)
    rc2, out2, _, _ = lab.run(home, "fs", "cat", "lakefs://probe/other/b/2")
    return obs, rc2 != 0 or out2 != b"x"


def _lmdb_damage(lab: Lab, how: str) -> tuple[str, bool]:
    home = lab.repo(commits=3)
    lab.ok(home, "repo", "create", "lakefs://other2")  # the damaged repository must not hide this one
    data = home / "repos" / "probe" / "refs.lmdb" / "data.mdb"
    if how == "truncate":
        os.truncate(data, 16384)
    elif how == "empty":
        os.truncate(data, 0)
    else:
        size = data.stat().st_size
        rnd = random.Random(7)
        with open(data, "r+b") as f:
            for pg in range(2, size // 4096):
                f.seek(pg * 4096)
                f.write(rnd.randbytes(4096))
    rc, _, err, _ = lab.run(home, "log", "lakefs://probe/main")
    rc2, out, err2, _ = lab.run(home, "repo", "list")
    listed = [line.split()[0] + (" (DAMAGED)" if "DAMAGED" in line else "")
              for line in out.decode().splitlines()[1:]]
    named = "probe" in err and "probe" in err2
    obs = f"log: {outcome(rc, err)}; repo list: exit {rc2}, lists {', '.join(listed) or 'nothing'}"
    obs += ", repository named" if named else ", repository NOT named"
    rc3, _, _, _ = lab.run(home, "log", "lakefs://other2/main")
    return obs, rc3 != 0


@probe("lmdb: data.mdb truncated to 16 KiB", "exit 5 naming it; repo list shows the others")
def p_lmdb_truncated(lab):
    return _lmdb_damage(lab, "truncate")


@probe("lmdb: data.mdb emptied", "exit 5 naming it; repo list shows the others")
def p_lmdb_empty(lab):
    return _lmdb_damage(lab, "empty")


@probe("lmdb: random bytes over the data pages", "exit 5 naming it; repo list shows the others")
def p_lmdb_random(lab):
    return _lmdb_damage(lab, "random")


_STAGER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from graveler.config import GravelerConfig, KVConfig
    from graveler.home import Graveler
    from graveler.model import Entry
    g = Graveler(GravelerConfig(home=Path(sys.argv[1]), kv=KVConfig(map_size=1 << 26, sync=False)))
    repo = g.repository("probe")
    meta = {"m": "x" * 8192}
    n = int(sys.argv[2])
    for s in range(0, n, 2000):
        repo.stage_many("main", [(f"p/{i:07d}", Entry(address=f"data/x/{i}", size=1, etag="e",
                                                       last_modified_ns=1, metadata=meta))
                                 for i in range(s, min(s + 2000, n))])
""")


@probe("lmdb: one process grows the map (100,000 x 8 KB staged) while others run `branch list`",
       "no command fails")
def p_map_resized(lab):
    home = lab.repo()
    stager = subprocess.Popen([sys.executable, "-c", _STAGER, str(home), "100000"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    runs = fails = 0
    reasons = set()
    while stager.poll() is None:
        rc, _, err, _ = lab.run(home, "branch", "list", "lakefs://probe")
        runs += 1
        if rc != 0:
            fails += 1
            reasons.add(err.strip()[:80])
    stager.wait()
    obs = f"{fails} of {runs} failed" + (f" ({'; '.join(reasons)})" if reasons else "")
    if stager.returncode != 0:
        obs += f"; the stager failed: {stager.stderr.read().decode()[-200:]}"
    return obs, lab.lost(home)


_COMMANDS = [
    ("log", "lakefs://probe/m\udcff"), ("show", "lakefs://probe/m\udcff"),
    ("diff", "lakefs://probe/main", "lakefs://probe/x\udcff"), ("merge", "lakefs://probe/x\udcff", "lakefs://probe/main"),
    ("revert", "lakefs://probe/main", "x\udcff"), ("branch", "create", "lakefs://probe/b", "-s", "m\udcff"),
    ("branch", "delete", "lakefs://probe/b\udcff", "--yes"), ("tag", "create", "lakefs://probe/t\udcff", "main"),
    ("tag", "delete", "lakefs://probe/t\udcff"), ("commit", "lakefs://probe/main", "-m", "m\udcff"),
    ("commit", "lakefs://probe/main", "-m", "m", "--meta", "k=\udcff"), ("fs", "ls", "lakefs://probe/main/\udcff"),
    ("fs", "rm", "-r", "lakefs://probe/main/a\udcff"), ("branch", "reset", "lakefs://probe/main", "--prefix", "\udcff"),
    ("repo", "create", "lakefs://p2", "--storage", "/tmp/\udcff"),
]


@probe("cli: a non-UTF-8 byte in an argument (15 commands)", "exit 2, one line, each")
def p_utf8(lab):
    home = lab.repo()
    codes = {}
    for args in _COMMANDS:
        rc, _, err, _ = lab.run(home, *[os.fsencode(a) for a in args])
        key = outcome(rc, err)
        codes[key] = codes.get(key, 0) + 1
    return "; ".join(f"{n} x {k}" for k, n in sorted(codes.items())), lab.lost(home)


@probe("cli: refs restore of a manifest nested 100,000 deep", "exit 2")
def p_nested_json(lab):
    home = lab.repo()
    m = home.parent / "manifest.json"
    m.write_text("[" * 100_000 + "]" * 100_000)
    rc, _, err, _ = lab.run(home, "refs", "restore", "lakefs://fresh", "--manifest", str(m))
    return outcome(rc, err), lab.lost(home)


@probe("cli: refs restore of a manifest with bogus IDs", "exit 2 or 5")
def p_bogus_ids(lab):
    home = lab.repo()
    m = home.parent / "manifest.json"
    m.write_text(json.dumps({"branches_meta_range_id": "nothing", "tags_meta_range_id": "x" * 64,
                             "commits_meta_range_id": "../../etc/passwd"}))
    rc, _, err, _ = lab.run(home, "refs", "restore", "lakefs://fresh", "--manifest", str(m))
    return outcome(rc, err), lab.lost(home)


@probe("cli: fs upload --source a FIFO", "exit 2 (no hang)")
def p_fifo(lab):
    home = lab.repo()
    fifo = home.parent / "fifo"
    os.mkfifo(fifo)
    rc, _, err, t = lab.run(home, "fs", "upload", "lakefs://probe/main/x", "-s", str(fifo), timeout=20)
    return outcome(rc, err), lab.lost(home)


@probe("cli: sst dump /dev/zero; sst dump of a missing file", "exit 2; exit 3")
def p_sst(lab):
    d = lab.dir("sst")
    rc, _, err, _ = lab.run(None, "sst", "dump", "/dev/zero", timeout=20)
    rc2, _, err2, _ = lab.run(None, "sst", "dump", str(d / "absent.sst"))
    return f"{outcome(rc, err)}; {outcome(rc2, err2)}", False


def _tty_output(lab: Lab, home: Path, *args) -> bytes:
    master, slave = pty.openpty()
    try:
        lab.run(home, *args, stdout=slave)
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            b = os.read(master, 65536)
        except OSError:
            break
        if not b:
            break
        chunks.append(b)
    os.close(master)
    return b"".join(chunks)


@probe("cli: escape sequences in a commit message and an object name, on a terminal",
       "escaped on a tty; --json exact")
def p_escapes(lab):
    home = lab.repo()
    f = home.parent / "x"
    f.write_bytes(b"x")
    lab.ok(home, "fs", "upload", "lakefs://probe/main/evil\x1b[2Jname", "-s", str(f))
    lab.ok(home, "commit", "lakefs://probe/main", "-m", "msg \x1b]0;pwned\x07 \x1b[31mred")
    raw = _tty_output(lab, home, "log", "lakefs://probe/main") + _tty_output(lab, home, "fs", "ls",
                                                                            "lakefs://probe/main/")
    js = lab.ok(home, "log", "lakefs://probe/main", "--json").decode()
    exact = json.loads(js.splitlines()[0])["message"] == "msg \x1b]0;pwned\x07 \x1b[31mred"
    obs = ("raw ESC on the terminal" if b"\x1b" in raw else "escaped on the tty") + \
          ("; --json exact" if exact else "; --json NOT exact")
    return obs, lab.lost(home)


@probe("cli: fs rm -r lakefs://repo/main/ (the whole branch)", "exit 2 without --all, nothing staged")
def p_rm_all(lab):
    home = lab.repo(files={"a/1": b"1", "b/2": b"2"})
    rc, _, err, _ = lab.run(home, "fs", "rm", "-r", "lakefs://probe/main/")
    out = lab.ok(home, "fs", "ls", "-r", "lakefs://probe/main/").decode()
    left = sum(1 for line in out.splitlines() if line.strip())
    return outcome(rc, err) + f", {left} of 3 objects still there", lab.lost(home)


@probe("concurrency: 4 processes, 8 upload+commit each, one branch", "every command exit 0")
def p_committers(lab):
    home = lab.repo()
    f = home.parent / "x"
    f.write_bytes(b"x")
    results = []

    def worker(w: int) -> None:
        for i in range(8):
            results.append(lab.run(home, "fs", "upload", f"lakefs://probe/main/w{w}/{i}", "-s", str(f))[0])
            rc, _, err, _ = lab.run(home, "commit", "lakefs://probe/main", "-m", f"w{w} {i}")
            results.append(rc if rc == 0 or "nothing to commit" not in err else 0)

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    bad = [rc for rc in results if rc != 0]
    out = lab.ok(home, "fs", "ls", "-r", "lakefs://probe/main/").decode()
    n = sum(1 for line in out.splitlines() if "/w" in line or " w" in line)
    codes = f" (exit {sorted(set(bad))})" if bad else ""
    return f"{len(bad)} of {len(results)} commands failed{codes}, {n} of 32 objects on main", \
        lab.lost(home) or n != 32


def _s3_range_files(lab: Lab, bucket: str) -> list[str]:
    out = lab.client().list_objects_v2(Bucket=bucket, Prefix="ns/_lakefs/")
    return [o["Key"] for o in out.get("Contents", [])]


@probe("s3: a range file damaged in the disk cache", "exit 0, right bytes (evicted, fetched again)")
def p_cache_damaged(lab):
    bucket = lab.bucket()
    home = lab.repo(storage=f"s3://{bucket}/ns", files={"f.txt": b"hello\n"})
    lab.ok(home, "fs", "ls", "-r", "lakefs://probe/main/")  # fills the cache
    import diskcache

    with diskcache.Cache(str(home / "cache")) as c:
        keys = [k for k in c.iterkeys() if "/_lakefs/" in str(k)]
        for k in keys:
            v = bytearray(c.get(k))
            v[len(v) // 2] ^= 0xFF
            c.set(k, bytes(v))
    rc, out, err, _ = lab.run(home, "fs", "cat", "lakefs://probe/main/f.txt")
    obs = outcome(rc, err) + (", right bytes" if out == b"hello\n" else ", WRONG bytes") + f" ({len(keys)} damaged)"
    return obs, lab.lost(home)


@probe("s3: a range file damaged in the store (not cached)", "exit 5, one line")
def p_store_damaged(lab):
    bucket = lab.bucket()
    home = lab.repo(storage=f"s3://{bucket}/ns", files={"f.txt": b"hello\n"})
    shutil.rmtree(home / "cache", ignore_errors=True)
    cl = lab.client()
    for key in _s3_range_files(lab, bucket):
        body = bytearray(cl.get_object(Bucket=bucket, Key=key)["Body"].read())
        body[len(body) // 2] ^= 0xFF
        cl.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    rc, _, err, _ = lab.run(home, "fs", "cat", "lakefs://probe/main/f.txt")
    return outcome(rc, err), False  # the damage itself is the loss here; nothing else was touched


@probe("s3: endpoint accepts connections and never answers (default timeouts)", "exit 6 within ~30 s")
def p_hung(lab):
    from tests.faultproxy import Fault, FaultProxy

    bucket = lab.bucket()
    with FaultProxy(lab.s3()) as proxy:
        home = lab.repo(storage=f"s3://{bucket}/ns", files={"f.txt": b"hello\n"})
        shutil.rmtree(home / "cache", ignore_errors=True)
        proxy.add(Fault("hang"))
        rc, _, err, t = lab.run(home, "fs", "cat", "lakefs://probe/main/f.txt", endpoint=proxy.url, timeout=600)
        proxy.clear()
        return outcome(rc, err, t), lab.lost(home)


@probe("s3: --timeout 2 against the hung endpoint", "exit 6 within ~10 s")
def p_hung_timeout(lab):
    from tests.faultproxy import Fault, FaultProxy

    bucket = lab.bucket()
    with FaultProxy(lab.s3()) as proxy:
        home = lab.repo(storage=f"s3://{bucket}/ns", files={"f.txt": b"hello\n"})
        shutil.rmtree(home / "cache", ignore_errors=True)
        proxy.add(Fault("hang"))
        rc, _, err, t = lab.run(home, "--timeout", "2", "fs", "cat", "lakefs://probe/main/f.txt",
                                endpoint=proxy.url, timeout=600)
        proxy.clear()
        return outcome(rc, err, t), lab.lost(home)


@probe("s3: endpoint fails every request for a while (503), then recovers", "exit 6, then exit 0")
def p_flaky(lab):
    from tests.faultproxy import Fault, FaultProxy

    bucket = lab.bucket()
    with FaultProxy(lab.s3()) as proxy:
        home = lab.repo(storage=f"s3://{bucket}/ns")
        f = home.parent / "x"
        f.write_bytes(os.urandom(1 << 20))
        proxy.add(Fault("error", status=503))
        rc, _, err, t = lab.run(home, "fs", "upload", "lakefs://probe/main/x", "-s", str(f), endpoint=proxy.url)
        proxy.clear()
        rc2, _, err2, _ = lab.run(home, "fs", "upload", "lakefs://probe/main/x", "-s", str(f), endpoint=proxy.url)
        return f"{outcome(rc, err, t)}; then {outcome(rc2, err2)}", lab.lost(home)


@probe("s3: repo create on a missing bucket / an invalid bucket name", "fails at create, clear message")
def p_bad_namespace(lab):
    lab.s3()
    d = lab.dir("ns")
    rc, _, err, _ = lab.run(d / "home", "repo", "create", "lakefs://aaa", "--storage", "s3://no-such-bucket-here/ns")
    rc2, _, err2, _ = lab.run(d / "home", "repo", "create", "lakefs://bbb", "--storage", "s3://Bad_Bucket!/ns")
    rc3, out, _, _ = lab.run(d / "home", "repo", "list")
    left = [line.split()[0] for line in out.decode().splitlines()[1:]]
    return f"{outcome(rc, err)}; {outcome(rc2, err2)}; repo list: {left or 'empty'}", False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", action="append", default=[], help="run only probes whose name contains this word")
    args = ap.parse_args()
    chosen = [p for p in PROBES if not args.k or any(k in p[0] for k in args.k)]
    lab = Lab()
    rows = []
    t0 = time.monotonic()
    try:
        for name, expected, fn in chosen:
            t = time.monotonic()
            try:
                observed, lost = fn(lab)
            except Exception as e:  # a probe that cannot even set up is a finding too
                observed, lost = f"probe error: {type(e).__name__}: {str(e)[:120]}", None
            rows.append((name, expected, observed, "?" if lost is None else ("YES" if lost else "no")))
            print(f"  [{time.monotonic() - t:5.1f} s] {name}: {observed}", file=sys.stderr, flush=True)
    finally:
        lab.close()
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"lakefuse fault and bad-input probe ({len(rows)} probes, {time.monotonic() - t0:.0f} s)")
    for col in ("probe", "expected", "observed", "data lost"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console(width=200).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
