"""Refs: names, records, ref expressions, the RefManager and commit-graph walks.

* :mod:`graveler.refs.names`    name rules (repository, branch, tag)
* :mod:`graveler.refs.records`  Commit, Branch, Tag, RepositoryRecord and their stored bytes
* :mod:`graveler.refs.expr`     the ref-expression grammar (``main~2^2``, ``main@``...)
* :mod:`graveler.refs.manager`  RefManager: the records in LMDB, resolution
* :mod:`graveler.refs.graph`    log, merge base, ancestry

This package re-exports the names callers use.
"""

from graveler.refs.expr import RawRef, RefType, ResolvedRef, parse_ref
from graveler.refs.manager import RefManager
from graveler.refs.names import (
    COMMIT_ID_LENGTH,
    MIN_COMMIT_PREFIX,
    validate_branch_name,
    validate_repository_name,
    validate_tag_name,
)
from graveler.refs.records import (
    COMMIT_VERSION,
    INITIAL_COMMIT_MESSAGE,
    Branch,
    Commit,
    RepositoryRecord,
    Tag,
    new_staging_token,
    unix_seconds,
)

__all__ = [
    "COMMIT_ID_LENGTH",
    "COMMIT_VERSION",
    "INITIAL_COMMIT_MESSAGE",
    "MIN_COMMIT_PREFIX",
    "Branch",
    "Commit",
    "RawRef",
    "RefManager",
    "RefType",
    "RepositoryRecord",
    "ResolvedRef",
    "Tag",
    "new_staging_token",
    "parse_ref",
    "unix_seconds",
    "validate_branch_name",
    "validate_repository_name",
    "validate_tag_name",
]
