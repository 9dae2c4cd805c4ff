"""The redo log of an LMDB environment: commits without a flush each, and a file that stays
intact across a power loss.

LMDB keeps its file intact across a power loss only if every commit flushes its pages
before the meta page that names them (``MDB_NOSYNC`` drops that flush, and a power loss
may then leave a meta page naming pages that never reached the disk). One ``fdatasync``
per commit is what a close of a small file through the mount used to wait for. Here the
environment is opened ``MDB_NOSYNC`` and made safe another way:

* A **checkpoint** is a snapshot of the environment known to be on disk: after
  ``mdb_env_sync`` (everything committed so far flushed, taken while holding LMDB's writer
  lock, so nothing commits meanwhile), its meta page (the 152 bytes that name the B-tree
  roots) is saved in ``redo.ckpt`` beside ``data.mdb`` (written to a temporary file,
  fsynced, renamed, the directory fsynced), with the machine's boot ID.
* The checkpoint's pages are never overwritten while it is the checkpoint: a process
  keeps a **read transaction open on it** (the pin), and LMDB never reuses a page a
  reader's snapshot still uses (``mdb_page_alloc`` takes free pages only from
  transactions older than the oldest reader; it honours the slot of a process that died
  until a ``reader_check`` clears it). ``redo.pin`` names the process holding the pin of
  the current checkpoint (with the boot ID; not flushed, it means nothing after a
  restart). A process commits only on a pinned checkpoint. Under the writer lock, before
  its commit: its own pin; or the pin ``redo.pin`` names, held for the commit by a shared
  ``flock`` on ``redo.lock`` (a pin ends only after its process cleared ``redo.pin`` under
  the exclusive lock: a map resize, which ends every transaction of a process, and a close;
  an open that clears a dead process's reader slots clears its ``redo.pin`` too, under the
  writer lock); else, if nothing was committed since the checkpoint, it pins it (no
  flush); else it makes a checkpoint of its own.
* Every write transaction appends a **record** of its changes (the puts, deletes and range
  deletes it made, with LMDB's transaction ID and a CRC-32C) to ``redo.<checkpoint>.log``
  while it holds the writer lock, just before it commits. No flush: the record is in the
  page cache, as the commit is.
* A durable write (``Store.sync``, ``write(durable=True)``) fdatasyncs the log, not
  ``data.mdb``: the checkpoint plus the log's records up to it rebuild the state.
* A checkpoint is taken every ``KVConfig.sync_interval`` seconds while commits come, at
  close, and when the log passes :data:`MAX_LOG_BYTES`; it starts a new log and deletes
  the old one.

**Recovery** runs when an environment is opened and ``redo.ckpt`` was written under
another boot ID (the machine restarted since: only then can the file on disk differ from
what the processes saw; the death of a process, ``kill -9`` included, leaves the page
cache, and with it LMDB's file and the log, whole). Under an exclusive lock on
``redo.lock``: the checkpoint's meta page is written back into both meta slots (the
pages it names are on disk and untouched, see above), and the log's records are
applied in transaction order up to the first torn or missing one -- a prefix of the
commits, never a mix. Then a new checkpoint records the new boot. If nothing was
committed after the checkpoint (a clean shutdown checkpoints at close) the file is left
as it is.

Process death, not a power loss, never needs recovery: a record whose commit never
happened (the process died in between, or the commit failed) is followed by the next
commit's record of the same transaction ID, which replaces it; a failed commit also
appends an abort marker.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
import google_crc32c
import lmdb

from graveler.errors import CorruptedData, NoSpace, NotFound, StoreUnavailable
from graveler.kv import lmdb_file
from graveler.kv.base import TABLES

log = logging.getLogger(__name__)

CKPT = "redo.ckpt"
LOCK = "redo.lock"
PIN = "redo.pin"
MAX_LOG_BYTES = 64 << 20  # a checkpoint at the next write once the log is this long
# ... or once a process made this many commits since its last: the pinned checkpoint keeps LMDB
# from reusing the pages later commits free, so the file grows by their copies until the next one
CKPT_COMMITS = 1000
# A background thread checkpoints at half of either limit (the commit path then rarely reaches one)
CKPT_DUE = 2

META_BYTES = 152  # LMDB 0.9: page header (16) + MDB_meta up to mm_txnid (lmdb_file's layout)
_PIN = struct.Struct("<16sQQ")  # boot id, pid, txnid (zeros: no pin)
_CKPT_MAGIC = b"LFRC"
_CKPT = struct.Struct("<4sIQ16sI")  # magic, version, txnid, boot id, meta length
_REC_MAGIC = b"LFRL"
_REC = struct.Struct("<4sBIQ")  # magic, kind, payload length, txnid
_CRC = struct.Struct("<I")
_COMMIT, _ABORT = 1, 2
_PUT, _DEL, _DELRANGE = 1, 2, 3
_U32 = struct.Struct("<I")
_OP = struct.Struct("<BB")
_LIMIT = struct.Struct("<q")
_NO_END = 0xFFFFFFFF
_TABLE_INDEX = {name: i for i, name in enumerate(TABLES)}


def boot_id() -> bytes:
    """This boot of the machine (16 bytes): the page cache outlives every process, not a boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return bytes.fromhex(f.read().strip().decode().replace("-", ""))
    except (OSError, ValueError):  # no procfs: no restart is ever seen, so no recovery runs (a
        return bytes(16)  # process that died needs none; after a power loss the file may be damaged)


