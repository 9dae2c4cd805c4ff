# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The records layer compiled: record values, catalog entries, their identities and the table-ID input.

Each function here has a pure-Python reference (``graveler.model``,
``graveler.ident``) with the same results, bytes
and errors; the tests feed both the same random inputs.  Hashing stays in
OpenSSL, hashlib's library (called directly for entry identities, without a
hashlib object per entry): this module only builds the bytes it is fed.
"""

from libc.stdint cimport uint64_t, int64_t, uint32_t
from libc.string cimport memcpy, memcmp, memchr
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF, PyObject

from graveler._cbytes cimport dec_len, put_dec, put_uvarint, read_uvarint, read_varint, uvarint_len

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
    f.pa = text(address, &f.la)
    f.pe = text(etag, &f.le)
    f.pc = text(content_type, &f.lc)
    return fields_measure(f, size, last_modified_ns, address_type, pb_items)


cdef int fields_measure(Fields* f, int64_t size, int64_t last_modified_ns, int address_type,
                        list pb_items) except -1:
    """The rest of ``fields_init`` once the text pointers (address, etag, content type) are set."""
    cdef Py_ssize_t total = 0, ts_len = 0, me_len, ident_len
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


# --- the value decoder handed to table scans ---------------------------------------------------------

from cpython.pycapsule cimport PyCapsule_New


cdef class ValueDecoder:
    """``decode_value`` for table scans (``SSTable.seek_ge(start, decode)``): callable as
    ``decode(raw, name)``, and ``c_decoder`` carries the same function as a C entry point (a capsule named
    ``graveler.sstable.value_fn``, the type ``graveler/sstable/_cblock.pxd`` declares) so a compiled scan
    decodes each value without a Python call. The sstable layer never learns what a value holds."""

    cdef readonly object c_decoder

    def __cinit__(self):
        self.c_decoder = PyCapsule_New(<void*>decode_ptr, b"graveler.sstable.value_fn", NULL)

    def __call__(self, raw, name=None):
        return decode_value(raw, name)


VALUE_DECODER = ValueDecoder()


# --- a listing's records straight from Arrow buffers (the Spark import's encode) ----------------------

from libc.stdint cimport int32_t

cdef const unsigned char _EMPTY[1]


cdef inline const unsigned char* buf_ptr(const unsigned char[:] b):
    return &b[0] if b.shape[0] else _EMPTY


cdef inline int listed_fields(Fields* f, const char* pa, Py_ssize_t la, const char* pe, Py_ssize_t le, int64_t size,
                              int64_t mtime_us, int address_type) except -1:
    """``f`` measured for a listed object's entry: address and etag (no content type), size, time."""
    f.pa = pa
    f.la = la
    f.pe = pe
    f.le = le
    f.pc = NULL
    f.lc = 0
    return fields_measure(f, size, mtime_us * 1000, address_type, None)


