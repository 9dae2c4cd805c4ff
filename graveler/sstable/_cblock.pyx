# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled block codec: the per-record loops of graveler.sstable.block.

Same format, same results and same errors as the pure-Python reference in
``block.py`` (``PyBlock``, ``py_decode_block``, ``PyBlockBuilder``); the
equivalence is tested record for record and byte for byte.  Decoding a block
validates every entry in one pass and keeps only the block's bytes plus a
small table of entry positions: lookups binary-search the restart points and
scan a few entries, building Python objects only for what they return.
"""

from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memcmp
from libc.stdint cimport uint32_t, uint64_t, int64_t
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF

from graveler.errors import CorruptedData
from graveler.sstable.format import BlockHandle

cdef struct Ent:
    uint32_t kpos      # where the entry's unshared key bytes start
    uint32_t shared
    uint32_t unshared
    uint32_t vlen


# --- varints ----------------------------------------------------------------------------------

cdef inline int read_uvarint(const unsigned char* p, Py_ssize_t n, Py_ssize_t* pos, uint64_t* out) noexcept nogil:
    """0: ok; -1: the buffer ends inside it; -2: longer than 10 bytes / over 64 bits."""
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    cdef Py_ssize_t i = pos[0]
    while True:
        if i >= n:
            return -1
        b = p[i]
        i += 1
        if shift == 63 and b > 1:
            return -2
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            pos[0] = i
            out[0] = result
            return 0
        shift += 7


cdef inline Py_ssize_t put_uvarint(unsigned char* p, uint64_t v) noexcept nogil:
    cdef Py_ssize_t i = 0
    while v >= 0x80:
        p[i] = <unsigned char>((v & 0x7F) | 0x80)
        v >>= 7
        i += 1
    p[i] = <unsigned char>v
    return i + 1


cdef inline int uvarint_len(uint64_t v) noexcept nogil:
    cdef int n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline int cmp_keys(const unsigned char* a, Py_ssize_t la, const unsigned char* b, Py_ssize_t lb) noexcept nogil:
    cdef Py_ssize_t m = la if la < lb else lb
    cdef int c = memcmp(a, b, m) if m > 0 else 0
    if c != 0:
        return c
    if la < lb:
        return -1
    if la > lb:
        return 1
    return 0


cdef inline bytes as_bytes(object b):
    if type(b) is bytes:
        return <bytes>b
    return bytes(b)


# --- decoding ---------------------------------------------------------------------------------

cdef class Block:
    """A validated block: its bytes and entry table.  Internal-key trailers are not part of ``keys``."""

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

    def __cinit__(self):
        self.ents = NULL
        self.rest = NULL
        self.n = 0
        self.nrest = 0

    def __dealloc__(self):
        free(self.ents)
        free(self.rest)

    def __len__(self):
        return self.n

    # -- key reconstruction ---------------------------------------------------------------
    cdef Py_ssize_t build_key(self, Py_ssize_t i, unsigned char* buf) noexcept:
        """Write entry ``i``'s stored key into ``buf`` (maxkey bytes); returns its length."""
        cdef Py_ssize_t j = i
        cdef const unsigned char* d = <const unsigned char*>PyBytes_AS_STRING(self.data)
        cdef Ent* e
        while j > 0 and self.ents[j].shared != 0:
            j -= 1
        while True:
            e = &self.ents[j]
            memcpy(buf + e.shared, d + e.kpos, e.unshared)
            if j == i:
                return e.shared + e.unshared
            j += 1

    cdef Py_ssize_t find_c(self, const unsigned char* key, Py_ssize_t klen, unsigned char* buf, bint* eq) noexcept:
        """Index of the first entry whose user key is >= key (``n`` if none); ``eq``: it equals key.

        ``buf`` (maxkey bytes) holds that entry's stored key on return when one was found.
        """
        cdef const unsigned char* d = <const unsigned char*>PyBytes_AS_STRING(self.data)
        cdef Py_ssize_t lo = 0, hi = self.nrest - 1, mid, i, klen_i
        cdef Ent* e
        cdef int c
        eq[0] = False
        if self.n == 0:
            return 0
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            e = &self.ents[self.rest[mid]]
            if cmp_keys(d + e.kpos, <Py_ssize_t>e.unshared - self.trail, key, klen) < 0:
                lo = mid
            else:
                hi = mid - 1
        i = self.rest[lo]
        while i < self.n:
            e = &self.ents[i]
            memcpy(buf + e.shared, d + e.kpos, e.unshared)
            klen_i = <Py_ssize_t>(e.shared + e.unshared) - self.trail
            c = cmp_keys(buf, klen_i, key, klen)
            if c >= 0:
                eq[0] = c == 0
                return i
            i += 1
        return self.n

    cdef inline object value_c(self, Py_ssize_t i):
        cdef Ent* e = &self.ents[i]
        return PyBytes_FromStringAndSize(PyBytes_AS_STRING(self.data) + e.kpos + e.unshared, e.vlen)

    cdef object key_c(self, Py_ssize_t i):
        cdef unsigned char small[512]
        cdef unsigned char* buf = small
        cdef Py_ssize_t ln
        if self.maxkey > 512:
            buf = <unsigned char*>malloc(self.maxkey)
            if buf == NULL:
                raise MemoryError()
        try:
            ln = self.build_key(i, buf) - self.trail
            return PyBytes_FromStringAndSize(<char*>buf, ln)
        finally:
            if buf != small:
                free(buf)

    cdef int handle_c(self, Py_ssize_t i, uint64_t* off, uint64_t* size) noexcept:
        """Decode entry ``i``'s value as a block handle; -1 when it is not one."""
        cdef Ent* e = &self.ents[i]
        cdef const unsigned char* v = <const unsigned char*>PyBytes_AS_STRING(self.data) + e.kpos + e.unshared
        cdef Py_ssize_t pos = 0
        if read_uvarint(v, e.vlen, &pos, off) != 0:
            return -1
        if read_uvarint(v, e.vlen, &pos, size) != 0:
            return -1
        return 0

    # -- Python API -----------------------------------------------------------------------
    def find(self, key):
        """Index of the first record whose user key is >= ``key`` (bisect_left)."""
        cdef bytes k = as_bytes(key)
        cdef unsigned char small[512]
        cdef unsigned char* buf = small
        cdef bint eq
        cdef Py_ssize_t r
        if self.maxkey > 512:
            buf = <unsigned char*>malloc(self.maxkey)
            if buf == NULL:
                raise MemoryError()
        r = self.find_c(<const unsigned char*>PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), buf, &eq)
        if buf != small:
            free(buf)
        return r

    seek_ge = find

    def get(self, key):
        """The value stored under exactly ``key``, or None."""
        cdef bytes k = as_bytes(key)
        cdef unsigned char small[512]
        cdef unsigned char* buf = small
        cdef bint eq
        cdef Py_ssize_t r
        if self.maxkey > 512:
            buf = <unsigned char*>malloc(self.maxkey)
            if buf == NULL:
                raise MemoryError()
        r = self.find_c(<const unsigned char*>PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), buf, &eq)
        if buf != small:
            free(buf)
        if eq:
            return self.value_c(r)
        return None

    def key_at(self, Py_ssize_t i):
        if i < 0 or i >= self.n:
            raise IndexError("block entry index out of range")
        return self.key_c(i)

    def value_at(self, Py_ssize_t i):
        if i < 0 or i >= self.n:
            raise IndexError("block entry index out of range")
        return self.value_c(i)

    def handle(self, Py_ssize_t i):
        """Entry ``i``'s value decoded as a BlockHandle (index blocks); ValueError if it is not one."""
        cdef uint64_t off, size
        if i < 0 or i >= self.n:
            raise IndexError("block entry index out of range")
        if self.handle_c(i, &off, &size) != 0:
            raise ValueError("malformed block handle")
        return BlockHandle(off, size)

    def iter_from(self, Py_ssize_t i=0):
        """(key, value) of the records from index ``i`` on."""
        return BlockIter(self, i)

    def summary(self, uint64_t raggedness):
        """What a range writer needs to carry this block over verbatim, without a Python object per record.

        Returns (first key, first value's length, last key, number of records, raw key bytes with
        8-byte trailers, raw value bytes, whether FNV-1a-64 of a key other than the last is 0 modulo
        ``raggedness``, whether the last key's is, the records' table-ID input).
        """
        cdef const unsigned char* d = <const unsigned char*>PyBytes_AS_STRING(self.data)
        cdef unsigned char* buf
        cdef unsigned char* hb
        cdef Py_ssize_t i, j, klen, total = 0, hlen = 0, raw_k = 0, raw_v = 0
        cdef Ent* e
        cdef uint64_t h
        cdef bint inside = False, last_breaks = False
        cdef bytes hin
        if self.n == 0:
            raise ValueError("empty block")
        for i in range(self.n):
            e = &self.ents[i]
            klen = <Py_ssize_t>(e.shared + e.unshared) - self.trail
            total += dec_len(klen) + klen + dec_len(e.vlen) + e.vlen + 2
            raw_k += klen + 8
            raw_v += e.vlen
        buf = <unsigned char*>malloc(self.maxkey if self.maxkey > 0 else 1)
        if buf == NULL:
            raise MemoryError()
        hin = PyBytes_FromStringAndSize(NULL, total)
        hb = <unsigned char*>PyBytes_AS_STRING(hin)
        try:
            for i in range(self.n):
                e = &self.ents[i]
                memcpy(buf + e.shared, d + e.kpos, e.unshared)
                klen = <Py_ssize_t>(e.shared + e.unshared) - self.trail
                hlen += put_dec(hb + hlen, klen)
                memcpy(hb + hlen, buf, klen)
                hlen += klen
                hb[hlen] = 124
                hlen += 1
                hlen += put_dec(hb + hlen, e.vlen)
                memcpy(hb + hlen, d + e.kpos + e.unshared, e.vlen)
                hlen += e.vlen
                hb[hlen] = 124
                hlen += 1
                if raggedness:
                    h = FNV_OFFSET
                    for j in range(klen):
                        h = (h ^ buf[j]) * FNV_PRIME
                    if h % raggedness == 0:
                        if i == self.n - 1:
                            last_breaks = True
                        else:
                            inside = True
        finally:
            free(buf)
        return (self.key_c(0), self.ents[0].vlen, self.key_c(self.n - 1), self.n, raw_k, raw_v, inside, last_breaks,
                hin)

    @property
    def keys(self):
        cdef Py_ssize_t i, ln
        cdef unsigned char small[512]
        cdef unsigned char* buf = small
        cdef const unsigned char* d
        cdef Ent* e
        cdef list out
        if self._keys is None:
            if self.maxkey > 512:
                buf = <unsigned char*>malloc(self.maxkey)
                if buf == NULL:
                    raise MemoryError()
            d = <const unsigned char*>PyBytes_AS_STRING(self.data)
            out = PyList_New(self.n)
            try:
                for i in range(self.n):
                    e = &self.ents[i]
                    memcpy(buf + e.shared, d + e.kpos, e.unshared)
                    k = PyBytes_FromStringAndSize(<char*>buf, <Py_ssize_t>(e.shared + e.unshared) - self.trail)
                    Py_INCREF(k)
                    PyList_SET_ITEM(out, i, k)
            finally:
                if buf != small:
                    free(buf)
            self._keys = out
        return self._keys

    @property
    def values(self):
        cdef Py_ssize_t i
        cdef list out
        if self._values is None:
            out = PyList_New(self.n)
            for i in range(self.n):
                v = self.value_c(i)
                Py_INCREF(v)
                PyList_SET_ITEM(out, i, v)
            self._values = out
        return self._values


