"""The ref-expression grammar (lakeFS's) and what an expression resolves to.

::

    main            a branch: reads show its staging over its head commit
    v1.0            a tag
    3f2a9c...       a full commit ID, or a unique prefix of at least 4 hex digits
    main@           the branch's committed head, ignoring staging
    REF~N  REF~     N-th first-parent ancestor (~ = ~1)
    REF^N  REF^     N-th parent (^ = ^1, ^0 = the commit itself)
    main~2^2        chains apply left to right

:func:`parse_ref` splits an expression; resolving it against the stored refs is
:meth:`graveler.refs.manager.RefManager.resolve_txn`'s.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from graveler.errors import InvalidArgument


class RefType(enum.Enum):
    BRANCH = "branch"
    TAG = "tag"
    COMMIT = "commit"


@dataclass(frozen=True, slots=True)
class ResolvedRef:
    """What a ref expression points at.

    ``type`` is BRANCH only for a plain branch name: then ``branch`` is its name
    and ``tokens`` its staging tokens in read precedence (current, then sealed
    newest first), so reads show staging over ``commit_id``. ``BRANCH@`` and any
    expression with ``~``/``^`` are COMMIT refs (read-only); ``branch`` then
    still names the branch they started from, if any.
    """

    type: RefType
    commit_id: str
    branch: str | None = None
    tokens: tuple[str, ...] = ()

    @property
    def is_branch(self) -> bool:
        return self.type is RefType.BRANCH

    @property
    def read_only(self) -> bool:
        return self.type is not RefType.BRANCH


@dataclass(frozen=True, slots=True)
class RawRef:
    base: str
    modifiers: tuple[tuple[str, int], ...]  # ("~" | "^" | "@", amount)


_MOD_RE = re.compile(r"[~^@][0-9]*")  # ASCII digits only (a regex digit is any script's)


def parse_ref(expr: str) -> RawRef:
    """Split a ref expression into its base and modifiers (``~N``, ``^N``, ``@``)."""
    if not isinstance(expr, str) or not expr:
        raise InvalidArgument("empty ref")
    if any(ord(c) <= 0x20 or c == "\x7f" for c in expr):
        raise InvalidArgument(f"invalid ref {expr!r}: contains spaces or control characters")
    if "$" in expr:
        raise InvalidArgument(f"invalid ref {expr!r}: '$' is not supported")
    i = 0
    while i < len(expr) and expr[i] not in "~^@":
        i += 1
    base = expr[:i]
    if not base:
        raise InvalidArgument(f"invalid ref {expr!r}: no branch, tag or commit before the modifier")
    bad = next((p for p in ("..", "?", "*", "[", "\\", ":") if p in base), None)
    if bad is not None:  # (in no branch, tag -- lakeFS's rule too -- or commit ID: not "not found")
        raise InvalidArgument(f"invalid ref {expr!r}: {bad!r} is in no branch, tag or commit name"
                              + (" (a range A..B is no ref: lakefuse diff A B compares two)" if bad == ".." else ""))
    mods: list[tuple[str, int]] = []
    pos = i
    while pos < len(expr):
        m = _MOD_RE.match(expr, pos)
        if m is None:
            raise InvalidArgument(f"invalid ref {expr!r}: unexpected {expr[pos:]!r}")
        tok = m.group(0)
        kind, digits = tok[0], tok[1:]
        if kind == "@" and digits:
            raise InvalidArgument(f"invalid ref {expr!r}: '@' takes no number")
        if len(digits) > 9:
            raise InvalidArgument(f"invalid ref {expr!r}: number too large")
        mods.append((kind, int(digits) if digits else 1))
        pos = m.end()
    if any(k == "@" for k, _ in mods) and len(mods) != 1:
        raise InvalidArgument(f"invalid ref {expr!r}: '@' must be the only modifier (BRANCH@)")
    return RawRef(base, tuple(mods))


__all__ = ["RawRef", "RefType", "ResolvedRef", "parse_ref"]
