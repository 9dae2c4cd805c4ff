# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled block codec: the per-record loops of graveler.sstable.block.

Same format, same results and same errors as the pure-Python reference in
``block.py`` (``PyBlock``, ``py_decode_block``, ``PyBlockBuilder``); the
equivalence is tested record for record and byte for byte.  Decoding a block
validates every entry in one pass and keeps only the block's bytes plus a
small table of entry positions: lookups binary-search the restart points and
scan a few entries, building Python objects only for what they return.
"""

cimport cython
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memcmp
from libc.stdint cimport uint32_t, uint64_t, int64_t
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from cpython.buffer cimport PyBUF_WRITE
from cpython.memoryview cimport PyMemoryView_FromMemory

from graveler.errors import CorruptedData
from graveler.sstable.block import not_a_value
from graveler.sstable.format import BlockHandle, compression_error

cdef inline bytes as_bytes(object b):
    if type(b) is bytes:
        return <bytes>b
    return bytes(b)


# --- decoding ---------------------------------------------------------------------------------

@cython.no_gc
cdef class Block:
    """A validated block: its bytes and entry table.  Internal-key trailers are not part of ``keys``.

    Not tracked by Python's cycle collector: it refers only to bytes and lists of bytes, so it can be in
    no cycle, and a block cache of tens of thousands of them would otherwise be walked by every full
    collection of a busy process.
    """

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

    cdef object value_c(self, Py_ssize_t i):
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


def decode_block(data, name, offset, bint internal_keys, bint data_block=False):
    """Validate and index a block.  Any inconsistency raises CorruptedData at ``offset``; a data
    block (``data_block``) holding a record that is not a value, UnsupportedFormat."""
    return decode_block_c(as_bytes(data), name, offset, internal_keys, data_block)


cdef Block decode_block_c(bytes buf, object name, object offset, bint internal_keys, bint data_block=False):
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
    cdef Py_ssize_t tail
    cdef object kind_err = None
    cdef object err = None
    cdef object order_err = None
    cdef Py_ssize_t i
    cdef Block blk

    if n < 4:
        raise CorruptedData("malformed block (block shorter than its restart count)", name, offset)
    num_restarts = le32(d + n - 4)
    tail = 4
    if num_restarts & 0x80000000u:  # a data block with RocksDB's hash index: its buckets before the count
        num_restarts &= 0x7fffffffu
        if n < 6:
            raise CorruptedData("malformed block (block shorter than its hash index)", name, offset)
        tail += 2 + (d[n - 6] | (<Py_ssize_t>d[n - 5] << 8))
    limit = <int64_t>n - tail - 4 * <int64_t>num_restarts
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
                    elif data_block and kcur[klen - 8] != 1 and kind_err is None:  # (block.KIND_VALUE)
                        kind_err = not_a_value(kcur[klen - 8], PyBytes_FromStringAndSize(<char*>kcur, klen - 8),
                                               name, offset)
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
        if kind_err is not None:
            raise kind_err
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
        self.reset_c()

    cdef int reset_c(self) noexcept:
        self.len = 0
        self.nrestarts = 0
        self.counter = 0
        self.last_key = b""
        self.n_entries = 0
        self.size = 4
        return 0

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
        return self.finish_c()

    cdef bytes finish_c(self):
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

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid

cdef const char* VALUE_FN_CAPSULE = b"graveler.sstable.value_fn"


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
cdef object _snappy_decompress_into = cramjam.snappy.decompress_raw_into
cdef list _CTYPE_BYTES = [bytes((i,)) for i in range(256)]


cdef inline object ctype_bytes(unsigned char c):
    return _CTYPE_BYTES[c]


cdef inline uint32_t mask_crc(object crc):
    cdef uint32_t c = <uint32_t>(<uint64_t>crc & 0xFFFFFFFFULL)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8U) & 0xFFFFFFFFU


# google-crc32c's C library (what google_crc32c.value runs), called through its C entry point when it can
# be found: a block's checksum is then computed where the block lies (a mapped file), with no bytes copy
# and no Python call per block. Found by ctypes in the wheel's bundled library; checked against the Python
# binding on a test vector; otherwise the Python binding is used.
ctypedef uint32_t (*crc32c_extend_fn)(uint32_t crc, const unsigned char* data, size_t n) noexcept nogil
cdef crc32c_extend_fn _crc_fn = NULL


def _bind_crc32c():
    global _crc_fn
    import ctypes
    import ctypes.util
    import glob
    import os

    here = os.path.dirname(google_crc32c.__file__)
    candidates = sorted(glob.glob(os.path.join(here, "..", "google_crc32c.libs", "libcrc32c*.so*")))
    candidates += [getattr(getattr(google_crc32c, "_crc32c", None), "__file__", None), ctypes.util.find_library("crc32c")]
    for path in candidates:
        if not path:
            continue
        try:
            fn = ctypes.CDLL(path).crc32c_extend
        except (OSError, AttributeError):
            continue
        _crc_fn = <crc32c_extend_fn><size_t>ctypes.cast(fn, ctypes.c_void_p).value
        probe = b"123456789 lakefuse"
        if _crc_fn(0, <const unsigned char*>PyBytes_AS_STRING(probe), len(probe)) == google_crc32c.value(probe):
            return path
        _crc_fn = NULL
    return None


CRC32C_LIBRARY = _bind_crc32c()


cdef uint32_t block_crc(const unsigned char* p, Py_ssize_t n, unsigned char ctype):
    """The masked CRC32C of a block's stored bytes and its compression type byte (its trailer's checksum)."""
    cdef uint32_t c
    if _crc_fn != NULL:
        c = _crc_fn(0, p, <size_t>n)
        c = _crc_fn(c, &ctype, 1)
        return ((c >> 15) | (c << 17)) + 0xA282EAD8U
    return mask_crc(_crc32c_extend(_crc32c(PyBytes_FromStringAndSize(<const char*>p, n)), ctype_bytes(ctype)))


def block_checksum(data, unsigned char ctype):
    """``block_crc`` of ``data`` (tests: the C entry point against the Python binding)."""
    cdef bytes b = as_bytes(data)
    return block_crc(<const unsigned char*>PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b), ctype)


cdef class Scratch:
    """A buffer blocks are decompressed into, one after another (grown as needed, never shrunk)."""

    def __cinit__(self):
        self.buf = None
        self.view = None
        self.cap = 0

    cdef unsigned char* ensure(self, Py_ssize_t n) except NULL:
        cdef Py_ssize_t cap = self.cap
        if n > cap or self.buf is None:
            cap = cap * 2 if cap else 1 << 16
            while cap < n:
                cap *= 2
            self.buf = bytearray(cap)
            self.view = memoryview(self.buf)
            self.cap = cap
        return <unsigned char*>(<char*>self.buf)


cdef class TableCore:
    """The compiled lookup path of one open SSTable (graveler.sstable.reader.SSTable).

    ``top`` is the top-level index block; with a two-level index its values are
    the handles of index partitions, else of data blocks.  Blocks come from the
    shared block cache (``cache.get`` / ``cache.put``, keyed ``(cache_id,
    offset)``) and, on a miss, from ``load(offset, size)``, which reads,
    verifies and decodes one block.
    """

    def __cinit__(self, Block top, bint two_level, cache, cache_id, load, name, Py_ssize_t index_offset,
                  owner=None, buf=None, int checksum_type=1, bint index_internal=True):
        self.index_internal = index_internal
        self.top = top
        self.two_level = two_level
        self.parts = [None] * top.n if two_level else []
        self.owner = owner
        self.has_buf = buf is not None
        self.buf_obj = buf
        self.pybuf = None
        if self.has_buf:
            self.buf = buf
        self.checksum_type = checksum_type
        self.cache_get = cache.get
        self.cache_put = cache.put
        self.cache_id = cache_id
        self.load = load
        self.name = name
        self.index_offset = index_offset

    cdef Block read(self, uint64_t off, uint64_t size, bint internal=True, bint data=True):
        """Read, verify, decompress and decode the block at (off, size): format.read_block + decode_block
        (``internal``: its keys are internal keys, an index partition's may not be; ``data``: a data
        block, not an index partition)."""
        if not self.has_buf:
            return <Block>self.load(off, size, internal, data)
        b = decode_block_c(self.read_contents(off, size), self.name, off, internal, data)
        self.owner.blocks_read += 1
        return <Block>b

    cdef Py_ssize_t checked_end(self, uint64_t off, uint64_t size) except -1:
        """Where the block at (off, size) ends (its trailer: compression type, then CRC), once its
        handle is checked against the file's size and its checksum verified."""
        cdef Py_ssize_t n = self.buf.shape[0], end
        cdef const unsigned char* p
        if off > <uint64_t>n or size > <uint64_t>n or off + size + 5 > <uint64_t>n:
            raise CorruptedData(f"block handle (offset {off}, size {size}) points past the end of the file "
                                f"({n} bytes)", self.name, off)
        end = <Py_ssize_t>(off + size)
        p = &self.buf[0]
        if self.checksum_type == 1 and block_crc(p + off, <Py_ssize_t>size, p[end]) != le32(p + end + 1):
            raise CorruptedData("block checksum mismatch", self.name, off)
        return end

    cdef bytes read_contents(self, uint64_t off, uint64_t size):
        """The contents of the block at (off, size), checksum verified and decompressed (format.read_block).

        Snappy blocks are decompressed straight from the file's buffer into the bytes object returned."""
        cdef Py_ssize_t end, pos = 0
        cdef const unsigned char* p
        cdef uint64_t ulen
        cdef unsigned char ctype
        cdef bytes out
        end = self.checked_end(off, size)
        p = &self.buf[0]
        ctype = p[end]
        if ctype == 0:
            return PyBytes_FromStringAndSize(<const char*>p + off, <Py_ssize_t>size)
        if ctype != 1:
            raise compression_error(ctype, self.name, off)
        # Snappy's raw format starts with the uncompressed length
        if read_uvarint(p + off, <Py_ssize_t>size, &pos, &ulen) != 0 or ulen > <uint64_t>(64 * size + 64) \
                or ulen > (1 << 31):
            raise CorruptedData("bad Snappy block (bad length)", self.name, off)
        out = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>ulen)
        if self.pybuf is None:
            self.pybuf = memoryview(self.buf_obj)
        try:
            got = _snappy_decompress_into(self.pybuf[off:end],
                                          PyMemoryView_FromMemory(PyBytes_AS_STRING(out), <Py_ssize_t>ulen, PyBUF_WRITE))
        except Exception as e:  # cramjam raises its own DecompressionError
            raise CorruptedData(f"bad Snappy block ({e})", self.name, off) from None
        if got != <Py_ssize_t>ulen:
            raise CorruptedData("bad Snappy block (short)", self.name, off)
        return out

    cdef Py_ssize_t read_raw(self, uint64_t off, uint64_t size, Scratch s, const unsigned char** out) except -1:
        """The contents of the block at (off, size), checksum verified, as ``read_contents`` reads them but
        with no object made: ``out`` points into the file's buffer (an uncompressed block) or into ``s`` (a
        Snappy block, decompressed there). Returns their length."""
        cdef Py_ssize_t end, pos = 0
        cdef const unsigned char* p
        cdef uint64_t ulen
        cdef unsigned char ctype
        end = self.checked_end(off, size)
        p = &self.buf[0]
        ctype = p[end]
        if ctype == 0:
            out[0] = p + off
            return <Py_ssize_t>size
        if ctype != 1:
            raise compression_error(ctype, self.name, off)
        if read_uvarint(p + off, <Py_ssize_t>size, &pos, &ulen) != 0 or ulen > <uint64_t>(64 * size + 64) \
                or ulen > (1 << 31):
            raise CorruptedData("bad Snappy block (bad length)", self.name, off)
        s.ensure(<Py_ssize_t>ulen)
        if self.pybuf is None:
            self.pybuf = memoryview(self.buf_obj)
        try:
            got = _snappy_decompress_into(self.pybuf[off:end], s.view)
        except Exception as e:  # cramjam raises its own DecompressionError
            raise CorruptedData(f"bad Snappy block ({e})", self.name, off) from None
        if got != <Py_ssize_t>ulen:
            raise CorruptedData("bad Snappy block (short)", self.name, off)
        out[0] = <const unsigned char*>(<char*>s.buf)
        return <Py_ssize_t>ulen

    cdef Block block_at(self, uint64_t off, uint64_t size):
        ck = (self.cache_id, off)
        b = self.cache_get(ck)
        if b is None:
            b = self.read(off, size)
            self.cache_put(ck, b)
        return <Block>b

    def cached_block(self, uint64_t off, uint64_t size):
        """The data block or index partition at (off, size), through the block cache (SSTable._cached_block)."""
        return self.block_at(off, size)

    cdef int handle_of(self, Block blk, Py_ssize_t i, Py_ssize_t at, uint64_t* off, uint64_t* size) except -1:
        """Handle ``i`` of the index block at ``at``: a block of its own (not empty) before that index
        block (data blocks, then index partitions, then the top index), else the index is damaged --
        said at ``at``, not where a zeroed handle (offset 0) would send the read."""
        if blk.handle_c(i, off, size) != 0:
            raise CorruptedData("malformed block handle", self.name, at)
        if size[0] == 0 or off[0] + size[0] + 5 > <uint64_t>at:  # (5: a block's trailer)
            raise CorruptedData(f"damaged index: entry {i} names a block at offset {off[0]} of {size[0]} bytes, "
                                "which is not before the index block", self.name, at)
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
            b = self.parts[p] = self.read(off, size, self.index_internal, False)
        return <Block>b

    def partition_block(self, Py_ssize_t p):
        """Index partition ``p`` of a two-level index (SSTable._partition)."""
        cdef Py_ssize_t at
        return self.partition(p, &at)

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

    def scan(self, start=b"", decode=None):
        """Iterator over (key, value) from ``start`` on; ``decode``: each value becomes ``decode(value, name)``
        (through its ``c_decoder`` capsule, a ``value_fn``, when it has one)."""
        return TableIter(self, as_bytes(start), decode)

    def records_digest(self, suffix=b""):
        """The hex SHA-256 of every record's table-ID input (see ``hash_records``) and then ``suffix``: hashed on
        a thread of its own while the blocks are read."""
        h = Sha256(threaded=True)
        self.hash_records(h)
        return h.hexdigest(suffix)

    def hash_records(self, Sha256 h):
        """Feed every record's table-ID input (``len(key) key | len(value) value |``, lengths in decimal) to
        ``h``, in order: a table's ID hashes this, then its properties. Blocks are read uncached and each
        checked as any read is; nothing per record is built as a Python object. Returns the record count."""
        cdef Py_ssize_t p, bi, at, count = 0, kcap = 0, dn
        cdef uint64_t off, size
        cdef Block part, blk
        cdef unsigned char* kb = NULL
        cdef unsigned char* nb
        cdef const unsigned char* d
        cdef RawBlockInfo info
        cdef Scratch scratch = Scratch()
        try:
            for p in range(self.nparts()):
                part = self.partition(p, &at)
                for bi in range(part.n):
                    self.handle_of(part, bi, at, &off, &size)
                    if self.has_buf:
                        # decompressed into one scratch buffer, walked once to size the input, once to stage it
                        dn = self.read_raw(off, size, scratch, &d)
                        if scan_raw_block(d, dn, &info) != 0:
                            raise CorruptedData("malformed block", self.name, off)
                        if info.maxkey > kcap:
                            nb = <unsigned char*>realloc(kb, info.maxkey)
                            if nb == NULL:
                                raise MemoryError()
                            kb, kcap = nb, info.maxkey
                        stage_raw_block(h, d, dn, &info, kb)
                        count += info.n
                        continue
                    blk = self.read(off, size)
                    if blk.maxkey > kcap:
                        nb = <unsigned char*>realloc(kb, blk.maxkey)
                        if nb == NULL:
                            raise MemoryError()
                        kb, kcap = nb, blk.maxkey
                    hash_block_records(h, blk, kb)
                    count += blk.n
        finally:
            free(kb)
        return count


