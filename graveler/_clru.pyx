# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The byte-bounded LRU of ``graveler.lru`` compiled: the same behaviour, a hit costs one C call."""

from cpython.ref cimport PyObject


from collections import OrderedDict
import threading

from cpython.dict cimport PyDict_GetItemWithError

# the insert lock's acquire and release, bound once (``with lock`` looks both up on every put)
cdef object lock_acquire = type(threading.Lock()).acquire
cdef object lock_release = type(threading.Lock()).release

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
        cdef object lock = self._lock
        lock_acquire(lock)
        try:
            if PyDict_GetItemWithError(self._d, key) != NULL:  # (a replacement: rare)
                old = self._d.pop(key, None)
                if old is not None:
                    self._bytes -= self._weight(old)
            self.insert(key, value)
        finally:
            lock_release(lock)

    def setdefault(self, key, value):
        """The value already cached under ``key`` if any (another thread won the race), else ``value``, now cached."""
        with self._lock:
            old = self._d.get(key)
            if old is not None:
                return old
            self.insert(key, value)
            return value

    cdef int insert(self, key, value) except -1:
        d = self._d
        d[key] = value  # (OrderedDict's own item assignment: it keeps the order)
        self._bytes += self._weight(value)
        while self._bytes > self.max_bytes and len(d) > 1:
            _, ev = d.popitem(last=False)
            self._bytes -= self._weight(ev)
        return 0

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
