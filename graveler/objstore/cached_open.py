"""Opening a local file without waiting for the disk: ``openat2(2)`` with ``RESOLVE_CACHED``.

Linux (5.12 and later) can refuse an open that would have to read a directory from
the disk to find the file (``EAGAIN``): the open then costs no more than a memory
look-up, and a caller that must not wait (an event loop) can do it itself, leaving
only the refused ones to a worker thread. Where there is no ``openat2`` (another
kernel, another libc) :func:`open_cached` always says "would wait" (None).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}  # the same number on every architecture since 5.6
_RESOLVE_CACHED = 0x20
_AT_FDCWD = -100


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_NR = _SYS_OPENAT2.get(os.uname().machine) if sys.platform.startswith("linux") else None


def _load():
    if _NR is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_HOW_SIZE = ctypes.sizeof(_OpenHow)
_syscall = _load()
_available = _syscall is not None
_hows: dict[int, tuple] = {}  # flags -> (its open_how, a reference to it)


def open_cached(path: str, flags: int) -> int | None:
    """A descriptor on ``path`` (``flags`` without ``O_CREAT``/``O_TRUNC``) when every
    component of the path is in the kernel's dentry cache, else None (it would wait for
    the disk, the file is missing, or ``openat2`` is not there: the caller opens it the
    usual way, where waiting is allowed, and gets the real error there)."""
    global _available
    if not _available:
        return None
    ref = _hows.get(flags)
    if ref is None:  # one struct per flags, kept (the kernel only reads it): no ctypes object per call
        how = _OpenHow(flags, 0, _RESOLVE_CACHED)
        ref = _hows[flags] = (how, ctypes.byref(how))
    fd = _syscall(_NR, _AT_FDCWD, os.fsencode(path), ref[1], _HOW_SIZE)
    if fd >= 0:
        return fd
    if ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL, errno.E2BIG, errno.EPERM):  # no openat2 or no RESOLVE_CACHED
        _available = False
    return None