cdef int hash_block_records(Sha256 h, Block blk, unsigned char* kb) except -1:
    """Write the table-ID input of every record of a decoded block (``len(key) key | len(value) value |``,
    lengths in decimal) straight into ``h``'s stage. ``kb``: a key buffer of at least ``blk.maxkey`` bytes."""
    cdef const unsigned char* d = <const unsigned char*>PyBytes_AS_STRING(blk.data)
    cdef Py_ssize_t i, lk, total = 0
    cdef Ent* e
    cdef unsigned char* q
    for i in range(blk.n):
        e = &blk.ents[i]
        lk = <Py_ssize_t>(e.shared + e.unshared) - blk.trail
        total += dec_len(lk) + lk + dec_len(e.vlen) + e.vlen + 2
    q = h.reserve(total)
    for i in range(blk.n):
        e = &blk.ents[i]
        memcpy(kb + e.shared, d + e.kpos, e.unshared)
        lk = <Py_ssize_t>(e.shared + e.unshared) - blk.trail
        q += put_dec(q, lk)
        memcpy(q, kb, lk)
        q += lk
        q[0] = 124
        q += 1
        q += put_dec(q, e.vlen)
        memcpy(q, d + e.kpos + e.unshared, e.vlen)
        q += e.vlen
        q[0] = 124
        q += 1
    h.commit(total)
    return 0


