"""The committed manager (lakeFS's CommittedManager): one storage namespace's trees.

It owns the write side: new metaranges from sorted records, ``apply`` (sorted
changes onto a metarange, reusing untouched ranges by ID and untouched blocks
byte for byte), and three-way ``merge`` (the change stream of
:mod:`graveler.committed.merge` fed through ``apply``). Reads (get, iterators,
the table and metarange LRUs) are :class:`graveler.committed.reader.TableReader`'s;
the manager exposes them unchanged. Files are content addressed under ``_lakefs/``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator

from graveler.cache import CheckMemo
from graveler.committed import checkpoints
from graveler.committed.diff import diff
from graveler.committed.fnv import fnv1a64_batch
from graveler.committed.merge import merge_changes
from graveler.committed.reader import (  # noqa: F401 (re-exported)
    EMPTY_METARANGE_ID,
    StoreSource,
    TableReader,
    TableSource,
    verify_table,
)
from graveler.committed.writer import MetaRangeWriter
from graveler import native
from graveler.config import CacheConfig, RangeParams
from graveler.errors import InvalidArgument
from graveler.model import DiffRecord, MergeStrategy, Value, decode_value, encode_value
from graveler.sstable.reader import BlockCache, SSTable

log = logging.getLogger(__name__)

Change = tuple[bytes, Value | None]  # None deletes

_FLUSH_RECORDS = 2048


@dataclass(slots=True)
class ApplyStats:
    added: int = 0
    removed: int = 0
    changed: int = 0
    ranges_written: int = 0
    ranges_reused: int = 0
    blocks_carried: int = 0  # unchanged blocks of touched ranges copied verbatim (compiled apply)
    blocks_resumed: int = 0  # unchanged blocks before a change skipped through a checkpoint (compiled apply)

    @property
    def changes(self) -> int:
        return self.added + self.removed + self.changed


def _sorted_changes(changes: Iterable[Change]) -> Iterator[Change]:
    last = None
    for k, v in changes:
        if last is not None and k <= last:
            raise InvalidArgument(f"changes must be sorted and unique: {k!r} after {last!r}")
        last = k
        yield k, v


class CommittedManager:
    """Thread-safe reads and writes of the committed trees of one storage namespace."""

    def __init__(self, source: TableSource, params: RangeParams = RangeParams(),
                 block_cache: BlockCache | None = None, cache: CacheConfig = CacheConfig(),
                 memo: CheckMemo | None = None):
        self.source = source
        self.params = params
        self.reader = TableReader(source, block_cache, cache, memo)
        self.block_cache = self.reader.block_cache
        self._lock = threading.Lock()
        self.tables_written = 0  # table files written (benchmarks, tests)
        # The read path, without an extra call frame.
        self.get = self.reader.get
        self.iterator = self.reader.iterator
        self.list_ranges = self.reader.list_ranges
        self.exists = self.reader.exists
        self.iter_range_raw = self.reader.iter_range_raw

    @property
    def tables_read(self) -> int:
        return self.reader.tables_read

    def _put(self, key: str, data: bytes) -> None:
        self.source.put(key, data)
        self.reader.remember_written(key)
        with self._lock:
            self.tables_written += 1

    # -- writing ---------------------------------------------------------------------------
    def new_writer(self, metadata: dict[str, str] | None = None) -> MetaRangeWriter:
        return MetaRangeWriter(self._put, self.params, metadata, on_checkpoints=self.reader.memo.put_facts,
                               background=True)

    def write_metarange(self, records: Iterable[tuple[bytes, Value]], metadata: dict[str, str] | None = None) -> str:
        w = self.new_writer(metadata)
        try:
            w.write_values(records)
            return w.close()
        except BaseException:
            w.abort()
            raise

    def empty_metarange(self) -> str:
        return EMPTY_METARANGE_ID

    def apply(self, base_id: str, changes: Iterable[Change],
              metadata: dict[str, str] | None = None) -> tuple[str, ApplyStats]:
        """Apply sorted changes (``None`` deletes) to a metarange; untouched ranges are copied by ID.

        A change whose identity equals the committed record's is no change.
        ``changes`` is consumed as the output is written (it may be a stream).
        """
        infos = self.reader.metarange(base_id).infos
        w = self.new_writer(metadata)
        stats = ApplyStats()
        try:
            self._apply_into(w, infos, changes, stats)
            new_id = w.close()
        except BaseException:
            w.abort()  # (a merge conflict found mid-way, a store failure: ranges put so far stay unreferenced)
            raise
        stats.ranges_written = w.ranges_written
        return new_id, stats

    def _apply_into(self, w: MetaRangeWriter, infos, changes: Iterable[Change], stats: ApplyStats) -> None:
        out: list[tuple[bytes, bytes]] = []
        ch = _sorted_changes(changes)
        pending = next(ch, None)
        for info in infos:
            if pending is None or pending[0] > info.max_key:
                if out:
                    w.write_batch(out)
                    out = []
                w.copy_range(info)
                stats.ranges_reused += 1
                continue
            t = self.reader.open(info.id)
            if out:
                w.write_batch(out)
                out = []
            if _RangeApply is not None and t.compiled and w._compiled:
                cps = checkpoints.unpack(self.reader.memo.get_facts(info.id), self.params, t.size)
                pending = _apply_range_compiled(t, info, pending, ch, w, stats, self.params, cps)
            else:
                pending = _apply_range(t, pending, ch, w, out, stats)
            # Changes after the range's last record but within its span (up to max_key) were added;
            # those equal to max_key were matched; nothing else belongs to this range.
        while pending is not None:
            if pending[1] is not None:
                out.append((pending[0], encode_value(pending[1])))
                stats.added += 1
                if len(out) >= _FLUSH_RECORDS:
                    w.write_batch(out)
                    out.clear()
            pending = next(ch, None)
        w.write_batch(out)

    # -- diff and merge ----------------------------------------------------------------------
    def diff(self, left_id: str, right_id: str) -> Iterator[DiffRecord]:
        """Records that differ between two metaranges, in key order (see :mod:`graveler.committed.diff`)."""
        return diff(self.reader, left_id, right_id)

    def merge(self, base_id: str, source_id: str, dest_id: str,
              strategy: MergeStrategy = MergeStrategy.NONE,
              metadata: dict[str, str] | None = None) -> tuple[str, ApplyStats]:
        """Three-way merge of ``source_id`` into ``dest_id`` over ``base_id``; the result is
        written as it is decided (MergeConflict when keys conflict and no strategy decides)."""
        changes = merge_changes(self.reader, base_id, source_id, dest_id, strategy)
        return self.apply(dest_id, changes, metadata)


def _merge_records(records: Iterable[tuple[bytes, bytes]], pending: Change | None, ch: Iterator[Change],
                   out: list[tuple[bytes, bytes]], stats: ApplyStats) -> Change | None:
    """Merge one touched block's ``records`` (key, encoded value) with the changes ``pending``
    and ``ch`` up to its last key into ``out``; an unchanged identity keeps the record's bytes.
    Returns the first change past the block's records."""
    for k, raw in records:
        while pending is not None and pending[0] < k:
            if pending[1] is not None:
                out.append((pending[0], encode_value(pending[1])))
                stats.added += 1
            pending = next(ch, None)
        if pending is not None and pending[0] == k:
            v = pending[1]
            if v is None:
                stats.removed += 1
            elif decode_value(raw).identity == v.identity:
                out.append((k, raw))
            else:
                out.append((k, encode_value(v)))
                stats.changed += 1
            pending = next(ch, None)
        else:
            out.append((k, raw))
    return pending


