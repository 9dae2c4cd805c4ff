# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled per-record work outside the table format: record values, entries, identities, FNV-1a.

Each function here has a pure-Python reference (``graveler.model``,
``graveler.ident``, ``graveler.committed.fnv``) with the same results, bytes
and errors; the tests feed both the same random inputs.  Hashing stays in
OpenSSL, hashlib's library (called directly for entry identities, without a
hashlib object per entry): this module only builds the bytes it is fed.
"""

from libc.stdint cimport uint64_t, int64_t, uint32_t
from libc.string cimport memcpy, memcmp
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF, PyObject
from cpython.long cimport PyLong_FromUnsignedLongLong

from graveler._cbytes cimport dec_len, put_dec, put_uvarint, read_uvarint, uvarint_len
from graveler._cbytes cimport fnv1a64 as fnv_c

cdef extern from "Python.h":
    object PyType_GenericAlloc(type t, Py_ssize_t n)

from graveler.errors import CorruptedData

cdef type _Value = None        # graveler.model.Value, set by bind()
cdef bint _value_fast = False  # Value instances can be allocated as 2-item tuples
cdef object _tuple_new = tuple.__new__



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

cdef inline int read_varint(const unsigned char* p, Py_ssize_t n, Py_ssize_t* pos, int64_t* out) noexcept nogil:
    """Go's binary.Varint (zigzag).  0: ok; -1: truncated; -2: too long / over 64 bits."""
    cdef uint64_t u
    cdef int r = read_uvarint(p, n, pos, &u)
    if r == 0:
        out[0] = <int64_t>(u >> 1) ^ -(<int64_t>(u & 1))
    return r


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
    void* PyMem_Malloc(size_t n)
    void PyMem_Free(void* p)

# OpenSSL's SHA-256 (what hashlib runs), called directly: one ``hashlib.sha256(...)`` object per entry
# costs more than hashing its ~100 bytes.
cdef extern from "openssl/evp.h":
    ctypedef struct EVP_MD:
        pass
    ctypedef struct EVP_MD_CTX:
        pass
    EVP_MD* EVP_MD_fetch(void* libctx, const char* algorithm, const char* properties)
    EVP_MD_CTX* EVP_MD_CTX_new()
    int EVP_DigestInit_ex2(EVP_MD_CTX* ctx, const EVP_MD* md, const void* params)
    int EVP_DigestUpdate(EVP_MD_CTX* ctx, const void* d, size_t n)
    int EVP_DigestFinal_ex(EVP_MD_CTX* ctx, unsigned char* md, unsigned int* n)

cdef EVP_MD* _SHA256 = EVP_MD_fetch(NULL, b"SHA256", NULL)
cdef EVP_MD_CTX* _SHA_CTX = EVP_MD_CTX_new()
if _SHA256 == NULL or _SHA_CTX == NULL:
    raise ImportError("graveler._crecord: OpenSSL's SHA-256 is not available")


cdef int sha256_into(const unsigned char* p, Py_ssize_t n, unsigned char* out) except -1:
    # One shared context: the GIL is held from init to final and nothing in between runs Python code.
    if (EVP_DigestInit_ex2(_SHA_CTX, _SHA256, NULL) != 1 or EVP_DigestUpdate(_SHA_CTX, p, <size_t>n) != 1
            or EVP_DigestFinal_ex(_SHA_CTX, out, NULL) != 1):
        raise RuntimeError("OpenSSL SHA-256 failed")
    return 0


def sha256(data):
    """hashlib.sha256(data).digest(), through the same OpenSSL call the entry encoders use (tests compare)."""
    cdef bytes b = as_bytes(data)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 32)
    sha256_into(<const unsigned char*>PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b), <unsigned char*>PyBytes_AS_STRING(out))
    return out


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


