"""Checkpoints of a range: what lets a rewrite skip the unchanged blocks before its first change.

When the compiled writer writes a range (``graveler.sstable._ctable``), it
records at every 16th data-block boundary the file offset, the record counters,
the stored CRC of the block before, and the state of the SHA-256 that makes the
range's ID. ``apply`` of a change far into that range later resumes from the
last checkpoint before the change: the file up to there is copied, and its
records are not decompressed and hashed again (the ID still covers every
record: the saved state already holds them).

The checkpoints are facts about one range ID, kept by the home's
:class:`graveler.cache.CheckMemo` (never in the storage namespace). This
module packs them with what they depend on -- the range parameters, the file's
size, the SHA-256 state layout of this OpenSSL build -- and a digest, and
unpacks them only when all of that still holds: otherwise a rewrite starts
from the first block, as it always can.
"""

from __future__ import annotations

import hashlib
import struct

from types import SimpleNamespace

from graveler.config import RangeParams

_MAGIC = b"lakefuse range checkpoints v1\n"
_HEAD = struct.Struct("<qqqqqq")  # checkpoint every, record size, min, max, raggedness, file size

# ``fmt`` below: the compiled sstable layer (graveler.sstable.kernel.compiled), whose builder records
# checkpoints: CHECKPOINT_EVERY, CHECKPOINT_BYTES, CHECKPOINT_HEAD and SHA256_STATE_TAG.


def pack(fmt: SimpleNamespace, params: RangeParams, file_size: int, raw: bytes) -> bytes | None:
    """The memo's record for a range's checkpoints (``TableBuilder.checkpoint_data``); None if there are none."""
    if not raw:
        return None
    body = _MAGIC + fmt.SHA256_STATE_TAG + b"\n" + _HEAD.pack(fmt.CHECKPOINT_EVERY, fmt.CHECKPOINT_BYTES,
                                                              params.min_range_size, params.max_range_size,
                                                              params.raggedness, file_size) + raw
    return body + hashlib.sha256(body).digest()


def unpack(fmt: SimpleNamespace, blob: bytes | None, params: RangeParams,
           file_size: int) -> tuple[list[tuple], bytes] | None:
    """(checkpoints, their raw bytes) if ``blob`` is intact and was recorded for these parameters and a file
    of this size by this build; else None."""
    if not blob or len(blob) < 32:
        return None
    body, digest = blob[:-32], blob[-32:]
    head = _MAGIC + fmt.SHA256_STATE_TAG + b"\n"
    if not body.startswith(head) or hashlib.sha256(body).digest() != digest:
        return None
    fields = _HEAD.unpack_from(body, len(head))
    want = (fmt.CHECKPOINT_EVERY, fmt.CHECKPOINT_BYTES, params.min_range_size, params.max_range_size,
            params.raggedness, file_size)
    if fields != want:
        return None
    raw = body[len(head) + _HEAD.size:]
    size, head_s = fmt.CHECKPOINT_BYTES, fmt.CHECKPOINT_HEAD
    if len(raw) % size:
        return None
    return [head_s.unpack_from(raw, at) + (raw[at + head_s.size:at + size],) for at in range(0, len(raw), size)], raw
