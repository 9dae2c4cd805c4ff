# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled per-record work outside the table format: record values, entries, identities, FNV-1a.

Each function here has a pure-Python reference (``graveler.model``,
``graveler.ident``, ``graveler.committed.fnv``) with the same results, bytes
and errors; the tests feed both the same random inputs.  Hashing stays in
hashlib (OpenSSL): this module only builds the bytes it is fed.
"""

import hashlib

from libc.stdint cimport uint64_t, int64_t, uint32_t
from libc.string cimport memcpy, memcmp
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from cpython.long cimport PyLong_FromUnsignedLongLong

cdef extern from "Python.h":
    object PyType_GenericAlloc(type t, Py_ssize_t n)

from graveler.errors import CorruptedData

cdef type _Value = None        # graveler.model.Value, set by bind()
cdef bint _value_fast = False  # Value instances can be allocated as 2-item tuples
cdef object _tuple_new = tuple.__new__
cdef object _sha256 = hashlib.sha256

cdef uint64_t FNV_OFFSET = 0xCBF29CE484222325ULL
cdef uint64_t FNV_PRIME = 0x100000001B3ULL


def bind(value_type):
    """Register graveler.model.Value (model imports this module, so it cannot be imported from here)."""
    global _Value, _value_fast
    _Value = value_type
    _value_fast = (value_type.__base__ is tuple and value_type.__basicsize__ == tuple.__basicsize__
                   and value_type.__itemsize__ == tuple.__itemsize__ and value_type.__slots__ == ())


cdef inline object make_value(object identity, object data):
    cdef object t
    if _Value is None:
        import graveler.model  # binds Value
    if _value_fast:
        # What tuple.__new__(Value, ...) does: the subtype's allocation, then the two items.
        t = PyType_GenericAlloc(_Value, 2)
        Py_INCREF(identity)
        Py_INCREF(data)
        PyTuple_SET_ITEM(t, 0, identity)
        PyTuple_SET_ITEM(t, 1, data)
        return t
    return _tuple_new(_Value, (identity, data))


cdef inline bytes as_bytes(object b):
    if type(b) is bytes:
        return <bytes>b
    return bytes(b)


# --- record values: zigzag-varint length-prefixed identity and data -----------------------------

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


cdef inline int read_varint(const unsigned char* p, Py_ssize_t n, Py_ssize_t* pos, int64_t* out) noexcept nogil:
    """Go's binary.Varint (zigzag).  0: ok; -1: truncated; -2: too long / over 64 bits."""
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
            out[0] = <int64_t>(result >> 1) ^ -(<int64_t>(result & 1))
            return 0
        shift += 7


cdef bytes encode_raw(const unsigned char* ident, Py_ssize_t li, const unsigned char* data, Py_ssize_t ld):
    cdef Py_ssize_t total = uvarint_len(<uint64_t>li << 1) + li + uvarint_len(<uint64_t>ld << 1) + ld
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    p += put_uvarint(p, <uint64_t>li << 1)
    if li:
        memcpy(p, ident, li)
        p += li
    p += put_uvarint(p, <uint64_t>ld << 1)
    if ld:
        memcpy(p, data, ld)
    return out


def encode_value(v):
    """A record value's bytes: zigzag varint len + identity, zigzag varint len + data."""
    cdef bytes ident = as_bytes(v[0])
    cdef bytes data = as_bytes(v[1])
    return encode_raw(<const unsigned char*>PyBytes_AS_STRING(ident), PyBytes_GET_SIZE(ident),
                      <const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


cdef object decode_c(bytes raw, object name):
    return decode_ptr(<const unsigned char*>PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), name)


cdef object decode_ptr(const unsigned char* p, Py_ssize_t n, object name):
    """Value(identity, data) of the record value at ``p`` (for graveler.sstable._cblock too)."""
    cdef Py_ssize_t pos = 0, istart, iend
    cdef int64_t li, ld
    cdef int r
    cdef str err
    r = read_varint(p, n, &pos, &li)
    if r == 0:
        if li < 0 or li > n - pos:
            err = "identity overruns the value"
        else:
            istart = pos
            iend = pos + li
            pos = iend
            r = read_varint(p, n, &pos, &ld)
            if r == 0:
                if ld < 0 or ld != n - pos:
                    err = "data length does not match the value"
                else:
                    return make_value(PyBytes_FromStringAndSize(<char*>p + istart, li),
                                      PyBytes_FromStringAndSize(<char*>p + pos, ld))
    if r == -1:
        err = "index out of range"
    elif r == -2:
        err = "varint too long"
    raise CorruptedData(f"malformed record value ({err})", name)


