"""Build of graveler's compiled hot path (Cython); everything else is in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

EXTENSIONS = [
    Extension("graveler.sstable._cblock", ["graveler/sstable/_cblock.pyx"]),
    Extension("graveler._crecord", ["graveler/_crecord.pyx"], libraries=["crypto"]),  # OpenSSL SHA-256
]

setup(ext_modules=cythonize(EXTENSIONS, compiler_directives={"language_level": "3"}))
