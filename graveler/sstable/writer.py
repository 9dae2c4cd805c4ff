"""Writing SSTables in the flavour lakeFS writes (Pebble, TableFormatRocksDBv2).

4 KiB data blocks closed by Pebble's flush rule, restart interval 16 in data
blocks and 1 in index blocks, Snappy where it saves at least 1/8, CRC32C
trailers, internal keys with seqnum 0 / kind SET, shortened index separators,
a two-level index once the index outgrows one block, Pebble's property set plus
the caller's properties, and the RocksDB v2 footer.

This is the reference writer: ``_ctable.TableBuilder`` writes the same bytes
compiled, and :mod:`graveler.sstable.kernel` chooses between them
(:class:`HashedSSTableWriter` is the reference of the builder).
"""

from __future__ import annotations

import hashlib
import struct

from graveler.errors import InvalidArgument
from graveler.sstable.block import PyBlockBuilder, py_should_flush
from graveler.sstable.format import (
    INDEX_TYPE_BINARY_SEARCH,
    INDEX_TYPE_TWO_LEVEL,
    SEPARATOR_TRAILER,
    SET_TRAILER,
    BlockHandle,
    block_trailer,
    compress_block,
    encode_footer_v2,
    uvarint_bytes,
)

BLOCK_SIZE = 4096
_COMPRESSION_OPTIONS = (
    b"window_bits=-14; level=32767; strategy=0; max_dict_bytes=0; zstd_max_train_bytes=0; enabled=0; "
)
_PROPS_RESTART_INTERVAL = 1 << 31  # one restart point: what Pebble does for the properties block


def separator(a: bytes, b: bytes) -> bytes:
    """Pebble's bytewise Separator: a short key k with a <= k < b (or a itself)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    if i >= n:
        return a  # one is a prefix of the other
    if a[i] >= b[i]:
        return a
    if i < len(b) - 1 or a[i] + 1 < b[i]:
        return a[:i] + bytes((a[i] + 1,))
    for j in range(i + 1, len(a)):
        if a[j] != 0xFF:
            return a[:j] + bytes((a[j] + 1,))
    return a


def successor(a: bytes) -> bytes:
    """Pebble's bytewise Successor: a short key k >= a."""
    for i, c in enumerate(a):
        if c != 0xFF:
            return a[:i] + bytes((c + 1,))
    return a


def _index_key(last: bytes, sep: bytes) -> bytes:
    """The internal key Pebble puts in the index for a block ending at ``last``."""
    if len(sep) <= len(last) and last < sep:
        return sep + SEPARATOR_TRAILER
    return last + SET_TRAILER


def py_index_key(last: bytes, following: bytes) -> bytes:
    """The index entry key for a data block ending at ``last`` when ``following`` comes next."""
    return _index_key(last, separator(last, following))


