"""LMDB's ``data.mdb`` read with ``pread``, never mapped: the check made before LMDB maps it.

Mapping a file shorter than the pages a database uses kills the process with SIGBUS
on the first touch of a missing page; an empty file would silently become a new,
empty database.  So before LMDB maps ``data.mdb`` we read its two meta pages and
compare the file's length with what the newest meta page counts.

A healthy file may end before the meta's last page.  LMDB never writes *loose*
pages (pages allocated and freed again within one write transaction, see
``mdb_page_flush``) and hands their numbers to the free list when it commits
(``mdb_freelist_save``).  When the highest pages of a transaction were loose, the
file ends up shorter than ``(last_pg + 1) * psize`` and stays so until a later
transaction reuses those pages.  Nothing in the database refers to a free page and
LMDB never reads one (a page taken from the free list is built in memory and
written), so such a file is healthy.

The rule, then: **a file shorter than its meta says is healthy exactly when every
missing page is on the free list of the newest meta page.**  Proving it reads only
the free-list B-tree (its branch, leaf and overflow pages, each bound-checked
against the file's length): a cost in proportion to the free list, paid only when
the file is short.  A missing page that is not free is one the database uses:
that file was truncated, and LMDB would die of SIGBUS (or read zeros) on it.

Concurrency: the check holds no LMDB lock.  The pages of the newest snapshot
(including its free-list tree) cannot be overwritten before the transaction after
the next one commits, so the proof is accepted only if the newest meta is still
the same after it; otherwise it is made again.

The layout read here is LMDB 0.9's (py-lmdb bundles 0.9): a 16-byte page header
(pgno u64, pad u16, flags u16, lower u16, upper u16 -- or, on an overflow page,
the page count u32 in place of lower/upper), then the node offsets; a node is
lo u16, hi u16, flags u16, ksize u16, key, data.
"""

from __future__ import annotations

import dataclasses
import os
import struct

P_INVALID = (1 << 64) - 1
DATA_VERSION = 1  # MDB_DATA_VERSION of LMDB 0.9: the layout below

_P_BRANCH = 0x01
_P_LEAF = 0x02
_P_OVERFLOW = 0x04
_F_BIGDATA = 0x01

_META_MAGIC = 0xBEEFC0DE
_META_BYTES = 152
_META_HEAD = struct.Struct("<II")  # magic, version (offset 16)
_META_PSIZE = struct.Struct("<I")  # free DB's md_pad holds the page size (offset 40)
_META_FREE_ROOT = struct.Struct("<Q")  # free DB's md_root (offset 80)
_META_TAIL = struct.Struct("<QQ")  # last_pg, txnid (offset 136)

_PAGE_HEAD = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_OVERFLOW_PAGES = struct.Struct("<I")  # offset 12 of an overflow page
_PAGE_HEAD_SIZE = 16
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, ksize
_NODE_SIZE = 8
_U64 = struct.Struct("<Q")

_MAX_DEPTH = 64  # far beyond any real B-tree; a cycle in a damaged file ends here


