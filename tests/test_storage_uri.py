"""StorageURI: the one parser and printer of namespace and object URIs."""

from __future__ import annotations

import pytest

from graveler.errors import InvalidArgument
from graveler.objects import split_full_address
from graveler.objstore import LocalStore, StorageURI, open_store


@pytest.mark.parametrize("text, parsed, printed", [
    ("file:///data/ns", StorageURI("file", "", "/data/ns"), "file:///data/ns"),
    ("file:///data/ns/", StorageURI("file", "", "/data/ns"), "file:///data/ns"),
    ("/data/ns", StorageURI("file", "", "/data/ns"), "file:///data/ns"),
    ("file:///data/a%20b", StorageURI("file", "", "/data/a b"), "file:///data/a%20b"),
    ("file://localhost/d", StorageURI("file", "", "/d"), "file:///d"),
    ("file:///", StorageURI("file", "", "/"), "file:///"),
    ("s3://bucket", StorageURI("s3", "bucket", ""), "s3://bucket"),
    ("s3://bucket/some/prefix/", StorageURI("s3", "bucket", "some/prefix"), "s3://bucket/some/prefix"),
])
def test_parse_and_print(text, parsed, printed):
    assert StorageURI.parse(text) == parsed
    assert str(parsed) == printed
    assert StorageURI.parse(printed) == parsed  # printing is canonical


@pytest.mark.parametrize("bad", ["", "relative/dir", "file://host/d", "file:///d?q=1", "file:rel", "gs://b/p", "s3:///p"])
def test_bad_uris(bad):
    with pytest.raises(InvalidArgument):
        StorageURI.parse(bad)


def test_object_uris_round_trip(tmp_path):
    d = tmp_path / "a b"
    store = open_store(d.as_uri())
    assert isinstance(store, LocalStore) and store.root == str(d) and store.uri == d.as_uri()
    uri = store.full_uri("x/y z.txt")
    root, key = StorageURI.split_object(uri)
    assert (str(root), key) == (str(StorageURI.parse(store.uri)) + "/x", "y z.txt")
    assert StorageURI("s3", "b", "p").object_uri("k/1") == "s3://b/p/k/1"
    assert StorageURI.split_object("s3://b/p/k/1") == (StorageURI("s3", "b", ""), "p/k/1")
    assert split_full_address("file:///d/s/f") == ("file:///d/s", "f")
    for bad in ("data/x", "s3://bucket", "file:///", "gs://b/k"):
        with pytest.raises(InvalidArgument):
            StorageURI.split_object(bad)


def test_bad_input_in_a_uri_is_invalid_argument_and_a_stored_address_is_read_as_written(tmp_path):
    """Found by fuzzing: `--storage file:///a%00b` and `file://[x/y` escaped as ValueError (a
    traceback, exit 1), and `file:///d/%ff` made the directory `d/%EF%BF%BD` (a replacement
    character, not the byte written). A new namespace refuses them (InvalidArgument: exit 2);
    a stored object address keeps bytes that are not UTF-8 as the bytes written; an entry whose
    address cannot be parsed is damage (CorruptedData), not the caller's bad input."""
    from graveler.errors import CorruptedData
    from graveler.model import AddressType, Entry
    from graveler.objects import EntryReader

    for bad, why in (("file:///a%00b", "NUL"), ("/a\x00b", "NUL"), ("file://[x/y", "IPv6"),
                     ("file:///d/%ff", "not UTF-8")):
        with pytest.raises(InvalidArgument, match=why):
            StorageURI.parse(bad)
    root, key = StorageURI.split_object("file:///tmp/x%ff/f%fe")
    assert root.path.encode("utf-8", "surrogateescape") == b"/tmp/x\xff"
    assert key.encode("utf-8", "surrogateescape") == b"f\xfe"
    assert root.object_uri(key) == "file:///tmp/x%FF/f%FE"  # printed back as written
    d = tmp_path / "ns"
    reader = EntryReader(d.as_uri(), open_store(d.as_uri()), open_store)
    with pytest.raises(CorruptedData, match="damaged entry"):
        reader.locate(Entry("file://[x/y", 3, "etag", address_type=AddressType.FULL))
    store, k = reader.locate(Entry(d.as_uri() + "/data/obj", 3, "etag", address_type=AddressType.FULL))
    assert k == "obj" and store is not None  # a healthy FULL address: its directory, its name
