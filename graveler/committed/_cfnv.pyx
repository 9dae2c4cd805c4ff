# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""FNV-1a 64, lakeFS's range-break hash, compiled (the reference is ``graveler.committed.fnv``)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from cpython.long cimport PyLong_FromUnsignedLongLong

from graveler._cbytes cimport fnv1a64 as fnv_c

cdef inline bytes as_bytes(object b):
    if type(b) is bytes:
        return <bytes>b
    return bytes(b)


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
