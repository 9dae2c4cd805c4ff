"""Renames in branch trees: :meth:`lakefuse.mount.writes.BranchWrites.rename`.

A rename restages entries under their new names (:mod:`graveler.tree`): no data is copied. A
file's rename is one KV transaction; a directory's runs in bounded transactions
(:data:`DIR_RENAME_BATCH` keys each) while holding its branch tree's lock exclusively, so no
reader of the mount sees half of it, and an intent record in the spool lets the next mount
finish one a crash cut short. Every change of a branch tree reads its paths from its
directories' nodes before it takes the tree lock; one that finds a directory moved meanwhile
is ``ESTALE`` (:meth:`BranchWrites._unmoved`), never staged under the old name.
"""

from __future__ import annotations

import errno
import logging
import time
from contextlib import ExitStack, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING

from graveler import paths
from graveler.errors import NotFound
from graveler.model import Entry
from graveler.objects import PosixAttrs
from graveler.staging import MAX_PATH_BYTES
from graveler.tree import rename_prefix
from lakefuse.mount import creates
from lakefuse.mount.errors import FsError
from lakefuse.mount.inodes import Kind, Node

if TYPE_CHECKING:
    from lakefuse.mount.trees import Tree

log = logging.getLogger("lakefuse.mount.writes")

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
DIR_RENAME_BATCH = 50_000  # keys per LMDB transaction of a directory rename


def rename(w, old_parent_ino: int, old_name: bytes, new_parent_ino: int, new_name: bytes,
           flags: int) -> None:
    creates.settle_at(w, old_parent_ino)  # (a rename across branches is refused below: EXDEV)
    if flags & RENAME_EXCHANGE:
        raise FsError(errno.EINVAL, "RENAME_EXCHANGE is not supported")
    if flags & ~RENAME_NOREPLACE:
        raise FsError(errno.EINVAL, f"rename flags {flags:#x} are not supported")
    op = w.inodes.get(old_parent_ino)
    np_ = w.inodes.get(new_parent_ino)
    if op.kind == Kind.ROOT or np_.kind == Kind.ROOT:
        raise FsError(errno.EPERM, "branches are not renamed through the mount")
    op = w._branch_node(old_parent_ino)
    np_ = w._branch_node(new_parent_ino)
    if op.tree.key != np_.tree.key:
        raise FsError(errno.EXDEV, "rename across refs")
    if old_name in paths.RESERVED_NAMES or new_name in paths.RESERVED_NAMES:
        raise FsError(errno.EPERM, "'.lakefuse' is reserved")
    src = w._child_path(op, old_name)
    dst = w._child_path(np_, new_name)
    tree: Tree = op.tree
    if src == dst:
        return
    with w.fs.tree_lock(tree).shared():
        w._unmoved(op, src)
        w._unmoved(np_, dst)
        s = w._stat(tree, src)
        d = w._stat(tree, dst)
        if not s.exists:
            raise FsError(errno.ENOENT)
        if d.exists and flags & RENAME_NOREPLACE:
            raise w._eexist(tree)
        if not s.is_dir:
            if d.is_dir:
                raise FsError(errno.EISDIR)
            _rename_file(w, tree, op, np_, src, dst)
            return
        if dst.startswith(src + b"/"):
            raise FsError(errno.EINVAL, "cannot move a directory into itself")
        if len(dst) + 1 > MAX_PATH_BYTES:  # (its marker's key ends in "/")
            raise FsError(errno.ENAMETOOLONG, f"path of {len(dst)} bytes (at most {MAX_PATH_BYTES - 1} "
                                              "for a directory)")
        if d.value is not None and not d.is_dir:
            raise FsError(errno.ENOTDIR)
        if d.is_dir:
            page = tree.view.list_page(dst + b"/", b"", 2)
            if any(it.path != dst + b"/" for it in page):
                raise FsError(errno.ENOTEMPTY)
    _rename_dir(w, tree, op, np_, src, dst, d.is_dir)

def _rename_file(w, tree: Tree, op: Node, np_: Node, src: bytes, dst: bytes) -> None:
    node = w.inodes.find(w.fs.file_key(tree, src))
    sf = w.spool.get(node.ino) if node is not None and w.spool is not None else None
    # an open file's save (its lock) is not under way while it moves: one that was waits
    # for it (and its entry is the one moved), the next one stages at dst
    with sf.lock if sf is not None else nullcontext():
        _rename_file_locked(w, tree, op, np_, src, dst, node, sf)

