"""The sstable layer's implementation, chosen once: compiled (the default) or the pure-Python reference.

``LAKEFUSE_PURE_PYTHON=1`` (see :mod:`graveler.native`) selects the reference at
start-up. Both are a namespace with the same names, and the module exposes the
selected one's names itself; the rest of the layer (:mod:`~graveler.sstable.reader`,
:mod:`~graveler.sstable.writer`) and its callers use these and never ask which
one they got:

* ``Block``, ``decode_block``, ``BlockBuilder``, ``should_flush``: the block codec
  (``_cblock`` / :mod:`~graveler.sstable.block`);
* ``index_key``: Pebble's index-entry key for a block ending at a key;
* ``TableCore``: an open table's lookups, scans and ID hash (``_cblock`` /
  :mod:`~graveler.sstable.core`);
* ``TableBuilder``: a table written with its lakeFS ID hashed as it goes (``_ctable`` /
  :class:`~graveler.sstable.writer.HashedSSTableWriter`).

``compiled`` additionally names the checkpoint layout of its builder
(``CHECKPOINT_EVERY``, ``CHECKPOINT_BYTES``, ``CHECKPOINT_HEAD``, ``SHA256_STATE_TAG``).
The C-level kernels that committed/'s compiled modules call are declared in
``graveler/sstable/_crange.pxd`` (and the builder's in ``_ctable.pxd``).
"""

from __future__ import annotations

from types import SimpleNamespace

from graveler import native
from graveler.sstable import block as _block
from graveler.sstable import core as _core
from graveler.sstable import writer as _writer

reference = SimpleNamespace(
    name="pure-python",
    Block=_block.PyBlock,
    decode_block=_block.py_decode_block,
    BlockBuilder=_block.PyBlockBuilder,
    should_flush=_block.py_should_flush,
    index_key=_writer.py_index_key,
    TableCore=_core.PyTableCore,
    TableBuilder=_writer.HashedSSTableWriter,
)


def _compiled() -> SimpleNamespace:
    cblock = native.load("graveler.sstable._cblock")
    ctable = native.load("graveler.sstable._ctable")
    csha = native.load("graveler.sstable._csha256")
    native.load("graveler.sstable._crange")  # committed/'s kernels (C-level only): a missing build fails here
    return SimpleNamespace(
        name="compiled",
        Block=cblock.Block,
        decode_block=cblock.decode_block,
        BlockBuilder=cblock.BlockBuilder,
        should_flush=cblock.should_flush,
        index_key=cblock.index_key_for,
        TableCore=cblock.TableCore,
        TableBuilder=ctable.TableBuilder,
        CHECKPOINT_EVERY=ctable.CHECKPOINT_EVERY,
        CHECKPOINT_BYTES=ctable.CHECKPOINT_BYTES,
        CHECKPOINT_HEAD=ctable.CHECKPOINT_HEAD,
        SHA256_STATE_TAG=csha.SHA256_STATE_TAG,
    )


compiled: SimpleNamespace | None = None if native.PURE_PYTHON else _compiled()
selected: SimpleNamespace = reference if compiled is None else compiled

Block = selected.Block
decode_block = selected.decode_block
BlockBuilder = selected.BlockBuilder
should_flush = selected.should_flush
index_key = selected.index_key
TableCore = selected.TableCore
TableBuilder = selected.TableBuilder

__all__ = ["Block", "BlockBuilder", "TableBuilder", "TableCore", "compiled", "decode_block", "index_key",
           "reference", "selected", "should_flush"]
