"""Opening a file of the mount (:class:`Opens`, a part of :class:`lakefuse.mount.fs.Filesystem`).

A control or info file gets its handle from :mod:`lakefuse.mount.special`; a branch file
being written (or opened for writing) a spool handle from :mod:`lakefuse.mount.writes`;
any other file a handle that reads its object (:mod:`lakefuse.mount.handles`). With FUSE
passthrough, a read-only open of a local store's object file, or of a remote object's
whole file in the data cache, names that file as the backing file, under the admission
rules of :mod:`lakefuse.mount.backing`.
"""

from __future__ import annotations

import errno
import logging
import os
import stat

from graveler.errors import NotFound
from graveler.model import Entry, entry_location
from lakefuse.mount import special
from lakefuse.mount.attrs import Opened
from lakefuse.mount.backing import CACHED, PASSTHROUGH, STALE
from lakefuse.mount.errors import FsError
from lakefuse.mount.handles import LocalObjectHandle, ObjectHandle
from lakefuse.mount.inodes import Kind, Node
from lakefuse.mount.trees import FRESH_NS, Tree

_MOVED_RETRIES = 4  # opens of a branch file that another version overtook, before the kernel's ESTALE


class _Moved(Exception):
    """An open's version was overtaken before it counted (:meth:`Opens._open_file`): open again."""


