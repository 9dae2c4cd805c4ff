"""One contract suite for every ObjectStore backend: a local directory and S3 over HTTP (moto).

Backend-specific behaviour (local temp files and directory pruning, S3 endpoint
errors, multipart ETags) is tested at the end, after the contract.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from graveler.errors import GravelerError, InvalidArgument, NotFound, StoreUnavailable
from graveler.objstore import LocalStore, ObjectInfo, ObjectStore, StoreConfig, open_store

MiB = 1 << 20
BACKENDS = ["local", pytest.param("s3", marks=pytest.mark.s3), pytest.param("s3-prefix", marks=pytest.mark.s3)]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def make_store(request, tmp_path):
    """factory(sub="") -> a store of this backend rooted at <root>/<sub>."""
    opened: list[ObjectStore] = []
    if request.param == "local":
        root = tmp_path / "store"

        def factory(sub: str = "") -> ObjectStore:
            store = open_store(str(root / sub) if sub else str(root))
            opened.append(store)
            return store
    else:
        bucket = request.getfixturevalue("s3_bucket")
        config = request.getfixturevalue("s3_config")

        def factory(sub: str = "") -> ObjectStore:
            store = open_store(f"s3://{bucket}/{sub}" if sub else f"s3://{bucket}", config)
            opened.append(store)
            return store

    factory.backend = request.param
    yield factory
    for store in opened:
        store.close()


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    if request.param == "local":
        s = open_store(str(tmp_path / "store"))
    else:
        bucket = request.getfixturevalue("s3_bucket")
        config = request.getfixturevalue("s3_config")
        uri = f"s3://{bucket}/some/prefix" if request.param == "s3-prefix" else f"s3://{bucket}"
        s = open_store(uri, config)
    yield s
    s.close()


def is_local(store: ObjectStore) -> bool:
    return isinstance(store, LocalStore)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def put_many(store: ObjectStore, items: dict[str, bytes]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: store.put(*kv), items.items()))


# ---------------------------------------------------------------------------------------
# the contract
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["a", "dir/sub/obj.parquet", "with space/ünïcødé-名前", "x" * 200])
def test_put_get_roundtrip(store, key):
    data = os.urandom(1000)
    info = store.put(key, data)
    assert isinstance(info, ObjectInfo)
    assert (info.key, info.size, info.etag) == (key, len(data), md5(data))
    assert abs(info.mtime - time.time()) < 60
    assert store.get(key) == data
    head = store.head(key)
    assert (head.key, head.size, head.etag) == (key, len(data), info.etag)
    assert abs(head.mtime - info.mtime) <= 1.0


def test_put_overwrites_and_empty_object(store):
    store.put("k", b"first version")
    info = store.put("k", b"second")
    assert store.get("k") == b"second"
    assert store.head("k").etag == info.etag == md5(b"second")
    empty = store.put("empty", b"")
    assert empty.size == 0 and empty.etag == md5(b"")
    assert store.get("empty") == b""
    assert store.get_range("empty", 0, 10) == b""
    store.put("ba", bytearray(b"bytes-like"))
    assert store.get("ba") == b"bytes-like"
    with pytest.raises(InvalidArgument):
        store.put("k", "a str is not bytes")


def test_put_immutable_and_get_immutable(store):
    """A table file: stored as put stores it (its etag computed only when asked), read back as a buffer; a
    local file has a fingerprint that changes when the file is rewritten, other stores have none."""
    data = os.urandom(5000)
    assert store.put_immutable("_lakefs/t1", data) is None
    assert store.get("_lakefs/t1") == data
    assert store.head("_lakefs/t1").etag == md5(data)
    buf, fp = store.get_immutable("_lakefs/t1")
    assert bytes(buf) == data
    mapped, fp2 = store.get_immutable("_lakefs/t1", min_size=0)
    assert bytes(mapped) == data
    if store.uri.startswith("file:"):
        assert fp is not None and fp == fp2 == store.fingerprint("_lakefs/t1")
        store.put_immutable("_lakefs/t1", data)  # the same bytes again: a new file, a new fingerprint
        assert store.fingerprint("_lakefs/t1") != fp
    else:
        assert fp is None and fp2 is None and store.fingerprint("_lakefs/t1") is None
    with pytest.raises(NotFound):
        store.get_immutable("_lakefs/missing")
    with pytest.raises(InvalidArgument):
        store.put_immutable("_lakefs/t2", "a str is not bytes")


def test_get_range(store):
    data = bytes(range(256)) * 40  # 10240 bytes
    store.put("r", data)
    assert store.get_range("r", 0, 10) == data[:10]
    assert store.get_range("r", 100, 1000) == data[100:1100]
    assert store.get_range("r", 10_000, 1000) == data[10_000:]  # short read at EOF
    assert store.get_range("r", len(data) - 1, 1) == data[-1:]
    assert store.get_range("r", len(data), 5) == b""  # at EOF
    assert store.get_range("r", len(data) + 100, 5) == b""  # past EOF
    assert store.get_range("r", 5, 0) == b""
    with pytest.raises(InvalidArgument):
        store.get_range("r", -1, 5)
    with pytest.raises(InvalidArgument):
        store.get_range("r", 0, -5)
    with pytest.raises(NotFound):
        store.get_range("missing", 0, 10)
    with pytest.raises(NotFound):
        store.get_range("missing", 0, 0)


def test_open_stream_reads_a_range_in_order_and_tells_the_size(store):
    """One sequential read of a range (S3: one GET): the bytes in order, in pieces of any size,
    the object's size beside them; a range past the end is cut there; a missing key is NotFound."""
    data = os.urandom(3 * 65536 + 17)
    store.put("s/obj", data)
    with store.open_stream("s/obj", 1000, 200_000) as st:
        assert st.total == len(data)
        got = []
        for n in (1, 65536, 7, 1 << 20):
            got.append(st.read(n))
        assert b"".join(got) == data[1000:1000 + 1 + 65536 + 7 + (len(data) - 1000 - 65544)]
        assert st.read(10) == b""
    with store.open_stream("s/obj") as st:  # the whole object
        out = bytearray()
        while piece := st.read(50_000):
            out += piece
        assert bytes(out) == data and st.total == len(data)
    with store.open_stream("s/obj", len(data) + 5, 10) as st:  # past the end: nothing, the size still told
        assert st.read(10) == b"" and st.total == len(data)
    with pytest.raises(NotFound):
        store.open_stream("s/missing", 0, 10).read(10)


