"""Build of graveler's compiled hot path (Cython); everything else is in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

# OpenSSL's SHA-256 (libcrypto, hashlib's library): its low-level API, whose context can be saved and resumed,
# is deprecated in OpenSSL 3 in favour of EVP; the define keeps the compiler quiet about it.
_OPENSSL = dict(libraries=["crypto"], define_macros=[("OPENSSL_SUPPRESS_DEPRECATED", None)])

EXTENSIONS = [
    # the records layer (values, entries, identities) and the LRU
    Extension("graveler._crecord", ["graveler/_crecord.pyx"], **_OPENSSL),
    Extension("graveler._clru", ["graveler/_clru.pyx"]),
    Extension("graveler._centries", ["graveler/_centries.pyx"]),  # catalog entries into Arrow columns (Spark)
    # the sstable layer: SHA-256 for table IDs, blocks and the table core, the table builder, committed/'s kernels
    Extension("graveler.sstable._csha256", ["graveler/sstable/_csha256.pyx"], **_OPENSSL),
    Extension("graveler.sstable._cblock", ["graveler/sstable/_cblock.pyx"], **_OPENSSL),
    Extension("graveler.sstable._ctable", ["graveler/sstable/_ctable.pyx"], **_OPENSSL),
    Extension("graveler.sstable._crange", ["graveler/sstable/_crange.pyx"], **_OPENSSL),
    # the committed layer: FNV range breaks, apply's per-range step, diff
    Extension("graveler.committed._cfnv", ["graveler/committed/_cfnv.pyx"]),
    Extension("graveler.committed._capply", ["graveler/committed/_capply.pyx"], **_OPENSSL),
    Extension("graveler.committed._cdiff", ["graveler/committed/_cdiff.pyx"], **_OPENSSL),
]

setup(ext_modules=cythonize(EXTENSIONS, compiler_directives={"language_level": "3"}))