cdef int scan_raw_block(const unsigned char* d, Py_ssize_t n, RawBlockInfo* info) noexcept nogil:
    """Walk the entries of a decompressed data block (internal keys) once, checking each lies inside the block
    and shares no more than the key before it had: ``info`` gets their count and sizes. -1 if malformed. (The
    restart array is not checked: ``decode_block_c`` does that for blocks that are looked up.)"""
    cdef uint64_t num_restarts, shared, unshared, vlen
    cdef int64_t limit
    cdef Py_ssize_t pos = 0, prevlen = 0, klen
    info.n = info.raw_k = info.raw_v = info.id_bytes = info.maxkey = 0
    info.first_key = NULL
    info.first_klen = info.first_vlen = 0
    if n < 4:
        return -1
    num_restarts = le32(d + n - 4)
    limit = <int64_t>n - 4 - 4 * <int64_t>num_restarts
    if limit < 0 or (num_restarts == 0 and limit > 0):
        return -1
    while pos < limit:
        if read_uvarint(d, n, &pos, &shared) != 0 or read_uvarint(d, n, &pos, &unshared) != 0 \
                or read_uvarint(d, n, &pos, &vlen) != 0:
            return -1
        if shared > <uint64_t>prevlen or unshared > <uint64_t>limit or vlen > <uint64_t>limit \
                or <int64_t>(pos + unshared + vlen) > limit:
            return -1
        klen = <Py_ssize_t>(shared + unshared)
        if klen < 8:
            return -1
        if info.n == 0:
            info.first_key = d + pos
            info.first_klen = klen - 8
            info.first_vlen = <Py_ssize_t>vlen
        if klen > info.maxkey:
            info.maxkey = klen
        info.raw_k += klen
        info.raw_v += <Py_ssize_t>vlen
        info.id_bytes += dec_len(klen - 8) + klen - 8 + dec_len(<Py_ssize_t>vlen) + <Py_ssize_t>vlen + 2
        info.n += 1
        prevlen = klen
        pos += <Py_ssize_t>(unshared + vlen)
    return 0