cdef class BlockIter:
    """Iterator over (key, value) of a block from one index on; keys rebuilt in a private buffer."""

    cdef Block blk
    cdef Py_ssize_t i
    cdef unsigned char* buf

    def __cinit__(self, Block blk, Py_ssize_t i):
        self.blk = blk
        self.i = i if i > 0 else 0
        self.buf = <unsigned char*>malloc(blk.maxkey if blk.maxkey > 0 else 1)
        if self.buf == NULL:
            raise MemoryError()
        if self.i > 0 and self.i < blk.n:
            blk.build_key(self.i - 1, self.buf)  # the prefix the next entry shares

    def __dealloc__(self):
        free(self.buf)

    def __iter__(self):
        return self

    def __next__(self):
        cdef Block b = self.blk
        cdef Py_ssize_t i = self.i
        cdef Ent* e
        cdef const char* d
        if i >= b.n:
            raise StopIteration
        e = &b.ents[i]
        d = PyBytes_AS_STRING(b.data)
        memcpy(self.buf + e.shared, d + e.kpos, e.unshared)
        self.i = i + 1
        t = PyTuple_New(2)
        k = PyBytes_FromStringAndSize(<char*>self.buf, <Py_ssize_t>(e.shared + e.unshared) - b.trail)
        v = PyBytes_FromStringAndSize(d + e.kpos + e.unshared, e.vlen)
        Py_INCREF(k)
        Py_INCREF(v)
        PyTuple_SET_ITEM(t, 0, k)
        PyTuple_SET_ITEM(t, 1, v)
        return t