def test_head_and_exists(store):
    assert not store.exists("d/obj")
    store.put("d/obj", b"12345")
    assert store.exists("d/obj")
    assert store.head("d/obj").size == 5
    # "d" is a prefix of an object, not an object
    assert not store.exists("d")
    with pytest.raises(NotFound):
        store.head("d")
    with pytest.raises(NotFound):
        store.head("d/obj/below")


def test_not_found(store, tmp_path):
    for op in (store.get, store.head):
        with pytest.raises(NotFound):
            op("no/such/key")
    dest = tmp_path / "dest"
    with pytest.raises(NotFound):
        store.get_to_file("no/such/key", str(dest))
    assert not dest.exists()
    assert sorted(os.listdir(tmp_path)) == []  # (a local store's root too: made by its first write)


def test_delete_is_idempotent(store):
    store.delete("never/existed")
    store.put("a/b/c", b"1")
    store.put("a/b/d", b"2")
    store.delete("a/b/c")
    store.delete("a/b/c")
    assert not store.exists("a/b/c")
    with pytest.raises(NotFound):
        store.get("a/b/c")
    assert store.get("a/b/d") == b"2"
    assert [i.key for i in store.list()] == ["a/b/d"]
    store.delete("a/b")  # a prefix, not an object: nothing happens
    assert store.exists("a/b/d")


TRICKY_KEYS = [
    "a", "a-c", "a/b", "a/b/c", "a/b-c", "a0", "ab", "b/x", "b/y/z", "c.txt", "ä/x", "Z",
    "dir/0", "dir/1/2", "dir-2/0", "dir0",
]