def decode_value(raw, name=None):
    """Split a record value into Value(identity, data); CorruptedData (naming ``name``) if malformed."""
    return decode_c(as_bytes(raw), name)


# --- FNV-1a 64 ----------------------------------------------------------------------------------

cdef inline uint64_t fnv_c(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef uint64_t h = FNV_OFFSET
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ p[i]) * FNV_PRIME
    return h


def fnv1a64(key):
    cdef bytes k = as_bytes(key)
    return PyLong_FromUnsignedLongLong(fnv_c(<const unsigned char*>PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k)))


def fnv1a64_batch(keys):
    cdef list ks = keys if type(keys) is list else list(keys)
    cdef Py_ssize_t i, n = len(ks)
    cdef list out = PyList_New(n)
    cdef bytes k
    for i in range(n):
        k = as_bytes(ks[i])
        h = PyLong_FromUnsignedLongLong(fnv_c(<const unsigned char*>PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k)))
        Py_INCREF(h)
        PyList_SET_ITEM(out, i, h)
    return out


# --- range / metarange ID input ------------------------------------------------------------------

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


def hasher_input(keys, values):
    """b"".join(b"%d%s|%d%s|" % (len(k), k, len(v), v)): what a table ID hashes per record."""
    cdef list ks = keys if type(keys) is list else list(keys)
    cdef list vs = values if type(values) is list else list(values)
    cdef Py_ssize_t i, n = min(len(ks), len(vs)), total = 0, lk, lv
    cdef bytes k, v, out
    cdef unsigned char* p
    for i in range(n):
        lk = len(ks[i])
        lv = len(vs[i])
        total += dec_len(lk) + lk + dec_len(lv) + lv + 2
    out = PyBytes_FromStringAndSize(NULL, total)
    p = <unsigned char*>PyBytes_AS_STRING(out)
    for i in range(n):
        k = as_bytes(ks[i])
        v = as_bytes(vs[i])
        lk = PyBytes_GET_SIZE(k)
        lv = PyBytes_GET_SIZE(v)
        p += put_dec(p, lk)
        memcpy(p, PyBytes_AS_STRING(k), lk)
        p += lk
        p[0] = 124  # '|'
        p += 1
        p += put_dec(p, lv)
        memcpy(p, PyBytes_AS_STRING(v), lv)
        p += lv
        p[0] = 124
        p += 1
    return out


# --- catalog entries: identity input and protobuf bytes ------------------------------------------

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL


cdef inline const char* text(object s, Py_ssize_t* n) except NULL:
    """UTF-8 bytes of a str (no copy for a str that has them cached, as ASCII ones do) or of bytes."""
    if type(s) is str:
        return PyUnicode_AsUTF8AndSize(s, n)
    if type(s) is bytes:
        n[0] = PyBytes_GET_SIZE(s)
        return PyBytes_AS_STRING(s)
    raise TypeError(f"expected str, not {type(s).__name__}")


cdef inline bytes utf8(object s):
    if type(s) is bytes:
        return <bytes>s
    return (<str>s).encode("utf-8")


cdef inline unsigned char* put_i64be(unsigned char* p, int64_t v) noexcept:
    cdef uint64_t u = <uint64_t>v
    cdef int i
    p[0] = 2
    p[1] = 8
    for i in range(8):
        p[9 - i] = <unsigned char>(u & 0xFF)
        u >>= 8
    return p + 10


cdef inline unsigned char* put_str(unsigned char* p, const char* s, Py_ssize_t n) noexcept:
    p[0] = 1
    p = put_i64be(p + 1, n)
    memcpy(p, s, n)
    return p + n


cdef list sorted_items(object metadata):
    cdef list items = [(utf8(k), utf8(v)) for k, v in metadata.items()]
    items.sort()
    return items