cdef inline uint32_t le32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0]) | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


def decode_block(data, name, offset, bint internal_keys):
    """Validate and index a block.  Any inconsistency raises CorruptedData at ``offset``."""
    cdef bytes buf = as_bytes(data)
    cdef const unsigned char* d = <const unsigned char*>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(buf)
    cdef uint64_t num_restarts, shared, unshared, vlen
    cdef int64_t limit
    cdef Py_ssize_t pos = 0, cap = 0, count = 0, rp = 0, prevlen = 0, klen, maxkey = 0
    cdef Ent* ents = NULL
    cdef Ent* tmp
    cdef uint32_t* rest = NULL
    cdef unsigned char* kprev = NULL
    cdef unsigned char* kcur = NULL
    cdef unsigned char* kswap
    cdef Py_ssize_t kcap = 0, kprevlen = 0
    cdef const unsigned char* rbase
    cdef uint32_t roff
    cdef int r, trail = 8 if internal_keys else 0
    cdef object err = None
    cdef object order_err = None
    cdef Py_ssize_t i
    cdef Block blk

    if n < 4:
        raise CorruptedData("malformed block (block shorter than its restart count)", name, offset)
    num_restarts = le32(d + n - 4)
    limit = <int64_t>n - 4 - 4 * <int64_t>num_restarts
    if limit < 0 or (num_restarts == 0 and limit > 0):
        raise CorruptedData(f"malformed block (bad restart count {num_restarts})", name, offset)
    rbase = d + limit
    try:
        if num_restarts > 0 and limit > 0:
            rest = <uint32_t*>malloc(num_restarts * sizeof(uint32_t))
            if rest == NULL:
                raise MemoryError()
        while pos < limit:
            if count == cap:
                cap = cap * 2 if cap else 32
                tmp = <Ent*>realloc(ents, cap * sizeof(Ent))
                if tmp == NULL:
                    raise MemoryError()
                ents = tmp
            r = read_uvarint(d, n, &pos, &shared)
            if r == 0:
                r = read_uvarint(d, n, &pos, &unshared)
            if r == 0:
                r = read_uvarint(d, n, &pos, &vlen)
            if r != 0:
                err = "index out of range" if r == -1 else "varint too long"
                break
            if shared > <uint64_t>prevlen or unshared > <uint64_t>limit or vlen > <uint64_t>limit \
                    or <int64_t>(pos + unshared + vlen) > limit:
                err = "entry overruns the block"
                break
            ents[count].kpos = <uint32_t>pos
            ents[count].shared = <uint32_t>shared
            ents[count].unshared = <uint32_t>unshared
            ents[count].vlen = <uint32_t>vlen
            klen = <Py_ssize_t>(shared + unshared)
            if klen > maxkey:
                maxkey = klen
            if internal_keys and order_err is None:
                if klen < 8:
                    order_err = "internal key shorter than its 8-byte trailer"
                else:
                    if klen > kcap:
                        kcap = klen * 2
                        kswap = <unsigned char*>realloc(kprev, kcap)
                        if kswap == NULL:
                            raise MemoryError()
                        kprev = kswap
                        kswap = <unsigned char*>realloc(kcur, kcap)
                        if kswap == NULL:
                            raise MemoryError()
                        kcur = kswap
                    if shared:
                        memcpy(kcur, kprev, shared)
                    memcpy(kcur + shared, d + pos, unshared)
                    if count > 0 and cmp_keys(kprev, kprevlen - 8, kcur, klen - 8) > 0:
                        order_err = "keys out of order"
                    kswap = kprev
                    kprev = kcur
                    kcur = kswap
                    kprevlen = klen
            prevlen = klen
            pos = pos + unshared + vlen
            count += 1
        if err is not None:
            raise CorruptedData(f"malformed block ({err})", name, offset)
        if order_err is not None:
            raise CorruptedData(order_err, name, offset)
        # Restart points (lookups binary-search them, so they must be right).
        if count > 0:
            rp = 0
            pos = 0
            for i in range(count):
                # entries are contiguous: entry i starts where entry i-1 ends
                if rp < <Py_ssize_t>num_restarts:
                    roff = le32(rbase + 4 * rp)
                    if roff == <uint32_t>pos:
                        if ents[i].shared != 0:
                            raise CorruptedData("malformed block (restart point inside a shared prefix)", name, offset)
                        rest[rp] = <uint32_t>i
                        rp += 1
                    elif roff < <uint32_t>pos:
                        raise CorruptedData("malformed block (bad restart point)", name, offset)
                pos = ents[i].kpos + ents[i].unshared + ents[i].vlen
            if rp != <Py_ssize_t>num_restarts or num_restarts == 0 or rest[0] != 0:
                raise CorruptedData("malformed block (bad restart point)", name, offset)
        blk = Block.__new__(Block)
        blk.data = buf
        blk.nbytes = n
        blk.internal = internal_keys
        blk.trail = trail
        blk.n = count
        blk.maxkey = maxkey
        if count > 0:
            tmp = <Ent*>realloc(ents, count * sizeof(Ent))
            blk.ents = tmp if tmp != NULL else ents
            ents = NULL
            blk.rest = rest
            blk.nrest = rp
            rest = NULL
        return blk
    finally:
        free(ents)
        free(rest)
        free(kprev)
        free(kcur)


