"""Reading block-based SSTables (RocksDB v2 / LevelDB footers, one- and two-level indexes).

A table is read from a bytes-like buffer (bytes or an mmap of a cached file).
Opening it decodes the footer, the metaindex, the properties and the top-level
index; data blocks (and index partitions) are read, verified and decoded only
when a lookup or an iterator enters them, and kept in a shared LRU of decoded
blocks so hot lookups never touch the buffer again.

Lookups, scans and the ID hash go through the table's core (the compiled
``_cblock.TableCore`` or the reference :class:`graveler.sstable.core.PyTableCore`,
as :mod:`graveler.sstable.kernel` selected). Values are bytes here: a scan can
hand each one to a decoder its caller supplies (the layer that owns values).
"""

from __future__ import annotations

import itertools
import struct
from typing import Callable, Iterator

from graveler.errors import CorruptedData, UnsupportedFormat
from graveler.lru import LRU
from graveler.sstable import kernel
from graveler.sstable.kernel import Block
from graveler.sstable.format import (
    BLOCK_TRAILER_LEN,
    INDEX_TYPE_TWO_LEVEL,
    BlockHandle,
    decode_footer,
    get_uvarint,
    read_block,
)

PROPERTIES_BLOCK = b"rocksdb.properties"

# Properties that RocksDB / Pebble store as uvarints, fixed32 or fixed64; the rest are strings.
_UVARINT_PROPS = {
    "rocksdb.column.family.id", "rocksdb.creation.time", "rocksdb.data.size", "rocksdb.deleted.keys",
    "rocksdb.filter.size", "rocksdb.fixed.key.length", "rocksdb.format.version",
    "rocksdb.index.key.is.user.key", "rocksdb.index.size", "rocksdb.index.value.is.delta.encoded",
    "rocksdb.merge.operands", "rocksdb.num.data.blocks", "rocksdb.num.entries",
    "rocksdb.num.range-deletions", "rocksdb.oldest.key.time", "rocksdb.raw.key.size",
    "rocksdb.raw.value.size", "rocksdb.index.partitions", "rocksdb.top-level.index.size",
    "rocksdb.file.creation.time", "rocksdb.num.filter_entries", "rocksdb.original.file.number",
    "rocksdb.tail.start.offset", "rocksdb.fast.compression.estimated.data.size",
    "rocksdb.slow.compression.estimated.data.size", "rocksdb.key.largest.seqno",
}
_FIXED32_PROPS = {"rocksdb.block.based.table.index.type", "rocksdb.external_sst_file.version"}


def decode_property(name: str, raw: bytes) -> int | str | bytes:
    """Decode a property value the way RocksDB's tools show it."""
    try:
        if name in _UVARINT_PROPS:
            v, pos = get_uvarint(raw, 0)
            if pos == len(raw):
                return v
        elif name in _FIXED32_PROPS and len(raw) == 4:
            return struct.unpack("<I", raw)[0]
    except (IndexError, ValueError):
        pass
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _block_weight(b: Block) -> int:
    return b.nbytes


class BlockCache(LRU[tuple, Block]):
    """A thread-safe LRU of decoded blocks, bounded by their encoded size in bytes."""

    __slots__ = ()

    def __init__(self, max_bytes: int = 256 << 20):
        super().__init__(max_bytes, _block_weight)


DEFAULT_BLOCK_CACHE = BlockCache()
_anon_ids = itertools.count()


