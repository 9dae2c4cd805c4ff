"""``apply``'s per-range step, the reference: one touched range and the changes that fall in it.

:meth:`graveler.committed.manager.CommittedManager.apply` copies untouched ranges by
ID and hands each touched one to its writer's ``apply_range``: this pure-Python
step for :class:`graveler.committed.writer.MetaRangeWriter`, the compiled one
(``graveler.committed._capply``) for the compiled writer of
:mod:`graveler.committed.kernel` -- the same files and IDs, tested.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from graveler.committed.fnv import py_fnv1a64_batch as fnv1a64_batch
from graveler.model import Value, decode_value, encode_value
from graveler.sstable.reader import SSTable

Change = tuple[bytes, Value | None]  # None deletes


@dataclass(slots=True)
class ApplyStats:
    added: int = 0
    removed: int = 0
    changed: int = 0
    ranges_written: int = 0
    ranges_reused: int = 0
    blocks_carried: int = 0  # unchanged blocks of touched ranges copied verbatim (compiled apply)
    blocks_resumed: int = 0  # unchanged blocks before a change skipped through a checkpoint (compiled apply)
    blocks_in_runs: int = 0  # of blocks_carried, those carried in runs between changes (compiled apply)
    blocks_rewritten: int = 0  # blocks of touched ranges written record by record (compiled apply)

    @property
    def changes(self) -> int:
        return self.added + self.removed + self.changed


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


def py_apply_range(t: SSTable, pending: Change | None, ch: Iterator[Change], w,
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