# --- encoding ---------------------------------------------------------------------------------

cdef class BlockBuilder:
    """Builds one block with prefix-compressed keys and a restart array (Pebble's estimatedSize in ``size``)."""

    cdef readonly Py_ssize_t restart_interval
    cdef unsigned char* buf
    cdef Py_ssize_t len, cap
    cdef uint32_t* restarts
    cdef Py_ssize_t nrestarts, rcap
    cdef readonly Py_ssize_t counter
    cdef readonly bytes last_key
    cdef readonly Py_ssize_t n_entries
    cdef readonly Py_ssize_t size

    def __cinit__(self, Py_ssize_t restart_interval):
        self.restart_interval = restart_interval
        self.buf = NULL
        self.restarts = NULL
        self.cap = 0
        self.rcap = 0
        self.reset()

    def __dealloc__(self):
        free(self.buf)
        free(self.restarts)

    def reset(self):
        self.len = 0
        self.nrestarts = 0
        self.counter = 0
        self.last_key = b""
        self.n_entries = 0
        self.size = 4

    cdef int grow(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap
        cdef unsigned char* nb
        if self.len + need <= self.cap:
            return 0
        cap = self.cap * 2 if self.cap else 8192
        while cap < self.len + need:
            cap *= 2
        nb = <unsigned char*>realloc(self.buf, cap)
        if nb == NULL:
            raise MemoryError()
        self.buf = nb
        self.cap = cap
        return 0

    cdef int add_c(self, bytes key, const unsigned char* v, Py_ssize_t vlen) except -1:
        cdef const unsigned char* k = <const unsigned char*>PyBytes_AS_STRING(key)
        cdef Py_ssize_t klen = PyBytes_GET_SIZE(key)
        cdef const unsigned char* last
        cdef Py_ssize_t m, shared = 0, unshared
        cdef uint32_t* nr
        if self.counter == 0:
            if self.nrestarts == self.rcap:
                self.rcap = self.rcap * 2 if self.rcap else 64
                nr = <uint32_t*>realloc(self.restarts, self.rcap * sizeof(uint32_t))
                if nr == NULL:
                    raise MemoryError()
                self.restarts = nr
            self.restarts[self.nrestarts] = <uint32_t>self.len
            self.nrestarts += 1
        else:
            last = <const unsigned char*>PyBytes_AS_STRING(self.last_key)
            m = PyBytes_GET_SIZE(self.last_key)
            if klen < m:
                m = klen
            while shared < m and last[shared] == k[shared]:
                shared += 1
        self.counter += 1
        if self.counter == self.restart_interval:
            self.counter = 0
        unshared = klen - shared
        self.grow(30 + unshared + vlen)
        self.len += put_uvarint(self.buf + self.len, shared)
        self.len += put_uvarint(self.buf + self.len, unshared)
        self.len += put_uvarint(self.buf + self.len, vlen)
        if unshared:
            memcpy(self.buf + self.len, k + shared, unshared)
            self.len += unshared
        if vlen:
            memcpy(self.buf + self.len, v, vlen)
            self.len += vlen
        self.last_key = key
        self.n_entries += 1
        self.size = self.len + 4 * self.nrestarts + 4
        return 0

    def add(self, key, value):
        cdef bytes v = as_bytes(value)
        self.add_c(as_bytes(key), <const unsigned char*>PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))

    def estimated_size(self):
        return self.size

    def finish(self):
        cdef Py_ssize_t nr = self.nrestarts if self.nrestarts else 1
        cdef Py_ssize_t total = self.len + 4 * nr + 4
        cdef Py_ssize_t i
        cdef uint32_t r
        cdef unsigned char* p
        out = PyBytes_FromStringAndSize(NULL, total)
        p = <unsigned char*>PyBytes_AS_STRING(out)
        if self.len:
            memcpy(p, self.buf, self.len)
        p += self.len
        for i in range(nr):
            r = self.restarts[i] if self.nrestarts else 0
            p[0] = r & 0xFF
            p[1] = (r >> 8) & 0xFF
            p[2] = (r >> 16) & 0xFF
            p[3] = (r >> 24) & 0xFF
            p += 4
        p[0] = nr & 0xFF
        p[1] = (nr >> 8) & 0xFF
        p[2] = (nr >> 16) & 0xFF
        p[3] = (nr >> 24) & 0xFF
        return out

    def should_flush(self, Py_ssize_t key_len, Py_ssize_t value_len, Py_ssize_t block_size, Py_ssize_t threshold):
        """Pebble's rule for closing a block before adding an entry."""
        return should_flush_c(self.n_entries, self.size, self.restart_interval, key_len, value_len,
                              block_size, threshold)


