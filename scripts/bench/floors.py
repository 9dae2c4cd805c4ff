"""Physical floors the benchmarks compare against, measured in the same run as what they bound."""

from __future__ import annotations

import os
import time


def write_floor(root: str, sizes) -> float:
    """Seconds to write and fsync new files of the given sizes (each file, then the directory once): what
    writing that many new range/metarange files costs on this disk, the floor under any commit, apply or
    merge that writes them. ``sizes`` is one size or a list of sizes."""
    if isinstance(sizes, int):
        sizes = [sizes]
    blobs = [os.urandom(size) for size in sizes]
    paths = [os.path.join(root, f"floor-{i}.tmp") for i in range(len(blobs))]
    t = time.perf_counter()
    for path, data in zip(paths, blobs):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    dfd = os.open(root, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    s = time.perf_counter() - t
    for path in paths:
        os.unlink(path)
    return s


def tree_files(root: str) -> dict[str, int]:
    """Every file under ``root`` with its size (to see which files an operation wrote)."""
    out = {}
    for d, _, names in os.walk(root):
        for name in names:
            p = os.path.join(d, name)
            try:
                out[p] = os.stat(p).st_size
            except FileNotFoundError:
                pass
    return out


def hash_floor(nbytes: int) -> float:
    """Seconds for one SHA-256 (hashlib: OpenSSL, SHA-NI where the CPU has it) over ``nbytes``: the floor
    under re-hashing that many bytes of records into a range ID."""
    import hashlib

    data = os.urandom(nbytes)
    t = time.perf_counter()
    hashlib.sha256(data).digest()
    return time.perf_counter() - t
