# C-level entry points of graveler._crecord, for the other compiled modules.

cdef object decode_ptr(const unsigned char* p, Py_ssize_t n, object name)
