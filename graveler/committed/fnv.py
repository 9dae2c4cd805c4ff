"""FNV-1a 64-bit, the hash behind lakeFS's range breaks.

The pure-Python reference: batches of keys hashed with numpy (one vectorised
step per byte column, imported only then), short batches with the plain loop.
The compiled loop is ``graveler.committed._cfnv``; :mod:`graveler.committed.kernel`
selects (``kernel.fnv1a64``, ``kernel.fnv1a64_batch``).
"""

from __future__ import annotations

OFFSET = 0xCBF29CE484222325
PRIME = 0x100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF
_BATCH_MIN = 4


def py_fnv1a64(key: bytes) -> int:
    h = OFFSET
    for b in key:
        h = ((h ^ b) * PRIME) & _MASK
    return h


def py_fnv1a64_batch(keys: list[bytes]) -> list[int]:
    n = len(keys)
    if n < _BATCH_MIN:
        return [py_fnv1a64(k) for k in keys]
    import numpy as np  # the reference only: the compiled path never loads numpy (nor its BLAS threads)

    lens = np.fromiter(map(len, keys), dtype=np.int64, count=n)
    width = max(int(lens.max()), 1)
    # Pad every key to the same width; the padding is never hashed (rows stop at their length).
    mat = np.frombuffer(b"".join([k.ljust(width, b"\0") for k in keys]), dtype=np.uint8).reshape(n, width)
    h = np.full(n, OFFSET, dtype=np.uint64)
    prime = np.uint64(PRIME)
    # Sort by length so each column step touches only the keys still running.
    order = np.argsort(-lens, kind="stable")
    cols_major = np.ascontiguousarray(mat[order].T)  # one contiguous uint8 row per byte column
    neg_lens = -lens[order]
    hs = h  # same initial value everywhere; order does not matter yet
    lives = np.searchsorted(neg_lens, -np.arange(width), side="left").tolist()  # rows with len > j
    with np.errstate(over="ignore"):
        for j, live in enumerate(lives):
            if live == 0:
                break
            col = cols_major[j, :live]
            part = hs[:live]
            np.bitwise_xor(part, col, out=part)
            np.multiply(part, prime, out=part)
    out = np.empty(n, dtype=np.uint64)
    out[order] = hs
    return out.tolist()

