#!/usr/bin/env python3
"""A FUSE request's round trip through a lakefuse mount: the fixed cost every operation pays.

Each row is one system call in a loop, on a file of a branch tree opened once, against the
same call on a native file in the same run (medians of ``--reps`` runs of ``--n`` calls):

* ``getxattr`` of ``security.capability`` (the name the kernel asks for before every write):
  answered on the trio thread (ENOTSUP), no I/O: the dispatch alone -- the kernel's queue,
  pyfuse3's session loop, the handler's error boundary and the reply;
* ``listxattr``: answered in a worker thread (one thread hand-off and back);
* ``pwrite`` of 1 byte into a branch file created write-only (direct I/O: one WRITE request per
  call, no ``getxattr`` before it): a worker thread writes the spool file and answers the
  request itself (``pyfuse3.Reply``: a hand-off one way), beside the same on a second mount with
  ``LAKEFUSE_DEFERRED_REPLIES=0`` (the trio thread woken to answer), in the same run: the ratio
  is what deferred replies save per request.

Beside each: the daemon's CPU per request (user + system, all its threads, from
``/proc/<pid>/stat``). A native call never leaves the kernel, so the ratio shows what a FUSE
round trip costs here rather than a target; the daemon's CPU per request is the figure to
lower. Run it with ``PYTHONPATH`` pointing at another pyfuse3 build to compare two builds:
the mount's daemon inherits the environment.

    .venv/bin/python scripts/bench/mount_requests.py
    .venv/bin/python scripts/bench/mount_requests.py --n 20000 --reps 5
"""

from __future__ import annotations

import argparse
import errno
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mount_write import LakefuseMount, cpu_s  # noqa: E402  (the bench's mount and the daemon's CPU seconds)


def getxattr_loop(fd: int, n: int) -> None:
    for _ in range(n):
        try:
            os.getxattr(fd, "security.capability")
        except OSError as e:
            if e.errno not in (errno.ENODATA, errno.ENOTSUP):
                raise


def listxattr_loop(fd: int, n: int) -> None:
    for _ in range(n):
        os.listxattr(fd)


def pwrite_loop(fd: int, n: int) -> None:
    for i in range(n):
        os.pwrite(fd, b"y", i & 4095)


def timed(fn, fd: int, n: int, pid: int | None) -> tuple[float, float | None]:
    c0 = cpu_s(pid) if pid else 0.0
    t0 = time.perf_counter()
    fn(fd, n)
    t = time.perf_counter() - t0
    return t / n * 1e6, ((cpu_s(pid) - c0) / n * 1e6 if pid else None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10000, help="calls per run (default 10,000)")
    p.add_argument("--reps", type=int, default=3, help="runs per row (default 3; medians)")
    p.add_argument("--dir", help="work directory (default: a temp dir, removed after)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        native = work / "native.bin"
        native.write_bytes(b"x" * 4096)
        lf = LakefuseMount(work / "lf")
        off = LakefuseMount(work / "off", env={"LAKEFUSE_DEFERRED_REPLIES": "0"})
        fds: list[int] = []
        try:
            for m in (lf, off):
                (m.branch / "one.bin").write_bytes(b"x" * 4096)
            nfd, mfd = os.open(native, os.O_RDONLY), os.open(lf.branch / "one.bin", os.O_RDONLY)
            created = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # (as cp and tar create: direct I/O)
            nwfd = os.open(work / "native.w", created, 0o644)
            mwfd, owfd = (os.open(m.branch / "w.bin", created, 0o644) for m in (lf, off))
            fds += [nfd, mfd, nwfd, mwfd, owfd]
            print(f"a request's round trip, {args.reps} run(s) of {args.n:,} calls; medians")
            got = {}
            for name, fn, fd, nat_fd, m in (
                    ("getxattr security.capability (trio thread)", getxattr_loop, mfd, nfd, lf),
                    ("listxattr (a worker thread)", listxattr_loop, mfd, nfd, lf),
                    ("pwrite 1 byte (a worker thread answers it)", pwrite_loop, mwfd, nwfd, lf),
                    ("pwrite 1 byte, LAKEFUSE_DEFERRED_REPLIES=0", pwrite_loop, owfd, nwfd, off)):
                fn(fd, 200)  # (warm: the first requests make the handler's state)
                ours, cpu, nat = [], [], []
                for _ in range(args.reps):
                    us, c = timed(fn, fd, args.n, m.proc.pid)
                    ours.append(us)
                    cpu.append(c)
                    nat.append(timed(fn, nat_fd, args.n, None)[0])
                o, n_ = statistics.median(ours), statistics.median(nat)
                got[name] = o
                print(f"  {name:45s} {o:8.1f} us/request (native {n_:.1f} us: x{o / n_:.0f}); "
                      f"daemon CPU {statistics.median(cpu):.1f} us/request")
            a, b = (got[k] for k in list(got)[2:])
            print(f"  deferred replies: a worker-thread write request in {a / b:.2f} of the time it takes answered "
                  f"from the trio thread")
        finally:
            for fd in fds:
                os.close(fd)
            lf.close()
            off.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
