"""New files of branch trees: created in memory, staged with their first save.

A create of a new name stages nothing: the file's entry and its directory's new marker are
staged by its first save (its close, fsync), in that save's KV transaction, so a small file
costs one transaction, not two. The mount answers for the name meanwhile (the kernel has its
entry; lookups answered from memory know it: :meth:`lakefuse.mount.trees.Tree.names_added`),
and :func:`settle` stages it (empty) before anything of the mount reads the branch where it
is: a lookup or listing that reaches the KV, another write, a control request, ``fsync`` of
a directory. The CLI and other mounts see it at its close. A create over an existing entry
(the kernel did not know it) is staged at once.

:func:`create_fast` is :func:`create` on the trio thread when it needs no I/O at all: the
kernel's lookup just found nothing, and the directory's marker is known current (this mount
staged it last: ``Tree.markers``). These functions are :class:`lakefuse.mount.writes.BranchWrites`'
``create``, ``create_fast`` and ``settle``.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import replace

from graveler import paths
from graveler.objects import PosixAttrs
from lakefuse.mount.attrs import Attr, Caller, Opened
from lakefuse.mount.errors import FsError
from lakefuse.mount.fs import FRESH_NS
from lakefuse.mount.handles import SpoolHandle
from lakefuse.mount.inodes import Kind


def create(w, parent_ino: int, name: bytes, mode: int, flags: int, caller: Caller) -> tuple[Opened, Attr]:
    parent = w._branch_node(parent_ino)
    path = w._child_path(parent, name)
    tree = parent.tree
    attrs = w.new_owner(parent, caller, stat.S_IFREG | stat.S_IMODE(mode))
    now = time.time_ns()
    entry = w._new_entry(attrs, now)
    # the kernel looked the name up just before (its create follows a lookup that found nothing)
    absent = w.fs.absent(parent, name)
    if not absent:
        settle(w, tree, key=path)  # (another create of this name, not staged yet, must be seen)
    with w.fs.tree_lock(tree).shared():
        w._unmoved(parent, path)
        st = None if absent else w._stat(tree, path)
        if st is not None and st.is_dir:
            raise FsError(errno.EISDIR if not flags & os.O_EXCL else errno.EEXIST)
        if st is not None and st.value is not None and flags & os.O_EXCL:
            raise w._eexist(tree)
        touched = w._touch_parent(tree, parent.path, now)
        if st is not None and st.value is not None:  # over an existing entry: staged at once (not synced)
            stamp = w._stage(tree, [(path, entry.to_value())] + touched)
            w.fs.dir_staged(parent, touched, stamp)
            attr = w._acquire_fresh(w.fs.file_key(tree, path), Kind.FILE, tree, path, parent_ino,
                                    w.rules.file_attr(entry.to_value(), tree), entry.to_value(), stamp)
            node = w.inodes.get(attr.ino)
            sf = w.spool.open(node.ino, tree.view.branch, path, entry, attrs)
            sf.born = tree.view.born  # (its saves go to this branch, never to a later one of its name)
            return _opened(w, node, sf, attr)
        tree.names_added([(path, b"")])  # (lookups answered from memory know the name)
        w.fs.dir_staged(parent, touched, tree.stamp)
        if parent.path:
            tree.markers_staged([(parent.path + b"/", touched[0][1] if touched else None)], tree.stamp)
        return _new(w, parent, tree, path, attrs, entry, now)


def create_fast(w, parent_ino: int, name: bytes, mode: int, flags: int, caller: Caller):
    """:func:`create` on the trio thread, never blocking: a new name in a branch directory whose
    marker this mount knows current, right after the kernel's lookup found nothing (else None:
    then :func:`create` in a worker thread)."""
    spool = w.spool
    parent = w.inodes.peek(parent_ino)
    if spool is None or not w.empty.ready or parent is None or parent.kind != Kind.DIR or parent.tree.immutable:
        return None
    tree = parent.tree
    known = tree.markers.get(parent.path) if parent.path else (tree.stamp, None)
    if known is None or not tree.dir_current(parent.path, known[0]) or not tree.fresh(FRESH_NS):
        return None
    if paths.name_problem(name) is not None or parent.attr is None:
        return None
    try:
        path = w._child_path(parent, name)
    except FsError:
        return None  # (the worker thread says why)
    lock = w.fs.tree_lock(tree)
    if not lock.try_shared():  # a directory rename under way
        return None
    try:
        if path.rpartition(b"/")[0] != parent.path or not tree.lock.acquire(blocking=False):
            return None  # (its directory renamed meanwhile: create says so)
        try:
            if not w.fs.absent(parent, name):
                return None
            tree.names_added([(path, b"")], locked=True)
        finally:
            tree.lock.release()
        attrs = w.new_owner(parent, caller, stat.S_IFREG | stat.S_IMODE(mode))
        now = time.time_ns()
        entry = w._new_entry(attrs, now)
        if known[1] is not None:  # its directory's times move (its marker is staged with the file)
            parent.attr = replace(parent.attr, mtime_ns=now, ctime_ns=now)
        w.stats.add("creates_inline")
        return _new(w, parent, tree, path, attrs, entry, now)
    finally:
        lock.release_shared()


def _new(w, parent, tree, path: bytes, attrs: PosixAttrs, entry, now: int) -> tuple[Opened, Attr]:
    """The node and spool file of a new file whose create is staged with its first save."""
    value = entry.to_value()
    attr = w._acquire_fresh(w.fs.file_key(tree, path), Kind.FILE, tree, path, parent.ino,
                            w.rules.entry_attr(entry, tree), value, tree.stamp)
    node = w.inodes.get(attr.ino)
    # its directory's marker as it is when staged (it may change, or the file move, meanwhile)
    sf = w.spool.create(node.ino, tree.view.branch, path, entry, attrs,
                        lambda key: w._touch_parent(tree, key.rpartition(b"/")[0], now))
    sf.born = tree.view.born
    return _opened(w, node, sf, attr)


def _opened(w, node, sf, attr: Attr) -> tuple[Opened, Attr]:
    w.inodes.open(node)
    w.stats.add("creates")
    return Opened(w.fs.new_fh(SpoolHandle(node, sf, True, w.spool)), False, False), w.rules.spooled(sf, attr)


def settle_at(w, ino: int) -> None:
    """Before a write at inode ``ino``: :func:`settle` its branch (another branch's pending creates
    wait for their own reads and writes: a commit of it would otherwise publish them empty)."""
    node = w.inodes.peek(ino)
    branch = node.tree.view.branch if node is not None and node.tree is not None else None
    settle(w, branch=branch)  # (None: every branch's -- the mount root)


def settle(w, tree=None, key: bytes | None = None, parent: bytes | None = None, branch: str | None = None) -> None:
    """Stage the files created through this mount and not saved yet (:func:`create`): before
    anything that reads the branch (a lookup or listing that reaches the KV, another write, a
    control request) -- what this mount answers must hold them. Only those of ``tree`` (or of
    ``branch``: a control request of it) at ``key`` (a lookup, a file's stat) or in directory
    ``parent`` (a listing, its stat) when given. Nothing to do: no I/O. The caller holds no
    spool file's lock."""
    spool = w.spool
    if spool is None or not spool.unstaged:
        return
    for sf in spool.unstaged_files():
        node = w.inodes.peek(sf.ino)
        tree_ = node.tree if node is not None else None
        if tree_ is None or (tree is not None and tree_ is not tree) or sf.key is None or \
                (branch is not None and tree_.view.branch != branch):
            continue
        if (key is not None and sf.key != key) or (parent is not None and sf.key.rpartition(b"/")[0] != parent):
            continue
        k = sf.key
        with tree_.own_saving():
            done = sf.stage_create()
            if done is None:
                continue
            stamp, raw, entry, extra = done
            tree_.staged(stamp, raw, {k, k.rpartition(b"/")[0]} | {d.rstrip(b"/") for d, _ in extra}, None)
        w.fs.file_staged(node, entry.to_value(), stamp)
        w.stats.add("creates_settled")
