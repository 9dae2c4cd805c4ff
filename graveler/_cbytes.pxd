# Byte-level helpers shared by graveler's compiled modules (inline C, no module of its own):
# Go's uvarints and (zigzag) varints, key order, little-endian words, decimal lengths (the table-ID input), FNV-1a 64.

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcmp


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


cdef inline int read_varint(const unsigned char* p, Py_ssize_t n, Py_ssize_t* pos, int64_t* out) noexcept nogil:
    """Go's binary.Varint (zigzag).  0: ok; -1: truncated; -2: too long / over 64 bits."""
    cdef uint64_t u
    cdef int r = read_uvarint(p, n, pos, &u)
    if r == 0:
        out[0] = <int64_t>(u >> 1) ^ -(<int64_t>(u & 1))
    return r


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


cdef inline uint32_t le32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0]) | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline Py_ssize_t dec_len(Py_ssize_t v) noexcept nogil:
    """Digits of ``v`` in decimal (the table-ID input writes lengths in ASCII)."""
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


cdef inline uint64_t fnv1a64(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef uint64_t h = 0xCBF29CE484222325ULL
    cdef Py_ssize_t j
    for j in range(n):
        h = (h ^ p[j]) * 0x100000001B3ULL
    return h