class SSTable:
    """One open table.  Thread-safe for reads.

    ``cache_key`` names the table in the block cache; pass the range or
    metarange ID so reopening the same immutable file reuses its blocks.
    """

    # The sstable layer's implementation (graveler.sstable.kernel; a test may set the other one here).
    kernel = kernel.selected

    def __init__(self, buf, name: str = "<sstable>", cache_key: str | None = None,
                 block_cache: BlockCache | None = None):
        self.buf = buf
        self.name = name
        self.size = len(buf)
        self._cache = block_cache if block_cache is not None else DEFAULT_BLOCK_CACHE
        self._cache_id = cache_key if cache_key is not None else f"anon-{next(_anon_ids)}"
        self.blocks_read = 0  # data and index-partition blocks read from the buffer (not the cache)
        self.footer = decode_footer(buf, name)
        meta = self._decode(self.footer.metaindex, internal_keys=False)
        self.raw_properties: dict[str, bytes] = {}
        for k, v in zip(meta.keys, meta.values):
            if k == PROPERTIES_BLOCK:
                handle = self._handle(v, self.footer.metaindex.offset)
                props = self._decode(handle, internal_keys=False)
                for pk, pv in zip(props.keys, props.values):
                    self.raw_properties[pk.decode("utf-8", "replace")] = pv
        idx_type = decode_property(
            "rocksdb.block.based.table.index.type",
            self.raw_properties.get("rocksdb.block.based.table.index.type", b"\0\0\0\0"),
        )
        if self.raw_properties.get("rocksdb.index.value.is.delta.encoded", b"\0") not in (b"\0", b""):
            raise UnsupportedFormat("delta-encoded index values (RocksDB's format_version 4 and later) are not "
                                    "supported", name, self.footer.index.offset)
        self.two_level = idx_type == INDEX_TYPE_TWO_LEVEL
        # format_version 3 on: index keys may be user keys, without the internal-key trailer
        self.index_internal = self.raw_properties.get("rocksdb.index.key.is.user.key", b"\0") in (b"\0", b"")
        top = self._decode(self.footer.index, internal_keys=self.index_internal)
        self._top = top
        self._top_handles = [self._handle_at(top, i, self.footer.index.offset) for i in range(len(top))]
        # For a single-level index the top index *is* the one partition.
        self._single = top if not self.two_level else None
        # Lookups and scans: the selected implementation's core.
        self._core = self.kernel.TableCore(top, self.two_level, self._cache, self._cache_id, self._load_block,
                                           self.name, self.footer.index.offset, self, buf,
                                           self.footer.checksum_type, self.index_internal)
        self.get = self._core.get  # no Python frame on the lookup path

    # -- plumbing -------------------------------------------------------------------------
    def _handle(self, raw: bytes, at: int) -> BlockHandle:
        """A handle read from the block at ``at`` (the metaindex): what it names lies before it."""
        try:
            h, pos = BlockHandle.decode(raw, 0)
        except (IndexError, ValueError):
            raise CorruptedData("malformed block handle", self.name, at) from None
        if h.size == 0 or h.offset + h.size + BLOCK_TRAILER_LEN > at:
            raise CorruptedData(f"damaged metaindex: it names a block at offset {h.offset} of {h.size} bytes, "
                                "which is not before it", self.name, at)
        return h

    def _handle_at(self, blk: Block, i: int, at: int) -> BlockHandle:
        try:
            h = blk.handle(i)
        except ValueError:
            raise CorruptedData("malformed block handle", self.name, at) from None
        if h.size == 0 or h.offset + h.size + BLOCK_TRAILER_LEN > at:  # (as the compiled reader's handle_of)
            raise CorruptedData(f"damaged index: entry {i} names a block at offset {h.offset} of {h.size} bytes, "
                                "which is not before the index block", self.name, at)
        return h

    def _decode(self, handle: BlockHandle, internal_keys: bool, data: bool = False) -> Block:
        raw = read_block(self.buf, handle, self.footer.checksum_type, self.name)
        return self.kernel.decode_block(raw, self.name, handle.offset, internal_keys, data)

    def _load_block(self, offset: int, size: int, internal_keys: bool = True, data: bool = True) -> Block:
        """A data block or index partition from the buffer (a block-cache miss; an index
        partition's keys are internal keys unless the table's index holds user keys)."""
        b = self._decode(BlockHandle(offset, size), internal_keys=internal_keys, data=data)
        self.blocks_read += 1
        return b

    def _cached_block(self, handle: BlockHandle) -> Block:
        return self._core.cached_block(handle.offset, handle.size)

    def _partition(self, i: int) -> Block:
        """Index partition ``i``: separator keys -> data-block handles."""
        if self._single is not None:
            return self._single
        return self._core.partition_block(i)

    def _partition_offset(self, i: int) -> int:
        return self.footer.index.offset if self._single is not None else self._top_handles[i].offset

    def _partition_handles(self, i: int) -> list[BlockHandle]:
        part, at = self._partition(i), self._partition_offset(i)
        return [self._handle_at(part, j, at) for j in range(len(part))]

    def _num_partitions(self) -> int:
        return 1 if self._single is not None else len(self._top_handles)

    # -- public API ------------------------------------------------------------------------
    @property
    def properties(self) -> dict[str, int | str | bytes]:
        return {k: decode_property(k, v) for k, v in self.raw_properties.items()}

    def get_property(self, name: str) -> bytes | None:
        return self.raw_properties.get(name)

    def seek_ge(self, key: bytes = b"", decode: Callable | None = None) -> Iterator[tuple[bytes, object]]:
        """Records with key >= ``key`` in order, as (user key, value bytes); with ``decode``, each value
        becomes ``decode(value bytes, table name)`` (a decoder with a ``c_decoder`` capsule is called from C
        by the compiled scan, see ``_cblock.pxd``)."""
        return self._core.scan(key, decode)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        return self.seek_ge(b"")

    def iter_blocks(self, start: bytes = b"") -> Iterator[Block]:
        """Decoded data blocks from the one that may hold ``start`` on (fast scans)."""
        nparts = self._num_partitions()
        p = 0 if self._single is not None else self._top.find(start)
        first = True
        while p < nparts:
            part = self._partition(p)
            at = self._partition_offset(p)
            bi = part.find(start) if first else 0
            first = False
            for j in range(bi, len(part)):
                yield self._cached_block(self._handle_at(part, j, at))
            p += 1

    def data_block_handles(self) -> list[BlockHandle]:
        """Handles of every data block, in key order (reads the index partitions, not the blocks)."""
        out: list[BlockHandle] = []
        for p in range(self._num_partitions()):
            out.extend(self._partition_handles(p))
        return out

    def raw_block(self, h: BlockHandle) -> bytes:
        """A data block's stored bytes, trailer included (not verified, not decoded)."""
        return bytes(self.buf[h.offset : h.offset + h.size + 5])

    def block(self, h: BlockHandle) -> Block:
        """A data block, verified and decoded (through the block cache)."""
        return self._cached_block(h)

    @property
    def crc32c_trailers(self) -> bool:
        """Whether blocks carry CRC32C trailers (so they can be copied into our files verbatim)."""
        from graveler.sstable.format import CHECKSUM_CRC32C

        return self.footer.checksum_type == CHECKSUM_CRC32C

    def get(self, key: bytes) -> bytes | None:
        """The value stored under exactly ``key``, or None (the core's ``get``, bound in ``__init__``)."""
        return self._core.get(key)

    def records_digest(self, suffix: bytes = b"") -> str:
        """The hex SHA-256 of every record's table-ID input (``len(key) key | len(value) value |``, lengths in
        decimal) in order, then ``suffix``: a range's or metarange's ID, given its properties' encoding."""
        return self._core.records_digest(suffix)

    def verify_checksums(self) -> int:
        """Check every data block's checksum without decoding it; returns the number of blocks."""
        from graveler.sstable.format import CHECKSUM_CRC32C, crc32c, mask_crc

        n = 0
        for p in range(self._num_partitions()):
            for h in self._partition_handles(p):
                end = h.offset + h.size
                if end + 5 > self.size:
                    raise CorruptedData("block handle points past the end of the file", self.name, h.offset)
                if self.footer.checksum_type == CHECKSUM_CRC32C:
                    stored = struct.unpack_from("<I", self.buf, end + 1)[0]
                    if mask_crc(crc32c(bytes(self.buf[h.offset:end + 1]))) != stored:
                        raise CorruptedData("block checksum mismatch", self.name, h.offset)
                n += 1
        return n