def entry_identity_input(size, etag, metadata, content_type=""):
    """The bytes lakeFS hashes for an entry's identity (size, etag, sorted metadata, content type)."""
    cdef Py_ssize_t le, lc = 0, total
    cdef const char* pe = text(etag, &le)
    cdef const char* pc = NULL
    cdef list items = sorted_items(metadata) if metadata else []
    cdef bytes out
    cdef unsigned char* p
    if content_type:
        pc = text(content_type, &lc)
    total = 10 + 11 + le + 11
    for k, v in items:
        total += 22 + PyBytes_GET_SIZE(<bytes>k) + PyBytes_GET_SIZE(<bytes>v)
    if pc != NULL:
        total += 11 + lc
    out = PyBytes_FromStringAndSize(NULL, total)
    p = <unsigned char*>PyBytes_AS_STRING(out)
    p = put_i64be(p, size)
    p = put_str(p, pe, le)
    p[0] = 4
    p = put_i64be(p + 1, len(items))
    for k, v in items:
        p = put_str(p, PyBytes_AS_STRING(<bytes>k), PyBytes_GET_SIZE(<bytes>k))
        p = put_str(p, PyBytes_AS_STRING(<bytes>v), PyBytes_GET_SIZE(<bytes>v))
    if pc != NULL:
        p = put_str(p, pc, lc)
    return out


def entry_identity(size, etag, metadata, content_type=""):
    return _sha256(entry_identity_input(size, etag, metadata, content_type)).digest()


cdef inline int proto_key_cmp(bytes a, bytes b) noexcept:
    cdef Py_ssize_t la = PyBytes_GET_SIZE(a), lb = PyBytes_GET_SIZE(b)
    cdef int c = memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), la if la < lb else lb)
    if c != 0:
        return c
    return <int>(lb - la) if la != lb else 0


cdef list proto_map_order(object metadata):
    """Map entries in the order protobuf (upb) writes them with deterministic=True.

    Bytewise by key, except that a key that is a prefix of another comes after it.
    """
    cdef list items = [(utf8(k), utf8(v)) for k, v in metadata.items()]
    cdef Py_ssize_t i, j, n = len(items)
    for i in range(1, n):
        it = items[i]
        j = i - 1
        while j >= 0 and proto_key_cmp(<bytes>(<tuple>items[j])[0], <bytes>(<tuple>it)[0]) > 0:
            items[j + 1] = items[j]
            j -= 1
        items[j + 1] = it
    return items


cdef inline Py_ssize_t field_len(Py_ssize_t n) noexcept:
    return 1 + uvarint_len(n) + n


cdef inline unsigned char* put_field(unsigned char* p, int field, const char* s, Py_ssize_t n) noexcept:
    p[0] = <unsigned char>((field << 3) | 2)
    p += 1 + put_uvarint(p + 1, n)
    memcpy(p, s, n)
    return p + n