@dataclasses.dataclass(frozen=True)
class Meta:
    """What the check needs of one meta page."""

    version: int
    psize: int
    free_root: int
    last_pg: int
    txnid: int

    @property
    def size_needed(self) -> int:
        """Bytes up to the end of the last page this meta counts."""
        return (self.last_pg + 1) * self.psize


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`check`: ``damage`` is None for a healthy file."""

    size: int  # the file's length when it was judged
    meta: Meta | None  # the newest meta page (None: the file is missing, or damaged before it)
    damage: str | None = None
    short_pages: int = 0  # pages past the end that were proven free (0: the file is long enough)

    @property
    def healthy(self) -> bool:
        return self.damage is None


def read_metas(fd: int) -> list[Meta] | str:
    """Both meta pages, or why they are unreadable."""
    first = os.pread(fd, _META_BYTES, 0)
    if len(first) < _META_BYTES:
        return f"shorter ({len(first)} bytes) than one meta page"
    (psize,) = _META_PSIZE.unpack_from(first, 40)
    if psize < 512 or psize > 1 << 16 or psize & (psize - 1):
        return f"bad page size {psize} in meta page 0"
    metas = []
    for i, buf in enumerate((first, os.pread(fd, _META_BYTES, psize))):
        if len(buf) < _META_BYTES:
            return f"has no meta page {i} (file shorter than {psize + _META_BYTES} bytes)"
        magic, version = _META_HEAD.unpack_from(buf, 16)
        if magic != _META_MAGIC:
            return f"bad magic {magic:#x} in meta page {i}"
        (free_root,) = _META_FREE_ROOT.unpack_from(buf, 80)
        last_pg, txnid = _META_TAIL.unpack_from(buf, 136)
        metas.append(Meta(version, psize, free_root, last_pg, txnid))
    return metas


def newest(metas: list[Meta]) -> Meta:
    """The meta page LMDB opens with: the higher transaction ID."""
    return max(metas, key=lambda m: m.txnid)


class _Bad(Exception):
    """The free list cannot be read: the file is damaged (the message says where)."""


def _read(fd: int, offset: int, length: int, size: int, what: str) -> bytes:
    if offset + length > size:
        raise _Bad(f"{what} ends at byte {offset + length}, past the end of the file")
    buf = os.pread(fd, length, offset)
    if len(buf) != length:
        raise _Bad(f"{what}: short read")
    return buf


def _overflow_data(fd: int, pgno: int, length: int, psize: int, size: int) -> bytes:
    head = _read(fd, pgno * psize, _PAGE_HEAD_SIZE, size, f"free-list overflow page {pgno}")
    got, _, flags, _, _ = _PAGE_HEAD.unpack(head)
    (pages,) = _OVERFLOW_PAGES.unpack_from(head, 12)
    if got != pgno or not flags & _P_OVERFLOW or pages * psize < _PAGE_HEAD_SIZE + length:
        raise _Bad(f"free-list overflow page {pgno} is not one (page number {got}, flags {flags:#x})")
    return _read(fd, pgno * psize + _PAGE_HEAD_SIZE, length, size, f"free-list overflow page {pgno}")


def _free_list(fd: int, meta: Meta, size: int, wanted: set[int]) -> None:
    """Remove from ``wanted`` every page on ``meta``'s free list; stop once it is empty."""
    psize = meta.psize
    if meta.free_root == P_INVALID:
        return
    stack = [(meta.free_root, 0)]
    seen: set[int] = set()
    while stack and wanted:
        pgno, depth = stack.pop()
        if depth > _MAX_DEPTH or pgno in seen or pgno > meta.last_pg or pgno < 2:
            raise _Bad(f"free-list page {pgno} is out of place (depth {depth})")
        seen.add(pgno)
        page = _read(fd, pgno * psize, psize, size, f"free-list page {pgno}")
        got, _, flags, lower, upper = _PAGE_HEAD.unpack_from(page)
        if got != pgno or not flags & (_P_BRANCH | _P_LEAF):
            raise _Bad(f"free-list page {pgno} is not a tree page (page number {got}, flags {flags:#x})")
        if not _PAGE_HEAD_SIZE <= lower <= upper <= psize:
            raise _Bad(f"free-list page {pgno} has bad bounds ({lower}, {upper})")
        count = (lower - _PAGE_HEAD_SIZE) >> 1
        for off in struct.unpack_from(f"<{count}H", page, _PAGE_HEAD_SIZE):
            if not upper <= off <= psize - _NODE_SIZE:
                raise _Bad(f"free-list page {pgno} has a node at bad offset {off}")
            lo, hi, nflags, ksize = _NODE.unpack_from(page, off)
            if flags & _P_BRANCH:
                stack.append((lo | hi << 16 | nflags << 32, depth + 1))
                continue
            dsize = lo | hi << 16
            start = off + _NODE_SIZE + ksize
            if nflags & _F_BIGDATA:
                if start + 8 > psize:
                    raise _Bad(f"free-list page {pgno} has a node past its end")
                (ov,) = _U64.unpack_from(page, start)
                data = _overflow_data(fd, ov, dsize, psize, size)
            else:
                if start + dsize > psize:
                    raise _Bad(f"free-list page {pgno} has a node past its end")
                data = page[start:start + dsize]
            if dsize < 8:
                raise _Bad(f"free-list page {pgno} has a record of {dsize} bytes")
            (n,) = _U64.unpack_from(data)
            if (n + 1) * 8 > dsize:
                raise _Bad(f"free-list page {pgno} has a record counting {n} pages in {dsize} bytes")
            wanted.difference_update(struct.unpack_from(f"<{n}Q", data, 8))


def _judge(fd: int) -> Verdict:
    metas = read_metas(fd)
    size = os.fstat(fd).st_size  # after the metas: a concurrent commit only makes the file longer
    if isinstance(metas, str):
        return Verdict(size, None, f"{metas}")
    if metas[0].version != metas[1].version:  # (LMDB checks both: it would refuse the file as of another format)
        return Verdict(size, None, f"has meta pages of two data formats (v{metas[0].version} and v{metas[1].version}): "
                                   "one of them is damaged")
    meta = newest(metas)
    need = meta.size_needed
    if size >= need or meta.version != DATA_VERSION:
        # long enough; or a layout this module does not know, which LMDB itself refuses
        # (MDB_VERSION_MISMATCH) from the header it reads with pread, before mapping anything
        return Verdict(size, meta)
    first_missing = size // meta.psize  # a partial last page counts as missing
    missing = set(range(first_missing, meta.last_pg + 1))
    short = len(missing)
    if first_missing < 2:
        return Verdict(size, meta, f"is truncated ({size} bytes; its meta page uses {need})")
    try:
        _free_list(fd, meta, size, missing)
    except _Bad as e:
        return Verdict(size, meta, f"is truncated ({size} bytes; its meta page uses {need}) and {e}")
    if missing:
        return Verdict(size, meta, f"is truncated ({size} bytes; its meta page uses {need}, and page "
                                   f"{min(missing)} past the end is in use)")
    return Verdict(size, meta, short_pages=short)


def check(fd: int, attempts: int = 20) -> Verdict:
    """Judge the open ``data.mdb`` ``fd``: healthy (possibly short by free pages only) or damaged.

    A verdict on a short file is kept only if the newest meta page did not change
    while it was made (see the module's note on concurrency); ``RuntimeError`` if
    it changed ``attempts`` times in a row (a writer that never pauses: the caller
    reports the database as busy, never as damaged).
    """
    for _ in range(attempts):
        verdict = _judge(fd)
        if verdict.meta is None or (verdict.healthy and not verdict.short_pages):
            return verdict
        again = read_metas(fd)
        if not isinstance(again, str) and newest(again).txnid == verdict.meta.txnid:
            return verdict
    raise RuntimeError("the database kept changing while its free list was read")