NEARLY_FULL_BYTES = 8 << 20  # free space below which an I/O error writing the database is taken for a full disk


def nearly_full(path) -> bool:
    """Whether the filesystem holding ``path`` has (almost) no space or no inode left: there, a
    write that the disk took (delayed allocation) fails at its flush with EIO, not ENOSPC."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < NEARLY_FULL_BYTES or (st.f_files > 0 and st.f_favail == 0)


@dataclass(frozen=True)
class Checkpoint:
    txnid: int  # LMDB's last committed transaction at the checkpoint; names its log, redo.<txnid>.log
    boot: bytes
    meta: bytes  # the first META_BYTES of the meta page of ``txnid``
    ino: int  # of redo.ckpt as read (a new checkpoint is a new file)


# -- records -------------------------------------------------------------------------------

def encode_ops(ops: list[tuple]) -> bytes:
    out = bytearray()
    for op in ops:
        kind, table = op[0], _TABLE_INDEX[op[1]]
        out += _OP.pack(kind, table)
        key = op[2]
        out += _U32.pack(len(key))
        out += key
        if kind == _PUT:
            out += _U32.pack(len(op[3]))
            out += op[3]
        elif kind == _DELRANGE:
            end, limit = op[3], op[4]
            if end is None:
                out += _U32.pack(_NO_END)
            else:
                out += _U32.pack(len(end))
                out += end
            out += _LIMIT.pack(-1 if limit is None else limit)
    return bytes(out)


def decode_ops(data: bytes) -> list[tuple]:
    ops, pos, n = [], 0, len(data)
    mv = memoryview(data)

    def take(k: int) -> bytes:
        nonlocal pos
        if pos + k > n:
            raise ValueError("record ends inside an operation")
        b = bytes(mv[pos:pos + k])
        pos += k
        return b

    while pos < n:
        kind, table = _OP.unpack(take(2))
        if kind not in (_PUT, _DEL, _DELRANGE) or table >= len(TABLES):
            raise ValueError(f"unknown operation {kind} on table {table}")
        (klen,) = _U32.unpack(take(4))
        key = take(klen)
        name = TABLES[table]
        if kind == _PUT:
            (vlen,) = _U32.unpack(take(4))
            ops.append((_PUT, name, key, take(vlen)))
        elif kind == _DEL:
            ops.append((_DEL, name, key))
        else:
            (elen,) = _U32.unpack(take(4))
            end = None if elen == _NO_END else take(elen)
            (limit,) = _LIMIT.unpack(take(8))
            ops.append((_DELRANGE, name, key, end, None if limit < 0 else limit))
    return ops


def apply_ops(txn, ops: list[tuple]) -> None:
    """Redo ``ops`` in ``txn`` (a :class:`graveler.kv.lmdb_txn.LmdbTxn` that records nothing)."""
    for op in ops:
        if op[0] == _PUT:
            txn.put(op[1], op[2], op[3])
        elif op[0] == _DEL:
            txn.delete(op[1], op[2])
        else:
            txn.delete_range(op[1], op[2], op[3], op[4])


def _record(kind: int, txnid: int, payload: bytes) -> bytes:
    head = _REC.pack(_REC_MAGIC, kind, len(payload), txnid)
    return head + payload + _CRC.pack(google_crc32c.extend(google_crc32c.value(head), payload))


def read_records(path: Path) -> tuple[list[tuple[int, int, bytes]], int]:
    """The whole records at the start of the log at ``path`` ((kind, txnid, payload) each) and
    how many bytes after them were not a whole record (a tail torn by a power loss)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    out, pos = [], 0
    while pos + _REC.size + _CRC.size <= len(data):
        magic, kind, length, txnid = _REC.unpack_from(data, pos)
        end = pos + _REC.size + length
        if magic != _REC_MAGIC or kind not in (_COMMIT, _ABORT) or end + _CRC.size > len(data):
            break
        (crc,) = _CRC.unpack_from(data, end)
        if crc != google_crc32c.value(data[pos:end]):
            break
        out.append((kind, txnid, data[pos + _REC.size:end]))
        pos = end + _CRC.size
    return out, len(data) - pos


