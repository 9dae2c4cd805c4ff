# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The table writer compiled: one SSTable in Pebble's flavour plus the lakeFS ID hash of its records.

``TableBuilder`` does what ``graveler.sstable.writer.SSTableWriter`` (the
reference) and ``graveler.ident.TableHasher`` do together, with every piece of
writer state in C: the file grows in a C buffer, blocks are closed by Pebble's
flush rule, compressed with Snappy where that saves 1/8, and checksummed; the
index is built (two-level once it outgrows a block); each record's table-ID
input (``len(key) key | len(value) value |``) goes to OpenSSL's SHA-256. The
same records give the same bytes and the same ID as the reference (tested byte
for byte). Compression stays in cramjam and checksums in google-crc32c.

It can also take a finished data block of another table verbatim (``carry``)
when that is exactly what adding its records would write, and it records
*checkpoints*: at every ``CHECKPOINT_EVERY``-th data-block boundary, the file
offset, the counters and the SHA-256 state. A later rewrite of the table that
changes nothing before some block resumes from the checkpoint at or before it:
the file's bytes up to there are copied, not re-encoded, and the records before
it are not hashed again (``resume``).
"""

from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy
from libc.stdint cimport int32_t, uint32_t, uint64_t
from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE

from graveler.sstable._csha256 cimport Sha256
from graveler._cbytes cimport cmp_keys, dec_len, fnv1a64, le32, put_dec, put_uvarint
from graveler.sstable._cblock cimport (Block, BlockBuilder, Ent, RawBlockInfo, Scratch, TableCore, block_crc,
                                      hash_block_records, index_key, should_flush_c, stage_raw_block, with_trailer)

import struct

import cramjam
import google_crc32c

from graveler.sstable._csha256 import SHA256_STATE_BYTES, SHA256_STATE_TAG
from graveler.errors import InvalidArgument
from graveler.sstable.format import BlockHandle, encode_footer_v2
from graveler.sstable.writer import _index_key, pebble_properties, successor

cdef object _crc32c = google_crc32c.value
cdef object _crc32c_extend = google_crc32c.extend
cdef object _compress = cramjam.snappy.compress_raw
cdef object _compress_into = cramjam.snappy.compress_raw_into
cdef bytes SET_TRAILER_B = b"\x01\x00\x00\x00\x00\x00\x00\x00"
cdef list _CTYPE_BYTES = [bytes((i,)) for i in range(256)]

# A checkpoint every this many data blocks (a 20 MiB range of Snappy blocks has ~11,000 blocks: ~170
# checkpoints of 156 bytes); a rewrite re-reads at most this many unchanged blocks (~0.2 ms) before its
# first change, and the hashing thread gets chunks of ~250 KB between them.
CHECKPOINT_EVERY = 64
# block index, file offset, entries, raw key bytes, raw value bytes, the stored CRC of the block before
_CP_HEAD = CHECKPOINT_HEAD = struct.Struct("<qqqqqI")
CHECKPOINT_BYTES = _CP_HEAD.size + SHA256_STATE_BYTES


cdef const unsigned char _EMPTY[1]


cdef inline const unsigned char* _buf_ptr(const unsigned char[:] b) noexcept:
    """A buffer's first byte (an empty one: a valid pointer all the same)."""
    return &b[0] if b.shape[0] else _EMPTY


# Freed file buffers kept for the next table (a few, of 1 MiB or more): a range being written grows to 20 MiB,
# and memory the process has not touched for a while can cost far more than the copy into it (first-touch
# faults, on virtual machines especially), so tables written one after another reuse one warm buffer.
cdef list _spare = []  # (address, capacity)
cdef enum:
    SPARE_MAX = 2
    SPARE_MIN_BYTES = 1 << 20


cdef inline uint32_t mask_crc(object crc):
    cdef uint32_t c = <uint32_t>(<uint64_t>crc & 0xFFFFFFFFULL)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8U) & 0xFFFFFFFFU


