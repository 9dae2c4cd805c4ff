"""Varints: Go's ``encoding/binary`` unsigned (LEB128) and signed (zigzag) forms.

The one codec for both users: SSTable block handles, block entries and
properties use unsigned varints (:mod:`graveler.sstable`); lakeFS's record value
encoding uses signed ones for its two lengths (:mod:`graveler.model`).
Decoders raise ValueError for a varint longer than 10 bytes and IndexError when
the buffer ends inside one; callers turn both into CorruptedData.
"""

from __future__ import annotations


def put_uvarint(out: bytearray, v: int) -> None:
    """Append ``v`` (>= 0) as an unsigned varint (``binary.PutUvarint``)."""
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def uvarint_bytes(v: int) -> bytes:
    out = bytearray()
    put_uvarint(out, v)
    return bytes(out)


def uvarint_len(v: int) -> int:
    """How many bytes ``v`` takes as an unsigned varint."""
    n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


def get_uvarint(buf, pos: int) -> tuple[int, int]:
    """Decode an unsigned varint at ``pos``; returns (value, next position)."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def put_varint(out: bytearray, v: int) -> None:
    """Append ``v`` as a signed (zigzag) varint (``binary.PutVarint``)."""
    put_uvarint(out, (v << 1) ^ (v >> 63) if v < 0 else v << 1)


def get_varint(buf, pos: int) -> tuple[int, int]:
    """Decode a signed (zigzag) varint at ``pos``; returns (value, next position)."""
    u, pos = get_uvarint(buf, pos)
    return (u >> 1) ^ -(u & 1), pos


__all__ = ["get_uvarint", "get_varint", "put_uvarint", "put_varint", "uvarint_bytes", "uvarint_len"]
