"""Build of graveler's compiled hot path (Cython); everything else is in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

# OpenSSL's SHA-256 (libcrypto, hashlib's library): its low-level API, whose context can be saved and resumed,
# is deprecated in OpenSSL 3 in favour of EVP; the define keeps the compiler quiet about it.
_OPENSSL = dict(libraries=["crypto"], define_macros=[("OPENSSL_SUPPRESS_DEPRECATED", None)])

EXTENSIONS = [
    Extension("graveler._crecord", ["graveler/_crecord.pyx"], **_OPENSSL),
    Extension("graveler.sstable._cblock", ["graveler/sstable/_cblock.pyx"], **_OPENSSL),
    Extension("graveler.sstable._ctable", ["graveler/sstable/_ctable.pyx"], **_OPENSSL),
    Extension("graveler.committed._capply", ["graveler/committed/_capply.pyx"], **_OPENSSL),
    Extension("graveler.committed._cdiff", ["graveler/committed/_cdiff.pyx"], **_OPENSSL),
]

setup(ext_modules=cythonize(EXTENSIONS, compiler_directives={"language_level": "3"}))
