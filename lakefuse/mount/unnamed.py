"""Inodes only descriptors reach: a file unlinked, a directory removed, or either renamed over
through this mount while open (``Node.unnamed``). No name leads to them, so a change of their
attributes comes through a descriptor (``fchmod``, ``fchown``, ``futimens``, ``fsetxattr``,
also on one open read-only) and stays with the inode, as an unlinked inode's does on ext4: no
staging (nothing names it), ``fstat`` and ``fgetxattr`` of its descriptors show it. ESTALE there
was wrong: the kernel retries a stale name, never a descriptor. A file still open for writing
takes such changes through its spool file instead (detached: its saves stage nothing)."""

from __future__ import annotations

import stat
import time
from dataclasses import replace

from graveler.model import Entry
from lakefuse.mount import xattrs
from lakefuse.mount.attrs import Attr, SetAttr
from lakefuse.mount.inodes import Node


def holds(w, node: Node) -> bool:
    """Whether ``node`` is open, unnamed through this mount and held by no spool file."""
    return (node.unnamed and node.opens > 0 and node.attr is not None and not w.inodes.attached(node)
            and (w.spool is None or w.spool.peek(node.ino) is None))


def setattr(w, node: Node, changes: SetAttr) -> Attr:
    """chmod, chown, utimens of ``node`` (:func:`holds`), in memory; what ``fstat`` shows now."""
    a = node.attr
    node.attr = replace(
        a, mode=(stat.S_IFMT(a.mode) | stat.S_IMODE(changes.mode)) if changes.mode is not None else a.mode,
        uid=a.uid if changes.uid is None else changes.uid, gid=a.gid if changes.gid is None else changes.gid,
        mtime_ns=a.mtime_ns if changes.mtime_ns is None else changes.mtime_ns,
        atime_ns=a.atime_ns if changes.atime_ns is None else changes.atime_ns, ctime_ns=time.time_ns())
    return w.fs.getattr(node.ino)


def setxattr(node: Node, name: bytes, value: bytes | None, flags: int) -> None:
    """Set or remove a user attribute of file ``node`` (:func:`holds`), in memory (its entry's copy)."""
    e = Entry.from_value(node.value)
    node.value = replace(e, metadata=xattrs.changed(e.metadata, name, value, flags)).to_value()
