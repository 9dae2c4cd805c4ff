"""POSIX attribute metadata, directory markers and the reserved name (graveler.objects)."""

from graveler.objects import (
    POSIX_MTIME,
    PosixAttrs,
    dir_marker_key,
    has_reserved_component,
    is_dir_marker,
)


def test_mtime_round_trips_through_metadata():
    a = PosixAttrs(mode=0o100640, uid=1, gid=2, mtime_ns=1_700_000_000_123_456_789)
    md = a.to_metadata()
    assert md[POSIX_MTIME] == "1700000000123456789"
    assert PosixAttrs.from_metadata(md) == a
    assert PosixAttrs.from_metadata({POSIX_MTIME: "junk"}).mtime_ns is None


def test_dir_markers_and_reserved_name():
    assert dir_marker_key(b"a/b") == b"a/b/"
    assert is_dir_marker(b"a/b/") and is_dir_marker("x/") and not is_dir_marker(b"a/b")
    assert has_reserved_component(b".lakefuse") and has_reserved_component("a/.lakefuse/b")
    assert not has_reserved_component(b"a/.lakefuse2") and not has_reserved_component(b"x.lakefuse")
