"""Encoding and decoding of one table block (data, index, metaindex, properties).

Two implementations with one behaviour: the compiled one in ``_cblock.pyx``
(the default) and the pure-Python reference here (``PyBlock``,
``py_decode_block``, ``PyBlockBuilder``, ``py_should_flush``);
:mod:`graveler.sstable.kernel` selects one.
"""

from __future__ import annotations

import struct
from bisect import bisect_left

from graveler.errors import CorruptedData, UnsupportedFormat
from graveler.sstable.format import BlockHandle, get_uvarint, put_uvarint, uvarint_len

_U32 = struct.Struct("<I")
HASH_INDEX_FLAG = 1 << 31  # the restart count's top bit: the data block carries RocksDB's hash index
KIND_VALUE = 1  # an internal key's kind (the low byte of its trailer): a value; RocksDB's others below
_KINDS = {0: "a deletion", 2: "a merge operand", 7: "a single deletion", 0x11: "a blob index"}


def not_a_value(kind: int, key: bytes, name: str, offset: int) -> UnsupportedFormat:
    """A record that is not a value (a deletion, a merge operand...): a RocksDB table lakeFS never
    writes; shown as a value it would list a deleted key as present."""
    what = _KINDS.get(kind, f"of kind {kind}")
    return UnsupportedFormat(f"the table holds {what} (key {key[:64]!r}): lakefuse reads tables of values, "
                             "as lakeFS writes them", name, offset)


class PyBlock:
    """A decoded block: parallel lists of keys and values, in file order.

    Internal-key trailers are already stripped from the keys of data and index
    blocks (lakeFS keys are unique user keys, so ordering by user key is exact).
    """

    __slots__ = ("keys", "values", "nbytes", "_handles")

    def __init__(self, keys: list[bytes], values: list[bytes], nbytes: int):
        self.keys = keys
        self.values = values
        self.nbytes = nbytes
        self._handles: list[BlockHandle] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, key: bytes) -> int:
        """Index of the first record whose key is >= ``key``."""
        return bisect_left(self.keys, key)

    seek_ge = find

    def get(self, key: bytes) -> bytes | None:
        keys = self.keys
        i = bisect_left(keys, key)
        if i < len(keys) and keys[i] == key:
            return self.values[i]
        return None

    def key_at(self, i: int) -> bytes:
        return self.keys[i]

    def value_at(self, i: int) -> bytes:
        return self.values[i]

    def handle(self, i: int) -> BlockHandle:
        """Record ``i``'s value as a BlockHandle (index blocks); ValueError if it is not one."""
        hs = self._handles
        if hs is None:
            hs = self._handles = [None] * len(self.values)
        h = hs[i]
        if h is None:
            try:
                h, _ = BlockHandle.decode(self.values[i], 0)
            except (IndexError, ValueError):
                raise ValueError("malformed block handle") from None
            hs[i] = h
        return h

    def iter_from(self, i: int = 0):
        """(key, value) of the records from index ``i`` on."""
        return zip(self.keys[i:], self.values[i:])


