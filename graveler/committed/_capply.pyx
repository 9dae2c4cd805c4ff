# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""``apply``'s per-range step compiled: one touched range and its changes into a MetaRangeWriter.

The reference is ``graveler.committed.manager._apply_range`` (same output, byte
for byte, tested on random trees). For each data block of the source range, in
order:

* a block no change falls in is *carried*: its stored bytes are appended to the
  table being written when that is exactly what writing its records would
  produce (``TableBuilder.carry_c``: Pebble would start a block at its first
  record and close it before the next one, and no size break falls inside); its
  records still feed the table-ID hash, which covers every record. Keys inside
  it are not FNV-checked for range breaks: they come from a range written under
  the same rule, so none of them breaks (an untouched range is copied whole on
  the same footing). Only a block that cannot be carried is re-encoded;
* a block a change falls in is merged record by record with the changes (an
  unchanged identity keeps the stored value; ``None`` deletes), each record
  checked for a range break after it is written.

Blocks are read uncached (a rewrite streams through a range once) with one
block of look-ahead, which tells whether Pebble would close the block before
the next record. Once a block is carried, the blocks after it up to the one
before the next change goes in one run (``RangeBlocks.carry_run``): each is
decompressed into a scratch buffer, checked to be carried as ``carry`` would,
and its records hashed from there, with no Python object per block or record. Table bytes are the sstable layer's: blocks, records, carrying
and resuming go through its kernel API (``graveler/sstable/_crange.pxd``).
"""

from libc.string cimport memcmp
from libc.stdint cimport uint64_t, int64_t
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE

from graveler._cbytes cimport cmp_keys, fnv1a64
from graveler.sstable._crange cimport BlockRecords, RangeBlocks
from graveler.sstable._ctable cimport TableBuilder

from graveler.errors import CorruptedData
from graveler.sstable._ctable import CHECKPOINT_BYTES


cdef inline int zigzag_len_prefix(const unsigned char* p, Py_ssize_t n, Py_ssize_t* pos, int64_t* out) noexcept:
    """Go's signed varint (zigzag) at ``pos``: 0 ok, -1 malformed."""
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    cdef Py_ssize_t i = pos[0]
    while True:
        if i >= n or shift > 63:
            return -1
        b = p[i]
        i += 1
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            break
        shift += 7
    pos[0] = i
    out[0] = <int64_t>(result >> 1) ^ -(<int64_t>(result & 1))
    return 0


cdef inline int identity_of(const unsigned char* v, Py_ssize_t n, const unsigned char** ident,
                            Py_ssize_t* ilen) noexcept:
    """The identity inside a record value (``zigzag(len) identity zigzag(len) data``); -1 if malformed."""
    cdef Py_ssize_t pos = 0
    cdef int64_t li
    if zigzag_len_prefix(v, n, &pos, &li) != 0 or li < 0 or li > n - pos:
        return -1
    ident[0] = v + pos
    ilen[0] = <Py_ssize_t>li
    return 0