cdef class TableBuilder:
    """One table being written; ``hashed``: also compute the lakeFS ID of its records (``digest``)."""

    def __cinit__(self, bint compression=True, Py_ssize_t block_size=4096, bint hashed=True,
                  bint checkpoints=False):
        self.compress = compression
        self.block_size = block_size
        self.threshold = (block_size * 90 + 99) // 100
        self.data = BlockBuilder(16)
        self.index = BlockBuilder(1)
        self.out = NULL
        self.out_len = 0
        self.out_cap = 0
        self.partitions = []
        self.pending = False
        self.pending_last = b""
        self.last_key = None
        self.first_key = None
        self.verbatim = False
        self.hasher = Sha256(threaded=True) if hashed else None
        self.checkpoints = bytearray() if checkpoints else None
        self.finished = False

    def __dealloc__(self):
        self.release_out()

    cdef void release_out(self) noexcept:
        if self.out != NULL and self.out_cap >= SPARE_MIN_BYTES and len(_spare) < SPARE_MAX:
            _spare.append((<size_t>self.out, self.out_cap))
        else:
            free(self.out)
        self.out = NULL
        self.out_len = self.out_cap = 0

    def __getbuffer__(self, Py_buffer* view, int flags):
        """The finished file (``finish`` returns a memoryview of it: no copy of a 20 MiB range)."""
        if not self.finished:
            raise BufferError("the table is not finished")
        view.buf = self.out
        view.obj = self
        view.len = self.out_len
        view.readonly = 1
        view.itemsize = 1
        view.format = NULL
        if flags & PyBUF_FORMAT:
            view.format = b"B"
        view.ndim = 1
        view.shape = &view.len if (flags & PyBUF_ND) else NULL
        view.strides = &view.itemsize if (flags & PyBUF_STRIDES) else NULL
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer* view):
        pass

    # -- the file buffer ------------------------------------------------------------------------------
    cdef int reserve(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap
        cdef unsigned char* nb
        if self.out_len + need <= self.out_cap:
            return 0
        if self.finished:
            raise ValueError("the table is finished")
        if self.out == NULL and _spare:
            addr, cap = _spare.pop()
            self.out = <unsigned char*><size_t>addr
            self.out_cap = cap
            if self.out_len + need <= self.out_cap:
                return 0
        cap = self.out_cap * 2 if self.out_cap else 1 << 16
        while cap < self.out_len + need:
            cap *= 2
        nb = <unsigned char*>realloc(self.out, cap)
        if nb == NULL:
            raise MemoryError()
        self.out = nb
        self.out_cap = cap
        return 0

    cdef int append(self, const void* p, Py_ssize_t n) except -1:
        self.reserve(n)
        memcpy(self.out + self.out_len, p, n)
        self.out_len += n
        return 0

    cdef int write_block(self, bytes contents, bint compress, uint64_t* off, uint64_t* size) except -1:
        """Compress as Pebble does (Snappy only if it saves at least 1/8), append with its trailer.
        (Compressed into a scratch buffer of the builder's; the checksum through google-crc32c's C entry.)"""
        cdef const unsigned char* body = <const unsigned char*>PyBytes_AS_STRING(contents)
        cdef unsigned char ctype = 0
        cdef unsigned char trailer[5]
        cdef uint32_t crc
        cdef Py_ssize_t n = PyBytes_GET_SIZE(contents), blen = n, clen
        cdef unsigned char* cbuf
        if compress:
            if self.cscratch is None:
                self.cscratch = Scratch()
            cbuf = self.cscratch.ensure(32 + n + n // 6 + 64)
            clen = _compress_into(contents, self.cscratch.view)
            if clen < n - n // 8:
                body = cbuf
                blen = clen
                ctype = 1
        crc = block_crc(body, blen, ctype)
        off[0] = <uint64_t>self.out_len
        size[0] = <uint64_t>blen
        trailer[0] = ctype
        trailer[1] = crc & 0xFF
        trailer[2] = (crc >> 8) & 0xFF
        trailer[3] = (crc >> 16) & 0xFF
        trailer[4] = (crc >> 24) & 0xFF
        self.reserve(blen + 5)
        self.append(body, blen)
        self.append(trailer, 5)
        return 0

    # -- the table-ID hash ------------------------------------------------------------------------------
    cdef int hash_record(self, const unsigned char* k, Py_ssize_t lk, const unsigned char* v,
                         Py_ssize_t lv) except -1:
        """The record's table-ID input: ``len(key) key | len(value) value |`` (lengths in decimal)."""
        cdef Py_ssize_t n = dec_len(lk) + lk + dec_len(lv) + lv + 2
        cdef unsigned char* p = self.hasher.reserve(n)
        p += put_dec(p, lk)
        memcpy(p, k, lk)
        p += lk
        p[0] = 124
        p += 1
        p += put_dec(p, lv)
        memcpy(p, v, lv)
        p += lv
        p[0] = 124
        self.hasher.commit(n)
        return 0

    cdef int hash_block(self, Block blk) except -1:
        """The table-ID input of every record of a decoded data block, written straight into the hash's stage."""
        cdef unsigned char small[512]
        cdef unsigned char* kb = small
        if blk.maxkey > 512:
            kb = <unsigned char*>malloc(blk.maxkey)
            if kb == NULL:
                raise MemoryError()
        try:
            hash_block_records(self.hasher, blk, kb)
        finally:
            if kb != small:
                free(kb)
        return 0

    def digest(self, suffix=b""):
        """The hex SHA-256 of the records' ID input so far, then ``suffix`` (the properties map)."""
        if self.hasher is None:
            raise ValueError("this table is not hashed")
        return self.hasher.hexdigest(suffix)

    # -- adding records -----------------------------------------------------------------------------
    cdef int flush_data_block(self) except -1:
        cdef uint64_t off, size
        if self.data.n_entries == 0:
            return 0
        self.write_block(self.data.finish_c(), self.compress, &off, &size)
        self.num_data_blocks += 1
        self.pending = True
        self.pend_off = off
        self.pend_size = size
        self.pending_last = self.last_key if self.last_key is not None else b""
        self.data.reset_c()
        self.block_boundary()
        return 0

    cdef int block_boundary(self) except -1:
        """A data block was just closed: the next record starts a block. Record a checkpoint here every
        CHECKPOINT_EVERY blocks (the state a rewrite resumes from)."""
        cdef Py_ssize_t at
        if self.checkpoints is None or self.num_data_blocks % CHECKPOINT_EVERY != 0:
            return 0
        self.checkpoints += _CP_HEAD.pack(self.num_data_blocks, self.out_len, self.num_entries, self.raw_key_size,
                                          self.raw_value_size, le32(self.out + self.out_len - 4))
        at = len(self.checkpoints)
        self.checkpoints += bytes(SHA256_STATE_BYTES)
        if self.hasher is not None:
            self.hasher.snapshot_into(self.checkpoints, at)  # filled in when the hashing thread gets there
        return 0

    cdef int resume_c(self, TableCore src, Py_ssize_t block, Py_ssize_t offset, Py_ssize_t entries,
                      Py_ssize_t raw_key_size, Py_ssize_t raw_value_size, bytes sha_state, bytes first_key,
                      bytes prev_last, uint64_t prev_off, uint64_t prev_size, bytes prior) except -1:
        """Start this (empty) table as a rewrite of ``src`` whose first ``block`` data blocks stay as they
        are: their bytes (``offset`` of them) are copied from ``src``, the counters, SHA-256 state and
        checkpoints (``prior``) are those recorded when ``src`` was written, the last of those blocks
        (``prev_off``/``prev_size``, ending with ``prev_last``) waits for its index entry as it would,
        and the index entries of the others are replayed from ``src``'s index. What is added next is
        written exactly as if every record before it had been added one by one."""
        cdef Py_ssize_t p, bi, at, j = 0, lk, cap = 0
        cdef Block part
        cdef unsigned char* kb = NULL
        cdef unsigned char* nb
        cdef uint64_t hoff, hsize
        cdef const unsigned char* d
        if self.num_entries or self.out_len or self.data.n_entries or self.hasher is None:
            raise ValueError("resume needs a new, hashed table")
        if block < 1 or offset > src.buf.shape[0]:
            raise ValueError("bad resume point")
        self.append(&src.buf[0], offset)
        self.num_data_blocks = block
        self.num_entries = entries
        self.raw_key_size = raw_key_size
        self.raw_value_size = raw_value_size
        self.hasher = Sha256(sha_state, threaded=True)
        self.first_key = first_key
        self.last_key = prev_last
        self.pending = True
        self.pend_off = prev_off
        self.pend_size = prev_size
        self.pending_last = prev_last
        if self.checkpoints is not None:
            self.checkpoints = bytearray(prior)
        try:
            for p in range(src.nparts()):
                part = src.partition(p, &at)
                d = <const unsigned char*>PyBytes_AS_STRING(part.data)
                for bi in range(part.n):
                    if j >= block - 1:
                        return 0
                    if part.maxkey > cap:
                        nb = <unsigned char*>realloc(kb, part.maxkey)
                        if nb == NULL:
                            raise MemoryError()
                        kb, cap = nb, part.maxkey
                    lk = part.build_key(bi, kb)  # the stored index key, trailer included
                    if part.handle_c(bi, &hoff, &hsize) != 0:
                        raise ValueError("malformed index entry")
                    if should_flush_c(self.index.n_entries, self.index.size, self.index.restart_interval, lk,
                                      part.ents[bi].vlen, self.block_size, self.threshold):
                        self.finish_partition()
                    self.index.add_c(PyBytes_FromStringAndSize(<char*>kb, lk),
                                     d + part.ents[bi].kpos + part.ents[bi].unshared, part.ents[bi].vlen)
                    j += 1
        finally:
            free(kb)
        if j != block - 1:
            raise ValueError("the table has fewer blocks than the resume point")
        return 0

    cdef int add_index_entry(self, bytes ikey) except -1:
        cdef unsigned char hb[20]
        cdef Py_ssize_t hl = put_uvarint(hb, self.pend_off)
        hl += put_uvarint(hb + hl, self.pend_size)
        self.pending = False
        if should_flush_c(self.index.n_entries, self.index.size, self.index.restart_interval,
                          PyBytes_GET_SIZE(ikey), hl, self.block_size, self.threshold):
            self.finish_partition()
        self.index.add_c(ikey, hb, hl)
        return 0

    cdef int finish_partition(self) except -1:
        self.partitions.append((self.index.last_key, self.index.finish_c()))
        self.index.reset_c()
        return 0

    cdef int add_c(self, bytes key, const unsigned char* v, Py_ssize_t lv) except -1:
        """Add one record (the reference's ``SSTableWriter.add``); keys must increase."""
        cdef Py_ssize_t lk = PyBytes_GET_SIZE(key)
        cdef const unsigned char* kp = <const unsigned char*>PyBytes_AS_STRING(key)
        if self.last_key is not None and cmp_keys(kp, lk, <const unsigned char*>PyBytes_AS_STRING(<bytes>self.last_key),
                                                 PyBytes_GET_SIZE(<bytes>self.last_key)) <= 0:
            raise InvalidArgument(f"SSTable keys must be strictly increasing: {key!r} after {self.last_key!r}")
        ikey = with_trailer(key, SET_TRAILER_B)
        self.verbatim = False
        if self.data.size > self.threshold and should_flush_c(self.data.n_entries, self.data.size,
                                                               self.data.restart_interval, lk + 8, lv,
                                                               self.block_size, self.threshold):
            self.flush_data_block()
        if self.pending:
            self.add_index_entry(index_key(self.pending_last, key))
        self.data.add_c(ikey, v, lv)
        if self.last_key is None:
            self.first_key = key
        self.last_key = key
        self.num_entries += 1
        self.raw_key_size += lk + 8
        self.raw_value_size += lv
        if self.hasher is not None:
            self.hash_record(kp, lk, v, lv)
        return 0

    def add(self, key, value):
        cdef bytes k = key if type(key) is bytes else bytes(key)
        cdef bytes v = value if type(value) is bytes else bytes(value)
        self.add_c(k, <const unsigned char*>PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))

    def add_records(self, list records, Py_ssize_t lo, Py_ssize_t min_size, Py_ssize_t max_size,
                    uint64_t raggedness):
        """Add ``records[lo:]`` ((key, value) pairs). With ``raggedness`` > 0, stop after the first record
        where lakeFS's range-break rule holds: the estimated size is >= ``min_size`` and either >=
        ``max_size`` or FNV-1a-64(key) is 0 modulo ``raggedness``. Returns (index after the last record
        added, whether it stopped on a break)."""
        cdef Py_ssize_t i = lo, n = len(records), est
        cdef tuple rec
        cdef bytes key, value
        while i < n:
            rec = <tuple?>records[i]
            key = rec[0] if type(rec[0]) is bytes else bytes(rec[0])
            value = rec[1] if type(rec[1]) is bytes else bytes(rec[1])
            self.add_c(key, <const unsigned char*>PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
            i += 1
            if raggedness:
                est = self.estimated_size_c()
                if est >= min_size and (est >= max_size or fnv1a64(<const unsigned char*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)) % raggedness == 0):
                    return i, True
        return i, False

    def add_buffers(self, const unsigned char[:] key_off, const unsigned char[:] key_data, Py_ssize_t key_start,
                    const unsigned char[:] val_off, const unsigned char[:] val_data, Py_ssize_t val_start,
                    Py_ssize_t lo, Py_ssize_t n, Py_ssize_t min_size, Py_ssize_t max_size, uint64_t raggedness):
        """``add_records`` over the buffers of two Arrow binary arrays of ``n`` records (int32 offsets and
        data; ``*_start``: each array's offset; no nulls): records ``lo`` to ``n - 1``, no Python object
        per record but the key's bytes. Returns (index after the last record added, whether it stopped on
        a break), as ``add_records`` does."""
        cdef const int32_t* ko = <const int32_t*>_buf_ptr(key_off) + key_start
        cdef const int32_t* vo = <const int32_t*>_buf_ptr(val_off) + val_start
        cdef const unsigned char* kd = _buf_ptr(key_data)
        cdef const unsigned char* vd = _buf_ptr(val_data)
        cdef Py_ssize_t i = lo, est, lk
        cdef bytes key
        if n < 0 or lo < 0 or lo > n or key_start < 0 or val_start < 0:
            raise ValueError("bad record range")
        if n == 0:
            return 0, False
        if key_off.shape[0] < 4 * (key_start + n + 1) or val_off.shape[0] < 4 * (val_start + n + 1):
            raise ValueError("record buffers shorter than the record count")
        if ko[0] < 0 or vo[0] < 0 or ko[n] > key_data.shape[0] or vo[n] > val_data.shape[0]:
            raise ValueError("record offsets beyond their data")
        while i < n:
            lk = ko[i + 1] - ko[i]
            if lk < 0 or vo[i + 1] < vo[i]:
                raise ValueError("record offsets out of order")
            key = PyBytes_FromStringAndSize(<const char*>kd + ko[i], lk)
            self.add_c(key, vd + vo[i], vo[i + 1] - vo[i])
            i += 1
            if raggedness:
                est = self.estimated_size_c()
                if est >= min_size and (est >= max_size or fnv1a64(kd + ko[i - 1], lk) % raggedness == 0):
                    return i, True
        return i, False

    cdef Py_ssize_t estimated_size_c(self) noexcept:
        """Pebble's EstimatedSize(): bytes written + the open data block + the open index block (a block
        carried verbatim counts as still open, at its decoded size, as it would be)."""
        if self.verbatim:
            return self.out_len - self.verb_stored + self.verb_decoded + self.index.size
        return self.out_len + self.data.size + self.index.size

    def estimated_size(self):
        return self.estimated_size_c()

    # -- carrying a finished block of another table -------------------------------------------------
    cdef int carry_c(self, const unsigned char* raw, Py_ssize_t raw_len, bytes first_key, Py_ssize_t first_vlen,
                     bytes last_key, Py_ssize_t n, Py_ssize_t raw_key_size, Py_ssize_t raw_value_size,
                     Py_ssize_t nbytes, bytes next_key, Py_ssize_t next_value_len, Py_ssize_t max_estimate,
                     bint closes, Block records) except -1:
        """Append a data block's stored bytes (``raw``: contents + trailer) if that is exactly what adding
        its records would write: Pebble would start a block at its first record and close it before the
        next one (``next_key`` / ``next_value_len``; or ``closes``: the table is closed right after it),
        and no size-based range break falls inside it. Returns 1 if carried, 0 if not (nothing observable
        changed: the caller adds the records). ``records``: the block decoded (its records feed the ID hash)."""
        if next_key is None and not closes:
            return 0
        if not self.carry_fits(PyBytes_GET_SIZE(first_key), first_vlen, n, nbytes,
                               PyBytes_GET_SIZE(next_key) if next_key is not None else -1, next_value_len):
            return 0
        if not self.carry_bytes_c(raw, raw_len, first_key, last_key, n, raw_key_size, raw_value_size, nbytes,
                                  max_estimate):
            return 0
        if self.hasher is not None:
            self.hash_block(records)
        self.block_boundary()
        return 1

    cdef int carry_raw_c(self, const unsigned char* raw, Py_ssize_t raw_len, const unsigned char* d, Py_ssize_t dn,
                         const RawBlockInfo* info, Py_ssize_t next_klen, Py_ssize_t next_vlen,
                         Py_ssize_t max_estimate, unsigned char* kb) except -1:
        """``carry_c`` for a block given decompressed (``d``, ``dn`` bytes, walked by ``scan_raw_block`` into
        ``info``) rather than decoded, with another record after it (``next_klen``: its user key's length,
        ``next_vlen``: its value's): no Python object per record. ``kb``: a key buffer of ``info.maxkey``
        bytes. 1 if carried, 0 if not (as ``carry_c``)."""
        cdef bytes first_key, last
        cdef Py_ssize_t lk
        if info.n == 0 or not self.carry_fits(info.first_klen, info.first_vlen, info.n, dn, next_klen, next_vlen):
            return 0
        first_key = PyBytes_FromStringAndSize(<const char*>info.first_key, info.first_klen)
        if not self.carry_bytes_c(raw, raw_len, first_key, None, info.n, info.raw_k, info.raw_v, dn, max_estimate):
            return 0
        lk = stage_raw_block(self.hasher, d, dn, info, kb)
        last = PyBytes_FromStringAndSize(<const char*>kb, lk)
        self.pending_last = last
        self.last_key = last
        self.block_boundary()
        return 1

    cdef bint carry_fits(self, Py_ssize_t first_klen, Py_ssize_t first_vlen, Py_ssize_t n, Py_ssize_t nbytes,
                         Py_ssize_t next_klen, Py_ssize_t next_vlen) noexcept:
        """Whether a block (``n`` records, ``nbytes`` decoded, its first record's user key and value lengths)
        stands as a block of its own here: (a) the open block would be closed before its first record, (b)
        it would be closed before the record after it (``next_klen`` < 0: none, the table closes)."""
        if self.data.n_entries and not should_flush_c(self.data.n_entries, self.data.size,
                                                      self.data.restart_interval, first_klen + 8, first_vlen,
                                                      self.block_size, self.threshold):
            return False
        if next_klen >= 0 and not should_flush_c(n, nbytes, 16, next_klen + 8, next_vlen, self.block_size,
                                                 self.threshold):
            return False
        return True

    cdef int carry_bytes_c(self, const unsigned char* raw, Py_ssize_t raw_len, bytes first_key, object last_key,
                           Py_ssize_t n, Py_ssize_t raw_key_size, Py_ssize_t raw_value_size, Py_ssize_t nbytes,
                           Py_ssize_t max_estimate) except -1:
        """The carry itself once ``carry_fits``: close the open block, give the one before its index entry,
        and append ``raw`` unless a size-based range break would fall inside it (0, with the flush and the
        index entry done: what adding the records would do first). The records are not hashed here; the
        caller hashes them and marks the block boundary. ``last_key`` None: the caller sets it after."""
        cdef Py_ssize_t off
        if self.last_key is not None and cmp_keys(<const unsigned char*>PyBytes_AS_STRING(first_key),
                                                  PyBytes_GET_SIZE(first_key),
                                                  <const unsigned char*>PyBytes_AS_STRING(<bytes>self.last_key),
                                                  PyBytes_GET_SIZE(<bytes>self.last_key)) <= 0:
            raise InvalidArgument(f"SSTable keys must be strictly increasing: {first_key!r} after {self.last_key!r}")
        if self.data.n_entries:
            self.flush_data_block()
        if self.pending:
            self.add_index_entry(index_key(self.pending_last, first_key))
        # (c) no size-based range break inside the block (checked against the estimate at its end)
        if self.out_len + nbytes + self.index.size >= max_estimate:
            return 0
        off = self.out_len
        self.append(raw, raw_len)
        self.verbatim = True
        self.verb_stored = raw_len
        self.verb_decoded = nbytes
        self.num_data_blocks += 1
        self.pending = True
        self.pend_off = <uint64_t>off
        self.pend_size = <uint64_t>(raw_len - 5)
        if self.last_key is None:
            self.first_key = first_key
        if last_key is not None:
            self.pending_last = <bytes>last_key
            self.last_key = last_key
        self.num_entries += n
        self.raw_key_size += raw_key_size
        self.raw_value_size += raw_value_size
        return 1

    # -- finishing ----------------------------------------------------------------------------------
    def finish(self, user_properties=None):
        """Close the table and return its bytes, as a read-only memoryview of the builder's buffer
        (``user_properties``: name -> bytes, added to Pebble's)."""
        cdef uint64_t off, size
        cdef Py_ssize_t index_size
        cdef BlockBuilder top
        self.verbatim = False
        self.flush_data_block()
        if self.pending:
            self.add_index_entry(_index_key(self.pending_last, successor(self.pending_last)))
        self.data_size = self.out_len
        two_level = bool(self.partitions)
        top_contents = None
        if two_level:
            self.finish_partition()
            top = BlockBuilder(1)
            index_size = 0
            # Pebble counts index sizes uncompressed, plus one trailer.
            for last_key, part in self.partitions:
                self.write_block(part, self.compress, &off, &size)
                index_size += PyBytes_GET_SIZE(part)
                top.add(last_key, BlockHandle(off, size).encode())
            top_contents = top.finish_c()
            self.write_block(top_contents, self.compress, &off, &size)
            index_size += PyBytes_GET_SIZE(top_contents) + 5
        else:
            contents = self.index.finish_c()
            self.write_block(contents, self.compress, &off, &size)
            index_size = PyBytes_GET_SIZE(contents) + 5
        index_handle = BlockHandle(off, size)
        props = pebble_properties(two_level, self.compress, self.data_size, index_size, self.num_data_blocks,
                                  self.num_entries, self.raw_key_size, self.raw_value_size,
                                  len(self.partitions) if two_level else 0,
                                  PyBytes_GET_SIZE(top_contents) if two_level else 0, user_properties)
        pb = BlockBuilder(1 << 31)
        for k in sorted(props):
            pb.add(k, props[k])
        self.write_block(pb.finish_c(), False, &off, &size)
        props_handle = BlockHandle(off, size)
        mb = BlockBuilder(1)
        mb.add(b"rocksdb.properties", props_handle.encode())
        self.write_block(mb.finish_c(), False, &off, &size)
        footer = encode_footer_v2(BlockHandle(off, size), index_handle)
        self.append(PyBytes_AS_STRING(footer), PyBytes_GET_SIZE(footer))
        self.finished = True
        return memoryview(self)

    def checkpoint_data(self):
        """The checkpoints recorded so far (``CHECKPOINT_BYTES`` each), or None if not recording."""
        if self.checkpoints is None:
            return None
        if self.hasher is not None:
            self.hasher.sync()  # the last snapshot is in
        return bytes(self.checkpoints)
