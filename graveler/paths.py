"""The one path rule: which keys graveler stores, and which a filesystem can show.

A *path* (an object key of a ref) is bytes, the UTF-8 of a ``/``-separated name.
graveler stores any path that :func:`check_path` accepts: non-empty, valid UTF-8,
no NUL, no ``.`` or ``..`` component. That is wider than what a POSIX directory
tree can show, because object stores (and lakeFS) accept keys such as ``a//b``,
``d/`` (a "directory marker"), a 300-byte component, or ``x`` beside ``x/y``.

How a filesystem view (the mount) shows each key is decided here, in one place:

* A key is *shown* when every component is a filesystem name (:func:`name_problem`
  returns None): non-empty, not ``.`` / ``..``, at most :data:`MAX_NAME_BYTES`
  bytes, no NUL, and not a reserved name (:data:`RESERVED_NAMES`).
* A key ending in ``/`` (``d/``) is a directory marker: it makes ``d`` a directory
  and is not itself a file.
* A key with any other empty component (``a//b``, ``/a``), or with an over-long or
  reserved component, is hidden, together with everything below that component.
* A key that is both an object and a prefix (``x`` and ``x/y``): the directory
  wins and the object ``x`` is hidden (mountpoint-s3's rule).

``docs/SEMANTICS.md`` states the same rules for users; the mount tests assert them.
"""

from __future__ import annotations

from graveler.errors import InvalidArgument, PathTooLong
from graveler.objects import RESERVED_NAME

SEP = b"/"
MAX_NAME_BYTES = 255  # NAME_MAX of Linux filesystems
RESERVED_NAMES = frozenset({RESERVED_NAME.encode()})  # the mount's control directory


def check_path(path: str | bytes, what: str = "path", max_bytes: int | None = None) -> bytes:
    """An object path as bytes, or InvalidArgument: non-empty, UTF-8, no NUL, no
    ``.``/``..`` component, at most ``max_bytes`` bytes when given."""
    if isinstance(path, str):
        try:
            b = path.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"invalid {what} {path!r}: not encodable as UTF-8") from None
    elif isinstance(path, (bytes, bytearray, memoryview)):
        b = bytes(path)
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(f"invalid {what} {b!r}: not UTF-8") from None
    else:
        raise InvalidArgument(f"invalid {what}: expected str or bytes, got {type(path).__name__}")
    if not b:
        raise InvalidArgument(f"invalid {what}: empty")
    if b"\x00" in b:
        raise InvalidArgument(f"invalid {what} {b!r}: contains NUL")
    for part in b.split(SEP):
        if part in (b".", b".."):
            raise InvalidArgument(f"invalid {what} {b!r}: '.' and '..' components are not allowed")
    if max_bytes is not None and len(b) > max_bytes:
        raise PathTooLong(f"invalid {what}: {len(b)} bytes, at most {max_bytes} are allowed")
    return b


def check_prefix(prefix: str | bytes) -> bytes:
    """A listing prefix: may be empty or end in a partial component; no NUL."""
    if prefix in ("", b""):
        return b""
    if isinstance(prefix, str):
        try:
            b = prefix.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"invalid prefix {prefix!r}: not encodable as UTF-8") from None
    else:
        b = bytes(prefix)
    if b"\x00" in b:
        raise InvalidArgument(f"invalid prefix {b!r}: contains NUL")
    return b


# The names name_problem refuses for what they are (the rest it refuses by length, NUL or '/'):
# a hot loop may test those itself and call it only then (lakefuse.mount.listing).
REFUSED_NAMES = frozenset({b".", b".."}) | RESERVED_NAMES


def name_problem(name: bytes) -> str | None:
    """Why ``name`` cannot be one component of a filesystem path (None: it can)."""
    if not name:
        return "empty path component"
    if name in (b".", b".."):
        return f"{name.decode()!r} component"
    if len(name) > MAX_NAME_BYTES:
        return f"component of {len(name)} bytes (at most {MAX_NAME_BYTES})"
    if b"\x00" in name or SEP in name:
        return "NUL or '/' in a component"
    if name in RESERVED_NAMES:
        return f"reserved name {name.decode()!r}"
    return None


def is_fs_name(name: bytes) -> bool:
    return name_problem(name) is None


def fs_path_problem(key: bytes) -> str | None:
    """Why the key ``key`` is hidden from a filesystem view (None: it is shown).

    A trailing ``/`` (a directory marker) is allowed; it shows the directory.
    Whether ``key`` is shadowed by a directory of the same name is not decided
    here: that needs the other keys (see the module docstring).
    """
    parts = key.split(SEP)
    if len(parts) > 1 and parts[-1] == b"":
        parts.pop()  # "d/" marks the directory d
    for part in parts:
        why = name_problem(part)
        if why is not None:
            return why
    return None


def child_name(dir_path: bytes, key: bytes) -> bytes:
    """The first component of ``key`` below the directory ``dir_path`` (``b""`` for
    the tree root, else a path without the trailing ``/``)."""
    start = len(dir_path) + 1 if dir_path else 0
    rest = key[start:]
    i = rest.find(SEP)
    return rest if i < 0 else rest[:i]


def dir_prefix(dir_path: bytes) -> bytes:
    """The listing prefix of a directory: ``b""`` for the root, else ``dir_path + "/"``."""
    return dir_path + SEP if dir_path else b""


def join(dir_path: bytes, name: bytes) -> bytes:
    """``dir_path/name`` (just ``name`` at the root)."""
    return dir_path + SEP + name if dir_path else name


__all__ = [
    "MAX_NAME_BYTES",
    "RESERVED_NAMES",
    "check_path",
    "check_prefix",
    "child_name",
    "dir_prefix",
    "fs_path_problem",
    "is_fs_name",
    "join",
    "name_problem",
]
