"""The one errno table of the mount, and the core's own error.

Every failure graveler reports is a :class:`graveler.errors.GravelerError`; the
table below gives each class its errno (the most specific class wins). The
filesystem core raises :class:`FsError` for conditions that are about the
filesystem rather than the repository (EROFS, ENOTDIR, ENAMETOOLONG...). Anything
else that escapes a handler is a bug: the FUSE adapter logs it with its traceback
and answers EIO.
"""

from __future__ import annotations

import errno

from graveler import errors as g

# Exhaustive on purpose (tests/test_mount_core.py walks every GravelerError subclass):
# a new error class must be given its errno here.
ERRNO_TABLE: dict[type[g.GravelerError], int] = {
    g.GravelerError: errno.EIO,
    g.NotFound: errno.ENOENT,
    g.AlreadyExists: errno.EEXIST,
    g.InvalidArgument: errno.EINVAL,
    g.AmbiguousRef: errno.ENOENT,  # a ref prefix that names no single commit is no directory
    g.Conflict: errno.EBUSY,
    g.MergeConflict: errno.EBUSY,
    g.PreconditionFailed: errno.EAGAIN,
    g.DirtyBranch: errno.EBUSY,
    g.NothingToCommit: errno.EBUSY,
    g.ReadOnlyRef: errno.EROFS,
    g.CorruptedData: errno.EIO,
    g.StoreUnavailable: errno.EIO,
}


def errno_for(exc: BaseException) -> int:
    """The errno answering ``exc``: FsError carries its own; a GravelerError goes
    through the table (nearest class in its MRO); anything else is EIO."""
    if isinstance(exc, FsError):
        return exc.errno
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
