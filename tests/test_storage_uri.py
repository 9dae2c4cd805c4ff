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
