"""The lookup and scan path of one open table in pure Python: the reference of ``_cblock.TableCore``.

:class:`graveler.sstable.reader.SSTable` hands its reads to a core, the compiled
one or this one as :mod:`graveler.sstable.kernel` selected; both take the same
arguments and answer ``get``, ``scan``, ``cached_block`` and ``records_digest``
alike (the tests compare them).
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterator

from graveler.errors import CorruptedData
from graveler.sstable.format import BLOCK_TRAILER_LEN, BlockHandle


def record_id_input(keys: list[bytes], values: list[bytes]) -> bytes:
    """What a table ID hashes for these records: ``len(key) key | len(value) value |`` (lengths in decimal)."""
    return b"".join([b"%d%s|%d%s|" % (len(k), k, len(v), v) for k, v in zip(keys, values)])


class PyTableCore:
    """Reads of one table through its index: ``top`` is the top-level index block (handles of index
    partitions with a two-level index, else of data blocks); blocks come from the shared cache, keyed
    ``(cache_id, offset)``, and on a miss from ``load(offset, size)``."""

    __slots__ = ("top", "two_level", "cache", "cache_id", "load", "name", "index_offset", "_parts", "_handles",
                 "index_internal")

    def __init__(self, top, two_level: bool, cache, cache_id, load: Callable, name: str, index_offset: int,
                 owner=None, buf=None, checksum_type: int = 1, index_internal: bool = True):
        self.index_internal = index_internal  # (False: index partitions hold user keys, format_version 3)
        self.top = top
        self.two_level = two_level
        self.cache = cache
        self.cache_id = cache_id
        self.load = load
        self.name = name
        self.index_offset = index_offset
        self._parts = [None] * len(top) if two_level else None
        self._handles = [self._handle_at(top, i, index_offset) for i in range(len(top))] if two_level else None

    def _handle_at(self, blk, i: int, at: int) -> BlockHandle:
        """Handle ``i`` of the index block at file offset ``at``: what it names is a block of its
        own (not empty) that lies before that index block (data blocks come first, then index
        partitions, then the top index), else the index is damaged -- said at ``at``, not at
        whatever a zeroed handle (offset 0) would have sent the read to."""
        try:
            h = blk.handle(i)
        except ValueError:
            raise CorruptedData("malformed block handle", self.name, at) from None
        if h.size == 0 or h.offset + h.size + BLOCK_TRAILER_LEN > at:
            raise CorruptedData(f"damaged index: entry {i} names a block at offset {h.offset} of {h.size} bytes, "
                                f"which is not before the index block", self.name, at)
        return h

    def cached_block(self, offset: int, size: int):
        ck = (self.cache_id, offset)
        b = self.cache.get(ck)
        if b is None:
            b = self.load(offset, size)
            self.cache.put(ck, b)
        return b

    def nparts(self) -> int:
        return len(self.top) if self.two_level else 1

    def partition(self, p: int):
        """(index partition ``p``, its file offset)."""
        if not self.two_level:
            return self.top, self.index_offset
        h = self._handles[p]
        return self.partition_block(p), h.offset

    def partition_block(self, p: int):
        """Index partition ``p`` of a two-level index, through the cache."""
        h = self._handles[p]
        ck = (self.cache_id, h.offset)
        b = self.cache.get(ck)
        if b is None:
            b = self.load(h.offset, h.size, self.index_internal, False)
            self.cache.put(ck, b)
        return b

    def block_handles(self, p: int) -> list[BlockHandle]:
        part, at = self.partition(p)
        return [self._handle_at(part, j, at) for j in range(len(part))]

    def blocks(self, start: bytes = b"") -> Iterator:
        """Decoded data blocks (through the cache) from the one that may hold ``start`` on."""
        p = self.top.find(start) if self.two_level else 0
        first = True
        while p < self.nparts():
            part, at = self.partition(p)
            for j in range(part.find(start) if first else 0, len(part)):
                h = self._handle_at(part, j, at)
                yield self.cached_block(h.offset, h.size)
            first = False
            p += 1

    def scan(self, start: bytes = b"", decode=None) -> Iterator[tuple[bytes, object]]:
        first = True
        for blk in self.blocks(start):
            ei = blk.find(start) if first else 0
            first = False
            if decode is None:
                yield from blk.iter_from(ei)
            else:
                name = self.name
                for k, v in blk.iter_from(ei):
                    yield k, decode(v, name)

    def get(self, key: bytes) -> bytes | None:
        if self.two_level:
            p = self.top.find(key)
            if p >= len(self._handles):
                return None
        else:
            p = 0
        part, at = self.partition(p)
        bi = part.find(key)
        if bi >= len(part):
            return None
        h = self._handle_at(part, bi, at)
        return self.cached_block(h.offset, h.size).get(key)

    def records_digest(self, suffix: bytes = b"") -> str:
        h = hashlib.sha256()
        for blk in self.blocks():
            h.update(record_id_input(blk.keys, blk.values))
        h.update(suffix)
        return h.hexdigest()