cdef struct Fields:
    # One catalog entry's fields as C values, with the sizes of both encodings.  The pointers borrow
    # from str/bytes objects the caller keeps alive.
    const char* pa
    Py_ssize_t la
    const char* pe
    Py_ssize_t le
    const char* pc
    Py_ssize_t lc
    int64_t size
    int64_t lm
    int64_t secs
    int64_t nanos
    Py_ssize_t ts_len
    int at
    Py_ssize_t proto_len  # catalog.Entry protobuf
    Py_ssize_t ident_len  # what the identity hashes


cdef int fields_init(Fields* f, object address, int64_t size, object etag, int64_t last_modified_ns,
                     int address_type, object content_type, list id_items, list pb_items) except -1:
    """Fill ``f``; ``id_items``/``pb_items``: the metadata in identity / protobuf order (None when empty)."""
    cdef Py_ssize_t total = 0, ts_len = 0, me_len, ident_len
    f.pa = text(address, &f.la)
    f.pe = text(etag, &f.le)
    f.pc = text(content_type, &f.lc)
    f.size = size
    f.lm = last_modified_ns
    f.at = address_type
    f.secs = 0
    f.nanos = 0
    if f.la:
        total += field_len(f.la)
    if last_modified_ns:
        f.secs = last_modified_ns // 1000000000
        f.nanos = last_modified_ns - f.secs * 1000000000
        if f.nanos < 0:  # floor division, as Python's divmod
            f.nanos += 1000000000
            f.secs -= 1
        if f.secs:
            ts_len += 1 + uvarint_len(<uint64_t>f.secs)
        if f.nanos:
            ts_len += 1 + uvarint_len(<uint64_t>f.nanos)
        total += field_len(ts_len)
    f.ts_len = ts_len
    if size:
        total += 1 + uvarint_len(<uint64_t>size)
    if f.le:
        total += field_len(f.le)
    ident_len = 10 + 11 + f.le + 11
    if pb_items is not None:
        for k, v in pb_items:
            me_len = field_len(PyBytes_GET_SIZE(<bytes>k)) + field_len(PyBytes_GET_SIZE(<bytes>v))
            total += field_len(me_len)
            ident_len += 22 + PyBytes_GET_SIZE(<bytes>k) + PyBytes_GET_SIZE(<bytes>v)
    if address_type:
        total += 1 + uvarint_len(<uint64_t><int64_t>address_type)
    if f.lc:
        total += field_len(f.lc)
        ident_len += 11 + f.lc
    f.proto_len = total
    f.ident_len = ident_len
    return 0


cdef unsigned char* ident_write(unsigned char* p, const Fields* f, list id_items):
    """The bytes lakeFS hashes for an entry's identity: size, etag, sorted metadata, content type if any."""
    p = put_i64be(p, f.size)
    p = put_str(p, f.pe, f.le)
    p[0] = 4
    if id_items is None:
        p = put_i64be(p + 1, 0)
    else:
        p = put_i64be(p + 1, len(id_items))
        for k, v in id_items:
            p = put_str(p, PyBytes_AS_STRING(<bytes>k), PyBytes_GET_SIZE(<bytes>k))
            p = put_str(p, PyBytes_AS_STRING(<bytes>v), PyBytes_GET_SIZE(<bytes>v))
    if f.lc:
        p = put_str(p, f.pc, f.lc)
    return p


cdef int ident_hash(const Fields* f, list id_items, unsigned char* out) except -1:
    """The entry's 32-byte identity into ``out``."""
    cdef unsigned char stack[512]
    cdef unsigned char* buf = stack
    if f.ident_len > 512:
        buf = <unsigned char*>PyMem_Malloc(f.ident_len)
        if buf == NULL:
            raise MemoryError()
    try:
        ident_write(buf, f, id_items)
        sha256_into(buf, f.ident_len, out)
    finally:
        if buf != stack:
            PyMem_Free(buf)
    return 0


