"""The special files of ``.lakefuse`` directories: one registry, info files and control files alike.

:data:`SPECIAL_FILES` is the whole list: each file's name, where it appears
(:class:`Where`: the mount root, branch trees, or every ref tree), whether it is
a control file (a request written to it runs through :mod:`lakefuse.mount.control`)
or an info file (generated on open), whether it takes writes, and what reading it
returns. Lookup, listing, ``stat`` and ``open`` of a ``.lakefuse`` directory all
read this table; control files appear only on a writable mount.

To add a special file: one :class:`SpecialFile` row here (its ``read`` callable
returns its content); a control file also needs its request in
:class:`lakefuse.mount.control.Controls` (parse + run), and a line in docs/SEMANTICS.md.
"""

from __future__ import annotations

import enum
import errno
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from lakefuse.mount.attrs import Attr
from lakefuse.mount.errors import FsError
from lakefuse.mount.handles import ControlHandle, Handle, InfoHandle

if TYPE_CHECKING:
    from lakefuse.mount.inodes import Node
    from lakefuse.mount.trees import Tree

INFO_NAME = b".lakefuse"


class Where(enum.Enum):
    ROOT = "root"  # the mount root's .lakefuse
    BRANCH = "branch"  # .lakefuse of a branch tree
    TREE = "tree"  # .lakefuse of every ref tree (branch, commit, tag, expression)


def _stats(fs, tree) -> bytes:
    return fs.stats_json()


def _head(fs, tree: "Tree") -> bytes:
    tree.repin()
    return (tree.view.commit_id + "\n").encode()


def _log(fs, tree: "Tree") -> bytes:
    tree.repin()
    lines = []
    for c in fs.repo.log(tree.view.commit_id, amount=fs.config.log_commits):
        first = c.message.splitlines()[0] if c.message else ""
        when = c.creation_date.strftime("%Y-%m-%dT%H:%M:%SZ")
        lines.append(f"{c.id} {when} {c.committer}: {first}\n")
    return "".join(lines).encode()


def _outcome(name: str) -> Callable[..., bytes]:
    def read(fs, tree) -> bytes:
        return fs.controls.outcome(tree.view.branch if tree is not None else None, name)

    return read


@dataclass(frozen=True)
class SpecialFile:
    name: bytes
    where: Where
    control: bool  # a control file (requests are written to it); else an info file
    writable: bool
    read: Callable[..., bytes]  # the content (blocking)
    sized: bool = True  # stat shows the content's size (False: 0, the content is costly to make)

    def appears(self, tree: "Tree | None", writable_mount: bool) -> bool:
        if self.control and not writable_mount:
            return False
        if self.where is Where.ROOT:
            return tree is None
        if tree is None:
            return False
        return self.where is Where.TREE or not tree.immutable

    def key(self, tree: "Tree | None") -> tuple:
        """The inode key of this file in ``tree``'s ``.lakefuse`` (None: the root's)."""
        return ("ic" if self.control else "if", tree.key if tree is not None else None, self.name)


def _control(name: str, where: Where = Where.BRANCH, writable: bool = True, sized: bool = True) -> SpecialFile:
    """A control file: reading it returns the last outcome of its requests."""
    return SpecialFile(name.encode(), where, True, writable, _outcome(name), sized)


# In listing order (info files first, then control files).
SPECIAL_FILES: tuple[SpecialFile, ...] = (
    SpecialFile(b"stats", Where.ROOT, False, False, _stats),  # the daemon's counters (JSON)
    SpecialFile(b"head", Where.TREE, False, False, _head),  # the tree's commit ID
    SpecialFile(b"log", Where.TREE, False, False, _log),  # its last commits, one a line
    _control("branch", Where.ROOT),  # NEW [SOURCE_REF]
    _control("tag", Where.ROOT),  # NAME REF
    _control("commit"),  # a message, or a JSON request
    _control("merge"),  # SOURCE_REF [dest-wins|source-wins]
    _control("reset"),  # * | PATH | PREFIX/
    _control("revert"),  # REF [PARENT_NUMBER]
    _control("status", writable=False, sized=False),  # uncommitted changes, A|M|D path a line
)


def files_in(tree: "Tree | None", writable_mount: bool) -> list[SpecialFile]:
    """The special files of ``tree``'s ``.lakefuse`` (None: the root's), in listing order."""
    return [f for f in SPECIAL_FILES if f.appears(tree, writable_mount)]


def find(tree: "Tree | None", name: bytes, writable_mount: bool) -> SpecialFile | None:
    for f in SPECIAL_FILES:
        if f.name == name and f.appears(tree, writable_mount):
            return f
    return None


def attr(fs, spec: SpecialFile, tree: "Tree | None") -> Attr:
    """Its attributes (ino 0): size of what reading it returns now, never cached."""
    size = len(spec.read(fs, tree)) if spec.sized else 0
    return fs.rules.special_attr(size, spec.writable)


def open_handle(fs, node: "Node", spec: SpecialFile, writing: bool, uid: int | None = None) -> Handle:
    tree = node.tree
    if writing:  # refused at open, not at the first write (which could only answer EBADF)
        if tree is not None and tree.immutable:
            raise FsError(errno.EROFS, "the .lakefuse files of immutable trees are read-only")
        if not spec.writable:
            raise FsError(errno.EACCES, f"{spec.name.decode()} is read-only")
    if not spec.control:
        return InfoHandle(node, spec.read(fs, tree), fs.stats)
    branch = tree.view.branch if tree is not None else None
    path = None  # (where processes see it: a control file's empty close looks for its other descriptors)
    if writing and fs.mountpoint is not None:
        where = os.fsencode(fs.mountpoint) + (b"/" + branch.encode() if branch else b"")
        path = where + b"/.lakefuse/" + spec.name
    return ControlHandle(node, fs.controls, branch, spec.name.decode(), writing, spec.read(fs, tree), uid, path)


def stats_json(fs, extra: dict) -> bytes:
    snap = fs.stats.snapshot()
    snap["pid"] = os.getpid()
    snap["repository"] = fs.repo.name
    snap.update(extra)
    snap.update(fs.repo.cache_stats())
    if fs.data_cache is not None:
        dc = snap["data_cache"] = fs.data_cache.stats()
        asked = dc.get("hits", 0) + dc.get("misses", 0)
        dc["hit_ratio"] = round(dc.get("hits", 0) / asked, 4) if asked else None
    if fs.spool is not None:  # copies in, uploads, adoptions, syncs, copies-on-write, retried saves
        snap["spool"] = dict(fs.spool.stats)
    if fs.config.extra_stats is not None:
        snap.update(fs.config.extra_stats())
    return (json.dumps(snap, indent=1, sort_keys=True) + "\n").encode()
