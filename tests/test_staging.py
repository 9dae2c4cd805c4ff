"""Staging areas in LMDB, seekable iterators, merged listings with delimiters."""

from __future__ import annotations

import bisect
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graveler import kv
from graveler.errors import InvalidArgument
from graveler.listing import CommittedIterator, ListIterator, MergedIterator, list_items
from graveler.model import Value
from graveler.staging import MAX_PATH_BYTES, StagingManager, as_path
from tests.graveler_testutil import backend_kv

T1, T2, T3 = "a" * 16, "b" * 16, "c" * 16


def V(s: str) -> Value:
    return Value(s.encode().ljust(32, b"."), b"data-" + s.encode())


@pytest.fixture
def sm(tmp_path):
    backend = kv.open_backend(backend_kv(tmp_path), tmp_path)
    yield StagingManager(backend.open("repo1"))
    backend.close("repo1")


def test_as_path():
    assert as_path("a/b") == b"a/b"
    assert as_path(b"x y/\xc3\xa9") == b"x y/\xc3\xa9"
    assert as_path("a//b") == b"a//b"
    for bad in ["", b"", "a/../b", "..", "./a", "a/.", "a\x00b", b"\xff", 3, "x" * (MAX_PATH_BYTES + 1)]:
        with pytest.raises(InvalidArgument):
            as_path(bad)
    assert as_path("x" * MAX_PATH_BYTES)


def test_set_get_tombstone(sm):
    env = sm.env
    env.write(lambda txn: sm.set_txn(txn, T1, b"a", V("1")))
    env.write(lambda txn: sm.set_txn(txn, T2, b"a", V("2")))
    env.write(lambda txn: sm.set_txn(txn, T2, b"b", None))
    assert sm.get([T1, T2], b"a") == (True, V("1"))
    assert sm.get([T2, T1], b"a") == (True, V("2"))
    assert sm.get([T1, T2], b"b") == (True, None)  # tombstone
    assert sm.get([T1, T2], b"c") == (False, None)
    assert sm.get([T3], b"a") == (False, None)
    assert sm.scan(T2) == [(b"a", V("2")), (b"b", None)]
    assert sm.count(T2) == 2 and sm.count(T3) == 0
    assert sm.tokens_present() == {T1, T2}
    sm.drop(T2)
    assert sm.scan(T2) == [] and sm.scan(T1) == [(b"a", V("1"))]


def test_token_keys_do_not_mix(sm):
    # A path that sorts before / after the separator must stay inside its token.
    paths = [b"\x01", b"a", b"\xc3\xa9", b"z" * 100]
    sm.env.write(lambda txn: sm.set_many_txn(txn, T1, [(p, V(p.hex())) for p in paths]))
    sm.env.write(lambda txn: sm.set_many_txn(txn, T2, [(b"m", V("m"))]))
    assert [k for k, _ in sm.scan(T1)] == sorted(paths)
    assert [k for k, _ in sm.scan(T2)] == [b"m"]
    assert [k for k, _ in sm.scan(T1, start=b"b", end=b"\xc3")] == [b"z" * 100]


def test_drop_prefix_and_batches(sm):
    items = [(b"d%04d/f" % i, V(str(i))) for i in range(500)] + [(b"e", V("e")), (b"d", V("d"))]
    sm.env.write(lambda txn: sm.set_many_txn(txn, T1, items))
    sm.env.write(lambda txn: sm.set_many_txn(txn, T2, items))
    n = sm.env.write(lambda txn: sm.drop_prefix_txn(txn, T1, b"d0"))
    assert n == 500
    assert [k for k, _ in sm.scan(T1)] == [b"d", b"e"]
    assert sm.drop(T2, batch=7) == 502
    assert sm.count(T2) == 0 and sm.count(T1) == 2


