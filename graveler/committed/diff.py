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
    """A position in a metarange: either at the start of a range (not opened) or on a record."""

    __slots__ = ("mgr", "infos", "ri", "records", "key", "raw", "at_boundary")

    def __init__(self, mgr: "CommittedManager", infos: list[RangeInfo]):
        self.mgr = mgr
        self.infos = infos
        self.ri = 0
        self.records: Iterator | None = None
        self.key: bytes | None = None
        self.raw: bytes | None = None
        self.at_boundary = True

    @property
    def done(self) -> bool:
        return self.ri >= len(self.infos)

    @property
    def range(self) -> RangeInfo:
        return self.infos[self.ri]

    def lower_bound(self) -> bytes:
        """The smallest key this cursor can produce next (no I/O)."""
        return self.range.min_key if self.at_boundary else self.key

    def skip_range(self) -> None:
        self.ri += 1
        self.at_boundary = True
        self.records = None

    def enter(self) -> None:
        """Open the current range and move onto its first record."""
        self.records = self.mgr.iter_range_raw(self.range)
        self.at_boundary = False
        self._step()

    def _step(self) -> None:
        nxt = next(self.records, None)
        if nxt is None:
            self.skip_range()
        else:
            self.key, self.raw = nxt

    def advance(self) -> None:
        self._step()


def diff(mgr: "CommittedManager", left_id: str, right_id: str) -> Iterator[DiffRecord]:
    """Records that differ between two metaranges, in key order (identity decides 'changed')."""
    L = _RangeCursor(mgr, mgr._metarange(left_id).infos)
    R = _RangeCursor(mgr, mgr._metarange(right_id).infos)
    while True:
        if L.done and R.done:
            return
        if L.done:
            if R.at_boundary:
                R.enter()
                continue
            yield DiffRecord(DiffType.ADDED, R.key, None, decode_value(R.raw))
            R.advance()
            continue
        if R.done:
            if L.at_boundary:
                L.enter()
                continue
            yield DiffRecord(DiffType.REMOVED, L.key, decode_value(L.raw), None)
            L.advance()
            continue
        if L.at_boundary and R.at_boundary and L.range.id == R.range.id:
            L.skip_range()
            R.skip_range()
            continue
        lk, rk = L.lower_bound(), R.lower_bound()
        # Open a range only when it may hold the smallest next key.
        if L.at_boundary and lk <= rk:
            L.enter()
            continue
        if R.at_boundary and rk <= lk:
            R.enter()
            continue
        if L.at_boundary:  # rk < range min of L: R's record is not in left
            yield DiffRecord(DiffType.ADDED, R.key, None, decode_value(R.raw))
            R.advance()
            continue
        if R.at_boundary:
            yield DiffRecord(DiffType.REMOVED, L.key, decode_value(L.raw), None)
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


class _Seeker:
    """Monotone point lookups in one metarange (used for dest during a merge)."""

    def __init__(self, mgr: "CommittedManager", mr_id: str):
        self.mgr = mgr
        self.mr_id = mr_id

    def get(self, key: bytes) -> Value | None:
        return self.mgr.get(self.mr_id, key)


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
    dest = _Seeker(mgr, dest_id)
    conflicts: list[bytes] = []

    def changes() -> Iterator[tuple[bytes, Value | None]]:
        for d in diff(mgr, base_id, source_id):
            base_v, src_v = d.left, d.right
            dest_v = dest.get(d.key)
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
