# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The sstable layer's kernels for committed/'s compiled apply and diff (the API is ``_crange.pxd``).

A :class:`RangeBlocks` lists a table's data blocks from its index once and reads
each uncached, verified and decoded; a :class:`BlockRecords` walks one block's
records in order, rebuilding each prefix-compressed key in a buffer of its own.
The steps of a rewrite that touch file bytes -- carrying a block over verbatim,
resuming from a checkpoint, checking the file is laid out as the checkpoint
says -- are here too, so committed/ never learns the block or file layout.
"""

from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memcmp
from libc.stdint cimport uint64_t
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

from graveler._cbytes cimport cmp_keys, le32

from graveler.errors import CorruptedData
from graveler.sstable._cblock cimport Block, Ent, RawBlockInfo, Scratch, TableCore, decode_block_c, scan_raw_block
from graveler.sstable._ctable cimport TableBuilder


cdef class BlockRecords:

    def __cinit__(self, Block blk):
        self.blk = blk
        self.n = blk.n
        self.i = -1
        self.kbuf = <unsigned char*>malloc(blk.maxkey if blk.maxkey > 0 else 1)
        if self.kbuf == NULL:
            raise MemoryError()
        self.key = self.kbuf
        self.klen = 0
        self.val = NULL
        self.vlen = 0
        self.last = None

    def __dealloc__(self):
        free(self.kbuf)

    cdef bint next(self) except -1:
        cdef Block b = self.blk
        cdef Ent* e
        cdef const unsigned char* d
        self.i += 1
        if self.i >= b.n:
            return False
        e = &b.ents[self.i]
        d = <const unsigned char*>PyBytes_AS_STRING(b.data)
        memcpy(self.kbuf + e.shared, d + e.kpos, e.unshared)  # after the shared prefix
        self.klen = <Py_ssize_t>(e.shared + e.unshared) - b.trail
        self.val = d + e.kpos + e.unshared
        self.vlen = e.vlen
        return True

    cdef bint at_last(self) noexcept:
        return self.i == self.n - 1

    cdef bytes first_key(self):
        return self.blk.key_c(0)

    cdef bytes last_key(self):
        if self.last is None:
            self.last = self.blk.key_c(self.n - 1)
        return <bytes>self.last

    cdef Py_ssize_t first_value_len(self) noexcept:
        return self.blk.ents[0].vlen


cdef class RangeBlocks:

    def __cinit__(self, table):
        """``table``: an open SSTable of the compiled sstable layer, read from a buffer."""
        cdef TableCore core = <TableCore?>table._core
        cdef Py_ssize_t p, bi, at, n = 0, cap = 0
        cdef Block part
        cdef uint64_t off, size
        cdef uint64_t* no
        self.offs = NULL
        self.sizes = NULL
        self.part_start = NULL
        self.table = table
        self.core = core
        self.name = core.name
        self.part_start = <Py_ssize_t*>malloc((core.nparts() + 1) * sizeof(Py_ssize_t))
        if self.part_start == NULL:
            raise MemoryError()
        for p in range(core.nparts()):
            part = core.partition(p, &at)
            self.part_start[p] = n
            for bi in range(part.n):
                core.handle_of(part, bi, at, &off, &size)
                if n == cap:
                    cap = cap * 2 if cap else 256
                    no = <uint64_t*>realloc(self.offs, cap * sizeof(uint64_t))
                    if no == NULL:
                        raise MemoryError()
                    self.offs = no
                    no = <uint64_t*>realloc(self.sizes, cap * sizeof(uint64_t))
                    if no == NULL:
                        raise MemoryError()
                    self.sizes = no
                self.offs[n] = off
                self.sizes[n] = size
                n += 1
        self.nb = n
        self.part_start[core.nparts()] = n
        if n and not core.has_buf:
            raise ValueError("the compiled range kernels need a table read from a buffer")
        self.carries = core.checksum_type == 1

    def __dealloc__(self):
        free(self.offs)
        free(self.sizes)
        free(self.part_start)

    cdef BlockRecords read(self, Py_ssize_t bi):
        return BlockRecords(decode_block_c(self.core.read_contents(self.offs[bi], self.sizes[bi]), self.core.name,
                                           self.offs[bi], True))

    cdef bint same_stored(self, Py_ssize_t bi, RangeBlocks other, Py_ssize_t obi) noexcept:
        cdef uint64_t n = self.sizes[bi]
        if n != other.sizes[obi]:
            return False
        return memcmp(&self.core.buf[0] + self.offs[bi], &other.core.buf[0] + other.offs[obi], n + 5) == 0

    cdef int carry(self, TableBuilder b, Py_ssize_t bi, BlockRecords blk, bytes next_key, Py_ssize_t next_len,
                   Py_ssize_t max_estimate, bint closes) except -1:
        cdef Block d = blk.blk
        cdef Py_ssize_t i, raw_k = 0, raw_v = 0
        cdef Ent* e
        for i in range(d.n):
            e = &d.ents[i]
            raw_k += e.shared + e.unshared
            raw_v += e.vlen
        return b.carry_c(&self.core.buf[0] + self.offs[bi], <Py_ssize_t>self.sizes[bi] + 5, blk.first_key(),
                         d.ents[0].vlen, blk.last_key(), d.n, raw_k, raw_v, d.nbytes, next_key, next_len,
                         max_estimate, closes, d)

    cdef Py_ssize_t first_block_reaching(self, bytes key) except -1:
        cdef TableCore core = self.core
        cdef const unsigned char* kp = <const unsigned char*>PyBytes_AS_STRING(key)
        cdef Py_ssize_t kl = PyBytes_GET_SIZE(key), p = 0, at, cap
        cdef Block part
        cdef unsigned char* kb = NULL
        cdef bint eq
        try:
            if core.two_level:
                # the top index holds each partition's last separator: the first >= key names the partition
                kb = <unsigned char*>malloc(core.top.maxkey if core.top.maxkey > 0 else 1)
                if kb == NULL:
                    raise MemoryError()
                p = core.top.find_c(kp, kl, kb, &eq)
                if p >= core.nparts():
                    return self.nb
                free(kb)
                kb = NULL
            part = core.partition(p, &at)
            kb = <unsigned char*>malloc(part.maxkey if part.maxkey > 0 else 1)
            if kb == NULL:
                raise MemoryError()
            return self.part_start[p] + part.find_c(kp, kl, kb, &eq)
        finally:
            free(kb)

    cdef bint laid_out_as(self, Py_ssize_t c, Py_ssize_t offset, uint64_t prev_crc) noexcept:
        if c < 0 or c >= self.nb or <Py_ssize_t>self.offs[c] != offset or offset < 4:
            return False
        return le32(&self.core.buf[0] + offset - 4) == prev_crc

    cdef object resume_keys(self, Py_ssize_t c):
        cdef BlockRecords first = self.read(0)
        cdef BlockRecords prev = self.read(c - 1)
        if first.n == 0 or prev.n == 0:
            return None
        return first.first_key(), prev.last_key()

    cdef int resume(self, TableBuilder b, Py_ssize_t c, Py_ssize_t offset, Py_ssize_t entries,
                    Py_ssize_t raw_key_size, Py_ssize_t raw_value_size, bytes sha_state, bytes first_key,
                    bytes prev_last, bytes prior) except -1:
        return b.resume_c(self.core, c, offset, entries, raw_key_size, raw_value_size, sha_state, first_key,
                          prev_last, self.offs[c - 1], self.sizes[c - 1], prior)

    cdef Py_ssize_t carry_run(self, TableBuilder b, Py_ssize_t k, Py_ssize_t end, Py_ssize_t max_estimate,
                              Py_ssize_t* entries) except -1:
        cdef Scratch cur, nxt, tmp
        cdef const unsigned char* d
        cdef const unsigned char* dn_p
        cdef Py_ssize_t dn, dnn, j = k, kcap = 0
        cdef RawBlockInfo info, ninfo
        cdef unsigned char* kb = NULL
        cdef unsigned char* nkb
        entries[0] = 0
        if k >= end or end >= self.nb:
            return 0
        if self.scratch_a is None:
            self.scratch_a = Scratch()
            self.scratch_b = Scratch()
        cur, nxt = self.scratch_a, self.scratch_b
        try:
            dn = self.core.read_raw(self.offs[j], self.sizes[j], cur, &d)
            if scan_raw_block(d, dn, &info) != 0:
                raise CorruptedData("malformed block", self.name, self.offs[j])
            while j < end:
                dnn = self.core.read_raw(self.offs[j + 1], self.sizes[j + 1], nxt, &dn_p)
                if scan_raw_block(dn_p, dnn, &ninfo) != 0:
                    raise CorruptedData("malformed block", self.name, self.offs[j + 1])
                if ninfo.n == 0:
                    break
                if info.maxkey > kcap:
                    nkb = <unsigned char*>realloc(kb, info.maxkey)
                    if nkb == NULL:
                        raise MemoryError()
                    kb, kcap = nkb, info.maxkey
                if not b.carry_raw_c(&self.core.buf[0] + self.offs[j], <Py_ssize_t>self.sizes[j] + 5, d, dn, &info,
                                     ninfo.first_klen, ninfo.first_vlen, max_estimate, kb):
                    break
                entries[0] += info.n
                j += 1
                tmp = cur
                cur = nxt
                nxt = tmp
                d, dn, info = dn_p, dnn, ninfo
        finally:
            free(kb)
        return j - k