def entry_proto(address, int64_t size, etag, int64_t last_modified_ns, metadata, int address_type, content_type):
    """catalog.Entry serialized as protobuf does with deterministic=True (fields in number order)."""
    cdef Py_ssize_t la, le, lc, total = 0, ts_len = 0, me_len
    cdef const char* pa = text(address, &la)
    cdef const char* pe = text(etag, &le)
    cdef const char* pc = text(content_type, &lc)
    cdef int64_t secs = 0, nanos = 0
    cdef list items = proto_map_order(metadata) if metadata else []
    cdef bytes out
    cdef unsigned char* p
    if la:
        total += field_len(la)
    if last_modified_ns:
        secs = last_modified_ns // 1000000000
        nanos = last_modified_ns - secs * 1000000000
        if nanos < 0:  # floor division, as Python's divmod
            nanos += 1000000000
            secs -= 1
        if secs:
            ts_len += 1 + uvarint_len(<uint64_t>secs)
        if nanos:
            ts_len += 1 + uvarint_len(<uint64_t>nanos)
        total += field_len(ts_len)
    if size:
        total += 1 + uvarint_len(<uint64_t>size)
    if le:
        total += field_len(le)
    for k, v in items:
        me_len = field_len(PyBytes_GET_SIZE(<bytes>k)) + field_len(PyBytes_GET_SIZE(<bytes>v))
        total += field_len(me_len)
    if address_type:
        total += 1 + uvarint_len(<uint64_t><int64_t>address_type)
    if lc:
        total += field_len(lc)
    out = PyBytes_FromStringAndSize(NULL, total)
    p = <unsigned char*>PyBytes_AS_STRING(out)
    if la:
        p = put_field(p, 1, pa, la)
    if last_modified_ns:
        p[0] = 0x12
        p += 1 + put_uvarint(p + 1, ts_len)
        if secs:
            p[0] = 0x08
            p += 1 + put_uvarint(p + 1, <uint64_t>secs)
        if nanos:
            p[0] = 0x10
            p += 1 + put_uvarint(p + 1, <uint64_t>nanos)
    if size:
        p[0] = 0x18
        p += 1 + put_uvarint(p + 1, <uint64_t>size)
    if le:
        p = put_field(p, 4, pe, le)
    for k, v in items:  # protobuf writes both fields of a map entry, empty or not
        me_len = field_len(PyBytes_GET_SIZE(<bytes>k)) + field_len(PyBytes_GET_SIZE(<bytes>v))
        p[0] = 0x2A
        p += 1 + put_uvarint(p + 1, me_len)
        p = put_field(p, 1, PyBytes_AS_STRING(<bytes>k), PyBytes_GET_SIZE(<bytes>k))
        p = put_field(p, 2, PyBytes_AS_STRING(<bytes>v), PyBytes_GET_SIZE(<bytes>v))
    if address_type:
        p[0] = 0x30
        p += 1 + put_uvarint(p + 1, <uint64_t><int64_t>address_type)
    if lc:
        p = put_field(p, 7, pc, lc)
    return out


def entry_to_value(entry):
    """Value(identity, protobuf bytes) of a graveler.model.Entry."""
    size = entry.size
    etag = entry.etag
    metadata = entry.metadata
    content_type = entry.content_type
    identity = _sha256(entry_identity_input(size, etag, metadata, content_type)).digest()
    data = entry_proto(entry.address, size, etag, entry.last_modified_ns, metadata, entry.address_type,
                       content_type)
    return make_value(identity, data)


# --- the byte-bounded LRU (graveler.lru), with a compiled hit path ----------------------------------

from collections import OrderedDict
import threading

from cpython.dict cimport PyDict_GetItemWithError
from cpython.ref cimport PyObject


cdef class LRU:
    """graveler.lru.LRU compiled: the same behaviour, a hit costs one C call (block, table and metarange lookups)."""

    cdef public Py_ssize_t max_bytes
    cdef object _weight
    cdef readonly object _d
    cdef object _move
    cdef Py_ssize_t _bytes
    cdef object _lock
    cdef public Py_ssize_t hits, misses

    def __init__(self, Py_ssize_t max_bytes, weight):
        self.max_bytes = max_bytes
        self._weight = weight
        self._d = OrderedDict()
        self._move = self._d.move_to_end
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @classmethod
    def __class_getitem__(cls, item):
        return cls

    @property
    def data(self):
        """The entries, least recently used first, for lock-free hits (read and ``move_to_end`` only)."""
        return self._d

    def get(self, key):
        cdef PyObject* v = PyDict_GetItemWithError(self._d, key)
        if v == NULL:
            self.misses += 1
            return None
        val = <object>v  # a new reference before anything can evict it
        try:
            self._move(key)
        except KeyError:  # evicted meanwhile
            pass
        self.hits += 1
        return val

    def put(self, key, value):
        """Insert or replace ``key``, then evict the least recently used past the budget."""
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._bytes -= self._weight(old)
            self._insert(key, value)

    def setdefault(self, key, value):
        """The value already cached under ``key`` if any (another thread won the race), else ``value``, now cached."""
        with self._lock:
            old = self._d.get(key)
            if old is not None:
                return old
            self._insert(key, value)
            return value

    def _insert(self, key, value):
        d = self._d
        d[key] = value
        self._bytes += self._weight(value)
        while self._bytes > self.max_bytes and len(d) > 1:
            _, ev = d.popitem(last=False)
            self._bytes -= self._weight(ev)

    def clear(self):
        with self._lock:
            self._d.clear()
            self._bytes = 0

    def __len__(self):
        return len(self._d)

    def __contains__(self, key):
        return key in self._d

    @property
    def size_bytes(self):
        return self._bytes
