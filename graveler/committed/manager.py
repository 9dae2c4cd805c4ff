"""The committed manager: metaranges and ranges in a storage namespace.

Reads go metarange -> range -> block: a metarange is opened once and its
range list kept parsed; a range is opened only when a lookup or an iterator
enters it.  Writes produce content-addressed files under ``_lakefs/``.  The
empty metarange ID ``""`` is the empty tree, as in lakeFS's first commit.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol

from graveler.committed.fnv import fnv1a64_batch
from graveler.committed.writer import MetaRangeWriter, RangeParams, table_key
from graveler.errors import CorruptedData, InvalidArgument, NotFound
from graveler.model import DiffRecord, MergeStrategy, RangeInfo, Value, decode_value, encode_value
from graveler.sstable.reader import BlockCache, SSTable

log = logging.getLogger(__name__)

EMPTY_METARANGE_ID = ""


class TableSource(Protocol):
    """Where table files come from: an ImmutableCache, or a store wrapped by StoreSource."""

    def get(self, key: str) -> bytes: ...
    def put(self, key: str, data: bytes) -> None: ...


class StoreSource:
    """Tables straight from an object store, uncached (tests, one-shot tools)."""

    def __init__(self, store):
        self.store = store

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def put(self, key: str, data: bytes) -> None:
        self.store.put(key, data)


def verify_table(key: str, data: bytes) -> None:
    """Cache-fill check: the table parses and every block's checksum holds."""
    SSTable(data, key, block_cache=BlockCache(0)).verify_checksums()


@dataclass(slots=True)
class ApplyStats:
    added: int = 0
    removed: int = 0
    changed: int = 0
    ranges_written: int = 0
    ranges_reused: int = 0

    @property
    def changes(self) -> int:
        return self.added + self.removed + self.changed


class _MetaRange:
    __slots__ = ("id", "infos", "max_keys")

    def __init__(self, mr_id: str, infos: list[RangeInfo]):
        self.id = mr_id
        self.infos = infos
        self.max_keys = [r.max_key for r in infos]


def _sorted_changes(changes: Iterable[tuple[bytes, Value | None]]) -> Iterator[tuple[bytes, Value | None]]:
    last = None
    for k, v in changes:
        if last is not None and k <= last:
            raise InvalidArgument(f"changes must be sorted and unique: {k!r} after {last!r}")
        last = k
        yield k, v


