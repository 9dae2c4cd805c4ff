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


def test_values_no_file_can_have_count_as_unset_and_times_past_64_bit_ns_as_the_end():
    """Another client may write anything into an entry's metadata: a mode, owner or device number
    out of range is not set (it crashed the mount's listing); a time past int64 nanoseconds (a
    ``touch -d 2300-01-01`` stored before the mount clamped it) is the range's end. Healthy values
    up to the very bounds -- and a time before 1970 -- are kept as they are."""
    from graveler.objects import (ID_MAX, MODE_MAX, POSIX_ATIME, POSIX_GID, POSIX_MODE, POSIX_RDEV,
                                  POSIX_UID, RDEV_MAX, TIME_NS_MAX, TIME_NS_MIN, clamp_time_ns)

    healthy = PosixAttrs(mode=MODE_MAX, uid=ID_MAX, gid=0, mtime_ns=TIME_NS_MAX, atime_ns=TIME_NS_MIN,
                         rdev=RDEV_MAX)
    assert PosixAttrs.from_metadata(healthy.to_metadata()) == healthy
    old = PosixAttrs(mode=0o100644, uid=1000, gid=1000, mtime_ns=-2_208_988_800 * 10**9, atime_ns=0, rdev=0)
    assert PosixAttrs.from_metadata(old.to_metadata()) == old  # 1900-01-01 and the epoch itself
    bad = {POSIX_MODE: format(MODE_MAX + 1, "o"), POSIX_UID: str(ID_MAX + 1), POSIX_GID: "-1",
           POSIX_RDEV: str(RDEV_MAX + 1), POSIX_MTIME: str(10_413_792_000 * 10**9), POSIX_ATIME: str(-(10**20))}
    assert PosixAttrs.from_metadata(bad) == PosixAttrs(mtime_ns=TIME_NS_MAX, atime_ns=TIME_NS_MIN)
    assert PosixAttrs.from_metadata({POSIX_MODE: "-644"}).mode is None
    assert [clamp_time_ns(v) for v in (TIME_NS_MAX, TIME_NS_MAX + 1, TIME_NS_MIN - 1, 5)] == [
        TIME_NS_MAX, TIME_NS_MAX, TIME_NS_MIN, 5]


def test_an_entry_stored_with_a_year_past_2262_reads_as_the_range_end_by_every_decoder():
    """A protobuf timestamp holds any year (another client's entry, a crafted range); its
    nanoseconds past 64 bits are read as the range's end, by the reference decoder, the one a
    listing uses and the compiled listing kernel's fallback alike; an ordinary time is as stored."""
    from graveler.model import TIME_NS_MAX, TIME_NS_MIN, Entry, Value, entry_stat, entry_stats, py_entry_proto

    for ns, shown in ((10_413_792_000 * 10**9, TIME_NS_MAX), (-(10**20), TIME_NS_MIN),
                      (1_700_000_000_123_456_789, 1_700_000_000_123_456_789)):
        data = py_entry_proto("data/x", 1, "e", ns, {}, 0, "")  # (the protobuf library's own encoding)
        assert Entry.from_proto_bytes(data).last_modified_ns == shown
        v = Value(b"identity", data)
        assert entry_stat(v)[1] == shown
        got = entry_stats([v])[0]
        assert got is None or got[1] == shown  # (None: the caller asks entry_stat, above)