cdef unsigned char* proto_write(unsigned char* p, const Fields* f, list pb_items):
    """catalog.Entry serialized as protobuf does with deterministic=True (fields in number order)."""
    cdef Py_ssize_t me_len
    if f.la:
        p = put_field(p, 1, f.pa, f.la)
    if f.lm:
        p[0] = 0x12
        p += 1 + put_uvarint(p + 1, f.ts_len)
        if f.secs:
            p[0] = 0x08
            p += 1 + put_uvarint(p + 1, <uint64_t>f.secs)
        if f.nanos:
            p[0] = 0x10
            p += 1 + put_uvarint(p + 1, <uint64_t>f.nanos)
    if f.size:
        p[0] = 0x18
        p += 1 + put_uvarint(p + 1, <uint64_t>f.size)
    if f.le:
        p = put_field(p, 4, f.pe, f.le)
    if pb_items is not None:
        for k, v in pb_items:  # protobuf writes both fields of a map entry, empty or not
            me_len = field_len(PyBytes_GET_SIZE(<bytes>k)) + field_len(PyBytes_GET_SIZE(<bytes>v))
            p[0] = 0x2A
            p += 1 + put_uvarint(p + 1, me_len)
            p = put_field(p, 1, PyBytes_AS_STRING(<bytes>k), PyBytes_GET_SIZE(<bytes>k))
            p = put_field(p, 2, PyBytes_AS_STRING(<bytes>v), PyBytes_GET_SIZE(<bytes>v))
    if f.at:
        p[0] = 0x30
        p += 1 + put_uvarint(p + 1, <uint64_t><int64_t>f.at)
    if f.lc:
        p = put_field(p, 7, f.pc, f.lc)
    return p


def entry_identity_input(size, etag, metadata, content_type=""):
    """The bytes lakeFS hashes for an entry's identity (size, etag, sorted metadata, content type)."""
    cdef Fields f
    cdef list id_items = sorted_items(metadata) if metadata else None
    if not content_type:
        content_type = ""
    fields_init(&f, "", size, etag, 0, 0, content_type, id_items, id_items)
    out = PyBytes_FromStringAndSize(NULL, f.ident_len)
    ident_write(<unsigned char*>PyBytes_AS_STRING(out), &f, id_items)
    return out


def entry_identity(size, etag, metadata, content_type=""):
    """The 32-byte identity of a catalog entry (graveler.ident.py_entry_identity)."""
    cdef Fields f
    cdef list id_items = sorted_items(metadata) if metadata else None
    if not content_type:
        content_type = ""
    fields_init(&f, "", size, etag, 0, 0, content_type, id_items, id_items)
    out = PyBytes_FromStringAndSize(NULL, 32)
    ident_hash(&f, id_items, <unsigned char*>PyBytes_AS_STRING(out))
    return out


def entry_proto(address, int64_t size, etag, int64_t last_modified_ns, metadata, int address_type, content_type):
    """catalog.Entry serialized as protobuf does with deterministic=True (fields in number order)."""
    cdef Fields f
    cdef list pb_items = proto_map_order(metadata) if metadata else None
    fields_init(&f, address, size, etag, last_modified_ns, address_type, content_type, pb_items, pb_items)
    out = PyBytes_FromStringAndSize(NULL, f.proto_len)
    proto_write(<unsigned char*>PyBytes_AS_STRING(out), &f, pb_items)
    return out


cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        const char* name
        int type
        Py_ssize_t offset
    int T_OBJECT_EX

cdef extern from "Python.h":
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member

cdef type _Entry = None  # graveler.model.Entry, set by bind_entry()
# Where an Entry keeps its fields (a slots dataclass: member descriptors at fixed offsets), so that the
# encoders read them without seven attribute look-ups per entry.  Only for exactly that type.
ENTRY_FIELDS = ("address", "size", "etag", "last_modified_ns", "metadata", "address_type", "content_type")
cdef Py_ssize_t _entry_off[7]


def bind_entry(entry_type):
    """Register graveler.model.Entry (model imports this module) and the offsets of its slots."""
    global _Entry
    cdef PyMemberDef* m
    for i, name in enumerate(ENTRY_FIELDS):
        d = entry_type.__dict__.get(name)
        if type(d).__name__ != "member_descriptor":
            raise TypeError(f"{entry_type.__name__}.{name} is not a slot")
        m = (<PyMemberDescrObject*><PyObject*>d).d_member
        if m.type != T_OBJECT_EX:
            raise TypeError(f"{entry_type.__name__}.{name} is not an object slot")
        _entry_off[i] = m.offset
    _Entry = entry_type