class SSTableWriter:
    """Builds one table in memory.  Keys must be strictly increasing user keys."""

    # The block codec: the reference's own (a test may put the compiled one here, see tests/test_native.py).
    block_builder = PyBlockBuilder
    should_flush = staticmethod(py_should_flush)
    index_key = staticmethod(py_index_key)

    def __init__(self, compression: bool = True, block_size: int = BLOCK_SIZE):
        self._compress = compression
        self._block_size = block_size
        self._threshold = (block_size * 90 + 99) // 100
        self._out = bytearray()
        self._data = self.block_builder(16)
        self._index = self.block_builder(1)
        self._partitions: list[tuple[bytes, bytes]] = []  # (last index key, finished partition bytes)
        self._pending: BlockHandle | None = None  # the last data block, waiting for its separator
        self._pending_last = b""
        self._last_key: bytes | None = None
        self.num_entries = 0
        self.num_data_blocks = 0
        self.raw_key_size = 0
        self.raw_value_size = 0
        self.data_size = 0
        self.first_key: bytes | None = None
        self._verbatim: tuple[int, int] | None = None  # (stored, decoded) size of a block just copied verbatim

    # -- adding records ---------------------------------------------------------------------
    def add(self, key: bytes, value: bytes) -> None:
        last = self._last_key
        if last is not None and key <= last:
            raise InvalidArgument(f"SSTable keys must be strictly increasing: {key!r} after {last!r}")
        ikey = key + SET_TRAILER
        self._verbatim = None
        data = self._data
        if data.size > self._threshold and data.should_flush(len(ikey), len(value), self._block_size,
                                                             self._threshold):
            self._flush_data_block()
        if self._pending is not None:
            self._add_index_entry(self.index_key(self._pending_last, key))
        self._data.add(ikey, value)
        if last is None:
            self.first_key = key
        self._last_key = key
        self.num_entries += 1
        self.raw_key_size += len(ikey)
        self.raw_value_size += len(value)

    @property
    def last_key(self) -> bytes | None:
        return self._last_key

    def estimated_size(self) -> int:
        """Pebble's EstimatedSize(): bytes written + the open data block + the open index block."""
        v = self._verbatim
        if v is not None:  # a verbatim block counts as still open, as it would be
            return len(self._out) - v[0] + v[1] + self._index.size
        return len(self._out) + self._data.size + self._index.size

    def append_block_canonical(self, raw: bytes, keys: list[bytes], values: list[bytes], nbytes: int,
                               next_key: bytes | None, next_value_len: int, max_estimate: int) -> bool:
        """Append a finished data block verbatim, if that is exactly what adding its records would write.

        ``raw`` is the block's stored bytes with trailer, ``nbytes`` its decoded size,
        ``keys``/``values`` its records; ``next_key``/``next_value_len`` describe
        the record that will follow it (None: unknown).  The block is copied only
        when Pebble's rules would start a fresh block at its first record, end it
        right before the next record, and the size estimate stays below
        ``max_estimate`` -- so the file comes out byte-identical to writing the
        records one by one.  Returns False (having changed nothing observable)
        otherwise; the caller then adds the records itself.
        """
        if next_key is None:
            return False
        n = len(keys)
        return self.append_block_summary(raw, keys[0], len(values[0]), keys[-1], n, sum(map(len, keys)) + 8 * n,
                                         sum(map(len, values)), nbytes, next_key, next_value_len, max_estimate)

    def append_block_summary(self, raw: bytes, first_key: bytes, first_value_len: int, last_key: bytes, n: int,
                             raw_key_size: int, raw_value_size: int, nbytes: int, next_key: bytes | None,
                             next_value_len: int, max_estimate: int) -> bool:
        """``append_block_canonical`` given a summary of the block's records instead of the records:
        first key, its value's length, last key, count, key bytes (8-byte trailers included), value bytes."""
        if next_key is None:
            return False
        data = self._data
        # (a) the open block would be closed before this block's first record
        if data.n_entries and not data.should_flush(len(first_key) + 8, first_value_len, self._block_size,
                                                     self._threshold):
            return False
        # (b) the block would be closed before the record after it
        if not self.should_flush(n, nbytes, 16, len(next_key) + 8, next_value_len, self._block_size,
                                 self._threshold):
            return False
        last = self._last_key
        if last is not None and first_key <= last:
            raise InvalidArgument(f"SSTable keys must be strictly increasing: {first_key!r} after {last!r}")
        self._flush_data_block()
        if self._pending is not None:
            self._add_index_entry(self.index_key(self._pending_last, first_key))
        # (c) no size-based range break inside the block (checked against the estimate at its end)
        if len(self._out) + nbytes + self._index.size >= max_estimate:
            return False  # the caller adds the records: the flush and index entry above are what it would do
        h = BlockHandle(len(self._out), len(raw) - 5)
        self._out += raw
        self._verbatim = (len(raw), nbytes)
        self.num_data_blocks += 1
        self._pending = h
        self._pending_last = last_key
        if last is None:
            self.first_key = first_key
        self._last_key = last_key
        self.num_entries += n
        self.raw_key_size += raw_key_size
        self.raw_value_size += raw_value_size
        return True

    # -- internals --------------------------------------------------------------------------
    def _write_block(self, contents: bytes, compress: bool) -> BlockHandle:
        body, ctype = compress_block(contents, compress)
        h = BlockHandle(len(self._out), len(body))
        self._out += body
        self._out += block_trailer(body, ctype)
        return h

    def _flush_data_block(self) -> None:
        if self._data.n_entries == 0:
            return
        h = self._write_block(self._data.finish(), self._compress)
        self.num_data_blocks += 1
        self._pending = h
        self._pending_last = self._last_key or b""
        self._data.reset()

    def _add_index_entry(self, ikey: bytes) -> None:
        handle = self._pending.encode()
        self._pending = None
        if self._index.should_flush(len(ikey), len(handle), self._block_size, self._threshold):
            self._finish_partition()
        self._index.add(ikey, handle)

    def _finish_partition(self) -> None:
        self._partitions.append((self._index.last_key, self._index.finish()))
        self._index.reset()

    # -- finishing --------------------------------------------------------------------------
    def finish(self, user_properties: dict[str, bytes] | None = None) -> bytes:
        """Close the table and return its bytes."""
        self._verbatim = None
        self._flush_data_block()
        if self._pending is not None:
            self._add_index_entry(_index_key(self._pending_last, successor(self._pending_last)))
        self.data_size = len(self._out)
        two_level = bool(self._partitions)
        if two_level:
            self._finish_partition()
            top = self.block_builder(1)
            index_size = 0
            # Pebble counts index sizes uncompressed, plus one trailer.
            for last_key, part in self._partitions:
                h = self._write_block(part, self._compress)
                index_size += len(part)
                top.add(last_key, h.encode())
            top_contents = top.finish()
            index_handle = self._write_block(top_contents, self._compress)
            index_size += len(top_contents) + 5
        else:
            contents = self._index.finish()
            index_handle = self._write_block(contents, self._compress)
            index_size = len(contents) + 5

        props = pebble_properties(two_level, self._compress, self.data_size, index_size, self.num_data_blocks,
                                  self.num_entries, self.raw_key_size, self.raw_value_size,
                                  len(self._partitions) if two_level else 0,
                                  len(top_contents) if two_level else 0, user_properties)
        pb = self.block_builder(_PROPS_RESTART_INTERVAL)
        for k in sorted(props):
            pb.add(k, props[k])
        props_handle = self._write_block(pb.finish(), False)
        mb = self.block_builder(1)
        mb.add(b"rocksdb.properties", props_handle.encode())
        meta_handle = self._write_block(mb.finish(), False)
        self._out += encode_footer_v2(meta_handle, index_handle)
        out = bytes(self._out)
        self._out = bytearray()
        return out


