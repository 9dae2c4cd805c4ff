# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A range's records as Arrow columns of catalog entries (graveler.spark.entries' tasks), compiled.

The record values (zigzag-varint length-prefixed identity and data, as ``graveler._crecord``
decodes them) and the catalog.Entry protobuf in their data are parsed straight into the
buffers of Arrow arrays: no Python object per record.  The pure-Python reference is the
protobuf path in :mod:`graveler.spark.entries`; the tests hold both to the same columns.
"""

from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE

from graveler._cbytes cimport read_uvarint, read_varint

from graveler.errors import CorruptedData


from cpython.mem cimport PyMem_Malloc, PyMem_Free


cdef inline int skip_field(const unsigned char* p, Py_ssize_t n, Py_ssize_t* pos, int wt) noexcept:
    """Skip a protobuf field's payload of wire type ``wt``; 0 ok, -1 malformed."""
    cdef uint64_t u
    if wt == 0:
        return -1 if read_uvarint(p, n, pos, &u) else 0
    if wt == 1:
        pos[0] += 8
    elif wt == 5:
        pos[0] += 4
    elif wt == 2:
        if read_uvarint(p, n, pos, &u) or u > <uint64_t>(n - pos[0]):
            return -1
        pos[0] += <Py_ssize_t>u
    else:
        return -1
    return 0 if pos[0] <= n else -1


cdef inline int read_len(const unsigned char* p, Py_ssize_t n, Py_ssize_t* pos, Py_ssize_t* start,
                         Py_ssize_t* length) noexcept:
    cdef uint64_t u
    if read_uvarint(p, n, pos, &u) or u > <uint64_t>(n - pos[0]):
        return -1
    start[0] = pos[0]
    length[0] = <Py_ssize_t>u
    pos[0] += <Py_ssize_t>u
    return 0