cdef inline object entry_slot(object e, int i):
    cdef PyObject* v = (<PyObject**>((<char*><PyObject*>e) + _entry_off[i]))[0]
    if v == NULL:
        raise AttributeError(ENTRY_FIELDS[i])
    return <object>v


def entry_to_value(entry):
    """Value(identity, protobuf bytes) of a graveler.model.Entry."""
    cdef Fields f
    cdef list id_items = None, pb_items = None
    if type(entry) is _Entry:
        address = entry_slot(entry, 0)
        size = entry_slot(entry, 1)
        etag = entry_slot(entry, 2)
        last_modified_ns = entry_slot(entry, 3)
        metadata = entry_slot(entry, 4)
        address_type = entry_slot(entry, 5)
        content_type = entry_slot(entry, 6)
    else:
        address = entry.address
        size = entry.size
        etag = entry.etag
        last_modified_ns = entry.last_modified_ns
        metadata = entry.metadata
        address_type = entry.address_type
        content_type = entry.content_type
    if metadata:
        id_items = sorted_items(metadata)
        pb_items = proto_map_order(metadata)
    fields_init(&f, address, size, etag, last_modified_ns, address_type, content_type, id_items, pb_items)
    identity = PyBytes_FromStringAndSize(NULL, 32)
    ident_hash(&f, id_items, <unsigned char*>PyBytes_AS_STRING(identity))
    data = PyBytes_FromStringAndSize(NULL, f.proto_len)
    proto_write(<unsigned char*>PyBytes_AS_STRING(data), &f, pb_items)
    return make_value(identity, data)


cdef bytes entry_record_c(object entry):
    """encode_value(entry_to_value(entry)) written in place: one bytes object, no Value."""
    cdef Fields f
    cdef unsigned char* p
    cdef list id_items = None, pb_items = None
    if type(entry) is _Entry:
        address = entry_slot(entry, 0)
        size = entry_slot(entry, 1)
        etag = entry_slot(entry, 2)
        last_modified_ns = entry_slot(entry, 3)
        metadata = entry_slot(entry, 4)
        address_type = entry_slot(entry, 5)
        content_type = entry_slot(entry, 6)
    else:
        address = entry.address
        size = entry.size
        etag = entry.etag
        last_modified_ns = entry.last_modified_ns
        metadata = entry.metadata
        address_type = entry.address_type
        content_type = entry.content_type
    if metadata:
        id_items = sorted_items(metadata)
        pb_items = proto_map_order(metadata)
    fields_init(&f, address, size, etag, last_modified_ns, address_type, content_type, id_items, pb_items)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 33 + uvarint_len(<uint64_t>f.proto_len << 1) + f.proto_len)
    p = <unsigned char*>PyBytes_AS_STRING(out)
    p[0] = 64  # zigzag varint of the identity's length, 32
    ident_hash(&f, id_items, p + 1)
    p += 33
    p += put_uvarint(p, <uint64_t>f.proto_len << 1)
    proto_write(p, &f, pb_items)
    return out


def entry_record(entry):
    """The stored record value of a graveler.model.Entry: ``encode_value(entry.to_value())``."""
    return entry_record_c(entry)


