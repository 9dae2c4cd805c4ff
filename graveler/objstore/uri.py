"""``StorageURI``: the one parser and printer of storage-namespace and object URIs.

::

    file:///abs/dir  (or /abs/dir)   a local directory; the path is percent-decoded on
                                     parsing and percent-encoded on printing
    s3://bucket[/prefix]             an S3 bucket and key prefix (keys are not encoded)

A namespace URI names a store root (:func:`graveler.objstore.open_store`); an
object URI (a FULL entry address, ``ObjectStore.full_uri``) is a root plus a
key, split by :meth:`StorageURI.split_object`. Printing is canonical (no
trailing ``/``), so two spellings of one root compare equal once parsed.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from graveler.errors import InvalidArgument

FILE = "file"
S3 = "s3"


@dataclass(frozen=True, slots=True)
class StorageURI:
    """A parsed store root: ``scheme`` ``file`` (``path``: an absolute directory) or
    ``s3`` (``bucket``, ``path``: the key prefix without leading or trailing ``/``)."""

    scheme: str
    bucket: str = ""
    path: str = ""

    @staticmethod
    def parse(text: str) -> "StorageURI":
        """Parse a namespace URI (InvalidArgument for anything else)."""
        if not isinstance(text, str) or not text:
            raise InvalidArgument(f"a store URI must be a non-empty str, not {text!r}")
        if text.startswith("s3://"):
            bucket, _, prefix = text[len("s3://"):].partition("/")
            if not bucket:
                raise InvalidArgument(f"bad S3 URI {text!r}: expected s3://bucket[/prefix]")
            return StorageURI(S3, bucket, prefix.strip("/"))
        if "\x00" in text:
            raise InvalidArgument(f"bad store URI {text!r}: it holds a NUL")
        if text.startswith("file:"):
            parts = _split(text)
            if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
                raise InvalidArgument(f"bad file URI {text!r}: expected file:///absolute/path")
            path = _unquote(parts.path, text)
            if not os.path.isabs(path):
                raise InvalidArgument(f"bad file URI {text!r}: expected file:///absolute/path")
            return StorageURI(FILE, "", _dir(path))
        if os.path.isabs(text):
            return StorageURI(FILE, "", _dir(text))
        raise InvalidArgument(
            f"unsupported store URI {text!r}: expected file:///absolute/path, an absolute path or s3://bucket[/prefix]"
        )

    @staticmethod
    def split_object(address: str) -> tuple["StorageURI", str]:
        """An object URI as (root, key): ``s3://bucket/a/b`` -> (``s3://bucket``, ``a/b``);
        ``file:///dir/sub/f`` -> (``file:///dir/sub``, ``f``)."""
        scheme, sep, rest = address.partition("://") if isinstance(address, str) else ("", "", "")
        if not sep or not rest:
            raise InvalidArgument(f"not a full address: {address!r}")
        if scheme == FILE:
            path = _unquote(_split(address).path, address, strict=False)
            root, _, key = path.rpartition("/")
            if not key or not os.path.isabs(path):
                raise InvalidArgument(f"bad file address {address!r}")
            return StorageURI(FILE, "", root or "/"), key
        if scheme == S3:
            bucket, _, key = rest.partition("/")
            if not bucket or not key:
                raise InvalidArgument(f"bad address {address!r}: expected {scheme}://bucket/key")
            return StorageURI(S3, bucket, ""), key
        raise InvalidArgument(f"unsupported address {address!r}: expected file:// or s3://")

    def __str__(self) -> str:
        if self.scheme == FILE:
            return "file://" + quote(self.path, errors="surrogateescape")
        return f"s3://{self.bucket}/{self.path}" if self.path else f"s3://{self.bucket}"

    def object_uri(self, key: str) -> str:
        """The URI of the object ``key`` under this root."""
        if self.scheme == FILE:
            return str(self).rstrip("/") + "/" + quote(key, errors="surrogateescape")
        return f"s3://{self.bucket}/{self.path}/{key}" if self.path else f"s3://{self.bucket}/{key}"


def _split(text: str):
    try:
        return urlsplit(text)
    except ValueError as e:  # (an unclosed "[": "Invalid IPv6 URL")
        raise InvalidArgument(f"bad file URI {text!r}: {e}") from None


def _unquote(path: str, text: str, strict: bool = True) -> str:
    """A file URI's path, percent-decoded, holding no NUL. ``strict``: what it names must be
    UTF-8 (a new namespace; one decoded with replacement characters would be another directory
    than the one written); else bytes that are not UTF-8 stay the bytes written, as Python's
    file names keep them (an object's address: the file it names, whatever its name)."""
    try:
        out = unquote(path, errors="strict" if strict else "surrogateescape")
    except UnicodeDecodeError:
        raise InvalidArgument(f"bad file URI {text!r}: its percent-escapes are not UTF-8") from None
    if "\x00" in out:
        raise InvalidArgument(f"bad file URI {text!r}: it holds a NUL (%00)")
    return out


def place(namespace: str) -> str:
    """A store root as a place, to compare two: a local one by its real path (a symbolic link
    to another directory is that directory, ``..`` resolved), each with a trailing slash, so
    ``a.startswith(b)`` says that ``b`` is ``a`` or holds it. Text that is no store URI stays
    as it is."""
    try:
        uri = StorageURI.parse(namespace)
    except InvalidArgument:
        return namespace.rstrip("/") + "/"
    if uri.scheme == FILE:
        return "file://" + os.path.realpath(uri.path).rstrip("/") + "/"
    return str(uri).rstrip("/") + "/"


def _dir(path: str) -> str:
    """An absolute directory path without a trailing '/' (the root stays '/')."""
    p = posixpath.normpath(path) if path.startswith("/") else os.path.abspath(path)
    return "/" if p in ("/", "//") else p


__all__ = ["StorageURI", "place"]
