"""Reading committed trees: the table LRU, metaranges, two-hop gets and range iterators.

A lookup goes metarange -> range -> block: a metarange is parsed once and its
range list kept (an LRU by file size), a range file is opened only when a
lookup or an iterator enters it (an LRU of open tables by file size), and its
decoded blocks live in the shared block cache of :mod:`graveler.sstable.reader`.
The empty metarange ID ``""`` is the empty tree, as in lakeFS's first commit.

:class:`TableReader` is used by the committed manager (gets, scans, apply) and
by diff and merge (:mod:`graveler.committed.diff`, :mod:`graveler.committed.merge`).
"""

from __future__ import annotations

import itertools
import logging
from bisect import bisect_left
from typing import Iterator, Protocol

from graveler.cache import CheckMemo
from graveler.committed.writer import table_key
from graveler.config import CacheConfig
from graveler.errors import CorruptedData, NotFound
from graveler.ident import enc_string_map
from graveler.lru import LRU
from graveler.model import VALUE_DECODER, RangeInfo, Value, decode_value
from graveler.sstable.reader import BlockCache, SSTable

log = logging.getLogger(__name__)

EMPTY_METARANGE_ID = ""


class TableSource(Protocol):
    """Where table files come from: an ImmutableCache, or a store wrapped by StoreSource."""

    def get(self, key: str) -> bytes: ...
    def put(self, key: str, data: bytes) -> None: ...


# Tables at least this large are memory-mapped from a local store rather than read into memory: a read copies
# the file into fresh memory (a page fault per 4 KiB of it) each time a process opens it; a mapping shares the
# page cache's pages, faulted in 64 KiB at a time. (The store's own default, for any object, is 4 MiB.)
TABLE_MAP_MIN_BYTES = 256 << 10


class StoreSource:
    """Tables straight from an object store, uncached (a local namespace, tests, one-shot tools)."""

    def __init__(self, store):
        self.store = store

    def get(self, key: str):
        """The table file: memory-mapped when the store can map it (a large local file), else bytes."""
        return self.store.get_mapped(key)

    def get_immutable(self, key: str):
        """``get``'s buffer and the fingerprint of the local file it came from (None if not one). A table of
        ``TABLE_MAP_MIN_BYTES`` or more is mapped (its pages read in place from the page cache as they are
        used), a smaller one read whole."""
        return self.store.get_immutable(key, TABLE_MAP_MIN_BYTES)

    def put(self, key: str, data: bytes) -> None:
        self.store.put_immutable(key, data)

    def fingerprint(self, key: str):
        return self.store.fingerprint(key)

    def full_uri(self, key: str) -> str:
        return self.store.full_uri(key)


# Properties lakeFS adds after hashing: not part of a table's ID.
_NOT_HASHED = frozenset({"min_key", "max_key", "count", "estimated_size_bytes"})


def hashed_properties(t: SSTable) -> dict[str, str]:
    """The properties that go into a table's ID: lakeFS's own, minus the ones added after hashing."""
    return {k: v.decode("utf-8", "replace") for k, v in t.raw_properties.items()
            if not k.startswith("rocksdb.") and k not in _NOT_HASHED}


def computed_table_id(t: SSTable) -> str:
    """The ID of a range or metarange from its content: the hash of its records and properties."""
    return t.records_digest(enc_string_map(hashed_properties(t)))


def check_table_id(table_id: str, t: SSTable) -> None:
    """``CorruptedData`` unless the table's content hashes to ``table_id``: a valid table stored
    under another table's name (copied over it) would otherwise be served as that table."""
    got = computed_table_id(t)
    if got != table_id:
        raise CorruptedData(f"table file holds table {got}, not {table_id} (a table under the wrong name)", t.name)


def verify_table(key: str, data: bytes) -> SSTable:
    """Cache-fill (and cache-hit) check: the table parses, every block's checksum holds,
    and its content hashes to the ID in its name (``_lakefs/<id>``). The table, for a caller
    that reads it too (:mod:`graveler.fsck`)."""
    t = SSTable(data, key, block_cache=BlockCache(0))
    t.verify_checksums()
    check_table_id(key.rsplit("/", 1)[-1], t)
    return t


def metarange_infos(mr_id: str, t: SSTable) -> list[RangeInfo]:
    """The ranges metarange table ``t`` lists (CorruptedData if it is a range's table)."""
    kind = t.raw_properties.get("type")
    if kind not in (None, b"metaranges"):
        raise CorruptedData(f"table {mr_id} is a {kind.decode(errors='replace')} table, not a metarange")
    return [RangeInfo.from_value(decode_value(raw, t.name), t.name) for _, raw in t]