cdef inline bytes record_of(object v):
    if type(v) is _Entry:
        return entry_record_c(v)
    if v is None:
        return b""
    if isinstance(v, _Entry):
        return entry_record_c(v)
    ident = as_bytes(v[0])
    data = as_bytes(v[1])
    return encode_raw(<const unsigned char*>PyBytes_AS_STRING(ident), PyBytes_GET_SIZE(ident),
                      <const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


def encode_records(values):
    """[record value bytes] of Entries and Values in one call; None (staging's tombstone) -> b""."""
    cdef list vs = values if type(values) is list else list(values)
    cdef Py_ssize_t i, n = len(vs)
    cdef list out = PyList_New(n)
    cdef bytes r
    for i in range(n):
        r = record_of(vs[i])
        Py_INCREF(r)
        PyList_SET_ITEM(out, i, r)
    return out


# --- the byte-bounded LRU (graveler.lru), with a compiled hit path ----------------------------------

from collections import OrderedDict
import threading

from cpython.dict cimport PyDict_GetItemWithError

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


# --- SHA-256 with a state that can be saved and restored (table IDs, apply's checkpoints) ---------------

cdef extern from "openssl/sha.h":
    # OpenSSL's low-level SHA-256 (deprecated in 3.0 for EVP, still there and as fast; setup.py defines
    # OPENSSL_SUPPRESS_DEPRECATED). It is used here because its context is a plain struct: a range writer
    # can save the state of a table-ID hash at a block boundary and a later rewrite of the range can resume
    # from it instead of hashing the unchanged records before its first change again.
    int SHA256_Init(SHA256_CTX* c) nogil
    int SHA256_Update(SHA256_CTX* c, const void* data, size_t n) nogil
    int SHA256_Final(unsigned char* md, SHA256_CTX* c) nogil

cdef extern from "openssl/crypto.h":
    unsigned long OpenSSL_version_num()

from libc.string cimport memset
from cpython.pythread cimport (PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_release_lock, PyThread_start_new_thread, WAIT_LOCK)

SHA256_STATE_BYTES = sizeof(SHA256_CTX)
# What a saved state is tied to: the struct's size and the library's version (a state saved by one build is
# never resumed by another that might lay the struct out differently).
SHA256_STATE_TAG = b"openssl-%x-sha256ctx-%d" % (OpenSSL_version_num(), sizeof(SHA256_CTX))

cdef bytes _HEX = b"0123456789abcdef"


cdef enum:
    # What one hand-over to the hashing thread carries at most (~0.7 ms of SHA-256); a table writer that
    # records checkpoints hands over less, at each one.
    STAGE_BYTES = 1 << 20

# Freed stage buffers kept for the next hash (a few): fresh memory costs more than hashing into it on a
# machine that hands untouched pages out lazily (virtual machines), and a range writer needs two.
cdef list _spare_stages = []


cdef unsigned char* stage_alloc(Py_ssize_t n) except NULL:
    cdef unsigned char* p
    if n == STAGE_BYTES and _spare_stages:
        return <unsigned char*><size_t>_spare_stages.pop()
    p = <unsigned char*>PyMem_Malloc(n)
    if p == NULL:
        raise MemoryError()
    return p


cdef void stage_free(unsigned char* p, Py_ssize_t n) noexcept:
    if p == NULL:
        return
    if n == STAGE_BYTES and len(_spare_stages) < 4:
        _spare_stages.append(<size_t>p)
    else:
        PyMem_Free(p)


cdef void _hash_worker(void* arg) noexcept nogil:
    """The hashing thread of a threaded Sha256: takes one staged chunk at a time (``ready``), hashes it,
    hands the buffer back (``done``). Never touches Python."""
    cdef HashPipe* p = <HashPipe*>arg
    while True:
        PyThread_acquire_lock(p.ready, WAIT_LOCK)
        if p.stop:
            PyThread_release_lock(p.done)
            return
        SHA256_Update(p.ctx, p.job, p.job_len)
        if p.want_snap:
            memcpy(&p.snap, p.ctx, sizeof(SHA256_CTX))
        PyThread_release_lock(p.done)


cdef class Sha256:
    """SHA-256 (OpenSSL) whose state can be saved (``state``) and resumed (``Sha256(state)``).

    Input is staged in 256 KiB chunks. ``threaded``: a full chunk is hashed by a thread of its own while
    the caller fills the next one (SHA-256 of a 20 MiB range is ~30 ms: on two cores it then overlaps
    with decompressing and re-encoding the range). The thread starts at the first full chunk, so a
    small table never starts one; ``state``/``hexdigest`` wait for it.
    """

    def __cinit__(self, state=None, bint threaded=False):
        cdef bytes b
        self.snap_target = None
        self.stage[0] = self.stage[1] = NULL
        self.cur = 0
        self.slen = 0
        self.pipe = NULL
        self.threaded = threaded
        if state is None:
            SHA256_Init(&self.ctx)
        else:
            b = as_bytes(state)
            if PyBytes_GET_SIZE(b) != sizeof(SHA256_CTX):
                raise ValueError(f"a SHA-256 state is {sizeof(SHA256_CTX)} bytes, not {PyBytes_GET_SIZE(b)}")
            memcpy(&self.ctx, PyBytes_AS_STRING(b), sizeof(SHA256_CTX))

    def __dealloc__(self):
        self.stop_worker()
        stage_free(self.stage[0], self.cap[0])
        stage_free(self.stage[1], self.cap[1])

    cdef void stop_worker(self) noexcept:
        cdef HashPipe* p = self.pipe
        if p == NULL:
            return
        with nogil:
            PyThread_acquire_lock(p.done, WAIT_LOCK)  # idle
        if self.snap_target is not None:
            memcpy(<char*>(<bytearray>self.snap_target) + self.snap_at, &p.snap, sizeof(SHA256_CTX))
            self.snap_target = None
        with nogil:
            p.stop = True
            PyThread_release_lock(p.ready)
            PyThread_acquire_lock(p.done, WAIT_LOCK)  # it has left
        PyThread_free_lock(p.ready)
        PyThread_free_lock(p.done)
        PyMem_Free(p)
        self.pipe = NULL

    cdef int start_worker(self) except -1:
        cdef HashPipe* p = <HashPipe*>PyMem_Malloc(sizeof(HashPipe))
        if p == NULL:
            raise MemoryError()
        memset(p, 0, sizeof(HashPipe))
        p.ctx = &self.ctx
        p.ready = PyThread_allocate_lock()
        p.done = PyThread_allocate_lock()
        if p.ready == NULL or p.done == NULL:
            PyMem_Free(p)
            raise MemoryError()
        PyThread_acquire_lock(p.ready, WAIT_LOCK)  # nothing ready; ``done`` is free: idle
        if PyThread_start_new_thread(_hash_worker, p) == -1:
            PyThread_free_lock(p.ready)
            PyThread_free_lock(p.done)
            PyMem_Free(p)
            self.threaded = False  # hash inline instead
            return 0
        self.pipe = p
        return 0

    cdef int acquire_done(self) except -1:
        """Wait until the thread is idle (it then holds no buffer); deliver a snapshot it took."""
        cdef HashPipe* p = self.pipe
        with nogil:
            PyThread_acquire_lock(p.done, WAIT_LOCK)
        if self.snap_target is not None:
            memcpy(<char*>(<bytearray>self.snap_target) + self.snap_at, &p.snap, sizeof(SHA256_CTX))
            self.snap_target = None
            p.want_snap = False
        return 0

    cdef int submit(self) except -1:
        """Hash the staged chunk (on the thread, if threaded) and start the other one."""
        cdef HashPipe* p
        if self.slen == 0:
            return 0
        if self.threaded and self.pipe == NULL:
            self.start_worker()
        p = self.pipe
        if p == NULL:
            with nogil:
                SHA256_Update(&self.ctx, self.stage[self.cur], <size_t>self.slen)
        else:
            self.acquire_done()  # the other buffer is hashed: it is free again
            p.job = self.stage[self.cur]
            p.job_len = <size_t>self.slen
            PyThread_release_lock(p.ready)
            self.cur ^= 1
        self.slen = 0
        return 0

    cdef int sync(self) except -1:
        """Everything fed so far is in ``ctx``."""
        self.submit()
        if self.pipe != NULL:
            self.acquire_done()
            PyThread_release_lock(self.pipe.done)
        return 0

    cdef int snapshot_into(self, bytearray target, Py_ssize_t at) except -1:
        """Write the state after everything fed so far into ``target[at:at + SHA256_STATE_BYTES]``: now,
        or (threaded) once the thread has hashed it, without waiting for that here (``target`` may grow
        meanwhile; it must not shrink)."""
        if self.threaded and self.pipe == NULL:
            self.start_worker()
        if self.pipe == NULL:
            self.submit()  # hashed here
            memcpy(<char*>target + at, &self.ctx, sizeof(SHA256_CTX))
            return 0
        self.acquire_done()  # idle: what was submitted is in ctx, the snapshot slot is free
        if self.slen == 0:
            memcpy(<char*>target + at, &self.ctx, sizeof(SHA256_CTX))
            PyThread_release_lock(self.pipe.done)
            return 0
        self.pipe.job = self.stage[self.cur]
        self.pipe.job_len = <size_t>self.slen
        self.pipe.want_snap = True
        self.snap_target = target
        self.snap_at = at
        PyThread_release_lock(self.pipe.ready)
        self.cur ^= 1
        self.slen = 0
        return 0

    cdef unsigned char* reserve(self, Py_ssize_t n) except NULL:
        """Room for ``n`` more bytes of input in the stage (``commit`` them after writing)."""
        if self.stage[self.cur] == NULL:
            self.cap[self.cur] = STAGE_BYTES if n <= STAGE_BYTES else n
            self.stage[self.cur] = stage_alloc(self.cap[self.cur])
        if self.slen + n > self.cap[self.cur]:
            self.submit()
            if self.stage[self.cur] == NULL or n > self.cap[self.cur]:
                stage_free(self.stage[self.cur], self.cap[self.cur])
                self.stage[self.cur] = NULL
                self.cap[self.cur] = STAGE_BYTES if n <= STAGE_BYTES else n
                self.stage[self.cur] = stage_alloc(self.cap[self.cur])
        return self.stage[self.cur] + self.slen

    cdef int commit(self, Py_ssize_t n) except -1:
        self.slen += n
        if self.slen >= STAGE_BYTES:
            self.submit()
        return 0

    cdef int update_c(self, const void* p, size_t n) except -1:
        memcpy(self.reserve(<Py_ssize_t>n), p, n)
        self.commit(<Py_ssize_t>n)
        return 0

    def update(self, data):
        cdef bytes b = as_bytes(data)
        self.update_c(PyBytes_AS_STRING(b), <size_t>PyBytes_GET_SIZE(b))

    def state(self):
        """The hash state so far (``SHA256_STATE_BYTES`` bytes; resume with ``Sha256(state)``)."""
        self.sync()
        return PyBytes_FromStringAndSize(<const char*>&self.ctx, sizeof(SHA256_CTX))

    def copy(self):
        cdef Sha256 c = Sha256.__new__(Sha256)
        self.sync()
        memcpy(&c.ctx, &self.ctx, sizeof(SHA256_CTX))
        return c

    def hexdigest(self, suffix=b""):
        """Hex digest of what was fed plus ``suffix``, leaving this hash as it is."""
        cdef SHA256_CTX c
        cdef unsigned char md[32]
        cdef bytes sb = as_bytes(suffix)
        cdef bytes out = PyBytes_FromStringAndSize(NULL, 64)
        cdef unsigned char* o = <unsigned char*>PyBytes_AS_STRING(out)
        cdef const unsigned char* hx = <const unsigned char*>PyBytes_AS_STRING(_HEX)
        cdef int i
        self.sync()
        memcpy(&c, &self.ctx, sizeof(SHA256_CTX))
        if PyBytes_GET_SIZE(sb):
            SHA256_Update(&c, PyBytes_AS_STRING(sb), <size_t>PyBytes_GET_SIZE(sb))
        SHA256_Final(md, &c)
        for i in range(32):
            o[2 * i] = hx[md[i] >> 4]
            o[2 * i + 1] = hx[md[i] & 15]
        return out.decode("ascii")