cdef bint should_flush_c(Py_ssize_t n_entries, Py_ssize_t size, Py_ssize_t restart_interval, Py_ssize_t key_len,
                         Py_ssize_t value_len, Py_ssize_t block_size, Py_ssize_t threshold) noexcept:
    cdef Py_ssize_t new_size
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


def should_flush(Py_ssize_t n_entries, Py_ssize_t size, Py_ssize_t restart_interval, Py_ssize_t key_len,
                 Py_ssize_t value_len, Py_ssize_t block_size, Py_ssize_t threshold):
    """Pebble's shouldFlush: close a block of ``n_entries`` / estimated ``size`` before the next entry?"""
    return should_flush_c(n_entries, size, restart_interval, key_len, value_len, block_size, threshold)


# --- whole-table lookups and scans ------------------------------------------------------------

from graveler._crecord cimport decode_ptr


cdef unsigned char* grow_buf(unsigned char* buf, unsigned char* small, Py_ssize_t n) except NULL:
    """A scratch buffer of ``n`` bytes replacing ``buf`` (which is freed unless it is the stack one)."""
    cdef unsigned char* nb = <unsigned char*>malloc(n)
    if nb == NULL:
        raise MemoryError()
    if buf != small:
        free(buf)
    return nb


import cramjam
import google_crc32c

cdef object _crc32c = google_crc32c.value
cdef object _crc32c_extend = google_crc32c.extend
cdef object _snappy_decompress = cramjam.snappy.decompress_raw
cdef list _CTYPE_BYTES = [bytes((i,)) for i in range(256)]


cdef inline object ctype_bytes(unsigned char c):
    return _CTYPE_BYTES[c]


cdef inline uint32_t mask_crc(object crc):
    cdef uint32_t c = <uint32_t>(<uint64_t>crc & 0xFFFFFFFFULL)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8U) & 0xFFFFFFFFU


cdef class TableCore:
    """The compiled lookup path of one open SSTable (graveler.sstable.reader.SSTable).

    ``top`` is the top-level index block; with a two-level index its values are
    the handles of index partitions, else of data blocks.  Blocks come from the
    shared block cache (``cache.get`` / ``cache.put``, keyed ``(cache_id,
    offset)``) and, on a miss, from ``load(offset, size)``, which reads,
    verifies and decodes one block.
    """

    cdef Block top
    cdef bint two_level
    cdef object cache_get, cache_put, cache_id, load, name
    cdef Py_ssize_t index_offset
    cdef list parts  # index partitions, kept once read (as a table reader keeps its index)
    cdef object owner  # the SSTable (for its blocks_read counter), when the core reads blocks itself
    cdef const unsigned char[::1] buf
    cdef bint has_buf
    cdef int checksum_type

    def __cinit__(self, Block top, bint two_level, cache, cache_id, load, name, Py_ssize_t index_offset,
                  owner=None, buf=None, int checksum_type=1):
        self.top = top
        self.two_level = two_level
        self.parts = [None] * top.n if two_level else []
        self.owner = owner
        self.has_buf = buf is not None
        if self.has_buf:
            self.buf = buf
        self.checksum_type = checksum_type
        self.cache_get = cache.get
        self.cache_put = cache.put
        self.cache_id = cache_id
        self.load = load
        self.name = name
        self.index_offset = index_offset

    cdef Block read(self, uint64_t off, uint64_t size):
        """Read, verify, decompress and decode the block at (off, size): format.read_block + decode_block."""
        cdef Py_ssize_t n, end
        cdef const unsigned char* p
        cdef uint32_t stored
        cdef unsigned char ctype
        if not self.has_buf:
            return <Block>self.load(off, size)
        n = self.buf.shape[0]
        if off > <uint64_t>n or size > <uint64_t>n or off + size + 5 > <uint64_t>n:
            raise CorruptedData(f"block handle (offset {off}, size {size}) points past the end of the file "
                                f"({n} bytes)", self.name, off)
        end = <Py_ssize_t>(off + size)
        p = &self.buf[0]
        body = PyBytes_FromStringAndSize(<const char*>p + off, <Py_ssize_t>size)
        ctype = p[end]
        if self.checksum_type == 1:
            stored = le32(p + end + 1)
            if mask_crc(_crc32c_extend(_crc32c(body), ctype_bytes(ctype))) != stored:
                raise CorruptedData("block checksum mismatch", self.name, off)
        if ctype == 1:
            try:
                body = bytes(_snappy_decompress(body))
            except Exception as e:  # cramjam raises its own DecompressionError
                raise CorruptedData(f"bad Snappy block ({e})", self.name, off) from None
        elif ctype != 0:
            raise CorruptedData(f"unknown compression type {ctype}", self.name, off)
        b = decode_block(body, self.name, off, True)
        self.owner.blocks_read += 1
        return <Block>b

    cdef Block block_at(self, uint64_t off, uint64_t size):
        ck = (self.cache_id, off)
        b = self.cache_get(ck)
        if b is None:
            b = self.read(off, size)
            self.cache_put(ck, b)
        return <Block>b

    cdef int handle_of(self, Block blk, Py_ssize_t i, Py_ssize_t at, uint64_t* off, uint64_t* size) except -1:
        if blk.handle_c(i, off, size) != 0:
            raise CorruptedData("malformed block handle", self.name, at)
        return 0

    cdef Block partition(self, Py_ssize_t p, Py_ssize_t* at):
        """Index partition ``p`` (the top index itself for a one-level index); ``at``: where it starts."""
        cdef uint64_t off, size
        if not self.two_level:
            at[0] = self.index_offset
            return self.top
        self.handle_of(self.top, p, self.index_offset, &off, &size)
        at[0] = <Py_ssize_t>off
        b = self.parts[p]
        if b is None:
            b = self.parts[p] = self.read(off, size)
        return <Block>b

    cdef Py_ssize_t nparts(self):
        return self.top.n if self.two_level else 1

    def get(self, key):
        """The value stored under exactly ``key``, or None."""
        cdef bytes k = as_bytes(key)
        cdef const unsigned char* kp = <const unsigned char*>PyBytes_AS_STRING(k)
        cdef Py_ssize_t kl = PyBytes_GET_SIZE(k), p = 0, bi, i, at
        cdef unsigned char small[512]
        cdef unsigned char* buf = small
        cdef Py_ssize_t cap = 512
        cdef bint eq
        cdef uint64_t off, size
        cdef Block part, blk
        try:
            if self.two_level:
                if self.top.maxkey > cap:
                    buf = grow_buf(buf, small, self.top.maxkey)
                    cap = self.top.maxkey
                p = self.top.find_c(kp, kl, buf, &eq)
                if p >= self.top.n:
                    return None
            part = self.partition(p, &at)
            if part.maxkey > cap:
                buf = grow_buf(buf, small, part.maxkey)
                cap = part.maxkey
            bi = part.find_c(kp, kl, buf, &eq)
            if bi >= part.n:
                return None
            self.handle_of(part, bi, at, &off, &size)
            blk = self.block_at(off, size)
            if blk.maxkey > cap:
                buf = grow_buf(buf, small, blk.maxkey)
                cap = blk.maxkey
            i = blk.find_c(kp, kl, buf, &eq)
            if eq:
                return blk.value_c(i)
            return None
        finally:
            if buf != small:
                free(buf)

    def scan(self, start=b"", bint records=False):
        """Iterator over (key, value) from ``start`` on; ``records``: values as graveler Values."""
        return TableIter(self, as_bytes(start), records)