def commits_after(records: list[tuple[int, int, bytes]], txnid: int) -> list[tuple[int, list[tuple]]]:
    """The commits to redo after checkpoint ``txnid``: for each transaction ID from
    ``txnid + 1`` on, its last record (a later one of the same ID replaces an attempt that
    never committed; an abort marker cancels it), up to the first ID with none."""
    last: dict[int, tuple[int, bytes]] = {}
    for kind, t, payload in records:
        last[t] = (kind, payload)
    out, t = [], txnid + 1
    while t in last and last[t][0] == _COMMIT:
        out.append((t, decode_ops(last[t][1])))
        t += 1
    return out


# -- the files ------------------------------------------------------------------------------

class RedoLog:
    """The checkpoint and the log of one environment directory (one per process and environment)."""

    def __init__(self, path: Path, label: str):
        self.path = Path(path)
        self.label = label
        self.ckpt_path = self.path / CKPT
        self._ck: Checkpoint | None = None
        self._fd: int | None = None  # the log of self._fd_gen, opened for appending
        self._fd_gen: int | None = None
        self.appended = 0  # the current log's length when opened, plus this process's appends since
        self._lock_fd: int | None = None
        self._pin_fd: int | None = None  # redo.pin, and a lock of redo.lock of its own (see the module docstring)
        self._pin_lock_fd: int | None = None
        self._fd_lock = threading.Lock()  # (sync from any thread; the writer lock orders appends)

    def log_path(self, gen: int) -> Path:
        return self.path / f"redo.{gen:016x}.log"

    # checkpoints
    def read_checkpoint(self) -> Checkpoint | None:
        try:
            fd = os.open(self.ckpt_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreUnavailable(f"{self.label}: cannot open {self.ckpt_path}: {e.strerror or e}") from None
        try:
            ino = os.fstat(fd).st_ino
            raw = os.pread(fd, 4096, 0)
        finally:
            os.close(fd)
        if len(raw) < _CKPT.size + _CRC.size:
            raise CorruptedData(f"{self.label} is damaged: {self.ckpt_path} is {len(raw)} bytes long, "
                                f"shorter than a checkpoint record")
        magic, version, txnid, boot, mlen = _CKPT.unpack_from(raw, 0)
        body_end = _CKPT.size + mlen
        if (magic != _CKPT_MAGIC or version != 1 or mlen != META_BYTES or body_end + _CRC.size != len(raw)
                or _CRC.unpack_from(raw, body_end)[0] != google_crc32c.value(raw[:body_end])):
            raise CorruptedData(f"{self.label} is damaged: {self.ckpt_path} is not a valid checkpoint record "
                                f"(wrong magic, version, length or checksum); data.mdb was not touched")
        return Checkpoint(txnid, boot, raw[_CKPT.size:body_end], ino)

    def current(self) -> Checkpoint | None:
        """The checkpoint now on disk (re-read only when ``redo.ckpt`` is a new file)."""
        try:
            ino = os.stat(self.ckpt_path).st_ino
        except FileNotFoundError:
            self._ck = None
            return None
        if self._ck is None or self._ck.ino != ino:
            self._ck = self.read_checkpoint()
        return self._ck

    def write_checkpoint(self, txnid: int, meta: bytes) -> Checkpoint:
        """Record ``meta`` (the synced meta page of ``txnid``) as the checkpoint, with a new,
        empty log; durable when it returns. The caller holds LMDB's writer lock."""
        body = _CKPT.pack(_CKPT_MAGIC, 1, txnid, boot_id(), len(meta)) + meta
        raw = body + _CRC.pack(google_crc32c.value(body))
        tmp = self.path / f"{CKPT}.tmp"
        lp = self.log_path(txnid)
        fd = os.open(lp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.close(fd)  # (a record of an attempt that never committed may be in an old one: gone)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, raw)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.ckpt_path)
        _fsync_dir(self.path)
        self._ck = Checkpoint(txnid, boot_id(), meta, os.stat(self.ckpt_path).st_ino)
        for p in self.path.glob("redo.*.log"):
            if p != lp:
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
        self.appended = 0
        return self._ck

    # the log
    def append(self, ck: Checkpoint, txnid: int, ops: list[tuple] | None) -> None:
        """Append a commit record (``ops``) or an abort marker (None) for ``txnid`` to the log of
        ``ck``; the caller holds LMDB's writer lock."""
        if self._fd_gen != ck.txnid:
            fd = os.open(self.log_path(ck.txnid), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            with self._fd_lock:
                self._close_fd()
                self._fd, self._fd_gen = fd, ck.txnid
            self.appended = os.fstat(fd).st_size
        rec = _record(_ABORT, txnid, b"") if ops is None else _record(_COMMIT, txnid, encode_ops(ops))
        n = os.write(self._fd, rec)  # (nothing written if it raises)
        if n != len(rec):
            # (a full disk mid-record) the log ends where it ended: a torn record left inside it
            # would end every recovery there, before the records of later commits; other
            # processes append too, but none while this one holds the writer lock
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - n)
            raise OSError(errno.ENOSPC, f"short write to {self.log_path(ck.txnid)}")
        self.appended += n  # (this process's appends: the limit of the log's length is a rough one)

    def sync(self) -> None:
        """Every record this process appended is on disk (a later checkpoint covers a log it replaced)."""
        with self._fd_lock:
            if self._fd is None:
                return
            fd = os.dup(self._fd)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._fd_gen = None

    def close(self) -> None:
        with self._fd_lock:
            self._close_fd()
        self.unlock()
        for fd in (self._pin_fd, self._pin_lock_fd):
            if fd is not None:
                os.close(fd)
        self._pin_fd = self._pin_lock_fd = None

    # the pin's owner, for other processes
    def _pin_file(self) -> int:
        if self._pin_fd is None:
            self._pin_fd = os.open(self.path / PIN, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._pin_fd

    def read_pin(self) -> tuple[int, int] | None:
        """(pid, txnid) of the pin ``redo.pin`` names, if one of this boot."""
        raw = os.pread(self._pin_file(), _PIN.size, 0)
        if len(raw) < _PIN.size:
            return None
        boot, pid, txnid = _PIN.unpack(raw)
        return (pid, txnid) if pid and boot == boot_id() else None

    def write_pin(self, pid: int, txnid: int) -> None:
        """Name the pin (under the writer lock; pid 0: none)."""
        os.pwrite(self._pin_file(), _PIN.pack(boot_id(), pid, txnid), 0)

    def pin_lock(self, exclusive: bool | None) -> None:
        """The lock that keeps a named pin from ending: shared while a commit relies on another
        process's pin, exclusive while a pin's owner ends it; None: release."""
        if self._pin_lock_fd is None:
            self._pin_lock_fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        op = fcntl.LOCK_UN if exclusive is None else fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        fcntl.flock(self._pin_lock_fd, op)

    # opening and recovery
    def lock(self, exclusive: bool) -> None:
        if self._lock_fd is None:
            self._lock_fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def prepare(self) -> list[tuple[int, list[tuple]]] | None:
        """Before LMDB maps the file: if the checkpoint is from another boot and anything was
        committed after it, put its meta page back and return the commits to redo (else None).
        Holds ``redo.lock`` until :meth:`unlock` (exclusively while a recovery may be due)."""
        if not (self.path / "data.mdb").exists():
            return None
        self.lock(exclusive=False)
        ck = self.current()
        if ck is None or ck.boot == boot_id():
            return None
        self.unlock()
        self.lock(exclusive=True)
        ck = self.current()  # another process may have recovered meanwhile
        if ck is None or ck.boot == boot_id():
            return None
        records, torn = read_records(self.log_path(ck.txnid))
        redo = commits_after(records, ck.txnid)
        data = self.path / "data.mdb"
        fd = os.open(data, os.O_RDWR | os.O_CLOEXEC)
        try:
            metas = lmdb_file.read_metas(fd)
            newest = max((m.txnid for m in metas), default=-1) if not isinstance(metas, str) else -1
            if newest == ck.txnid and not redo:
                log.info("%s: opened after a restart; nothing was committed after its checkpoint", self.label)
                return []
            psize = struct.unpack_from("<I", ck.meta, 40)[0]
            for slot in (0, 1):  # both slots: LMDB takes the newer, and the other may name lost pages
                page = bytearray(ck.meta)
                struct.pack_into("<Q", page, 0, slot)
                os.pwrite(fd, bytes(page), slot * psize)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        log.warning("%s: opened after a restart: restored its checkpoint (transaction %d) and redoing %d "
                    "logged commit(s) after it%s", self.label, ck.txnid, len(redo),
                    f"; {torn} byte(s) of a torn log tail ignored" if torn else "")
        return redo


class Keeper:
    """One process's side of the protocol for one open environment: the pin, the checkpoints it
    makes, the records it appends. Every method but :meth:`drop_pin` runs under LMDB's writer lock."""

    def __init__(self, redo: RedoLog, env, data: Path):
        self.redo = redo
        self.env = env  # the lmdb.Environment
        self.data = data
        self.pin = None  # a read transaction on the checkpoint this process made
        self.pin_txnid: int | None = None
        self.since = 0  # commits logged since this process's last checkpoint
        self._sharing = False  # a commit relies on another process's pin (its lock held)

    def log(self, txn, ops: list[tuple]) -> tuple[Checkpoint, int]:
        """Append the record of write transaction ``txn`` before it commits, the checkpoint it
        builds on made safe first (:meth:`protect`)."""
        txnid = txn.id()
        try:
            ck = self.protect(txnid - 1)
            self.redo.append(ck, txnid, ops)
        except BaseException as e:
            self.done()
            if isinstance(e, OSError):
                if e.errno == errno.ENOENT and not self.redo.path.exists():  # (a `repo delete` meanwhile)
                    raise NotFound(f"{self.redo.label} is gone (the repository was deleted)") from None
                full = e.errno in (errno.ENOSPC, errno.EDQUOT) or (e.errno == errno.EIO and nearly_full(self.redo.path))
                cls = NoSpace if full else StoreUnavailable
                raise cls(f"{self.redo.label}: cannot write its redo log: {e.strerror or e}") from None
            raise
        self.since += 1
        return ck, txnid

    def due(self) -> bool:
        """A checkpoint is due (a background thread makes it, before a commit would have to)."""
        return self.since >= CKPT_COMMITS // CKPT_DUE or self.redo.appended >= MAX_LOG_BYTES // CKPT_DUE

    def log_abort(self, ck: Checkpoint, txnid: int) -> None:
        try:
            self.redo.append(ck, txnid, None)
        except OSError as e:  # the next commit's record of this ID replaces it anyway
            log.debug("%s: cannot note an aborted commit in the redo log: %s", self.redo.label, e)

    def done(self) -> None:
        """The commit that relied on another process's pin is over (committed or not)."""
        if self._sharing:
            self._sharing = False
            self.redo.pin_lock(None)

    def protect(self, last: int) -> Checkpoint:
        """The checkpoint, pinned -- by this process, or by the one ``redo.pin`` names (then its
        lock is held until :meth:`done`) -- the log not too long; else a new checkpoint of
        ``last``, the last commit."""
        ck = self.redo.current()
        if ck is not None and self.redo.appended < MAX_LOG_BYTES and self.since < CKPT_COMMITS:
            if ck.txnid == self.pin_txnid:
                return ck
            named = self.redo.read_pin()
            if named is not None and named[1] == ck.txnid:
                self.redo.pin_lock(False)
                self._sharing = True
                if self.redo.read_pin() == named:  # (not ended while the lock was awaited)
                    return ck
                self.done()
            if ck.txnid == last:  # nothing committed since: this process pins it
                self._set_pin(self.env.begin(write=False))
                return ck
        return self.checkpoint(last)

    def checkpoint(self, last: int) -> Checkpoint:
        """Flush everything committed (``last`` is the last commit) and record it as the
        checkpoint, pinned by this process."""
        self.env.sync(True)
        meta = synced_meta(self.data, last)
        pin = self.env.begin(write=False)  # the snapshot of ``last``: nothing commits meanwhile
        try:
            if pin.id() != last:
                raise StoreUnavailable(f"{self.redo.label}: its checkpoint would pin transaction {pin.id()}, "
                                       f"not {last}: nothing was recorded")
            ck = self.redo.write_checkpoint(last, meta)
        except BaseException:
            pin.abort()
            raise
        self._set_pin(pin)
        self.since = 0
        return ck

    def _set_pin(self, pin) -> None:
        """Pin the checkpoint (under the writer lock: ``redo.pin`` names the new pin before the
        old one ends, and no commit relies on the old one meanwhile)."""
        old = self.pin
        self.pin, self.pin_txnid = pin, pin.id()
        self.redo.write_pin(os.getpid(), self.pin_txnid)
        if old is not None:
            try:
                old.abort()
            except lmdb.Error:  # (ended already)
                pass

    def before_resize(self) -> None:
        """A map resize is about to end every transaction of this process, the pin too: unname it
        first, once no commit of another process relies on it."""
        if self.pin is not None:
            self.redo.pin_lock(True)
            try:
                if self.redo.read_pin() == (os.getpid(), self.pin_txnid):
                    self.redo.write_pin(0, 0)
            except BaseException:
                self.redo.pin_lock(None)
                raise

    def after_resize(self) -> None:
        if self.pin is not None:
            self.pin = self.pin_txnid = None  # (py-lmdb ended it; the next write pins again)
            self.redo.pin_lock(None)

    def drop_pin(self) -> None:
        """End the pin (at close)."""
        if self.pin is None:
            return
        self.before_resize()
        try:
            self.pin.abort()
        except lmdb.Error:  # (ended already)
            pass
        self.after_resize()

    def clear_dead_pin(self) -> None:
        """After a ``reader_check`` (under the writer lock): unname the pin of a process that died
        (its reader slot, which kept the checkpoint's pages, may be gone now)."""
        named = self.redo.read_pin()
        if named is None:
            return
        for line in self.env.readers().splitlines()[1:]:  # "pid thread txnid" per reader slot
            parts = line.split()
            if len(parts) == 3 and parts[0] == str(named[0]) and parts[2] == str(named[1]):
                return
        self.redo.write_pin(0, 0)  # (its process died, or its pid now names another process)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def synced_meta(data: Path, txnid: int) -> bytes:
    """The meta page of ``txnid`` from ``data`` (synced by the caller, who holds the writer lock)."""
    fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
    try:
        metas = lmdb_file.read_metas(fd)
        for slot, m in enumerate(metas if not isinstance(metas, str) else ()):
            if m.txnid == txnid:
                return os.pread(fd, META_BYTES, slot * m.psize)
    finally:
        os.close(fd)
    raise StoreUnavailable(f"no meta page of transaction {txnid} in {data} right after a sync")