def test_token_iterator_seek(sm):
    keys = [b"k%05d" % i for i in range(0, 3000, 3)]
    sm.env.write(lambda txn: sm.set_many_txn(txn, T1, [(k, V(k.decode())) for k in keys]))
    it = sm.iterator(T1)
    got = []
    while (x := it.next()) is not None:
        got.append(x[0])
    assert got == keys
    for target in [b"k00000", b"k00001", b"k01500", b"k02998", b"k02999", b"z", b""]:
        it.seek_ge(target)
        x = it.next()
        i = bisect.bisect_left(keys, target)
        assert (x[0] if x else None) == (keys[i] if i < len(keys) else None)
    # forward seeks within a batch, then backward
    it = sm.iterator(T1, b"k00100")
    assert it.next()[0] == b"k00102"
    it.seek_ge(b"k00150")
    assert it.next()[0] == b"k00150"
    it.seek_ge(b"k00003")
    assert it.next()[0] == b"k00003"


def test_merged_precedence():
    a = ListIterator([(b"1", V("a1")), (b"3", None), (b"5", V("a5"))])
    b = ListIterator([(b"1", V("b1")), (b"2", None), (b"3", V("b3")), (b"4", V("b4"))])
    c = ListIterator([(b"2", V("c2")), (b"3", V("c3")), (b"6", V("c6"))])
    got = list(MergedIterator([a, b, c]))
    assert got == [(b"1", V("a1")), (b"4", V("b4")), (b"5", V("a5")), (b"6", V("c6"))]
    a.seek_ge(b""), b.seek_ge(b""), c.seek_ge(b"")
    got = list(MergedIterator([a, b, c], keep_tombstones=True))
    assert got == [(b"1", V("a1")), (b"2", None), (b"3", None), (b"4", V("b4")), (b"5", V("a5")), (b"6", V("c6"))]
    m = MergedIterator([a, b, c])
    m.seek_ge(b"4")
    assert m.next() == (b"4", V("b4"))
    m.seek_ge(b"2")  # backwards
    assert m.next() == (b"4", V("b4"))  # 2 and 3 are tombstoned


class FakeCommitted:
    """Just ``iterator``; counts how often it is (re)opened."""

    def __init__(self, items):
        self.items = items
        self.keys = [k for k, _ in items]
        self.opens = 0

    def iterator(self, mr, start=b"", end=None):
        self.opens += 1
        return iter(self.items[bisect.bisect_left(self.keys, start):])


def test_committed_iterator_seeks():
    fc = FakeCommitted([(b"%05d" % i, V(str(i))) for i in range(1000)])
    it = CommittedIterator(fc, "mr")
    assert it.next()[0] == b"00000"
    it.seek_ge(b"00005")  # short: read ahead
    assert it.next()[0] == b"00005" and fc.opens == 1
    it.seek_ge(b"00900")  # long: reopen
    assert it.next()[0] == b"00900" and fc.opens == 2
    it.seek_ge(b"00100")  # backwards: reopen
    assert it.next()[0] == b"00100"
    it.seek_ge(b"99999")
    assert it.next() is None


def test_a_damaged_range_fails_a_listing_after_the_items_before_it():
    """The committed records end in an error midway (a damaged second range): a batch hands
    out every item read before it, and the error comes at the next call -- ``fs ls`` printed
    none of the batch that ran into it (entries of the healthy first range were missing
    from its output before its exit 5)."""
    from graveler.errors import CorruptedData

    class Damaged(FakeCommitted):
        def iterator(self, mr, start=b"", end=None):
            def gen():
                yield from super(Damaged, self).iterator(mr, start, end)
                raise CorruptedData("range checksum mismatch", "r2.sst", 0)
            return gen()

    items = [(b"a/%02d" % i, V(str(i))) for i in range(5)]
    it = CommittedIterator(Damaged(items), "mr")
    assert it.next_batch(100) == items
    with pytest.raises(CorruptedData):
        it.next_batch(100)
    listed = []
    with pytest.raises(CorruptedData):
        for x in list_items(CommittedIterator(Damaged(items), "mr"), b"a/", b"/"):
            listed.append(x.path)
    assert listed == [k for k, _ in items]
    it = CommittedIterator(Damaged(items), "mr")  # one at a time: the same
    assert [it.next() for _ in range(5)] == items
    with pytest.raises(CorruptedData):
        it.next()


class CountingIterator(ListIterator):
    def __init__(self, items):
        super().__init__(items)
        self.seeks = 0
        self.nexts = 0

    def seek_ge(self, key):
        self.seeks += 1
        super().seek_ge(key)

    def next(self):
        self.nexts += 1
        return super().next()


