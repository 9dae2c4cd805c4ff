"""A file exerciser in the spirit of xfstests' fsx, our own: random operations on one file,
each checked against an in-memory model of what the file must hold.

Operations (chosen by a seeded RNG, so a run is reproducible from its seed):

* ``read``: ``pread`` of a random range, compared with the model (a read past the end is
  short, exactly at the model's size);
* ``read2``: the same through a second, read-only descriptor of the same file;
* ``openread``: the same through an open of the path of its own, closed right after;
* ``write``: ``pwrite`` of random bytes at a random offset; now and then past the end, which
  leaves a hole the model fills with zeros;
* ``copyrange``: ``copy_file_range`` of a range of the file to a place that does not
  overlap it, possibly past the end;
* ``truncate``: ``ftruncate`` to a random size, down or up (up leaves zeros);
  ``ptruncate``: the same by ``truncate(2)`` of the path;
* ``mapread``: ``mmap`` (``MAP_SHARED``) of a range of the file, compared with the model;
* ``mapwrite``: the same, written through the map, then ``msync`` (the file is first
  extended with ``ftruncate`` when the range runs past its end: a store past the end of a
  mapped file is SIGBUS);
* ``fsync``: now and then.

Every ``reopen_every`` operations both descriptors are closed and the file opened again
(a close is a save on a lakefuse branch tree); every ``check_every`` operations, and at
the end, the whole file is read back and compared, and its size checked through
``fstat`` and ``stat`` of its path. The last ``log_keep`` operations are kept; a mismatch
raises :class:`Mismatch`, whose message has the seed, the operation that saw it, the first
differing offset, which logged operations last touched that offset, and the log.

As a script: ``python tests/fsxlike.py PATH --ops N --seed S`` (``--help`` for the rest);
exit 0 and a summary line when every operation matched, 1 and the report otherwise
(``--model-out FILE`` keeps the final model, for comparing copies of the file later).
A program that serves the file from its own process (a moto server in a test's thread)
must run it as a script: ``mmap.flush`` and page faults hold Python's GIL.
Standard library only, so the script runs without the project on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field

PAGE = mmap.ALLOCATIONGRANULARITY

# Relative weights of the random operations (reopen and the whole-file check are periodic).
WEIGHTS = {"read": 16, "read2": 4, "openread": 3, "write": 18, "copyrange": 5, "truncate": 6, "ptruncate": 2,
           "mapread": 12, "mapwrite": 12, "fsync": 1}
MAP_OPS = ("mapread", "mapwrite")
SKIP = "skip"  # what an operation returns when the file gave it nothing to do (counted as "skip")


class Mismatch(AssertionError):
    """The file and the model disagree (or an operation failed); the message says how."""


@dataclass
class Options:
    seed: int = 1
    max_size: int = 256 * 1024  # the file never grows past this
    max_op_len: int = 64 * 1024  # longest read, write or map
    reopen_every: int = 500  # close both descriptors and open again every N operations (0: never)
    check_every: int = 100  # compare the whole file every N operations (0: only at the end)
    hole_chance: float = 0.15  # share of writes that start past the end of the file
    mmap: bool = True  # mapped reads and writes
    log_keep: int = 1000  # operations kept for the failure report
    weights: dict = field(default_factory=lambda: dict(WEIGHTS))


class Exerciser:
    """Runs random operations on ``path`` (created or emptied first) against a model."""

    def __init__(self, path: str | os.PathLike, opts: Options | None = None):
        self.path = os.fspath(path)
        self.opts = opts or Options()
        if self.opts.max_size < 1 or self.opts.max_op_len < 1:
            raise ValueError("max_size and max_op_len must be positive")
        self.rng = random.Random(self.opts.seed)
        self.model = bytearray()
        self.log: deque[tuple] = deque(maxlen=self.opts.log_keep)
        self.counts: Counter = Counter()
        self.opnum = 0
        self.fd = -1
        self.rfd = -1
        weights = {k: v for k, v in self.opts.weights.items() if v > 0 and (self.opts.mmap or k not in MAP_OPS)}
        self._names = list(weights)
        self._cum = []
        total = 0
        for k in self._names:
            total += weights[k]
            self._cum.append(total)

    # -- descriptors -------------------------------------------------------------------------

    def _open(self, create: bool = False) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        self.fd = os.open(self.path, flags, 0o644)
        self.rfd = os.open(self.path, os.O_RDONLY)

    def _close(self) -> None:
        for name in ("rfd", "fd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)

    # -- the run -----------------------------------------------------------------------------

    def run(self, ops: int) -> Counter:
        """Do ``ops`` random operations; returns how many of each ran so far (``reopen`` and
        ``check`` included). The first run creates or empties the file, a later one goes on
        with it. Raises :class:`Mismatch` at the first disagreement."""
        try:
            self._run(ops)
        except OSError as e:  # outside an operation: an open, a close (a save), a check
            self._fail(f"failed: {e!r}")
        return self.counts

    def _run(self, ops: int) -> None:
        self._open(create=self.opnum == 0)
        try:
            self._check_size("at open")
            for _ in range(ops):
                self.opnum += 1
                name = self._pick()
                try:
                    skipped = getattr(self, "_op_" + name)() == SKIP
                except Mismatch:
                    raise
                except OSError as e:
                    self._fail(f"{name} failed: {e!r}")
                self.counts["skip" if skipped else name] += 1
                o = self.opts
                if o.check_every and self.opnum % o.check_every == 0:
                    self.check_whole("check")
                if o.reopen_every and self.opnum % o.reopen_every == 0:
                    self._reopen()
            self.check_whole("final check")
        finally:
            self._close()
        self.log.append((self.opnum, "closed", 0, 0, len(self.model)))
        self.check_path_bytes("after close")

    def _pick(self) -> str:
        x = self.rng.random() * self._cum[-1]
        for name, c in zip(self._names, self._cum):
            if x < c:
                return name
        return self._names[-1]

    def _reopen(self) -> None:
        self.log.append((self.opnum, "reopen", 0, 0, len(self.model)))
        self._close()
        self._open()
        self.counts["reopen"] += 1
        self._check_size("after reopen")

    # -- operations --------------------------------------------------------------------------

    def _range(self, size: int) -> tuple[int, int]:
        """A random (offset, length) inside [0, size), length >= 1; size must be > 0."""
        off = self.rng.randrange(size)
        n = self.rng.randint(1, min(self.opts.max_op_len, size - off))
        return off, n

    def _op_read(self, fd: int | None = None, name: str = "read") -> None:
        size = len(self.model)
        if size == 0:
            off, n = 0, self.rng.randint(1, self.opts.max_op_len)
        else:
            off = self.rng.randrange(size)
            n = self.rng.randint(1, self.opts.max_op_len)  # may run past the end: a short read
        self.log.append((self.opnum, name, off, n, size))
        got = _pread_all(self.fd if fd is None else fd, n, off)
        want = bytes(self.model[off:off + n])
        if got != want:
            self._fail_bytes(name, off, got, want)

    def _op_read2(self) -> None:
        self._op_read(self.rfd, "read2")

    def _op_write(self) -> None:
        o = self.opts
        size = len(self.model)
        n = self.rng.randint(1, min(o.max_op_len, o.max_size))
        if size and self.rng.random() >= o.hole_chance:
            off = self.rng.randrange(min(size, o.max_size - n + 1))
        else:  # at or past the end: extends the file, leaving a hole when past it
            off = self.rng.randint(min(size, o.max_size - n), o.max_size - n)
        data = self.rng.randbytes(n)
        self.log.append((self.opnum, "write", off, n, size))
        done = 0
        while done < n:
            w = os.pwrite(self.fd, data[done:], off + done)
            if w <= 0:
                self._fail(f"write returned {w} at {off + done}")
            done += w
        if off > size:
            self.model.extend(bytes(off - size))
        self.model[off:off + n] = data
        self._check_size("after write")

    def _op_truncate(self) -> None:
        size = len(self.model)
        new = self.rng.randint(0, self.opts.max_size)
        self.log.append((self.opnum, "truncate", new, 0, size))
        os.ftruncate(self.fd, new)
        if new < size:
            del self.model[new:]
        else:
            self.model.extend(bytes(new - size))
        self._check_size("after truncate")

    def _op_mapread(self) -> str | None:
        size = len(self.model)
        if size == 0:
            self.log.append((self.opnum, "mapread(skip: empty)", 0, 0, 0))
            return SKIP
        off, n = self._range(size)
        self.log.append((self.opnum, "mapread", off, n, size))
        base = off - off % PAGE
        with mmap.mmap(self.fd, off + n - base, mmap.MAP_SHARED, mmap.PROT_READ, offset=base) as m:
            got = m[off - base:off - base + n]
        want = bytes(self.model[off:off + n])
        if got != want:
            self._fail_bytes("mapread", off, got, want)

    def _op_mapwrite(self) -> None:
        o = self.opts
        size = len(self.model)
        n = self.rng.randint(1, min(o.max_op_len, o.max_size))
        off = self.rng.randint(0, min(size, o.max_size - n))  # may run past the end: extended first
        data = self.rng.randbytes(n)
        self.log.append((self.opnum, "mapwrite", off, n, size))
        if off + n > size:
            os.ftruncate(self.fd, off + n)
            self.model.extend(bytes(off + n - size))
        base = off - off % PAGE
        with mmap.mmap(self.fd, off + n - base, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                       offset=base) as m:
            m[off - base:off - base + n] = data
            m.flush()  # msync(MS_SYNC)
        self.model[off:off + n] = data
        self._check_size("after mapwrite")

    def _op_openread(self) -> None:
        """A read through an open of the path of its own, closed again (a close of another
        handle while the file is being written: a save on a lakefuse branch tree)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            self._op_read(fd, "openread")
        finally:
            os.close(fd)

    def _op_copyrange(self) -> str | None:
        """``copy_file_range`` of a range of the file to a place that does not overlap it
        (possibly past the end: it extends the file)."""
        o = self.opts
        size = len(self.model)
        if size == 0:
            self.log.append((self.opnum, "copyrange(skip: empty)", 0, 0, 0))
            return SKIP
        src, n = self._range(size)
        n = max(1, min(n, o.max_size // 4))  # leaves room for dst on one side of src
        # dst in [0, max_size - n], outside (src - n, src + n): the ranges must not overlap
        below, above = max(0, src - n + 1), min(o.max_size - n + 1, src + n)
        choices = below + max(0, o.max_size - n + 1 - above)
        if choices <= 0:  # only for a tiny max_size
            self.log.append((self.opnum, "copyrange(skip: no room)", 0, 0, size))
            return SKIP
        k = self.rng.randrange(choices)
        dst = k if k < below else above + (k - below)
        self.log.append((self.opnum, "copyrange", dst, n, size))
        self.log.append((self.opnum, "  (from)", src, n, size))
        done = 0
        while done < n:
            c = os.copy_file_range(self.fd, self.fd, n - done, src + done, dst + done)
            if c <= 0:
                self._fail(f"copy_file_range returned {c} after {done} of {n} bytes")
            done += c
        data = bytes(self.model[src:src + n])
        if dst > size:
            self.model.extend(bytes(dst - size))
        self.model[dst:dst + n] = data
        self._check_size("after copyrange")

    def _op_ptruncate(self) -> None:
        """``truncate(2)`` of the path, not the descriptor."""
        size = len(self.model)
        new = self.rng.randint(0, self.opts.max_size)
        self.log.append((self.opnum, "ptruncate", new, 0, size))
        os.truncate(self.path, new)
        if new < size:
            del self.model[new:]
        else:
            self.model.extend(bytes(new - size))
        self._check_size("after ptruncate")

    def _op_fsync(self) -> None:
        self.log.append((self.opnum, "fsync", 0, 0, len(self.model)))
        os.fsync(self.fd)

    # -- checks ------------------------------------------------------------------------------

    def _check_size(self, when: str) -> None:
        got = os.fstat(self.fd).st_size
        if got != len(self.model):
            self._fail(f"fstat size {got} {when}, the model's is {len(self.model)}")

    def check_whole(self, name: str) -> None:
        """The whole file through the read-write descriptor, and its size by fstat and stat."""
        self.log.append((self.opnum, name, 0, len(self.model), len(self.model)))
        self.counts["check"] += 1
        self._check_size(name)
        st = os.stat(self.path).st_size
        if st != len(self.model):
            self._fail(f"stat of the path says size {st} ({name}), the model's is {len(self.model)}")
        got = _pread_all(self.fd, len(self.model) + 1, 0)
        if got != self.model:
            self._fail_bytes(name, 0, got, bytes(self.model))

    def check_path_bytes(self, when: str) -> None:
        """The file read through a fresh open of its path (no descriptor of the run open)."""
        with open(self.path, "rb") as f:
            got = f.read()
        if got != self.model:
            self._fail_bytes(f"read of the path {when}", 0, got, bytes(self.model))

    def check_other(self, path: str | os.PathLike, what: str) -> None:
        """Another file (e.g. the same file in a commit) holds exactly the model's bytes."""
        with open(path, "rb") as f:
            got = f.read()
        if got != self.model:
            self._fail_bytes(what, 0, got, bytes(self.model))

    # -- reports -----------------------------------------------------------------------------

    def _fail_bytes(self, name: str, off: int, got: bytes, want: bytes) -> None:
        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        bad = off + i
        detail = (f"{name} at {off}: got {len(got)} bytes, expected {len(want)}; first difference at file offset "
                  f"{bad}: got {got[i:i + 16].hex(' ')} expected {want[i:i + 16].hex(' ')}")
        touched = [e for e in self.log if _touches(e, bad)][-5:]
        if touched:
            detail += "\nlast logged operations touching that offset:\n" + "\n".join(map(_fmt, touched))
        self._fail(detail)

    def _fail(self, detail: str) -> None:
        o = self.opts
        head = (f"fsxlike: operation {self.opnum} of seed {o.seed} failed on {self.path} "
                f"(max_size {o.max_size}, max_op_len {o.max_op_len}, reopen_every {o.reopen_every}, "
                f"check_every {o.check_every}, mmap {o.mmap}): {detail}")
        log = "\n".join(_fmt(e) for e in self.log)
        raise Mismatch(f"{head}\nthe last {len(self.log)} operations (number, op, offset, length, size before):\n"
                       f"{log}\n{head}")


def _touches(entry: tuple, offset: int) -> bool:
    _, name, off, n, size = entry
    if name in ("write", "mapwrite", "copyrange"):
        return off <= offset < off + n
    if name in ("truncate", "ptruncate"):  # off is the new size
        return min(off, size) <= offset
    return False


def _fmt(entry: tuple) -> str:
    num, name, off, n, size = entry
    if name in ("truncate", "ptruncate"):
        return f"{num:7d} {name:<11} {size:#x} -> {off:#x}"
    if "skip" in name:
        return f"{num:7d} {name}"
    if name in ("reopen", "fsync", "closed"):
        return f"{num:7d} {name:<11} (size {size:#x})"
    return f"{num:7d} {name:<11} {off:#x} + {n:#x} = {off + n:#x} (size {size:#x})"


def _pread_all(fd: int, n: int, off: int) -> bytes:
    """``pread`` until ``n`` bytes or the end of the file."""
    parts = []
    while n > 0:
        b = os.pread(fd, n, off)
        if not b:
            break
        parts.append(b)
        n -= len(b)
        off += len(b)
    return b"".join(parts)


def main(argv: list[str] | None = None) -> int:
    d = Options()
    p = argparse.ArgumentParser(
        description="Random reads, writes, truncates, mapped reads and writes, fsyncs and close/reopen on one "
                    "file, each checked against an in-memory model of its content. Exit 0 when all matched, "
                    "1 with the seed and the log of the last operations otherwise.")
    p.add_argument("path", help="the file to exercise (created, or emptied first)")
    p.add_argument("--ops", type=int, default=10_000, help="operations to run (default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the random operations (default %(default)s)")
    p.add_argument("--max-size", type=int, default=d.max_size, help="largest file size (default %(default)s)")
    p.add_argument("--max-op-len", type=int, default=d.max_op_len,
                   help="longest read, write or map (default %(default)s)")
    p.add_argument("--reopen-every", type=int, default=d.reopen_every,
                   help="close and reopen every N operations, 0 never (default %(default)s)")
    p.add_argument("--check-every", type=int, default=d.check_every,
                   help="compare the whole file every N operations, 0 only at the end (default %(default)s)")
    p.add_argument("--no-mmap", action="store_true", help="no mapped reads and writes")
    p.add_argument("--log-keep", type=int, default=d.log_keep,
                   help="operations kept for the failure report (default %(default)s)")
    p.add_argument("--model-out", metavar="FILE",
                   help="after a run that matched, write the model (the bytes the file must hold) to FILE")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    a = p.parse_args(argv)
    if a.ops < 0 or a.max_size < 1 or a.max_op_len < 1 or a.log_keep < 1:
        p.error("--ops must be >= 0; --max-size, --max-op-len and --log-keep >= 1")
    opts = Options(seed=a.seed, max_size=a.max_size, max_op_len=a.max_op_len, reopen_every=a.reopen_every,
                   check_every=a.check_every, mmap=not a.no_mmap, log_keep=a.log_keep)
    ex = Exerciser(a.path, opts)
    t0 = time.monotonic()
    try:
        counts = ex.run(a.ops)
    except Mismatch as e:
        print(e, file=sys.stderr)
        return 1
    took = time.monotonic() - t0
    if a.model_out:
        with open(a.model_out, "wb") as f:
            f.write(ex.model)
    if a.json:
        print(json.dumps({"ops": a.ops, "seed": a.seed, "seconds": round(took, 3), "size": len(ex.model),
                          "counts": dict(counts)}))
        return 0
    print(f"fsxlike: {a.ops} operations on {a.path} matched the model (seed {a.seed}, {took:.1f} s, "
          f"{a.ops / took if took else 0:.0f} ops/s, final size {len(ex.model)}): "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
