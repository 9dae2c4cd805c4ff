"""The KV protocol's contract (graveler.kv.base), run on every backend (tests/conftest.py)."""

from __future__ import annotations

import threading

import pytest

from graveler import kv
from graveler.errors import NotFound
from tests.graveler_testutil import backend_kv


@pytest.fixture
def backend(tmp_path):
    b = kv.open_backend(backend_kv(tmp_path), tmp_path / "home")
    yield b
    for name in b.names():
        b.close(name)


@pytest.fixture
def store(backend):
    return backend.open("repo1")


def test_get_put_insert_delete(store):
    assert store.write(lambda t: t.get(kv.BRANCHES, b"a")) is None
    store.write(lambda t: t.put(kv.BRANCHES, b"a", b"1"))
    with store.read() as t:
        assert t.get(kv.BRANCHES, b"a") == b"1"
        assert t.get(kv.TAGS, b"a") is None  # tables are separate
    assert store.write(lambda t: t.insert(kv.BRANCHES, b"a", b"2")) is False
    assert store.write(lambda t: t.insert(kv.BRANCHES, b"b", b"2")) is True
    assert store.write(lambda t: t.delete(kv.BRANCHES, b"a")) is True
    assert store.write(lambda t: t.delete(kv.BRANCHES, b"a")) is False
    with store.read() as t:
        assert [k for k, _ in t.scan(kv.BRANCHES)] == [b"b"] and t.count(kv.BRANCHES) == 1


def test_get_many_reads_several_tables_keys_in_order_and_sees_its_own_writes(store):
    store.write(lambda t: (t.put(kv.BRANCHES, b"main", b"B"), t.put(kv.REPO, b"born\0main", b"R")))
    keys = [(kv.BRANCHES, b"main"), (kv.REPO, b"born\0main"), (kv.TAGS, b"main"), (kv.BRANCHES, b"main")]
    with store.read() as t:
        assert t.get_many(keys) == [b"B", b"R", None, b"B"]
        assert t.get_many([]) == [] and t.get(kv.REPO, b"born\0main") == b"R"

    def fn(t):
        t.put(kv.BRANCHES, b"main", b"B2")  # (not sent yet, on a server)
        t.delete(kv.REPO, b"born\0main")
        t.put(kv.TAGS, b"main", b"T")
        first = t.get_many(keys)
        t.put(kv.TAGS, b"main", b"T2")
        return first, t.get_many(keys[2:3]), t.get(kv.BRANCHES, b"main")
    assert store.write(fn) == ([b"B2", None, b"T", b"B2"], [b"T2"], b"B2")
    with store.read() as t:
        assert t.get_many(keys) == [b"B2", None, b"T2", b"B2"]


def test_compare_and_set(store):
    assert store.write(lambda t: t.set_if(kv.BRANCHES, b"m", b"v1", None)) is True  # absent -> v1
    assert store.write(lambda t: t.set_if(kv.BRANCHES, b"m", b"v2", None)) is False
    assert store.write(lambda t: t.set_if(kv.BRANCHES, b"m", b"v2", b"v0")) is False
    assert store.write(lambda t: t.set_if(kv.BRANCHES, b"m", b"v2", b"v1")) is True
    assert store.write(lambda t: t.set_if(kv.BRANCHES, b"m", None, b"v2")) is True  # delete
    with store.read() as t:
        assert t.get(kv.BRANCHES, b"m") is None


def test_ordered_scan_from_a_key_and_range_delete(store):
    keys = [b"a", b"a\x00", b"ab", b"b", b"b\xff", b"c"]
    store.write(lambda t: t.put_many(kv.STAGING, [(k, k.upper()) for k in reversed(keys)]))
    with store.read() as t:
        assert [k for k, _ in t.scan(kv.STAGING)] == keys
        assert list(t.scan(kv.STAGING, b"ab", b"c")) == [(b"ab", b"AB"), (b"b", b"B"), (b"b\xff", b"B\xff")]
        assert [v for _, v in t.scan(kv.STAGING, b"b", values=False)] == [None, None, None]
        assert list(t.scan(kv.STAGING, b"d")) == []
    assert store.write(lambda t: t.delete_range(kv.STAGING, b"a", b"b", limit=2)) == 2
    with store.read() as t:
        assert [k for k, _ in t.scan(kv.STAGING)] == [b"ab", b"b", b"b\xff", b"c"]
    assert store.write(lambda t: t.delete_range(kv.STAGING, b"b", None)) == 3
    with store.read() as t:
        assert [k for k, _ in t.scan(kv.STAGING)] == [b"ab"]


def test_a_failed_write_changes_nothing(store):
    store.write(lambda t: t.put(kv.COMMITS, b"keep", b"1"))

    def fn(t):
        t.put(kv.COMMITS, b"keep", b"2")
        t.put(kv.COMMITS, b"new", b"x")
        t.delete_range(kv.COMMITS, b"", None)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        store.write(fn)
    with store.read() as t:
        assert list(t.scan(kv.COMMITS)) == [(b"keep", b"1")]


