# The sstable layer's kernel API for committed/'s compiled modules (apply: ``graveler.committed._capply``,
# diff: ``graveler.committed._cdiff``): a table's data blocks read by index, their records read in order,
# and the table-byte steps of a rewrite (carrying a block over verbatim, resuming from a checkpoint).
# Callers see keys, values and counts; the block layout, the index and the file bytes stay in sstable/.
#
# Pointers handed out (``key``, ``val``) stay valid while the BlockRecords they came from lives; ``key``
# only until its next ``next()``.

from libc.stdint cimport uint64_t

from graveler.sstable._cblock cimport Block, Scratch, TableCore
from graveler.sstable._ctable cimport TableBuilder


cdef class BlockRecords:
    """One decoded data block, its records read in order with ``next()``."""
    cdef Block blk                  # (sstable-private)
    cdef unsigned char* kbuf        # (sstable-private)
    cdef Py_ssize_t i               # (sstable-private) the current record, -1 before the first
    cdef readonly Py_ssize_t n      # records in the block
    cdef const unsigned char* key   # the current record's key ...
    cdef Py_ssize_t klen
    cdef const unsigned char* val   # ... and value
    cdef Py_ssize_t vlen
    cdef object last                # (sstable-private) the last key, once asked for

    # Move to the next record (the first after construction); False past the last one.
    cdef bint next(self) except -1
    # Whether the current record is the block's last.
    cdef bint at_last(self) noexcept
    # The first / last record's key, and the first record's value length.
    cdef bytes first_key(self)
    cdef bytes last_key(self)
    cdef Py_ssize_t first_value_len(self) noexcept


cdef class RangeBlocks:
    """The data blocks of one open table (an ``SSTable`` of the compiled sstable layer, read from a buffer),
    read uncached: a rewrite or a diff streams through a range once."""
    cdef object table               # (sstable-private) the SSTable, keeps its buffer alive
    cdef TableCore core             # (sstable-private)
    cdef uint64_t* offs             # (sstable-private) each block's handle
    cdef uint64_t* sizes
    cdef readonly Py_ssize_t nb     # number of data blocks
    cdef readonly object name       # the table's name (errors)
    cdef readonly bint carries      # blocks carry CRC32C trailers: they can be copied into our files verbatim
    cdef Py_ssize_t* part_start     # (sstable-private) the first block of each index partition (and nb)
    cdef Scratch scratch_a, scratch_b  # (sstable-private) what carry_run decompresses into

    # Block ``bi`` decoded (checksum verified), positioned before its first record.
    cdef BlockRecords read(self, Py_ssize_t bi)
    # Whether block ``bi`` here and block ``obi`` of ``other`` have the same stored bytes (trailer included).
    cdef bint same_stored(self, Py_ssize_t bi, RangeBlocks other, Py_ssize_t obi) noexcept
    # Append block ``bi`` (decoded as ``blk``) to ``b`` verbatim if that is what adding its records would
    # write (``TableBuilder.carry_c``; ``next_key``/``next_len``: the record after it, or ``closes``: the
    # table closes right after it). 1 if carried, 0 if not (the caller adds the records).
    cdef int carry(self, TableBuilder b, Py_ssize_t bi, BlockRecords blk, bytes next_key, Py_ssize_t next_len,
                   Py_ssize_t max_estimate, bint closes) except -1
    # The first block whose index separator is >= ``key`` (``nb`` if none): the first a change at ``key``
    # can reach.
    cdef Py_ssize_t first_block_reaching(self, bytes key) except -1
    # Whether block ``c`` starts at ``offset`` and the 4 bytes before it (block c-1's stored CRC) are
    # ``prev_crc``: the file is laid out as when a checkpoint at block ``c`` was recorded.
    cdef bint laid_out_as(self, Py_ssize_t c, Py_ssize_t offset, uint64_t prev_crc) noexcept
    # (first key of the table, last key of block c-1) for ``resume`` from block ``c``; None if either block
    # is empty (no resuming there).
    cdef object resume_keys(self, Py_ssize_t c)
    # Start ``b`` (empty) as a rewrite of this table whose first ``c`` blocks stay as they are, from a
    # checkpoint (``TableBuilder.resume_c``): counters, SHA-256 state, the checkpoints before (``prior``);
    # ``first_key``/``prev_last``: what ``resume_keys(c)`` said.
    cdef int resume(self, TableBuilder b, Py_ssize_t c, Py_ssize_t offset, Py_ssize_t entries,
                    Py_ssize_t raw_key_size, Py_ssize_t raw_value_size, bytes sha_state, bytes first_key,
                    bytes prev_last, bytes prior) except -1
    # Carry blocks ``k``, ``k + 1``, ... (up to ``end`` excluded, ``end`` < ``nb``) to ``b`` verbatim, each as
    # ``carry`` would with the next block's first record after it (the caller has made sure no change falls
    # in or before block ``end``), right after block ``k - 1`` was carried to ``b``: their records are hashed
    # from a scratch buffer, no Python object per record. Stops at the first block that cannot be carried
    # (an empty one, a layout ``carry`` refuses, a size-based range break). Returns how many were carried;
    # ``entries``: their records.
    cdef Py_ssize_t carry_run(self, TableBuilder b, Py_ssize_t k, Py_ssize_t end, Py_ssize_t max_estimate,
                              Py_ssize_t* entries) except -1
