"""Which implementation runs graveler's per-record hot path.

The compiled extensions, built from their ``.pyx`` files by ``pip install``, are the
default: ``graveler._crecord`` (entry encoding and identity, SHA-256 on OpenSSL),
``graveler.sstable._cblock`` (block decode, get, scans, block encode),
``graveler.sstable._ctable`` (the table writer with the range-ID hash),
``graveler.committed._capply`` (the per-range step of apply) and
``graveler.committed._cdiff`` (diff).  The
pure-Python code beside them is the reference they are tested against, and
``LAKEFUSE_PURE_PYTHON=1`` selects it at start-up (debugging, profiling the
reference).  A missing build is an ImportError that says so, never a silent
fall-back to the slow path.
"""

from __future__ import annotations

import importlib
import os

PURE_PYTHON = os.environ.get("LAKEFUSE_PURE_PYTHON", "").strip().lower() not in ("", "0", "false", "no")


def implementation() -> str:
    return "pure-python" if PURE_PYTHON else "compiled"


def load(module: str):
    """Import a compiled module of graveler, or fail with an ImportError that says what to do."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{module}, graveler's compiled hot path, is not built ({e}); run `pip install -e .` "
            "(scripts/setup.sh does) or set LAKEFUSE_PURE_PYTHON=1 to run the pure-Python reference"
        ) from e