def test_list_order_prefix_start_after(store):
    # Local "a" and "a/b" cannot both exist; keep the tricky ordering without that clash.
    keys = [k for k in TRICKY_KEYS if k not in ("a", "a/b")]
    items = {k: k.encode() * 3 for k in keys}
    put_many(store, items)
    expected = sorted(keys, key=lambda k: k.encode("utf-8"))

    it = store.list()
    assert iter(it) is it  # lazy
    listed = list(it)
    assert [i.key for i in listed] == expected
    for info in listed:
        assert info.size == len(items[info.key])
        assert info.etag == md5(items[info.key])

    def keys_of(**kw):
        return [i.key for i in store.list(**kw)]

    assert keys_of(prefix="a/") == [k for k in expected if k.startswith("a/")]
    assert keys_of(prefix="a") == [k for k in expected if k.startswith("a")]
    assert keys_of(prefix="dir") == ["dir-2/0", "dir/0", "dir/1/2", "dir0"]
    assert keys_of(prefix="dir/") == ["dir/0", "dir/1/2"]
    assert keys_of(prefix="b/y/z") == ["b/y/z"]
    assert keys_of(prefix="nope") == []
    assert keys_of(prefix="a//") == []
    for after in ["", "a", "a-c", "a/", "a/b", "a/b/c", "b", "b/y", "dir/1", "zzz", "\U0010ffff"]:
        assert keys_of(start_after=after) == [k for k in expected if k > after], after
    assert keys_of(prefix="dir", start_after="dir/0") == ["dir/1/2", "dir0"]
    assert keys_of(prefix="dir/", start_after="a") == ["dir/0", "dir/1/2"]
    with pytest.raises(InvalidArgument):
        store.list(prefix="/abs")
    with pytest.raises(InvalidArgument):
        store.list(start_after="nul\x00")


def test_list_level_and_delete_many(store):
    keys = ["top", "a/1", "a/2", "a/b/3", "b/4", "b-c/5", "é/6"]
    put_many(store, {k: k.encode() for k in keys})
    objs, subs = store.list_level()
    assert [o.key for o in objs] == ["top"] and objs[0].etag == md5(b"top") and objs[0].size == 3
    assert subs == ["a/", "b-c/", "b/", "é/"]
    objs, subs = store.list_level("a/")
    assert [o.key for o in objs] == ["a/1", "a/2"] and subs == ["a/b/"]
    assert store.list_level("nope/") == ([], [])
    for bad in ("a", "/a/", "a//", "nul\x00/"):
        with pytest.raises(InvalidArgument):
            store.list_level(bad)
    assert store.delete_many(["a/1", "b/4", "missing/x"]) == []
    assert [i.key for i in store.list()] == sorted(set(keys) - {"a/1", "b/4"}, key=lambda k: k.encode())
    with pytest.raises(InvalidArgument):
        store.delete_many(["ok", "../bad"])


def test_list_pagination(make_store):
    """More than one S3 page (1000 keys); resuming with start_after."""
    store = make_store()
    n = 1003
    keys = [f"p/{i // 100:02d}/{i:05d}" for i in range(n)]
    put_many(store, {k: b"x" for k in keys})
    store.put("q/outside", b"y")
    listed = [i.key for i in store.list(prefix="p/")]
    assert listed == keys
    assert [i.key for i in store.list(prefix="p/", start_after=keys[999])] == keys[1000:]
    # Laziness: taking a few keys does not need the rest.
    it = store.list()
    assert [next(it).key for _ in range(3)] == keys[:3]


def test_put_file_get_to_file(store, tmp_path):
    src = tmp_path / "src.bin"
    data = os.urandom(300_000)
    src.write_bytes(data)
    info = store.put_file("files/small", str(src))
    assert (info.size, info.etag) == (len(data), md5(data))
    assert store.get("files/small") == data

    dest = tmp_path / "out" / "small.bin"
    dest.parent.mkdir()
    dest.write_bytes(b"old content, replaced")
    got = store.get_to_file("files/small", str(dest))
    assert dest.read_bytes() == data
    assert (got.key, got.size, got.etag) == ("files/small", len(data), info.etag)
    assert os.listdir(dest.parent) == ["small.bin"]  # no temp file left behind

    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert store.put_file("files/empty", str(empty)).size == 0
    assert store.get_to_file("files/empty", str(tmp_path / "empty.out")).size == 0
    assert (tmp_path / "empty.out").read_bytes() == b""

    with pytest.raises(InvalidArgument):
        store.put_file("files/x", str(tmp_path / "no-such-source"))
    with pytest.raises(InvalidArgument):
        store.get_to_file("files/small", str(tmp_path / "no-such-dir" / "f"))