class HashedSSTableWriter(SSTableWriter):
    """An SSTableWriter that hashes its records' table-ID input as it writes them: the reference of
    ``_ctable.TableBuilder`` (same constructor, ``digest``, ``checkpoint_data``; the same bytes and ID)."""

    def __init__(self, compression: bool = True, block_size: int = BLOCK_SIZE, hashed: bool = True,
                 checkpoints: bool = False):
        super().__init__(compression, block_size)
        self._hash = hashlib.sha256() if hashed else None

    def add(self, key: bytes, value: bytes) -> None:
        super().add(key, value)
        if self._hash is not None:
            self._hash.update(b"%d%s|%d%s|" % (len(key), key, len(value), value))

    def append_block_canonical(self, raw: bytes, keys: list[bytes], values: list[bytes], nbytes: int,
                               next_key: bytes | None, next_value_len: int, max_estimate: int) -> bool:
        done = super().append_block_canonical(raw, keys, values, nbytes, next_key, next_value_len, max_estimate)
        if done and self._hash is not None:
            self._hash.update(b"".join([b"%d%s|%d%s|" % (len(k), k, len(v), v) for k, v in zip(keys, values)]))
        return done

    def digest(self, suffix: bytes = b"") -> str:
        """The hex SHA-256 of the records' ID input so far, then ``suffix`` (the writer goes on unchanged)."""
        h = self._hash.copy()
        h.update(suffix)
        return h.hexdigest()

    def checkpoint_data(self) -> bytes:
        return b""  # the reference records no checkpoints


def pebble_properties(two_level: bool, compressed: bool, data_size: int, index_size: int, num_data_blocks: int,
                      num_entries: int, raw_key_size: int, raw_value_size: int, partitions: int, top_index_size: int,
                      user_properties: dict | None) -> dict[bytes, bytes]:
    """The properties block Pebble writes for a table with these figures, plus the caller's properties."""
    props: dict[bytes, bytes] = {
        b"rocksdb.block.based.table.index.type": struct.pack(
            "<I", INDEX_TYPE_TWO_LEVEL if two_level else INDEX_TYPE_BINARY_SEARCH
        ),
        b"rocksdb.block.based.table.prefix.filtering": b"0",
        b"rocksdb.block.based.table.whole.key.filtering": b"0",
        b"rocksdb.column.family.id": uvarint_bytes(2147483647),
        b"rocksdb.comparator": b"leveldb.BytewiseComparator",
        b"rocksdb.compression": b"Snappy" if compressed else b"NoCompression",
        b"rocksdb.compression_options": _COMPRESSION_OPTIONS,
        b"rocksdb.creation.time": b"\x00",
        b"rocksdb.data.size": uvarint_bytes(data_size),
        b"rocksdb.deleted.keys": b"\x00",
        b"rocksdb.external_sst_file.global_seqno": b"\x00" * 8,
        b"rocksdb.external_sst_file.version": struct.pack("<I", 2),
        b"rocksdb.filter.size": b"\x00",
        b"rocksdb.fixed.key.length": b"\x00",
        b"rocksdb.format.version": b"\x00",
        b"rocksdb.index.key.is.user.key": b"\x00",
        b"rocksdb.index.size": uvarint_bytes(index_size),
        b"rocksdb.index.value.is.delta.encoded": b"\x00",
        b"rocksdb.merge.operands": b"\x00",
        b"rocksdb.merge.operator": b"pebble.concatenate",
        b"rocksdb.num.data.blocks": uvarint_bytes(num_data_blocks),
        b"rocksdb.num.entries": uvarint_bytes(num_entries),
        b"rocksdb.num.range-deletions": b"\x00",
        b"rocksdb.oldest.key.time": b"\x00",
        b"rocksdb.prefix.extractor.name": b"nullptr",
        b"rocksdb.property.collectors": b"[static]",
        b"rocksdb.raw.key.size": uvarint_bytes(raw_key_size),
        b"rocksdb.raw.value.size": uvarint_bytes(raw_value_size),
    }
    if two_level:
        props[b"rocksdb.index.partitions"] = uvarint_bytes(partitions)
        props[b"rocksdb.top-level.index.size"] = uvarint_bytes(top_index_size)
    for k, v in (user_properties or {}).items():
        props[k.encode("utf-8") if isinstance(k, str) else k] = v
    return props
