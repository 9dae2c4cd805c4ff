"""``lakefs://`` URIs, as lakectl writes them.

::

    lakefs://REPO                 a repository
    lakefs://REPO/REF             a ref: branch, tag, commit ID, or an expression (main~2, v1^2, main@)
    lakefs://REPO/REF/PATH        an object path (or a prefix) on that ref

REF is the second segment: branch and tag names never contain ``/`` and ref
expressions use only ``~``, ``^`` and ``@``. PATH is the rest, kept verbatim (no
percent-decoding, as lakectl); it may end in ``/`` (a prefix) but must not
contain NUL or a ``.`` / ``..`` component. ``lakefs://REPO/`` and
``lakefs://REPO/REF/`` are accepted and mean the same as without the slash
(an empty PATH).

Parsing checks the form only; whether the repository or the ref exist is
graveler's business. Errors are ``InvalidArgument`` (exit code 2 in the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass

from graveler.errors import InvalidArgument
from graveler.refs import validate_repository_name

SCHEME = "lakefs://"


@dataclass(frozen=True, slots=True)
class LakeFSURI:
    """A parsed ``lakefs://`` URI. ``ref`` and ``path`` are None when absent;
    ``path`` is ``""`` for ``lakefs://REPO/REF/``."""

    repository: str
    ref: str | None = None
    path: str | None = None

    def __str__(self) -> str:
        s = SCHEME + self.repository
        if self.ref is not None:
            s += "/" + self.ref
            if self.path:
                s += "/" + self.path
        return s

    # The commands say what they need; each check raises a one-line InvalidArgument.

    def repo_only(self) -> "LakeFSURI":
        """For commands that take a repository: no ref, no path."""
        if self.ref is not None:
            raise InvalidArgument(f"{self}: expected a repository URI lakefs://REPO, without a ref")
        return self

    def with_ref(self, what: str = "ref") -> str:
        """The ref, which must be present; no path allowed."""
        if self.ref is None:
            raise InvalidArgument(f"{self}: expected lakefs://REPO/{what.upper()}")
        if self.path:  # (as the name rules: '/' is in no branch or tag name made here, nor in a ref)
            raise InvalidArgument(f"{self}: expected lakefs://REPO/{what.upper()}, without a path "
                                  f"({self.ref}/{self.path} is no {what} name: a name cannot hold '/')")
        return self.ref

    def with_path(self) -> tuple[str, str]:
        """``(ref, path)`` with a non-empty path."""
        if self.ref is None or not self.path:
            raise InvalidArgument(f"{self}: expected lakefs://REPO/REF/PATH")
        return self.ref, self.path

    def with_prefix(self) -> tuple[str, str]:
        """``(ref, prefix)``; the prefix may be empty."""
        if self.ref is None:
            raise InvalidArgument(f"{self}: expected lakefs://REPO/REF[/PREFIX]")
        return self.ref, self.path or ""


def _check_path(path: str, uri: str) -> None:
    if "\x00" in path:
        raise InvalidArgument(f"invalid URI {uri!r}: the path contains NUL")
    for part in path.split("/"):
        if part in (".", ".."):
            raise InvalidArgument(f"invalid URI {uri!r}: '.' and '..' are not allowed in a path")


def parse_uri(text: str) -> LakeFSURI:
    """Parse ``lakefs://REPO[/REF[/PATH]]`` (raises InvalidArgument)."""
    if not isinstance(text, str):
        raise InvalidArgument(f"invalid URI {text!r}: not a string")
    if not text.startswith(SCHEME):
        scheme, sep, _ = text.partition("://")
        if sep:
            raise InvalidArgument(f"invalid URI {text!r}: the scheme must be lakefs://, not {scheme}://")
        raise InvalidArgument(f"invalid URI {text!r}: expected lakefs://REPO[/REF[/PATH]]")
    rest = text[len(SCHEME):]
    repo, sep, rest = rest.partition("/")
    if not repo:
        raise InvalidArgument(f"invalid URI {text!r}: no repository name")
    if "\x00" in repo:
        raise InvalidArgument(f"invalid URI {text!r}: the repository name contains NUL")
    try:
        validate_repository_name(repo)
    except InvalidArgument as e:
        raise InvalidArgument(f"invalid URI {text!r}: {e}") from None
    if not sep or not rest:
        return LakeFSURI(repo)
    ref, sep, path = rest.partition("/")
    if not ref:
        raise InvalidArgument(f"invalid URI {text!r}: empty ref (two slashes after the repository)")
    if "\x00" in ref:
        raise InvalidArgument(f"invalid URI {text!r}: the ref contains NUL")
    if not sep:
        return LakeFSURI(repo, ref)
    _check_path(path, text)
    return LakeFSURI(repo, ref, path)


def is_uri(text: str) -> bool:
    return isinstance(text, str) and "://" in text


__all__ = ["LakeFSURI", "SCHEME", "is_uri", "parse_uri"]
