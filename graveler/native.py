"""Which implementation runs graveler's hot paths: the switch's setting and the loader, nothing else.

The compiled extensions, built from their ``.pyx`` files by ``pip install``, are the
default; the pure-Python code beside them is the reference they are tested
against, and ``LAKEFUSE_PURE_PYTHON=1`` selects it at start-up (debugging,
profiling the reference). Each layer chooses once, in one module, and exposes
the same names either way; nothing else asks which one it got:

* records (values, entries, identities): :mod:`graveler.model` -- ``graveler._crecord``, ``graveler._centries``
  (entries into Arrow columns);
* the LRU: :mod:`graveler.lru` -- ``graveler._clru``;
* sstable: :mod:`graveler.sstable.kernel` -- ``graveler.sstable._cblock`` (blocks, the table
  core), ``_ctable`` (the table builder), ``_csha256`` (the table-ID hash), ``_crange``
  (the kernels committed/ runs on table blocks);
* committed: :mod:`graveler.committed.kernel` -- ``graveler.committed._cfnv`` (range
  breaks), ``_capply`` (apply's per-range step), ``_cdiff`` (diff).

A missing build is an ImportError that says so, never a silent fall-back to the
slow path.
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
