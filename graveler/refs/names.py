"""Name rules of repositories, branches and tags (lakeFS's and git's), and what a commit ID looks like."""

from __future__ import annotations

import re

from graveler.errors import InvalidArgument

COMMIT_ID_LENGTH = 64
MIN_COMMIT_PREFIX = 4

BRANCH_RE = re.compile(r"^\w[-\w]*$", re.ASCII)
_REPO_RE = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
HEX_RE = re.compile(r"^[0-9a-fA-F]+$")
_TAG_FORBIDDEN = set("~^:?*[\\@$/")


def validate_repository_name(name: str) -> str:
    """lakeFS's rule: 3-63 characters of ``a-z0-9-``, not starting with ``-``."""
    if not isinstance(name, str) or not _REPO_RE.fullmatch(name):
        raise InvalidArgument(
            f"invalid repository name {name!r}: use 3-63 characters a-z, 0-9 and '-', starting with a letter or digit"
        )
    return name


def validate_branch_name(name: str) -> str:
    """lakeFS's rule ``^\\w[-\\w]*$`` (ASCII word characters and '-', not starting with '-')."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("invalid branch name: empty")
    if len(name) > 255:
        raise InvalidArgument(f"invalid branch name {name[:40]!r}...: longer than 255 characters")
    if not BRANCH_RE.fullmatch(name):
        raise InvalidArgument(
            f"invalid branch name {name!r}: use letters, digits, '_' and '-', not starting with '-'"
        )
    return name


def validate_tag_name(name: str) -> str:
    """A new tag's name: git's check-ref-format rules, minus '/', nothing that ref expressions
    use (~ ^ @ $), and not 64 hex digits (a full commit ID wins over a tag: such a tag could
    never be reached by its name). Stricter than lakeFS (:func:`validate_lakefs_tag_name`),
    whose tags a restored dump may still bring."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("invalid tag name: empty")

    def bad(reason: str) -> InvalidArgument:
        return InvalidArgument(f"invalid tag name {name!r}: {reason}")

    if len(name) == COMMIT_ID_LENGTH and HEX_RE.fullmatch(name):
        raise bad("64 hex digits are read as a commit ID")

    if len(name.encode("utf-8", "surrogatepass")) > 255:
        raise bad("longer than 255 bytes")
    if name.startswith("-") or name.startswith("."):
        raise bad("must not start with '-' or '.'")
    if name.endswith(".") or name.endswith(".lock"):
        raise bad("must not end with '.' or '.lock'")
    if ".." in name:
        raise bad("must not contain '..'")
    for ch in name:
        if ord(ch) <= 0x20 or ord(ch) == 0x7F:
            raise bad("must not contain spaces or control characters")
        if ch in _TAG_FORBIDDEN:
            raise bad(f"must not contain {ch!r} (one of ~ ^ : ? * [ \\ @ $ /)")
    return name


_LAKEFS_TAG_FORBIDDEN = set("^:?*[\\")


def validate_lakefs_tag_name(name: str) -> str:
    """lakeFS's own rule for tags (its ValidateTagID), which a refs dump's tags must meet: not
    empty or ``@``; no ``..``, ``//`` or ``@{``; not ending in ``.``, ``.lock`` or ``/``; none of
    ``^ : ? * [ \\``, spaces or control characters. '/', '~', '@' and '$' pass: such a tag is
    kept and listed, reached by its exact name where it can be (a name with '/' is no
    directory of the mount's root and no ref of a ``lakefs://`` URI)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("invalid tag name: empty")

    def bad(reason: str) -> InvalidArgument:
        return InvalidArgument(f"invalid tag name {name!r} (lakeFS's rule): {reason}")

    if name == "@":
        raise bad("'@' alone")
    if name.endswith((".", ".lock", "/")):
        raise bad("must not end with '.', '.lock' or '/'")
    for part in ("..", "//", "@{"):
        if part in name:
            raise bad(f"must not contain {part!r}")
    for ch in name:
        if ch.isspace() or ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
            raise bad("must not contain spaces or control characters")
        if ch in _LAKEFS_TAG_FORBIDDEN:
            raise bad(f"must not contain {ch!r} (one of ^ : ? * [ \\)")
    return name


__all__ = [
    "BRANCH_RE",
    "COMMIT_ID_LENGTH",
    "HEX_RE",
    "MIN_COMMIT_PREFIX",
    "validate_branch_name",
    "validate_lakefs_tag_name",
    "validate_repository_name",
    "validate_tag_name",
]