cdef class RangeApply:
    """The state of one range's rewrite; ``run`` does it. ``added``/``removed``/``changed``: its stats."""

    cdef object w                 # the MetaRangeWriter
    cdef TableBuilder b           # the table being written (None between a range break and the next record)
    cdef RangeBlocks src
    cdef Py_ssize_t src_size
    cdef Py_ssize_t min_size, max_size
    cdef uint64_t ragg
    cdef list ckeys, craws
    cdef Py_ssize_t ci, nch
    cdef readonly Py_ssize_t added, removed, changed, written, blocks_carried, blocks_rewritten, blocks_in_runs
    cdef object last_written
    cdef list checkpoints
    cdef bytes cp_raw
    cdef readonly Py_ssize_t resumed_at    # the block the rewrite resumed at (0: from the start)

    def __cinit__(self, w, table, list ckeys, list craws, Py_ssize_t min_size, Py_ssize_t max_size,
                  uint64_t raggedness, checkpoints=None):
        """``table``: the source range, an open SSTable; ``checkpoints``: what the source range's writer
        recorded, as ``graveler.committed.checkpoints`` decodes it: (records as tuples, their raw bytes), or None."""
        self.checkpoints = checkpoints[0] if checkpoints is not None else None
        self.cp_raw = checkpoints[1] if checkpoints is not None else b""
        self.resumed_at = 0
        self.w = w
        self.src = RangeBlocks(table)
        self.src_size = table.size
        self.ckeys = ckeys
        self.craws = craws
        self.ci = 0
        self.nch = len(ckeys)
        if len(craws) != self.nch:
            raise ValueError("keys and values of the changes differ in number")
        self.min_size = min_size
        self.max_size = max_size
        self.ragg = raggedness
        self.b = None
        self.last_written = None

    @property
    def last_key(self):
        """The last key written (None if nothing was)."""
        return self.last_written

    # -- writing ------------------------------------------------------------------------------------
    cdef TableBuilder builder(self):
        if self.b is None:
            self.b = <TableBuilder?>self.w.open_table()
            # room for a file the source range's size at once (not grown by doubling, copied each time)
            self.b.reserve(self.src_size + 65536)
        return self.b

    cdef int after_record(self, bytes key, bint hashed_break) except -1:
        """lakeFS's range-break rule after ``key`` was written: close the range when it holds.

        ``hashed_break``: whether the key's FNV can break the range. A key of the source range other than
        its last one cannot (the range was written by the same rule and did not break there), so its hash
        is not computed; added keys and the range's last key are hashed."""
        cdef Py_ssize_t est = self.b.estimated_size_c()
        self.last_written = key
        self.written += 1
        if est >= self.min_size and self.ragg and (
                est >= self.max_size or (hashed_break and fnv1a64(
                    <const unsigned char*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)) % self.ragg == 0)):
            self.w.close_range()
            self.b = None
        return 0

    cdef int write(self, bytes key, const unsigned char* v, Py_ssize_t lv, bint hashed_break) except -1:
        self.builder().add_c(key, v, lv)
        self.after_record(key, hashed_break)
        return 0

    cdef int write_change(self, Py_ssize_t i) except -1:
        cdef bytes raw = <bytes>self.craws[i]
        self.write(<bytes>self.ckeys[i], <const unsigned char*>PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), True)
        return 0

    cdef int changes_before(self, const unsigned char* k, Py_ssize_t lk) except -1:
        """Write the changes with keys < k (all of them if k is NULL): additions (a deletion of a key
        that is not there is nothing)."""
        cdef bytes ck
        while self.ci < self.nch:
            ck = <bytes>self.ckeys[self.ci]
            if k != NULL and cmp_keys(<const unsigned char*>PyBytes_AS_STRING(ck), PyBytes_GET_SIZE(ck), k, lk) >= 0:
                break
            if self.craws[self.ci] is not None:
                self.write_change(self.ci)
                self.added += 1
            self.ci += 1
        return 0

    # -- blocks ---------------------------------------------------------------------------------------
    cdef int merge_block(self, BlockRecords blk, bint last_block) except -1:
        """Write ``blk``'s records merged with the changes that fall before its end (``last_block``: the
        source range's last block, whose last key may break the range)."""
        cdef Py_ssize_t lk, lv, li_r, li_c
        cdef const unsigned char* kb
        cdef const unsigned char* v
        cdef const unsigned char* id_r
        cdef const unsigned char* id_c
        cdef bytes key, ck, craw
        cdef int c
        while blk.next():
            kb, lk, v, lv = blk.key, blk.klen, blk.val, blk.vlen
            self.changes_before(kb, lk)
            if self.ci < self.nch:
                ck = <bytes>self.ckeys[self.ci]
                c = cmp_keys(<const unsigned char*>PyBytes_AS_STRING(ck), PyBytes_GET_SIZE(ck), kb, lk)
            else:
                c = 1
            if c == 0:
                craw = self.craws[self.ci]
                self.ci += 1
                if craw is None:
                    self.removed += 1
                    continue
                if identity_of(v, lv, &id_r, &li_r) != 0:
                    raise CorruptedData(f"malformed record value of {PyBytes_FromStringAndSize(<char*>kb, lk)!r}", self.src.name)
                if identity_of(<const unsigned char*>PyBytes_AS_STRING(craw), PyBytes_GET_SIZE(craw),
                               &id_c, &li_c) != 0:
                    raise ValueError(f"malformed change value for {ck!r}")
                if li_r == li_c and memcmp(id_r, id_c, li_r) == 0:
                    # the same identity: no change, the stored bytes stay
                    self.write(ck, v, lv, last_block and blk.at_last())
                else:
                    self.write(ck, <const unsigned char*>PyBytes_AS_STRING(craw), PyBytes_GET_SIZE(craw),
                               last_block and blk.at_last())
                    self.changed += 1
                continue
            key = PyBytes_FromStringAndSize(<char*>kb, lk)
            self.write(key, v, lv, last_block and blk.at_last())
        return 0

    cdef int carry(self, Py_ssize_t bi, BlockRecords blk, BlockRecords nxt) except -1:
        """Carry block ``bi`` (``blk``, no change falls in it) verbatim if the writer can; 1 if it did."""
        cdef Py_ssize_t next_len = 0
        cdef bytes next_key = None, last, ck
        cdef bint closes = False
        cdef int r
        if nxt is not None:
            if nxt.n == 0:
                return 0
            next_key = nxt.first_key()
            if self.ci < self.nch:
                ck = <bytes>self.ckeys[self.ci]
                if cmp_keys(<const unsigned char*>PyBytes_AS_STRING(ck), PyBytes_GET_SIZE(ck),
                            <const unsigned char*>PyBytes_AS_STRING(next_key), PyBytes_GET_SIZE(next_key)) <= 0:
                    return 0  # a change comes next: the block's end is decided by what it writes
            next_len = nxt.first_value_len()
        last = blk.last_key()
        if nxt is None:
            # the range's last block: carried when the table closes right after it (its last key breaks)
            if self.ci < self.nch or self.min_size != 0 or not self.ragg or fnv1a64(
                    <const unsigned char*>PyBytes_AS_STRING(last), PyBytes_GET_SIZE(last)) % self.ragg != 0:
                return 0
            closes = True
        r = self.src.carry(self.builder(), bi, blk, next_key, next_len, self.max_size, closes)
        if r:
            self.written += blk.n - 1
            self.blocks_carried += 1
            self.after_record(last, nxt is None)
        return r

    def run(self):
        """Rewrite the source range with the changes; then the changes past its last record are added."""
        cdef RangeBlocks src = self.src
        cdef Py_ssize_t nb = src.nb, k, start, m
        cdef BlockRecords blk, nxt
        start = self.resume() if self.checkpoints and self.nch and nb else 0
        blk = src.read(start) if nb else None
        k = start
        while k < nb:
            nxt = src.read(k + 1) if k + 1 < nb else None
            if blk.n:
                if self.ci < self.nch and self.change_in(blk):
                    self.merge_block(blk, nxt is None)
                    self.blocks_rewritten += 1
                elif src.carries and self.carry(k, blk, nxt):
                    if nxt is not None:
                        m = self.carry_run(k + 1)
                        if m:
                            # the blocks after it up to the next change went over in one run
                            k += 1 + m
                            blk = src.read(k)
                            continue
                else:
                    self.merge_block(blk, nxt is None)  # no change in it: its records as they are
                    self.blocks_rewritten += 1
            blk = nxt
            k += 1
        self.changes_before(NULL, 0)
        return self

    cdef Py_ssize_t carry_run(self, Py_ssize_t k) except -1:
        """Right after block ``k - 1`` was carried: carry blocks ``k``, ``k + 1``, ... in one run
        (``RangeBlocks.carry_run``) while the block after each lies wholly before the next change (so that
        no change falls in them or between them) and is not the range's last. Returns how many went."""
        cdef RangeBlocks src = self.src
        cdef Py_ssize_t end, m, entries = 0
        if self.b is None:
            return 0  # the range closed after block k - 1
        end = src.first_block_reaching(<bytes>self.ckeys[self.ci]) if self.ci < self.nch else src.nb
        if end > src.nb:
            end = src.nb
        end -= 1
        if k >= end:
            return 0
        m = src.carry_run(self.b, k, end, self.max_size, &entries)
        if m:
            self.written += entries
            self.last_written = self.b.last_key
            self.blocks_carried += m
            self.blocks_in_runs += m
        return m

    cdef Py_ssize_t resume(self) except -1:
        """Where to start: the last checkpoint before the first block a change can reach (0: none fits).

        A checkpoint (block ``c``, recorded when the source range was written: file offset, counters,
        SHA-256 state, the stored CRC of block ``c - 1``) fits when no change comes at or before block
        ``c``'s records and the source file is laid out as it was (same offset, same CRC bytes there):
        then blocks before ``c`` come out byte for byte as they are, so they are copied, not re-read,
        and their records are not hashed again. Only a rewrite that starts a new table can resume."""
        cdef RangeBlocks src = self.src
        cdef Py_ssize_t b0, c, i
        cdef Py_ssize_t offset, entries, raw_k, raw_v
        cdef uint64_t prev_crc
        cdef bytes state
        if self.w._current is not None:
            return 0  # the output range started before this one: its bytes are not this range's
        # b0: the first block whose index separator (>= its last key) is >= the first change
        b0 = src.first_block_reaching(<bytes>self.ckeys[0])
        chosen = None
        for cp in self.checkpoints:
            c = cp[0]
            if c < 1 or c > b0 - 1 or c >= src.nb:
                break
            chosen = cp
        if chosen is None:
            return 0
        c, offset, entries, raw_k, raw_v, prev_crc, state = chosen
        if not src.laid_out_as(c, offset, prev_crc):
            return 0  # not the file the checkpoints were recorded for
        i = 0
        while i < len(self.checkpoints) and self.checkpoints[i][0] <= c:
            i += 1
        keys = src.resume_keys(c)
        if keys is None:
            return 0
        src.resume(self.builder(), c, offset, entries, raw_k, raw_v, state, keys[0], keys[1],
                   self.cp_raw[:i * CHECKPOINT_BYTES])
        self.last_written = keys[1]
        self.written += entries
        self.resumed_at = c
        return c

    cdef bint change_in(self, BlockRecords blk) except -1:
        """Whether the next change's key is <= the block's last key."""
        cdef bytes last = blk.last_key()
        cdef bytes ck = <bytes>self.ckeys[self.ci]
        return cmp_keys(<const unsigned char*>PyBytes_AS_STRING(ck), PyBytes_GET_SIZE(ck),
                        <const unsigned char*>PyBytes_AS_STRING(last), PyBytes_GET_SIZE(last)) <= 0