class CommittedManager:
    """Thread-safe access to the committed trees of one storage namespace."""

    def __init__(self, source: TableSource, params: RangeParams = RangeParams(),
                 block_cache: BlockCache | None = None, max_open_bytes: int = 512 << 20):
        self.source = source
        self.params = params
        self.block_cache = block_cache if block_cache is not None else BlockCache()
        self._tables: OrderedDict[str, SSTable] = OrderedDict()
        self._tables_bytes = 0
        self._max_open_bytes = max_open_bytes
        self._metaranges: OrderedDict[str, _MetaRange] = OrderedDict()
        self._lock = threading.Lock()
        # Counters for benchmarks and tests: table files fetched from the source and written.
        self.tables_read = 0
        self.tables_written = 0

    # -- files -----------------------------------------------------------------------------
    def _put(self, key: str, data: bytes) -> None:
        self.source.put(key, data)
        with self._lock:
            self.tables_written += 1

    def _open(self, table_id: str) -> SSTable:
        t = self._tables.get(table_id)  # lock-free hit (atomic under the GIL); LRU order is best effort
        if t is not None:
            try:
                self._tables.move_to_end(table_id)
            except KeyError:  # evicted meanwhile
                pass
            return t
        key = table_key(table_id)
        try:
            data = self.source.get(key)
        except NotFound:
            raise NotFound(f"table {table_id} not found in the namespace ({key})") from None
        t = SSTable(data, key, cache_key=table_id, block_cache=self.block_cache)
        with self._lock:
            self.tables_read += 1
            if table_id not in self._tables:
                self._tables[table_id] = t
                self._tables_bytes += t.size
                while self._tables_bytes > self._max_open_bytes and len(self._tables) > 1:
                    _, old = self._tables.popitem(last=False)
                    self._tables_bytes -= old.size
        return t

    def _metarange(self, mr_id: str) -> _MetaRange:
        m = self._metaranges.get(mr_id)  # lock-free hit, as in _open
        if m is not None:
            try:
                self._metaranges.move_to_end(mr_id)
            except KeyError:
                pass
            return m
        if mr_id == EMPTY_METARANGE_ID:
            m = _MetaRange(mr_id, [])
        else:
            t = self._open(mr_id)
            kind = t.raw_properties.get("type")
            if kind not in (None, b"metaranges"):
                raise CorruptedData(f"table {mr_id} is a {kind.decode(errors='replace')} table, not a metarange")
            infos = [RangeInfo.from_value(decode_value(raw, t.name), t.name) for _, raw in t]
            m = _MetaRange(mr_id, infos)
        with self._lock:
            self._metaranges[mr_id] = m
            while len(self._metaranges) > 256:
                self._metaranges.popitem(last=False)
        return m

    # -- reading ---------------------------------------------------------------------------
    def list_ranges(self, metarange_id: str) -> list[RangeInfo]:
        return list(self._metarange(metarange_id).infos)

    def exists(self, metarange_id: str) -> bool:
        try:
            self._metarange(metarange_id)
            return True
        except NotFound:
            return False

    def get(self, metarange_id: str, key: bytes) -> Value | None:
        m = self._metarange(metarange_id)
        i = bisect_left(m.max_keys, key)
        if i == len(m.infos):
            return None
        info = m.infos[i]
        if key < info.min_key:
            return None
        t = self._open(info.id)
        raw = t.get(key)
        return decode_value(raw, t.name) if raw is not None else None

    def iter_range_raw(self, info: RangeInfo, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """(key, encoded value) of one range from ``start`` on."""
        t = self._open(info.id)
        first = True
        for blk in t.iter_blocks(start):
            keys, vals = blk.keys, blk.values
            i = bisect_left(keys, start) if first else 0
            first = False
            for j in range(i, len(keys)):
                yield keys[j], vals[j]

    def iterator(self, metarange_id: str, start: bytes = b"") -> Iterator[tuple[bytes, Value]]:
        """All records with key >= ``start``, in order; ranges are opened as they are entered."""
        m = self._metarange(metarange_id)
        i = bisect_left(m.max_keys, start)
        for info in m.infos[i:]:
            t = self._open(info.id)
            name = t.name
            for k, raw in self.iter_range_raw(info, start):
                yield k, decode_value(raw, name)
            start = b""

    # -- writing ---------------------------------------------------------------------------
    def new_writer(self, metadata: dict[str, str] | None = None) -> MetaRangeWriter:
        return MetaRangeWriter(self._put, self.params, metadata)

    def write_metarange(self, records: Iterable[tuple[bytes, Value]], metadata: dict[str, str] | None = None) -> str:
        w = self.new_writer(metadata)
        w.write_values(records)
        return w.close()

    def empty_metarange(self) -> str:
        return EMPTY_METARANGE_ID

    def apply(self, base_id: str, changes: Iterable[tuple[bytes, Value | None]],
              metadata: dict[str, str] | None = None) -> tuple[str, ApplyStats]:
        """Apply sorted changes (``None`` deletes) to a metarange; untouched ranges are copied by ID.

        A change whose identity equals the committed record's is no change.
        """
        infos = self._metarange(base_id).infos
        w = self.new_writer(metadata)
        stats = ApplyStats()
        out: list[tuple[bytes, bytes]] = []
        ch = _sorted_changes(changes)
        pending = next(ch, None)

        def flush() -> None:
            nonlocal out
            w.write_batch(out)
            out = []

        for info in infos:
            if pending is None or pending[0] > info.max_key:
                flush()
                w.copy_range(info)
                stats.ranges_reused += 1
                continue
            t = self._open(info.id)
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
                    flush()
                    w.write_block(t.raw_block(handles[bi]), keys, vals, blk.nbytes, hashes, next_key, next_len)
                    continue
                for k, raw in zip(keys, vals):
                    while pending is not None and pending[0] < k:
                        if pending[1] is not None:
                            out.append((pending[0], encode_value(pending[1])))
                            stats.added += 1
                        pending = next(ch, None)
                    if pending is not None and pending[0] == k:
                        v = pending[1]
                        if v is None:
                            stats.removed += 1
                        else:
                            old = decode_value(raw)
                            if old.identity == v.identity:
                                out.append((k, raw))
                            else:
                                out.append((k, encode_value(v)))
                                stats.changed += 1
                        pending = next(ch, None)
                    else:
                        out.append((k, raw))
            # Changes after the range's last record but within its span (up to max_key) are added above;
            # those equal to max_key were matched; nothing else belongs to this range.
        while pending is not None:
            if pending[1] is not None:
                out.append((pending[0], encode_value(pending[1])))
                stats.added += 1
                if len(out) >= 2048:
                    flush()
            pending = next(ch, None)
        flush()
        new_id = w.close()
        stats.ranges_written = w.ranges_written
        return new_id, stats

    # -- diff and merge (graveler.committed.diff) ------------------------------------------
    def diff(self, left_id: str, right_id: str) -> Iterator[DiffRecord]:
        from graveler.committed.diff import diff

        return diff(self, left_id, right_id)

    def merge(self, base_id: str, source_id: str, dest_id: str,
              strategy: MergeStrategy = MergeStrategy.NONE,
              metadata: dict[str, str] | None = None) -> tuple[str, ApplyStats]:
        from graveler.committed.diff import merge

        return merge(self, base_id, source_id, dest_id, strategy, metadata)