cdef class TableIter:
    """A table scan: positions lazily (on the first ``next``), then walks blocks and partitions."""

    cdef TableCore core
    cdef bytes start
    cdef bint records, started
    cdef Py_ssize_t p, bi, part_at
    cdef Block part, blk
    cdef Py_ssize_t ei
    cdef unsigned char* buf
    cdef Py_ssize_t cap

    def __cinit__(self, TableCore core, bytes start, bint records):
        self.core = core
        self.start = start
        self.records = records
        self.started = False
        self.buf = NULL
        self.cap = 0
        self.blk = None
        self.part = None

    def __dealloc__(self):
        free(self.buf)

    def __iter__(self):
        return self

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef unsigned char* nb
        if n <= self.cap:
            return 0
        nb = <unsigned char*>realloc(self.buf, n if n > 64 else 64)
        if nb == NULL:
            raise MemoryError()
        self.buf = nb
        self.cap = n if n > 64 else 64
        return 0

    cdef int enter_block(self) except -1:
        """Load data block ``bi`` of the current partition, at its first record."""
        cdef uint64_t off, size
        self.core.handle_of(self.part, self.bi, self.part_at, &off, &size)
        self.blk = self.core.block_at(off, size)
        self.reserve(self.blk.maxkey)
        self.ei = 0
        return 0

    cdef int position(self) except -1:
        cdef const unsigned char* kp = <const unsigned char*>PyBytes_AS_STRING(self.start)
        cdef Py_ssize_t kl = PyBytes_GET_SIZE(self.start)
        cdef bint eq
        self.started = True
        self.p = 0
        if self.core.two_level:
            self.reserve(self.core.top.maxkey)
            self.p = self.core.top.find_c(kp, kl, self.buf, &eq)
        if self.p >= self.core.nparts():
            return 0
        self.part = self.core.partition(self.p, &self.part_at)
        self.reserve(self.part.maxkey)
        self.bi = self.part.find_c(kp, kl, self.buf, &eq)
        if self.bi >= self.part.n:
            # nothing >= start in this partition (only possible with an inconsistent index): go on
            return 0
        self.enter_block()
        self.ei = self.blk.find_c(kp, kl, self.buf, &eq)
        if self.ei > 0 and self.ei < self.blk.n:
            self.blk.build_key(self.ei - 1, self.buf)
        return 0

    cdef bint advance(self) except -1:
        """Move to the next non-exhausted block; False at the end of the table."""
        while True:
            if self.part is not None:
                self.bi += 1
                if self.bi < self.part.n:
                    self.enter_block()
                    if self.blk.n > 0:
                        return True
                    continue
            self.p += 1
            if self.p >= self.core.nparts():
                self.part = None
                self.blk = None
                return False
            self.part = self.core.partition(self.p, &self.part_at)
            self.bi = -1

    def __next__(self):
        cdef Block b
        cdef Ent* e
        cdef const char* d
        if not self.started:
            self.position()
        b = self.blk
        if b is None or self.ei >= b.n:
            if self.part is None and b is None and self.started and self.p >= self.core.nparts():
                raise StopIteration
            if not self.advance():
                raise StopIteration
            b = self.blk
        e = &b.ents[self.ei]
        d = PyBytes_AS_STRING(b.data)
        memcpy(self.buf + e.shared, d + e.kpos, e.unshared)
        self.ei += 1
        k = PyBytes_FromStringAndSize(<char*>self.buf, <Py_ssize_t>(e.shared + e.unshared) - b.trail)
        if self.records:
            v = decode_ptr(<const unsigned char*>d + e.kpos + e.unshared, e.vlen, self.core.name)
        else:
            v = PyBytes_FromStringAndSize(d + e.kpos + e.unshared, e.vlen)
        t = PyTuple_New(2)
        Py_INCREF(k)
        Py_INCREF(v)
        PyTuple_SET_ITEM(t, 0, k)
        PyTuple_SET_ITEM(t, 1, v)
        return t


