"""Writing ranges and metaranges, split the way lakeFS splits them.

A range closes after a record when its estimated size reaches the maximum, or
(once past the minimum) when FNV-1a-64 of the record's key is 0 modulo the
raggedness.  Breaks therefore depend only on keys (and, past 20 MiB, on the
records since the last break), so the same records make the same range IDs
whatever wrote them: this process, another commit, a Spark executor.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from graveler import native
from graveler.committed.fnv import fnv1a64_batch
from graveler.config import RangeParams
from graveler.errors import InvalidArgument
from graveler.ident import TableHasher
from graveler.model import RangeInfo, Value, encode_value
from graveler.sstable.writer import SSTableWriter

log = logging.getLogger(__name__)

RANGES_TYPE = "ranges"
METARANGES_TYPE = "metaranges"
TABLE_PREFIX = "_lakefs/"


def table_key(table_id: str) -> str:
    return TABLE_PREFIX + table_id


class TableWriter:
    """One range or metarange: an SSTable plus the running lakeFS ID hash."""

    def __init__(self, table_type: str, metadata: dict[str, str] | None = None):
        self.table_type = table_type
        self.metadata = dict(metadata or {})
        self.sst = SSTableWriter()
        self.hasher = TableHasher()

    def add(self, key: bytes, raw_value: bytes) -> None:
        self.sst.add(key, raw_value)
        self.hasher.add(key, raw_value)

    def finish(self) -> tuple[str, bytes, RangeInfo]:
        """Returns (ID, file bytes, the metarange record describing it)."""
        props = dict(self.metadata)
        props["type"] = self.table_type
        table_id = self.hasher.finish(props)
        estimated = self.sst.estimated_size()
        sst = self.sst
        min_key = sst.first_key or b""
        max_key = sst.last_key or b""
        count = sst.num_entries
        sst_props: dict[str, bytes] = {k: v.encode("utf-8") for k, v in props.items()}
        sst_props["min_key"] = min_key
        sst_props["max_key"] = max_key
        sst_props["count"] = str(count).encode()
        sst_props["estimated_size_bytes"] = str(estimated).encode()
        data = self.sst.finish(sst_props)
        # RangeData.estimated_size is Pebble's estimate after close: file size + two empty blocks.
        info = RangeInfo(table_id, min_key, max_key, count, len(data) + 8)
        return table_id, data, info


class MetaRangeWriter:
    """Streams records into ranges and collects them into a metarange.

    ``put(key, data)`` stores a finished table (the manager passes its
    write-through cache).  Ranges copied whole from another metarange go in
    with :meth:`copy_range`, which first closes the range being written,
    exactly as lakeFS does.
    """

    compiled = True  # False: the pure-Python record loop (the reference; tests compare the two)

    def __init__(self, put: Callable[[str, bytes], None], params: RangeParams,
                 metadata: dict[str, str] | None = None):
        self._put = put
        self.params = params
        self.metadata = dict(metadata or {})
        self.ranges: list[RangeInfo] = []
        self._current: TableWriter | None = None
        self.ranges_written = 0
        self.ranges_copied = 0
        self.records_written = 0
        self.blocks_copied = 0
        self._last_key: bytes | None = None

    def write_batch(self, records: list[tuple[bytes, bytes]], hashes: list[int] | None = None) -> None:
        """Add records given as (key, encoded value), in order (``hashes``: their keys' FNV, if known)."""
        if not records:
            return
        if _add_records is not None and self.compiled:
            self._write_batch_compiled(records)
            return
        p = self.params
        min_size, max_size, raggedness = p.min_range_size, p.max_range_size, p.raggedness
        if hashes is None:
            hashes = fnv1a64_batch([k for k, _ in records])
        cur = self._current
        prev = self._last_key
        for (key, raw), h in zip(records, hashes):
            if cur is None:
                # Inside a range the SSTable writer checks order; across a break, check here.
                if prev is not None and key <= prev:
                    raise InvalidArgument(f"records must be sorted and unique: {key!r} after {prev!r}")
                cur = self._current = TableWriter(RANGES_TYPE, self.metadata)
            cur.add(key, raw)  # the SSTable writer checks that keys increase
            est = cur.sst.estimated_size()
            if est < min_size:
                continue
            if est >= max_size or h % raggedness == 0:
                self.close_range()
                cur = None
                prev = key
        self._last_key = records[-1][0]
        self.records_written += len(records)

    def _write_batch_compiled(self, records: list[tuple[bytes, bytes]]) -> None:
        """write_batch's loop, compiled: the same ranges, bytes and IDs."""
        p = self.params
        if not isinstance(records, list):
            records = list(records)
        i, n = 0, len(records)
        while i < n:
            cur = self._current
            if cur is None:
                prev = records[i - 1][0] if i else self._last_key
                key = records[i][0]
                if prev is not None and key <= prev:
                    raise InvalidArgument(f"records must be sorted and unique: {key!r} after {prev!r}")
                cur = self._current = TableWriter(RANGES_TYPE, self.metadata)
            i, broke = _add_records(cur.sst, records, i, p.min_range_size, p.max_range_size, p.raggedness,
                                    cur.hasher)
            if broke:
                self.close_range()
        self._last_key = records[-1][0]
        self.records_written += n

    def write_block(self, raw: bytes, keys: list[bytes], values: list[bytes], nbytes: int,
                    hashes: list[int], next_key: bytes | None, next_value_len: int) -> None:
        """Add the records of one untouched data block of an existing range.

        The block's stored bytes are appended verbatim when that is exactly what
        writing its records one by one would produce (see
        ``SSTableWriter.append_block_canonical``) and no range break falls
        inside it; otherwise its records are written one by one.  Either way the
        range files, range breaks and IDs are those of a from-scratch write.
        """
        p = self.params
        cur = self._current
        if p.min_range_size == 0 and not any(h % p.raggedness == 0 for h in hashes[:-1]):
            if cur is None:
                if self._last_key is not None and keys[0] <= self._last_key:
                    raise InvalidArgument(f"records must be sorted and unique: {keys[0]!r} after {self._last_key!r}")
                cur = self._current = TableWriter(RANGES_TYPE, self.metadata)
            if cur.sst.append_block_canonical(raw, keys, values, nbytes, next_key, next_value_len,
                                              p.max_range_size):
                cur.hasher.add_many(keys, values)
                self._last_key = keys[-1]
                self.records_written += len(keys)
                self.blocks_copied += 1
                if cur.sst.estimated_size() >= p.max_range_size or hashes[-1] % p.raggedness == 0:
                    self.close_range()
                return
        self.write_batch(list(zip(keys, values)), hashes)

    def write_compiled_block(self, raw: bytes, blk, next_key: bytes | None, next_value_len: int) -> None:
        """``write_block`` for a compiled block (graveler.sstable._cblock.Block): its records are summed up
        (keys' FNV, table-ID input) in compiled code, without a Python object per record."""
        p = self.params
        first, first_vlen, last, n, raw_k, raw_v, inside, last_breaks, id_input = blk.summary(p.raggedness)
        cur = self._current
        if p.min_range_size == 0 and not inside:
            if cur is None:
                if self._last_key is not None and first <= self._last_key:
                    raise InvalidArgument(f"records must be sorted and unique: {first!r} after {self._last_key!r}")
                cur = self._current = TableWriter(RANGES_TYPE, self.metadata)
            if cur.sst.append_block_summary(raw, first, first_vlen, last, n, raw_k, raw_v, blk.nbytes, next_key,
                                            next_value_len, p.max_range_size):
                cur.hasher.add_input(id_input)
                self._last_key = last
                self.records_written += n
                self.blocks_copied += 1
                if cur.sst.estimated_size() >= p.max_range_size or last_breaks:
                    self.close_range()
                return
        self.write_batch(list(blk.iter_from(0)))

    def write_values(self, records: Iterable[tuple[bytes, Value]], batch: int = 2048) -> None:
        buf: list[tuple[bytes, bytes]] = []
        for k, v in records:
            buf.append((k, encode_value(v)))
            if len(buf) >= batch:
                self.write_batch(buf)
                buf = []
        self.write_batch(buf)

    def close_range(self) -> None:
        cur = self._current
        if cur is None:
            return
        self._current = None
        table_id, data, info = cur.finish()
        self._put(table_key(table_id), data)
        self.ranges.append(info)
        self.ranges_written += 1

    def copy_range(self, info: RangeInfo) -> None:
        self.close_range()
        if self._last_key is not None and info.min_key <= self._last_key:
            raise InvalidArgument(f"copied range {info.id} overlaps records already written")
        self.ranges.append(info)
        self._last_key = info.max_key
        self.ranges_copied += 1

    def close(self) -> str:
        """Close the last range, write the metarange; returns its ID."""
        self.close_range()
        mr = TableWriter(METARANGES_TYPE, self.metadata)
        for info in self.ranges:
            mr.add(info.max_key, encode_value(info.to_value()))
        table_id, data, _ = mr.finish()
        self._put(table_key(table_id), data)
        log.debug("wrote metarange %s: %d ranges (%d new, %d reused)", table_id, len(self.ranges),
                  self.ranges_written, self.ranges_copied)
        return table_id


if native.PURE_PYTHON:
    _add_records = None
else:
    _add_records = native.load("graveler.sstable._cblock").add_records
