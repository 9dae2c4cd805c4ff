"""Plain data types shared by every graveler layer, and the record value encoding.

A *value* is what a range or metarange record holds: an identity and opaque
data.  For a range record, identity is the 32-byte sha256 of the entry and data
is a protobuf ``catalog.Entry``; for a metarange record, identity is the range
ID (64 ASCII hex characters) and data is a protobuf ``RangeData``.

This module is the records layer's switch: the value codec, the catalog entry
encoders and the entry identity are ``graveler._crecord``'s (compiled, the
default) or the pure-Python references here and in :mod:`graveler.ident`
(``LAKEFUSE_PURE_PYTHON=1``), chosen once at import under the same names.
``VALUE_DECODER`` is what a table scan is handed to decode values
(``SSTable.seek_ge(start, VALUE_DECODER)``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

from graveler import ident, native
from graveler.errors import CorruptedData
from graveler.proto import catalog_pb2, committed_pb2
from graveler.varint import get_varint, put_varint

TIME_NS_MIN = -(1 << 63)  # 1677-09-21T00:12:43.145224192Z: times are nanoseconds in 64 bits,
TIME_NS_MAX = (1 << 63) - 1  # 2262-04-11T23:47:16.854775807Z  as stat and FUSE carry them


def clamp_time_ns(ns: int) -> int:
    """``ns`` within :data:`TIME_NS_MIN`..:data:`TIME_NS_MAX` (a stored time past them -- a
    protobuf timestamp can hold any year -- is read as the nearer end, as ext4 clamps a time past
    its own range to that range's end)."""
    return TIME_NS_MIN if ns < TIME_NS_MIN else TIME_NS_MAX if ns > TIME_NS_MAX else ns


class Value(NamedTuple):
    identity: bytes
    data: bytes


def py_encode_value(v: Value) -> bytes:
    ident_, data = v
    li, ld = len(ident_), len(data)
    if li < 64:  # zigzag length of the identity fits one byte
        if ld < 64:
            return b"".join((bytes((li << 1,)), ident_, bytes((ld << 1,)), data))
        if ld < 8192:
            u = ld << 1
            return b"".join((bytes((li << 1,)), ident_, bytes(((u & 0x7F) | 0x80, u >> 7)), data))
    out = bytearray()
    put_varint(out, li)
    out += ident_
    put_varint(out, ld)
    out += data
    return bytes(out)


def py_decode_value(raw: bytes, name: str | None = None) -> Value:
    # Fast path: one-byte identity length, one- or two-byte data length (every lakeFS record).
    n = len(raw)
    if n >= 2:
        b0 = raw[0]
        if b0 < 0x80 and not b0 & 1:
            end = 1 + (b0 >> 1)
            if end + 1 < n:
                b1 = raw[end]
                if b1 < 0x80:
                    if not b1 & 1 and end + 1 + (b1 >> 1) == n:
                        return Value(raw[1:end], raw[end + 1 :])
                else:
                    b2 = raw[end + 1]
                    u = (b1 & 0x7F) | (b2 << 7)
                    if b2 < 0x80 and not u & 1 and end + 2 + (u >> 1) == n:
                        return Value(raw[1:end], raw[end + 2 :])
    try:
        li, pos = get_varint(raw, 0)
        end = pos + li
        if li < 0 or end > len(raw):
            raise ValueError("identity overruns the value")
        identity = raw[pos:end]
        ld, pos = get_varint(raw, end)
        end = pos + ld
        if ld < 0 or end != len(raw):
            raise ValueError("data length does not match the value")
        return Value(identity, raw[pos:end])
    except (IndexError, ValueError) as e:
        raise CorruptedData(f"malformed record value ({e})", name) from None


class AddressType(enum.IntEnum):
    BY_PREFIX_DEPRECATED = 0
    RELATIVE = 1
    FULL = 2


@dataclass(frozen=True, slots=True)
class Entry:
    """A catalog entry: one object in a commit (lakeFS's ``catalog.Entry``)."""

    address: str
    size: int
    etag: str
    last_modified_ns: int = 0  # unix nanoseconds
    metadata: dict[str, str] = field(default_factory=dict)
    address_type: AddressType = AddressType.RELATIVE
    content_type: str = ""

    def identity(self) -> bytes:
        return entry_identity(self.size, self.etag, self.metadata, self.content_type)

    def to_proto_bytes(self) -> bytes:
        return _entry_proto(self.address, self.size, self.etag, self.last_modified_ns, self.metadata,
                            int(self.address_type), self.content_type)

    def py_to_proto_bytes(self) -> bytes:
        """The pure-Python reference of ``to_proto_bytes`` (protobuf's deterministic serialization)."""
        return py_entry_proto(self.address, self.size, self.etag, self.last_modified_ns, self.metadata,
                              int(self.address_type), self.content_type)

    def to_value(self) -> Value:
        return _entry_to_value(self)

    def py_to_value(self) -> Value:
        """The pure-Python reference of ``to_value``."""
        return Value(ident.py_entry_identity(self.size, self.etag, self.metadata, self.content_type),
                     self.py_to_proto_bytes())

    def to_record(self) -> bytes:
        """The stored record value, ``encode_value(self.to_value())`` (staging, range records)."""
        return _entry_record(self)

    @staticmethod
    def from_proto_bytes(data: bytes) -> "Entry":
        pb = catalog_pb2.Entry()
        try:
            pb.ParseFromString(data)
        except Exception as e:  # protobuf's DecodeError
            raise CorruptedData(f"malformed catalog entry ({e})") from None
        if pb.size < 0:  # (an int64 on the wire: no object has such a size)
            raise CorruptedData(f"damaged catalog entry: size {pb.size}")
        ts = pb.last_modified
        return Entry(
            address=pb.address,
            size=pb.size,
            etag=pb.e_tag,
            last_modified_ns=clamp_time_ns(ts.seconds * 1_000_000_000 + ts.nanos),
            metadata=dict(pb.metadata),
            address_type=AddressType(pb.address_type) if pb.address_type in (0, 1, 2) else AddressType.RELATIVE,
            content_type=pb.content_type,
        )

    @staticmethod
    def from_value(v: Value) -> "Entry":
        return Entry.from_proto_bytes(v.data)


def py_entry_proto(address: str, size: int, etag: str, last_modified_ns: int, metadata: dict[str, str],
                   address_type: int, content_type: str) -> bytes:
    """A catalog entry's protobuf bytes (deterministic serialization): the reference of ``entry_proto``."""
    pb = catalog_pb2.Entry(address=address, size=size, e_tag=etag, address_type=address_type,
                           content_type=content_type)
    if last_modified_ns:
        pb.last_modified.seconds, pb.last_modified.nanos = divmod(last_modified_ns, 1_000_000_000)
    if metadata:
        pb.metadata.update(metadata)
    return pb.SerializeToString(deterministic=True)


def py_encode_records(values: Iterable[Entry | Value | None]) -> list[bytes]:
    """The stored record value of each Entry or Value, in one call; None (staging's tombstone) gives b"".
    The pure-Python reference of ``encode_records``."""
    return [b"" if v is None else py_encode_value(v.py_to_value() if isinstance(v, Entry) else v) for v in values]


if native.PURE_PYTHON:
    encode_value, decode_value = py_encode_value, py_decode_value
    encode_records = py_encode_records
    entry_identity = ident.py_entry_identity
    VALUE_DECODER = py_decode_value
    _entry_to_value = Entry.py_to_value
    _entry_record = lambda e: py_encode_value(e.py_to_value())  # noqa: E731
    _entry_proto = py_entry_proto
    # The columnar kernels (a listing's records from Arrow buffers, entries into Arrow columns: the Spark
    # tasks'); None under the reference, whose callers then take their per-record protobuf path.
    listing_records = entry_columns = None
else:
    _c = native.load("graveler._crecord")
    _c.bind(Value)
    _c.bind_entry(Entry)
    encode_value, decode_value = _c.encode_value, _c.decode_value
    encode_records = _c.encode_records
    entry_identity = _c.entry_identity
    VALUE_DECODER = _c.VALUE_DECODER
    _entry_to_value, _entry_record, _entry_proto = _c.entry_to_value, _c.entry_record, _c.entry_proto
    listing_records = _c.listing_records
    entry_columns = native.load("graveler._centries").entry_columns


@dataclass(frozen=True, slots=True)
class RangeInfo:
    """One record of a metarange: a range and what it covers."""

    id: str
    min_key: bytes
    max_key: bytes
    count: int
    estimated_size: int

    def to_value(self) -> Value:
        pb = committed_pb2.RangeData(
            min_key=self.min_key, max_key=self.max_key, estimated_size=self.estimated_size, count=self.count
        )
        return Value(self.id.encode("ascii"), pb.SerializeToString(deterministic=True))

    @staticmethod
    def from_value(v: Value, name: str | None = None) -> "RangeInfo":
        pb = committed_pb2.RangeData()
        try:
            pb.ParseFromString(v.data)
            rid = v.identity.decode("ascii")
        except Exception as e:
            raise CorruptedData(f"malformed metarange record ({e})", name) from None
        return RangeInfo(rid, pb.min_key, pb.max_key, pb.count, pb.estimated_size)


class DiffType(enum.Enum):
    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


@dataclass(frozen=True, slots=True)
class DiffRecord:
    type: DiffType
    key: bytes
    left: Value | None  # None when added
    right: Value | None  # None when removed


class MergeStrategy(enum.Enum):
    NONE = "none"  # conflicts fail the merge
    DEST_WINS = "dest-wins"
    SOURCE_WINS = "source-wins"


_STAT_PB = catalog_pb2.Entry


def _parse_entry_pb(v: Value):
    """The catalog entry protobuf of a range record; CorruptedData when it does not parse."""
    pb = _STAT_PB()
    try:
        pb.ParseFromString(v.data)
    except Exception as e:  # protobuf's DecodeError
        raise CorruptedData(f"malformed catalog entry ({e})") from None
    return pb


class EntryLocation:
    """Where a catalog entry's object is and how big it is (:func:`entry_location`): what an
    open needs of the entry, without the rest (:meth:`graveler.objects.EntryReader.locate`
    and :meth:`graveler.view.View.open_cached` take it as they take an :class:`Entry`)."""

    __slots__ = ("address", "address_type", "size")

    def __init__(self, address: str, address_type: int, size: int):
        self.address = address
        self.address_type = address_type
        self.size = size

    def __eq__(self, other) -> bool:  # the same object, whatever else two entries differ in (metadata)
        if not isinstance(other, EntryLocation):
            return NotImplemented
        return (self.address, self.address_type, self.size) == (other.address, other.address_type, other.size)

    def __hash__(self) -> int:
        return hash((self.address, self.address_type, self.size))


def entry_location(v: Value) -> EntryLocation:
    """The :class:`EntryLocation` of a range record's catalog entry: a quarter of the cost of
    :meth:`Entry.from_value` (no metadata, no timestamp, no :class:`Entry`), for opens."""
    pb = _parse_entry_pb(v)
    at = pb.address_type
    return EntryLocation(pb.address, at if at in (0, 1, 2) else 1, pb.size)  # unknown: RELATIVE, as Entry does


def entry_stat(v: Value) -> tuple[int, int, dict[str, str] | None]:
    """(size, last-modified unix ns, metadata or None when there is none) of a range record's
    catalog entry, without building an :class:`Entry` (listings that only need ``stat``)."""
    pb = _parse_entry_pb(v)
    ts = pb.last_modified
    md = pb.metadata
    return pb.size, clamp_time_ns(ts.seconds * 1_000_000_000 + ts.nanos), (dict(md) if len(md) else None)


def py_entry_stats(values) -> list[tuple[int, int] | None]:
    """``(size, last-modified unix ns)`` of each value's catalog entry, or None where it has user
    metadata or does not parse (or is None) (:func:`entry_stat` then says which): a listing page's in one call.
    The pure-Python reference of ``graveler._centries.entry_stats``."""
    out: list[tuple[int, int] | None] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        try:
            size, ns, md = entry_stat(v)
        except CorruptedData:
            out.append(None)
            continue
        out.append((size, ns) if md is None else None)
    return out


entry_stats = py_entry_stats if native.PURE_PYTHON else native.load("graveler._centries").entry_stats
