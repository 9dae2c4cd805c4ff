"""Chunk buffers a stream receives into, reused once nothing refers to them.

A stream (:mod:`graveler.objstore.prefetch`) brings a large object in chunks of 8 MiB. A fresh
buffer per chunk costs the kernel a page fault and a page of zeroes for every 4 KiB of it (on a
2-core machine, a fifth of what the whole read costs); a buffer that is reused has its pages
already. :class:`BufferPool` hands out page-aligned buffers (anonymous ``mmap``: page-aligned, so
the data cache writes them to its file with ``O_DIRECT`` as they are, without a copy) and takes
one back only when nothing else refers to it: a chunk held in memory by its reader, a memoryview
a FUSE reply holds, a write to the cache file -- all hold a reference to the buffer (a memoryview
holds one to the object it views), so a buffer whose only reference is the pool's is free. The
buffers are never written but by the stream that took them.
"""

from __future__ import annotations

import mmap
import sys
import threading

MiB = 1 << 20


class BufferPool:
    """Page-aligned writable buffers of ``size`` bytes; at most ``keep`` kept for reuse (more may
    be out at once: those are let go when done)."""

    def __init__(self, size: int, keep: int):
        self.size = size
        self.keep = keep
        self._bufs: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self.made = 0  # buffers allocated (the rest of the takes reused one)
        self.taken = 0

    def take(self) -> mmap.mmap:
        """A buffer nothing else refers to (its old bytes still in it: the caller overwrites them)."""
        with self._lock:
            self.taken += 1
            bufs = self._bufs
            for i in range(len(bufs)):
                # two references: the list's and getrefcount's argument -- nobody else has it
                if sys.getrefcount(bufs[i]) == 2:
                    buf = bufs[i]
                    return buf
            self.made += 1
            buf = mmap.mmap(-1, self.size)
            if len(bufs) < self.keep:
                bufs.append(buf)
            return buf

    def trim(self, keep: int) -> None:
        """Let go of free buffers past ``keep`` kept ones (what is held stays)."""
        with self._lock:
            bufs = self._bufs
            for i in range(len(bufs) - 1, -1, -1):
                if len(bufs) <= keep:
                    break
                if sys.getrefcount(bufs[i]) == 2:
                    del bufs[i]

    def free(self) -> int:
        """How many kept buffers nothing refers to (for tests)."""
        with self._lock:
            return sum(1 for i in range(len(self._bufs)) if sys.getrefcount(self._bufs[i]) == 2)


_pools: dict[int, BufferPool] = {}
_pools_lock = threading.Lock()
# Buffers kept per chunk size: a reader holds up to its window of chunks (19 at the widest:
# see graveler.objstore.prefetch) and the cache file's writer a few more; more readers at once
# allocate past it (their extra buffers are freed after use). When a reader closes, or the
# last stream ends, what is free beyond KEEP_IDLE goes (192 MiB at most while streams run,
# 64 MiB kept between them, with 8 MiB chunks).
KEEP = 24
KEEP_IDLE = 8


def pool(size: int) -> BufferPool:
    """The process's pool of ``size``-byte buffers."""
    with _pools_lock:
        p = _pools.get(size)
        if p is None:
            p = _pools[size] = BufferPool(size, KEEP)
        return p


def trim_idle() -> None:
    """Every pool down to :data:`KEEP_IDLE` free buffers (those in use stay)."""
    with _pools_lock:
        pools = list(_pools.values())
    for p in pools:
        p.trim(KEEP_IDLE)


__all__ = ["BufferPool", "pool", "trim_idle"]