def _apply_range(t: SSTable, pending: Change | None, ch: Iterator[Change], w: MetaRangeWriter,
                 out: list[tuple[bytes, bytes]], stats: ApplyStats) -> Change | None:
    """Apply the changes that fall in one touched range ``t``: pending (the first of them)
    and those after it from ``ch``, up to the range's last record. Untouched blocks are
    carried over verbatim where the writer can; records go to ``out`` (flushed to ``w``
    before a block is carried over). Returns the first change past the range's records."""
    handles = t.data_block_handles()
    blocks = [t.block(h) for h in handles]
    copyable = t.crc32c_trailers  # our trailers: a block can be carried over verbatim
    # One FNV batch for the whole range: the break check needs every key's hash.
    all_hashes = fnv1a64_batch([k for b in blocks for k in b.keys])
    hpos = 0
    for bi, blk in enumerate(blocks):
        keys, vals = blk.keys, blk.values
        hashes = all_hashes[hpos : hpos + len(keys)]
        hpos += len(keys)
        if not keys:
            continue
        last_block = bi == len(blocks) - 1
        if copyable and not last_block and (pending is None or pending[0] > keys[-1]):
            # An untouched block inside a touched range: carried over without re-encoding when the
            # record after it is the next block's first (unchanged) one.
            nxt = blocks[bi + 1]
            if nxt.keys and (pending is None or pending[0] > nxt.keys[0]):
                next_key, next_len = nxt.keys[0], len(nxt.values[0])
            else:
                next_key, next_len = None, 0
            if out:
                w.write_batch(out)
                out.clear()
            w.write_block(t.raw_block(handles[bi]), keys, vals, blk.nbytes, hashes, next_key, next_len)
            continue
        pending = _merge_records(zip(keys, vals), pending, ch, out, stats)
    return pending


def _apply_range_compiled(t: SSTable, info, pending: Change | None, ch: Iterator[Change], w: MetaRangeWriter,
                          stats: ApplyStats, params: RangeParams, cps=None) -> Change | None:
    """``_apply_range`` compiled (graveler.committed._capply): the changes up to the range's max key are
    taken from the stream, encoded, and merged with the range's blocks in one call. Returns the first
    change past the range."""
    keys: list[bytes] = []
    raws: list[bytes | None] = []
    max_key = info.max_key
    while pending is not None and pending[0] <= max_key:
        keys.append(pending[0])
        raws.append(None if pending[1] is None else encode_value(pending[1]))
        pending = next(ch, None)
    ra = _RangeApply(w, t._core, keys, raws, params.min_range_size, params.max_range_size, params.raggedness,
                     cps).run()
    w.kernel_done(ra.last_key, ra.written, ra.blocks_carried)
    stats.blocks_carried += ra.blocks_carried
    stats.blocks_resumed += ra.resumed_at
    stats.added += ra.added
    stats.removed += ra.removed
    stats.changed += ra.changed
    return pending


_RangeApply = None if native.PURE_PYTHON else native.load("graveler.committed._capply").RangeApply

__all__ = ["ApplyStats", "CommittedManager", "EMPTY_METARANGE_ID", "StoreSource", "TableSource", "verify_table"]
