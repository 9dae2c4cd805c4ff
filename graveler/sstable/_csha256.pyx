# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""SHA-256 (OpenSSL) with a state that can be saved and resumed, and an optional hashing thread.

The table builder (``_ctable``) and the table core (``_cblock``) hash a table's records for its ID
with it; its state at a block boundary is what a range checkpoint saves.
"""

from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE

cdef extern from "Python.h":
    void* PyMem_Malloc(size_t n)
    void PyMem_Free(void* p)

cdef inline bytes as_bytes(object b):
    if type(b) is bytes:
        return <bytes>b
    return bytes(b)


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
