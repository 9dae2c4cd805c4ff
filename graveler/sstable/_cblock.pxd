# C-level declarations of graveler.sstable._cblock, for the other compiled modules (the table
# builder in _ctable, the committed layer's apply kernel): blocks, block builders and open tables.

from libc.stdint cimport uint32_t, uint64_t, int64_t
from libc.string cimport memcmp

from graveler.sstable._csha256 cimport Sha256
from graveler._cbytes cimport cmp_keys, dec_len, fnv1a64, le32, put_dec, put_uvarint, read_uvarint, uvarint_len


# A value decoder a table scan can call per record without a Python call (``TableCore.scan(start,
# decode)`` with ``decode.c_decoder`` a PyCapsule of this type, named "graveler.sstable.value_fn"): the layer that
# owns values supplies it (graveler._crecord.VALUE_DECODER); the sstable layer never learns what a value holds.
ctypedef object (*value_fn)(const unsigned char* p, Py_ssize_t n, object name)


cdef struct Ent:
    uint32_t kpos      # where the entry's unshared key bytes start
    uint32_t shared
    uint32_t unshared
    uint32_t vlen


cdef class Block:
    cdef readonly bytes data
    cdef readonly Py_ssize_t nbytes
    cdef readonly bint internal
    cdef Py_ssize_t n
    cdef Ent* ents
    cdef uint32_t* rest       # entry index of each restart point
    cdef Py_ssize_t nrest
    cdef Py_ssize_t maxkey    # longest stored (internal) key
    cdef int trail            # 8 for internal keys, else 0
    cdef object _keys
    cdef object _values

    cdef Py_ssize_t build_key(self, Py_ssize_t i, unsigned char* buf) noexcept
    cdef Py_ssize_t find_c(self, const unsigned char* key, Py_ssize_t klen, unsigned char* buf, bint* eq) noexcept
    cdef object value_c(self, Py_ssize_t i)
    cdef object key_c(self, Py_ssize_t i)
    cdef int handle_c(self, Py_ssize_t i, uint64_t* off, uint64_t* size) noexcept


cdef class BlockBuilder:
    cdef readonly Py_ssize_t restart_interval
    cdef unsigned char* buf
    cdef Py_ssize_t len, cap
    cdef uint32_t* restarts
    cdef Py_ssize_t nrestarts, rcap
    cdef readonly Py_ssize_t counter
    cdef readonly bytes last_key
    cdef readonly Py_ssize_t n_entries
    cdef readonly Py_ssize_t size

    cdef int grow(self, Py_ssize_t need) except -1
    cdef int add_c(self, bytes key, const unsigned char* v, Py_ssize_t vlen) except -1
    cdef int reset_c(self) noexcept
    cdef bytes finish_c(self)


# What one walk over a decompressed data block's entries found (``scan_raw_block``): the records' count and
# sizes, the size of their table-ID input, and the first record's key (user key, in the block) and value length.
cdef struct RawBlockInfo:
    Py_ssize_t n              # records
    Py_ssize_t raw_k          # stored (internal) key bytes
    Py_ssize_t raw_v          # value bytes
    Py_ssize_t id_bytes       # bytes of their table-ID input (``len(key) key | len(value) value |`` each)
    Py_ssize_t maxkey         # longest stored key
    const unsigned char* first_key  # the first record's user key (it shares no prefix)
    Py_ssize_t first_klen
    Py_ssize_t first_vlen


# A scratch buffer blocks are decompressed into (reused from block to block: no bytes object per block).
cdef class Scratch:
    cdef bytearray buf
    cdef object view
    cdef Py_ssize_t cap

    cdef unsigned char* ensure(self, Py_ssize_t n) except NULL


cdef class TableCore:
    cdef Block top
    cdef bint two_level
    cdef object cache_get, cache_put, cache_id, load, name
    cdef Py_ssize_t index_offset
    cdef list parts  # index partitions, kept once read (as a table reader keeps its index)
    cdef object owner  # the SSTable (for its blocks_read counter), when the core reads blocks itself
    cdef const unsigned char[::1] buf
    cdef object buf_obj     # the buffer itself (bytes or a mapped file)
    cdef object pybuf       # a memoryview of it (slices of it feed cramjam without a copy)
    cdef bint has_buf
    cdef int checksum_type
    cdef bint index_internal  # False: index partitions hold user keys (format_version 3's option)

    cdef Py_ssize_t checked_end(self, uint64_t off, uint64_t size) except -1
    cdef bytes read_contents(self, uint64_t off, uint64_t size)
    cdef Py_ssize_t read_raw(self, uint64_t off, uint64_t size, Scratch s, const unsigned char** out) except -1
    cdef Block read(self, uint64_t off, uint64_t size, bint internal=*, bint data=*)
    cdef Block block_at(self, uint64_t off, uint64_t size)
    cdef int handle_of(self, Block blk, Py_ssize_t i, Py_ssize_t at, uint64_t* off, uint64_t* size) except -1
    cdef Block partition(self, Py_ssize_t p, Py_ssize_t* at)
    cdef Py_ssize_t nparts(self)


# The masked CRC32C of a block's stored bytes and its compression type byte (its trailer's checksum).
cdef uint32_t block_crc(const unsigned char* p, Py_ssize_t n, unsigned char ctype)
cdef Block decode_block_c(bytes buf, object name, object offset, bint internal_keys, bint data_block=*)
cdef int hash_block_records(Sha256 h, Block blk, unsigned char* kb) except -1
cdef int scan_raw_block(const unsigned char* d, Py_ssize_t n, RawBlockInfo* info) noexcept nogil
cdef Py_ssize_t stage_raw_block(Sha256 h, const unsigned char* d, Py_ssize_t n, const RawBlockInfo* info,
                                unsigned char* kb) except -1
cdef bint should_flush_c(Py_ssize_t n_entries, Py_ssize_t size, Py_ssize_t restart_interval, Py_ssize_t key_len,
                         Py_ssize_t value_len, Py_ssize_t block_size, Py_ssize_t threshold) noexcept
cdef bytes with_trailer(bytes key, bytes trailer)
cdef bytes index_key(bytes a, bytes b)
