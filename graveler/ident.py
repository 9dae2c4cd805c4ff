"""lakeFS's identity hashing (pkg/ident): typed, length-prefixed items fed to sha256.

Every content address in a storage namespace -- entry identities, range and
metarange IDs, commit IDs -- is computed here, so that our IDs equal lakeFS's.
This is pure Python; the compiled entry identity and table-ID input are
``graveler._crecord``'s, and the records layer (:mod:`graveler.model`) selects
them (``model.entry_identity``).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable, Mapping

_I64 = struct.Struct(">q")


def enc_int64(v: int) -> bytes:
    return b"\x02\x08" + _I64.pack(v)


def enc_bytes(b: bytes) -> bytes:
    return b"\x00" + enc_int64(len(b)) + b


def enc_string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return b"\x01" + enc_int64(len(b)) + b


def enc_string_slice(items: Iterable[str]) -> bytes:
    items = list(items)
    return b"\x03" + enc_int64(len(items)) + b"".join(enc_string(s) for s in items)


def enc_string_map(m: Mapping[str, str] | Mapping[bytes, bytes]) -> bytes:
    keys = sorted(m, key=lambda k: k.encode("utf-8") if isinstance(k, str) else k)
    return b"\x04" + enc_int64(len(keys)) + b"".join(enc_string(k) + enc_string(m[k]) for k in keys)


def enc_identifiable(identity: bytes) -> bytes:
    return b"\x05" + enc_bytes(identity)


def py_entry_identity(size: int, etag: str, metadata: Mapping[str, str], content_type: str = "") -> bytes:
    """The 32-byte identity of a catalog entry, as lakeFS computes it since April 2021."""
    parts = enc_int64(size) + enc_string(etag) + enc_string_map(metadata)
    if content_type:
        parts += enc_string(content_type)
    return hashlib.sha256(parts).digest()


def entry_identity_v0(address: str, size: int, etag: str, metadata: Mapping[str, str]) -> bytes:
    """The identity scheme of lakeFS files from before April 2021 (address included)."""
    return hashlib.sha256(
        enc_string(address) + enc_int64(size) + enc_string(etag) + enc_string_map(metadata)
    ).digest()


def commit_id(
    committer: str,
    message: str,
    meta_range_id: str,
    creation_seconds: int,
    metadata: Mapping[str, str],
    parents: Iterable[str],
) -> str:
    parents_identity = hashlib.sha256(enc_string_slice(parents)).digest()
    h = hashlib.sha256()
    h.update(enc_string("commit:v1"))
    h.update(enc_string(committer))
    h.update(enc_string(message))
    h.update(enc_string(meta_range_id))
    h.update(enc_int64(creation_seconds))
    h.update(enc_string_map(metadata))
    h.update(enc_identifiable(parents_identity))
    return h.hexdigest()


class TableHasher:
    """Incremental range / metarange ID: records in order, then the properties map."""

    __slots__ = ("_h",)

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, key: bytes, value: bytes) -> None:
        self._h.update(b"%d%s|%d%s|" % (len(key), key, len(value), value))

    def add_many(self, keys: list[bytes], values: list[bytes]) -> None:
        self._h.update(py_hasher_input(keys, values))

    def add_input(self, data: bytes) -> None:
        """Records already in their hashed form (``hasher_input``)."""
        self._h.update(data)

    def finish(self, properties: Mapping[str, str]) -> str:
        self._h.update(enc_string_map(properties))
        return self._h.hexdigest()


def py_hasher_input(keys: list[bytes], values: list[bytes]) -> bytes:
    """What a table ID hashes for these records (the reference of the compiled one)."""
    return b"".join([b"%d%s|%d%s|" % (len(k), k, len(v), v) for k, v in zip(keys, values)])