def listing_records(bytes prefix, Py_ssize_t n,
                    const unsigned char[:] key_off, const unsigned char[:] key_data, Py_ssize_t key_start,
                    const unsigned char[:] addr_off, const unsigned char[:] addr_data, Py_ssize_t addr_start,
                    const unsigned char[:] etag_off, const unsigned char[:] etag_data, Py_ssize_t etag_start,
                    const unsigned char[:] sizes, Py_ssize_t size_start,
                    const unsigned char[:] mtimes_us, Py_ssize_t mtime_start, int address_type):
    """The records of ``n`` listed objects from the buffers of Arrow arrays (string: int32 offsets and
    data; int64 sizes and last-modified microseconds; ``*_start``: each array's offset; no nulls): keys
    ``prefix + key``, values ``entry_record(Entry(address, size, etag, mtime_us * 1000,
    address_type=address_type))``.  Returns the int32 offsets and data buffers of the key column and of
    the value column (an Arrow binary array's buffers); no Python object per record."""
    cdef const int32_t* ko = <const int32_t*>buf_ptr(key_off) + key_start
    cdef const int32_t* ao = <const int32_t*>buf_ptr(addr_off) + addr_start
    cdef const int32_t* eo = <const int32_t*>buf_ptr(etag_off) + etag_start
    cdef const char* kd = <const char*>buf_ptr(key_data)
    cdef const char* ad = <const char*>buf_ptr(addr_data)
    cdef const char* ed = <const char*>buf_ptr(etag_data)
    cdef const int64_t* sz = <const int64_t*>buf_ptr(sizes) + size_start
    cdef const int64_t* mt = <const int64_t*>buf_ptr(mtimes_us) + mtime_start
    cdef Py_ssize_t lp = PyBytes_GET_SIZE(prefix), i, j, klen, ktotal = 0, vtotal = 0, vlen
    cdef const char* k
    cdef Fields f
    if n < 0 or (n and (key_off.shape[0] < 4 * (key_start + n + 1) or addr_off.shape[0] < 4 * (addr_start + n + 1)
                        or etag_off.shape[0] < 4 * (etag_start + n + 1) or sizes.shape[0] < 8 * (size_start + n)
                        or mtimes_us.shape[0] < 8 * (mtime_start + n))):
        raise ValueError("listing buffers shorter than the row count")
    if n and (ko[n] > key_data.shape[0] or ao[n] > addr_data.shape[0] or eo[n] > etag_data.shape[0]):
        raise ValueError("listing offsets beyond their data")
    for i in range(n):
        klen = ko[i + 1] - ko[i]
        k = kd + ko[i]
        if klen <= 0 or k[0] == 47 or memchr(k, 0, klen) != NULL:  # empty, "/...", or a NUL
            raise ValueError(f"invalid listed key {PyBytes_FromStringAndSize(k, klen if klen > 0 else 0)!r}")
        ktotal += lp + klen
        if mt[i] > 9223372036854775 or mt[i] < -9223372036854775:  # its nanoseconds would not fit int64
            raise ValueError(f"last-modified time of {PyBytes_FromStringAndSize(k, klen)!r} out of range "
                             f"({mt[i]} us since the epoch)")
        listed_fields(&f, ad + ao[i], ao[i + 1] - ao[i], ed + eo[i], eo[i + 1] - eo[i], sz[i], mt[i], address_type)
        vtotal += 33 + uvarint_len(<uint64_t>f.proto_len << 1) + f.proto_len
    if ktotal > 0x7FFFFFFF or vtotal > 0x7FFFFFFF:
        raise ValueError("listing batch too large for one Arrow binary array")
    cdef bytes koff_out = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
    cdef bytes kdata_out = PyBytes_FromStringAndSize(NULL, ktotal)
    cdef bytes voff_out = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
    cdef bytes vdata_out = PyBytes_FromStringAndSize(NULL, vtotal)
    cdef int32_t* kop = <int32_t*>PyBytes_AS_STRING(koff_out)
    cdef int32_t* vop = <int32_t*>PyBytes_AS_STRING(voff_out)
    cdef unsigned char* kp = <unsigned char*>PyBytes_AS_STRING(kdata_out)
    cdef unsigned char* vp = <unsigned char*>PyBytes_AS_STRING(vdata_out)
    cdef unsigned char* v0 = vp
    cdef unsigned char* kq = kp
    kop[0] = 0
    vop[0] = 0
    for i in range(n):
        klen = ko[i + 1] - ko[i]
        memcpy(kq, PyBytes_AS_STRING(prefix), lp)
        memcpy(kq + lp, kd + ko[i], klen)
        kq += lp + klen
        kop[i + 1] = <int32_t>(kq - kp)
        listed_fields(&f, ad + ao[i], ao[i + 1] - ao[i], ed + eo[i], eo[i + 1] - eo[i], sz[i], mt[i], address_type)
        vp[0] = 64  # zigzag varint of the identity's length, 32
        ident_hash(&f, None, vp + 1)
        vp += 33
        vp += put_uvarint(vp, <uint64_t>f.proto_len << 1)
        vp = proto_write(vp, &f, None)
        vop[i + 1] = <int32_t>(vp - v0)
    return koff_out, kdata_out, voff_out, vdata_out