def entry_columns(list values, name, int unknown_address_type):
    """Decode record values holding catalog entries into Arrow column buffers, with no Python object
    per record: ``(address offsets, address data, etag offsets, etag data, identity offsets, identity
    data, last-modified microseconds (int64), its validity bitmap, its null count, sizes (int64),
    address types (int32; one outside 0..2 becomes ``unknown_address_type``), [row indices of entries
    with user metadata])``.  Offsets are int32.  CorruptedData (naming ``name``) if a value or its
    protobuf is malformed (the strings' UTF-8 is the caller's to validate)."""
    cdef Py_ssize_t n = len(values), i, total = 0, pos, ln, istart, dstart, dn, fstart, flen, tpos, tend
    cdef Py_ssize_t astart, alen, estart, elen, ap = 0, ep = 0, ip = 0, nulls = 0
    cdef int64_t li, ld, secs, nanos, size
    cdef uint64_t tag, u
    cdef int r, wt, field, atype
    cdef bint has_ts, has_md
    cdef const unsigned char* p
    cdef const unsigned char* d
    cdef bytes raw
    cdef list md_rows = []
    for i in range(n):
        total += PyBytes_GET_SIZE(<bytes?>values[i])
    if total > 0x7FFFFFFF:
        raise ValueError("range block too large for one Arrow binary array")
    cdef bytes a_off = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
    cdef bytes e_off = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
    cdef bytes i_off = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
    cdef bytes lm = PyBytes_FromStringAndSize(NULL, 8 * n)
    cdef bytes valid = PyBytes_FromStringAndSize(NULL, (n + 7) // 8)
    cdef bytes sizes = PyBytes_FromStringAndSize(NULL, 8 * n)
    cdef bytes types = PyBytes_FromStringAndSize(NULL, 4 * n)
    cdef int32_t* aop = <int32_t*>PyBytes_AS_STRING(a_off)
    cdef int32_t* eop = <int32_t*>PyBytes_AS_STRING(e_off)
    cdef int32_t* iop = <int32_t*>PyBytes_AS_STRING(i_off)
    cdef int64_t* lmp = <int64_t*>PyBytes_AS_STRING(lm)
    cdef unsigned char* vp = <unsigned char*>PyBytes_AS_STRING(valid)
    cdef int64_t* szp = <int64_t*>PyBytes_AS_STRING(sizes)
    cdef int32_t* tp = <int32_t*>PyBytes_AS_STRING(types)
    cdef unsigned char* abuf = <unsigned char*>PyMem_Malloc(total + 1)
    cdef unsigned char* ebuf = <unsigned char*>PyMem_Malloc(total + 1)
    cdef unsigned char* ibuf = <unsigned char*>PyMem_Malloc(total + 1)
    cdef str err = ""
    if abuf == NULL or ebuf == NULL or ibuf == NULL:
        PyMem_Free(abuf)
        PyMem_Free(ebuf)
        PyMem_Free(ibuf)
        raise MemoryError()
    try:
        if n:
            memset(vp, 0, (n + 7) // 8)
        aop[0] = eop[0] = iop[0] = 0
        for i in range(n):
            raw = <bytes>values[i]
            p = <const unsigned char*>PyBytes_AS_STRING(raw)
            ln = PyBytes_GET_SIZE(raw)
            pos = 0
            r = read_varint(p, ln, &pos, &li)
            if r or li < 0 or li > ln - pos:
                err = "malformed record value (identity overruns the value)"
                break
            istart = pos
            pos += li
            r = read_varint(p, ln, &pos, &ld)
            if r or ld < 0 or ld != ln - pos:
                err = "malformed record value (data length does not match the value)"
                break
            memcpy(ibuf + ip, p + istart, li)
            ip += li
            iop[i + 1] = <int32_t>ip
            d = p + pos
            dn = ld
            pos = 0
            alen = elen = 0
            astart = estart = 0
            secs = nanos = size = 0
            atype = 0
            has_ts = has_md = False
            while pos < dn:
                if read_uvarint(d, dn, &pos, &tag):
                    err = "malformed catalog entry (bad tag)"
                    break
                field = <int>(tag >> 3)
                wt = <int>(tag & 7)
                if field == 1 and wt == 2:
                    if read_len(d, dn, &pos, &astart, &alen):
                        err = "malformed catalog entry (address)"
                        break
                elif field == 4 and wt == 2:
                    if read_len(d, dn, &pos, &estart, &elen):
                        err = "malformed catalog entry (etag)"
                        break
                elif field == 3 and wt == 0:
                    if read_uvarint(d, dn, &pos, &u):
                        err = "malformed catalog entry (size)"
                        break
                    size = <int64_t>u
                elif field == 6 and wt == 0:
                    if read_uvarint(d, dn, &pos, &u):
                        err = "malformed catalog entry (address type)"
                        break
                    atype = <int32_t>u
                elif field == 2 and wt == 2:
                    if read_len(d, dn, &pos, &fstart, &flen):
                        err = "malformed catalog entry (last modified)"
                        break
                    has_ts = True
                    tpos = fstart
                    tend = fstart + flen
                    while tpos < tend:
                        if read_uvarint(d, tend, &tpos, &tag):
                            err = "malformed catalog entry (timestamp)"
                            break
                        if (tag >> 3) == 1 and (tag & 7) == 0:
                            if read_uvarint(d, tend, &tpos, &u):
                                err = "malformed catalog entry (timestamp)"
                                break
                            secs = <int64_t>u
                        elif (tag >> 3) == 2 and (tag & 7) == 0:
                            if read_uvarint(d, tend, &tpos, &u):
                                err = "malformed catalog entry (timestamp)"
                                break
                            nanos = <int32_t>u
                        elif skip_field(d, tend, &tpos, <int>(tag & 7)):
                            err = "malformed catalog entry (timestamp)"
                            break
                    if err:
                        break
                else:
                    if field == 5:
                        has_md = True
                    if field == 0 or skip_field(d, dn, &pos, wt):
                        err = "malformed catalog entry (field %d)" % field
                        break
            if err:
                break
            memcpy(abuf + ap, d + astart, alen)
            ap += alen
            aop[i + 1] = <int32_t>ap
            memcpy(ebuf + ep, d + estart, elen)
            ep += elen
            eop[i + 1] = <int32_t>ep
            szp[i] = size
            tp[i] = atype if 0 <= atype <= 2 else unknown_address_type
            if has_ts:
                # seconds * 1e6 + nanos // 1000, Python's floor division
                lmp[i] = secs * 1000000 + (nanos // 1000 if nanos >= 0 else -((-nanos + 999) // 1000))
                vp[i >> 3] |= <unsigned char>(1 << (i & 7))
            else:
                lmp[i] = 0
                nulls += 1
            if has_md:
                md_rows.append(i)
        if err:
            raise CorruptedData(err, name)
        return (a_off, PyBytes_FromStringAndSize(<char*>abuf, ap), e_off, PyBytes_FromStringAndSize(<char*>ebuf, ep),
                i_off, PyBytes_FromStringAndSize(<char*>ibuf, ip), lm, valid, nulls, sizes, types, md_rows)
    finally:
        PyMem_Free(abuf)
        PyMem_Free(ebuf)
        PyMem_Free(ibuf)


cdef inline bint ascii(const unsigned char* p, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        if p[i] >= 0x80:
            return False
    return True


cdef object stat_of(bytes d):
    """(size, last-modified unix ns) of one catalog.Entry protobuf without user metadata, else None
    (metadata, or anything unusual -- a string field not ASCII, a field number out of range, a
    group, a malformed varint: the protobuf path decides)."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(d)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(d), pos = 0, tpos, tend, fstart, flen
    cdef uint64_t tag, u
    cdef int64_t secs = 0, size = 0
    cdef int32_t nanos = 0
    cdef int field, wt
    while pos < n:
        if read_uvarint(p, n, &pos, &tag) or tag > 0xFFFFFFFF:  # (field numbers end at 2**29 - 1)
            return None
        field = <int>(tag >> 3)
        wt = <int>(tag & 7)
        if wt == 2 and (field == 1 or field == 4 or field == 7):  # a string: protobuf checks its UTF-8
            if read_len(p, n, &pos, &fstart, &flen) or not ascii(p + fstart, flen):
                return None
        elif field == 3 and wt == 0:
            if read_uvarint(p, n, &pos, &u):
                return None
            size = <int64_t>u
        elif field == 2 and wt == 2:
            if read_len(p, n, &pos, &fstart, &flen):
                return None
            tpos = fstart
            tend = fstart + flen
            while tpos < tend:
                if read_uvarint(p, tend, &tpos, &tag) or tag > 0xFFFFFFFF:
                    return None
                if (tag >> 3) == 1 and (tag & 7) == 0:
                    if read_uvarint(p, tend, &tpos, &u):
                        return None
                    secs = <int64_t>u
                elif (tag >> 3) == 2 and (tag & 7) == 0:
                    if read_uvarint(p, tend, &tpos, &u):
                        return None
                    nanos = <int32_t>u
                elif (tag >> 3) == 0 or skip_field(p, tend, &tpos, <int>(tag & 7)):
                    return None
        elif field == 5 or field == 0 or skip_field(p, n, &pos, wt):
            return None  # user metadata, or malformed
    if secs > 9000000000 or secs < -9000000000:  # its nanoseconds past int64: Python's ints decide
        return None
    return (size, secs * 1000000000 + nanos)


def entry_stats(values):
    """``(size, last-modified unix ns)`` of the catalog entry of each range-record value (a listing
    page's; None: a common prefix), or None for one with user metadata or that does not parse as the simple case: those take
    :func:`graveler.model.entry_stat` (which raises CorruptedData where it must). One call a page, no
    protobuf object per record; the reference is :func:`graveler.model.py_entry_stats`."""
    return [None if v is None else stat_of(<bytes?>v[1]) for v in values]
