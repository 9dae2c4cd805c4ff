"""The filesystem core: what the mount shows, as plain data, without a kernel.

The mount root holds one directory per branch and tag; any other ref expression
(``main~1``, a commit-ID prefix, ``v1^2``, ``main@``) is reachable by path though
not listed. Under a ref, directories come from the ``/``-separated keys, shown by
the rule of :mod:`graveler.paths`. ``docs/SEMANTICS.md`` is the user's account of
the same rules; the tests assert each promise.

One class, :class:`Filesystem`, dispatches to small collaborators, each in its
own module:

* :mod:`lakefuse.mount.handles` -- open files (committed object, local object,
  spool file, control file, info file), each owning read / write / flush / release;
* :mod:`lakefuse.mount.special` -- the registry of ``.lakefuse`` files;
* :mod:`lakefuse.mount.listing` -- directory listing (the open directory's calls: the
  :class:`Directories` part, :mod:`lakefuse.mount.dirs`);
* :mod:`lakefuse.mount.writes` -- the write operations of branch trees (and branch
  creation at the root), only on a writable core (``writable=True``); a read-only
  core answers every write EROFS;
* :mod:`lakefuse.mount.attrs` -- the plain data handed out, and how entries become
  attributes; :mod:`lakefuse.mount.trees` -- a ref as a tree, and its rename lock;
* :mod:`lakefuse.mount.xattrs` -- the extended attributes the mount takes (``user.*``)
  and how they are kept in entry metadata (their reads: the :class:`XattrReads` part);
* :mod:`lakefuse.mount.opens` -- opening a file (the :class:`Opens` part), FUSE
  passthrough's admission in :mod:`lakefuse.mount.backing`;
* :mod:`lakefuse.mount.dircache` -- directories held in memory whole (a branch's with the
  stamp it was read at); lookups answered from them in :mod:`lakefuse.mount.listing`.

Every method is synchronous and thread-safe and may block on graveler (LMDB,
object store, table decoding): the FUSE adapter calls them through
:mod:`lakefuse.mount.offload`. Methods named ``*_fast`` (and ``pending``,
``release_pending``) never block and may run on the trio thread. Failures are
:class:`lakefuse.mount.errors.FsError`, graveler errors or a local file's OSError,
which the adapter maps through the one errno policy.

Caching: a tree of an immutable ref (commit, tag, expression) never changes, so
its nodes' attributes are computed once and the kernel is told to keep them (and
the page cache) for long. A branch tree follows the branch's change stamp: a
node's attributes are reused while the stamp is unchanged and re-read after, and
the kernel keeps them only for ``branch_timeout`` seconds.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import stat
import threading
import time

from graveler import paths
from graveler.errors import GravelerError, InvalidArgument, NotFound
from graveler.model import Entry, Value
from graveler.objects import PosixAttrs
from lakefuse.mount import control, listing, special
from lakefuse.mount.attrs import (  # noqa: F401  (the core's vocabulary, importable from here)
    DIR_MODE,
    FILE_MODE,
    XATTR_PREFIX,
    Attr,
    AttrRules,
    Caller,
    DirEntry,
    FsConfig,
    Opened,
    SetAttr,
    StatFs,
)
from lakefuse.mount.backing import Backings
from lakefuse.mount.dircache import DirCache
from lakefuse.mount.dirs import Directories
from lakefuse.mount.errors import FsError, LogOnce
from lakefuse.mount.handles import Handle
from lakefuse.mount.inodes import ROOT_INO, InodeTable, Kind, Node
from lakefuse.mount.opens import Opens
from lakefuse.mount.reads import Reads
from lakefuse.mount.special import INFO_NAME
from lakefuse.mount.stats import Stats
from lakefuse.mount.trees import FRESH_NS, Tree, TreeLocks  # noqa: F401  (FRESH_NS: importable from here)
from lakefuse.mount.xattrs import XattrReads

log = logging.getLogger(__name__)


class Filesystem(Opens, Reads, XattrReads, Directories):
    """The semantics of the mount over one repository (see the module docstring).

    ``writes``: the class of the branch-tree write operations
    (:class:`lakefuse.mount.writes.BranchWrites`, made with this core): branch trees
    then take writes (their content through ``spool``, a
    :class:`lakefuse.mount.spool.Spool`) and control files appear. Without it every
    tree is read-only, and with ``FsConfig.read_only`` branch trees are immutable too
    (frozen at their head: a refs dump's branches never move).
    :func:`lakefuse.mount.writes.WritableFilesystem` makes a writable core."""

    def __init__(self, repo, config: FsConfig | None = None, stats: Stats | None = None, data_cache=None,
                 spool=None, writes=None, space_dir: str | None = None):
        if writes is not None and config is not None and config.read_only:
            raise ValueError("a read-only core (FsConfig.read_only) takes no branch writes")
        writable = writes is not None
        self.repo = repo
        self.config = config or FsConfig()
        self.stats = stats or Stats()
        self.mountpoint: str | None = None  # where it is mounted (the daemon says), as processes see it
        self.data_cache = data_cache  # graveler.objstore.chunked.DataCache for remote stores (or None)
        self.spool = spool
        # statfs: the spool's filesystem (files being written), else the caches' (read-only), else the home's
        self.space_dir = str(spool.config.root if spool is not None else space_dir or repo.config.home)
        self.writable = writable
        self.rules = AttrRules(self.config, writable)
        self.controls = control.Controls(repo)
        self.tree_lock = TreeLocks()
        self.log_once = LogOnce(log)
        self.inodes = InodeTable()
        self.inodes.on_drop = self._dropped
        self.inodes.on_new = self._made
        self.dircache = DirCache(self.config.dir_cache_names)
        self.branch_dirs = DirCache(self.config.dir_cache_names)  # branch listings, each with its stamp
        self.listed: dict[tuple, DirEntry] = {}  # commit-tree files a plain READDIR reported (listing.numbered)
        self.started_ns = time.time_ns()
        self._trees: dict[tuple, Tree] = {}
        self._trees_lock = threading.Lock()
        self._handles: dict[int, Handle] = {}
        self._handles_lock = threading.Lock()
        self._next_fh = 1
        # (tree, dir path) -> (subdirectory count, tree.foreign when counted): see _nlink
        self._nlinks: dict[tuple, tuple[int, int]] = {}
        self._nlinks_lock = threading.Lock()
        self._nlinks_gen = 0  # bumped by every subdirs_changed: a count read across one is not kept
        self._negatives: dict[tuple[int, bytes], tuple[int, int]] = {}  # (dir ino, name) -> (stamp, when): note_absent
        self.writes = writes(self) if writable else None
        # FUSE passthrough: which inodes are bound to which object file; branch files too
        self.backings = Backings()
        self.branch_passthrough = True
        # the kernel's attributes of an inode are stale (attributes only: never blocks on its pages);
        # the FUSE adapter sets it (pyfuse3.invalidate_inode), a core without a kernel has none
        self.kernel_attrs_stale = lambda ino: None
        # a remote object's first, daemon-served open with FOPEN_DIRECT_IO when its whole file will
        # serve every later open by passthrough (see opens._cold_direct_io); set at FUSE init when
        # the kernel lets such a file be mapped shared
        self.cold_direct_io = False
        self.dio_mmap = False  # the kernel maps FOPEN_DIRECT_IO files shared (set at FUSE init)
        self._local_store = str(getattr(repo, "storage_namespace", "")).startswith("file:")
        root = self.inodes.get(ROOT_INO)
        timeout = self.config.branch_timeout
        root.attr = self.rules.dir_attr(ROOT_INO, self.started_ns, timeout, timeout)
        if writable:  # mkdir makes a branch: the kernel lets the mounting user try only in a root it may write
            root.attr.mode = stat.S_IFDIR | 0o755

    @staticmethod
    def _with_ino(attr: Attr, ino: int) -> Attr:
        attr.ino = ino  # every Attr handed in here is fresh: set in place (no copy on the hot path)
        return attr

    # ------------------------------------------------------------------ trees and nodes

    def tree(self, name: bytes) -> Tree:
        """The tree a root entry names (ENOENT for an unknown or invalid ref)."""
        try:
            ref = name.decode("utf-8")
        except UnicodeDecodeError:
            raise FsError(errno.ENOENT, f"{name!r} is not a ref") from None
        try:
            view = self.repo.view(ref)
        except (NotFound, InvalidArgument) as e:
            raise FsError(errno.ENOENT, str(e)) from None
        tree = Tree(ref, view, frozen=self.config.read_only)
        with self._trees_lock:
            return self._trees.setdefault(tree.key, tree)

    def immutable_trees(self) -> list[Tree]:
        """The commit, tag and expression trees the kernel knows now, the longest known first."""
        with self._trees_lock:
            return [t for t in self._trees.values() if t.immutable]

    def branch_trees(self) -> list[Tree]:
        """The branch trees the kernel knows now (a snapshot)."""
        with self._trees_lock:
            return [t for t in self._trees.values() if not t.immutable]

    def _made(self, nodes: list[Node]) -> None:
        with self._trees_lock:
            for node in nodes:
                tree = node.tree
                if tree is not None:
                    tree.nodes += 1
                    self._trees.setdefault(tree.key, tree)

    def _dropped(self, node: Node) -> None:
        tree = node.tree
        if tree is None:
            return
        with self._trees_lock:
            tree.nodes -= 1
            if tree.nodes <= 0 and self._trees.get(tree.key) is tree:
                del self._trees[tree.key]
                gone = True
            else:
                gone = False
        if gone:  # its entries name this Tree: a new one is made if shown again
            (self.dircache if tree.immutable else self.branch_dirs).drop_tree(tree.key)

    def acquire(self, key, kind: Kind, tree, path: bytes, parent_ino: int, attr: Attr,
                value: Value | None = None, stamp: int = 0, lookups: int = 1) -> Attr:
        if value is not None and (old := self.inodes.find(key)) is not None and old.other_object(value, self.spooled):
            self.inodes.replace(old)  # an open file replaced behind the mount: the name's new inode (revalidate)
        return self._took(self.inodes.acquire(key, kind, tree, path, parent_ino, lookups)[0], tree, attr, value, stamp)

    def _took(self, node: Node, tree, attr: Attr, value: Value | None, stamp: int) -> Attr:
        """The attributes of ``node`` just acquired, ``attr`` as read (a new node has none yet)."""
        old = node.attr
        if (old is not None and not old.uncounted and attr.uncounted
                and (tree.immutable or node.stamp == stamp)) or (
                value is not None and node.other_object(value, self.spooled)):
            return old  # a listing's directory counted already; an open file replaced (its handles' version)
        if tree is None or not tree.immutable or old is None or (old.uncounted and not attr.uncounted):
            if attr.ino and attr.ino != node.ino:  # a held listing's entry, another node's already: a copy
                attr = dataclasses.replace(attr)
            attr.ino = node.ino
            if value is not None and node.kind == Kind.FILE and tree is not None and not tree.immutable:
                # (the check above and this take are one step against an open counting meanwhile)
                if not node.take_file(attr, stamp, value, self.spooled):
                    self.inodes.replace(node)  # opened meanwhile: the name's next lookup makes its new inode
                    return old
            else:
                node.take(attr, stamp, value)  # (not over a state read at a later stamp)
        return node.attr

    @staticmethod
    def dir_key(tree: Tree, path: bytes) -> tuple:
        return ("d", tree.key, path)

    @staticmethod
    def file_key(tree: Tree, path: bytes) -> tuple:
        return ("f", tree.key, path)

    def spooled(self, ino: int):
        """The spool file of ``ino`` while it is being written (else None)."""
        return self.spool.get(ino) if self.spool is not None else None

    # ------------------------------------------------------------------ lookup / forget / getattr

    def lookup_fast(self, parent_ino: int, name: bytes) -> Attr | None:
        """:meth:`lookup` of a file in a directory whose whole listing is in memory
        (:mod:`lakefuse.mount.dircache`; a name it lacks: ENOENT, cached by the kernel for an
        immutable tree), else None: then :meth:`lookup`. A branch directory's only while the
        branch is as its listing was read (:func:`lakefuse.mount.listing.branch_held`). Never blocks."""
        parent = self.inodes.peek(parent_ino)
        if parent is None or parent.kind != Kind.DIR:
            return None
        if parent.tree.immutable:
            return listing.from_held(self, parent, name, ("lookups", "lookups_memory"))
        lock = self.tree_lock(parent.tree)
        if not lock.try_shared():  # a directory rename under way
            return None
        try:
            return listing.from_held(self, parent, name, ("lookups", "lookups_memory"))
        finally:
            lock.release_shared()

    def lookup_absent(self, parent_ino: int, name: bytes) -> bool:
        """True (never blocks) when ``name`` is surely not in branch directory ``parent_ino``
        without reading: a directory this mount made and alone changed since, its branch's
        stamp known current within :data:`FRESH_NS` (:meth:`Tree.known_absent`): the lookup is
        answered ENOENT at once (and a create that follows need not look again)."""
        parent = self.inodes.peek(parent_ino)
        if parent is None or parent.kind != Kind.DIR or parent.tree.immutable or not parent.path:
            return False
        if len(name) > paths.MAX_NAME_BYTES or name in (b".", b"..") or paths.name_problem(name) is not None:
            return False
        tree = parent.tree
        if not tree.known_absent(parent.path, name, FRESH_NS):
            return False
        self.stats.add("lookups")
        self.note_absent(parent_ino, name, tree.stamp)
        return True

    def lookup(self, parent_ino: int, name: bytes) -> Attr:
        """The attributes of ``name`` in directory ``parent_ino``; its lookup count +1."""
        parent = self.inodes.get(parent_ino)
        if parent.kind == Kind.DIR and not parent.tree.immutable:
            if name not in (b".", b".."):
                self.settle(parent.tree, key=paths.join(parent.path, name))
            with self.tree_lock(parent.tree).shared():
                attr = self._lookup(parent, name)
            if attr.ino and self.inodes.get(attr.ino).kind == Kind.FILE:
                return self.rules.spooled(self.spooled(attr.ino), attr)
            return attr
        return self._lookup(parent, name)

    def _lookup(self, parent: Node, name: bytes) -> Attr:
        self.stats.add("lookups")
        parent_ino = parent.ino
        if name == b".":
            return self._relookup(parent)
        if name == b"..":
            return self._relookup(self.inodes.get(parent.parent_ino))
        if len(name) > paths.MAX_NAME_BYTES:
            raise FsError(errno.ENAMETOOLONG, f"name of {len(name)} bytes")
        kind = parent.kind
        if kind == Kind.ROOT:
            if name == INFO_NAME:
                attr = self.rules.dir_attr(0, self.started_ns, 0.0, 0.0)
                return self.acquire(("i", None), Kind.INFO_DIR, None, b"", ROOT_INO, attr)
            tree = self.tree(name)
            stamp = tree.repin()
            attr = self._counted(self.rules.tree_dir_attr(tree, b"", tree.root_marker()), tree, b"")
            return self.acquire(self.dir_key(tree, b""), Kind.DIR, tree, b"", ROOT_INO, attr, stamp=stamp)
        if kind == Kind.INFO_DIR:
            spec = special.find(parent.tree, name, self.writable)
            if spec is None:
                raise FsError(errno.ENOENT)
            node, _ = self.inodes.acquire(spec.key(parent.tree), Kind.INFO_FILE, parent.tree, name, parent_ino)
            return self._special_attr(node)
        if kind != Kind.DIR:
            raise FsError(errno.ENOTDIR)
        tree: Tree = parent.tree
        stamp = tree.repin()
        neg = self.config.immutable_timeout if tree.immutable else 0.0
        if name == INFO_NAME:
            if parent.path:
                raise FsError(errno.ENOENT, "reserved name", neg)
            return self.acquire(("i", tree.key), Kind.INFO_DIR, tree, b"", parent_ino,
                                self.rules.dir_attr(0, tree.mtime_ns, 0.0, 0.0))
        if paths.name_problem(name) is not None:
            raise FsError(errno.ENOENT, paths.name_problem(name), neg)
        if listing.read_whole(self, parent, stamp):
            attr = listing.from_held(self, parent, name)  # the listing is in memory now
            if attr is not None:
                return attr
        path = paths.join(parent.path, name)
        st = tree.view.stat(path)
        if st.is_dir:
            if st.value is not None:
                listing.shadowed(self, tree, path)
            return self.acquire(self.dir_key(tree, path), Kind.DIR, tree, path, parent_ino,
                                self._counted(self.rules.tree_dir_attr(tree, path, st.marker), tree, path,
                                              stamp), stamp=stamp)
        if st.value is not None:
            return self.acquire(self.file_key(tree, path), Kind.FILE, tree, path, parent_ino,
                                self.rules.file_attr(st.value, tree), st.value, stamp)
        if not tree.immutable:
            self.note_absent(parent_ino, name, stamp)
        raise FsError(errno.ENOENT, "", neg)

    def note_absent(self, parent_ino: int, name: bytes, stamp: int) -> None:
        negatives = self._negatives
        if len(negatives) >= 10_000:
            negatives.clear()
        negatives[(parent_ino, name)] = (stamp, time.monotonic_ns())

    def absent(self, parent: Node, name: bytes) -> bool:
        """Whether a lookup of ``name`` in branch directory ``parent`` found nothing less than
        :data:`FRESH_NS` ago, and nothing since -- only this mount's own changes, none in
        ``parent`` (:meth:`Tree.dir_current`) -- can have made it: a create that follows the
        kernel's lookup need not look again. Forgets the lookup."""
        seen = self._negatives.pop((parent.ino, name), None)
        return (seen is not None and time.monotonic_ns() - seen[1] < FRESH_NS
                and parent.tree.dir_current(parent.path, seen[0]))

    def _relookup(self, node: Node) -> Attr:
        attr = self.getattr(node.ino)
        self.inodes.incref(node)
        return attr

    def _special_attr(self, node: Node) -> Attr:
        spec = special.find(node.tree, node.path, self.writable)
        if spec is None:
            raise FsError(errno.ENOENT)
        node.attr = self._with_ino(special.attr(self, spec, node.tree), node.ino)
        return node.attr

    def forget(self, items: list[tuple[int, int]]) -> None:
        for ino, n in items:
            self.inodes.forget(ino, n)

    def _counted(self, attr: Attr, tree: Tree | None, path: bytes, stamp: int | None = None) -> Attr:
        """``attr`` with its link count (:meth:`_nlink`; ``stamp``: a branch's, read under the tree lock)."""
        return self.rules.counted(attr, tree, self._nlink(tree, path, stamp))

    def _nlink(self, tree: Tree | None, path: bytes, stamp: int | None = None) -> int:
        """:func:`lakefuse.mount.listing.nlink`, remembered for a branch directory: a file
        created, saved or unlinked there changes no subdirectory count, so the count (a
        listing read of up to ``nlink_scan`` names, which would otherwise follow every create
        in it: the kernel asks the directory's attributes again after each) stays true until
        this mount makes or removes a subdirectory there (:meth:`subdirs_changed`) or the
        stamp watch sees a change this mount did not make (``Tree.foreign``)."""
        if tree is None or tree.immutable:
            n = self.dircache.nlink(tree.key, path) if tree is not None else None
            return listing.nlink(self, tree, path) if n is None else n
        key = (tree, path)  # the Tree itself: a branch made again is another Tree, its counts start afresh
        hit = self._nlinks.get(key)
        if hit is not None and hit[1] == tree.foreign:
            return hit[0]
        epoch, gen = tree.foreign, self._nlinks_gen
        n = listing.nlink(self, tree, path, stamp)
        with self._nlinks_lock:
            if gen == self._nlinks_gen:  # no subdirectory changed meanwhile: the count is current
                if len(self._nlinks) >= 100_000:
                    self._nlinks.clear()
                self._nlinks[key] = (n, epoch)
        return n

    def subdirs_changed(self, tree: Tree, path: bytes | None) -> None:
        """This mount made, removed or moved a subdirectory of ``path`` (called once it is
        staged): count it again. None: every directory of ``tree`` (a directory rename)."""
        with self._nlinks_lock:
            self._nlinks_gen += 1
            if path is None:
                for k in [k for k in self._nlinks if k[0] is tree]:
                    del self._nlinks[k]
            else:
                self._nlinks.pop((tree, path), None)

    def getattr_fast(self, ino: int) -> Attr | None:
        """The attributes when no I/O is needed to be sure of them (else None): an immutable
        tree's node; a branch file being written (its spool file's); a branch directory's or
        file's, read (or staged by this mount) at a stamp since which only this mount's own
        changes, none to it, came (:meth:`Tree.dir_current`), the branch's stamp known current
        within :data:`FRESH_NS` (the kernel asks a directory's attributes again after every
        create in it, a file's after every change: this answers from what was staged)."""
        node = self.inodes.get(ino)
        if node.kind == Kind.INFO_DIR:
            return node.attr
        stamp = node.stamp  # before the attributes: a writer sets them first, then their stamp
        attr = node.attr
        if node.kind in (Kind.DIR, Kind.FILE) and attr is not None:
            tree = node.tree
            if tree.immutable:
                if not attr.uncounted:
                    return attr
                n = self.dircache.nlink(tree.key, node.path)  # a listed directory: counted from memory
                if n is not None:
                    node.attr = self.rules.counted(attr, tree, n)
                    return node.attr
                return None
            if attr.uncounted:
                return None
            if node.kind == Kind.FILE:
                if not self.inodes.attached(node):
                    return None  # unlinked while open: getattr says so
                sf = self.spool.peek(ino) if self.spool is not None else None
                if sf is not None:  # being written: as its spool file says (what getattr answers)
                    return self.rules.spooled(sf, attr)
            if tree.dir_current(node.path, stamp) and tree.fresh(FRESH_NS):
                return attr
        return None

    def getattr(self, ino: int) -> Attr:
        node = self.inodes.get(ino)
        kind = node.kind
        if kind == Kind.ROOT:  # its refs are counted at each ask (the kernel keeps it branch_timeout)
            node.attr = self._counted(node.attr, None, b"")
            return node.attr
        if kind == Kind.INFO_DIR:
            return node.attr
        if kind == Kind.INFO_FILE:
            return self._special_attr(node)
        tree: Tree = node.tree
        if tree.immutable:
            return self.revalidate(node).attr
        if not self.inodes.attached(node):  # (a directory removed or renamed over while open, as a file)
            return self._detached_attr(node)
        if kind == Kind.FILE:
            sf = self.spooled(ino)
            if sf is not None:
                base = node.attr if node.attr is not None else self.revalidate(node).attr
                return self.rules.spooled(sf, base)
        with self.tree_lock(tree).shared():
            try:
                attr = self.revalidate(node).attr
            except FsError as e:  # removed behind the mount (or its branch deleted): open handles keep it
                if e.errno != errno.ENOENT or kind != Kind.FILE or node.opens == 0 or node.attr is None:
                    raise
                return self._detached_attr(node)
        return attr if self.inodes.attached(node) else self._detached_attr(node)  # (just replaced)

    def _detached_attr(self, node: Node) -> Attr:
        """A branch file (or directory) whose name went to another version or nowhere (through the mount
        or behind it): while open, what its handles see, ``nlink`` 0 (a directory's fstat after its rmdir:
        as ext4's); else ESTALE (the kernel looks it up again)."""
        if node.attr is not None and (node.opens > 0 or self.gone_dir(node)):
            if node.kind == Kind.DIR:
                return dataclasses.replace(node.attr, nlink=0)
            return dataclasses.replace(self.rules.spooled(self.spooled(node.ino), node.attr), nlink=0)
        raise FsError(errno.ESTALE, f"{node.path!r}: replaced or removed; the name is looked up again")

    @staticmethod
    def gone_dir(node: Node) -> bool:
        """A branch's directory whose branch went, its name dropped from the kernel (the stamp watch):
        only what held it reaches it (a working directory), and it is a removed directory there."""
        return node.kind == Kind.DIR and node.unnamed and not node.path

    def revalidate(self, node: Node) -> Node:
        """A branch node whose tree's stamp moved is read again (ENOENT if it is gone)."""
        tree: Tree = node.tree
        if tree.immutable:
            if node.attr is not None and node.attr.uncounted:  # a listing's directory, stat'ed now
                node.attr = self._counted(node.attr, tree, node.path)
            return node
        self.settle(tree, *((None, node.path) if node.kind == Kind.DIR else (node.path,)))  # a file; a directory's
        try:
            stamp = tree.repin()
        except NotFound:
            self.inodes.replace(node)
            raise FsError(errno.ENOENT, f"branch {tree.name!r} is gone") from None
        if node.stamp >= stamp and node.attr is not None:  # (or a later state: a save's, staged since)
            if node.attr.uncounted:
                node.attr = self._counted(node.attr, tree, node.path, stamp)
            return node
        if not node.path:
            attr = self.rules.tree_dir_attr(tree, b"", tree.root_marker())
            node.attr = self._with_ino(self._counted(attr, tree, b"", stamp), node.ino)
            node.stamp = stamp
            return node
        st = tree.view.stat(node.path)
        if node.kind == Kind.DIR and st.is_dir:
            node.take(self._with_ino(self._counted(self.rules.tree_dir_attr(tree, node.path, st.marker), tree,
                                                   node.path, stamp), node.ino), stamp)
        elif node.kind == Kind.FILE and st.value is not None and not st.is_dir:
            if not node.take_file(self._with_ino(self.rules.file_attr(st.value, tree), node.ino), stamp, st.value,
                                  self.spooled):
                self.inodes.replace(node)  # replaced behind the mount while open: as if renamed over (getattr)
                return node
        elif node.stamp <= stamp:  # (gone at a stamp later than what the node holds)
            self.inodes.replace(node)  # a new lookup makes a new inode for what is there now
            raise FsError(errno.ENOENT, f"{node.path!r} is gone from branch {tree.name!r}")
        return node

    def dir_staged(self, node: Node, touched: list, stamp: int) -> None:
        """This mount staged a change in directory ``node`` (a create, mkdir, unlink, rmdir; ``touched``: its marker
        as :meth:`BranchWrites._touch_parent` staged it, or nothing) and the stamp became ``stamp``:
        its attributes are known without a read (the kernel asks them right after)."""
        if not node.path or stamp < node.stamp:
            return  # the tree root (its attributes are computed, never read); or known newer
        marker = touched[0][1] if touched else None
        attr = self._counted(self.rules.tree_dir_attr(node.tree, node.path, marker), node.tree, node.path)
        node.attr = self._with_ino(attr, node.ino)
        node.stamp = stamp

    def readlink(self, ino: int) -> bytes:
        node = self.revalidate(self.inodes.get(ino)) if self.inodes.get(ino).kind == Kind.FILE else None
        if node is None or node.value is None:
            raise FsError(errno.EINVAL, "not a symlink")
        target = PosixAttrs.from_metadata(Entry.from_value(node.value).metadata).symlink
        if target is None:
            raise FsError(errno.EINVAL, "not a symlink")
        return target.encode()

    # ------------------------------------------------------------------ handles

    def new_fh(self, handle: Handle) -> int:
        with self._handles_lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = handle
            return fh

    def _handle(self, fh: int) -> Handle:
        h = self._handles.get(fh)
        if h is None:
            raise FsError(errno.EBADF, f"file handle {fh} is not open")
        return h

    # ------------------------------------------------------------------ files

    def write(self, fh: int, offset: int, data: bytes) -> int:
        return self._handle(fh).write(offset, data)

    def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:  # (lakefuse.mount.falloc)
        self._handle(fh).fallocate(mode, offset, length)

    def pending(self, fh: int) -> bool:
        """True when ``flush`` of ``fh`` has work to do (never blocks)."""
        return (h := self._handles.get(fh)) is not None and h.pending()

    def bulky(self, fh: int, size: int) -> bool:
        """Whether a write of ``size`` bytes to ``fh`` (0: its flush) moves many bytes: the FUSE
        adapter gives it the bulk threads (offload.BULK_WRITE_MIN). Never blocks."""
        return (h := self._handles.get(fh)) is not None and h.bulky(size)

    def flush(self, fh: int) -> None:
        """close(2): save a written file (upload + stage: visible, kept if the daemon dies) or run a control."""
        if (h := self._handles.get(fh)) is not None:
            self._saved(h, h.flush())

    def _saved(self, h, stamp: int | None) -> None:
        """A save (close, fsync) through the spool: its entry and (create) its directory's marker as staged."""
        if stamp:
            self.file_staged(h.node, h.sf.saved.to_value(), stamp, h.sf.saved)
            parent = self.inodes.peek(h.node.parent_ino) if h.sf.staged_items else None
            if parent is not None and parent.kind == Kind.DIR:
                self.dir_staged(parent, h.sf.staged_items, stamp)

    def settle(self, tree: Tree | None = None, key: bytes | None = None, parent: bytes | None = None) -> None:
        """Before a read of the branch: stage what this mount created, not saved yet (creates.settle)."""
        if self.writes is not None:
            try:
                self.writes.settle(tree, key, parent)
            except GravelerError as e:  # (the KV's disk full, its server away): a listing answers without them
                if key is not None:
                    raise  # (that very name: no answer is true but the error)
                self.log_once(logging.WARNING, ("settle", type(e)), "new files not staged before a read: %s", e)

    def removed_behind(self, node: Node, gone: bool) -> bool:
        """A change this mount did not make (the stamp watch) took the name of open file ``node``
        (``gone``), or may have discarded what a copy being written here saved: that copy is
        detached if so (:meth:`lakefuse.mount.spool.SpoolFile.removed_behind`), and the name
        then shows the branch's version, under a new inode. Whether the name is to be dropped
        from the kernel. Blocking."""
        sf = self.spool.peek(node.ino) if self.spool is not None else None
        if sf is None or (not gone and sf.saved is None):
            return gone
        if not self.spool.detach(node.ino, behind=True):
            return gone
        self.stats.add("detached_behind")
        self.inodes.replace(node)
        return True

    def file_staged(self, node: Node, value: Value, stamp: int, entry: Entry | None = None) -> bool:
        """This mount staged ``value`` for file ``node`` and the branch's stamp became ``stamp``:
        its attributes as of ``stamp`` are known without reading them back (False: the node
        holds a later state already). ``entry``: ``value`` as an Entry (then not decoded again)."""
        if stamp < node.stamp:
            return False
        rules = self.rules
        attr = rules.file_attr(value, node.tree) if entry is None else rules.entry_attr(entry, node.tree)
        return node.take(self._with_ino(attr, node.ino), stamp, value)

    def fsyncdir(self) -> None:
        """fsync(2) of a directory: every change this mount staged (unsynced KV transactions) is on disk."""
        if self.writes is not None:
            self.writes.settle()  # (strict: what is to be made durable must be staged)
            self.repo.sync()

    def fsync(self, fh: int) -> None:
        """fsync(2) / fdatasync(2): :meth:`flush`, and the file's saved content on disk."""
        if (h := self._handles.get(fh)) is not None:
            self._saved(h, h.fsync())

    def release_pending(self, fh: int) -> bool:
        """True when ``release`` of ``fh`` may block (never blocks itself)."""
        return (h := self._handles.get(fh)) is not None and h.release_pending()

    def release(self, fh: int) -> None:
        with self._handles_lock:
            h = self._handles.pop(fh, None)
        if h is None:
            return
        try:
            h.release()
        finally:
            self.backings.released(fh)
            self.inodes.close(h.node)

    # ------------------------------------------------------------------ .lakefuse/stats

    def stats_json(self) -> bytes:
        return special.stats_json(self, {"inodes": len(self.inodes), "trees": len(self._trees),
                                         "open_handles": len(self._handles),
                                         "foreign_changes": sum(t.foreign for t in self.branch_trees())})

    # ------------------------------------------------------------------ writes (lakefuse.mount.writes)

    def check_writable(self, ino: int) -> None:
        """Every write-type call asks here first: EROFS on immutable trees and in a read-only core."""
        node = self.inodes.get(ino)
        if not self.writable or (node.tree is not None and node.tree.immutable):
            self.stats.add("writes_refused")
            raise FsError(errno.EROFS, "read-only tree")

    def setxattr(self, ino: int, name: bytes, value: bytes, flags: int = 0) -> None:
        """Set a ``user.*`` attribute of a branch tree's file or directory (``flags``:
        XATTR_CREATE / XATTR_REPLACE, checked atomically here; pyfuse3 checks them with a
        getxattr before calling and passes none)."""
        self.check_writable(ino)
        self._writer().setxattr(ino, name, value, flags)

    def removexattr(self, ino: int, name: bytes) -> None:
        self.check_writable(ino)
        self._writer().setxattr(ino, name, None)

    def _writer(self):
        """The branch-tree write operations (EROFS on a read-only core)."""
        if self.writes is None:
            self.stats.add("writes_refused")
            raise FsError(errno.EROFS, "read-only tree")
        return self.writes

    def empty_entry(self) -> Entry:
        """The mount's shared empty object (uploaded once), as an entry."""
        return self._writer().empty_entry()

    def create(self, parent_ino: int, name: bytes, mode: int, flags: int, caller: Caller,
               fast: bool = False) -> tuple[Opened, Attr] | None:  # fast: no I/O, or None
        got = (self._writer().create_fast if fast else self._writer().create)(parent_ino, name, mode, flags, caller)
        if got is None:
            return None
        o, attr = got
        if (flags & os.O_ACCMODE) == os.O_WRONLY and not attr.mode & (stat.S_ISUID | stat.S_ISGID):
            # direct I/O: the kernel then sends no getxattr of security.capability before each write
            o = Opened(o.fh, o.keep_cache, True, o.backing_fd, o.noflush)  # (docs/SEMANTICS.md)
        if self.backings.hold(attr.ino):  # a cached open: no passthrough open of it meanwhile
            self.backings.opened(o.fh, attr.ino, False)
        return o, attr

    def mkdir(self, parent_ino: int, name: bytes, mode: int, caller: Caller) -> Attr:
        return self._writer().mkdir(parent_ino, name, mode, caller)

    def symlink(self, parent_ino: int, name: bytes, target: bytes, caller: Caller) -> Attr:
        return self._writer().symlink(parent_ino, name, target, caller)

    def mknod(self, parent_ino: int, name: bytes, mode: int, caller: Caller, rdev: int = 0) -> Attr:
        return self._writer().mknod(parent_ino, name, mode, caller, rdev)

    def link(self, ino: int, new_parent_ino: int, new_name: bytes) -> Attr:
        return self._writer().link(ino, new_parent_ino, new_name)

    def unlink(self, parent_ino: int, name: bytes) -> None:
        self._writer().unlink(parent_ino, name)

    def rmdir(self, parent_ino: int, name: bytes) -> None:
        self._writer().rmdir(parent_ino, name)

    def rename(self, old_parent_ino: int, old_name: bytes, new_parent_ino: int, new_name: bytes,
               flags: int) -> None:
        self._writer().rename(old_parent_ino, old_name, new_parent_ino, new_name, flags)

    def setattr_fast(self, ino: int, changes: SetAttr) -> Attr | None:
        """chmod / chown / utimens of a branch file open for writing, when it needs no I/O: the
        change goes into its spool file, saved at its last close (as :meth:`setattr` does);
        never blocks (None: then :meth:`setattr`)."""
        node = self.inodes.peek(ino)
        if (changes.size is not None or node is None or node.kind != Kind.FILE or self.writes is None
                or node.tree is None or node.tree.immutable):
            return None
        return self.writes.setattr_open(node, changes)

    def setattr(self, ino: int, changes: SetAttr, fh: int | None = None) -> Attr:
        node = self.inodes.get(ino)
        if node.kind == Kind.INFO_FILE and node.key[0] == "ic":
            if changes.size not in (None, 0) or any(
                    v is not None for v in (changes.mode, changes.uid, changes.gid, changes.mtime_ns, changes.atime_ns)):
                raise FsError(errno.EPERM, "control files only take truncation to zero")
            return self._special_attr(node)
        if changes.size is not None and node.kind == Kind.FILE:
            self.backings.wrote(node.key)
        if changes.size is not None and fh is None and self.backings.bound(ino):
            self.check_writable(ino)
            self.backings.writer_waits(node.key)  # (its retry must find the next inode unbound)
            self._stale(node)  # truncate(2) of a file read through a backing file: on a new inode
        return self._writer().setattr(ino, changes)

    def recover(self):
        """At mount start: take over spool leftovers and finish interrupted directory renames."""
        return self.writes.recover() if self.writes is not None else None

    def statfs(self) -> StatFs:
        """The space and inodes of the filesystem holding the spool and caches (a branch tree
        cannot take more), the mount's own name limit. Blocking (one statvfs)."""
        return StatFs.of(self.space_dir, paths.MAX_NAME_BYTES)
