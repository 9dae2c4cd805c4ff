# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The diff of two metaranges compiled: ``graveler.committed.diff.diff`` without a Python frame per block.

The same walk as the reference (``diff.py``, tested against it): two ranges with
the same ID are skipped unopened, a range is opened only when its key span can
hold the next difference, and inside two differing ranges data blocks whose
stored bytes (checksum included) are equal are skipped undecoded -- compared
where they lie in the two files. Records are compared as bytes, and a record
whose value differs only outside its identity is no difference. Only the
differences become Python objects. Blocks and records come through the sstable
layer's kernel API (``graveler/sstable/_crange.pxd``).
"""

from libc.string cimport memcmp
from libc.stdint cimport uint64_t, int64_t
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE

from graveler._crecord cimport decode_ptr
from graveler._cbytes cimport cmp_keys
from graveler.sstable._crange cimport BlockRecords, RangeBlocks

from graveler.model import DiffRecord, DiffType

cdef object ADDED = DiffType.ADDED
cdef object REMOVED = DiffType.REMOVED
cdef object CHANGED = DiffType.CHANGED

cdef enum:
    RANGE = 0   # at the start of a range, not opened
    BLOCK = 1   # at the start of a data block of an opened range, not decoded
    RECORD = 2  # on a record


cdef inline int identity_of(const unsigned char* v, Py_ssize_t n, const unsigned char** ident,
                            Py_ssize_t* ilen) noexcept:
    """The identity inside a record value (``zigzag(len) identity ...``); -1 if malformed."""
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    cdef Py_ssize_t i = 0
    cdef int64_t li
    while True:
        if i >= n or shift > 63:
            return -1
        b = v[i]
        i += 1
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            break
        shift += 7
    li = <int64_t>(result >> 1) ^ -(<int64_t>(result & 1))
    if li < 0 or li > n - i:
        return -1
    ident[0] = v + i
    ilen[0] = <Py_ssize_t>li
    return 0


cdef class _Cursor:
    """A position in a metarange's ranges (see diff.py's _RangeCursor); on a record, ``key``/``val`` point
    into the current block's records."""

    cdef object open_table   # TableReader.open
    cdef list infos
    cdef Py_ssize_t ri, nr
    cdef int state
    cdef RangeBlocks blocks  # the open range's data blocks
    cdef Py_ssize_t bi
    cdef BlockRecords blk
    cdef const unsigned char* key
    cdef Py_ssize_t klen
    cdef const unsigned char* val
    cdef Py_ssize_t vlen
    cdef public Py_ssize_t blocks_skipped

    def __cinit__(self, open_table, list infos):
        self.open_table = open_table
        self.infos = infos
        self.ri = 0
        self.nr = len(infos)
        self.state = RANGE

    cdef inline bint done(self):
        return self.ri >= self.nr

    cdef object range_info(self):
        return self.infos[self.ri]

    cdef int skip_range(self) except -1:
        self.ri += 1
        self.state = RANGE
        self.blocks = None
        self.blk = None
        return 0

    cdef int enter(self) except -1:
        """Open the current range: move to the start of its first block."""
        self.blocks = RangeBlocks(self.open_table(self.infos[self.ri].id))
        self.bi = -1
        self.next_block()
        return 0

    cdef int next_block(self) except -1:
        self.bi += 1
        if self.bi >= self.blocks.nb:
            self.skip_range()
        else:
            self.state = BLOCK
        return 0

    cdef int load(self) except -1:
        """Decode the current block (uncached: a diff streams) and move onto its first record."""
        self.blk = self.blocks.read(self.bi)
        if self.blk.n == 0:
            self.next_block()
            return 0
        self.state = RECORD
        self.advance()
        return 0

    cdef int advance(self) except -1:
        """The next record of the block (the next block's start after its last)."""
        cdef BlockRecords b = self.blk
        if not b.next():
            self.blk = None
            self.next_block()
            return 0
        self.key, self.klen, self.val, self.vlen = b.key, b.klen, b.val, b.vlen
        return 0

    cdef int to_record(self) except -1:
        while not self.done() and self.state != RECORD:
            if self.state == RANGE:
                self.enter()
            else:
                self.load()
        return 0

    cdef bint same_block(self, _Cursor other):
        """Whether both cursors' current blocks have the same stored bytes (contents, type, checksum)."""
        return self.blocks.same_stored(self.bi, other.blocks, other.bi)

    cdef object key_bytes(self):
        return PyBytes_FromStringAndSize(<char*>self.key, self.klen)

    cdef object value(self):
        return decode_ptr(self.val, self.vlen, self.blocks.name)