def _rename_file_locked(w, tree: Tree, op: Node, np_: Node, src: bytes, dst: bytes, node, sf) -> None:
    branch = tree.view.branch
    now = time.time_ns()
    for attempt in range(3):
        tree.repin()  # a save that was under way staged src meanwhile
        value = tree.view.get(src)
        if value is None:  # gone since the stat: another host's rename or unlink came first
            raise FsError(errno.ENOENT)
        e = Entry.from_value(value)
        pa = PosixAttrs.from_metadata(e.metadata)
        md = dict(e.metadata)
        if pa.mtime_ns is None:  # the entry's last_modified becomes the ctime: keep the mtime
            md.update(PosixAttrs(mtime_ns=e.last_modified_ns).to_metadata())
        moved = replace(e, metadata=md, last_modified_ns=now).to_value()
        items = [(dst, moved), (src, None)] + w._touch_parent(tree, op.path, now, frozenset({src}))
        if np_.path != op.path:
            items += w._touch_parent(tree, np_.path, now)
        # only if src is still what was read: of two hosts renaming one file at once, one does
        if w._stage(tree, items, expected={src: value.identity}) is not None:
            break
    else:
        raise FsError(errno.EBUSY, f"{src!r} kept changing while it was renamed; try again")
    w._forget_path(tree, dst, Kind.FILE, renamed_over=True)  # an open file replaced at dst: detached
    if node is not None:
        w.inodes.rekey(node, w.fs.file_key(tree, dst), dst)
        if sf is not None:
            sf.move(branch, dst, moved.identity)  # what the branch now shows at dst: its next save's base
    w.stats.add("renames")

def _rename_dir(w, tree: Tree, op: Node, np_: Node, src: bytes, dst: bytes, dst_exists: bool) -> None:
    branch = tree.view.branch
    with w.fs.tree_lock(tree).exclusive(), ExitStack() as saving:
        w._unmoved(op, src)  # (another directory rename may have come between the locks)
        w._unmoved(np_, dst)
        tree.forget_own()  # (the lookups answered on the trio thread take no tree lock)
        # the open files below src: no save of one is under way while the keys move (one
        # that was is waited for, and its entry moves with the rest); the next stages at dst
        below = [sf for sf in (w.spool.open_files() if w.spool is not None else ())
                 if sf.branch == branch and sf.key is not None and sf.key.startswith(src + b"/")]
        for sf in below:
            saving.enter_context(sf.lock)
        intent = None
        if w.spool is not None:
            intent = w.spool.begin_intent({"op": "rename_dir", "branch": branch,
                                              "src": src.decode(), "dst": dst.decode()})
        now = time.time_ns()
        pre = []
        if dst_exists:
            pre.append((dst + b"/", None))  # the empty target's marker (src's own moves over it)
        pre += w._touch_parent(tree, op.path, now, frozenset({src + b"/"}))
        if np_.path != op.path:
            pre += w._touch_parent(tree, np_.path, now)
        try:  # an object at the directory's own name, hidden by it, goes with it (hidden there too)
            pre += [(dst, w.repo.get_value(branch, src)), (src, None)]
        except NotFound:
            pass
        moved_keys: list[int] = []  # (pre goes with the first batch: a rename failing before it leaves no trace)
        try:
            rename_prefix(w.repo, branch, src, dst, batch=DIR_RENAME_BATCH, first=pre,
                          staged=moved_keys.append)
        except BaseException:
            if intent is not None and not sum(moved_keys):  # nothing moved: no rename for recovery to finish
                w.spool.end_intent(intent)  # (a batch of none: a rename another mount made first took them)
            elif intent is not None:
                log.error("renaming directory %r -> %r on %s failed after %d keys moved: the next mount "
                          "finishes it", src, dst, branch, sum(moved_keys))
            raise
        w.fs.subdirs_changed(tree, None)  # every directory under src moved: count them all again
        if intent is not None:
            w.spool.end_intent(intent)
        tree.repin()
        w._forget_path(tree, dst, Kind.DIR)
        moved = w.inodes.rekey_prefix(tree.key, src, dst)
        for sf in below:
            sf.move(branch, dst + sf.key[len(src):])
    log.debug("renamed directory %r -> %r on %s (%d inodes)", src, dst, branch, moved)
    w.stats.add("renames")

