"""fallocate(2) on branch files: the modes the mount takes, and zeroing a range of a spool file.

The kernel passes on only three flags (``FALLOC_FL_KEEP_SIZE``, ``PUNCH_HOLE`` and
``ZERO_RANGE``; it answers ``EOPNOTSUPP`` to the rest itself). What each does to a branch
file, which becomes an object on close:

* mode 0: the size grows to ``offset + length`` if it is smaller (the new bytes read as
  zeros); nothing is reserved: the object is written whole at close anyway;
* ``KEEP_SIZE`` alone: nothing visible changes (a reservation only): accepted, nothing done;
* ``PUNCH_HOLE | KEEP_SIZE`` (Linux refuses a punch without ``KEEP_SIZE``: ``EOPNOTSUPP``)
  and ``ZERO_RANGE``: the range reads as zeros; ``ZERO_RANGE`` without ``KEEP_SIZE`` also
  grows the size to its end.
"""

from __future__ import annotations

import ctypes
import errno
import os

from lakefuse.mount.errors import FsError

KEEP_SIZE = 0x01
PUNCH_HOLE = 0x02
ZERO_RANGE = 0x10
_ZEROS = bytes(1 << 20)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)


def check(mode: int, offset: int, length: int) -> None:
    """FsError unless the mount takes this fallocate (the errnos Linux gives)."""
    if offset < 0 or length <= 0:
        raise FsError(errno.EINVAL, f"fallocate of {length} bytes at {offset}")
    if mode & ~(KEEP_SIZE | PUNCH_HOLE | ZERO_RANGE) or (mode & PUNCH_HOLE and not mode & KEEP_SIZE) or (
            mode & PUNCH_HOLE and mode & ZERO_RANGE):
        raise FsError(errno.EOPNOTSUPP, f"fallocate mode {mode:#x} is not supported on branch files")


def zero(fd: int, offset: int, length: int) -> None:
    """Make ``length`` bytes at ``offset`` of the file ``fd`` (within its size) read as zeros: a
    hole punched where the filesystem can, else zeros written."""
    if _libc.fallocate(fd, PUNCH_HOLE | KEEP_SIZE, offset, length) == 0:
        return
    e = ctypes.get_errno()
    if e not in (errno.EOPNOTSUPP, errno.ENOSYS):
        raise OSError(e, os.strerror(e))
    end = offset + length
    while offset < end:
        offset += os.pwrite(fd, memoryview(_ZEROS)[:min(len(_ZEROS), end - offset)], offset)