# --- the writer's per-record loop ---------------------------------------------------------------

from cpython.bytearray cimport PyByteArray_GET_SIZE

from graveler.errors import InvalidArgument

cdef bytes SET_TRAILER_B = b"\x01\x00\x00\x00\x00\x00\x00\x00"
cdef bytes SEPARATOR_TRAILER_B = b"\x11\xff\xff\xff\xff\xff\xff\xff"  # (SEQNUM_MAX << 8) | KIND_SEPARATOR


cdef bytes with_trailer(bytes key, bytes trailer):
    cdef Py_ssize_t n = PyBytes_GET_SIZE(key)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n + 8)
    cdef char* p = PyBytes_AS_STRING(out)
    memcpy(p, PyBytes_AS_STRING(key), n)
    memcpy(p + n, PyBytes_AS_STRING(trailer), 8)
    return out


cdef bytes index_key(bytes a, bytes b):
    """Pebble's index key for a block ending at ``a`` followed by ``b``: Separator(a, b), trailer included."""
    cdef const unsigned char* pa = <const unsigned char*>PyBytes_AS_STRING(a)
    cdef const unsigned char* pb = <const unsigned char*>PyBytes_AS_STRING(b)
    cdef Py_ssize_t la = PyBytes_GET_SIZE(a), lb = PyBytes_GET_SIZE(b), n = la if la < lb else lb, i = 0, j
    cdef bytes sep
    cdef unsigned char* ps
    while i < n and pa[i] == pb[i]:
        i += 1
    if i >= n or pa[i] >= pb[i]:
        return with_trailer(a, SET_TRAILER_B)  # separator is a itself
    if i < lb - 1 or pa[i] + 1 < pb[i]:
        j = i
    else:
        j = i + 1
        while j < la and pa[j] == 0xFF:
            j += 1
        if j >= la:
            return with_trailer(a, SET_TRAILER_B)
    # separator = a[:j] + (a[j] + 1): shorter than a or equal length, and greater than a
    if j + 1 > la:
        return with_trailer(a, SET_TRAILER_B)
    sep = PyBytes_FromStringAndSize(NULL, j + 1 + 8)
    ps = <unsigned char*>PyBytes_AS_STRING(sep)
    memcpy(ps, pa, j)
    ps[j] = pa[j] + 1
    memcpy(ps + j + 1, PyBytes_AS_STRING(SEPARATOR_TRAILER_B), 8)
    if j + 1 == la and memcmp(ps, pa, la) <= 0:
        return with_trailer(a, SET_TRAILER_B)
    return sep


def index_key_for(a, b):
    """The index entry key Pebble writes for a data block ending at ``a`` when ``b`` follows (tests)."""
    return index_key(as_bytes(a), as_bytes(b))


cdef uint64_t FNV_OFFSET = 0xCBF29CE484222325ULL
cdef uint64_t FNV_PRIME = 0x100000001B3ULL


def add_records(w, list records, Py_ssize_t lo, Py_ssize_t min_size, Py_ssize_t max_size,
                uint64_t raggedness, hasher):
    """Add ``records[lo:]`` ((key, value) pairs) to the SSTableWriter ``w`` exactly as ``w.add`` would.

    ``hasher`` (a graveler.ident.TableHasher, or None) gets each record's table-ID input.  With
    ``raggedness`` > 0, stop after the first record where lakeFS's range-break rule holds: the
    writer's estimated size is >= ``min_size`` and either >= ``max_size`` or FNV-1a-64(key) is 0
    modulo ``raggedness``.  Returns (index after the last record added, whether it stopped on a break).
    """
    cdef BlockBuilder data = <BlockBuilder?>w._data
    cdef BlockBuilder index = <BlockBuilder?>w._index
    cdef bytearray out = <bytearray?>w._out
    cdef Py_ssize_t threshold = w._threshold, block_size = w._block_size
    cdef Py_ssize_t i = lo, n = len(records), added = 0, raw_k = 0, raw_v = 0, est, lk, lv
    cdef object last = w._last_key
    cdef bint pending = w._pending is not None, broke = False
    cdef bytes key, value, ikey
    cdef tuple rec
    cdef const unsigned char* kp
    cdef uint64_t h
    cdef Py_ssize_t j, hlen = 0, hcap = 0
    cdef unsigned char* hb = NULL
    cdef unsigned char* nb
    cdef int c
    try:
        while i < n:
            rec = <tuple?>records[i]
            key = as_bytes(rec[0])
            value = as_bytes(rec[1])
            lk = PyBytes_GET_SIZE(key)
            lv = PyBytes_GET_SIZE(value)
            if last is not None:
                c = cmp_keys(<const unsigned char*>PyBytes_AS_STRING(key), lk,
                             <const unsigned char*>PyBytes_AS_STRING(<bytes>last), PyBytes_GET_SIZE(<bytes>last))
                if c <= 0:
                    raise InvalidArgument(f"SSTable keys must be strictly increasing: {key!r} after {last!r}")
            ikey = with_trailer(key, SET_TRAILER_B)
            if data.size > threshold and should_flush_c(data.n_entries, data.size, data.restart_interval, lk + 8, lv,
                                                        block_size, threshold):
                w._last_key = last
                w._verbatim = None
                w._flush_data_block()
                pending = w._pending is not None
            if pending:
                w._add_index_entry(index_key(<bytes>w._pending_last, key))
                pending = False
            data.add_c(ikey, <const unsigned char*>PyBytes_AS_STRING(value), lv)
            if last is None:
                w.first_key = key
            last = key
            added += 1
            raw_k += lk + 8
            raw_v += lv
            i += 1
            if hasher is not None:
                j = dec_len(lk) + lk + dec_len(lv) + lv + 2
                if hlen + j > hcap:
                    hcap = (hlen + j) * 2 if (hlen + j) * 2 > 65536 else 65536
                    nb = <unsigned char*>realloc(hb, hcap)
                    if nb == NULL:
                        raise MemoryError()
                    hb = nb
                hlen += put_dec(hb + hlen, lk)
                memcpy(hb + hlen, PyBytes_AS_STRING(key), lk)
                hlen += lk
                hb[hlen] = 124
                hlen += 1
                hlen += put_dec(hb + hlen, lv)
                memcpy(hb + hlen, PyBytes_AS_STRING(value), lv)
                hlen += lv
                hb[hlen] = 124
                hlen += 1
            if raggedness:
                est = PyByteArray_GET_SIZE(out) + data.size + index.size
                if est >= min_size:
                    if est >= max_size:
                        broke = True
                        break
                    kp = <const unsigned char*>PyBytes_AS_STRING(key)
                    h = FNV_OFFSET
                    for j in range(lk):
                        h = (h ^ kp[j]) * FNV_PRIME
                    if h % raggedness == 0:
                        broke = True
                        break
        return i, broke
    finally:
        w._last_key = last
        w._verbatim = None
        w.num_entries += added
        w.raw_key_size += raw_k
        w.raw_value_size += raw_v
        if hasher is not None and hlen:
            hasher.add_input(PyBytes_FromStringAndSize(<char*>hb, hlen))
        free(hb)


