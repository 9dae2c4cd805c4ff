"""Physical floors the benchmarks compare against, measured in the same run as what they bound."""

from __future__ import annotations

import os
import time


_floor_files = 0


def write_floor(root: str, sizes, keep: list[str] | None = None, pool: bytes | None = None) -> float:
    """Seconds to write and fsync new files of the given sizes (each file, then the directory once): what
    writing that many new range/metarange files costs on this disk, the floor under any commit, apply or
    merge that writes them. ``sizes`` is one size or a list of sizes.

    ``keep``: the files stay (their paths are added to it; the caller removes them), as the files an
    operation writes do, so the floor's page cache grows as the operation's does; otherwise they are
    removed at once and the next floor writes into the page cache they freed. ``pool``: random bytes to
    write slices of (made beforehand, so that no memory is allocated and freed around what is measured)."""
    global _floor_files
    if isinstance(sizes, int):
        sizes = [sizes]
    if pool is not None and max(sizes, default=0) <= len(pool):
        view = memoryview(pool)
        blobs = [view[:size] for size in sizes]
    else:
        blobs = [os.urandom(size) for size in sizes]
    paths = [os.path.join(root, f"floor-{_floor_files + i}.tmp") for i in range(len(blobs))]
    _floor_files += len(blobs)
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
    if keep is not None:
        keep.extend(paths)
    else:
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


def hash_floor(nbytes: int, pool: bytes | None = None) -> float:
    """Seconds for one SHA-256 (hashlib: OpenSSL, SHA-NI where the CPU has it) over ``nbytes``: the floor
    under re-hashing that many bytes of records into a range ID (``pool``: as for ``write_floor``)."""
    import hashlib

    data = memoryview(pool)[:nbytes] if pool is not None and nbytes <= len(pool) else os.urandom(nbytes)
    t = time.perf_counter()
    hashlib.sha256(data).digest()
    return time.perf_counter() - t


def large_folio_share(path: Path | str, pages: int = 4096) -> float | None:
    """The share of the first ``pages`` cached pages of ``path`` that belong to large folios
    (several pages managed as one: ext4 reads and copies them a folio at a time), from
    /proc/self/pagemap and /proc/kpageflags (root only: None elsewhere). The kernel's FUSE page
    cache keeps single pages where ext4 keeps large folios, which sets a FUSE daemon's warm rate."""
    import ctypes
    import mmap
    import struct

    try:
        with open(path, "rb") as f, open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
            size = min(os.fstat(f.fileno()).st_size, pages * 4096) // 4096 * 4096
            if size == 0:
                return None
            m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # (never written: the cached pages)
            try:
                anchor = ctypes.c_char.from_buffer(m)
                base = ctypes.addressof(anchor)
                del anchor
                large = seen = 0
                for i in range(size // 4096):
                    m[i * 4096]  # (touched: its page-table entry names the cached page)
                    pm.seek((base // 4096 + i) * 8)
                    entry = struct.unpack("Q", pm.read(8))[0]
                    if not entry >> 63 & 1:
                        continue
                    kf.seek((entry & ((1 << 55) - 1)) * 8)
                    flags = struct.unpack("Q", kf.read(8))[0]
                    seen += 1
                    large += bool(flags >> 15 & 3)  # COMPOUND_HEAD or COMPOUND_TAIL
                return round(large / seen, 2) if seen else None
            finally:
                m.close()
    except (OSError, ValueError, TypeError, BufferError, struct.error):
        return None