def test_multipart_put_file_get_to_file(store, tmp_path):
    """12 MiB with a 5 MiB threshold and part size (S3): 3 parts up, 3 ranged GETs down."""
    data = os.urandom(12 * MiB + 123)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    info = store.put_file("big/file.bin", str(src))
    assert info.size == len(data)
    head = store.head("big/file.bin")
    assert (head.size, head.etag) == (info.size, info.etag)
    if is_local(store):
        assert info.etag == md5(data)
    else:
        assert info.etag.endswith("-3")  # multipart ETag: md5 of the part md5s, dash, part count
    dest = tmp_path / "big.out"
    got = store.get_to_file("big/file.bin", str(dest))
    assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert (got.size, got.etag) == (info.size, info.etag)
    assert store.get_range("big/file.bin", 5 * MiB - 10, 20) == data[5 * MiB - 10:5 * MiB + 10]


def test_put_is_atomic_for_concurrent_readers(store):
    """Readers see one whole version or the other, never a mix or a partial object."""
    versions = [b"A" * (2 * MiB), b"B" * (2 * MiB + 4096), b"C" * 1000]
    store.put("hot", versions[0])
    stop = threading.Event()
    seen: list[bytes] = []
    errors: list[BaseException] = []

    def reader():
        try:
            while not stop.is_set():
                data = store.get("hot")
                if data not in versions:
                    errors.append(AssertionError(f"torn read: {len(data)} bytes"))
                    return
                seen.append(data[:1])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(24):
        store.put("hot", versions[i % 3])
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    assert seen
    if is_local(store):
        leftovers = [f for _, _, files in os.walk(store.root) for f in files if f != "hot"]
        assert leftovers == []


