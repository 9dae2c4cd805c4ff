#!/usr/bin/env python3
"""Writes through a lakefuse branch tree, against a native local directory in the same run.

Work (each timed ``--reps`` times; medians reported):

* sequential write of one file (``--seq-mib``, default 1024) in 1 MiB writes, closed
  (for lakefuse the close returns once the object is uploaded and staged), and the same with
  an fsync before the close; native and lakefuse take turns, each write from a clean start
  (dirty pages written, page cache dropped: as root);
* create + write (``--size`` bytes, default 4 KiB) + close of ``--files`` small files
  (default 10,000) in 10 directories;
* the same by ``--writers`` processes at once (default 8; concurrent closes share
  KV transactions: group commit);
* the same from 1 process with an fsync before each close (beside native with one);
* ``tar -x`` of an archive of ``--tar-files`` small files (default 10,000);
* ``cp -r`` of a tree of ``--files`` small files;
* commit of the ``--files`` staged files through ``.lakefuse/commit`` (lakefuse only);
* rename (``mv``) of a directory holding ``--files`` files.

The peer for every figure is the same work on a native directory of the same
filesystem (no fsync, as ``cp`` does), in the same run; the native figure with an
fsync before each close is printed too. The small-file rows have a second peer, the cost of
FUSE itself: the same work through libfuse's own example file system ``passthrough_hp``
(C++, multithreaded; ``--nopassthrough``: its daemon serves every write, as lakefuse's does)
over a native directory, built once from the vendored libfuse into ``.venv/opt/libfuse-peer``
(meson, ninja and g++; skipped with a note when it cannot be built). A third, the cost of the
Python binding itself: ``nullfs.py``, pyfuse3 and trio answering every request from memory with
no I/O (the floor under any pyfuse3 daemon; lakefuse's "x of it" is how much its own work adds).

Each file through the mount is about six FUSE
requests (lookup, create, write, flush, release, and the getattr of its directory at the next
create; a file created write-only is opened with direct I/O, so the kernel no longer asks for
security.capability before each write); the 1-process row prints the count
(from ``.lakefuse/stats``), with the share of creates answered without a thread hand-off, and the
``tar -x`` row its own (GNU tar also sends utimens, chown and chmod of each file, and a
write that crosses one of its 10 KiB records is two); a line under each gives the requests per
file by type and the thread hops per file (``thread_hops_*``: the requests answered in a
worker thread rather than on the trio thread), and another the daemon's CPU per file by thread
(trio's loop against all other threads: from ``/proc/<pid>/task``). With ``--s3`` the sequential and
small-file work also runs on S3 (a moto server on 127.0.0.1): lakefuse with an
S3 storage namespace, ``rclone mount`` and ``s3fs`` on the same server (installed
with apt when missing; skipped with a note if that fails), and one boto3 upload of a
local file of the sequential write's size (the limit for a close that returns once the
object is stored; rclone's write-back cache returns before it uploads).

    .venv/bin/python scripts/bench/mount_write.py
    .venv/bin/python scripts/bench/mount_write.py --seq-mib 256 --files 2000 --reps 1 --s3
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def lakefuse(home: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lakefuse", "--home", str(home), *args], check=True,
                          capture_output=True, text=True, cwd=ROOT, env=env)


def is_mount(p: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(p) for line in f)


def wait_mount(p: Path, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_mount(p):
            try:
                os.listdir(p)
                return
            except OSError:
                pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"mount exited with {proc.returncode}")
        time.sleep(0.1)
    raise RuntimeError(f"{p} not mounted after {timeout} s")


def unmount(p: Path, proc: subprocess.Popen | None = None) -> None:
    for args in (["-u"], ["-uz"]):
        if is_mount(p):
            subprocess.run(["fusermount3", *args, str(p)], capture_output=True)
            time.sleep(0.2)
    if proc is not None:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def drop_caches() -> None:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


# ------------------------------------------------------------------ the work


def seq_write(path: Path, mib: int, fsync: bool = False) -> float:
    buf = os.urandom(MiB)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(mib):
        os.write(fd, buf)
    if fsync:
        os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - t0


def small_files(root: Path, n: int, fsync: bool = False, size: int = 4096) -> float:
    data = os.urandom(size)
    t0 = time.perf_counter()
    for d in range(10):
        os.makedirs(root / f"d{d}", exist_ok=True)
    for i in range(n):
        fd = os.open(root / f"d{i % 10}" / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - t0


def _small_files_job(a) -> float:
    return small_files(*a)


def small_files_parallel(root: Path, n: int, writers: int, fsync: bool = False, size: int = 4096) -> float:
    """``small_files`` by ``writers`` processes at once (``n`` files in all): wall time."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(writers) as pool:
        t0 = time.perf_counter()
        pool.map(_small_files_job, [(root / f"w{w}", n // writers, fsync, size) for w in range(writers)])
        return time.perf_counter() - t0


def make_tree(root: Path, n: int, size: int = 1024) -> None:
    data = os.urandom(size)
    for i in range(n):
        d = root / f"a{i % 10}" / f"b{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_bytes(data)


def _cpu_of(stat_path: str) -> float:
    """CPU seconds (user + system) of the process or thread whose ``stat`` file this is."""
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far: per file, the daemon's cost, which
    a loaded machine inflates less than wall time."""
    return _cpu_of(f"/proc/{pid}/stat")


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of each thread of process ``pid`` (by thread id), with its group: the main
    thread (trio's loop) or another (trio's workers and the spool's and KV's helpers: their names
    do not tell them apart, a thread inherits its creator's)."""
    out: dict[int, tuple[str, float]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            cpu = _cpu_of(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue  # (the thread ended meanwhile)
        out[int(tid)] = ("trio loop" if int(tid) == pid else "other threads", cpu)
    return out


def thread_split(t0: dict, t1: dict, n: int) -> str:
    """The daemon's CPU per file by thread group between two :func:`thread_cpu` samples (threads
    that ended in between are missing: the split, not the total, which :func:`cpu_s` gives)."""
    by: dict[str, float] = {}
    for tid, (group, cpu) in t1.items():
        by[group] = by.get(group, 0.0) + cpu - t0.get(tid, (group, 0.0))[1]
    return ", ".join(f"{k} {v * 1e6 / n:.0f}" for k, v in sorted(by.items()))


def fuse_requests(mp: Path) -> tuple[int, dict]:
    """FUSE requests the daemon of mount ``mp`` answered so far, and its counters (``.lakefuse/stats``)."""
    import json

    st = json.loads((mp / ".lakefuse" / "stats").read_text())
    return sum(st.get("requests", {}).values()), st


def per_file(st0: dict, st1: dict, n: int) -> str:
    """FUSE requests per file by type, and thread hops per file, between two ``.lakefuse/stats``."""
    r0, r1 = st0.get("requests", {}), st1.get("requests", {})
    by = sorted(((k, (v - r0.get(k, 0)) / n) for k, v in r1.items()), key=lambda kv: -kv[1])
    hops = sum(v - st0.get(k, 0) for k, v in st1.items() if k.startswith("thread_hops_")) / n
    return " ".join(f"{k} {v:.2f}" for k, v in by if v >= 0.01) + f"; thread hops/file {hops:.2f}"


def create_cost_us(d: Path, n: int = 1000) -> float:
    """Wall microseconds per creation of an empty file in ``d`` (a new directory; the files stay:
    deleting them would make the next creations dearer, see below). On an ext4 without a journal
    (these VMs) the inode allocator skips every inode freed in the last 60 s (360 s while its inode
    table block is dirty), reading that block, from the start of the group, at each creation: right
    after a large delete a creation costs ~0.5 ms of CPU instead of ~0.02 -- natively, and for each
    spool file the daemon makes. Printed before the small-file rows, it says whether they ran in
    that state."""
    d.mkdir(parents=True)
    t0 = time.perf_counter()
    for i in range(n):
        os.close(os.open(d / f"e{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    return (time.perf_counter() - t0) * 1e6 / n


def timed_cmd(*cmd: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def median(xs: list[float]) -> float:
    return statistics.median(xs)


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, what: str, value: str, ratio: str = "") -> None:
        self.rows.append((what, value, ratio))
        print(f"  {what:<58} {value:>16} {ratio}", flush=True)


# ------------------------------------------------------------------ lakefuse mounts


class LakefuseMount:
    def __init__(self, work: Path, storage: str | None = None, env: dict | None = None):
        self.home = work / "home"
        self.mp = work / "mnt"
        self.mp.mkdir(parents=True, exist_ok=True)
        (work / "cache").mkdir(exist_ok=True)
        self.env = {**os.environ, **(env or {})}
        args = ["repo", "create", "lakefs://bench"]
        if storage:
            args += ["--storage", storage]
        lakefuse(self.home, *args, env=self.env)
        self.log = open(work / "mount.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lakefuse", "--home", str(self.home), "mount", "lakefs://bench", str(self.mp),
             "-f", "--cache-dir", str(work / "cache")], stdout=self.log, stderr=self.log, cwd=ROOT, env=self.env)
        wait_mount(self.mp, self.proc)
        self.branch = self.mp / "main"

    def close(self) -> None:
        unmount(self.mp, self.proc)
        self.log.close()


class PeerMount:
    """A peer file system mounted by a command of its own (``ok`` False and ``why`` when it did not
    mount); :meth:`close` unmounts it."""

    ok, why, proc = False, "", None

    def _start(self, cmd: list[str], mp: Path, log: Path, what: str, env: dict | None = None) -> None:
        self.mp = mp
        self.mp.mkdir(parents=True)
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, env=env)
        try:
            wait_mount(self.mp, self.proc, timeout=20)
        except RuntimeError as e:
            self.why = f"{what} did not mount: {e}"
            self.close()
            return
        self.ok = True

    def close(self) -> None:
        if self.proc is not None:
            unmount(self.mp, self.proc)
            self.log.close()
            self.proc = None


class CFusePeer(PeerMount):
    """libfuse's ``example/passthrough_hp`` mounted over a native directory (see the docstring)."""

    def __init__(self, work: Path, src: Path | None = None):
        """Over ``src`` (default: a new empty directory in ``work``), mounted at ``work/mnt``."""
        self.src, self.mp = src or work / "src", work / "mnt"
        try:
            exe = build_passthrough_hp()
        except (OSError, subprocess.CalledProcessError) as e:
            self.why = f"cannot build libfuse's passthrough_hp: {e}"
            return
        self.src.mkdir(parents=True, exist_ok=src is not None)
        env = {**os.environ, "LD_LIBRARY_PATH": str(exe.parents[1] / "lib")}
        self._start([str(exe), "--nopassthrough", "--foreground", str(self.src), str(self.mp)], self.mp,
                    work / "peer.log", "passthrough_hp", env)


class NullPeer(PeerMount):
    """``nullfs.py``: pyfuse3 and trio answering every request from memory, no I/O -- the
    binding's own cost per file, the floor under lakefuse's."""

    def __init__(self, work: Path):
        self._start([sys.executable, str(Path(__file__).with_name("nullfs.py")), str(work / "mnt")], work / "mnt",
                    work / "nullfs.log", "nullfs")


def build_passthrough_hp() -> Path:
    """libfuse's example/passthrough_hp from the vendored libfuse tarball, built once (a few
    minutes) into .venv/opt/libfuse-peer; its path."""
    dest = ROOT / ".venv" / "opt" / "libfuse-peer"
    exe = dest / "build" / "example" / "passthrough_hp"
    if exe.exists():
        return exe
    print("  (building libfuse's passthrough_hp once, the C peer of the small-file rows)", flush=True)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    tarball = next((ROOT / "scripts" / "vendor").glob("fuse3_*.orig.tar.gz"))
    subprocess.run(["tar", "-xzf", str(tarball), "-C", str(dest), "--strip-components=1"], check=True)
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"}
    subprocess.run(["meson", "setup", "build", "--buildtype=release", "-Dexamples=true", "-Dutils=false",
                    "-Dtests=false", "-Duseroot=false", "-Dinitscriptdir="], cwd=dest, env=env, check=True,
                   capture_output=True)
    subprocess.run(["ninja", "-C", "build", "example/passthrough_hp"], cwd=dest, env=env, check=True,
                   capture_output=True)
    return exe


def peer_rows(args, peer, rep: Report, ours: dict[str, float], name: str = "C FUSE peer") -> None:
    """The small-file work through a peer (:class:`CFusePeer`, :class:`NullPeer`; ``ours``:
    lakefuse's median seconds by row)."""
    kib, sz = f"{args.size / 1024:g} KiB", args.size
    if not peer.ok:
        print(f"  (no {name}: {peer.why})", flush=True)
        return
    pid = peer.proc.pid
    w, nw, nf = args.writers, args.files // args.writers * args.writers, args.fsync_files
    for key, label, n, run in (
            ("one", f"create+write+close {args.files} x {kib}", args.files,
             lambda r: small_files(peer.mp / f"small{r}", args.files, size=sz)),
            ("par", f"the same by {w} processes", nw,
             lambda r: small_files_parallel(peer.mp / f"par{r}", nw, w, size=sz)),
            ("fsync", f"create+write+fsync+close {nf} x {kib}", nf,
             lambda r: small_files(peer.mp / f"fsync{r}", nf, fsync=True, size=sz))):
        c0 = cpu_s(pid)
        times = [run(r) for r in range(args.reps)]
        cpu_ms = (cpu_s(pid) - c0) * 1000 / (n * args.reps)
        rep.add(f"{label}: {name}", f"{n / median(times):.0f} files/s",
                f"lakefuse x{median(times) / ours[key]:.2f} of it; its daemon CPU {cpu_ms:.2f} ms/file")


def bench_local(args, work: Path, rep: Report) -> None:
    native = work / "native"
    native.mkdir(parents=True)
    lf = LakefuseMount(work / "lf")
    try:
        b = lf.branch
        print(f"local store; {args.reps} rep(s); medians", flush=True)
        # sequential, taking turns, each from a clean start (no dirty pages of the last one piling up)
        nat, nat_f, ours, ours_f = [], [], [], []
        for r in range(args.reps):
            for out, path, fsync in ((nat, native / f"seq{r}", False), (ours, b / f"seq{r}", False),
                                     (nat_f, native / f"seqf{r}", True), (ours_f, b / f"seqf{r}", True)):
                drop_caches()
                out.append(seq_write(path, args.seq_mib, fsync))
        mb = args.seq_mib * MiB / 1e6
        rep.add(f"sequential write {args.seq_mib} MiB: lakefuse", f"{mb / median(ours):.0f} MB/s",
                f"{median(nat) / median(ours):.2f} of native ({mb / median(nat):.0f} MB/s)")
        rep.add("the same with an fsync before the close", f"{mb / median(ours_f):.0f} MB/s",
                f"{median(nat_f) / median(ours_f):.2f} of native with one ({mb / median(nat_f):.0f} MB/s)")
        for r in range(args.reps):
            os.unlink(native / f"seq{r}")
            os.unlink(native / f"seqf{r}")
        # small files
        print(f"  (creating an empty file here, natively: {create_cost_us(work / 'probe-before'):.0f} us; "
              "over ~100 the file system's inode allocator is in its slow state: see create_cost_us)", flush=True)
        kib = f"{args.size / 1024:g} KiB"
        sz = args.size
        nat = [small_files(native / f"small{r}", args.files, size=sz) for r in range(args.reps)]
        nat_f = [small_files(native / f"smallf{r}", args.files, fsync=True, size=sz) for r in range(args.reps)]
        c0, t0 = cpu_s(lf.proc.pid), thread_cpu(lf.proc.pid)
        q0, st0 = fuse_requests(lf.mp)
        ours = [small_files(b / f"small{r}", args.files, size=sz) for r in range(args.reps)]
        cpu_ms = (cpu_s(lf.proc.pid) - c0) * 1000 / (args.files * args.reps)
        t1 = thread_cpu(lf.proc.pid)
        q1, st1 = fuse_requests(lf.mp)
        n = args.files * args.reps
        inline = (st1.get("creates_inline", 0) - st0.get("creates_inline", 0)) / n
        got = {"one": median(ours)}
        rep.add(f"create+write+close {args.files} x {kib}: lakefuse", f"{args.files / median(ours):.0f} files/s",
                f"x{median(nat) / median(ours):.2f} of native ({args.files / median(nat):.0f}/s), "
                f"x{median(nat_f) / median(ours):.2f} of native+fsync ({args.files / median(nat_f):.0f}/s); "
                f"daemon CPU {cpu_ms:.2f} ms/file; {(q1 - q0) / n:.1f} FUSE requests/file, "
                f"creates without a thread {inline:.0%}")
        print(f"    requests/file: {per_file(st0, st1, n)}", flush=True)
        print(f"    daemon CPU by thread, us/file: {thread_split(t0, t1, n)}", flush=True)
        # small files by concurrent writers (their closes share KV transactions)
        w, nw = args.writers, args.files // args.writers * args.writers
        nat = [small_files_parallel(native / f"par{r}", nw, w, size=sz) for r in range(args.reps)]
        nat_f = [small_files_parallel(native / f"parf{r}", nw, w, fsync=True, size=sz) for r in range(args.reps)]
        c0 = cpu_s(lf.proc.pid)
        ours = [small_files_parallel(b / f"par{r}", nw, w, size=sz) for r in range(args.reps)]
        cpu_ms = (cpu_s(lf.proc.pid) - c0) * 1000 / (nw * args.reps)
        got["par"] = median(ours)
        rep.add(f"create+write+close {nw} x {kib} by {w} processes: lakefuse", f"{nw / median(ours):.0f} files/s",
                f"x{median(nat) / median(ours):.2f} of native ({nw / median(nat):.0f}/s), "
                f"x{median(nat_f) / median(ours):.2f} of native+fsync ({nw / median(nat_f):.0f}/s); "
                f"daemon CPU {cpu_ms:.2f} ms/file")
        # small files with an fsync before each close, 1 process
        nf = args.fsync_files
        nat_f = [small_files(native / f"fsync{r}", nf, fsync=True, size=sz) for r in range(args.reps)]
        ours = [small_files(b / f"fsync{r}", nf, fsync=True, size=sz) for r in range(args.reps)]
        rep.add(f"create+write+fsync+close {nf} x {kib}: lakefuse", f"{nf / median(ours):.0f} files/s",
                f"x{median(nat_f) / median(ours):.2f} of native+fsync ({nf / median(nat_f):.0f}/s)")
        got["fsync"] = median(ours)
        peer = CFusePeer(work / "cpeer")
        try:
            peer_rows(args, peer, rep, got)
        finally:
            peer.close()
        null = NullPeer(work / "nullpeer")
        try:
            peer_rows(args, null, rep, got, "pyfuse3 with nothing behind it")
        finally:
            null.close()
        print(f"  (creating an empty file here, natively: {create_cost_us(work / 'probe-after'):.0f} us)", flush=True)
        # tar -x of an archive of small files
        tsrc = work / "tarsrc"
        make_tree(tsrc, args.tar_files, sz)
        tarball = work / "small.tar"
        subprocess.run(["tar", "-cf", str(tarball), "-C", str(tsrc), "."], check=True)
        # tsrc stays until the end (the work directory goes then): on an ext4 without a journal
        # (these VMs) the inode allocator skips every inode freed in the last ~30 s, reading its
        # inode table block, from the start of the group, at each creation -- deleting 10,000
        # files here made each file created next (the daemon's spool files) cost up to ~0.4 ms
        # more CPU (scripts/bench/mount_core_files.py: the CPU outside its calling thread)
        nat, ours, cpu = [], [], 0.0
        q0, st0 = fuse_requests(lf.mp)
        t0 = thread_cpu(lf.proc.pid)
        for r in range(args.reps):
            (native / f"tar{r}").mkdir()
            nat.append(timed_cmd("tar", "-xf", str(tarball), "-C", str(native / f"tar{r}")))
            (b / f"tar{r}").mkdir()
            c0 = cpu_s(lf.proc.pid)
            ours.append(timed_cmd("tar", "-xf", str(tarball), "-C", str(b / f"tar{r}")))
            cpu += cpu_s(lf.proc.pid) - c0
        t1 = thread_cpu(lf.proc.pid)
        q1, st1 = fuse_requests(lf.mp)
        n = args.tar_files * args.reps
        rep.add(f"tar -x of {args.tar_files} x {kib}: lakefuse", f"{median(ours):.2f} s",
                f"x{median(nat) / median(ours):.2f} of native ({median(nat):.2f} s); "
                f"{args.tar_files / median(ours):.0f} files/s; daemon CPU {cpu * 1000 / n:.2f} ms/file; "
                f"{(q1 - q0) / n:.1f} FUSE requests/file")
        print(f"    requests/file: {per_file(st0, st1, n)}", flush=True)
        print(f"    daemon CPU by thread, us/file: {thread_split(t0, t1, n)}", flush=True)
        # commit of the staged files (the first rep's set plus the big files)
        t0 = time.perf_counter()
        (b / ".lakefuse" / "commit").write_text("bench: small files\n")
        commit_s = time.perf_counter() - t0
        n_staged = (args.files + nw + nf + args.tar_files) * args.reps + args.reps
        rep.add(f"commit of {n_staged} staged files via .lakefuse/commit", f"{commit_s:.2f} s")
        # cp -r
        src = work / "tree"
        make_tree(src, args.files)
        drop_caches()
        nat = [timed_cmd("cp", "-r", str(src), str(native / f"cp{r}")) for r in range(args.reps)]
        ours = [timed_cmd("cp", "-r", str(src), str(b / f"cp{r}")) for r in range(args.reps)]
        rep.add(f"cp -r of {args.files} files: lakefuse", f"{median(ours):.2f} s",
                f"x{median(nat) / median(ours):.2f} of native ({median(nat):.2f} s)")
        # rename of a directory of files
        nat = [timed_cmd("mv", str(native / f"cp{r}"), str(native / f"mv{r}")) for r in range(args.reps)]
        ours = [timed_cmd("mv", str(b / f"cp{r}"), str(b / f"mv{r}")) for r in range(args.reps)]
        rep.add(f"rename of a directory of {args.files} files: lakefuse", f"{median(ours):.3f} s",
                f"native {median(nat) * 1000:.1f} ms")
    finally:
        lf.close()


# ------------------------------------------------------------------ S3 peers


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ensure_tool(tool: str, package: str) -> bool:
    if shutil.which(tool):
        return True
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["bash", "-c", f"apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                                      f"{package} >/dev/null"], capture_output=True)
    return r.returncode == 0 and shutil.which(tool) is not None


def bench_s3(args, work: Path, rep: Report) -> None:
    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
           "LAKEFUSE_S3_ENDPOINT": endpoint}
    os.environ.update(env)
    moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        s3 = boto3.client("s3", endpoint_url=endpoint)
        for bucket in ("lakefuse", "rclone", "s3fs"):
            s3.create_bucket(Bucket=bucket)
        print(f"S3 (moto on 127.0.0.1:{port}); {args.reps} rep(s); medians", flush=True)
        mb = args.s3_seq_mib * MiB / 1e6
        results: dict[str, tuple[float, float]] = {}

        def run(name: str, root: Path) -> None:
            seq = [seq_write(root / f"seq{r}", args.s3_seq_mib) for r in range(args.reps)]
            small = [small_files(root / f"small{r}", args.s3_files, size=args.size) for r in range(args.reps)]
            results[name] = (median(seq), median(small))
            rep.add(f"S3 {name}: sequential {args.s3_seq_mib} MiB", f"{mb / median(seq):.0f} MB/s")
            rep.add(f"S3 {name}: {args.s3_files} small files", f"{args.s3_files / median(small):.0f} files/s")

        lf = LakefuseMount(work / "lf-s3", storage="s3://lakefuse/repo", env=env)
        try:
            run("lakefuse", lf.branch)
        finally:
            lf.close()
        # the limit for a write whose close returns once the object is stored: one boto3 upload of
        # a local file of that size (its multipart defaults), timed alone
        src = work / "s3-floor.bin"
        seq_write(src, args.s3_seq_mib)
        ups = []
        for r in range(args.reps):
            t0 = time.perf_counter()
            s3.upload_file(str(src), "lakefuse", f"floor{r}")
            ups.append(time.perf_counter() - t0)
        src.unlink()
        rep.add(f"S3 one boto3 upload of a {args.s3_seq_mib} MiB file", f"{mb / median(ups):.0f} MB/s",
                f"lakefuse's sequential write (the write and its close) {median(ups) / results['lakefuse'][0]:.2f} "
                "of it")
        if ensure_tool("rclone", "rclone"):
            mp = work / "rclone"
            mp.mkdir(parents=True)
            renv = {**{k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"},  # rclone refuses one for http
                    "RCLONE_CONFIG_MOTO_TYPE": "s3", "RCLONE_CONFIG_MOTO_PROVIDER": "Other",
                    "RCLONE_CONFIG_MOTO_ENDPOINT": endpoint, "RCLONE_CONFIG_MOTO_ACCESS_KEY_ID": "bench",
                    "RCLONE_CONFIG_MOTO_SECRET_ACCESS_KEY": "bench", "RCLONE_CONFIG_MOTO_FORCE_PATH_STYLE": "true"}
            p = subprocess.Popen(["rclone", "mount", "moto:rclone", str(mp), "--vfs-cache-mode", "writes",
                                  "--cache-dir", str(work / "rclone-cache")], env=renv,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_mount(mp, p)
                run("rclone mount (--vfs-cache-mode writes)", mp)
            except RuntimeError as e:
                print(f"  rclone: could not mount ({e}); skipped")
            finally:
                unmount(mp, p)
        else:
            print("  rclone: not installed and apt could not install it; skipped")
        if ensure_tool("s3fs", "s3fs"):
            mp = work / "s3fs"
            mp.mkdir(parents=True)
            pw = work / "s3fs.passwd"
            pw.write_text("bench:bench\n")
            pw.chmod(0o600)
            r = subprocess.run(["s3fs", "s3fs", str(mp), "-o", f"url={endpoint}", "-o", "use_path_request_style",
                                "-o", f"passwd_file={pw}"], capture_output=True, text=True)
            try:
                if r.returncode != 0:
                    raise RuntimeError(r.stderr.strip())
                wait_mount(mp)
                run("s3fs", mp)
            except RuntimeError as e:
                print(f"  s3fs: could not mount ({e}); skipped")
            finally:
                unmount(mp)
        else:
            print("  s3fs: not installed and apt could not install it; skipped")
        lf_seq, lf_small = results["lakefuse"]
        for name, (seq, small) in results.items():
            if name != "lakefuse":
                rep.add(f"S3 lakefuse vs {name}", f"seq x{seq / lf_seq:.2f}", f"small files x{small / lf_small:.2f}")
    finally:
        moto.terminate()
        moto.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--size", type=int, default=4096, help="bytes per small file")
    ap.add_argument("--fsync-files", type=int, default=2000, help="small files written with an fsync each")
    ap.add_argument("--tar-files", type=int, default=10_000, help="small files in the archive tar -x extracts")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--writers", type=int, default=8, help="processes for the concurrent small-file work")
    ap.add_argument("--s3", action="store_true", help="also run on S3 (moto) with rclone and s3fs as peers")
    ap.add_argument("--s3-seq-mib", type=int, default=256)
    ap.add_argument("--s3-files", type=int, default=1000)
    ap.add_argument("--s3-only", action="store_true", help="skip the local-store work")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir; same filesystem as native)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakefuse-bench-write-", dir=args.dir))
    rep = Report()
    try:
        if not args.s3_only:
            bench_local(args, work / "local", rep)
        if args.s3 or args.s3_only:
            bench_s3(args, work / "s3", rep)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