class MetaRange:
    """A parsed metarange: its ranges in key order and their max keys (for bisecting)."""

    __slots__ = ("id", "infos", "max_keys", "nbytes")

    def __init__(self, mr_id: str, infos: list[RangeInfo], nbytes: int = 0):
        self.id = mr_id
        self.infos = infos
        self.max_keys = [r.max_key for r in infos]
        self.nbytes = nbytes


def _table_weight(t: SSTable) -> int:
    return t.size


def _metarange_weight(m: MetaRange) -> int:
    return m.nbytes


class TableReader:
    """Thread-safe reads of the committed trees of one storage namespace."""

    def __init__(self, source: TableSource, block_cache: BlockCache | None = None,
                 cache: CacheConfig = CacheConfig(), memo: CheckMemo | None = None):
        self.source = source
        # Table files known to hash to their IDs, by file fingerprint (shared by the processes of a home)
        self.memo = memo if memo is not None else CheckMemo()
        self.block_cache = block_cache if block_cache is not None else BlockCache(cache.block_bytes)
        self._tables: LRU[str, SSTable] = LRU(cache.table_bytes, _table_weight)
        self._metaranges: LRU[str, MetaRange] = LRU(cache.metarange_bytes, _metarange_weight)
        self._table_hits = self._tables.data  # for the inlined hits of get()
        self._metarange_hits = self._metaranges.data
        self.tables_read = 0  # table files fetched from the source (benchmarks, tests)
        # IDs checked in this process (tables with no local file); a source that runs verify_table itself (the
        # disk tier) needs no second check
        self._checked: set[str] = set()
        self._source_checks = getattr(source, "verify", None) is verify_table
        self._get_immutable = getattr(source, "get_immutable", None)
        self._full_uri = getattr(source, "full_uri", None)

    # -- files -----------------------------------------------------------------------------
    def open(self, table_id: str) -> SSTable:
        """The open table ``table_id`` (a range or a metarange).

        Before a table file is used it is checked to hash to ``table_id`` (CorruptedData
        otherwise): once per file, remembered by the file's fingerprint in the memo (so
        a file written by us, or checked by another process of the home, is not hashed
        again, and one copied over or rewritten since is); once per process for a table
        with no local file. The disk tier checks its files itself, on fill and on hits
        it does not remember.
        """
        t = self._tables.get(table_id)
        if t is not None:
            return t
        key = table_key(table_id)
        try:
            # Mapped where the source can (large local or cached files): a big repository's ranges are
            # paged in as they are read, not held in memory whole.
            if self._get_immutable is not None:
                data, fp = self._get_immutable(key)
            else:
                data, fp = self.source.get(key), None
        except NotFound:
            raise NotFound(f"table {table_id} not found in the namespace ({key})") from None
        t = SSTable(data, key, cache_key=table_id, block_cache=self.block_cache)
        if not self._source_checks and table_id not in self._checked:
            uri = self._full_uri(key) if self._full_uri is not None else None
            if uri is None or not self.memo.checked(uri, fp):
                check_table_id(table_id, t)
                if fp is not None and uri is not None:
                    self.memo.remember(uri, fp)
                else:
                    self._checked.add(table_id)
        self.tables_read += 1
        return self._tables.setdefault(table_id, t)

    def remember_written(self, key: str) -> None:
        """A table file we just wrote (its ID hashed from the records we wrote): no check needed."""
        if self._full_uri is None or self._source_checks:
            return  # the disk tier remembers its own fills
        fingerprint = getattr(self.source, "fingerprint", None)
        if fingerprint is not None:
            self.memo.remember(self._full_uri(key), fingerprint(key))

    def metarange(self, mr_id: str) -> MetaRange:
        """The parsed metarange ``mr_id`` (CorruptedData if the table is a range)."""
        m = self._metaranges.get(mr_id)
        if m is not None:
            return m
        if mr_id == EMPTY_METARANGE_ID:
            m = MetaRange(mr_id, [])
        else:
            t = self.open(mr_id)
            m = MetaRange(mr_id, metarange_infos(mr_id, t), t.size)
        self._metaranges.put(mr_id, m)
        return m

    # -- reading ---------------------------------------------------------------------------
    def list_ranges(self, metarange_id: str) -> list[RangeInfo]:
        return list(self.metarange(metarange_id).infos)

    def exists(self, metarange_id: str) -> bool:
        try:
            self.metarange(metarange_id)
            return True
        except NotFound:
            return False

    def get(self, metarange_id: str, key: bytes) -> Value | None:
        """The record ``key`` of a metarange (two hops: its range, then the key), or None."""
        # The hits of metarange() and open(), inlined: this is the hottest read path.
        hits = self._metarange_hits
        m = hits.get(metarange_id)
        if m is None:
            m = self.metarange(metarange_id)
        else:
            try:
                hits.move_to_end(metarange_id)
            except KeyError:
                pass
        i = bisect_left(m.max_keys, key)
        if i == len(m.infos):
            return None
        info = m.infos[i]
        if key < info.min_key:
            return None
        tid = info.id
        hits = self._table_hits
        t = hits.get(tid)
        if t is None:
            t = self.open(tid)
        else:
            try:
                hits.move_to_end(tid)
            except KeyError:
                pass
        raw = t.get(key)
        return decode_value(raw, t.name) if raw is not None else None

    def iter_range_raw(self, info: RangeInfo, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """(key, encoded value) of one range from ``start`` on."""
        return itertools.chain.from_iterable(self._range_scans([info], start, False))

    def iterator(self, metarange_id: str, start: bytes = b"", end: bytes | None = None
                 ) -> Iterator[tuple[bytes, Value]]:
        """All records with key >= ``start``, in order; ranges are opened as they are entered.
        ``end``: the caller wants no key >= ``end``: the records stop before a range whose
        first key (the metarange says) is there, unopened -- a damaged range after the keys
        asked for fails nothing (the last records of the range before may still reach it).

        The records come straight from the tables' scans (compiled: no Python frame per record).
        """
        return itertools.chain.from_iterable(self._metarange_scans(metarange_id, start, end))

    def _metarange_scans(self, metarange_id: str, start: bytes,
                         end: bytes | None = None) -> Iterator[Iterator[tuple[bytes, Value]]]:
        m = self.metarange(metarange_id)
        yield from self._range_scans(m.infos[bisect_left(m.max_keys, start):], start, True, end)

    def _range_scans(self, infos: list[RangeInfo], start: bytes, records: bool,
                     end: bytes | None = None) -> Iterator[Iterator]:
        for info in infos:
            if end is not None and info.min_key >= end:
                return
            t = self.open(info.id)
            yield t.seek_ge(start, VALUE_DECODER if records else None)
            start = b""


class RecordIterator:
    """A seekable iterator over a metarange's records, values still encoded.

    ``next()`` returns ``(key, raw value)`` or None at the end; ``seek_ge(key)``
    moves to the first key >= ``key``: within the current block by bisection,
    else through the metarange and the range's index (one range opened at most).
    Ranges are opened only when entered.
    """

    __slots__ = ("_reader", "_m", "_ri", "_blocks", "_keys", "_vals", "_ei", "name")

    def __init__(self, reader: TableReader, metarange_id: str, start: bytes = b""):
        self._reader = reader
        self._m = reader.metarange(metarange_id)
        self._keys: list[bytes] = []
        self._vals: list[bytes] = []
        self._ei = 0
        self.name = ""  # the file name of the range being read (for error messages)
        self._position(start)

    def _position(self, key: bytes) -> None:
        m = self._m
        self._ri = bisect_left(m.max_keys, key)
        self._keys, self._vals, self._ei = [], [], 0
        if self._ri < len(m.infos):
            t = self._reader.open(m.infos[self._ri].id)
            self.name = t.name
            self._blocks = t.iter_blocks(key)
            self._next_block()
            self._ei = bisect_left(self._keys, key)
        else:
            self._blocks = None

    def _next_block(self) -> bool:
        """Load the next block (entering the next range when one ends); False at the end."""
        while self._blocks is not None:
            blk = next(self._blocks, None)
            if blk is not None:
                self._keys, self._vals, self._ei = blk.keys, blk.values, 0
                if blk.keys:
                    return True
                continue
            self._ri += 1
            infos = self._m.infos
            if self._ri < len(infos):
                t = self._reader.open(infos[self._ri].id)
                self.name = t.name
                self._blocks = t.iter_blocks()
            else:
                self._blocks = None
        self._keys, self._vals, self._ei = [], [], 0
        return False

    def next(self) -> tuple[bytes, bytes] | None:
        ei = self._ei
        if ei >= len(self._keys):
            if not self._next_block():
                return None
            ei = 0
        self._ei = ei + 1
        return self._keys[ei], self._vals[ei]

    def seek_ge(self, key: bytes) -> None:
        keys = self._keys
        if keys and keys[0] <= key <= keys[-1]:
            self._ei = bisect_left(keys, key)
        else:
            self._position(key)


__all__ = ["EMPTY_METARANGE_ID", "MetaRange", "RecordIterator", "StoreSource", "TableReader", "TableSource",
           "verify_table"]
