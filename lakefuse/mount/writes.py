"""Branch operations: every write-type operation on branch trees, and branch creation.

:class:`BranchWrites` holds the write operations of branch trees (create, mkdir,
symlink, mknod, unlink, rmdir, rename, setattr, opening a file for writing) and
branch creation by ``mkdir`` at the mount root; the core
(:class:`lakefuse.mount.fs.Filesystem`) dispatches its write-type calls to it.
:func:`WritableFilesystem` makes a core with it. Commit, tag and ref-expression
trees stay immutable (EROFS). Like the core, it is synchronous, thread-safe,
returns plain data and is tested without a kernel; ``docs/SEMANTICS.md`` is the
user's account of it. Control files are :mod:`lakefuse.mount.special` and
:mod:`lakefuse.mount.control`; open files are :mod:`lakefuse.mount.handles`.

How each change reaches graveler:

* File content goes through the spool (:mod:`lakefuse.mount.spool`): written to
  local disk, uploaded and staged on close (FUSE ``flush``) and ``fsync``; close
  promises what ext4's does (visible, kept if the daemon dies), fsync also that the
  object and the staging entry are on disk.
* Every other change is staged by a KV transaction that is committed but not synced,
  as ext4 journals a metadata change without flushing it: ``fsync`` of a file or
  of a directory (FUSE ``fsyncdir``) and every commit make it durable.
* ``create`` stages the new file at once as an empty entry (pointing at the mount's
  shared empty object, :mod:`lakefuse.mount.emptyobj`), so every lookup -- another process, the
  CLI -- sees it while it is being written; its content is staged on close.
* ``mkdir`` stages a directory marker ``<dir>/`` (the shared empty object, the
  directory's POSIX attributes in its metadata); ``symlink`` stages an empty
  entry whose metadata holds the target. Neither writes an object.
* ``unlink`` / ``rmdir`` stage tombstones. A directory that would vanish because
  its last entry went away (a directory that only existed through the keys under
  it) gets a marker in the same transaction, so it stays, as POSIX says.
* ``rename`` (:mod:`lakefuse.mount.renames`) restages entries under their new names (:mod:`graveler.tree`): no
  data is copied. A directory rename runs in bounded transactions while holding
  its branch tree's lock exclusively, so no reader of the mount sees half of it;
  an intent record in the spool lets the next mount finish one a crash cut short.
* ``chmod`` / ``chown`` / ``utimens`` restage the entry (or the directory's
  marker) with new ``lakefuse-posix-*`` metadata, same object; ``setxattr`` /
  ``removexattr`` likewise with ``lakefuse-xattr-*`` keys (:mod:`lakefuse.mount.xattrs`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from graveler import paths
from graveler.errors import GravelerError, NotFound
from graveler.fences import rename_fence
from graveler.model import Entry, Value
from graveler.objects import POSIX_MTIME, PosixAttrs, user_metadata
from graveler.staging import MAX_PATH_BYTES
from graveler.tree import rename_prefix
from lakefuse.mount import creates, renames, unnamed, xattrs
from lakefuse.mount.attrs import (
    BRANCH_DIR_MODE,
    BRANCH_FILE_MODE,
    DEVICE_KINDS,
    SPECIAL_KINDS,
    Attr,
    Caller,
    FsConfig,
    Opened,
    SetAttr,
)
from lakefuse.mount.errors import FsError
from lakefuse.mount.emptyobj import EmptyObject
from lakefuse.mount.recovery import RecoveryRetry
from lakefuse.mount.fs import FRESH_NS, Filesystem

from lakefuse.mount.handles import SpoolHandle
from lakefuse.mount.inodes import ROOT_INO, Kind, Node
from lakefuse.mount.special import INFO_NAME
from lakefuse.mount.trees import Tree

if TYPE_CHECKING:
    from lakefuse.mount.spool import Spool

log = logging.getLogger(__name__)

RENAME_NOREPLACE = renames.RENAME_NOREPLACE
# names read past a departing one to tell whether its directory keeps an entry (BranchWrites._remains)
REMAINS_PAGE = 16
RENAME_EXCHANGE = renames.RENAME_EXCHANGE


def _dirs_of(items) -> set[bytes]:
    """The paths whose attributes staging ``items`` may change: each key's (a file's entry, a
    directory's marker ``d/``), and the directory holding it (an entry there appears or goes)."""
    out = set()
    for key, _ in items:
        key = key.rstrip(b"/")
        out.add(key)
        out.add(key.rpartition(b"/")[0])
    return out