cdef Py_ssize_t stage_raw_block(Sha256 h, const unsigned char* d, Py_ssize_t n, const RawBlockInfo* info,
                                unsigned char* kb) except -1:
    """Write the table-ID input of the records of a decompressed data block that ``scan_raw_block`` accepted
    (``info``) into ``h``'s stage (None: none). ``kb``: a key buffer of at least ``info.maxkey`` bytes; it holds the last
    record's stored key afterwards. Returns that key's user length."""
    cdef uint64_t shared, unshared, vlen
    cdef Py_ssize_t pos = 0, i, lk = 0
    cdef unsigned char* q
    if h is None:  # (an unhashed table: only the last key)
        for i in range(info.n):
            read_uvarint(d, n, &pos, &shared)
            read_uvarint(d, n, &pos, &unshared)
            read_uvarint(d, n, &pos, &vlen)
            memcpy(kb + shared, d + pos, unshared)
            lk = <Py_ssize_t>(shared + unshared) - 8
            pos += <Py_ssize_t>(unshared + vlen)
        return lk
    q = h.reserve(info.id_bytes)
    for i in range(info.n):
        read_uvarint(d, n, &pos, &shared)
        read_uvarint(d, n, &pos, &unshared)
        read_uvarint(d, n, &pos, &vlen)
        memcpy(kb + shared, d + pos, unshared)
        lk = <Py_ssize_t>(shared + unshared) - 8
        q += put_dec(q, lk)
        memcpy(q, kb, lk)
        q += lk
        q[0] = 124
        q += 1
        q += put_dec(q, <Py_ssize_t>vlen)
        memcpy(q, d + pos + unshared, vlen)
        q += vlen
        q[0] = 124
        q += 1
        pos += <Py_ssize_t>(unshared + vlen)
    h.commit(info.id_bytes)
    return lk