def py_decode_block(data: bytes, name: str, offset: int, internal_keys: bool, data_block: bool = False) -> PyBlock:
    """Decode a whole block.  Any inconsistency raises CorruptedData at ``offset``; a data block
    (``data_block``) holding a record that is not a value, UnsupportedFormat."""
    n = len(data)
    try:
        if n < 4:
            raise ValueError("block shorter than its restart count")
        num_restarts = _U32.unpack_from(data, n - 4)[0]
        tail = 4
        if num_restarts & HASH_INDEX_FLAG:  # a data block with RocksDB's hash index: its buckets before the count
            num_restarts &= ~HASH_INDEX_FLAG
            if n < 6:
                raise ValueError("block shorter than its hash index")
            tail += 2 + (data[n - 6] | data[n - 5] << 8)
        limit = n - tail - 4 * num_restarts
        if limit < 0 or (num_restarts == 0 and limit > 0):
            raise ValueError(f"bad restart count {num_restarts}")
        keys: list[bytes] = []
        values: list[bytes] = []
        prev = b""
        pos = 0
        while pos < limit:
            shared = data[pos]
            unshared = data[pos + 1]
            vlen = data[pos + 2]
            if shared < 0x80 and unshared < 0x80 and vlen < 0x80:
                pos += 3
            elif shared < 0x80 and unshared < 0x80 and data[pos + 3] < 0x80:
                vlen = (vlen & 0x7F) | (data[pos + 3] << 7)
                pos += 4
            else:
                shared, pos = get_uvarint(data, pos)
                unshared, pos = get_uvarint(data, pos)
                vlen, pos = get_uvarint(data, pos)
            kend = pos + unshared
            vend = kend + vlen
            if shared > len(prev) or vend > limit:
                raise ValueError("entry overruns the block")
            key = prev[:shared] + data[pos:kend] if shared else data[pos:kend]
            keys.append(key)
            values.append(data[kend:vend])
            prev = key
            pos = vend
    except (IndexError, ValueError, struct.error) as e:
        raise CorruptedData(f"malformed block ({e})", name, offset) from None
    if internal_keys:
        if keys and min(map(len, keys)) < 8:
            raise CorruptedData("internal key shorter than its 8-byte trailer", name, offset)
        for k in keys if data_block else ():  # (index separators carry a kind of their own: pebble's 17)
            if k[-8] != KIND_VALUE:
                raise not_a_value(k[-8], k[:-8], name, offset)
        keys = [k[:-8] for k in keys]
        if keys != sorted(keys):
            raise CorruptedData("keys out of order", name, offset)
    return PyBlock(keys, values, n)


class PyBlockBuilder:
    """Builds one block with prefix-compressed keys and a restart array.

    ``size`` is Pebble's estimatedSize(), kept up to date on every add.
    """

    __slots__ = ("restart_interval", "buf", "restarts", "counter", "last_key", "n_entries", "size")

    def __init__(self, restart_interval: int):
        self.restart_interval = restart_interval
        self.reset()

    def reset(self) -> None:
        self.buf = bytearray()
        self.restarts: list[int] = []
        self.counter = 0
        self.last_key = b""
        self.n_entries = 0
        self.size = 4

    def add(self, key: bytes, value: bytes) -> None:
        buf = self.buf
        if self.counter == 0:
            self.restarts.append(len(buf))
            shared = 0
        else:
            last = self.last_key
            n = min(len(last), len(key))
            # Common prefix length in three C calls: the XOR's leading zero bytes.
            x = int.from_bytes(last[:n], "big") ^ int.from_bytes(key[:n], "big")
            shared = n - ((x.bit_length() + 7) >> 3) if x else n
        self.counter += 1
        if self.counter == self.restart_interval:
            self.counter = 0
        unshared = len(key) - shared
        vlen = len(value)
        if shared < 0x80 and unshared < 0x80 and vlen < 0x4000:
            if vlen < 0x80:
                buf += bytes((shared, unshared, vlen))
            else:
                buf += bytes((shared, unshared, (vlen & 0x7F) | 0x80, vlen >> 7))
        else:
            put_uvarint(buf, shared)
            put_uvarint(buf, unshared)
            put_uvarint(buf, vlen)
        buf += key[shared:] if shared else key
        buf += value
        self.last_key = key
        self.n_entries += 1
        self.size = len(buf) + 4 * len(self.restarts) + 4

    def estimated_size(self) -> int:
        return self.size

    def finish(self) -> bytes:
        restarts = self.restarts or [0]
        return bytes(self.buf) + struct.pack(f"<{len(restarts)}I", *restarts) + _U32.pack(len(restarts))

    def should_flush(self, key_len: int, value_len: int, block_size: int, threshold: int) -> bool:
        """Pebble's rule for closing a block before adding an entry."""
        return py_should_flush(self.n_entries, self.size, self.restart_interval, key_len, value_len,
                            block_size, threshold)


def py_should_flush(n_entries: int, size: int, restart_interval: int, key_len: int, value_len: int,
                 block_size: int, threshold: int) -> bool:
    """Pebble's shouldFlush: close a block of ``n_entries`` / estimated ``size`` before the next entry?"""
    if n_entries == 0:
        return False
    if size >= block_size:
        return True
    if size <= threshold:
        return False
    new_size = size + key_len + value_len
    if n_entries % restart_interval == 0:
        new_size += 4
    new_size += 4
    new_size += uvarint_len(key_len)
    new_size += uvarint_len(value_len)
    return new_size > block_size

