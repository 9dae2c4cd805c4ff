"""The byte-bounded LRU (graveler.lru) and the varint codec (graveler.varint)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graveler.lru import LRU
from graveler.varint import get_uvarint, get_varint, put_uvarint, put_varint, uvarint_bytes, uvarint_len


def test_lru_evicts_least_recent_past_the_byte_budget():
    c: LRU[str, bytes] = LRU(10, len)
    c.put("a", b"1234")
    c.put("b", b"1234")
    assert c.get("a") == b"1234"  # a is now the most recent
    c.put("c", b"1234")  # 12 bytes > 10: b goes
    assert "b" not in c and c.get("a") and c.get("c")
    assert c.size_bytes == 8 and len(c) == 2
    c.put("a", b"12")  # replacing re-weighs
    assert c.size_bytes == 6


def test_lru_keeps_the_newest_value_however_heavy():
    c: LRU[str, bytes] = LRU(4, len)
    c.put("small", b"12")
    c.put("huge", b"x" * 100)
    assert list(c._d) == ["huge"] and c.size_bytes == 100


def test_lru_setdefault_keeps_the_first_value():
    c: LRU[str, bytes] = LRU(100, len)
    first, second = b"first", b"second"
    assert c.setdefault("k", first) is first
    assert c.setdefault("k", second) is first
    assert c.get("missing") is None and c.misses == 1 and c.get("k") is first and c.hits == 1
    c.clear()
    assert len(c) == 0 and c.size_bytes == 0


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_uvarint_roundtrip(v):
    b = uvarint_bytes(v)
    assert len(b) == uvarint_len(v)
    assert get_uvarint(b + b"tail", 0) == (v, len(b))


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varint_roundtrip(v):
    out = bytearray()
    put_varint(out, v)
    assert get_varint(bytes(out), 0) == (v, len(out))
    # zigzag: small magnitudes stay short, as Go's binary.PutVarint
    assert len(out) == uvarint_len((v << 1) ^ (v >> 63))


def test_varint_errors():
    with pytest.raises(IndexError):
        get_uvarint(b"\x80\x80", 0)
    with pytest.raises(ValueError):
        get_uvarint(b"\xff" * 11, 0)
    out = bytearray()
    put_uvarint(out, 300)
    assert bytes(out) == b"\xac\x02"