class BranchWrites:
    """The write operations of branch trees, for one :class:`lakefuse.mount.fs.Filesystem`
    (see the module docstring); the core dispatches its write-type calls here."""

    def __init__(self, fs: "Filesystem"):
        self.fs = fs
        self.repo = fs.repo
        self.config = fs.config
        self.stats = fs.stats
        self.spool = fs.spool
        self.inodes = fs.inodes
        self.rules = fs.rules
        self.empty = EmptyObject(self.repo)
        self.recovery = RecoveryRetry(self.recover)  # leftovers the store could not take at start, again
        # one attribute change of an inode at a time (each rewrites its entry's metadata); striped by inode
        self._xattr_locks = [threading.Lock() for _ in range(64)]
        # directory marker key -> (the value _touch_parent made last, its entry, POSIX and user
        # metadata): the next change in that directory starts from them without decoding again
        self._marker_parts: dict[bytes, tuple] = {}
        if self.spool is not None:
            # a file whose save failed keeps its inode (its content readable through the mount)
            # until a retry saves it; a commit first retries its branch's failed saves
            self.spool.pin = self._pin
            fs.controls.before_commit = self.spool.check_saved
            fs.controls.before_request = self.settle

    def _pin(self, ino: int, held: bool) -> None:
        try:
            node = self.inodes.get(ino)
        except FsError:
            return
        if held:
            self.inodes.open(node)
        else:
            self.inodes.close(node)

    # ------------------------------------------------------------------ helpers

    def _branch_node(self, ino: int, kinds=(Kind.DIR,)) -> Node:
        """The node ``ino`` of a branch tree (EROFS on immutable trees)."""
        node = self.inodes.get(ino)
        if node.kind == Kind.ROOT:
            raise FsError(errno.EPERM, "the mount root holds refs: make a branch with mkdir")
        if node.tree is not None and node.tree.immutable:  # its .lakefuse too: every write there is EROFS
            self.stats.add("writes_refused")
            raise FsError(errno.EROFS, f"{node.tree.name!r} is not a branch: its tree is read-only")
        if node.tree is None or node.kind in (Kind.INFO_DIR, Kind.INFO_FILE):
            raise FsError(errno.EPERM, "the .lakefuse directory is managed by the mount")
        if node.kind not in kinds:
            raise FsError(errno.ENOTDIR if Kind.DIR in kinds else errno.EISDIR)
        return node

    def _named(self, node: Node) -> None:
        """A change of file ``node`` that no spool file holds is staged at its name: ESTALE if the
        name went to another inode (renamed over, replaced behind the mount, or given a new one
        for a writer while readers read the old through the kernel). A stale dentry brings
        truncate(2), chmod(2), utimensat(2) here; their retry looks the name up again. Staging
        the old inode's version there would put an older file back over the newer."""
        if not self.inodes.attached(node):
            self.stats.add("changes_stale")
            self.fs.backings.writer_waits(node.key)  # (the retry's inode must take it: not bound meanwhile)
            raise FsError(errno.ESTALE, f"{node.path!r}: the name has another inode now; it is looked up again")

    def _unmoved(self, parent: Node, path: bytes) -> None:
        """(Under the tree lock.) ``path``, made from directory ``parent``'s path before the lock, is
        still there: a directory rename that moved ``parent`` meanwhile would have the change land
        at the old name -- the renamed directory coming back there. ESTALE then: the kernel looks
        the names up again and repeats the call (create, mkdir, unlink, rmdir, rename, ...)."""
        if path.rpartition(b"/")[0] != parent.path:
            self.stats.add("changes_stale")
            raise FsError(errno.ESTALE, "a directory on the path was renamed meanwhile; it is looked up again")

    @staticmethod
    def _branch(node: Node) -> str:
        return node.tree.view.branch

    def _child_path(self, parent: Node, name: bytes, room: int = 0) -> bytes:
        """``name``'s path in directory ``parent``, checked; ``room``: bytes its key needs past
        the path (1 for a new directory: its marker's ``/``)."""
        if len(name) > paths.MAX_NAME_BYTES:
            raise FsError(errno.ENAMETOOLONG, f"name of {len(name)} bytes")
        if name in paths.RESERVED_NAMES:
            raise FsError(errno.EPERM, f"{name.decode()!r} is reserved for the mount's control files")
        why = paths.name_problem(name)
        if why is not None:
            raise FsError(errno.EINVAL, why)
        path = paths.join(parent.path, name)
        if len(path) + room > MAX_PATH_BYTES:
            raise FsError(errno.ENAMETOOLONG, f"path of {len(path)} bytes (at most {MAX_PATH_BYTES - room}"
                                              f"{' for a directory' if room else ''})")
        try:
            path.decode("utf-8")
        except UnicodeDecodeError:
            raise FsError(errno.EINVAL, "names must be UTF-8") from None
        return path

    def empty_entry(self) -> Entry:
        """The mount's shared empty object, as an entry (:mod:`lakefuse.mount.emptyobj`)."""
        return self.empty.entry()

    def _new_entry(self, attrs: PosixAttrs, now: int | None = None) -> Entry:
        e = self.empty_entry()  # (built directly: dataclasses.replace costs more than the rest of this)
        return Entry(e.address, e.size, e.etag, now or time.time_ns(), attrs.to_metadata(), e.address_type,
                     e.content_type)

    @staticmethod
    def _stat(tree: Tree, path: bytes):
        # no repin first: a view re-pins by itself when the branch record moved under it
        # (graveler.core.RepoCore.pinned), and the staging that follows updates the stamp
        return tree.view.stat(path)

    @staticmethod
    def _eexist(tree: Tree) -> FsError:
        """EEXIST for a name this mount found there on reading the branch: the branch's stamp is
        read again first. Another host made the name since this mount last looked; what this mount
        remembers of the directory (:meth:`Tree.known_absent`, answered without a read) must not
        say it is absent the next moment -- ``mkdir -p`` on two hosts at once got EEXIST, then
        ENOENT from the same mount for up to 50 ms, and failed."""
        tree.repin()
        return FsError(errno.EEXIST)

    @staticmethod
    def _remains(tree: Tree, parent_path: bytes, leaving: frozenset[bytes]) -> bool:
        """Whether directory ``parent_path`` (no marker) keeps an entry once ``leaving`` (keys; a
        directory's ``name/``) go. First its witness (:attr:`Tree.witnesses`), if it is not leaving
        and one point read finds it still there; else the names after the last one leaving, then
        (none there) its first names; the last found that stays is the next witness. (Read from its
        start at every unlink, a directory emptied in key order, as ``rm -rf`` and ``rsync
        --delete`` do, was read past every name gone before: quadratic in its size. Now either
        order reads a few names per unlink.)"""
        w = tree.witnesses.get(parent_path)
        if w is not None and w not in leaving and not any(w.startswith(k) for k in leaving if k.endswith(b"/")):
            if tree.view.get(w) is not None:
                return True
        for after in (max(leaving), b""):
            page = tree.view.list_page(parent_path + b"/", after, len(leaving) + REMAINS_PAGE)
            left = [it for it in page if it.path not in leaving and it.path.rstrip(b"/") + b"/" not in leaving]
            if left:
                tree.witness(parent_path, left)
                return True
        return False

    def _touch_parent(self, tree: Tree, parent_path: bytes, now: int,
                      leaving: frozenset[bytes] = frozenset()) -> list[tuple[bytes, Value]]:
        """What to stage, in the same transaction as a change in directory ``parent_path``:
        its marker with mtime/ctime ``now`` if it has one (made with mkdir, or kept
        before); a new marker if the change takes its last entries away (``leaving``), so
        the directory stays, as POSIX says. A directory that only exists through the keys
        under it gets no marker while it has entries. The tree root has no marker (its
        times are the head commit's)."""
        if not parent_path:
            return []
        key = parent_path + b"/"
        known = tree.markers.get(parent_path) if not leaving else None
        if known is not None and tree.dir_current(parent_path, known[0]) and tree.fresh(FRESH_NS):
            cur = known[1]  # as this mount staged it last, nothing changed it since: no read
            if cur is None:
                return []
        else:
            cur = tree.view.get(key)
        if cur is not None:
            parts = self._marker_parts.get(key)
            if parts is not None and parts[0] == cur:  # the marker this mount made last: decoded already
                _, e, pa, md = parts
                md = dict(md)
            else:
                e = Entry.from_value(cur)
                pa = PosixAttrs.from_metadata(e.metadata)
                md = user_metadata(e.metadata)
        else:
            if not leaving or self._remains(tree, parent_path, leaving):
                return []  # entries remain: the directory stays without a marker
            e = self.empty_entry()
            pa = PosixAttrs(mode=stat.S_IFDIR | BRANCH_DIR_MODE, uid=self.config.uid, gid=self.config.gid)
            md = {}
        user = dict(md)
        pa = PosixAttrs(pa.mode, pa.uid, pa.gid, pa.symlink, now, pa.atime_ns, pa.rdev)
        md.update(pa.to_metadata())
        e = Entry(e.address, e.size, e.etag, now, md, e.address_type, e.content_type)
        value = e.to_value()
        parts = self._marker_parts
        if len(parts) >= 1024:
            parts.clear()
        parts[key] = (value, e, pa, user)
        self.rules.marker_made(value, e, pa)
        return [(key, value)]

    def settle(self, tree: Tree | None = None, key: bytes | None = None, parent: bytes | None = None,
               branch: str | None = None) -> None:
        """:func:`lakefuse.mount.creates.settle`: stage the pending creates a read needs."""
        creates.settle(self, tree, key, parent, branch)

    def _stage(self, tree: Tree, items, durable: bool = False, expected: dict | None = None) -> int | None:
        """Stage ``items`` (one stamp bump); the branch's stamp after it. ``expected`` (path ->
        identity or None): only if the branch still shows those there (None returned if not)."""
        with tree.own_saving():
            if expected is None:
                _, stamp, raw = self.repo.stage_stamped(tree.view.branch, items, durable)
            else:
                got = self.repo.stage_stamped_if(tree.view.branch, items, expected, durable)
                if got is None:
                    return None
                _, stamp, raw = got
            return tree.staged(stamp, raw, _dirs_of(items), items)

    # ------------------------------------------------------------------ open for writing

    def open_spooled(self, node: Node, flags: int, writing: bool, uid: int | None = None) -> Opened:
        tree: Tree = node.tree
        # (held at once if there is one: a spool file looked at, then opened, may be dropped between
        # -- its last handle's save -- and a new one would start from nothing: a hole, saved)
        sf = self.spool.hold(node.ino)
        if sf is None:
            with self.fs.tree_lock(tree).shared():
                node = self.fs.revalidate(node)
            self._named(node)  # (a writer's saves go to the name: never from an older version's inode)
            entry = Entry.from_value(node.value)
            pa = PosixAttrs.from_metadata(entry.metadata)
            if pa.symlink is not None:
                raise FsError(errno.ELOOP, "a symlink")
            sf = self.spool.open(node.ino, tree.view.branch, node.path, entry, self._attrs_for(node, pa))
            sf.born = tree.view.born  # (its saves go to this branch, never to a later one of its name)
        try:
            if flags & os.O_TRUNC and writing:
                sf.truncate(0)
                if uid not in (None, 0) and self._kill_setid(sf):
                    node.stamp = -1  # (its mode changed: read again once saved)
                    self.fs.kernel_attrs_stale(node.ino)
        except BaseException:
            self.spool.release(node.ino)
            raise
        self.inodes.open(node)
        self.stats.add("opens")
        # a reader of a file another handle writes skips the page cache (FOPEN_DIRECT_IO, where the
        # kernel still maps such files shared): the kernel pads a page it reads past the daemon's end
        # with zeros and keeps it, and a write in flight then extends the size over those zeros. Nor
        # does its open drop the inode's pages (FOPEN_KEEP_CACHE): a write in flight has put its bytes
        # there, not yet in the daemon, and a cached reader would read that page again too early.
        direct = not writing and self.fs.dio_mmap
        return Opened(self.fs.new_fh(SpoolHandle(node, sf, writing, self.spool)), direct, direct)

    def _kill_setid(self, sf) -> bool:
        """A truncation by ``open(O_TRUNC)`` of a caller without CAP_FSETID clears the file's set-user-ID
        bit, and its set-group-ID bit if group-executable, as ext4's (``should_remove_suid``): the
        kernel does it for ftruncate and writes, but leaves an atomic ``O_TRUNC`` open to the daemon.
        (uid 0 stands for the capability.) Whether anything changed."""
        with sf.lock:
            m = sf.attrs.mode
            if m is None:
                return False
            kill = (stat.S_ISUID if m & stat.S_ISUID else 0) | \
                (stat.S_ISGID if m & (stat.S_ISGID | stat.S_IXGRP) == stat.S_ISGID | stat.S_IXGRP else 0)
            if kill:
                self._apply_attrs(sf, SetAttr(mode=m & ~kill))
            return bool(kill)

    def _attrs_for(self, node: Node, pa: PosixAttrs | None) -> PosixAttrs:
        a = node.attr
        if pa is None:
            pa = PosixAttrs()
        return PosixAttrs(
            mode=pa.mode if pa.mode is not None else (a.mode if a is not None else stat.S_IFREG | BRANCH_FILE_MODE),
            uid=pa.uid if pa.uid is not None else (a.uid if a is not None else self.config.uid),
            gid=pa.gid if pa.gid is not None else (a.gid if a is not None else self.config.gid),
            mtime_ns=pa.mtime_ns,
            atime_ns=pa.atime_ns,  # (a set atime stays: `touch -m` through a descriptor moved it to the mtime)
        )

    # ------------------------------------------------------------------ create / mkdir / symlink / mknod

    def create(self, parent_ino: int, name: bytes, mode: int, flags: int, caller: Caller) -> tuple[Opened, Attr]:
        return creates.create(self, parent_ino, name, mode, flags, caller)

    def create_fast(self, parent_ino: int, name: bytes, mode: int, flags: int, caller: Caller):
        return creates.create_fast(self, parent_ino, name, mode, flags, caller)

    def _acquire_fresh(self, key, kind: Kind, tree, path: bytes, parent_ino: int, attr: Attr,
                       value: Value | None, stamp: int) -> Attr:
        """The node for ``key`` with these attributes (a stale node of the key is replaced)."""
        old = self.inodes.find(key)
        if old is not None and old.kind != kind:
            self.inodes.replace(old)
        node, _ = self.inodes.acquire(key, kind, tree, path, parent_ino)
        attr.ino = node.ino  # (every caller hands in attributes made for this call)
        node.take(attr, stamp, value)
        return node.attr

    @staticmethod
    def new_owner(parent: Node, caller: Caller, mode: int) -> PosixAttrs:
        """The mode, owner and group of a new entry of ``parent`` made by ``caller``, as Linux
        gives them (``inode_init_owner``): in a set-group-ID directory the directory's group,
        and a new subdirectory keeps the bit; a set-group-ID file made there group-executable by
        someone outside that group (whose primary group is another, unless root) loses it
        (``mode_strip_sgid``: without group-exec the bit marks mandatory locking, and stays)."""
        pa = parent.attr
        if pa is None or not pa.mode & stat.S_ISGID:
            return PosixAttrs(mode=mode, uid=caller.uid, gid=caller.gid)
        if stat.S_ISDIR(mode):
            mode |= stat.S_ISGID
        elif mode & (stat.S_ISGID | stat.S_IXGRP) == stat.S_ISGID | stat.S_IXGRP and caller.uid != 0 \
                and caller.gid != pa.gid:
            mode &= ~stat.S_ISGID
        return PosixAttrs(mode=mode, uid=caller.uid, gid=pa.gid)

    def mkdir(self, parent_ino: int, name: bytes, mode: int, caller: Caller) -> Attr:
        creates.settle_at(self, parent_ino)
        parent = self.inodes.get(parent_ino)
        if parent.kind == Kind.ROOT:
            return self._mkdir_branch(name)
        parent = self._branch_node(parent_ino)
        path = self._child_path(parent, name, room=1)
        tree: Tree = parent.tree
        attrs = self.new_owner(parent, caller, stat.S_IFDIR | stat.S_IMODE(mode))
        now = time.time_ns()
        entry = self._new_entry(attrs, now)
        with self.fs.tree_lock(tree).shared():
            self._unmoved(parent, path)
            st = self._stat(tree, path)
            if st.exists:
                raise self._eexist(tree)
            touched = self._touch_parent(tree, parent.path, now)
            stamp = self._stage(tree, [(path + b"/", entry.to_value())] + touched)
            tree.made_dir(path, stamp)
            self.fs.subdirs_changed(tree, parent.path)
            self.fs.dir_staged(parent, touched, stamp)
            attr = self.rules.tree_dir_attr(tree, path, entry.to_value())
            attr = self._acquire_fresh(self.fs.dir_key(tree, path), Kind.DIR, tree, path, parent_ino, attr,
                                       None, tree.stamp)
        self.stats.add("mkdirs")
        return attr

    def _mkdir_branch(self, name: bytes) -> Attr:
        try:
            branch = name.decode("utf-8")
        except UnicodeDecodeError:
            raise FsError(errno.EINVAL, "branch names are UTF-8") from None
        if name == INFO_NAME:
            raise FsError(errno.EEXIST)
        self.repo.create_branch(branch)  # AlreadyExists -> EEXIST, a bad name -> EINVAL
        log.info("%s: branch %s created through mkdir at the mount root", self.repo.name, branch)
        return self.fs.lookup(ROOT_INO, name)

    def symlink(self, parent_ino: int, name: bytes, target: bytes, caller: Caller) -> Attr:
        parent = self._branch_node(parent_ino)
        path = self._child_path(parent, name)
        try:
            text = target.decode("utf-8")
        except UnicodeDecodeError:
            raise FsError(errno.EINVAL, "symlink targets must be UTF-8") from None
        if not text or "\0" in text:
            raise FsError(errno.ENOENT if not text else errno.EINVAL)
        attrs = replace(self.new_owner(parent, caller, stat.S_IFLNK | 0o777), symlink=text)
        return self._make_special(parent, path, attrs)

    def _make_special(self, parent: Node, path: bytes, attrs: PosixAttrs) -> Attr:
        """A symlink, FIFO, socket or device: an entry of the shared empty object, kind in its metadata."""
        creates.settle_at(self, parent.ino)
        tree: Tree = parent.tree
        now = time.time_ns()
        entry = self._new_entry(attrs, now)
        with self.fs.tree_lock(tree).shared():
            self._unmoved(parent, path)
            if self._stat(tree, path).exists:
                raise self._eexist(tree)
            self._stage(tree, [(path, entry.to_value())] + self._touch_parent(tree, parent.path, now))
            attr = self.rules.file_attr(entry.to_value(), tree)
            return self._acquire_fresh(self.fs.file_key(tree, path), Kind.FILE, tree, path, parent.ino, attr,
                                       entry.to_value(), tree.stamp)

    def mknod(self, parent_ino: int, name: bytes, mode: int, caller: Caller, rdev: int = 0) -> Attr:
        """A regular file is created empty; a FIFO, a socket or a character or block device
        is kept as an entry (like a symlink), a device's ``rdev`` in its metadata. Opening a
        device is the kernel's business (the mount is ``nodev`` unless asked otherwise)."""
        parent = self._branch_node(parent_ino)
        kind = stat.S_IFMT(mode)
        if kind in (0, stat.S_IFREG):
            opened, attr = self.create(parent_ino, name, stat.S_IFREG | stat.S_IMODE(mode), os.O_EXCL, caller)
            self.fs.release(opened.fh)
            return attr
        if kind not in SPECIAL_KINDS:
            raise FsError(errno.EINVAL, f"mknod of file type {kind:#o}")
        path = self._child_path(parent, name)
        attrs = self.new_owner(parent, caller, kind | stat.S_IMODE(mode))
        return self._make_special(parent, path, replace(attrs, rdev=rdev if kind in DEVICE_KINDS else None))

    def link(self, ino: int, new_parent_ino: int, new_name: bytes) -> Attr:
        self._branch_node(new_parent_ino)
        raise FsError(errno.EPERM, "hard links are not supported")

    # ------------------------------------------------------------------ unlink / rmdir

    def unlink(self, parent_ino: int, name: bytes) -> None:
        creates.settle_at(self, parent_ino)
        parent = self._branch_node(parent_ino)
        if name in paths.RESERVED_NAMES:
            raise FsError(errno.EPERM if parent.path else errno.EISDIR)
        path = self._child_path(parent, name)
        tree: Tree = parent.tree
        with self.fs.tree_lock(tree).shared():
            self._unmoved(parent, path)
            st = self._stat(tree, path)
            if st.is_dir:
                raise FsError(errno.EISDIR)
            if st.value is None:
                raise FsError(errno.ENOENT)
            touched = self._touch_parent(tree, parent.path, time.time_ns(), frozenset({path}))
            stamp = self._stage(tree, [(path, None)] + touched)
            self.fs.dir_staged(parent, touched, stamp)  # (the kernel asks for them right after)
            self._forget_path(tree, path, Kind.FILE)
        self.stats.add("unlinks")

    def _forget_path(self, tree: Tree, path: bytes, kind: Kind, renamed_over: bool = False) -> None:
        key = self.fs.file_key(tree, path) if kind == Kind.FILE else self.fs.dir_key(tree, path)
        node = self.inodes.find(key)
        if node is not None:
            self.inodes.replace(node)
            node.renamed_over = renamed_over
            node.unnamed = True
            if node.attr is not None:  # its link count went: its ctime moves (open handles fstat it)
                node.attr = replace(node.attr, ctime_ns=time.time_ns())
            if kind == Kind.FILE and self.spool is not None:
                self.spool.detach(node.ino)

    def rmdir(self, parent_ino: int, name: bytes) -> None:
        creates.settle_at(self, parent_ino)
        parent = self.inodes.get(parent_ino)
        if parent.kind == Kind.ROOT:
            raise FsError(errno.EPERM, "deleting a branch stays with the CLI (lakefuse branch delete)")
        parent = self._branch_node(parent_ino)
        if name in paths.RESERVED_NAMES:
            raise FsError(errno.EPERM)
        path = self._child_path(parent, name)
        tree: Tree = parent.tree
        marker = path + b"/"
        with self.fs.tree_lock(tree).shared():
            self._unmoved(parent, path)
            st = self._stat(tree, path)
            if not st.is_dir:
                raise FsError(errno.ENOTDIR if st.value is not None else errno.ENOENT)
            page = tree.view.list_page(marker, b"", 2)
            if any(it.path != marker for it in page):
                raise FsError(errno.ENOTEMPTY)
            if st.value is not None:  # gone, the directory would show the object it hides at its name
                raise FsError(errno.ENOTEMPTY, f"{path.decode('utf-8', 'replace')!r} hides an object of its own "
                                               "name: remove it with the CLI, or rename the directory (it goes along)")
            touched = self._touch_parent(tree, parent.path, time.time_ns(), frozenset({marker}))
            stamp = self._stage(tree, [(marker, None)] + touched)
            self.fs.subdirs_changed(tree, parent.path)
            self.fs.dir_staged(parent, touched, stamp)
            self._forget_path(tree, path, Kind.DIR)
        self.stats.add("rmdirs")

    # ------------------------------------------------------------------ rename (lakefuse.mount.renames)

    def rename(self, old_parent_ino: int, old_name: bytes, new_parent_ino: int, new_name: bytes,
               flags: int) -> None:
        renames.rename(self, old_parent_ino, old_name, new_parent_ino, new_name, flags)

    # ------------------------------------------------------------------ setattr

    def setattr(self, ino: int, changes: SetAttr) -> Attr:
        creates.settle_at(self, ino)
        node = self.inodes.get(ino)
        if unnamed.holds(self, node) and changes.size is None:
            return unnamed.setattr(self, node, changes)
        if node.kind == Kind.DIR:
            node = self._branch_node(ino, (Kind.DIR,))
            return self._setattr_dir(node, changes)
        node = self._branch_node(ino, (Kind.FILE,))
        tree: Tree = node.tree
        sf = self.spool.hold(ino)  # an open file: change it through its spool (saved at its last close)
        if sf is None:
            self._named(node)
        if sf is None and changes.size is not None:
            with self.fs.tree_lock(tree).shared():
                node = self.fs.revalidate(node)
            self._named(node)  # (the read may find the name given to another inode meanwhile)
            e = Entry.from_value(node.value)
            sf = self.spool.open(ino, tree.view.branch, node.path, e,
                                 self._attrs_for(node, PosixAttrs.from_metadata(e.metadata)))
            sf.born = tree.view.born
        if sf is not None:
            try:
                if changes.size is not None:
                    sf.truncate(changes.size)
                self._apply_attrs(sf, changes)
                if (not sf.loaded or sf.handles == 1) and sf.flush() is not None:
                    self._took_save(node, sf)  # nothing else will save it soon: truncate(2)/chmod(2) return once saved
            finally:
                self.spool.release(ino)
            return self._fresh_attr(node)
        with self.fs.tree_lock(tree).shared():
            if not (node.value is not None and node.attr is not None and tree.dir_current(node.path, node.stamp)
                    and tree.fresh(FRESH_NS)):  # (what this mount staged there last is what it holds)
                node = self.fs.revalidate(node)
                self._named(node)
            e = Entry.from_value(node.value)
            pa = PosixAttrs.from_metadata(e.metadata)
            cur = node.attr
            new = PosixAttrs(
                mode=(stat.S_IFMT(cur.mode) | stat.S_IMODE(changes.mode)) if changes.mode is not None else cur.mode,
                uid=changes.uid if changes.uid is not None else cur.uid,
                gid=changes.gid if changes.gid is not None else cur.gid,
                symlink=pa.symlink,
                mtime_ns=changes.mtime_ns if changes.mtime_ns is not None else cur.mtime_ns,
                atime_ns=changes.atime_ns if changes.atime_ns is not None else pa.atime_ns,
                rdev=pa.rdev,
            )
            md = user_metadata(e.metadata)
            md.update(new.to_metadata())
            value = replace(e, metadata=md, last_modified_ns=time.time_ns()).to_value()
            stamp = self._stage(tree, [(node.path, value)])
            if self.fs.file_staged(node, value, stamp):
                return node.attr
        return self._fresh_attr(node)

    def setattr_open(self, node: Node, changes: SetAttr) -> Attr | None:
        """:meth:`setattr` of a file open for writing by a handle that saves it at its close,
        without waiting: None when that cannot be done at once (not open so, or its spool file
        busy: a save under way). A new file whose create is still to be staged (with its first
        save: :mod:`lakefuse.mount.creates`) takes the change in memory before any write too
        (``touch``, tar's utimens/chown/chmod of an empty file): staged with it at its close."""
        sf = self.spool.peek(node.ino) if self.spool is not None else None
        if (sf is None or node.attr is None or not (sf.loaded or sf.unstaged is not None) or sf.handles < 1
                or not sf.lock.acquire(blocking=False)):
            return None
        try:
            if sf.handles < 1 or sf.key is None or not (sf.loaded or sf.unstaged is not None):
                return None
            self._apply_attrs(sf, changes)
        finally:
            sf.lock.release()
        node.stamp = -1  # read again once saved
        self.stats.add("setattrs_inline")
        return self.rules.spooled(sf, node.attr)

    def _took_save(self, node: Node, sf) -> None:
        """A save made through a spool file no handle keeps (truncate(2) by path): the inode shows
        the saved version, as its open readers see it -- the next read of the name would otherwise
        take it for a file replaced behind the mount and give the name a new inode, leaving them
        the old version (nlink 0) and the truncate's own answer the old size."""
        stamp, value = sf.stamped[0], sf.saved.to_value()
        if not (stamp and self.fs.file_staged(node, value, stamp, sf.saved)):
            node.take(node.attr, node.stamp, value)  # (the stamp unknown: read again, as this version)

    def _fresh_attr(self, node: Node) -> Attr:
        node.stamp = -1
        return self.fs.getattr(node.ino)

    @staticmethod
    def _apply_attrs(sf, changes: SetAttr) -> None:
        a = sf.attrs
        mode = a.mode
        if changes.mode is not None:
            mode = stat.S_IFREG | stat.S_IMODE(changes.mode)
        sf.set_attrs(PosixAttrs(
            mode=mode,
            uid=changes.uid if changes.uid is not None else a.uid,
            gid=changes.gid if changes.gid is not None else a.gid,
            symlink=a.symlink,
            mtime_ns=changes.mtime_ns if changes.mtime_ns is not None else a.mtime_ns,
            atime_ns=changes.atime_ns if changes.atime_ns is not None else a.atime_ns,
        ))

    def _setattr_dir(self, node: Node, changes: SetAttr) -> Attr:
        if changes.size is not None:
            raise FsError(errno.EISDIR)
        tree: Tree = node.tree
        with self.fs.tree_lock(tree).shared():
            tree.repin()
            marker = tree.view.get(node.path + b"/")  # (the root's: "/", graveler.objects.ROOT_MARKER)
            cur = self.rules.tree_dir_attr(tree, node.path, marker)
            md: dict[str, str] = {}
            e = self.empty_entry()
            old_atime = None
            if marker is not None:
                e = Entry.from_value(marker)
                md = user_metadata(e.metadata)
                old_atime = PosixAttrs.from_metadata(e.metadata).atime_ns
            new = PosixAttrs(
                mode=stat.S_IFDIR | stat.S_IMODE(changes.mode if changes.mode is not None else cur.mode),
                uid=changes.uid if changes.uid is not None else cur.uid,
                gid=changes.gid if changes.gid is not None else cur.gid,
                mtime_ns=changes.mtime_ns if changes.mtime_ns is not None else cur.mtime_ns,
                atime_ns=changes.atime_ns if changes.atime_ns is not None else old_atime,
            )
            md.update(new.to_metadata())
            self._stage(tree, [(node.path + b"/", replace(e, metadata=md, last_modified_ns=time.time_ns()).to_value())])
        return self._fresh_attr(node)

    # ------------------------------------------------------------------ extended attributes

    def setxattr(self, ino: int, name: bytes, value: bytes | None, flags: int = 0) -> None:
        """Set (``value``) or remove (None) the user attribute ``name`` of a file or
        directory: its entry (a directory's marker, made for a directory that has none) is
        restaged with the new metadata (:mod:`lakefuse.mount.xattrs`), same object; a file
        open for writing takes it through its spool file, like chmod."""
        creates.settle_at(self, ino)
        node = self._branch_node(ino, (Kind.DIR, Kind.FILE))
        xattrs.check_name(name, writing=True)
        if node.kind == Kind.FILE and node.attr is not None and not stat.S_ISREG(node.attr.mode):
            raise FsError(errno.EPERM, "user.* attributes are for regular files and directories (as Linux says)")
        tree: Tree = node.tree
        with self._xattr_locks[ino % len(self._xattr_locks)]:
            if node.kind == Kind.FILE and node.value is not None and unnamed.holds(self, node):
                unnamed.setxattr(node, name, value, flags)
                return
            if node.kind == Kind.DIR:
                with self.fs.tree_lock(tree).shared():
                    tree.repin()
                    key = node.path + b"/"
                    marker = tree.view.get(key)
                    if marker is not None:
                        e = Entry.from_value(marker)
                        md = xattrs.changed(e.metadata, name, value, flags)
                        if POSIX_MTIME not in md:  # its mtime was the marker's last_modified, which moves now
                            md[POSIX_MTIME] = str(self.rules.tree_dir_attr(tree, node.path, marker).mtime_ns)
                    else:  # a directory that exists through its keys only (or the root): it gets a marker
                        if node.path and not tree.view.stat(node.path).is_dir:
                            raise FsError(errno.ENOENT, f"{node.path!r} is gone from branch {tree.name!r}")
                        if value is None or flags & xattrs.XATTR_REPLACE:
                            raise FsError(errno.ENODATA, f"no attribute {name!r}")
                        cur = self.rules.tree_dir_attr(tree, node.path, None)
                        e = self.empty_entry()
                        md = xattrs.changed(PosixAttrs(mode=cur.mode, uid=cur.uid, gid=cur.gid,
                                                       mtime_ns=cur.mtime_ns).to_metadata(), name, value, flags)
                    self._stage(tree, [(key, replace(e, metadata=md, last_modified_ns=time.time_ns()).to_value())])
                node.stamp = -1
                return
            sf = self.spool.hold(ino) if self.spool is not None else None
            if sf is not None:
                try:
                    with sf.lock:
                        sf.set_user_metadata(xattrs.changed(sf.user_metadata, name, value, flags))
                    if not sf.loaded or sf.handles == 1:
                        sf.flush()  # nothing else will save it soon
                finally:
                    self.spool.release(ino)
                return
            with self.fs.tree_lock(tree).shared():
                node = self.fs.revalidate(node)
                self._named(node)
                e = Entry.from_value(node.value)
                md = xattrs.changed(e.metadata, name, value, flags)
                if PosixAttrs.from_metadata(e.metadata).mtime_ns is None:
                    # the entry's last_modified becomes the ctime: keep the mtime
                    md.update(PosixAttrs(mtime_ns=e.last_modified_ns).to_metadata())
                self._stage(tree, [(node.path, replace(e, metadata=md, last_modified_ns=time.time_ns()).to_value())])
            node.stamp = -1

    # ------------------------------------------------------------------ the rest

    def recover(self):
        """At mount start: take over spool leftovers (:mod:`lakefuse.mount.recovery`) and finish
        interrupted directory renames; the :class:`~lakefuse.mount.recovery.RecoveryReport`."""
        if self.spool is None:
            return
        report = self.spool.recover()
        self.recovery.after(report)
        for intent in report.intents:
            if intent.get("op") != "rename_dir":
                continue
            try:
                # a rename is half done only while its fence stands (graveler.fences): one of one
                # transaction is whole or absent, and one whose fence a branch reset or delete
                # removed was discarded -- replaying it would bring it back (onto a new branch too)
                if not rename_fence(self.repo.fence_of(intent["branch"]), intent["src"], intent["dst"]):
                    log.info("an interrupted rename %s -> %s on %s left nothing half done: not replayed",
                             intent["src"], intent["dst"], intent["branch"])
                    continue
                n = rename_prefix(self.repo, intent["branch"], intent["src"].encode(), intent["dst"].encode(),
                                  batch=renames.DIR_RENAME_BATCH)
                log.warning("finished an interrupted rename %s -> %s on %s (%d keys)",
                            intent["src"], intent["dst"], intent["branch"], n)
            except NotFound:
                pass
            except (GravelerError, KeyError) as e:
                log.error("could not finish an interrupted rename %s: %s", intent, e)
        return report


def WritableFilesystem(repo, config: FsConfig | None = None, stats=None, spool: "Spool | None" = None,
                       **kw) -> Filesystem:
    """The filesystem core with writable branch trees (its writes through ``spool``)."""
    return Filesystem(repo, config, stats, spool=spool, writes=BranchWrites, **kw)


__all__ = ["BranchWrites", "Caller", "RENAME_EXCHANGE", "RENAME_NOREPLACE", "SetAttr", "WritableFilesystem"]
