"""Seekable iterators and the merged, delimited listing of a ref.

One iterator protocol (lakeFS's, reduced): ``next()`` returns ``(key, staged)``
or None at the end, ``seek_ge(key)`` moves to the first key >= ``key``.
``staged`` is a Value, or None for a staging tombstone. An iterator may also offer
``next_batch(n)``: up to ``n`` items at once (what ``n`` calls of ``next()`` return), which
:func:`list_items` takes where it is offered.

* :class:`CommittedIterator` adapts ``CommittedManager.iterator`` (a plain
  generator) to the protocol; a short forward seek reads ahead, a long one
  re-opens the iterator at the key.
* :class:`MergedIterator` merges sources in precedence order (current staging
  token, sealed tokens newest first, committed): for each key the first source
  that has it wins, as in lakeFS's ``combined_iterator.go``.
* :func:`list_items` turns a merged iterator into a listing with a prefix, a
  delimiter and a ``start_after``, skipping each common prefix with one seek.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import islice
from operator import itemgetter
from typing import Iterator, NamedTuple, Protocol

from graveler.errors import InvalidArgument
from graveler.kv.base import prefix_successor
from graveler.model import Entry, Value

Item = tuple[bytes, "Value | None"]

BATCH_FIRST = 16  # items a listing takes first from an iterator that gives batches (next_batch) ...
BATCH_MAX = 512  # ... doubling up to this
_key = itemgetter(0)
_item = tuple.__new__  # ListItem(path, value) without NamedTuple's Python-level __new__


class SeekIterator(Protocol):
    def next(self) -> Item | None: ...
    def seek_ge(self, key: bytes) -> None: ...


class CommittedIterator:
    """``CommittedManager.iterator`` as a seekable iterator."""

    __slots__ = ("_cm", "_mr", "_gen", "_head", "_lower", "_end", "_failed")

    READ_AHEAD = 16

    def __init__(self, committed, metarange_id: str, start: bytes = b"", end: bytes | None = None):
        """``end``: no key >= ``end`` is wanted (ranges that start there are never opened;
        keys there may still be returned from a range entered before)."""
        self._cm = committed
        self._mr = metarange_id
        self._end = end
        self._open(start)

    def _open(self, start: bytes) -> None:
        self._gen = self._cm.iterator(self._mr, start, self._end)
        self._head: Item | None = None
        self._lower = start  # every key >= _lower not yet returned is still ahead
        self._failed: Exception | None = None  # met by a batch after some items: raised at the next call

    def _fill(self) -> Item | None:
        if self._failed is not None:
            e, self._failed = self._failed, None
            raise e
        if self._head is None and self._gen is not None:
            self._head = next(self._gen, None)
            if self._head is None:
                self._gen = None
        return self._head

    def next(self) -> Item | None:
        item = self._fill()
        if item is not None:
            self._head = None
            self._lower = item[0] + b"\x00"
        return item

    def next_batch(self, n: int) -> list[Item]:
        """Up to ``n`` items, as many :meth:`next` calls would return (fewer: the end)."""
        out: list[Item] = []
        if self._head is not None:
            out.append(self._head)
            self._head = None
            n -= 1
        if self._failed is not None and not out:
            self._fill()  # (raises it)
        gen = self._gen
        if gen is not None and n > 0:
            before = len(out)
            try:
                out.extend(islice(gen, n))  # (what a damaged range's error comes after is kept)
            except Exception as e:
                if not out:
                    raise
                self._gen, self._failed = None, e  # the items before it first, then the error
            else:
                if len(out) - before < n:
                    self._gen = None
        if out:
            self._lower = out[-1][0] + b"\x00"
        return out

    def seek_ge(self, key: bytes) -> None:
        if key < self._lower:
            self._open(key)
            return
        for _ in range(self.READ_AHEAD):
            head = self._fill()
            if head is None or head[0] >= key:
                self._lower = key
                return
            self._head = None
            self._lower = head[0] + b"\x00"
        self._open(key)


class ListIterator:
    """A fixed, sorted list as a seekable iterator (tests, small sources)."""

    def __init__(self, items: list[Item]):
        import bisect

        self._bisect = bisect
        self._items = items
        self._keys = [k for k, _ in items]
        self._i = 0

    def next(self) -> Item | None:
        if self._i >= len(self._items):
            return None
        self._i += 1
        return self._items[self._i - 1]

    def seek_ge(self, key: bytes) -> None:
        self._i = self._bisect.bisect_left(self._keys, key)


_UNSET = object()


class MergedIterator:
    """Sources in precedence order; per key the first source holding it wins.

    With ``keep_tombstones=False`` a winning tombstone hides the key (reads of a
    branch); with True it is returned as ``(key, None)`` (a staging change stream).
    """

    __slots__ = ("_sources", "_heads", "_keep", "_lower")

    def __init__(self, sources: list[SeekIterator], keep_tombstones: bool = False):
        self._sources = sources
        # Heads are read lazily, so that a seek right after construction costs no read.
        self._heads: list = [_UNSET] * len(sources)
        self._keep = keep_tombstones
        self._lower = b""  # no key below this is still ahead

    def next(self) -> Item | None:
        heads = self._heads
        sources = self._sources
        if len(heads) == 2:
            return self._next2(heads, sources[0], sources[1])
        while True:
            best_key = None
            for i, h in enumerate(heads):
                if h is _UNSET:
                    h = heads[i] = sources[i].next()
                if h is not None and (best_key is None or h[0] < best_key):
                    best_key = h[0]
            if best_key is None:
                return None
            winner = None
            for i, h in enumerate(heads):
                if h is not None and h[0] == best_key:
                    if winner is None:
                        winner = h
                    heads[i] = _UNSET
            self._lower = best_key + b"\x00"
            if winner[1] is None and not self._keep:
                continue
            return winner

    def _next2(self, heads: list, first, second) -> Item | None:
        """:meth:`next` of two sources (a branch: its staging over its commit), without the loops."""
        while True:
            a = heads[0]
            if a is _UNSET:
                a = heads[0] = first.next()
            b = heads[1]
            if b is _UNSET:
                b = heads[1] = second.next()
            if a is None:
                if b is None:
                    return None
                winner = b
                heads[1] = _UNSET
            elif b is None or a[0] < b[0]:
                winner = a
                heads[0] = _UNSET
            elif a[0] == b[0]:  # the first source's wins; the second's is passed over
                winner = a
                heads[0] = heads[1] = _UNSET
            else:
                winner = b
                heads[1] = _UNSET
            self._lower = winner[0] + b"\x00"
            if winner[1] is None and not self._keep:
                continue
            return winner

    def next_batch(self, n: int) -> list[Item]:
        """Up to ``n`` items, as many :meth:`next` calls would return (fewer: the end): a
        branch's staging over its commit, once the staging has nothing more ahead, straight
        from the commit's records (no merge step per item)."""
        heads = self._heads
        if len(heads) != 2 or heads[0] is not None or not isinstance(self._sources[1], CommittedIterator):
            item = self.next()
            return [] if item is None else [item]
        b = heads[1]  # the staging source is at its end: the rest is the committed source's
        if b is None:
            return []
        if b is _UNSET:
            out = self._sources[1].next_batch(n)
        else:
            out = [b] + self._sources[1].next_batch(n - 1)
        if out:
            heads[1] = _UNSET
            self._lower = out[-1][0] + b"\x00"
        else:
            heads[1] = None
        return out  # (as they are: a commit has no tombstones)

    def seek_ge(self, key: bytes) -> None:
        forward = key >= self._lower
        for i, s in enumerate(self._sources):
            h = self._heads[i]
            if forward and h is not _UNSET and (h is None or h[0] >= key):
                continue  # this source is already at the first key >= key (or exhausted)
            s.seek_ge(key)
            self._heads[i] = _UNSET
        self._lower = key

    def __iter__(self) -> Iterator[Item]:
        while True:
            item = self.next()
            if item is None:
                return
            yield item


