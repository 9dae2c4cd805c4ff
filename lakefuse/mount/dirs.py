"""An open directory's calls on the filesystem core (the :class:`Directories` part of
:class:`lakefuse.mount.fs.Filesystem`): open, read (from memory or blocking), read ahead, the
dots, and the entries' inodes. The listing itself is :mod:`lakefuse.mount.listing`."""

from __future__ import annotations

import dataclasses
import errno

from lakefuse.mount import listing
from lakefuse.mount.attrs import Attr, DirEntry
from lakefuse.mount.errors import FsError
from lakefuse.mount.inodes import Kind


class Directories:
    """Mixed into :class:`lakefuse.mount.fs.Filesystem` (its inodes, handles, spool and rules)."""

    def opendir(self, ino: int) -> int:
        node = self.inodes.get(ino)
        if node.kind not in (Kind.ROOT, Kind.DIR, Kind.INFO_DIR):
            raise FsError(errno.ENOTDIR)
        self.inodes.open(node)
        return self.new_fh(listing.DirHandle(node))

    def listing_fixed(self, ino: int) -> bool:
        """Whether directory ``ino``'s listing never changes (an immutable tree's): the kernel may keep it."""
        node = self.inodes.peek(ino)
        return node is not None and node.kind == Kind.DIR and node.tree.immutable

    def releasedir(self, fh: int) -> None:
        self.release(fh)

    def readdir_fast(self, fh: int, offset: int) -> list[DirEntry] | None:
        """Entries from ``offset`` on, read already (``[]``: the end); None: :meth:`readdir_fill` first."""
        h = self._handle(fh)
        entries = h.ready(offset)
        return entries if entries is not None else listing.from_memory(self, h, offset)

    def readdir_fill(self, fh: int, offset: int) -> None:
        """Read the entries from ``offset`` on (blocking)."""
        h = self._handle(fh)
        self.settle(h.node.tree, parent=h.node.path)  # (of a branch directory: nothing pends elsewhere)
        listing.fill(self, h, offset)

    def readdir_wants_ahead(self, fh: int, offset: int, n: int) -> bool:
        """Whether to read the next page now (:meth:`readdir_ahead`): a readdir just handed
        out ``n`` entries up to ``offset`` and the next would run out. Never blocks."""
        h = self._handles.get(fh)
        return isinstance(h, listing.DirHandle) and listing.wants_ahead(h, offset, n)

    def readdir_ahead(self, fh: int, keep_from: int, n: int = 0) -> None:
        """Read the next page of the open directory (at least ``n`` entries: what the last
        readdir handed out), keeping its entries from ``keep_from`` on (blocking;
        :func:`lakefuse.mount.listing.fill_ahead`)."""
        h = self._handles.get(fh)
        if isinstance(h, listing.DirHandle):
            self.settle(h.node.tree, parent=h.node.path)
            listing.fill_ahead(self, h, keep_from, n)

    def readdir_dots(self, fh: int) -> list[tuple[bytes, Attr]]:
        """``.`` and ``..`` (name, attributes) of the open directory: the readdir offsets
        before its entries' (:data:`listing.DOTS`); neither takes a lookup (never blocks)."""
        return listing.dots(self._handle(fh).node)

    def accept(self, fh: int, e: DirEntry) -> Attr:
        """Make (or find) the inode of a readdir entry, lookup count +1 (never blocks).
        Call :meth:`forget` with it if the kernel refused the entry."""
        node = self._handle(fh).node
        attr = self.acquire(e.key, e.kind, e.tree, e.path, node.ino, e.attr, e.value, e.stamp)
        if e.kind == Kind.FILE and not e.tree.immutable and self.spool is not None:
            # a file being written: as its handles see it (the kernel takes a listing's attributes
            # for the inode it has; a smaller staged size would cut reads of the open file short)
            return self.rules.spooled(self.spool.peek(attr.ino), attr)
        return attr

    def accept_many(self, fh: int, entries: list[DirEntry]) -> list[Attr]:
        """:meth:`accept` of each of ``entries``, in one go (a readdir reply's worth)."""
        took, spool = self._took, self.spool
        out = []
        append = out.append
        for n, e in zip(self.inodes.acquire_many(entries, self._handle(fh).node.ino), entries):
            attr = e.attr
            if n.attr is None:  # a node just made: _took's case, inline (the listing's hot path)
                if attr.ino:  # a held listing's entry, another node's already: a copy (as _took)
                    attr = dataclasses.replace(attr)
                attr.ino, n.attr, n.value, n.stamp = n.ino, attr, e.value, e.stamp
                append(attr)
            else:
                append(took(n, e.tree, attr, e.value, e.stamp))
        if spool is not None:
            for i, e in enumerate(entries):
                if e.kind == Kind.FILE and not e.tree.immutable:  # as accept says
                    out[i] = self.rules.spooled(spool.peek(out[i].ino), out[i])
        return out

    def numbered(self, entries: list[DirEntry]) -> list[int]:
        """The inode number of each of ``entries``, for a plain READDIR (never blocks; no lookup
        counted, no node made: :func:`lakefuse.mount.listing.numbered`)."""
        return listing.numbered(self, entries)
