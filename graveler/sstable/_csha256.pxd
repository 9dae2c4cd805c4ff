# C-level declarations of graveler.sstable._csha256 (the table-ID hash), for _cblock and _ctable.

from cpython.pythread cimport PyThread_type_lock

cdef extern from "openssl/sha.h":
    ctypedef struct SHA256_CTX:
        pass


cdef struct HashPipe:
    SHA256_CTX* ctx
    PyThread_type_lock ready   # held while no chunk waits for the thread
    PyThread_type_lock done    # held while the thread hashes a chunk
    const unsigned char* job
    size_t job_len
    bint stop
    bint want_snap             # copy the state after this job into ``snap``
    SHA256_CTX snap


cdef class Sha256:
    cdef SHA256_CTX ctx
    cdef unsigned char* stage[2]
    cdef Py_ssize_t cap[2]
    cdef int cur
    cdef Py_ssize_t slen
    cdef HashPipe* pipe
    cdef bint threaded
    cdef object snap_target    # a bytearray waiting for the snapshot of the job in flight
    cdef Py_ssize_t snap_at

    cdef void stop_worker(self) noexcept
    cdef int start_worker(self) except -1
    cdef int acquire_done(self) except -1
    cdef int snapshot_into(self, bytearray target, Py_ssize_t at) except -1
    cdef int submit(self) except -1
    cdef int sync(self) except -1
    cdef unsigned char* reserve(self, Py_ssize_t n) except NULL
    cdef int commit(self, Py_ssize_t n) except -1
    cdef int update_c(self, const void* p, size_t n) except -1