cdef class DiffIter:
    """Iterator of DiffRecord over two metaranges' range lists (``reader.open`` opens a table)."""

    cdef _Cursor L, R

    def __cinit__(self, open_table, list left_infos, list right_infos):
        self.L = _Cursor(open_table, left_infos)
        self.R = _Cursor(open_table, right_infos)

    def __iter__(self):
        return self

    @property
    def blocks_skipped(self):
        return self.L.blocks_skipped

    def __next__(self):
        cdef _Cursor L = self.L, R = self.R, c
        cdef int ls, rs, cmpk
        cdef const unsigned char* il
        cdef const unsigned char* ir
        cdef Py_ssize_t nl, nr
        while True:
            if L.done() or R.done():
                if L.done() and R.done():
                    raise StopIteration
                c = R if L.done() else L
                c.to_record()
                if not c.done():
                    k = c.key_bytes()
                    v = c.value()
                    c.advance()
                    if c is R:
                        return DiffRecord(ADDED, k, None, v)
                    return DiffRecord(REMOVED, k, v, None)
                continue
            ls = L.state
            rs = R.state
            if ls == RANGE and rs == RANGE and L.range_info().id == R.range_info().id:
                L.skip_range()
                R.skip_range()
                continue
            if ls == BLOCK and rs == BLOCK:
                if L.same_block(R):
                    L.blocks_skipped += 1
                    R.blocks_skipped += 1
                    L.next_block()
                    R.next_block()
                else:
                    L.load()
                    R.load()
                continue
            if ls == BLOCK:
                L.load()
                continue
            if rs == BLOCK:
                R.load()
                continue
            # both at RANGE (different IDs) or RECORD: compare lower bounds
            if ls == RANGE and rs == RANGE:
                lk = L.range_info().min_key
                rk = R.range_info().min_key
                if lk <= rk:
                    L.enter()
                else:
                    R.enter()
                continue
            if ls == RANGE:
                lk = L.range_info().min_key
                if cmp_keys(<const unsigned char*>PyBytes_AS_STRING(lk), PyBytes_GET_SIZE(lk), R.key, R.klen) <= 0:
                    L.enter()
                    continue
                k = R.key_bytes()  # R's record is before L's range: not in left
                v = R.value()
                R.advance()
                return DiffRecord(ADDED, k, None, v)
            if rs == RANGE:
                rk = R.range_info().min_key
                if cmp_keys(<const unsigned char*>PyBytes_AS_STRING(rk), PyBytes_GET_SIZE(rk), L.key, L.klen) <= 0:
                    R.enter()
                    continue
                k = L.key_bytes()
                v = L.value()
                L.advance()
                return DiffRecord(REMOVED, k, v, None)
            cmpk = cmp_keys(L.key, L.klen, R.key, R.klen)
            if cmpk < 0:
                k = L.key_bytes()
                v = L.value()
                L.advance()
                return DiffRecord(REMOVED, k, v, None)
            if cmpk > 0:
                k = R.key_bytes()
                v = R.value()
                R.advance()
                return DiffRecord(ADDED, k, None, v)
            if L.vlen != R.vlen or memcmp(L.val, R.val, L.vlen) != 0:
                if identity_of(L.val, L.vlen, &il, &nl) != 0 or identity_of(R.val, R.vlen, &ir, &nr) != 0 \
                        or nl != nr or memcmp(il, ir, nl) != 0:
                    k = L.key_bytes()
                    lv = L.value()  # raises CorruptedData for a malformed value
                    rv = R.value()
                    L.advance()
                    R.advance()
                    return DiffRecord(CHANGED, k, lv, rv)
            L.advance()
            R.advance()
