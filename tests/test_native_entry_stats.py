"""graveler._centries.entry_stats (a listing page's sizes and mtimes, compiled) against its reference.

The mount decodes a readdir page's catalog entries in one call (lakefuse/mount/listing.py): every
entry without user metadata must come out as ``entry_stat`` says; the rest (metadata, anything that
does not parse as the simple case, a string that is not ASCII) come out None and take
``entry_stat`` itself.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from graveler import native
from graveler.errors import CorruptedData
from graveler.proto import catalog_pb2
from graveler.model import Value, entry_stat, py_entry_stats
from tests.graveler_testutil import catalog_entries

_centries = native.load("graveler._centries")

_entries = catalog_entries(20, lambda text: st.one_of(st.just({}), st.dictionaries(text, text, max_size=3)))


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(st.one_of(_entries, st.none()), max_size=6))
def test_entries_stat_the_same(entries):
    values = [None if e is None else e.to_value() for e in entries]
    got = _centries.entry_stats(values)
    for e, g, want in zip(entries, got, py_entry_stats(values)):
        assert g is None or g == want  # None: entry_stat decides
        if e is None or e.metadata:
            assert g is None
        elif (e.address + e.etag + e.content_type).isascii():  # the common case: decoded here
            assert g == want == (e.size, e.last_modified_ns) == entry_stat(e.to_value())[:2]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=60))
def test_unusual_bytes_are_left_to_entry_stat(data):
    """Whatever the compiled decoder answers for arbitrary bytes, entry_stat answers the same (or
    it answered None: entry_stat decides, CorruptedData included)."""
    v = Value(b"id", data)
    (got,) = _centries.entry_stats([v])
    if got is None:
        return
    try:
        size, ns, md = entry_stat(v)
    except CorruptedData:
        raise AssertionError(f"compiled stat {got} of bytes entry_stat rejects") from None
    assert md is None and got == (size, ns)


def test_edge_cases_are_left_to_entry_stat_or_decoded_alike():
    """Seconds whose nanoseconds overflow int64, a field number past 2**29 - 1, a string that is
    not ASCII, a varint that runs off the end: None (entry_stat decides, a time past 64-bit ns as
    that range's end); an empty entry: (0, 0)."""
    pb = catalog_pb2.Entry(address="a", size=1, e_tag="e")
    pb.last_modified.seconds, pb.last_modified.nanos = 10**10, 5
    big = Value(b"", pb.SerializeToString())
    odd = [big, Value(b"", b"\x80\x80\x80\x80\x10\x00%\x00\x00\x00\x00"), Value(b"", b"\n\x01\x80"),
           Value(b"", b"\x18\x80")]
    assert _centries.entry_stats(odd) == [None] * len(odd)
    assert entry_stat(big)[1] == (1 << 63) - 1  # (year 2286: past 64-bit ns, the range's end: TIME_NS_MAX)
    assert _centries.entry_stats([Value(b"", b"")]) == py_entry_stats([Value(b"", b"")]) == [(0, 0)]
