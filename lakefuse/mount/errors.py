"""The one errno policy of the mount, and the core's own error.

Every failure graveler reports is a :class:`graveler.errors.GravelerError`; the
table below gives each class its errno (the most specific class wins). The
filesystem core raises :class:`FsError` for conditions that are about the
filesystem rather than the repository (EROFS, ENOTDIR, ENAMETOOLONG...). An
``OSError`` comes from a local file of the daemon's own (a spool file, the data
cache, a local object file): the errnos in :data:`OS_ERRNOS` are the caller's
answer as they are (a full disk, a file too large), any other is EIO. Anything
else that escapes a handler is a bug: the FUSE adapter logs it with its traceback
and answers EIO.
"""

from __future__ import annotations

import errno
import logging
import threading

from graveler import errors as g

# Exhaustive on purpose (tests/test_mount_core.py walks every GravelerError subclass):
# a new error class must be given its errno here.
ERRNO_TABLE: dict[type[g.GravelerError], int] = {
    g.GravelerError: errno.EIO,
    g.NotFound: errno.ENOENT,
    g.RepositoryGone: errno.ENOENT,  # (deleted since the mount began: every ref of it is gone; logged once)
    g.Forbidden: errno.EACCES,
    g.AlreadyExists: errno.EEXIST,
    g.InvalidArgument: errno.EINVAL,
    g.PathTooLong: errno.ENAMETOOLONG,
    g.AmbiguousRef: errno.ENOENT,  # a ref prefix that names no single commit is no directory
    g.Conflict: errno.EBUSY,
    g.MergeConflict: errno.EBUSY,
    g.PreconditionFailed: errno.EAGAIN,
    g.DirtyBranch: errno.EBUSY,
    g.NothingToCommit: errno.EBUSY,
    g.ReadOnlyRef: errno.EROFS,
    g.CorruptedData: errno.EIO,
    g.UnsupportedFormat: errno.EIO,
    g.StoreUnavailable: errno.EIO,
    g.NoSpace: errno.ENOSPC,
}


# errnos of the daemon's own local files (OSError) that are the caller's answer as they are:
# the local disk is full or over quota, the file or the name is too large for it, it is
# read-only, a request is out of range (a size or offset the disk cannot hold), it failed.
OS_ERRNOS = frozenset({errno.EFBIG, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG,
                       errno.EINVAL, errno.EIO})


def errno_for(exc: BaseException) -> int:
    """The errno answering ``exc``: FsError carries its own; a GravelerError goes
    through the table (nearest class in its MRO); an OSError answers its own errno
    when it is in :data:`OS_ERRNOS`; anything else is EIO."""
    if isinstance(exc, FsError):
        return exc.errno
    if isinstance(exc, OSError):
        return exc.errno if exc.errno in OS_ERRNOS else errno.EIO
    for cls in type(exc).__mro__:
        code = ERRNO_TABLE.get(cls)
        if code is not None:
            return code
    return errno.EIO


class FsError(Exception):
    """A filesystem-level failure with its errno.

    ``cache_timeout`` > 0 on an ENOENT from ``lookup`` lets the kernel cache the
    negative answer for that long (immutable trees never grow a name).
    """

    def __init__(self, code: int, message: str = "", cache_timeout: float = 0.0):
        super().__init__(message or errno.errorcode.get(code, str(code)))
        self.errno = code
        self.cache_timeout = cache_timeout


class LogOnce:
    """Log a message once per key (bounded memory): a damaged entry or a failing store
    is reported once, not on every request that meets it."""

    def __init__(self, logger: logging.Logger, limit: int = 10_000):
        self._log = logger
        self._seen: set = set()
        self._limit = limit
        self._lock = threading.Lock()

    def __call__(self, level: int, key, msg: str, *args) -> None:
        with self._lock:
            if key in self._seen:
                return
            if len(self._seen) >= self._limit:
                self._seen.clear()
            self._seen.add(key)
        self._log.log(level, msg, *args)
