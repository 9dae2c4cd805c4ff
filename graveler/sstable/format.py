"""Low-level pieces of the RocksDB block-based table format, as Pebble writes it.

Only the ``graveler.sstable`` package knows table bytes; everything here is
private to it.  See ``shared/docs/FORMAT.md`` for the layout.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import cramjam
import google_crc32c

from graveler.errors import CorruptedData, UnsupportedFormat
from graveler.varint import get_uvarint, put_uvarint, uvarint_bytes, uvarint_len  # noqa: F401 (the sstable package's names)

ROCKSDB_MAGIC = bytes.fromhex("f7cff485b741e288")
LEVELDB_MAGIC = bytes.fromhex("57fb808b247547db")
ROCKSDB_FOOTER_LEN = 53
LEVELDB_FOOTER_LEN = 48
BLOCK_TRAILER_LEN = 5

CHECKSUM_NONE = 0
CHECKSUM_CRC32C = 1

COMPRESSION_NONE = 0
COMPRESSION_SNAPPY = 1
# RocksDB's other block compressions and checksums: healthy tables lakefuse does not read
_COMPRESSIONS = {2: "zlib", 3: "bzip2", 4: "LZ4", 5: "LZ4HC", 6: "XPRESS", 7: "ZSTD"}
_CHECKSUMS = {2: "xxHash", 3: "xxHash64", 4: "XXH3"}


def compression_error(ctype: int, name: str, off: int) -> CorruptedData:
    """A block's compression type byte lakefuse does not decompress: another of RocksDB's
    (UnsupportedFormat) or no compression at all (CorruptedData)."""
    if ctype in _COMPRESSIONS:
        return UnsupportedFormat(f"{_COMPRESSIONS[ctype]} compression is not supported (lakefuse reads Snappy "
                                 "and uncompressed blocks, as lakeFS writes them)", name, off)
    return CorruptedData(f"unknown compression type {ctype}", name, off)

# Internal-key trailers: (seqnum << 8) | kind, little-endian.
KIND_SET = 1
KIND_SEPARATOR = 17
SEQNUM_MAX = (1 << 56) - 1
SET_TRAILER = struct.pack("<Q", KIND_SET)  # seqnum 0, kind SET: what lakeFS writes
SEPARATOR_TRAILER = struct.pack("<Q", (SEQNUM_MAX << 8) | KIND_SEPARATOR)

INDEX_TYPE_BINARY_SEARCH = 0
INDEX_TYPE_TWO_LEVEL = 2

_U32 = struct.Struct("<I")
_CRC_MASK_DELTA = 0xA282EAD8

if google_crc32c.implementation != "c":  # pragma: no cover - packaging problem
    raise ImportError("google-crc32c has no C implementation here; SSTable checksums would be too slow")

crc32c = google_crc32c.value
crc32c_extend = google_crc32c.extend


def mask_crc(c: int) -> int:
    return (((c >> 15) | (c << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class BlockHandle:
    offset: int
    size: int

    def encode(self) -> bytes:
        out = bytearray()
        put_uvarint(out, self.offset)
        put_uvarint(out, self.size)
        return bytes(out)

    @staticmethod
    def decode(buf, pos: int = 0) -> tuple["BlockHandle", int]:
        off, pos = get_uvarint(buf, pos)
        size, pos = get_uvarint(buf, pos)
        return BlockHandle(off, size), pos


@dataclass(frozen=True, slots=True)
class Footer:
    magic: str  # "rocksdb" | "leveldb"
    version: int
    checksum_type: int
    metaindex: BlockHandle
    index: BlockHandle


def decode_footer(buf, name: str) -> Footer:
    n = len(buf)
    if n < LEVELDB_FOOTER_LEN:
        raise CorruptedData(f"file too short for an SSTable footer ({n} bytes)", name, 0)
    tail = bytes(buf[n - 8 : n])
    try:
        if tail == ROCKSDB_MAGIC:
            if n < ROCKSDB_FOOTER_LEN:
                raise CorruptedData("file too short for a RocksDB footer", name, 0)
            start = n - ROCKSDB_FOOTER_LEN
            foot = bytes(buf[start:n])
            version = _U32.unpack_from(foot, 41)[0]
            if version == 0:
                # RocksDB's legacy footer shape with the RocksDB magic (format_version 0).
                start = n - LEVELDB_FOOTER_LEN
                foot = bytes(buf[start:n])
                checksum, pos = CHECKSUM_CRC32C, 0
            else:
                checksum = foot[0]
                pos = 1
            if checksum not in (CHECKSUM_NONE, CHECKSUM_CRC32C):
                if checksum in _CHECKSUMS:
                    raise UnsupportedFormat(f"{_CHECKSUMS[checksum]} block checksums are not supported (lakefuse "
                                            "reads CRC32C, as lakeFS writes them)", name, start)
                raise CorruptedData(f"unknown checksum type {checksum}", name, start)
            metaindex, pos = BlockHandle.decode(foot, pos)
            index, pos = BlockHandle.decode(foot, pos)
            if pos > (41 if version else 40):
                raise CorruptedData("block handles overrun the footer", name, start)
            _check_footer_handles(metaindex, index, start, name)
            return Footer("rocksdb", version, checksum, metaindex, index)
        if tail == LEVELDB_MAGIC:
            start = n - LEVELDB_FOOTER_LEN
            foot = bytes(buf[start:n])
            metaindex, pos = BlockHandle.decode(foot, 0)
            index, pos = BlockHandle.decode(foot, pos)
            if pos > 40:
                raise CorruptedData("block handles overrun the footer", name, start)
            _check_footer_handles(metaindex, index, start, name)
            return Footer("leveldb", 0, CHECKSUM_CRC32C, metaindex, index)
    except (IndexError, ValueError) as e:
        raise CorruptedData(f"malformed footer ({e})", name, n - LEVELDB_FOOTER_LEN) from None
    raise CorruptedData(f"bad magic {tail.hex()}: not an SSTable", name, n - 8)


def encode_footer_v2(metaindex: BlockHandle, index: BlockHandle) -> bytes:
    body = bytearray([CHECKSUM_CRC32C])
    body += metaindex.encode()
    body += index.encode()
    body += b"\x00" * (41 - len(body))
    body += _U32.pack(2)
    body += ROCKSDB_MAGIC
    return bytes(body)


def _check_footer_handles(metaindex: BlockHandle, index: BlockHandle, start: int, name: str) -> None:
    """The metaindex and index blocks are not empty and lie before the footer (at ``start``), else
    the footer is damaged: said at its offset, not where a zeroed handle (0, 0) would send a read."""
    for what, h in (("metaindex", metaindex), ("index", index)):
        if h.size == 0 or h.offset + h.size + BLOCK_TRAILER_LEN > start:
            raise CorruptedData(f"damaged footer: its {what} handle names offset {h.offset}, {h.size} bytes, "
                                "not a block before it", name, start)


def read_block(buf, handle: BlockHandle, checksum_type: int, name: str) -> bytes:
    """Read, verify and decompress the block at ``handle``; returns its contents."""
    off, size = handle.offset, handle.size
    end = off + size
    if end + BLOCK_TRAILER_LEN > len(buf) or off < 0:
        raise CorruptedData(
            f"block handle (offset {off}, size {size}) points past the end of the file ({len(buf)} bytes)", name, off
        )
    raw = bytes(buf[off : end + 1])  # block contents + compression type byte
    if checksum_type == CHECKSUM_CRC32C:
        stored = _U32.unpack_from(buf, end + 1)[0]
        if mask_crc(crc32c(raw)) != stored:
            raise CorruptedData("block checksum mismatch", name, off)
    ctype = raw[-1]
    if ctype == COMPRESSION_NONE:
        return raw[:-1]
    if ctype == COMPRESSION_SNAPPY:
        try:
            return bytes(cramjam.snappy.decompress_raw(raw[:-1]))
        except Exception as e:  # cramjam raises its own DecompressionError
            raise CorruptedData(f"bad Snappy block ({e})", name, off) from None
    raise compression_error(ctype, name, off)


def compress_block(contents: bytes, allow_snappy: bool = True) -> tuple[bytes, int]:
    """Compress as Pebble does: Snappy only if it saves at least 1/8."""
    if allow_snappy:
        compressed = bytes(cramjam.snappy.compress_raw(contents))
        if len(compressed) < len(contents) - len(contents) // 8:
            return compressed, COMPRESSION_SNAPPY
    return contents, COMPRESSION_NONE


def block_trailer(body: bytes, ctype: int) -> bytes:
    crc = crc32c_extend(crc32c(body), bytes((ctype,)))
    return bytes((ctype,)) + _U32.pack(mask_crc(crc))
