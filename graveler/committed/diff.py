"""Diff and three-way merge of metaranges, at range granularity where possible.

A diff walks the two range lists side by side: two ranges with the same ID are
skipped without being opened, and a range is opened only when its key span can
hold the next difference.  A merge applies the base->source diff onto dest,
deciding each key with the three-way table, so dest's untouched ranges are
reused by ID and the cost follows the changes, not the tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from graveler.errors import MergeConflict
from graveler.model import DiffRecord, DiffType, MergeStrategy, RangeInfo, Value, decode_value

if TYPE_CHECKING:
    from graveler.committed.manager import ApplyStats, CommittedManager

MAX_CONFLICTS_REPORTED = 1000


class _RangeCursor:
    """A position in a metarange, at one of three levels.

    ``RANGE``: at the start of a range, not opened.  ``BLOCK``: at the start of a
    data block of an opened range, not decoded.  ``RECORD``: on a record.
    """

    RANGE, BLOCK, RECORD = 0, 1, 2
    __slots__ = ("mgr", "infos", "ri", "state", "table", "handles", "bi", "keys", "vals", "ei", "key", "raw",
                 "blocks_skipped")

    def __init__(self, mgr: "CommittedManager", infos: list[RangeInfo]):
        self.mgr = mgr
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
        self.table = self.mgr._open(self.range.id)
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


def diff(mgr: "CommittedManager", left_id: str, right_id: str) -> Iterator[DiffRecord]:
    """Records that differ between two metaranges, in key order (identity decides 'changed').

    Equal range IDs are skipped unopened; inside two differing ranges, data
    blocks with identical stored bytes are skipped undecoded (apply carries
    untouched blocks over byte for byte wherever Pebble's rules allow).
    """
    L = _RangeCursor(mgr, mgr._metarange(left_id).infos)
    R = _RangeCursor(mgr, mgr._metarange(right_id).infos)
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


def _same(a: Value | None, b: Value | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.identity == b.identity


def merge(mgr: "CommittedManager", base_id: str, source_id: str, dest_id: str,
          strategy: MergeStrategy, metadata: dict[str, str] | None = None) -> tuple[str, "ApplyStats"]:
    """Three-way merge of source into dest over their common base.

    | base->source | dest vs base      | result                       |
    |--------------|-------------------|------------------------------|
    | unchanged    | anything          | dest                         |
    | changed/added/deleted | unchanged | source                      |
    | changed      | changed the same  | either (same identity)       |
    | changed      | changed otherwise | conflict (or the strategy)   |
    Deletions count as changes; a key added on both sides with the same identity is no conflict.
    """
    conflicts: list[bytes] = []

    def changes() -> Iterator[tuple[bytes, Value | None]]:
        for d in diff(mgr, base_id, source_id):
            base_v, src_v = d.left, d.right
            dest_v = mgr.get(dest_id, d.key)
            if _same(dest_v, base_v):
                yield d.key, src_v  # only source changed it
            elif _same(dest_v, src_v):
                continue  # both made the same change
            elif strategy is MergeStrategy.SOURCE_WINS:
                yield d.key, src_v
            elif strategy is MergeStrategy.DEST_WINS:
                continue
            else:
                if len(conflicts) < MAX_CONFLICTS_REPORTED:
                    conflicts.append(d.key)

    change_list = list(changes())
    if conflicts:
        shown = ", ".join(k.decode("utf-8", "replace") for k in conflicts[:10])
        more = f" and {len(conflicts) - 10} more" if len(conflicts) > 10 else ""
        raise MergeConflict(f"merge conflict on {len(conflicts)} key(s): {shown}{more}", conflicts)
    return mgr.apply(dest_id, change_list, metadata)
