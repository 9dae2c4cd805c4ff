"""The committed layer's implementation, chosen once: compiled (the default) or the pure-Python reference.

``LAKEFUSE_PURE_PYTHON=1`` (see :mod:`graveler.native`) selects the reference at
start-up. Both are a namespace with the same names, and the module exposes the
selected one's names itself; the manager, merge and the Spark jobs use these and
never ask which one they got:

* ``MetaRangeWriter``: records into ranges and a metarange, and ``apply``'s per-range
  step (:class:`graveler.committed.writer.MetaRangeWriter` /
  :class:`CMetaRangeWriter`: the builder's compiled record loop, ``_capply``,
  range checkpoints);
* ``diff``: the difference of two metaranges (:func:`graveler.committed.diff.py_diff` /
  ``_cdiff.DiffIter``);
* ``fnv1a64``, ``fnv1a64_batch``: lakeFS's range-break hash (:mod:`graveler.committed.fnv` /
  ``_cfnv``).

The compiled modules reach table bytes only through the sstable layer's kernels
(``graveler/sstable/_crange.pxd``, ``_ctable.pxd``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Iterator

from graveler import native
from graveler.committed import checkpoints
from graveler.committed import fnv as _fnv
from graveler.committed.diff import py_diff
from graveler.committed.writer import MetaRangeWriter as _PyMetaRangeWriter
from graveler.committed.writer import buffer_item
from graveler.config import RangeParams
from graveler.errors import InvalidArgument
from graveler.model import DiffRecord, encode_value
from graveler.sstable import kernel as sstable_kernel


def _py_diff(reader, left_id: str, right_id: str) -> Iterator[DiffRecord]:
    return py_diff(reader, reader.metarange(left_id).infos, reader.metarange(right_id).infos)


reference = SimpleNamespace(
    name="pure-python",
    MetaRangeWriter=_PyMetaRangeWriter,
    diff=_py_diff,
    fnv1a64=_fnv.py_fnv1a64,
    fnv1a64_batch=_fnv.py_fnv1a64_batch,
)


compiled: SimpleNamespace | None = None
if not native.PURE_PYTHON:
    _sst = sstable_kernel.compiled
    _cfnv = native.load("graveler.committed._cfnv")
    _RangeApply = native.load("graveler.committed._capply").RangeApply
    _DiffIter = native.load("graveler.committed._cdiff").DiffIter

    class CMetaRangeWriter(_PyMetaRangeWriter):
        """The compiled writer: ranges through ``_ctable.TableBuilder``'s record loop (the break rule
        included), checkpoints recorded for later rewrites, ``apply_range`` through ``_capply``."""

        table_builder = _sst.TableBuilder

        def write_batch(self, records: list[tuple[bytes, bytes]], hashes: list[int] | None = None) -> None:
            """Add records given as (key, encoded value), in order: the reference's ranges, bytes and IDs."""
            if not records:
                return
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
                    cur = self._new_table()
                i, broke = cur.sst.add_records(records, i, p.min_range_size, p.max_range_size, p.raggedness)
                if broke:
                    self.close_range()
            self._last_key = records[-1][0]
            self.records_written += n

        def write_buffers(self, n: int, key_off, key_data, key_start: int, val_off, val_data, val_start: int) -> None:
            """``write_batch`` over the buffers of two Arrow binary arrays (see the reference's): the
            records are read by the table builder's loop in C, no Python object per record."""
            if n <= 0:
                return
            p = self.params
            i = 0
            while i < n:
                cur = self._current
                if cur is None:
                    key = buffer_item(key_off, key_data, key_start, i)
                    prev = buffer_item(key_off, key_data, key_start, i - 1) if i else self._last_key
                    if prev is not None and key <= prev:
                        raise InvalidArgument(f"records must be sorted and unique: {key!r} after {prev!r}")
                    cur = self._new_table()
                try:
                    i, broke = cur.sst.add_buffers(key_off, key_data, key_start, val_off, val_data, val_start, i, n,
                                                   p.min_range_size, p.max_range_size, p.raggedness)
                except ValueError as e:
                    raise InvalidArgument(str(e)) from None
                if broke:
                    self.close_range()
            self._last_key = buffer_item(key_off, key_data, key_start, n - 1)
            self.records_written += n

        def open_table(self):
            """The table builder being written (a new one if none is open): what ``_capply`` writes to."""
            cur = self._current if self._current is not None else self._new_table()
            return cur.sst

        def kernel_done(self, last_key: bytes | None, written: int, carried: int) -> None:
            """What a compiled apply step wrote through ``open_table``: its last key and counts."""
            if last_key is not None:
                self._last_key = last_key
            self.records_written += written
            self.blocks_copied += carried

        def _checkpoints_of(self, table, data) -> bytes | None:
            return checkpoints.pack(_sst, self.params, len(data), table.sst.checkpoint_data())

        def apply_range(self, t, info, pending, ch, out, stats, facts=None):
            """``apply_range`` compiled: the changes up to the range's max key are taken from the stream,
            encoded, and merged with the range's blocks in one call (``out`` stays empty)."""
            params: RangeParams = self.params
            keys: list[bytes] = []
            raws: list[bytes | None] = []
            max_key = info.max_key
            while pending is not None and pending[0] <= max_key:
                keys.append(pending[0])
                raws.append(None if pending[1] is None else encode_value(pending[1]))
                pending = next(ch, None)
            cps = checkpoints.unpack(_sst, facts, params, t.size)
            ra = _RangeApply(self, t, keys, raws, params.min_range_size, params.max_range_size, params.raggedness,
                            cps).run()
            self.kernel_done(ra.last_key, ra.written, ra.blocks_carried)
            stats.blocks_carried += ra.blocks_carried
            stats.blocks_resumed += ra.resumed_at
            stats.blocks_in_runs += ra.blocks_in_runs
            stats.blocks_rewritten += ra.blocks_rewritten
            stats.added += ra.added
            stats.removed += ra.removed
            stats.changed += ra.changed
            return pending

    def _c_diff(reader, left_id: str, right_id: str) -> Iterator[DiffRecord]:
        return _DiffIter(reader.open, reader.metarange(left_id).infos, reader.metarange(right_id).infos)

    compiled = SimpleNamespace(
        name="compiled",
        MetaRangeWriter=CMetaRangeWriter,
        diff=_c_diff,
        fnv1a64=_cfnv.fnv1a64,
        fnv1a64_batch=_cfnv.fnv1a64_batch,
    )


selected: SimpleNamespace = reference if compiled is None else compiled

MetaRangeWriter = selected.MetaRangeWriter
fnv1a64 = selected.fnv1a64
fnv1a64_batch = selected.fnv1a64_batch


def diff(reader, left_id: str, right_id: str) -> Iterator[DiffRecord]:
    """Records that differ between two metaranges, in key order (identity decides 'changed').

    Equal range IDs are skipped unopened; inside two differing ranges, data blocks with
    identical stored bytes are skipped undecoded (see :mod:`graveler.committed.diff`)."""
    return selected.diff(reader, left_id, right_id)


__all__ = ["MetaRangeWriter", "compiled", "diff", "fnv1a64", "fnv1a64_batch", "reference", "selected"]
