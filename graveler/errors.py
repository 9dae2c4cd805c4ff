"""The one error tree of graveler.

Every failure that graveler reports is a ``GravelerError``.  Errors from the
libraries underneath (boto3, lmdb, the filesystem) are wrapped where they enter
graveler, so callers -- the CLI, the FUSE edge, a Spark job -- handle one tree.
The FUSE edge maps these classes to errno values; graveler itself never imports
errno, trio or pyfuse3.
"""

from __future__ import annotations


class GravelerError(Exception):
    """Base class of every error graveler raises on purpose."""


class NotFound(GravelerError):
    """A key, object, ref, branch, tag, commit or repository does not exist."""


class RepositoryGone(NotFound):
    """The repository a process opened was deleted since (and maybe one of its name made again)."""


class Forbidden(GravelerError):
    """An object the repository names that its owner may not read, asked for by a process of
    another user (:mod:`graveler.objstore.readfor`)."""


class AlreadyExists(GravelerError):
    """Something that must be new (a branch, tag, repository) exists already."""


class InvalidArgument(GravelerError):
    """Bad input: a malformed name, path, ref expression or parameter."""


class PathTooLong(InvalidArgument):
    """A path longer than the staging key limit allows (a name that is too long for a filesystem)."""


class AmbiguousRef(InvalidArgument):
    """A commit-ID prefix (or a name) that matches more than one commit."""


class Conflict(GravelerError):
    """The operation conflicts with the current state."""


class MergeConflict(Conflict):
    """A three-way merge found keys changed differently on both sides."""

    def __init__(self, message: str, keys: list[bytes] | None = None, count: int | None = None):
        super().__init__(message)
        self.keys = list(keys or [])  # the first conflicting keys (a bounded number of them)
        self.count = len(self.keys) if count is None else count  # every conflicting key

    @classmethod
    def on(cls, what: str, keys: list[bytes], count: int, hint: str = "") -> "MergeConflict":
        """The conflict of a ``what`` ("merge", "revert") on ``count`` keys, the first of them
        ``keys``: its message names up to 10 (then "and N more"), and ends with ``hint``."""
        shown = ", ".join(k.decode("utf-8", "replace") for k in keys[:10])
        more = f" and {count - 10} more" if count > 10 else ""
        return cls(f"{what} conflict on {count} key(s): {shown}{more}{'; ' + hint if hint else ''}", keys, count)


class PreconditionFailed(Conflict):
    """A compare-and-set lost a race (e.g. the branch moved during a commit)."""


class DirtyBranch(Conflict):
    """The branch has uncommitted changes and the operation needs it clean."""


class NothingToCommit(Conflict):
    """A commit with no staged changes was asked for without allow_empty."""


class ReadOnlyRef(GravelerError):
    """A write was aimed at something immutable: a tag, a commit, a ref expression."""


class CorruptedData(GravelerError):
    """Stored bytes are damaged or not of the expected format.

    ``name`` is the file or object, ``offset`` the byte offset where the damage
    was found (``None`` when it is not about one place).
    """

    def __init__(self, message: str, name: str | None = None, offset: int | None = None):
        where = ""
        if name is not None:
            where = f" in {name}"
            if offset is not None:
                where += f" at offset {offset}"
        super().__init__(message + where)
        self.name = name
        self.offset = offset
        self.reason = message


class UnsupportedFormat(CorruptedData):
    """Stored bytes of a healthy file in a form lakefuse does not read (a RocksDB table written
    with LZ4, XXH3 checksums, format_version 4...): refused, as damage is, but said as what it is."""


class StoreUnavailable(GravelerError):
    """The object store (or the refs database) cannot be reached or refused access."""


class NoSpace(StoreUnavailable):
    """A local disk the refs database (or the store) writes to is full, or over its quota."""
