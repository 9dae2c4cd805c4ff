"""Diff of two metaranges, at range and block granularity where possible.

A diff walks the two range lists side by side: two ranges with the same ID are
skipped without being opened, a range is opened only when its key span can
hold the next difference, and inside two differing ranges data blocks with
identical stored bytes are skipped undecoded. Three-way merge
(:mod:`graveler.committed.merge`) is built on it.

This is the reference walk; ``graveler.committed._cdiff`` compiles it and
:func:`graveler.committed.kernel.diff` selects.
"""

from __future__ import annotations

from typing import Iterator

from graveler.committed.reader import TableReader
from graveler.model import DiffRecord, DiffType, RangeInfo, decode_value


class _RangeCursor:
    """A position in a metarange, at one of three levels.

    ``RANGE``: at the start of a range, not opened.  ``BLOCK``: at the start of a
    data block of an opened range, not decoded.  ``RECORD``: on a record.
    """

    RANGE, BLOCK, RECORD = 0, 1, 2
    __slots__ = ("reader", "infos", "ri", "state", "table", "handles", "bi", "keys", "vals", "ei", "key", "raw",
                 "blocks_skipped")

    def __init__(self, reader: TableReader, infos: list[RangeInfo]):
        self.reader = reader
        self.infos = infos
        self.ri = 0
        self.state = self.RANGE
        self.key: bytes | None = None
        self.raw: bytes | None = None
        self.blocks_skipped = 0

    @property
    def done(self) -> bool:
        return self.ri >= len(self.infos)

    @property
    def range(self) -> RangeInfo:
        return self.infos[self.ri]

    def lower_bound(self) -> bytes:
        """The smallest key this cursor can produce next (no I/O); needs state RANGE or RECORD."""
        return self.range.min_key if self.state == self.RANGE else self.key

    def skip_range(self) -> None:
        self.ri += 1
        self.state = self.RANGE

    def enter(self) -> None:
        """Open the current range: move to the start of its first block."""
        self.table = self.reader.open(self.range.id)
        self.handles = self.table.data_block_handles()
        self.bi = -1
        self._next_block()

    def _next_block(self) -> None:
        self.bi += 1
        if self.bi >= len(self.handles):
            self.skip_range()
        else:
            self.state = self.BLOCK

    def raw_block(self) -> bytes:
        return self.table.raw_block(self.handles[self.bi])

    def skip_block(self) -> None:
        self.blocks_skipped += 1
        self._next_block()

    def load(self) -> None:
        """Decode the current block and move onto its first record."""
        blk = self.table.block(self.handles[self.bi])
        self.keys, self.vals, self.ei = blk.keys, blk.values, 0
        if not self.keys:
            self._next_block()
            return
        self.state = self.RECORD
        self.key, self.raw = self.keys[0], self.vals[0]

    def advance(self) -> None:
        self.ei += 1
        if self.ei >= len(self.keys):
            self._next_block()
        else:
            self.key, self.raw = self.keys[self.ei], self.vals[self.ei]

    def to_record(self) -> None:
        """Move on until the cursor is on a record or done (opening / decoding as needed)."""
        while not self.done and self.state != self.RECORD:
            if self.state == self.RANGE:
                self.enter()
            else:
                self.load()


def py_diff(reader: TableReader, left: list[RangeInfo], right: list[RangeInfo]) -> Iterator[DiffRecord]:
    """The reference walk of ``graveler.committed.kernel.diff`` over two range lists."""
    L = _RangeCursor(reader, left)
    R = _RangeCursor(reader, right)
    RANGE, BLOCK = _RangeCursor.RANGE, _RangeCursor.BLOCK
    while True:
        if L.done or R.done:
            if L.done and R.done:
                return
            c, kind = (R, DiffType.ADDED) if L.done else (L, DiffType.REMOVED)
            c.to_record()
            if not c.done:
                v = decode_value(c.raw)
                yield DiffRecord(kind, c.key, None, v) if kind is DiffType.ADDED else DiffRecord(kind, c.key, v, None)
                c.advance()
            continue
        ls, rs = L.state, R.state
        if ls == RANGE and rs == RANGE and L.range.id == R.range.id:
            L.skip_range()
            R.skip_range()
            continue
        if ls == BLOCK and rs == BLOCK:
            if L.raw_block() == R.raw_block():
                L.skip_block()
                R.skip_block()
            else:
                L.load()
                R.load()
            continue
        if ls == BLOCK:
            L.load()
            continue
        if rs == BLOCK:
            R.load()
            continue
        lk, rk = L.lower_bound(), R.lower_bound()
        # Open a range only when it may hold the smallest next key.
        if ls == RANGE and lk <= rk:
            L.enter()
            continue
        if rs == RANGE and rk <= lk:
            R.enter()
            continue
        if ls == RANGE:  # rk < range min of L: R's record is not in left
            yield DiffRecord(DiffType.ADDED, rk, None, decode_value(R.raw))
            R.advance()
            continue
        if rs == RANGE:
            yield DiffRecord(DiffType.REMOVED, lk, decode_value(L.raw), None)
            L.advance()
            continue
        if lk < rk:
            yield DiffRecord(DiffType.REMOVED, lk, decode_value(L.raw), None)
            L.advance()
        elif rk < lk:
            yield DiffRecord(DiffType.ADDED, rk, None, decode_value(R.raw))
            R.advance()
        else:
            if L.raw != R.raw:
                lv, rv = decode_value(L.raw), decode_value(R.raw)
                if lv.identity != rv.identity:
                    yield DiffRecord(DiffType.CHANGED, lk, lv, rv)
            L.advance()
            R.advance()


__all__ = ["py_diff"]