cdef inline Py_ssize_t dec_len(Py_ssize_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 10:
        v //= 10
        n += 1
    return n


cdef inline Py_ssize_t put_dec(unsigned char* p, Py_ssize_t v) noexcept nogil:
    cdef Py_ssize_t n = dec_len(v), i = n
    while i > 0:
        i -= 1
        p[i] = <unsigned char>(48 + v % 10)
        v //= 10
    return n


cdef int add_index_entry(w, BlockBuilder index, uint64_t off, uint64_t size, bytes ikey,
                         Py_ssize_t block_size, Py_ssize_t threshold) except -1:
    """SSTableWriter._add_index_entry for the pending block (``off``, ``size``)."""
    cdef unsigned char hb[20]
    cdef Py_ssize_t hl = put_uvarint(hb, off)
    hl += put_uvarint(hb + hl, size)
    w._pending = None
    if should_flush_c(index.n_entries, index.size, index.restart_interval, PyBytes_GET_SIZE(ikey), hl,
                      block_size, threshold):
        w._finish_partition()
    index.add_c(ikey, hb, hl)
    return 0


def carry_block(w, bytes raw, bytes first_key, Py_ssize_t first_vlen, bytes last_key, Py_ssize_t n,
                Py_ssize_t raw_key_size, Py_ssize_t raw_value_size, Py_ssize_t nbytes, next_key,
                Py_ssize_t next_value_len, Py_ssize_t max_estimate):
    """SSTableWriter.append_block_summary, compiled (same checks, same state changes, same bytes)."""
    cdef BlockBuilder data = <BlockBuilder?>w._data
    cdef BlockBuilder index = <BlockBuilder?>w._index
    cdef bytearray out = <bytearray?>w._out
    cdef Py_ssize_t threshold = w._threshold, block_size = w._block_size, off
    cdef object last, pending
    if next_key is None:
        return False
    # (a) the open block would be closed before this block's first record
    if data.n_entries and not should_flush_c(data.n_entries, data.size, data.restart_interval,
                                             PyBytes_GET_SIZE(first_key) + 8, first_vlen, block_size, threshold):
        return False
    # (b) the block would be closed before the record after it
    if not should_flush_c(n, nbytes, 16, len(next_key) + 8, next_value_len, block_size, threshold):
        return False
    last = w._last_key
    if last is not None and cmp_keys(<const unsigned char*>PyBytes_AS_STRING(first_key), PyBytes_GET_SIZE(first_key),
                                     <const unsigned char*>PyBytes_AS_STRING(<bytes>last),
                                     PyBytes_GET_SIZE(<bytes>last)) <= 0:
        raise InvalidArgument(f"SSTable keys must be strictly increasing: {first_key!r} after {last!r}")
    if data.n_entries:
        w._flush_data_block()
    pending = w._pending
    if pending is not None:
        add_index_entry(w, index, pending.offset, pending.size, index_key(<bytes>w._pending_last, first_key),
                        block_size, threshold)
    # (c) no size-based range break inside the block (checked against the estimate at its end)
    if PyByteArray_GET_SIZE(out) + nbytes + index.size >= max_estimate:
        return False
    off = PyByteArray_GET_SIZE(out)
    out += raw
    w._verbatim = (PyBytes_GET_SIZE(raw), nbytes)
    w.num_data_blocks += 1
    w._pending = BlockHandle(off, PyBytes_GET_SIZE(raw) - 5)
    w._pending_last = last_key
    if last is None:
        w.first_key = first_key
    w._last_key = last_key
    w.num_entries += n
    w.raw_key_size += raw_key_size
    w.raw_value_size += raw_value_size
    return True