class Opens:
    """The open path of :class:`lakefuse.mount.fs.Filesystem` (which supplies ``inodes``,
    ``spool``, ``writes``, ``backings``, ``stats``, ``config`` and the other collaborators)."""

    def open(self, ino: int, flags: int, passthrough: bool = False, uid: int | None = None) -> Opened:
        """Open a file. With ``passthrough`` (the adapter can hand reads to the kernel), a
        read-only open of an object of a local store -- a commit's file, or a branch file no
        handle is writing (``branch_passthrough``) -- names the object's file as
        ``backing_fd``: immutable, the very bytes the daemon would read. Such an inode takes
        no other kind of open while one lasts (:mod:`lakefuse.mount.backing`): a writer, or a
        reader of a newer version, gets ESTALE and the name a new inode; the kernel looks it
        up again and repeats the open there."""
        node = self.inodes.get(ino)
        writing = bool(flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_APPEND))
        if node.kind == Kind.INFO_FILE:
            spec = special.find(node.tree, node.path, self.writable)
            if spec is None:
                raise FsError(errno.ENOENT)
            if writing and not spec.control:
                self.check_writable(ino)
            h = special.open_handle(self, node, spec, writing, uid)
            self.inodes.open(node)
            return Opened(self.new_fh(h), False, True, noflush=not writing)
        try:
            told = node.attr  # (what the kernel was last told of the inode, if anything: before any retry)
            for _ in range(_MOVED_RETRIES):
                try:
                    return self._open_tree_file(node, flags, writing, passthrough, told, uid)
                except _Moved:
                    self.stats.add("opens_moved_retried")  # (the branch moved under the open: again, at once)
            self._stale(node)
        except FsError as e:
            if e.errno != errno.ENOENT or node.kind != Kind.FILE or node.tree.immutable:
                raise
            # removed behind the mount, the kernel still holding the name (an open, or a create
            # with O_TRUNC, by its cached entry): ESTALE has it look the name up (then create it)
            self.stats.add("opens_stale")
            raise FsError(errno.ESTALE, f"{e}: the kernel looks the name up again") from None

    def _open_tree_file(self, node: Node, flags: int, writing: bool, passthrough: bool, told=None,
                        uid: int | None = None) -> Opened:
        ino = node.ino
        if node.kind == Kind.FILE and not node.tree.immutable and self.writes is not None and self.spool is not None:
            if writing:
                self.backings.wrote(node.key)
            if writing or self.spool.get(ino) is not None:
                if not passthrough:
                    return self.writes.open_spooled(node, flags, writing, uid)
                if not self.backings.hold(node.ino):
                    self.backings.writer_waits(node.key)  # (its retry must find the next inode unbound)
                    self._stale(node)
                return self._admitted(node, False, self.writes.open_spooled, node, flags, writing, uid)
        if writing:
            self.check_writable(ino)
        if node.kind != Kind.FILE:
            raise FsError(errno.EISDIR)
        if node.renamed_over and node.value is not None and not self.inodes.attached(node):
            # this mount renamed another file over the name after the kernel's path walk had found
            # this inode, before the kernel moved its entry (it does once the rename is answered):
            # as on a local filesystem, the open opens the file the walk found -- the version the
            # name had, nlink 0 -- where ESTALE reached the caller when a second rename came
            # within the kernel's one retry. (Replaced behind the mount, the kernel's entry is
            # merely old: that open still looks the name up again, below.)
            self.stats.add("opens_renamed_over")
        else:
            node = self.revalidate(node)
            if not node.tree.immutable and not self.inodes.attached(node):
                self._stale(node)  # replaced behind the mount while open: the name's new version is a new inode
            if told is not None and node.attr is not told and (told.size, told.mtime_ns) != (node.attr.size,
                                                                                            node.attr.mtime_ns):
                # replaced behind the mount (another process, host or mount) since the kernel took its
                # attributes, none open: the open serves the new version, which the kernel would read
                # by the old size (cut short, or padded) until its attributes time out -- it asks again
                self.kernel_attrs_stale(node.ino)
                self.stats.add("opens_attrs_refreshed")
        if not passthrough:
            return self._uncached(node, self._open_file(node, False))
        tree: Tree = node.tree
        entry = Entry.from_value(node.value)
        if (not writing and entry.size > 0 and not stat.S_ISLNK(node.attr.mode)
                and ((self._local_store and (tree.immutable or self.branch_passthrough))
                     or (tree.immutable and self.data_cache is not None))):
            mode = self.backings.bind(node.ino, node.value.identity, node.key)
            if mode == STALE:
                self._stale(node)
        elif self.backings.hold(node.ino):
            mode = CACHED
        else:
            self._stale(node)
        o = self._admitted(node, mode == PASSTHROUGH, self._open_file, node, mode == PASSTHROUGH)
        return self._uncached(node, o) if mode == CACHED else o

    def _uncached(self, node: Node, o: Opened) -> Opened:
        """A branch file's open the daemon serves skips the page cache (FOPEN_DIRECT_IO, where the kernel
        still maps such files shared) when a handle may write it, or truncate(2) cut it, while this one
        reads -- the kernel pads a page read as the file shrinks or grows with zeros and keeps it (as
        open_spooled's readers): a local store's file whose plain reads are passthrough, or one written
        through the mount (:meth:`Backings.written`). While a handle writes it, the open keeps the
        inode's pages (FOPEN_KEEP_CACHE: a write in flight has put its bytes there); else it drops
        them as every open of a changed file does (its mmap reads the pages)."""
        if node.tree.immutable or not self.dio_mmap or not (
                (self._local_store and self.branch_passthrough) or self.backings.written(node.key)):
            return o
        return Opened(o.fh, self.spool is not None and self.spool.peek(node.ino) is not None, True,
                      o.backing_fd, o.noflush)

    def _admitted(self, node: Node, pt: bool, fn, *args) -> Opened:
        """Run the open :class:`Backings` admitted; it is released with its fh (or now, if it fails)."""
        try:
            o = fn(*args)
        except BaseException:
            self.backings.undo(node.ino, pt)
            raise
        if pt and o.backing_fd < 0:  # not a local object file after all: the daemon serves it
            self.backings.opened(o.fh, node.ino, True)
            self.backings.refused(o.fh)
        else:
            self.backings.opened(o.fh, node.ino, pt)
        return o

    def _stale(self, node: Node) -> None:
        """The kernel reads an older version of this inode through a backing file: the name
        gets a new inode (the next lookup makes it), and ESTALE has the kernel look it up."""
        self.inodes.replace(node)
        self.stats.add("opens_stale")
        raise FsError(errno.ESTALE, "open files read an older version through the kernel: the name has a new inode")

    def _open_file(self, node: Node, passthrough: bool) -> Opened:
        """Open a (revalidated) file of a tree for reading; ``passthrough``: name its local object's
        file as ``backing_fd``."""
        tree: Tree = node.tree
        value = node.value
        entry = Entry.from_value(value)
        reader = None
        if entry.size > 0 and not stat.S_ISLNK(node.attr.mode):
            reader = self._open_object(tree, node.path, entry)
        wanted = passthrough  # a remote object's: its whole file in the data cache, if there is one
        opened_before = node.opened_identity == value.identity  # (this mount served it already)
        if passthrough and reader is not None and not hasattr(reader, "bytes_from_store"):
            # the FUSE page cache is neither used nor filled: dropped if the kernel refuses (the
            # daemon then serves this open), and a later cached open starts empty
            keep = False
            node.opened_identity = None
        else:
            passthrough = False
            keep = tree.immutable or opened_before
            node.opened_identity = value.identity
        backing_fd = -1
        direct_io = False
        if reader is not None and not hasattr(reader, "bytes_from_store"):  # a local object file
            content = None
            if passthrough:
                backing_fd = reader.fileno()  # the kernel reads it: nothing to read ahead here
            elif entry.size <= self.config.small_file_bytes:
                # a small local file is read whole now, in the same thread call: its reads need no other
                data = reader.read(0, entry.size)
                if len(data) == entry.size:
                    content = data
                    self.stats.add("bytes_from_store", len(data))
            h = LocalObjectHandle(node, reader, entry.size, content, self.config.sequential_chunk, self.spool,
                                  self.stats, self.log_once, self.repo.name)
        else:
            h = ObjectHandle(node, reader, entry.size, self.spool, self.stats, self.log_once, self.repo.name)
            if reader is not None and self.data_cache is not None:
                to_kernel = wanted and tree.immutable
                backing_fd = h.open_cached(to_kernel, self.config.small_file_bytes)
                if backing_fd < 0 and to_kernel and not opened_before and self._cold_direct_io(entry.size):
                    direct_io = True
                    keep = False  # the kernel keeps no page of this open: nothing to keep for the next
                    self.stats.add("opens_direct_io")
        self.inodes.open(node)
        if not tree.immutable and not node.holds(value):
            # another thread read a newer version into the node between this open's read of it and
            # its count (a stat, a lookup): the handle would read this one by the other's size
            self.inodes.close(node)
            h.release()
            raise _Moved()
        self.stats.add("opens")
        return Opened(self.new_fh(h), keep, direct_io, backing_fd, True)  # an object's handle: no flush

    def _cold_direct_io(self, size: int) -> bool:
        """Whether the mount's first, daemon-served open of a remote object of ``size`` bytes,
        on an immutable tree, read-only, its whole file not in the data cache yet, skips the
        kernel's page cache (FOPEN_DIRECT_IO): a read of it from the start fills that whole file,
        and every later open is passthrough from it (the object small enough to be kept whole,
        too big to have been read whole at open), so the FUSE page cache would hold a second
        copy of pages no later open reads, and filling it is a reply's main cost on a host slow
        to hand out fresh memory (see docs/SEMANTICS.md). The caller asks only at the mount's first open of
        the object: a reader that did not read it from the start (no whole file) gets the page
        cache from its second open on, as before. Only where the kernel maps such a file shared
        all the same (``cold_direct_io``, FUSE init)."""
        return self.cold_direct_io and self.config.small_file_bytes < size <= self.data_cache.whole_max

    def open_fast(self, ino: int, flags: int, passthrough: bool) -> Opened | None:
        """:meth:`open` of a local object for reading when the kernel will read it itself
        (``passthrough``: admitted by :meth:`Backings.bind`, released with its fh as every
        open) and its file opens from the kernel's caches alone
        (:meth:`graveler.view.View.open_cached`), else None: then :meth:`open`. Never blocks.
        A commit's file; or a branch file (``branch_passthrough``) no handle writes, as read at
        a stamp known current within :data:`lakefuse.mount.trees.FRESH_NS` (the rule
        ``getattr_fast`` answers by: :meth:`open` would read the same entry again)."""
        node = self.inodes.peek(ino)
        if (not passthrough or node is None or node.kind != Kind.FILE
                or node.value is None or node.attr is None or stat.S_ISLNK(node.attr.mode)
                or flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_APPEND)):
            return None
        branch = not node.tree.immutable
        if branch and not self._branch_file_current(node):
            return None
        loc = entry_location(node.value)  # what the open needs of the entry: decoded at a quarter of the cost
        if loc.size <= 0:
            return None
        reader = node.tree.view.open_cached(loc)
        if reader is None:
            return None
        mode = self.backings.bind(ino, node.value.identity, node.key) if reader.size == loc.size else None
        if mode != PASSTHROUGH:  # :meth:`open` says what is wrong, or decides (cached opens, another object's)
            reader.close()
            if mode == CACHED:
                self.backings.undo(ino, False)
            return None
        h = LocalObjectHandle(node, reader, loc.size, None, self.config.sequential_chunk, self.spool,
                              self.stats, self.log_once, self.repo.name)
        self.inodes.open(node)
        fh = self.new_fh(h)
        self.backings.opened(fh, ino, True)
        self.stats.count("opens", "opens_inline")
        if branch:  # as _open_file: the FUSE page cache is neither used nor filled (a later cached open starts empty)
            node.opened_identity = None
        return Opened(fh, not branch, False, reader.fileno(), True)

    def _branch_file_current(self, node: Node) -> bool:
        """Whether branch file ``node`` may be opened for passthrough reading without a read of
        the branch (never blocks): a local store's object with ``branch_passthrough``, nothing
        of this mount's pending (no spool file of it, no create not staged yet), still its name's
        inode, its entry read (or staged) at a stamp since which only this mount's own changes,
        none to it, came, the stamp known current within ``FRESH_NS``."""
        if not (self._local_store and self.branch_passthrough):
            return False
        spool = self.spool
        if spool is not None and (spool.unstaged or spool.peek(node.ino) is not None):
            return False
        tree = node.tree
        return (self.inodes.attached(node) and tree.dir_current(node.path, node.stamp)
                and tree.fresh(FRESH_NS))

    def _open_object(self, tree: Tree, path: bytes, entry: Entry):
        try:
            reader = tree.view.open(entry, self.data_cache)
        except NotFound:
            self.log_once(logging.WARNING, ("missing", entry.address),
                          "%s/%s: %r: its object %s is missing from the store",
                          self.repo.name, tree.name, path.decode("utf-8", "replace"), entry.address)
            raise FsError(errno.EIO, "object missing") from None
        if reader.size != entry.size:
            reader.close()
            self.log_once(logging.WARNING, ("size", entry.address),
                          "%s/%s: %r: its object %s has %d bytes, the entry says %d",
                          self.repo.name, tree.name, path.decode("utf-8", "replace"), entry.address,
                          reader.size, entry.size)
            raise FsError(errno.EIO, "object size differs from the entry")
        return reader