BAD_KEYS = ["", "/abs", "a//b", "trailing/", "./a", "a/./b", "a/../b", "..", ".", "a/..", "nul\x00byte",
            "lone\ud800surrogate"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_key_validation(store, key, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"x")
    calls = [
        lambda: store.get(key), lambda: store.get_range(key, 0, 1), lambda: store.put(key, b"x"),
        lambda: store.put_file(key, str(src)), lambda: store.get_to_file(key, str(tmp_path / "d")),
        lambda: store.head(key), lambda: store.exists(key), lambda: store.delete(key),
        lambda: store.full_uri(key),
    ]
    for call in calls:
        with pytest.raises(InvalidArgument):
            call()
    if is_local(store):  # nothing escaped the root
        assert sorted(os.listdir(tmp_path)) == ["src"]  # (nor made the root: nothing was written)


def test_prefix_store(make_store):
    root = make_store()
    sub = make_store("some/prefix")
    sub.put("k/1", b"inside")
    root.put("some/prefixed-sibling", b"outside")
    root.put("some/other/k", b"outside")
    assert root.get("some/prefix/k/1") == b"inside"
    assert [i.key for i in sub.list()] == ["k/1"]
    assert [i.key for i in sub.list(prefix="k/")] == ["k/1"]
    assert [i.key for i in root.list(prefix="some/")] == ["some/other/k", "some/prefix/k/1",
                                                          "some/prefixed-sibling"]
    assert sub.full_uri("k/1") == root.full_uri("some/prefix/k/1")
    assert sub.full_uri("k/1") == sub.uri + "/k/1"
    # open_store(store.uri) is the same store
    again = open_store(sub.uri, getattr(sub, "config", None))
    assert again.uri == sub.uri and again.get("k/1") == b"inside"
    again.close()
    if make_store.backend == "s3":
        root.put("some/prefix", b"an object named like the prefix")
        assert [i.key for i in sub.list()] == ["k/1"]


# ---------------------------------------------------------------------------------------
# open_store and StoreConfig
# ---------------------------------------------------------------------------------------


def test_open_store_dispatch(tmp_path):
    d = tmp_path / "has space%"
    s = open_store(str(d))
    assert isinstance(s, LocalStore) and not d.exists()  # (made by the first write)
    s.put("k", b"v")
    assert d.is_dir()
    assert s.uri == d.as_uri()
    assert open_store(s.uri).root == str(d)
    assert open_store("file://localhost" + str(d)).root == str(d)
    for bad in ["relative/path", "ftp://host/x", "file://otherhost/x", "file:relative", "", "s3://"]:
        with pytest.raises(InvalidArgument):
            open_store(bad)
    f = tmp_path / "a-file"
    f.write_bytes(b"")
    with pytest.raises(InvalidArgument):
        open_store(str(f))
    with pytest.raises(InvalidArgument, match="which exists and is not a directory"):  # (it blamed the root)
        open_store(str(f / "sub" / "root"))
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # (it was "keeps disappearing" at the first put)
    with pytest.raises(InvalidArgument, match="symbolic link to nothing"):
        open_store(str(tmp_path / "dangling"))


def test_open_store_s3_uri_needs_no_network():
    from graveler.objstore.s3 import S3Store

    cfg = StoreConfig(s3_endpoint_url="http://127.0.0.1:9", region="us-east-1")
    s = open_store("s3://bucket/some/prefix/", cfg)
    assert isinstance(s, S3Store)
    assert (s.bucket, s.prefix, s.uri) == ("bucket", "some/prefix", "s3://bucket/some/prefix")
    assert s.full_uri("a/b") == "s3://bucket/some/prefix/a/b"
    s.close()
    with pytest.raises(InvalidArgument):
        open_store("s3://bucket/a//b", cfg)


def test_store_config(monkeypatch):
    monkeypatch.delenv("LAKEFUSE_S3_ENDPOINT", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert StoreConfig().s3_endpoint_url is None
    assert StoreConfig().effective_addressing_style == "auto"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://aws-env:1")
    assert StoreConfig().s3_endpoint_url == "http://aws-env:1"
    monkeypatch.setenv("LAKEFUSE_S3_ENDPOINT", "http://lakefuse-env:2")
    cfg = StoreConfig()
    assert cfg.s3_endpoint_url == "http://lakefuse-env:2"
    assert cfg.effective_addressing_style == "path"
    assert StoreConfig(addressing_style="virtual").effective_addressing_style == "virtual"
    for bad in [dict(max_attempts=0), dict(retry_mode="legacy"), dict(addressing_style="dns"),
                dict(multipart_chunksize=1 * MiB), dict(read_timeout=0)]:
        with pytest.raises(InvalidArgument):
            StoreConfig(**bad)


# ---------------------------------------------------------------------------------------
# S3 specifics
# ---------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.s3
def test_unreachable_endpoint_fails_fast(s3_endpoint):
    port = _closed_port()
    cfg = StoreConfig(s3_endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1", max_attempts=2,
                      connect_timeout=1, read_timeout=1)
    store = open_store("s3://bucket/prefix", cfg)
    for op in (lambda: store.get("k"), lambda: store.put("k", b"x"), lambda: list(store.list()),
               lambda: store.head("k")):
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable) as err:
            op()
        assert time.monotonic() - t0 < 5
        message = str(err.value)
        assert f"127.0.0.1:{port}" in message and "unreachable" in message
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in message
    store.close()


@pytest.mark.s3
def test_a_user_and_password_in_the_endpoint_url_never_show_in_messages(s3_endpoint):
    """Found by an S3 user's tour: `AWS_ENDPOINT_URL=http://admin:PASS@host:port` put the password
    in every error message (and so the mount's log), botocore's own text naming the URL it asked."""
    port = _closed_port()
    cfg = StoreConfig(s3_endpoint_url=f"http://admin:hunter2pass@127.0.0.1:{port}", region="us-east-1",
                      max_attempts=1, connect_timeout=1, read_timeout=1)
    store = open_store("s3://bucket/prefix", cfg)
    for op in (lambda: store.get("k"), lambda: store.head("k")):
        with pytest.raises(StoreUnavailable) as err:
            op()
        message = str(err.value)
        assert f"http://***@127.0.0.1:{port}" in message and "hunter2pass" not in message and "admin" not in message
    store.close()
    with pytest.raises(InvalidArgument) as err:
        open_store("s3://bucket", StoreConfig(s3_endpoint_url="http://admin:hunter2pass@[::1", region="us-east-1"))
    assert "hunter2pass" not in str(err.value)


@pytest.mark.s3
def test_missing_bucket_is_store_unavailable(s3_config):
    store = open_store("s3://no-such-bucket-here", s3_config)
    for op in (lambda: store.get("k"), lambda: store.put("k", b"x"), lambda: list(store.list())):
        with pytest.raises(StoreUnavailable, match="no-such-bucket-here.*does not exist"):
            op()
    store.close()


@pytest.mark.s3
def test_no_credentials_is_store_unavailable(s3_config, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    store = open_store("s3://bucket", s3_config)
    with pytest.raises(StoreUnavailable, match="credentials"):
        store.get("k")
    store.close()


@pytest.mark.s3
def test_s3_multipart_leaves_no_pending_uploads(s3_config, s3_bucket, s3_client, tmp_path):
    src = tmp_path / "big"
    src.write_bytes(os.urandom(11 * MiB))
    store = open_store(f"s3://{s3_bucket}", s3_config)
    store.put_file("big", str(src))
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    store.close()


@pytest.mark.s3
def test_s3_download_restarts_when_the_object_changes(s3_config, s3_bucket, s3_client, tmp_path):
    """A ranged download pins the first part's ETag (If-Match): never a mix of two versions."""
    old, new = os.urandom(11 * MiB), os.urandom(1000)
    store = open_store(f"s3://{s3_bucket}", s3_config)
    store.put("obj", old)
    gets = []

    def replace_after_first_part(**kwargs):  # botocore's public event hook on our client
        gets.append(1)
        if len(gets) == 2:
            s3_client.put_object(Bucket=s3_bucket, Key="obj", Body=new)

    store._client.meta.events.register("before-call.s3.GetObject", replace_after_first_part)
    info = store.get_to_file("obj", str(tmp_path / "out"))
    assert (tmp_path / "out").read_bytes() == new
    assert (info.size, info.etag) == (len(new), md5(new))
    assert len(gets) >= 4  # 3 parts of the old version (2 refused), then the new one
    store.close()


# ---------------------------------------------------------------------------------------
# local specifics
# ---------------------------------------------------------------------------------------


def test_local_file_and_directory_cannot_share_a_name(tmp_path):
    store = LocalStore(str(tmp_path / "s"))
    store.put("a/b", b"1")
    with pytest.raises(InvalidArgument, match="conflicts"):
        store.put("a", b"2")
    with pytest.raises(InvalidArgument, match="conflicts"):
        store.put("a/b/c", b"3")
    assert store.get("a/b") == b"1"
    with pytest.raises(NotFound):
        store.get("a")


def test_local_reserved_and_overlong_names(tmp_path):
    store = LocalStore(str(tmp_path / "s"))
    with pytest.raises(InvalidArgument, match="reserved"):
        store.put("x/.lakefuse-tmp-" + "0" * 32, b"")
    with pytest.raises(InvalidArgument, match="255"):
        store.put("x/" + "y" * 256, b"")
    store.put("x/" + "é" * 127, b"ok")  # 254 bytes


def test_local_delete_prunes_empty_directories(tmp_path):
    store = LocalStore(str(tmp_path / "s"))
    store.put("a/b/c/d", b"1")
    store.put("a/x", b"2")
    store.delete("a/b/c/d")
    assert sorted(os.listdir(store.root)) == ["a"]
    assert sorted(os.listdir(os.path.join(store.root, "a"))) == ["x"]
    store.delete("a/x")
    assert os.listdir(store.root) == []
    assert os.path.isdir(store.root)


def test_local_etag_of_files_placed_behind_the_store(tmp_path):
    store = LocalStore(str(tmp_path / "s"))
    (tmp_path / "s" / "ext").mkdir(parents=True)
    path = tmp_path / "s" / "ext" / "f"
    path.write_bytes(b"written by someone else")
    assert store.head("ext/f").etag == md5(b"written by someone else")
    store.put("ext/f", b"by the store")
    with open(path, "r+b") as f:  # modified in place: the kept etag is stale and ignored
        f.write(b"BY")
    os.utime(path, ns=(0, 123_456_789))
    assert store.head("ext/f").etag == md5(b"BY the store")
    assert [i.etag for i in store.list()] == [md5(b"BY the store")]
    dest = tmp_path / "copy"
    assert store.get_to_file("ext/f", str(dest)).etag == md5(b"BY the store")
    assert dest.read_bytes() == b"BY the store"


def test_local_list_skips_temp_files_and_symlinks(tmp_path):
    store = LocalStore(str(tmp_path / "s"))
    store.put("d/real", b"1")
    (tmp_path / "s" / "d" / (".lakefuse-tmp-" + "a" * 32)).write_bytes(b"partial")
    os.symlink("/etc", tmp_path / "s" / "d" / "link")
    assert [i.key for i in store.list()] == ["d/real"]


def test_local_concurrent_put_and_delete_in_one_directory(tmp_path):
    """Deletes prune directories that concurrent puts are about to write into."""
    store = LocalStore(str(tmp_path / "s"))

    def worker(n: int) -> None:
        for i in range(150):
            key = f"shared/deep/dir/k{n}"
            store.put(key, b"%d" % i)
            store.delete(key)
        store.put(f"shared/deep/dir/k{n}", b"final")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(worker, range(8)))
    assert [i.key for i in store.list()] == [f"shared/deep/dir/k{n}" for n in range(8)]


_WRITER = """
import sys
from graveler.objstore import LocalStore
store = LocalStore(sys.argv[1])
payload = sys.argv[2].encode() * 50_000
for i in range(40):
    store.put("same/key", payload)
    store.put(f"own/{sys.argv[2]}/{i}", payload)
"""


def test_local_multi_process_writers(tmp_path):
    root = str(tmp_path / "s")
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, root, name]) for name in ("p", "q")]
    for p in procs:
        assert p.wait(timeout=60) == 0
    store = LocalStore(root)
    assert store.get("same/key") in (b"p" * 50_000, b"q" * 50_000)
    keys = [i.key for i in store.list()]
    assert len(keys) == 81 and keys[-1] == "same/key"
    leftovers = [f for _, _, files in os.walk(root) for f in files if f.startswith(".")]
    assert leftovers == []


