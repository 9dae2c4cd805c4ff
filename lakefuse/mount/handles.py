"""Open files: each kind of handle owns its read / write / flush / release.

The core keeps one table of handles by ``fh`` and asks the handle; it never asks
what kind it holds. The kinds:

* :class:`ObjectHandle` -- a committed object in a remote store, read through
  graveler's chunked reader (ranged GETs, read-ahead, the data cache);
* :class:`LocalObjectHandle` -- a committed object that is a local file (a local
  store): small ones read whole at open, sequential reads fetched a chunk ahead;
* :class:`SpoolHandle` -- a file of a branch tree opened for writing (or while
  another handle writes it): its content lives in the spool until close/fsync
  (close saves it as ext4 does -- visible, kept if the daemon dies; fsync also
  puts it on disk: :mod:`lakefuse.mount.spool`);
* :class:`ControlHandle` -- a control file: what is written is one request;
* :class:`InfoHandle` -- a generated read-only file (``stats``, ``head``, ``log``).

Every method may block (it runs in a worker thread) except :meth:`Handle.read_fast`,
:meth:`Handle.read_nowait`, :meth:`Handle.read_pending`, :meth:`Handle.pending` and
:meth:`Handle.release_pending`, which answer on the trio thread (they wait for no lock a
worker may hold for long). A new
kind of handle subclasses :class:`Handle`, overrides what it does, and is made by whatever
opens it (the core's ``open``, or :mod:`lakefuse.mount.special`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading

from graveler.errors import GravelerError, NotFound
from graveler.model import Entry, entry_location
from lakefuse.mount import control, falloc
from lakefuse.mount.errors import FsError
from lakefuse.mount.nowait import pread_nowait
from lakefuse.mount.offload import BULK_WRITE_MIN
from lakefuse.mount.openelsewhere import open_elsewhere

log = logging.getLogger(__name__)
_COUNTS = threading.Lock()  # SpoolFile.writers (held for an increment only: never during I/O)


class Handle:
    """One open file. The defaults: nothing to read ahead, no writes, nothing to flush."""

    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node

    def read_fast(self, offset: int, size: int) -> bytes | None:
        """The bytes when they are in memory already (never blocks), else None."""
        return None

    def read_nowait(self, offset: int, size: int) -> bytes | bytearray | None:
        """The bytes when a local file's page cache holds them all (never blocks), else
        None: the read then goes to a worker thread (:meth:`read`)."""
        return None

    def read_pending(self, offset: int, size: int):
        """A ``concurrent.futures.Future`` that another thread completes once :meth:`read_fast`
        can answer this read (a remote object's chunk a stream is bringing), else None. Never
        blocks: the caller waits for it without a thread, then asks :meth:`read_fast` again."""
        return None

    def read(self, offset: int, size: int) -> bytes:
        return b""

    def write(self, offset: int, data: bytes) -> int:
        raise FsError(errno.EBADF, "not open for writing")

    def fallocate(self, mode: int, offset: int, length: int) -> None:
        raise FsError(errno.EOPNOTSUPP, "fallocate is for branch files")

    def pending(self) -> bool:
        """True when :meth:`flush` has work to do (never blocks)."""
        return False

    def bulky(self, size: int) -> bool:
        """Whether a write of ``size`` bytes (0: the flush) may hold its thread long -- it moves
        many bytes, or runs a control request -- (never blocks)."""
        return size >= BULK_WRITE_MIN

    def flush(self) -> None:
        """close(2): make what was written take effect (visible, kept if the daemon dies)."""

    def fsync(self) -> int | None:
        """fsync(2) / fdatasync(2): :meth:`flush`, and what the file shows is on disk when it
        returns; the branch's stamp after a save it made (None: none, or not known)."""
        self.flush()
        return None

    def release_pending(self) -> bool:
        """True when :meth:`release` may block (it then runs in a worker thread)."""
        return False

    def release(self) -> None:
        """The last close: let go of what the handle holds (the core closes the node)."""


class InfoHandle(Handle):
    """A generated read-only file: its content is made at open."""

    __slots__ = ("content", "stats")

    def __init__(self, node, content: bytes, stats):
        super().__init__(node)
        self.content = content
        self.stats = stats

    def read_fast(self, offset: int, size: int) -> bytes:
        data = self.content[offset:offset + size]
        return data

    def read(self, offset: int, size: int) -> bytes:
        return self.content[offset:offset + size]


class ObjectHandle(Handle):
    """A committed object of a remote store (see the module docstring). While a spool
    file of the same inode holds newer content (another handle writes it), reads go there."""

    __slots__ = ("reader", "size", "next_off", "spool", "stats", "log_once", "repo_name", "value")

    def __init__(self, node, reader, size: int, spool, stats, log_once, repo_name: str):
        super().__init__(node)
        self.value = node.value  # the entry opened (a branch file's may move on: _moved)
        self.reader = reader
        self.size = size
        self.next_off = 0
        self.spool = spool
        self.stats = stats
        self.log_once = log_once
        self.repo_name = repo_name

    def _written(self) -> bool:
        """Another handle writes the inode, or saved it since this one opened: reads go to a worker."""
        return self.node.value is not self.value or (self.spool is not None and self.spool.peek(self.node.ino) is not None)

    def _missing(self) -> FsError:
        """EIO for an object gone from the store, said once in the log (which object, which path)."""
        self.log_once(logging.WARNING, ("missing", self.reader.key), "%s: %s: its object %s is missing from the store",
                      self.repo_name, self.node.path.decode("utf-8", "replace"), self.reader.key)
        return FsError(errno.EIO, "object missing")

    def open_cached(self, passthrough: bool, small: int) -> int:
        """At open (in a worker thread), a remote object: its whole file in the data cache when
        there is one -- returned for FUSE passthrough when ``passthrough`` (a read-only open of an
        immutable tree), else -1 and read here -- or, for a file of at most ``small`` bytes, the
        whole object fetched now (size and MD5 checked) and kept in memory. A failed fetch is left
        to the reads (they fetch and report it)."""
        reader = self.reader
        if reader.open_cached():
            self.stats.add("opens_from_cache")
            return reader.fileno() if passthrough else -1
        if self.size <= small:
            try:
                reader.read_whole()
            except GravelerError:
                return -1
            self.stats.add("opens_small_whole")
        return -1

    def _spooled_read(self, offset: int, size: int) -> bytes | None:
        if self.spool is None:
            return None
        sf = self.spool.get(self.node.ino)
        if sf is not None and (sf.loaded or sf.saved is not None):
            return sf.read(offset, size)  # another handle is writing it: read what it wrote
        moved = self._moved()
        if moved is None:
            return None
        if offset >= moved.size:
            return b""
        return self.spool.repo.read_entry(moved, offset, min(size, moved.size - offset))

    def _moved(self) -> Entry | None:
        """A branch file whose inode another handle of this mount wrote and saved since this one
        opened it: its entry now, which every descriptor of the inode reads, as on a local
        filesystem (the kernel's size and page cache of the inode are that version's; reading the
        object opened would end early and the kernel would take the old size back). None while
        the handle's object is the inode's (a change of attributes only is taken here)."""
        v = self.node.value
        if v is self.value or v is None or self.spool is None:
            return None
        if self.value is not None and entry_location(v) == entry_location(self.value):
            self.value = v
            return None
        return Entry.from_value(v)

    def read_fast(self, offset: int, size: int) -> bytes | None:
        reader = self.reader
        if reader is None or self._written():
            return None
        content = getattr(reader, "content", None)  # a small remote object read whole at open
        if content is not None:
            data = content[offset:offset + size]
        else:  # chunks a stream (or an earlier read) brought in already
            ready = getattr(reader, "read_ready", None)
            if ready is None or offset >= self.size:
                return None
            data = ready(offset, min(size, self.size - offset))
            if data is None:
                return None
        return data

    def read_pending(self, offset: int, size: int):
        pending = getattr(self.reader, "pending", None)  # a remote object's stream
        if pending is None or offset >= self.size or self._written():
            return None
        return pending(offset, min(size, self.size - offset))

    def read_nowait(self, offset: int, size: int) -> bytes | bytearray | None:
        fileno = getattr(self.reader, "fileno", None)  # the data cache's whole file of a remote object
        fd = fileno() if fileno is not None else -1
        if fd < 0 or self._written() or offset >= self.size:
            return None
        n = min(size, self.size - offset)
        data = pread_nowait(fd, offset, n)
        if data is not None:
            self.stats.add("bytes_from_cache", n)
        return data

    def read(self, offset: int, size: int) -> bytes:
        data = self._spooled_read(offset, size)
        if data is not None:
            return data
        return self._read_object(offset, size)

    def _read_object(self, offset: int, size: int) -> bytes:
        if offset >= self.size or self.reader is None:
            return b""
        n = min(size, self.size - offset)
        try:
            data = self.reader.read(offset, n)
        except NotFound:
            raise self._missing() from None
        self._count_from_store(len(data))
        self.next_off = offset + len(data)
        if len(data) < n:
            self.log_once(logging.WARNING, ("short", self.reader.key),
                          "%s: object %s ended at %d bytes, the entry says %d",
                          self.repo_name, self.reader.key, offset + len(data), self.size)
            raise FsError(errno.EIO, "object shorter than its entry")
        return data

    def _count_from_store(self, n: int) -> None:
        pass  # a remote reader counts its own GETs (bytes_from_store, added at release)

    def fsync(self) -> None:
        """A branch file open for reading: its inode's saved content is made durable, as an fsync
        of any descriptor of a file does (an earlier close saved it without syncing)."""
        tree = self.node.tree
        if self.spool is None or tree is None or tree.immutable:
            return
        sf = self.spool.get(self.node.ino)
        try:
            if sf is not None:  # another handle writes it: save that too, durably
                sf.flush(durable=True)
                return
            tree.repin()
            value = tree.view.get(self.node.path)
            self.spool.sync_saved(Entry.from_value(value) if value is not None else None)
        except NotFound:
            raise FsError(errno.EIO, "object missing") from None

    def release(self) -> None:
        reader = self.reader
        if reader is not None:
            self.stats.add_each((("bytes_from_store", getattr(reader, "bytes_from_store", 0)),
                                 ("bytes_from_cache", getattr(reader, "bytes_from_cache", 0)),
                                 ("store_gets", getattr(reader, "gets", 0)),
                                 ("store_streams", getattr(reader, "streams", 0)),  # sequential runs' GETs
                                 ("store_parts", getattr(reader, "parts", 0))))  # parallel part GETs behind them
            reader.close()


class LocalObjectHandle(ObjectHandle):
    """A committed object that is a local file (see the module docstring)."""

    __slots__ = ("content", "chunk", "buf", "buf_off", "lock")

    def __init__(self, node, reader, size: int, content: bytes | None, chunk: int, spool, stats, log_once,
                 repo_name: str):
        super().__init__(node, reader, size, spool, stats, log_once, repo_name)
        self.content = content  # a small file, read whole at open
        self.chunk = chunk
        self.buf = b""  # what the last sequential read fetched beyond what it was asked for
        self.buf_off = 0
        self.lock = threading.Lock()  # one fetch ahead at a time: concurrent reads wait for it

    def read_fast(self, offset: int, size: int) -> bytes | None:
        if self._written():
            return None  # another handle is writing it: no read-ahead buffer is current
        return self._from_memory(offset, size)

    def read_nowait(self, offset: int, size: int) -> bytes | bytearray | None:
        if self.spool is not None:
            sf = self.spool.peek(self.node.ino)
            if sf is not None and (sf.loaded or sf.saved is not None):
                return sf.read_nowait(offset, size)  # another handle is writing it (as _spooled_read)
            if self.node.value is not self.value:
                return None  # written and saved since this handle opened (_moved, in a worker)
        if offset >= self.size or self.reader is None:
            return b""
        fileno = getattr(self.reader, "fileno", None)
        fd = fileno() if fileno is not None else -1
        if fd < 0:
            return None
        n = min(size, self.size - offset)
        data = pread_nowait(fd, offset, n)  # never past the size the entry says: a short read is "not cached"
        if data is not None:
            self.next_off = max(self.next_off, offset + n)
            self.stats.add("bytes_from_store", n)
        return data

    def _from_memory(self, offset: int, size: int) -> bytes | None:
        if self.content is not None:
            data = self.content[offset:offset + size]
            return data
        buf, lo = self.buf, self.buf_off
        if buf and lo <= offset and (offset + size <= lo + len(buf) or lo + len(buf) >= self.size):
            data = buf[offset - lo:offset - lo + size]
            self.next_off = max(self.next_off, offset + len(data))
            self.stats.add("reads_from_memory")
            return data
        return None

    def read(self, offset: int, size: int) -> bytes:
        data = self._spooled_read(offset, size)
        if data is not None:
            return data
        if self.content is not None:
            return self.content[offset:offset + size]
        if offset >= self.size or self.reader is None:
            return b""
        n = min(size, self.size - offset)
        chunk = self.chunk
        if n * 4 < chunk and offset > 0 and abs(offset - self.next_off) <= 2 * chunk:
            # small sequential reads (the kernel's read-ahead window is small; its requests may
            # arrive slightly out of order): fetch the aligned piece around them in this one
            # thread call; the next reads are then served from memory on the trio thread
            # (read_fast). Concurrent reads wait for the fetch rather than repeat it.
            with self.lock:
                data = self._from_memory(offset, n)
                if data is not None:
                    return data
                start = offset - offset % chunk
                want = min(max(offset + n - start, chunk), self.size - start)
                try:
                    piece = self.reader.read(start, want)
                except NotFound:
                    raise self._missing() from None
                self.stats.add("bytes_from_store", len(piece))
                if len(piece) == want:
                    self.buf, self.buf_off = piece, start
                    data = piece[offset - start:offset - start + n]
                    self.next_off = max(self.next_off, offset + len(data))
                    return data
        return self._read_object(offset, n)

    def _count_from_store(self, n: int) -> None:
        self.stats.add("bytes_from_store", n)  # a local object file: every byte is from the store


class SpoolHandle(Handle):
    """A file of a branch tree whose content goes through the spool: written to local
    disk, uploaded and staged on flush (durably on fsync); the last release saves what a
    failed flush left and drops the spool copy."""

    __slots__ = ("sf", "writable", "spool")

    def __init__(self, node, sf, writable: bool, spool):
        super().__init__(node)
        self.sf = sf
        self.writable = writable
        self.spool = spool
        if writable:
            with _COUNTS:
                sf.writers += 1

    def read_nowait(self, offset: int, size: int) -> bytes | bytearray | None:
        return self.sf.read_nowait(offset, size)

    def read(self, offset: int, size: int) -> bytes:
        return self.sf.read(offset, size)

    def write(self, offset: int, data: bytes) -> int:
        if not self.writable:
            raise FsError(errno.EBADF, "not open for writing")
        try:
            return self.sf.write(offset, data)
        except OSError as e:  # the spool's disk is full: the read caches on it give up their space first
            if e.errno != errno.ENOSPC or not self.sf.spool.pool.make_room():
                raise
            return self.sf.write(offset, data)

    def fallocate(self, mode: int, offset: int, length: int) -> None:
        if not self.writable:
            raise FsError(errno.EBADF, "not open for writing")
        falloc.check(mode, offset, length)
        self.sf.fallocate(mode, offset, length)

    def _leaves_the_save(self) -> bool:
        """A read-only handle of a file whose save failed -- its close leaves the save to the
        spool's retry (a reader's close does not fail for a writer's save) -- or of a file another
        handle still has open for writing: a reader's close publishes nobody's half-written file
        (the concurrency tour: a ``cat``'s close staged it, over a newer upload); the writer's close
        saves it, or the last release."""
        return not self.writable and (self.sf.failure is not None or self.sf.writers > 0)

    def pending(self) -> bool:
        return self.sf.dirty and not self._leaves_the_save()

    def bulky(self, size: int) -> bool:
        return self.sf.bulky(size, BULK_WRITE_MIN)

    def flush(self) -> int | None:
        """Save (close); the branch's stamp after this save (None: nothing staged, or not known)."""
        if self._leaves_the_save():
            return None
        with self._saving():
            try:
                if self.sf.flush() is not None:
                    return self._own_change()
            except NotFound:
                if not self.spool.branch_deleted(self.sf):  # (then detached: the close succeeds)
                    raise
            except GravelerError:
                self.spool.note_unsaved()  # commits made elsewhere are refused meanwhile (graveler.fences)
                raise
        return None

    def fsync(self) -> int | None:
        with self._saving():
            try:
                staged = self.sf.flush(durable=True)
            except NotFound:
                if self.spool.branch_deleted(self.sf):
                    return None
                raise FsError(errno.EIO, "object missing") from None  # the object it was saved with is gone
            except GravelerError:
                self.spool.note_unsaved()  # (as a failed close's)
                raise
            if staged is not None:
                return self._own_change()
        return None

    def release_pending(self) -> bool:
        # the last handle's release saves the file if a flush failed (upload, staging) and
        # removes its spool files; a saved file with none left is released on the trio thread
        return not self.spool.release_is_inline(self.node.ino)

    def release(self) -> None:
        if self.writable:
            with _COUNTS:
                self.sf.writers -= 1
        was_dirty = self.sf.dirty
        with self._saving() if was_dirty else contextlib.nullcontext():
            self.spool.release(self.node.ino)
            if was_dirty and not self.sf.dirty:
                self._own_change()

    def _saving(self):
        """:meth:`lakefuse.mount.trees.Tree.own_saving` of a branch tree's file."""
        tree = self.node.tree
        return tree.own_saving() if tree is not None and not tree.immutable else contextlib.nullcontext()

    def _own_change(self) -> int | None:
        """The save moved the branch's stamp by one: this mount's own change (lakefuse.mount.watch);
        the stamp after it when this save's transaction read it. A save changes the file's own
        attributes, no directory's (its entry was staged by the create, or was there)."""
        tree = self.node.tree
        if tree is not None and not tree.immutable:
            stamp, raw = self.sf.stamped
            # (a new file's first save stages its create too: its directory's marker)
            dirs = (self.node.path,) + tuple(k.rstrip(b"/") for k, _ in self.sf.staged_items)
            try:
                tree.staged(stamp, raw, dirs=dirs)
                if raw is not None and self.sf.staged_items:
                    tree.markers_staged(self.sf.staged_items, stamp)
            except GravelerError:  # the save stands; the watch then drops the caches, which is harmless
                return None
            return stamp if raw is not None else None
        return None


class ControlHandle(Handle):
    """An open control file: what is written is one request, run when a write shorter than
    a block ends a line, else on flush (close) or fsync; reading returns the last outcome.
    A request one of whose writes failed (over :data:`control.MAX_REQUEST_BYTES`) never
    runs: what was written of it is dropped, and the close (flush, fsync) fails with the
    same errno.
    Opened for writing and closed with nothing written (``: > commit``; a truncation at
    open is no write) is an empty request: a flush before a write fails with EINVAL unless
    another descriptor of the file is still open (``path``: its path under the mount;
    :mod:`lakefuse.mount.openelsewhere` -- bash closes its first descriptor before the
    command writes through the second; it records nothing), and the last close (release)
    records the failure for the read-back."""

    __slots__ = ("controls", "branch", "name", "buf", "start", "writable", "content", "failed", "written", "uid",
                 "path")

    def __init__(self, node, controls, branch: str | None, name: str, writable: bool, content: bytes,
                 uid: int | None = None, path: bytes | None = None):
        super().__init__(node)
        self.path = path
        self.uid = uid  # who opened it (its commit's committer); None: the daemon's own user
        self.controls = controls
        self.branch = branch
        self.name = name
        self.buf = bytearray()
        # the file offset where the request being written begins: its first write's (O_APPEND
        # writes at the outcome's size; a second request of the descriptor after the first's bytes)
        self.start = 0
        self.writable = writable
        self.content = content
        self.failed: FsError | None = None  # a write of the request being written failed: it never runs
        self.written = False  # a write arrived (a truncation is none)

    def read_fast(self, offset: int, size: int) -> bytes:
        return self.content[offset:offset + size]

    def read(self, offset: int, size: int) -> bytes:
        return self.content[offset:offset + size]

    def write(self, offset: int, data: bytes) -> int:
        if not self.writable:
            raise FsError(errno.EBADF, "not open for writing")
        self.written = True
        if self.failed is not None:
            raise FsError(self.failed.errno, str(self.failed))
        if not self.buf:
            self.start = offset
        pos = offset - self.start
        if pos < 0:
            raise FsError(errno.EINVAL, f"{self.name}: a write before the start of the request being written")
        if pos + len(data) > control.MAX_REQUEST_BYTES:
            self._fail(FsError(errno.EFBIG, f"control requests are at most {control.MAX_REQUEST_BYTES} bytes: "
                                            f"a write reached byte {pos + len(data)}, the request was not run"))
        if pos > len(self.buf):  # (a gap: the request then holds NULs, and is refused)
            self.buf.extend(b"\0" * (pos - len(self.buf)))
        self.buf[pos:pos + len(data)] = data
        if data.endswith(b"\n") and len(data) < control.RUN_AT_NEWLINE_BELOW:
            # A write that ends a line ends the request: run it now, so the write itself
            # fails when the request does (bash ignores errors of close, not of write).
            # A full block is a piece of a longer request (control.RUN_AT_NEWLINE_BELOW).
            req = bytes(self.buf)
            self.buf.clear()
            self._run(req)
        return len(data)

    def _fail(self, e: FsError) -> None:
        """This request's write failed: drop what was written of it, keep the failure for
        the close (and the read-back), and answer the write with it."""
        self.buf.clear()
        self.failed = e
        self.controls.refuse(self.branch, self.name, str(e))
        self.content = self.controls.outcome(self.branch, self.name)
        raise e

    def bulky(self, size: int) -> bool:
        return True  # (a write or a close may run a request: a commit or a merge may take long)

    def _empty(self) -> str:
        return f"{self.name}: empty request: nothing was written (e.g. echo REQUEST > {self.name})"

    def pending(self) -> bool:
        return bool(self.buf) or self.failed is not None or (self.writable and not self.written)

    def flush(self) -> None:
        if self.failed is not None:
            raise FsError(self.failed.errno, str(self.failed))
        if self.writable and not self.written:
            if self.path is not None and open_elsewhere(self.path):
                return  # (a descriptor is left: the request may still come through it)
            raise FsError(errno.EINVAL, self._empty())
        if self.writable and self.buf:
            data = bytes(self.buf)
            self.buf.clear()
            self._run(data)

    def release_pending(self) -> bool:
        return self.writable and (bool(self.buf) or not self.written)

    def release(self) -> None:
        if self.writable and not self.written:
            self.controls.refuse(self.branch, self.name, self._empty(), "InvalidArgument")
        elif self.writable and self.buf:  # written without a flush (never for close(2))
            try:
                self._run(bytes(self.buf))
            except GravelerError:
                pass  # the outcome is kept for the read-back

    def _run(self, data: bytes) -> None:
        try:
            self.controls.execute(self.branch, self.name, data, self.uid)
        finally:
            self.content = self.controls.outcome(self.branch, self.name)
            if self.node.tree is not None:
                try:
                    self.node.tree.repin()
                except GravelerError as e:  # the request's outcome stands (a commit made is made): the
                    log.debug("%s: the tree is read again later: %s", self.name, e)  # next read repins it
