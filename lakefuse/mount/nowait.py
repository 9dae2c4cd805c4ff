"""Reads of a local file that never wait: what the page cache holds, or nothing.

The FUSE adapter answers a read on the trio thread when its bytes are in memory
already; for a local file (a local store's object file, a spool file) that includes
the page cache: ``preadv2(..., RWF_NOWAIT)`` returns what is cached and never goes
to the disk. A read it cannot answer whole goes to a worker thread, as any
blocking read does.
"""

from __future__ import annotations

import os


def pread_nowait(fd: int, offset: int, n: int) -> bytearray | None:
    """Exactly ``n`` bytes of ``fd`` at ``offset`` when the page cache holds all of them,
    else None (nothing cached at ``offset`` (EAGAIN), only a part cached (a short read:
    the caller knows the size, so ``n`` never reaches past the end), a file system
    without RWF_NOWAIT (EOPNOTSUPP), any other error: the blocking read then says)."""
    if n <= 0:
        return bytearray()
    buf = bytearray(n)
    try:
        got = os.preadv(fd, [buf], offset, os.RWF_NOWAIT)
    except OSError:
        return None
    return buf if got == n else None