def test_local_sync_object_flushes_the_file_and_its_directory_in_kept_threads(tmp_path, monkeypatch):
    """An fsync through the mount syncs the object's file and its directory (its name) at once:
    both are flushed, the directory's in one of a few threads kept for it (not one made per
    call); a flush that fails says so; a missing object is NotFound; a forked child syncs too."""
    store = LocalStore(str(tmp_path / "s"))
    for i in range(20):
        store.put(f"d/k{i}", b"x" * i)
    synced, runners, real_fsync = [], set(), os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            runners.add(threading.current_thread())  # (the objects: an OS thread ID may be reused)
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(store.sync_object, [f"d/k{i}" for i in range(20)]))
    assert sorted(synced) == sorted(["dir"] * 20 + [f"k{i}" for i in range(20)])
    assert 1 <= len(runners) <= 8 and all(t.name.startswith("graveler-fsync") for t in runners)  # kept, not one per call
    with pytest.raises(NotFound):
        store.sync_object("d/missing")

    def failing(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(GravelerError, match="Input/output error"):
        store.sync_object("d/k1")
    monkeypatch.setattr(os, "fsync", real_fsync)
    pid = os.fork()
    if pid == 0:  # the child: the parent's flush threads are not there; its own are made
        try:
            store.sync_object("d/k2")
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
