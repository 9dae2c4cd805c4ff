"""The write spool of branch trees: files being written live on local disk until close/fsync.

One :class:`SpoolFile` per inode being written, shared by every handle of it:

* Opening an existing file for write copies nothing. Its committed (or staged)
  content -- the *base* entry -- is copied into the spool file only when it is
  first written or truncated to a non-zero size (lazy copy-in); ``O_TRUNC`` or a
  truncate to zero never reads the base at all.
* Reads of an inode whose content is in the spool come from the spool file, from
  any handle, so a file reads back what was written to it before it is saved.
* :meth:`SpoolFile.flush` (the mount calls it on close -- FUSE ``flush`` -- and on
  ``fsync``) uploads the spool file to a new object in the store and stages its
  entry in the KV. A local store takes the spool file itself (hard-linked into the
  object's place, its MD5 computed while it was written): no copy. The spool then
  drops its names of that file (nothing is left on disk for a recovery) but keeps
  reading it through its descriptor; a later write to it first copies it to a new
  spool file, locally (copy-on-write, :meth:`SpoolFile._unshare`): a stored object
  is never modified, and nothing is copied unless the file changes. What it
  promises is ext4's contract:

  - ``flush(durable=False)`` (close): the object is complete (S3 answered the PUT; a local store
    linked it in, not fsynced) and the entry staged by a committed, unsynced KV transaction: every
    reader sees it, ``kill -9`` of the daemon loses nothing, the next commit takes it (syncing the
    store and the KV first). A power loss before an fsync or a commit may lose it.
  - ``flush(durable=True)`` (fsync): the object (:meth:`graveler.Repository.sync_entry`) and the KV
    (:meth:`graveler.Repository.sync`) on disk too before it returns, an earlier close's save too.
* A file unlinked while open is *detached*: later writes still work, its flush stages nothing.

The spool's layout on disk, its instance directories and their recovery: :mod:`lakefuse.mount.recovery`.

This module is plain blocking code over the graveler ``Repository`` API: the FUSE core calls it from worker threads.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from graveler.errors import Conflict, GravelerError, InvalidArgument, PathTooLong
from graveler.model import Entry
from graveler.objects import COMPOSITE_MIN, PosixAttrs, file_etag, user_metadata
from graveler.objstore import sparse
from graveler.repository import ANY_BIRTH
from graveler.staging import MAX_PATH_BYTES
from lakefuse.mount import falloc, sidecar
from lakefuse.mount.md5stream import Md5Stream
from lakefuse.mount.nowait import pread_nowait
from lakefuse.mount.recovery import RECOVERED_DIR, RecoveryReport, make_instance_dir, recover_spool  # noqa: F401
from lakefuse.mount.retry import SaveRetries
from lakefuse.mount.spoolpool import FilePool, new_sid

log = logging.getLogger(__name__)

SPOOL_DIR = "spool"
_UNSET = object()  # SpoolFile._expect when the last flush did not fail
_COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class SpoolConfig:
    """Where the spool lives: ``<cache_dir>/spool/<repository>``."""

    cache_dir: Path
    repository: str

    @property
    def root(self) -> Path:
        return Path(self.cache_dir) / SPOOL_DIR / self.repository


class SpoolFile:
    """The spooled content of one inode being written, shared by all its handles.

    ``base`` is the entry the file had when it was opened (None for a new file):
    its content is the file's content until the first write. Every method takes
    the file's lock; :meth:`flush` holds it while uploading, so writes to the
    same file wait for a flush in progress (never half in an upload).
    """

    born = ANY_BIRTH  # its branch's birth (set by the opener): no save goes to a later branch of the name

    def __init__(self, spool: "Spool", ino: int, branch: str, key: bytes, base: Entry | None,
                 attrs: PosixAttrs, new: bool):
        self.spool = spool
        self.ino = ino
        self.branch = branch
        self.key: bytes | None = key  # None once unlinked (detached)
        self.base = base
        self.attrs = attrs
        self.user_metadata: dict[str, str] = user_metadata(base.metadata) if base is not None else {}
        self.content_type = base.content_type if base is not None else ""
        self.sid = new_sid()
        self.lock = threading.RLock()
        self.handles = 0
        self.writers = 0  # the handles open for writing (a reader's close saves nothing while one is)
        self._fd: int | None = None
        self.on_disk = False  # a spool file or its sidecar exists (close has files to remove)
        self.loaded = False  # the spool file holds the whole content
        self.size = 0 if base is None else base.size
        self.mtime_ns = time.time_ns() if base is None else (base.last_modified_ns or time.time_ns())
        if base is not None and attrs.mtime_ns is not None:
            self.mtime_ns = attrs.mtime_ns
        self.ctime_ns = self.mtime_ns
        self._gen = 1 if new else 0  # bumped by every change of content or attributes
        self._saved_gen = 0
        self.saved: Entry | None = None  # the entry staged by the last successful flush
        self.stamped: list = [0, None]  # [stamp, branch record] read by that flush's transaction
        # the identity the branch shows at ``key`` as this file last knew it (opened, saved or
        # renamed with; None: no entry): a retried or recovered save stages only over that
        self.known: bytes | None = None if base is None else base.identity()
        # after a failed flush: the identity the next one expects at the key (None: no entry),
        # and (gen, (branch, key), entry) of an object it uploaded but could not stage
        self._expect, self._pending = _UNSET, None
        self._adopted = False  # the spool file is a stored object now (a local store linked it): never written
        self.failure: BaseException | None = None  # why the last save failed (None: it did not)
        self.pinned = False  # its inode held by the spool while a failed save waits for a retry
        # a new file's create not staged yet (None: staged): what it changes besides its entry (its
        # directory's marker), staged with its first save, or before by :meth:`stage_create`
        self.unstaged = None  # (as a function of its key then: it may move meanwhile)
        self.staged_items: list = []  # what the last successful flush staged besides the file's own entry
        # MD5 of bytes [0, _md5_off) while written in order from the start (else None): the etag, no second pass
        self._md5, self._md5_off = None, 0
        if new:
            self._create()
            self.loaded = True

    # -- state
    @property
    def dirty(self) -> bool:
        """True while the file has content or attributes not yet staged (or its create)."""
        return self._gen != self._saved_gen or self.unstaged is not None

    @property
    def detached(self) -> bool:
        return self.key is None

    @property
    def data_path(self) -> Path:
        return self.spool.dir / f"{self.sid}.data"

    @property
    def copy_path(self) -> Path:
        return self.spool.dir / f"{self.sid}.copyin"

    def _create(self, path: Path | None = None) -> None:
        made = self.spool.pool.take() if path is None and not self.on_disk else None  # made ahead (spoolpool)
        if made is not None:
            self.sid, self._fd = made
        else:
            for remade in (False, True):
                try:
                    self._fd = os.open(path or self.data_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                    break
                except FileNotFoundError:
                    if remade or not self.spool.remake_dir():
                        raise
        self.on_disk = True
        self._write_sidecar()  # before the first byte: a crash leaves no content without it
        self._md5, self._md5_off = Md5Stream(), 0

    def _write_sidecar(self) -> None:
        """The record recovery reads of this spool file: a line of the spool's journal
        (:mod:`lakefuse.mount.sidecar`)."""
        saved = self.saved
        self.spool.journal.put(self.sid, {
            "repository": self.spool.config.repository,
            "branch": self.branch,
            "key": None if self.key is None else self.key.decode("utf-8", "surrogateescape"),
            "created_ns": time.time_ns(),
            # the content of the last acknowledged save: a leftover with exactly this
            # content was saved, whatever the branch shows at its key by recovery time
            "saved_etag": saved.etag if saved is not None else None,
            "saved_size": saved.size if saved is not None else None,
            # what the branch showed at the key when this file last knew it (hex identity,
            # None: no entry): recovery stages the leftover only if it still shows that
            "expect": None if self.known is None else self.known.hex(),
            "expect_known": True,
            # what its next save stages besides the bytes: a recovery stages them (not the replaced entry's)
            "attrs": self.attrs.to_metadata(), "user_metadata": self.user_metadata, "content_type": self.content_type,
        })

    def _load(self) -> None:
        """Copy the base content into the spool file (the lazy copy-in)."""
        if self.loaded:
            return
        copying = self.base is not None and self.base.size > 0
        if self._fd is None:
            # The copy is made under another name and renamed once whole: a daemon killed
            # during it leaves no partial copy of the saved file for recovery to take as work.
            self._create(self.copy_path if copying else None)
        if copying:
            off = 0
            try:
                while off < self.base.size:
                    chunk = self.spool.repo.read_entry(self.base, off, min(_COPY_CHUNK, self.base.size - off))
                    if not chunk:
                        raise GravelerError(f"object of {self.key!r} ended at {off} of {self.base.size} bytes")
                    sparse.pwrite_sparse(self._fd, chunk, off)  # (zeros stay holes: a sparse file stays sparse)
                    self._hash(off, chunk)
                    off += len(chunk)
                os.ftruncate(self._fd, off)
            except BaseException:
                # No partial copy of the saved file stays behind: after a crash, recovery
                # would present it as unsaved work. The next write starts a new copy.
                os.close(self._fd)
                self._fd = None
                self._md5 = None
                try:
                    os.unlink(self.copy_path)
                except FileNotFoundError:
                    pass
                self._unlink_names()
                self.on_disk = False  # the next write starts afresh (its sidecar too)
                raise
            if self.copy_path.exists():
                os.rename(self.copy_path, self.data_path)
            self.spool.stats["copy_in_bytes"] += off
        self.loaded = True

    # -- content
    def read(self, offset: int, length: int) -> bytes:
        with self.lock:
            if offset >= self.size or length <= 0:
                return b""
            length = min(length, self.size - offset)
            if self.loaded and self._fd is not None:
                return os.pread(self._fd, length, offset)  # (closed after its save: what it saved, below)
            e = (self.saved or self.base) if self.loaded else self.base
            return self.spool.repo.read_entry(e, offset, length) if e is not None else b""

    def read_nowait(self, offset: int, length: int) -> bytearray | bytes | None:
        """:meth:`read` when it cannot block (on the trio thread): the bytes from the page
        cache, else None -- the lock is held (a flush may be uploading), the content is not
        copied in yet, or not all of it is cached (:func:`lakefuse.mount.nowait.pread_nowait`)."""
        if not self.lock.acquire(blocking=False):
            return None
        try:
            if offset >= self.size or length <= 0:
                return b""
            if not self.loaded or self._fd is None:
                return None
            return pread_nowait(self._fd, offset, min(length, self.size - offset))
        finally:
            self.lock.release()

    def write(self, offset: int, data: bytes) -> int:
        with self.lock:
            self._load()
            self._unshare()
            n = os.pwrite(self._fd, data, offset)
            self._hash(offset, data[:n] if n < len(data) else data)
            self.size = max(self.size, offset + n)
            self._changed()
            return n

    def truncate(self, size: int) -> None:
        if size < 0:
            raise InvalidArgument("negative size")
        with self.lock:
            if size == 0 and not self.loaded:
                if self._fd is None:
                    self._create()
                self.loaded = True
            else:
                self._load()
            self._unshare(keep=size > 0)
            os.ftruncate(self._fd, size)
            if size == 0:
                self._md5, self._md5_off = Md5Stream(), 0
            elif size != self._md5_off:
                self._md5 = None
            self.size = size
            self._changed()

    def fallocate(self, mode: int, offset: int, length: int) -> None:
        """fallocate(2), a mode :func:`lakefuse.mount.falloc.check` accepted: the range reads as
        zeros (PUNCH_HOLE, ZERO_RANGE); the size grows to its end unless KEEP_SIZE."""
        with self.lock:
            end = offset + length
            if mode & (falloc.PUNCH_HOLE | falloc.ZERO_RANGE) and offset < self.size:
                self._load()
                self._unshare()
                falloc.zero(self._fd, offset, min(end, self.size) - offset)
                self._md5 = None  # (the close hashes the file)
                self._changed()
            if not mode & falloc.KEEP_SIZE and end > self.size:
                self.truncate(end)

    def _changed(self) -> None:
        """The content changed: new times, one more generation to save."""
        self.mtime_ns = self.ctime_ns = time.time_ns()
        if (a := self.attrs).mtime_ns is not None:  # the write time (an atime set stays: ext4 moves no atime on a write)
            self.attrs = PosixAttrs(a.mode, a.uid, a.gid, a.symlink, None, a.atime_ns)
        self._gen += 1

    def _hash(self, offset: int, data) -> None:
        if self._md5 is not None:
            if offset == self._md5_off:
                self._md5.update(data)
                self._md5_off += len(data)
            else:
                self._md5 = None

    def bulky(self, size: int, big: int) -> bool:
        """Whether a write of ``size`` bytes (0: the next save) moves ``big`` or more (a hint, unlocked)."""
        if size:  # (a copy-in first: of the base, or of the object the file became)
            return size >= big or self.size >= big and (not self.loaded or self._adopted)
        return self.size >= big and self.loaded and not self._adopted and (self._md5 is None or self._md5_off != self.size)

    def _etag(self) -> str | None:
        """The MD5 of the whole spool file if it was computed while writing."""
        if self._md5 is not None and self._md5_off == self.size:
            return self._md5.hexdigest()
        return None

    def set_attrs(self, attrs: PosixAttrs) -> None:
        """New POSIX attributes, staged with the next flush (and noted for a recovery at once)."""
        with self.lock:
            if attrs != self.attrs:
                self.attrs = attrs
                if attrs.mtime_ns is not None:
                    self.mtime_ns = attrs.mtime_ns
                self._changed_attrs()

    def set_user_metadata(self, md: dict[str, str]) -> None:
        """New user metadata (extended attributes), staged with the next flush (noted at once)."""
        with self.lock:
            if md != self.user_metadata:
                self.user_metadata = md
                self._changed_attrs()

    def _changed_attrs(self) -> None:
        self.ctime_ns, self._gen = time.time_ns(), self._gen + 1
        if self.on_disk and self._fd is not None:  # (a chmod that returned survives a kill -9 with the bytes)
            self._write_sidecar()

    def move(self, branch: str, key: bytes, identity: bytes | None | object = _UNSET) -> None:
        """The file was renamed: its next flush stages it at ``key``, where the branch now
        shows the entry of ``identity`` (unchanged when not given: a directory rename moves
        entries as they are)."""
        with self.lock:
            self.branch, self.key = branch, key
            if identity is not _UNSET:  # this file renamed (not a directory above it): its ctime moves
                self.ctime_ns = time.time_ns()
                self.known = identity
                if self._expect is not _UNSET:  # a failed save's retry: this rename is no other writer's
                    self._expect = identity
            if self.on_disk:
                self._write_sidecar()

    def removed_behind(self) -> bool:
        """Detach this file (True) if a change behind the mount took from the branch what this
        file last knew there (opened with, or saved): a delete, reset or revert removed the name,
        or a reset discarded its saved change (the committed version shows again). Its handles go
        on as an unlinked file's; its later writes and close stage nothing. A new file not saved
        yet stays, and one another writer saved over (the last close wins). Blocking (KV reads),
        under the file's lock: no save or rename of this file meanwhile."""
        with self.lock:
            if self.key is None or self.known is None:
                return False
            repo = self.spool.repo
            now = repo.value_or_none(self.branch, self.key)
            if now is not None:
                if self.saved is None or now.identity == self.known:
                    return False
                head = repo.value_or_none(repo.get_branch(self.branch).commit_id, self.key)
                if head is None or head.identity != now.identity:
                    return False  # (another writer's save: not a discard)
            log.info("%s on %s was %s behind the mount while open here for writing: detached (what is written to it "
                     "now is not saved, as an unlinked file's)", _name(self), self.branch, "removed" if now is None else "reset")
            self.detach()
            return True

    def detach(self) -> None:
        """The file was unlinked while open: keep serving its handles, stage nothing."""
        with self.lock:
            self.key, self.failure = None, None
            self.ctime_ns = time.time_ns()  # (its link count went: a change of the inode, as on ext4)
            self._saved_gen = self._gen
            self._staged_create()
            if self.on_disk:
                self._write_sidecar()

    # -- saving
    def flush(self, durable: bool = False) -> Entry | None:
        """Upload and stage the file if it changed since the last flush; return the
        staged entry (None if nothing was to do). Raises a GravelerError (the file
        stays dirty and spooled) if the store or the KV failed. ``durable`` (fsync): the
        object and the staging are on disk when it returns, also when an earlier flush
        saved the content (see the module docstring).

        A first save stages unconditionally (the last close wins, as on S3). A save that
        follows a failed one (a retried close, the last release, the unmount) stages only if
        the branch still shows what this file last knew at its key -- the entry it was opened
        or last saved with -- (:meth:`graveler.Repository.stage_if`): if another writer saved
        a newer version meanwhile, this content is not put over it (Conflict; the copy stays
        in the spool, and the next mount's recovery keeps it for the user)."""
        with self.lock:
            repo = self.spool.repo
            if not self.dirty or self.key is None:
                self.failure = None
                if durable and self.key is not None:
                    # what an earlier close saved (or what it was opened with), and the
                    # staging of its create(2): neither is synced yet, perhaps
                    self.spool.sync_saved(self.saved or self.base)
                return None
            gen = self._gen
            expect = self._expect
            if self._pending is not None and self._pending[0] == gen and self._pending[1] == (self.branch, self.key):
                entry = self._pending[2]  # uploaded by the failed try: only its staging is left to do
            else:
                try:
                    entry = self._entry_to_stage()
                except Exception as e:  # (any failure: a save not done gates commits, and is retried)
                    self.failure = e
                    if self._expect is _UNSET:  # its retry must not put these bytes over a newer save
                        self._expect = self.known
                    raise
            syncing = None
            try:
                self.stamped = [0, None]  # unknown (a compare-and-set): the tree reads it
                extra = self.unstaged(self.key) if self.unstaged is not None else []
                if expect is _UNSET:
                    if durable and entry.size:
                        # the object flushed beside the KV's commit and then its sync: until both
                        # are done the file is as after a close (the entry may be durable first)
                        syncing = self.spool.in_background(repo.sync_entry, entry)
                    # a new file's create is staged with its first save: one transaction, not two
                    _, *self.stamped = repo.stage_stamped(self.branch, [(self.key, entry)] + extra, False, self.born)
                    self.staged_items = extra
                    if durable:
                        repo.sync()
                    if syncing is not None:
                        syncing, wait = None, syncing
                        wait.result()
                else:
                    if durable and entry.size:
                        repo.sync_entry(entry)  # the object first: a durable entry never names a lost object
                    if not repo.stage_if(self.branch, self.key, entry, expect, self.born):
                        raise Conflict(f"{self.key.decode('utf-8', 'replace')} on {self.branch}: another writer saved "
                                       f"a newer version after this file's save failed; this content was not saved "
                                       f"and stays in {self.data_path if self._fd is not None else 'the store'}")
            except Exception as e:
                if syncing is not None:
                    syncing.exception()  # (it ends before the save is retried)
                self._pending = (gen, (self.branch, self.key), entry)
                if self._expect is _UNSET:
                    self._expect = self.known
                self.failure = e
                raise
            if expect is not _UNSET:
                self.staged_items = []
            self._staged_create()
            if durable:
                self.spool.stats["syncs"] += 1
            self._pending, self._expect, self.failure = None, _UNSET, None
            self._saved_gen = gen
            self.saved = entry
            self.known = entry.identity()
            if self._fd is not None and self.on_disk:
                # note it is saved: its copy stays until the last close -- handed over to the store, until the
                # pool's thread removes its name: a crash before leaves a copy recovery must find saved
                try:
                    self._write_sidecar()
                except OSError as e:  # the save stands; recovery then compares with the branch
                    log.warning("spool: cannot note the save of %s in %s: %s", self.key, self.spool.journal.path, e)
            if self.loaded and self._fd is not None and os.fstat(self._fd).st_nlink > 1:
                self._handed_over(entry)
            return entry

    def stage_create(self) -> tuple[int, bytes | None, Entry, list] | None:
        """Stage a new file's create before its first save (empty, its attributes, its directory's
        marker): (stamp, branch record, entry, other items) of that staging, or None."""
        with self.lock:
            if self.unstaged is None or self.key is None:
                return None
            extra = self.unstaged(self.key)
            e = self.base
            md = dict(self.user_metadata)
            md.update(self.attrs.to_metadata())
            entry = Entry(e.address, e.size, e.etag, self.ctime_ns, md, e.address_type, e.content_type)
            _, stamp, raw = self.spool.repo.stage_stamped(self.branch, [(self.key, entry)] + extra, False, self.born)
            self._staged_create()
            self.known = entry.identity()  # what the branch shows at its key now: a retry or recovery stages over it
            if self._expect is not _UNSET:  # a failed save's retry: this staging is no other writer's
                self._expect = self.known
            if self.on_disk:
                self._write_sidecar()
            return stamp, raw, entry, extra

    def _staged_create(self) -> None:
        if self.unstaged is not None:
            self.unstaged = None
            self.spool.created_staged(self.ino, self)

    def _entry_to_stage(self) -> Entry:
        """The entry this flush stages: the base object under new metadata when only attributes
        changed, else the spool file uploaded to a new object."""
        md = dict(self.user_metadata)
        md.update(self.attrs.to_metadata())
        repo = self.spool.repo
        if not self.loaded or self._adopted:
            # Only attributes changed (the content is the base's, or the object the spool
            # file became): restage that object under new metadata. The entry's
            # last_modified is the change time (ctime); the mtime stays as it was.
            if self.attrs.mtime_ns is None:
                md.update(PosixAttrs(mtime_ns=self.mtime_ns).to_metadata())
            b = self.base
            return Entry(b.address, b.size, b.etag, self.ctime_ns, md, b.address_type, b.content_type)
        # last_modified (the ctime; the mtime too unless set) is the file's last change, not this
        # save's time: a close moves neither, as on ext4 (not fsynced here: an fsync syncs it later)
        etag = self._etag()
        if etag is None and self.size >= COMPOSITE_MIN:  # not hashed while written: its parts, holes unread
            etag = file_etag(self._fd, self.size)
        entry = repo.put_object(f"{self.spool.dir_name}/{self.sid}.data", content_type=self.content_type, metadata=md,
                                adopt=True, etag=etag, durable=False, fd=self._fd,
                                last_modified_ns=self.ctime_ns)
        self.spool.stats["uploaded_bytes"] += entry.size
        self.spool.stats["uploads"] += 1
        return entry

    def _handed_over(self, entry: Entry) -> None:
        """The spool file became the stored object (a local store linked it into place)
        and the entry is staged. The spool keeps its name and descriptor of it: reads come
        from it and nothing is copied unless the file changes again -- then
        :meth:`_unshare` first copies it to a new spool file (a stored object is never
        modified). Its names go now (nothing is left on disk for a recovery to look at, and
        the last release does no I/O); the descriptor keeps the file readable. The saved
        entry becomes the base (what an attribute change restages)."""
        self._unlink_names()
        self.on_disk = False
        self.base = entry
        self._adopted = True
        self.spool.stats["adopted"] += 1

    def _unshare(self, keep: bool = True) -> None:
        """Before a change of a spool file that became a stored object: copy it (``keep``;
        in the kernel, ``copy_file_range``, nothing through the store) to a new file that
        takes the spool file's name, and write that one. The MD5 computed while it was
        written stays valid (same bytes), so an append keeps hashing where it was. A daemon
        killed during the copy leaves only ``<sid>.copyin``, never taken by recovery."""
        if not self._adopted:
            return
        fd = os.open(self.copy_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            if not self.on_disk:
                self._write_sidecar()  # it says which save this copy was made from
                self.on_disk = True
            if keep:
                sparse.copy_sparse(self._fd, fd, self.size)  # (its holes kept)
            os.rename(self.copy_path, self.data_path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(self.copy_path)
            except FileNotFoundError:
                pass
            raise
        os.close(self._fd)
        self._fd = fd
        self._adopted = False
        self.spool.stats["cow_bytes"] += self.size if keep else 0

    def close(self) -> None:
        """Forget the spool copy (after a successful flush, or a discard)."""
        with self.lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self.on_disk:
                self.on_disk = False
                self._unlink_names()

    def _unlink_names(self) -> None:
        """Remove the spool file's name, then its journal record, in the pool's thread (:meth:`FilePool.discard`);
        the file takes a new name stem: a name it makes later (copy-on-write, copy-in) is never the one going."""
        self.spool.pool.discard(f"{self.spool.dir_name}/{self.sid}.data", partial(self.spool.journal.forget, self.sid))
        self.sid = new_sid()


def _name(sf: SpoolFile) -> str:
    return "?" if sf.key is None else sf.key.decode("utf-8", "replace")


_REMAKE_LOCK = threading.Lock()


class Spool(SaveRetries):
    """Every file being written through one mount of one repository (its failed saves:
    :class:`lakefuse.mount.retry.SaveRetries`)."""

    def __init__(self, repo, config: SpoolConfig):
        self.repo = repo
        self.config = config
        self._lock = threading.Lock()
        self._files: dict[int, SpoolFile] = {}
        self.unstaged: dict[int, SpoolFile] = {}  # files created through the mount, not staged yet
        self.stats = dict.fromkeys(("copy_in_bytes", "uploaded_bytes", "uploads", "adopted", "syncs", "save_retries",
                                    "cow_bytes"), 0)
        # pin(ino, True/False): hold / let go the inode of a file whose failed save waits for a
        # retry, so its content stays reachable through the mount (set by the mount core)
        self.pin = None
        self._retrier: threading.Thread | None = None
        self._stop = threading.Event()
        self.dir = config.root / f"{os.getpid()}-{secrets.token_hex(4)}"
        self.dir_name = str(self.dir)
        self._lock_fd = make_instance_dir(self.dir, self._owner())
        self.journal = sidecar.Journal(self.dir)  # the spool files' records (for recovery)
        self._background = None  # a thread pool: an fsync's object flush beside its KV commit
        self.pool = FilePool(self.dir)  # empty spool files made ahead (taken by new files); make_room()

    def remake_dir(self) -> bool:
        """Make this mount's spool directory again, with its lock and journal, if it was removed
        under the mount (open files' saves copy from their descriptors); False if it is there."""
        with _REMAKE_LOCK:  # (its own lock: the caller holds a spool file's)
            if self.dir.is_dir():
                return False
            log.warning("spool: %s was removed while mounted; made again", self.dir)
            old, self._lock_fd = self._lock_fd, make_instance_dir(self.dir, self._owner())
            os.close(old)
            self.journal = sidecar.Journal(self.dir)
        return True

    def _owner(self) -> dict:
        """Which repository this spool serves: the name alone is not enough (two homes may
        each have a repository of that name and share a cache directory: recovery's ``owned``)."""
        created = getattr(getattr(self.repo, "record", None), "creation_date", None)
        return {"repository": self.config.repository, "storage_namespace": getattr(self.repo, "storage_namespace", None),
                "creation_date": created.isoformat() if created is not None else None}

    # -- files
    def get(self, ino: int) -> SpoolFile | None:
        with self._lock:
            return self._files.get(ino)

    def peek(self, ino: int) -> SpoolFile | None:
        """:meth:`get` without the lock, for the trio thread: :meth:`open` holds the lock while
        it makes a spool file on disk. (One dict lookup: atomic in CPython.)"""
        return self._files.get(ino)

    def open(self, ino: int, branch: str, key: bytes, base: Entry | None, attrs: PosixAttrs,
             new: bool = False) -> SpoolFile:
        """The spool file of ``ino`` (made on first open), with one more handle."""
        with self._lock:
            sf = self._files.get(ino)
            if sf is None:
                if len(key) > MAX_PATH_BYTES:  # (a key imported as it was: readable, never savable)
                    raise PathTooLong(f"a path of {len(key)} bytes is read-only (staged ones: {MAX_PATH_BYTES} at most)")
                sf = SpoolFile(self, ino, branch, key, base, attrs, new)
                self._files[ino] = sf
            sf.handles += 1
            return sf

    def create(self, ino: int, branch: str, key: bytes, entry: Entry, attrs: PosixAttrs, items) -> SpoolFile:
        """:meth:`open` of a new file whose create (``entry``, and ``items(key)``) is staged with its first save."""
        with self._lock:
            sf = self._files.get(ino)
            if sf is None:
                sf = SpoolFile(self, ino, branch, key, entry, attrs, False)
                sf.known = None  # the branch shows nothing at its key (recovery stages over nothing)
                sf.unstaged = items
                self._files[ino] = sf
                self.unstaged[ino] = sf
            sf.handles += 1
            return sf

    def created_staged(self, ino: int, sf: SpoolFile) -> None:
        with self._lock:
            if self.unstaged.get(ino) is sf:
                del self.unstaged[ino]

    def unstaged_files(self) -> list[SpoolFile]:
        with self._lock:
            return list(self.unstaged.values())

    def in_background(self, fn, *args) -> concurrent.futures.Future:
        """``fn(*args)`` in another thread (one of a few kept for it): its future."""
        with self._lock:
            if self._background is None:
                self._background = concurrent.futures.ThreadPoolExecutor(4, "lakefuse-spool-sync")
            return self._background.submit(fn, *args)

    def release_is_inline(self, ino: int) -> bool:
        """Whether :meth:`release` of one handle of ``ino`` does no I/O now: another handle
        stays, or the file is saved and nothing of it is on disk (never blocks: reads flags
        the handle's own writes and flushes set, which are finished). The descriptor of a
        spool file a local store adopted is only closed (the object keeps the file)."""
        sf = self._files.get(ino)
        return sf is None or sf.handles > 1 or not (
            sf.dirty or sf.on_disk or sf.failure is not None or (sf._fd is not None and not sf._adopted))

    def hold(self, ino: int) -> SpoolFile | None:
        """The spool file of ``ino`` with one more handle (None if it has none): a
        change made through it is saved by whoever releases the last handle."""
        with self._lock:
            sf = self._files.get(ino)
            if sf is not None:
                sf.handles += 1
            return sf

    def release(self, ino: int) -> None:
        """One handle of ``ino`` closed. The last one saves the file if it is still dirty and
        drops the spool copy once saved; a failed save stays in the spool and the mount (reads
        show what was written) and is retried in the background (:meth:`retry_saves`)."""
        with self._lock:
            sf = self._files.get(ino)
            if sf is None:
                return
            sf.handles -= 1
            if sf.handles > 0:
                return
        if sf.failure is not None:  # the close's own save just failed: the background retries it, 1 s on
            return self._save_failed(sf, sf.failure, "after its last close")
        try:
            sf.flush()
        except Exception as e:
            self._save_failed(sf, e, "after its last close")
            return
        self._finish(sf)

    def sync_saved(self, entry: Entry | None) -> None:
        """fsync(2) of a branch file with no unsaved content here: make what it shows durable -- ``entry``'s
        object, if a close saved it without an fsync, and every staging write of this process
        (:meth:`SpoolFile.flush` with ``durable=True`` for a file being written); the two flushed at once."""
        syncing = self.in_background(self.repo.sync_entry, entry) if entry is not None and entry.size else None
        self.repo.sync()
        if syncing is not None:
            syncing.result()
        self.stats["syncs"] += 1

    def detach(self, ino: int, behind: bool = False) -> bool:
        """Detach ``ino``'s file (unlinked here; ``behind``: if :meth:`SpoolFile.removed_behind`); whether it was."""
        sf = self.get(ino)
        if sf is None or (behind and not sf.removed_behind()):
            return False
        if not behind:
            sf.detach()
        if sf.pinned:  # a failed save no handle holds: nothing of it is to be saved now
            self._finish(sf)
        return True

    def open_files(self) -> list[SpoolFile]:
        with self._lock:
            return list(self._files.values())

    # -- intents (operations that span several transactions)
    def begin_intent(self, record: dict) -> Path:
        sidecar.write_synced_json(path := self.dir / f"{time.time_ns():019d}-{secrets.token_hex(4)}.intent", record)
        return path

    def end_intent(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    # -- crash recovery
    def recover(self) -> RecoveryReport:
        """Take over what killed mounts of this repository left in the spool (:mod:`lakefuse.mount.recovery`):
        safe to run while other mounts are live: their instance directories are locked and left alone."""
        return recover_spool(self)

    def close(self) -> None:
        """Unmount: every file must have been released (a still-dirty one stays for recovery)."""
        self._stop.set()
        self.pool.close()
        if self._background is not None:
            self._background.shutdown()
        t = self._retrier
        if t is not None:
            t.join(60)
        with self._lock:
            left = list(self._files.values())
            self._files.clear()
        for sf in left:  # (still open: the mount stopped under its writer, a SIGTERM)
            try:
                if sf.flush() is not None:
                    log.warning("spool: %s on branch %s was open for writing when the mount stopped: the %d bytes "
                                "written to it were saved (staged, not committed)", _name(sf), sf.branch, sf.size)
                sf.close()
            except Exception as e:  # (a store or KV away: one line, as every other; a defect: its traceback)
                log.error("could not save %s on branch %s at unmount; its content stays in %s%s", _name(sf),
                          sf.branch, sf.data_path, f": {e}" if isinstance(e, GravelerError) else "",
                          exc_info=not isinstance(e, GravelerError))
        self.note_unsaved(left)  # (what failed stays noted: the next mount's recovery takes it over)
        if not left or all(not sf.data_path.exists() for sf in left):
            shutil.rmtree(self.dir, ignore_errors=True)
        try:  # as umount(8) of a local filesystem: what closes saved is on disk once it returns
            if self.repo.config.kv.sync:  # (a home that syncs nothing: benchmarks, tests)
                self.repo.store.sync()
            self.repo.sync()
        except GravelerError as e:
            log.error("could not sync the store and the KV at unmount: %s", e)
        self.journal.close()
        os.close(self._lock_fd)