class BatchIterator(CountingIterator):
    """A list iterator that also gives batches (``next_batch``, as a commit's iterator does)."""

    def __init__(self, items):
        super().__init__(items)
        self.batches = 0

    def next_batch(self, n):
        self.batches += 1
        out = self._items[self._i:self._i + n]
        self._i += len(out)
        return out


def _listing(items, prefix=b"", delim=b"/", after=b"", batches=False):
    it = (BatchIterator if batches else ListIterator)(items)
    return [(x.path, x.is_prefix) for x in list_items(it, prefix, delim, after)]


@pytest.mark.parametrize("batches", [False, True], ids=["one_by_one", "batches"])
def test_list_items_delimiter(batches):
    keys = [b"a.txt", b"a/1", b"a/2", b"a/b/c", b"a0", b"b/x", b"c"]
    items = [(k, V(k.decode())) for k in keys]
    listing = functools.partial(_listing, batches=batches)
    assert listing(items) == [(b"a.txt", False), (b"a/", True), (b"a0", False), (b"b/", True), (b"c", False)]
    assert listing(items, b"a/") == [(b"a/1", False), (b"a/2", False), (b"a/b/", True)]
    assert listing(items, b"a") == [(b"a.txt", False), (b"a/", True), (b"a0", False)]
    assert [p for p, _ in listing(items, delim=b"")] == keys
    assert listing(items, after=b"a/") == [(b"a0", False), (b"b/", True), (b"c", False)]
    assert listing(items, after=b"a/1") == [(b"a0", False), (b"b/", True), (b"c", False)]
    assert listing(items, after=b"a.txt") == [(b"a/", True), (b"a0", False), (b"b/", True), (b"c", False)]
    assert listing(items, b"a/", after=b"a/1") == [(b"a/2", False), (b"a/b/", True)]
    assert listing(items, b"a/", after=b"0") == listing(items, b"a/")
    assert listing(items, b"zz") == []
    assert listing(items, delim=b"", after=b"a/2") == [(k, False) for k in keys[3:]]


def test_list_skips_directory_with_one_seek():
    items = [(b"big/%06d" % i, V(str(i))) for i in range(10_000)] + [(b"small", V("s"))]
    it = CountingIterator(items)
    out = [x.path for x in list_items(it, b"", b"/")]
    assert out == [b"big/", b"small"]
    assert it.seeks == 2  # the initial positioning + one seek past "big/"
    assert it.nexts <= 4


def test_a_batched_listing_skips_a_directory_within_its_batch_or_with_one_seek():
    items = ([(b"a/%02d" % i, V(str(i))) for i in range(5)] + [(b"b", V("b"))]
             + [(b"big/%06d" % i, V(str(i))) for i in range(10_000)] + [(b"small", V("s"))])
    it = BatchIterator(items)
    out = [x.path for x in list_items(it, b"", b"/")]
    assert out == [b"a/", b"b", b"big/", b"small"]
    assert it.nexts == 0 and it.batches <= 4  # a/ skipped inside the first batch
    assert it.seeks == 2  # the initial positioning + one seek past "big/" (longer than the batch)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text("ab/", min_size=1, max_size=5), unique=True),
    st.text("ab/", max_size=3),
    st.sampled_from(["", "/"]),
    st.text("ab/", max_size=4),
)
@pytest.mark.parametrize("batches", [False, True], ids=["one_by_one", "batches"])
def test_list_items_matches_naive(batches, keys, prefix, delim, after):
    keys = sorted(k.encode() for k in keys)
    prefix, delim, after = prefix.encode(), delim.encode(), after.encode()
    items = [(k, V(k.decode())) for k in keys]
    expect = []
    for k in keys:
        if not k.startswith(prefix):
            continue
        name, is_prefix = k, False
        if delim:
            i = k.find(delim, len(prefix))
            if i >= 0:
                name, is_prefix = k[: i + 1], True
        if name <= after:
            continue
        if not expect or expect[-1][0] != name:
            expect.append((name, is_prefix))
    assert _listing(items, prefix, delim, after, batches) == expect
