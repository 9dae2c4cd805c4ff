# C-level declaration of graveler.sstable._ctable.TableBuilder, for the committed layer's apply kernel.

from libc.stdint cimport uint64_t

from graveler.sstable._csha256 cimport Sha256
from graveler.sstable._cblock cimport Block, BlockBuilder, RawBlockInfo, Scratch, TableCore


cdef class TableBuilder:
    cdef BlockBuilder data, index
    cdef unsigned char* out
    cdef Py_ssize_t out_len, out_cap
    cdef list partitions
    cdef bint pending
    cdef uint64_t pend_off, pend_size
    cdef bytes pending_last
    cdef readonly object last_key
    cdef readonly object first_key
    cdef readonly Py_ssize_t num_entries, num_data_blocks, raw_key_size, raw_value_size, data_size
    cdef bint compress
    cdef Py_ssize_t block_size, threshold
    cdef bint verbatim
    cdef Py_ssize_t verb_stored, verb_decoded
    cdef Sha256 hasher
    cdef bytearray checkpoints
    cdef bint finished
    cdef Scratch cscratch     # what blocks are compressed into

    cdef void release_out(self) noexcept

    cdef int reserve(self, Py_ssize_t need) except -1
    cdef int append(self, const void* p, Py_ssize_t n) except -1
    cdef int write_block(self, bytes contents, bint compress, uint64_t* off, uint64_t* size) except -1
    cdef int hash_record(self, const unsigned char* k, Py_ssize_t lk, const unsigned char* v,
                         Py_ssize_t lv) except -1
    cdef int flush_data_block(self) except -1
    cdef int block_boundary(self) except -1
    cdef int add_index_entry(self, bytes ikey) except -1
    cdef int finish_partition(self) except -1
    cdef int add_c(self, bytes key, const unsigned char* v, Py_ssize_t lv) except -1
    cdef Py_ssize_t estimated_size_c(self) noexcept
    cdef int carry_c(self, const unsigned char* raw, Py_ssize_t raw_len, bytes first_key, Py_ssize_t first_vlen,
                     bytes last_key, Py_ssize_t n, Py_ssize_t raw_key_size, Py_ssize_t raw_value_size,
                     Py_ssize_t nbytes, bytes next_key, Py_ssize_t next_value_len, Py_ssize_t max_estimate,
                     bint closes, Block records) except -1
    cdef int carry_raw_c(self, const unsigned char* raw, Py_ssize_t raw_len, const unsigned char* d, Py_ssize_t dn,
                         const RawBlockInfo* info, Py_ssize_t next_klen, Py_ssize_t next_vlen,
                         Py_ssize_t max_estimate, unsigned char* kb) except -1
    cdef bint carry_fits(self, Py_ssize_t first_klen, Py_ssize_t first_vlen, Py_ssize_t n, Py_ssize_t nbytes,
                         Py_ssize_t next_klen, Py_ssize_t next_vlen) noexcept
    cdef int carry_bytes_c(self, const unsigned char* raw, Py_ssize_t raw_len, bytes first_key, object last_key,
                           Py_ssize_t n, Py_ssize_t raw_key_size, Py_ssize_t raw_value_size, Py_ssize_t nbytes,
                           Py_ssize_t max_estimate) except -1
    cdef int hash_block(self, Block blk) except -1
    cdef int resume_c(self, TableCore src, Py_ssize_t block, Py_ssize_t offset, Py_ssize_t entries,
                      Py_ssize_t raw_key_size, Py_ssize_t raw_value_size, bytes sha_state, bytes first_key,
                      bytes prev_last, uint64_t prev_off, uint64_t prev_size, bytes prior) except -1