cdef class TableIter:
    """A table scan: positions lazily (on the first ``next``), then walks blocks and partitions."""

    cdef TableCore core
    cdef bytes start
    cdef bint started
    cdef object decode       # a Python decoder without a C entry point (None: values as bytes)
    cdef value_fn decode_c   # the decoder's C entry point (NULL: none)
    cdef Py_ssize_t p, bi, part_at
    cdef Block part, blk
    cdef Py_ssize_t ei
    cdef unsigned char* buf
    cdef Py_ssize_t cap

    def __cinit__(self, TableCore core, bytes start, decode):
        self.core = core
        self.start = start
        self.decode = None
        self.decode_c = NULL
        if decode is not None:
            cap = getattr(decode, "c_decoder", None)
            if cap is not None and PyCapsule_IsValid(cap, VALUE_FN_CAPSULE):
                self.decode_c = <value_fn>PyCapsule_GetPointer(cap, VALUE_FN_CAPSULE)
            else:
                self.decode = decode
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
        if self.decode_c != NULL:
            v = self.decode_c(<const unsigned char*>d + e.kpos + e.unshared, e.vlen, self.core.name)
        else:
            v = PyBytes_FromStringAndSize(d + e.kpos + e.unshared, e.vlen)
            if self.decode is not None:
                v = self.decode(v, self.core.name)
        t = PyTuple_New(2)
        Py_INCREF(k)
        Py_INCREF(v)
        PyTuple_SET_ITEM(t, 0, k)
        PyTuple_SET_ITEM(t, 1, v)
        return t


# --- index keys (the table writer in _ctable) --------------------------------------------------------

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
