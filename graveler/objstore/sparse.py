"""Copies that keep a file's holes: a sparse file stays sparse when it is copied.

A branch file grown with ``truncate`` (or written with ``dd seek=``) is mostly hole; a
copy that writes every byte it reads fills the holes in, so a 200 MB sparse file costs
200 MB of disk at its first change and a 1 GiB one fails with ENOSPC on a small spool disk.
:func:`copy_sparse` copies only the data extents (``SEEK_DATA``/``SEEK_HOLE``), in the
kernel where it can (``copy_file_range``); :func:`pwrite_sparse` lets a copy that reads (from
the store, from a file on another filesystem) skip writing its blocks of zeros. Either way the
destination reads back byte for byte as the source.
"""

from __future__ import annotations

import errno
import os

CHUNK = 1 << 20  # a read-and-write copy's piece
BLOCK = 64 << 10  # the grain of pwrite_sparse's holes
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


def pwrite_sparse(fd: int, data: bytes, offset: int) -> None:
    """Write ``data`` at ``offset`` into a file being filled from its start, except its
    :data:`BLOCK`-sized blocks of zeros (left as holes: the writer sets the file's size at the
    end, ``ftruncate``). A block is looked at byte by byte only when its first and last bytes
    are zero, so dense data costs two index operations a block."""
    n, i, start = len(data), 0, -1  # start: where the run of blocks to write began
    while i < n:
        j = min(i + BLOCK, n)
        hole = data[i] == 0 and data[j - 1] == 0 and data.count(0, i, j) == j - i
        if hole and start >= 0:
            pwrite_all(fd, memoryview(data)[start:i], offset + start)
            start = -1
        elif not hole and start < 0:
            start = i
        i = j
    if start >= 0:
        pwrite_all(fd, memoryview(data)[start:n], offset + start)


def pwrite_all(fd: int, data, offset: int) -> int:
    """Write all of ``data`` at ``offset``; how many bytes that was."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
    return done


def copy_sparse(src: int, dst: int, size: int) -> None:
    """Copy bytes ``[0, size)`` of ``src`` to the same offsets of ``dst`` (a new, empty file),
    its data extents only, then make ``dst`` ``size`` bytes long: the holes stay holes. Where
    the filesystem cannot say where its data is, everything is copied. OSError(EIO) if ``src``
    ends early."""
    off = 0
    while off < size:
        try:
            start = os.lseek(src, off, os.SEEK_DATA)
            end = min(os.lseek(src, start, os.SEEK_HOLE), size) if start < size else size
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data past off: a hole to the end
                break
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            start, end = off, size
        if start >= size:
            break
        _copy_span(src, dst, start, end)
        off = end
    os.ftruncate(dst, size)


def _copy_span(src: int, dst: int, start: int, end: int) -> None:
    off = start
    while off < end:
        try:
            n = os.copy_file_range(src, dst, end - off, off, off)
        except OSError as e:
            if e.errno not in _NO_KERNEL_COPY:
                raise
            chunk = os.pread(src, min(CHUNK, end - off), off)
            n = pwrite_all(dst, chunk, off) if chunk else 0
        if n == 0:
            raise OSError(errno.EIO, f"the file ended at {off} of {end} bytes")
        off += n
