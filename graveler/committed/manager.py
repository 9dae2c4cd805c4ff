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
from typing import Iterable, Iterator

from graveler.cache import CheckMemo
from graveler.committed import kernel
from graveler.committed.apply import ApplyStats, Change
from graveler.committed.merge import merge_changes
from graveler.committed.reader import (  # noqa: F401 (re-exported)
    EMPTY_METARANGE_ID,
    StoreSource,
    TableReader,
    TableSource,
    verify_table,
)
from graveler.committed.writer import MetaRangeWriter
from graveler.config import CacheConfig, RangeParams
from graveler.errors import InvalidArgument
from graveler.model import DiffRecord, MergeStrategy, Value, encode_value
from graveler.sstable.reader import BlockCache

log = logging.getLogger(__name__)

_FLUSH_RECORDS = 2048


def _sorted_changes(changes: Iterable[Change]) -> Iterator[Change]:
    last = None
    for k, v in changes:
        if last is not None and k <= last:
            raise InvalidArgument(f"changes must be sorted and unique: {k!r} after {last!r}")
        last = k
        yield k, v


class CommittedManager:
    """Thread-safe reads and writes of the committed trees of one storage namespace."""

    writer_class = kernel.MetaRangeWriter  # the committed layer's writer (a test may set the other one)

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
        return self.writer_class(self._put, self.params, metadata, on_checkpoints=self.reader.memo.put_facts,
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
            pending = w.apply_range(t, info, pending, ch, out, stats, self.reader.memo.get_facts(info.id))
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
        return kernel.diff(self.reader, left_id, right_id)

    def merge(self, base_id: str, source_id: str, dest_id: str,
              strategy: MergeStrategy = MergeStrategy.NONE,
              metadata: dict[str, str] | None = None, conflicts_to_base: bool = False) -> tuple[str, ApplyStats]:
        """Three-way merge of ``source_id`` into ``dest_id`` over ``base_id``; the result is
        written as it is decided (MergeConflict when keys conflict and no strategy decides;
        ``conflicts_to_base``: see :func:`graveler.committed.merge.merge_changes`)."""
        changes = merge_changes(self.reader, base_id, source_id, dest_id, strategy, conflicts_to_base)
        return self.apply(dest_id, changes, metadata)


__all__ = ["ApplyStats", "CommittedManager", "EMPTY_METARANGE_ID", "StoreSource", "TableSource", "verify_table"]
