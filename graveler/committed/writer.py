"""Writing ranges and metaranges, split the way lakeFS splits them.

A range closes after a record when its estimated size reaches the maximum, or
(once past the minimum) when FNV-1a-64 of the record's key is 0 modulo the
raggedness.  Breaks therefore depend only on keys (and, past 20 MiB, on the
records since the last break), so the same records make the same range IDs
whatever wrote them: this process, another commit, a Spark executor.

:class:`MetaRangeWriter` here is the reference (a Python record loop over the
reference table writer); :mod:`graveler.committed.kernel` holds the compiled
writer and selects one.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

from graveler.committed.apply import py_apply_range
from graveler.committed.fnv import py_fnv1a64_batch as fnv1a64_batch
from graveler.config import RangeParams
from graveler.errors import InvalidArgument
from graveler.ident import enc_string_map
from graveler.model import RangeInfo, Value, encode_value
from graveler.sstable import kernel as sstable_kernel

log = logging.getLogger(__name__)

RANGES_TYPE = "ranges"
METARANGES_TYPE = "metaranges"
TABLE_PREFIX = "_lakefs/"


def table_key(table_id: str) -> str:
    return TABLE_PREFIX + table_id


def buffer_item(off, data, start: int, i: int) -> bytes:
    """Item ``i`` of an Arrow binary array given as its int32 offsets and data buffers (``start``: its offset)."""
    lo, hi = struct.unpack_from("<ii", off, 4 * (start + i))
    if not 0 <= lo <= hi <= len(data):
        raise InvalidArgument("record offsets beyond their data or out of order")
    return bytes(data[lo:hi])


class TableWriter:
    """One range or metarange: a table builder that hashes its records for the lakeFS ID as it writes.

    ``builder``: the sstable layer's ``TableBuilder`` (the selected one unless given);
    ``checkpoints``: have it record its checkpoints (``checkpoint_data``) for later rewrites.
    """

    def __init__(self, table_type: str, metadata: dict[str, str] | None = None, builder=None,
                 checkpoints: bool = False):
        self.table_type = table_type
        self.metadata = dict(metadata or {})
        self.sst = (builder or sstable_kernel.TableBuilder)(hashed=True, checkpoints=checkpoints)

    def add(self, key: bytes, raw_value: bytes) -> None:
        self.sst.add(key, raw_value)

    def finish(self) -> tuple[str, bytes, RangeInfo]:
        """Returns (ID, file bytes, the metarange record describing it)."""
        props = dict(self.metadata)
        props["type"] = self.table_type
        table_id = self.sst.digest(enc_string_map(props))
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

    ``background=True``: finished ranges are stored by one helper thread while the
    next range is built (the store's write and fsync release the GIL), at most
    ``PUTS_IN_FLIGHT`` at a time; :meth:`close` waits for every one (raising the
    first failure) before it stores the metarange that names them, so a metarange
    is never durable before its ranges. A writer given up on must be
    :meth:`abort`-ed.
    """

    # The table builder (the reference's; the compiled writer, graveler.committed.kernel, uses _ctable's).
    table_builder = sstable_kernel.reference.TableBuilder
    PUTS_IN_FLIGHT = 2

    def __init__(self, put: Callable[[str, bytes], None], params: RangeParams,
                 metadata: dict[str, str] | None = None,
                 on_checkpoints: Callable[[str, bytes], None] | None = None, background: bool = False):
        self._put = put
        self._background = background
        self._pool: ThreadPoolExecutor | None = None
        self._puts: deque = deque()
        self._on_checkpoints = on_checkpoints  # (range ID, packed checkpoints) of each range written
        self.params = params
        self.metadata = dict(metadata or {})
        self.ranges: list[RangeInfo] = []
        self._current: TableWriter | None = None
        self.ranges_written = 0
        self.ranges_copied = 0
        self.records_written = 0
        self.blocks_copied = 0
        self._last_key: bytes | None = None

    def _new_table(self) -> TableWriter:
        self._current = TableWriter(RANGES_TYPE, self.metadata, self.table_builder,
                                    checkpoints=self._on_checkpoints is not None)
        return self._current

    def write_batch(self, records: list[tuple[bytes, bytes]], hashes: list[int] | None = None) -> None:
        """Add records given as (key, encoded value), in order (``hashes``: their keys' FNV, if known)."""
        if not records:
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
                cur = self._new_table()
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

    def write_buffers(self, n: int, key_off, key_data, key_start: int, val_off, val_data, val_start: int) -> None:
        """:meth:`write_batch` over the buffers of two Arrow binary arrays of ``n`` records: int32 offsets
        and data (bytes-like), ``*_start`` each array's offset, no nulls (the Spark range-writing task hands
        its sorted records over like this; the compiled writer reads them in C)."""
        if n <= 0:
            return
        self.write_batch([(buffer_item(key_off, key_data, key_start, i), buffer_item(val_off, val_data, val_start, i))
                          for i in range(n)])

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
                cur = self._new_table()
            if cur.sst.append_block_canonical(raw, keys, values, nbytes, next_key, next_value_len,
                                              p.max_range_size):
                self._last_key = keys[-1]
                self.records_written += len(keys)
                self.blocks_copied += 1
                if cur.sst.estimated_size() >= p.max_range_size or hashes[-1] % p.raggedness == 0:
                    self.close_range()
                return
        self.write_batch(list(zip(keys, values)), hashes)

    def apply_range(self, t, info: RangeInfo, pending, ch, out: list[tuple[bytes, bytes]], stats,
                    facts: bytes | None = None):
        """Apply the changes ``pending`` and on from ``ch`` that fall in the touched range ``t`` (``info``);
        records go to ``out`` (the caller writes it). ``facts``: what the memo keeps for the range (the
        compiled writer's checkpoints). Returns the first change past the range's records."""
        return py_apply_range(t, pending, ch, self, out, stats)

    def _checkpoints_of(self, table: TableWriter, data) -> bytes | None:
        """What to remember about a range just written (its checkpoints; the reference records none)."""
        return None

    def write_values(self, records: Iterable[tuple[bytes, Value]], batch: int = 2048) -> None:
        buf: list[tuple[bytes, bytes]] = []
        for k, v in records:
            buf.append((k, encode_value(v)))
            if len(buf) >= batch:
                self.write_batch(buf)
                buf = []
        self.write_batch(buf)

    def close_range(self, inline: bool = False) -> None:
        """Finish the range being written and store it (``inline``: on this thread, as ``close`` stores the
        last one: it would only wait for the helper thread to do it)."""
        cur = self._current
        if cur is None:
            return
        self._current = None
        table_id, data, info = cur.finish()
        if inline:
            self._put(table_key(table_id), data)
        else:
            self._store(table_key(table_id), data)
        if self._on_checkpoints is not None:
            blob = self._checkpoints_of(cur, data)
            if blob is not None:
                self._on_checkpoints(table_id, blob)
        self.ranges.append(info)
        self.ranges_written += 1

    def copy_range(self, info: RangeInfo) -> None:
        self.close_range()
        if self._last_key is not None and info.min_key <= self._last_key:
            raise InvalidArgument(f"copied range {info.id} overlaps records already written")
        self.ranges.append(info)
        self._last_key = info.max_key
        self.ranges_copied += 1

    def _store(self, key: str, data) -> None:
        if not self._background:
            self._put(key, data)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graveler-put")
        while len(self._puts) >= self.PUTS_IN_FLIGHT:
            self._puts.popleft().result()
        # ``data`` may be a view of the builder's buffer: the future holds it (and so the builder) until stored
        self._puts.append(self._pool.submit(self._put, key, data))

    def _drain(self) -> None:
        """Wait for every range put; the first failure is raised (after all have ended)."""
        try:
            while self._puts:
                self._puts.popleft().result()
        finally:
            self.abort()

    def abort(self) -> None:
        """Give the writer up: puts not started are cancelled, running ones waited for. What they stored
        is unreferenced (garbage collection removes it)."""
        pool, self._pool = self._pool, None
        self._puts.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> str:
        """Close the last range, write the metarange; returns its ID."""
        try:
            self.close_range(inline=True)  # (alongside the helper's puts still running)
        finally:
            self._drain()
        mr = TableWriter(METARANGES_TYPE, self.metadata, self.table_builder)
        for info in self.ranges:
            mr.add(info.max_key, encode_value(info.to_value()))
        table_id, data, _ = mr.finish()
        self._put(table_key(table_id), data)
        log.debug("wrote metarange %s: %d ranges (%d new, %d reused)", table_id, len(self.ranges),
                  self.ranges_written, self.ranges_copied)
        return table_id
