# C-level entry points of graveler._crecord (the records layer), for the other compiled modules.

# The graveler Value held in a stored record value (``zigzag(len) identity zigzag(len) data``);
# CorruptedData naming ``name`` when malformed.
cdef object decode_ptr(const unsigned char* p, Py_ssize_t n, object name)