class ListItem(NamedTuple):
    """One listing result: an object (``value`` set) or a common prefix ("directory"). (A
    tuple: a listing makes one per name, and a tuple is made in a fifth of a dataclass's time.)"""

    path: bytes
    value: Value | None = None  # None for a common prefix

    @property
    def is_prefix(self) -> bool:
        return self.value is None

    @property
    def entry(self) -> Entry:
        """The decoded catalog entry of an object."""
        if self.value is None:
            raise InvalidArgument(f"{self.path!r} is a common prefix, not an object")
        return Entry.from_value(self.value)


def list_items(
    it: SeekIterator, prefix: bytes = b"", delimiter: bytes = b"/", start_after: bytes = b""
) -> Iterator[ListItem]:
    """Objects and common prefixes under ``prefix`` with names > ``start_after``, in order.

    With a delimiter, every key whose remainder after ``prefix`` contains it is
    folded into its common prefix (``prefix + part + delimiter``), reported once;
    the rest of that prefix is skipped with one seek to its successor. Names are
    strictly increasing, so the last name returned is a valid ``start_after``.
    """
    start = prefix
    if start_after and start_after >= prefix:
        start = start_after + b"\x00"
        if delimiter and start_after.startswith(prefix):
            rest = start_after[len(prefix):]
            i = rest.find(delimiter)
            if i >= 0:
                cp = prefix + rest[: i + len(delimiter)]
                succ = prefix_successor(cp)
                if succ is None:
                    return
                start = succ
    it.seek_ge(start)
    plen, dlen = len(prefix), len(delimiter)
    # items are taken a batch at a time where the iterator can (next_batch: a growing batch,
    # what a directory of a few names needs first), one at a time where it cannot
    next_batch = getattr(it, "next_batch", None)
    n = BATCH_FIRST
    while True:
        if next_batch is not None:
            batch = next_batch(n)
            n = min(n * 2, BATCH_MAX)
        else:
            item = it.next()
            batch = [] if item is None else [item]
        if not batch:
            return
        i, end = 0, len(batch)
        while i < end:
            key, value = batch[i]
            i += 1
            if not key.startswith(prefix):
                if key < prefix:
                    continue
                return
            if delimiter:
                j = key.find(delimiter, plen)
                if j >= 0:
                    cp = key[: j + dlen]
                    yield _item(ListItem, (cp, None))
                    succ = prefix_successor(cp)
                    if succ is None:
                        return
                    i = bisect_left(batch, succ, i, end, key=_key)  # the rest of cp in this batch
                    if i == end:  # (maybe more of it after the batch) one seek past it
                        it.seek_ge(succ)
                    continue
            yield _item(ListItem, (key, value))