def test_nesting_rules(store):
    def outer(t):
        t.put(kv.TAGS, b"k", b"v")
        with store.read() as inner:
            assert inner.get(kv.TAGS, b"k") == b"v"  # the write's own transaction
        with pytest.raises(kv.NestedTransaction):
            store.write(lambda t2: None)
        return True

    assert store.write(outer)
    with store.read():
        with pytest.raises(kv.NestedTransaction):
            store.write(lambda t: None)


def test_grouped_writes_from_threads_each_keep_their_result_and_error(store):
    results: dict[int, object] = {}

    def one(i):
        def fn(t):
            if i % 7 == 3:
                raise ValueError(i)
            t.put(kv.STAGING, b"%03d" % i, b"v")
            return i
        try:
            results[i] = store.write_grouped(fn, durable=i % 2 == 0)
        except ValueError as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    store.sync()
    for i in range(40):
        assert isinstance(results[i], ValueError) if i % 7 == 3 else results[i] == i
    with store.read() as t:
        assert t.count(kv.STAGING) == len([i for i in range(40) if i % 7 != 3])


def test_backend_names_exists_borrow_and_remove(backend):
    assert backend.names() == [] and not backend.exists("r1")
    with pytest.raises(NotFound):
        backend.open("r1", create=False)
    backend.open("r1").write(lambda t: t.put(kv.REPO, b"record", b"{}"))
    backend.open("r2").write(lambda t: t.put(kv.REPO, b"record", b"{}"))
    assert backend.names() == ["r1", "r2"] and backend.exists("r1")
    with backend.borrowed("r2") as s:
        with s.read() as t:
            assert t.get(kv.REPO, b"record") == b"{}"
    backend.remove("r1")
    assert backend.names() == ["r2"] and not backend.exists("r1")


def test_keys_up_to_the_one_limit(store):
    k = b"k" * kv.MAX_KEY_BYTES
    store.write(lambda t: t.put(kv.STAGING, k, b"v"))
    with store.read() as t:
        assert t.get(kv.STAGING, k) == b"v"


def test_store_get_reads_one_key_on_its_own_and_sees_the_callers_transaction(store):
    assert store.get(kv.STAGING, b"k") is None
    store.write(lambda txn: txn.put(kv.STAGING, b"k", b"v1"))
    assert store.get(kv.STAGING, b"k") == b"v1"
    assert store.get(kv.BRANCHES, b"k") is None  # tables stay apart

    def fn(txn):
        txn.put(kv.STAGING, b"k", b"v2")
        return store.get(kv.STAGING, b"k")  # inside this thread's write: its own view

    assert store.write(fn) == b"v2"
    with store.read() as txn:
        assert store.get(kv.STAGING, b"k") == txn.get(kv.STAGING, b"k") == b"v2"
    store.write(lambda txn: txn.delete(kv.STAGING, b"k"))
    assert store.get(kv.STAGING, b"k") is None


def test_store_get_range_reads_a_small_range_on_its_own(store):
    store.write(lambda t: t.put_many(kv.STAMPS, [(b"a", b"1"), (b"m", b"2"), (b"m\x00\x01", b"3"), (b"n", b"4")]))
    assert store.get_range(kv.STAMPS, b"m", b"m\x01") == [(b"m", b"2"), (b"m\x00\x01", b"3")]
    assert store.get_range(kv.STAMPS, b"x", b"z") == []

    def fn(txn):
        txn.put(kv.STAMPS, b"m\x00\x02", b"5")
        return store.get_range(kv.STAMPS, b"m", b"m\x01")  # inside this thread's write: its own view

    assert [k for k, _ in store.write(fn)] == [b"m", b"m\x00\x01", b"m\x00\x02"]


def _u64(raw):
    return int.from_bytes(raw, "big")


def test_add_bumps_a_counter_without_reading_it(store):
    store.write(lambda t: t.add(kv.STAMPS, b"c", 1))  # absent: from 0
    assert _u64(store.get(kv.STAMPS, b"c")) == 1

    def fn(t):
        t.add(kv.STAMPS, b"c", 2)
        t.add(kv.STAMPS, b"c", 3)  # two adds in one transaction: both count
        t.put(kv.STAGING, b"k", b"v")  # beside other writes
        t.put(kv.STAMPS, b"d", (40).to_bytes(8, "big"))
        t.add(kv.STAMPS, b"d", 2)  # after a put of the same key: on top of it
    store.write(fn)
    assert _u64(store.get(kv.STAMPS, b"c")) == 6 and _u64(store.get(kv.STAMPS, b"d")) == 42
    assert store.get(kv.STAGING, b"k") == b"v"
    assert store.write(lambda t: (t.add(kv.STAMPS, b"c", 1), t.get(kv.STAMPS, b"c"))[1]) == (7).to_bytes(8, "big")


def test_concurrent_adds_lose_nothing_grouped_or_not(store):
    def bump(grouped):
        def go():
            for _ in range(25):
                (store.write_grouped if grouped else store.write)(lambda t: t.add(kv.STAMPS, b"n", 1))
        return go

    threads = [threading.Thread(target=bump(i % 2 == 0)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert _u64(store.get(kv.STAMPS, b"n")) == 150
