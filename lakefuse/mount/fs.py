"""The filesystem core: what the mount shows, as plain data, without a kernel.

The mount root holds one directory per branch and tag; any other ref expression
(``main~1``, a commit-ID prefix, ``v1^2``, ``main@``) is reachable by path though
not listed. Under a ref, directories come from the ``/``-separated keys, shown by
the rule of :mod:`graveler.paths`. ``docs/SEMANTICS.md`` is the user's account of
the same rules; the tests assert each promise.

Every method is synchronous and thread-safe and may block on graveler (LMDB,
object store, table decoding): the FUSE adapter calls them through
:mod:`lakefuse.mount.offload`. Methods named ``*_fast`` never block and may run on
the trio thread. Results are plain data (:class:`Attr`, :class:`DirEntry`...);
failures are :class:`lakefuse.mount.errors.FsError` or graveler errors, which the
adapter maps through the one errno table.

Caching: a tree of an immutable ref (commit, tag, expression) never changes, so
its nodes' attributes are computed once and the kernel is told to keep them (and
the page cache) for long. A branch tree follows the branch's change stamp: a
node's attributes are reused while the stamp is unchanged and re-read after, and
the kernel keeps them only for ``branch_timeout`` seconds.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from graveler import paths
from graveler.errors import InvalidArgument, NotFound
from graveler.model import Entry, Value, entry_stat
from graveler.objects import POSIX_KEYS, PosixAttrs, user_metadata
from graveler.view import View
from lakefuse.mount.errors import FsError
from lakefuse.mount.inodes import ROOT_INO, InodeTable, Kind, Node
from lakefuse.mount.stats import Stats

log = logging.getLogger(__name__)

INFO_NAME = b".lakefuse"
ROOT_INFO_FILES = (b"stats",)
TREE_INFO_FILES = (b"head", b"log")
XATTR_PREFIX = b"user.lakefs."
DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444


@dataclass(frozen=True)
class FsConfig:
    """How the core shows a repository; built at the edge (the mount command)."""

    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    branch_timeout: float = 1.0  # kernel entry/attr cache of branch trees and of the root's names
    immutable_timeout: float = 3600.0  # kernel entry/attr cache of commit, tag and expression trees
    readdir_page: int = 1000  # directory entries read from graveler per call
    small_file_bytes: int = 128 * 1024  # local files up to this size are read whole at open
    sequential_chunk: int = 4 << 20  # a sequential read of a local file fetches this much at once
    log_commits: int = 100  # lines of .lakefuse/log
    extra_stats: Callable[[], dict] | None = None  # more counters for .lakefuse/stats


@dataclass(slots=True)
class Attr:
    """What ``stat`` shows, and for how long the kernel may keep it."""

    ino: int
    mode: int
    size: int = 0
    mtime_ns: int = 0
    uid: int = 0
    gid: int = 0
    nlink: int = 1
    entry_timeout: float = 0.0
    attr_timeout: float = 0.0
    atime_ns: int = 0  # 0: the mtime
    ctime_ns: int = 0  # 0: the mtime

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


@dataclass(slots=True)
class DirEntry:
    """One readdir entry before it is handed to the kernel (``accept`` makes its inode)."""

    name: bytes
    offset: int  # the offset that resumes after this entry
    key: tuple
    kind: Kind
    tree: object
    path: bytes
    value: Value | None
    attr: Attr  # ino 0 until accepted
    stamp: int


@dataclass(frozen=True, slots=True)
class Opened:
    fh: int
    keep_cache: bool
    direct_io: bool


@dataclass(frozen=True, slots=True)
class StatFs:
    block_size: int
    blocks: int
    files: int
    name_max: int


class _Tree:
    """One ref shown as a tree: a branch (live) or a commit (immutable)."""

    __slots__ = ("key", "name", "view", "immutable", "nodes", "stamp", "lock")

    def __init__(self, name: str, view: View):
        self.name = name
        self.view = view
        self.immutable = not view.is_branch
        self.key = ("tree", name, view.commit_id if self.immutable else None)
        self.nodes = 0
        self.stamp = view.change_stamp()
        self.lock = threading.Lock()

    def sync(self) -> int:
        """The current change stamp; a branch view re-pins when it moved (NotFound
        if the branch is gone). Blocking (a cheap LMDB read)."""
        if self.immutable:
            return 0
        s = self.view.change_stamp()
        if s != self.stamp:
            with self.lock:
                if s != self.stamp:
                    self.view.refresh()
                    self.stamp = s
        return s

    @property
    def mtime_ns(self) -> int:
        return int(self.view.commit.creation_date.timestamp()) * 1_000_000_000


class _DirHandle:
    __slots__ = ("node", "lock", "buf", "buf_start", "marks", "next_off", "next_after", "done", "entries")

    def __init__(self, node: Node):
        self.node = node
        self.lock = threading.Lock()
        self.buf: list[DirEntry] = []
        self.buf_start = 0
        self.marks: dict[int, bytes] = {0: b""}  # offset -> listing key to resume after
        self.next_off = 0
        self.next_after = b""
        self.done = False
        self.entries: list[DirEntry] | None = None  # a small directory held whole (root, .lakefuse)


class _FileHandle:
    __slots__ = ("node", "reader", "size", "content", "buf", "buf_off", "next_off", "lock")

    def __init__(self, node: Node, reader, size: int, content: bytes | None):
        self.node = node
        self.reader = reader
        self.size = size
        self.content = content
        self.buf = b""  # what the last sequential read fetched beyond what it was asked for
        self.buf_off = 0
        self.next_off = 0
        self.lock = threading.Lock()  # one fetch ahead at a time: concurrent reads wait for it


class _LogOnce:
    """Log a message once per key (bounded memory)."""

    def __init__(self, limit: int = 10_000):
        self._seen: set = set()
        self._limit = limit
        self._lock = threading.Lock()

    def __call__(self, level: int, key, msg: str, *args) -> None:
        with self._lock:
            if key in self._seen:
                return
            if len(self._seen) >= self._limit:
                self._seen.clear()
            self._seen.add(key)
        log.log(level, msg, *args)


class Filesystem:
    """The semantics of the mount over one repository (see the module docstring)."""

    def __init__(self, repo, config: FsConfig | None = None, stats: Stats | None = None, data_cache=None):
        self.repo = repo
        self.config = config or FsConfig()
        self.stats = stats or Stats()
        self.data_cache = data_cache  # graveler.objstore.chunked.DataCache for remote stores (or None)
        self.inodes = InodeTable()
        self.inodes.on_drop = self._dropped
        self.inodes.on_new = self._made
        self.started_ns = time.time_ns()
        self._trees: dict[tuple, _Tree] = {}
        self._trees_lock = threading.Lock()
        self._handles: dict[int, object] = {}
        self._handles_lock = threading.Lock()
        self._next_fh = 1
        self._log_once = _LogOnce()
        root = self.inodes.get(ROOT_INO)
        root.attr = self._dir_attr(ROOT_INO, self.started_ns, self.config.branch_timeout, self.config.branch_timeout)

    # ------------------------------------------------------------------ attributes

    def _dir_attr(self, ino: int, mtime_ns: int, entry_timeout: float, attr_timeout: float) -> Attr:
        c = self.config
        return Attr(ino, DIR_MODE, 0, mtime_ns, c.uid, c.gid, 2, entry_timeout, attr_timeout)

    def _timeouts(self, tree: _Tree) -> tuple[float, float]:
        t = self.config.immutable_timeout if tree.immutable else self.config.branch_timeout
        return t, t

    def _file_attr(self, value: Value, tree: _Tree) -> Attr:
        size, mtime_ns, metadata = entry_stat(value)
        c = self.config
        mode, uid, gid = FILE_MODE, c.uid, c.gid
        if metadata:
            pa = PosixAttrs.from_metadata(metadata)
            if pa.symlink is not None:
                mode, size = stat.S_IFLNK | 0o777, len(pa.symlink.encode())
            elif pa.mode is not None and stat.S_IFMT(pa.mode) in (0, stat.S_IFREG):
                mode = stat.S_IFREG | stat.S_IMODE(pa.mode)
            uid = pa.uid if pa.uid is not None else uid
            gid = pa.gid if pa.gid is not None else gid
            if pa.mtime_ns is not None:
                return Attr(0, mode, size, pa.mtime_ns, uid, gid, 1, *self._timeouts(tree))
        mtime = mtime_ns or tree.mtime_ns
        et, at = self._timeouts(tree)
        return Attr(0, mode, size, mtime, uid, gid, 1, et, at)

    def _tree_dir_attr(self, tree: _Tree, path: bytes, marker: Value | None = None) -> Attr:
        """A directory of a tree: read-only defaults, or the POSIX attributes of its
        directory marker (``path/``) when it has one."""
        et, at = self._timeouts(tree)
        if not path:
            et = self.config.branch_timeout  # the root's name -> commit mapping can change
        attr = self._dir_attr(0, tree.mtime_ns, et, at)
        if marker is not None:
            try:
                e = Entry.from_value(marker)
            except Exception:
                return attr
            pa = PosixAttrs.from_metadata(e.metadata) if e.metadata else PosixAttrs()
            if pa.mode is not None:
                attr.mode = stat.S_IFDIR | stat.S_IMODE(pa.mode)
            if pa.uid is not None:
                attr.uid = pa.uid
            if pa.gid is not None:
                attr.gid = pa.gid
            attr.mtime_ns = pa.mtime_ns if pa.mtime_ns is not None else (e.last_modified_ns or attr.mtime_ns)
        return attr

    def _info_attr(self, size: int) -> Attr:
        c = self.config
        return Attr(0, FILE_MODE, size, time.time_ns(), c.uid, c.gid, 1, 0.0, 0.0)

    @staticmethod
    def _with_ino(attr: Attr, ino: int) -> Attr:
        attr.ino = ino  # every Attr handed in here is fresh: set in place (no copy on the hot path)
        return attr

    # ------------------------------------------------------------------ trees and nodes

    def _tree(self, name: bytes) -> _Tree:
        """The tree a root entry names (ENOENT for an unknown or invalid ref)."""
        try:
            ref = name.decode("utf-8")
        except UnicodeDecodeError:
            raise FsError(errno.ENOENT, f"{name!r} is not a ref") from None
        try:
            view = self.repo.view(ref)
        except (NotFound, InvalidArgument) as e:
            raise FsError(errno.ENOENT, str(e)) from None
        tree = _Tree(ref, view)
        with self._trees_lock:
            return self._trees.setdefault(tree.key, tree)

    def _made(self, node: Node) -> None:
        tree = node.tree
        if tree is not None:
            with self._trees_lock:
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

    def _acquire(self, key, kind: Kind, tree, path: bytes, parent_ino: int, attr: Attr,
                 value: Value | None = None, stamp: int = 0, lookups: int = 1) -> Attr:
        node, new = self.inodes.acquire(key, kind, tree, path, parent_ino, lookups)
        if new or tree is None or not tree.immutable or node.attr is None:
            attr.ino = node.ino
            node.attr = attr
            node.value = value
            node.stamp = stamp
        return node.attr

    @staticmethod
    def _dir_key(tree: _Tree, path: bytes) -> tuple:
        return ("d", tree.key, path)

    @staticmethod
    def _file_key(tree: _Tree, path: bytes) -> tuple:
        return ("f", tree.key, path)

    # ------------------------------------------------------------------ lookup / forget / getattr

    def lookup(self, parent_ino: int, name: bytes) -> Attr:
        """The attributes of ``name`` in directory ``parent_ino``; its lookup count +1."""
        self.stats.add("lookups")
        parent = self.inodes.get(parent_ino)
        if name == b".":
            return self._relookup(parent)
        if name == b"..":
            return self._relookup(self.inodes.get(parent.parent_ino))
        if len(name) > paths.MAX_NAME_BYTES:
            raise FsError(errno.ENAMETOOLONG, f"name of {len(name)} bytes")
        kind = parent.kind
        if kind == Kind.ROOT:
            if name == INFO_NAME:
                attr = self._dir_attr(0, self.started_ns, 0.0, 0.0)
                return self._acquire(("i", None), Kind.INFO_DIR, None, b"", ROOT_INO, attr)
            tree = self._tree(name)
            return self._acquire(self._dir_key(tree, b""), Kind.DIR, tree, b"", ROOT_INO,
                                 self._tree_dir_attr(tree, b""), stamp=tree.stamp)
        if kind == Kind.INFO_DIR:
            names = ROOT_INFO_FILES if parent.tree is None else TREE_INFO_FILES
            if name not in names:
                raise FsError(errno.ENOENT)
            tree = parent.tree
            content = self._info_content(tree, name)
            return self._acquire(("if", tree.key if tree else None, name), Kind.INFO_FILE, tree, name,
                                 parent_ino, self._info_attr(len(content)))
        if kind != Kind.DIR:
            raise FsError(errno.ENOTDIR)
        tree: _Tree = parent.tree
        stamp = tree.sync()
        neg = self.config.immutable_timeout if tree.immutable else 0.0
        if name == INFO_NAME:
            if parent.path:
                raise FsError(errno.ENOENT, "reserved name", neg)
            return self._acquire(("i", tree.key), Kind.INFO_DIR, tree, b"", parent_ino,
                                 self._dir_attr(0, tree.mtime_ns, 0.0, 0.0))
        if paths.name_problem(name) is not None:
            raise FsError(errno.ENOENT, paths.name_problem(name), neg)
        path = paths.join(parent.path, name)
        st = tree.view.stat(path)
        if st.is_dir:
            if st.value is not None:
                self._shadowed(tree, path)
            return self._acquire(self._dir_key(tree, path), Kind.DIR, tree, path, parent_ino,
                                 self._tree_dir_attr(tree, path, st.marker), stamp=stamp)
        if st.value is not None:
            return self._acquire(self._file_key(tree, path), Kind.FILE, tree, path, parent_ino,
                                 self._file_attr(st.value, tree), st.value, stamp)
        raise FsError(errno.ENOENT, "", neg)

    def _relookup(self, node: Node) -> Attr:
        attr = self.getattr(node.ino)
        self.inodes.incref(node)
        return attr

    def _shadowed(self, tree: _Tree, path: bytes) -> None:
        self._log_once(logging.INFO, ("shadow", tree.key, path),
                       "%s/%s: the object %r is hidden by the directory of the same name",
                       self.repo.name, tree.name, path.decode("utf-8", "replace"))

    def forget(self, items: list[tuple[int, int]]) -> None:
        for ino, n in items:
            self.inodes.forget(ino, n)

    def getattr_fast(self, ino: int) -> Attr | None:
        """The attributes when no I/O is needed to be sure of them (else None)."""
        node = self.inodes.get(ino)
        if node.kind == Kind.ROOT:
            return node.attr
        if node.kind in (Kind.DIR, Kind.FILE) and node.tree.immutable and node.attr is not None:
            return node.attr
        return None

    def getattr(self, ino: int) -> Attr:
        node = self.inodes.get(ino)
        kind = node.kind
        if kind == Kind.ROOT:
            return node.attr
        if kind == Kind.INFO_DIR:
            return node.attr
        if kind == Kind.INFO_FILE:
            content = self._info_content(node.tree, node.path)
            node.attr = self._with_ino(self._info_attr(len(content)), ino)
            return node.attr
        return self._revalidate(node).attr

    def _revalidate(self, node: Node) -> Node:
        """A branch node whose tree's stamp moved is read again (ENOENT if it is gone)."""
        tree: _Tree = node.tree
        if tree.immutable:
            return node
        try:
            stamp = tree.sync()
        except NotFound:
            self.inodes.replace(node)
            raise FsError(errno.ENOENT, f"branch {tree.name!r} is gone") from None
        if node.stamp == stamp and node.attr is not None:
            return node
        if not node.path:
            node.attr = self._with_ino(self._tree_dir_attr(tree, b""), node.ino)
            node.stamp = stamp
            return node
        st = tree.view.stat(node.path)
        if node.kind == Kind.DIR and st.is_dir:
            node.attr = self._with_ino(self._tree_dir_attr(tree, node.path, st.marker), node.ino)
        elif node.kind == Kind.FILE and st.value is not None and not st.is_dir:
            node.value = st.value
            node.attr = self._with_ino(self._file_attr(st.value, tree), node.ino)
        else:
            self.inodes.replace(node)  # a new lookup makes a new inode for what is there now
            raise FsError(errno.ENOENT, f"{node.path!r} is gone from branch {tree.name!r}")
        node.stamp = stamp
        return node

    def readlink(self, ino: int) -> bytes:
        node = self._revalidate(self.inodes.get(ino)) if self.inodes.get(ino).kind == Kind.FILE else None
        if node is None or node.value is None:
            raise FsError(errno.EINVAL, "not a symlink")
        target = PosixAttrs.from_metadata(Entry.from_value(node.value).metadata).symlink
        if target is None:
            raise FsError(errno.EINVAL, "not a symlink")
        return target.encode()

    # ------------------------------------------------------------------ directories

    def _new_fh(self, handle) -> int:
        with self._handles_lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = handle
            return fh

    def _handle(self, fh: int):
        h = self._handles.get(fh)
        if h is None:
            raise FsError(errno.EBADF, f"file handle {fh} is not open")
        return h

    def opendir(self, ino: int) -> int:
        node = self.inodes.get(ino)
        if node.kind not in (Kind.ROOT, Kind.DIR, Kind.INFO_DIR):
            raise FsError(errno.ENOTDIR)
        self.inodes.open(node)
        return self._new_fh(_DirHandle(node))

    def releasedir(self, fh: int) -> None:
        with self._handles_lock:
            h = self._handles.pop(fh, None)
        if isinstance(h, _DirHandle):
            self.inodes.close(h.node)

    def readdir_fast(self, fh: int, offset: int) -> list[DirEntry] | None:
        """Entries from ``offset`` on that are already read (``[]``: the end), or None
        when :meth:`readdir_fill` must read first."""
        h = self._handle(fh)
        if h.entries is not None:
            return h.entries[offset:]
        i = offset - h.buf_start
        if 0 <= i < len(h.buf):
            return h.buf[i:]
        if i == len(h.buf) and h.done and offset == h.next_off:
            return []
        return None

    def readdir_fill(self, fh: int, offset: int) -> None:
        """Read the entries from ``offset`` on (blocking)."""
        h: _DirHandle = self._handle(fh)
        node = h.node
        with h.lock:
            if node.kind == Kind.ROOT:
                h.entries = self._root_entries()
                return
            if node.kind == Kind.INFO_DIR:
                h.entries = self._info_entries(node)
                return
            self._fill_tree_dir(h, offset)

    def _fill_tree_dir(self, h: _DirHandle, offset: int) -> None:
        node = h.node
        tree: _Tree = node.tree
        if offset == h.next_off:
            after, start = h.next_after, offset
        else:  # a seek: resume from the nearest page mark at or before offset, skip the rest
            start = max(o for o in h.marks if o <= offset)
            after = h.marks[start]
        skip = offset - start
        stamp = tree.sync()
        prefix = paths.dir_prefix(node.path)
        entries: list[DirEntry] = []
        want = skip + self.config.readdir_page
        done = False
        last = after
        while len(entries) < want and not done:
            page = tree.view.list_page(prefix, last, self.config.readdir_page)
            done = len(page) < self.config.readdir_page
            if not page:
                break
            last = page[-1].path
            entries.extend(self._page_entries(tree, node, page, done, stamp))
        # offsets: the entry at index i (counted from `start`) resumes at start + i + 1
        for i, e in enumerate(entries):
            e.offset = start + i + 1
        h.marks[start] = after
        h.buf = entries[skip:]
        h.buf_start = offset
        h.next_off = start + len(entries)
        h.next_after = last
        h.done = done
        if not h.buf and not done:  # nothing visible in what was read: keep going later
            h.done = False

    def _page_entries(self, tree: _Tree, node: Node, page, complete: bool, stamp: int) -> list[DirEntry]:
        """Visible entries of one listing page, with the path rule applied."""
        prefixes = {it.path for it in page if it.value is None}
        last = page[-1].path
        out: list[DirEntry] = []
        plen = len(node.path) + 1 if node.path else 0
        for it in page:
            key = it.path
            if it.value is None:  # a common prefix: "<dir>/<name>/"
                name = key[plen:-1]
                why = paths.name_problem(name)
                if why is not None:
                    self._hidden(tree, key, why)
                    continue
                path = key[:-1]
                marker = tree.view.get(key)  # the common prefix "d/" is also d's marker key
                out.append(DirEntry(name, 0, self._dir_key(tree, path), Kind.DIR, tree, path, None,
                                    self._tree_dir_attr(tree, path, marker), stamp))
                continue
            name = key[plen:]
            why = paths.name_problem(name)
            if why is not None:
                if name:  # an empty name is the directory's own marker ("d/"), not a hidden key
                    self._hidden(tree, key, why)
                continue
            below = key + b"/"
            if below in prefixes or (not complete and below > last and tree.view.stat(key).is_dir):
                self._shadowed(tree, key)
                continue
            try:
                attr = self._file_attr(it.value, tree)
            except Exception as e:  # a damaged entry hides that one file, not the directory
                self._log_once(logging.WARNING, ("bad", tree.key, key), "%s/%s: cannot show %r: %s",
                               self.repo.name, tree.name, key.decode("utf-8", "replace"), e)
                continue
            out.append(DirEntry(name, 0, self._file_key(tree, key), Kind.FILE, tree, key, it.value, attr, stamp))
        return out

    def _hidden(self, tree: _Tree, key: bytes, why: str) -> None:
        self._log_once(logging.INFO, ("hidden", tree.key, key), "%s/%s: key %r is not shown (%s)",
                       self.repo.name, tree.name, key.decode("utf-8", "replace"), why)

    def _root_entries(self) -> list[DirEntry]:
        names: dict[str, None] = {}
        for b in self.repo.list_branches():
            names[b.name] = None
        for t in self.repo.list_tags():
            names.setdefault(t.name, None)
        out = []
        for ref in sorted(names, key=lambda s: s.encode()):
            name = ref.encode()
            if paths.name_problem(name) is not None:
                continue
            try:
                tree = self._tree(name)
            except FsError:
                continue  # deleted meanwhile
            out.append(DirEntry(name, len(out) + 1, self._dir_key(tree, b""), Kind.DIR, tree, b"", None,
                                self._tree_dir_attr(tree, b""), tree.stamp))
        return out

    def _info_entries(self, node: Node) -> list[DirEntry]:
        tree = node.tree
        names = ROOT_INFO_FILES if tree is None else TREE_INFO_FILES
        out = []
        for name in names:
            size = len(self._info_content(tree, name))
            out.append(DirEntry(name, len(out) + 1, ("if", tree.key if tree else None, name), Kind.INFO_FILE,
                                tree, name, None, self._info_attr(size), 0))
        return out

    def accept(self, fh: int, e: DirEntry) -> Attr:
        """Make (or find) the inode of a readdir entry, lookup count +1 (never blocks).
        Call :meth:`forget` with it if the kernel refused the entry."""
        node = self._handle(fh).node
        return self._acquire(e.key, e.kind, e.tree, e.path, node.ino, e.attr, e.value, e.stamp)

    # ------------------------------------------------------------------ files

    def open(self, ino: int, flags: int) -> Opened:
        node = self.inodes.get(ino)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_APPEND):
            self.check_writable(ino)
        if node.kind == Kind.INFO_FILE:
            content = self._info_content(node.tree, node.path)
            self.inodes.open(node)
            return Opened(self._new_fh(_FileHandle(node, None, len(content), content)), False, True)
        if node.kind != Kind.FILE:
            raise FsError(errno.EISDIR)
        tree: _Tree = node.tree
        node = self._revalidate(node)
        value = node.value
        entry = Entry.from_value(value)
        reader = None
        if entry.size > 0 and not stat.S_ISLNK(node.attr.mode):
            reader = self._open_object(tree, node.path, entry)
        keep = tree.immutable or node.opened_identity == value.identity
        node.opened_identity = value.identity
        content = None
        if reader is not None and entry.size <= self.config.small_file_bytes and not hasattr(reader, "bytes_from_store"):
            # a small local file is read whole now, in the same thread call: its reads need no other
            data = reader.read(0, entry.size)
            if len(data) == entry.size:
                content = data
                self.stats.add("bytes_from_store", len(data))
        self.inodes.open(node)
        self.stats.add("opens")
        return Opened(self._new_fh(_FileHandle(node, reader, entry.size, content)), keep, False)

    def _open_object(self, tree: _Tree, path: bytes, entry: Entry):
        try:
            reader = tree.view.open(entry, self.data_cache)
        except NotFound:
            self._log_once(logging.WARNING, ("missing", entry.address),
                           "%s/%s: %r: its object %s is missing from the store",
                           self.repo.name, tree.name, path.decode("utf-8", "replace"), entry.address)
            raise FsError(errno.EIO, "object missing") from None
        if reader.size != entry.size:
            reader.close()
            self._log_once(logging.WARNING, ("size", entry.address),
                           "%s/%s: %r: its object %s has %d bytes, the entry says %d",
                           self.repo.name, tree.name, path.decode("utf-8", "replace"), entry.address,
                           reader.size, entry.size)
            raise FsError(errno.EIO, "object size differs from the entry")
        return reader

    def read_fast(self, fh: int, offset: int, size: int) -> bytes | None:
        """The bytes when they are in memory already (a small file read at open, or what a
        sequential read fetched ahead), else None."""
        h: _FileHandle = self._handle(fh)
        if h.content is not None:
            data = h.content[offset:offset + size]
            self.stats.add("bytes_read", len(data))
            return data
        buf, lo = h.buf, h.buf_off
        if buf and lo <= offset and (offset + size <= lo + len(buf) or lo + len(buf) >= h.size):
            data = buf[offset - lo:offset - lo + size]
            h.next_off = max(h.next_off, offset + len(data))
            self.stats.add("bytes_read", len(data))
            self.stats.add("reads_from_memory")
            return data
        return None

    def read(self, fh: int, offset: int, size: int) -> bytes:
        h: _FileHandle = self._handle(fh)
        if h.content is not None:
            return h.content[offset:offset + size]
        if offset >= h.size or h.reader is None:
            return b""
        n = min(size, h.size - offset)
        local = not hasattr(h.reader, "bytes_from_store")
        chunk = self.config.sequential_chunk
        if local and n * 4 < chunk and offset > 0 and abs(offset - h.next_off) <= 2 * chunk:
            # small sequential reads (the kernel's read-ahead window is small; its requests may
            # arrive slightly out of order): fetch the aligned piece around them in this one
            # thread call; the next reads are then served from memory on the trio thread
            # (read_fast). Concurrent reads wait for the fetch rather than repeat it.
            with h.lock:
                data = self.read_fast(fh, offset, n)
                if data is not None:
                    return data
                start = offset - offset % chunk
                want = min(max(offset + n - start, chunk), h.size - start)
                try:
                    piece = h.reader.read(start, want)
                except NotFound:
                    raise FsError(errno.EIO, "object missing") from None
                self.stats.add("bytes_from_store", len(piece))
                if len(piece) == want:
                    h.buf, h.buf_off = piece, start
                    data = piece[offset - start:offset - start + n]
                    h.next_off = max(h.next_off, offset + len(data))
                    self.stats.add("bytes_read", len(data))
                    return data
        try:
            data = h.reader.read(offset, n)
        except NotFound:
            raise FsError(errno.EIO, "object missing") from None
        if local:  # a local object file: every byte is from the store
            self.stats.add("bytes_from_store", len(data))
        h.next_off = offset + len(data)
        self.stats.add("bytes_read", len(data))
        if len(data) < n:
            self._log_once(logging.WARNING, ("short", h.reader.key),
                           "%s: object %s ended at %d bytes, the entry says %d",
                           self.repo.name, h.reader.key, offset + len(data), h.size)
            raise FsError(errno.EIO, "object shorter than its entry")
        return data

    def release(self, fh: int) -> None:
        with self._handles_lock:
            h = self._handles.pop(fh, None)
        if isinstance(h, _FileHandle):
            if h.reader is not None:
                self.stats.add("bytes_from_store", getattr(h.reader, "bytes_from_store", 0))
                h.reader.close()
            self.inodes.close(h.node)

    # ------------------------------------------------------------------ .lakefuse files

    def _info_content(self, tree: _Tree | None, name: bytes) -> bytes:
        if tree is None:
            return self._stats_json()
        tree.sync()
        if name == b"head":
            return (tree.view.commit_id + "\n").encode()
        lines = []
        for c in self.repo.log(tree.view.commit_id, amount=self.config.log_commits):
            first = c.message.splitlines()[0] if c.message else ""
            when = c.creation_date.strftime("%Y-%m-%dT%H:%M:%SZ")
            lines.append(f"{c.id} {when} {c.committer}: {first}\n")
        return "".join(lines).encode()

    def _stats_json(self) -> bytes:
        import json

        snap = self.stats.snapshot()
        snap["pid"] = os.getpid()
        snap["repository"] = self.repo.name
        snap["inodes"] = len(self.inodes)
        snap["trees"] = len(self._trees)
        snap["open_handles"] = len(self._handles)
        snap.update(self.repo.cache_stats())
        if self.data_cache is not None:
            snap["data_cache"] = self.data_cache.stats()
        if self.config.extra_stats is not None:
            snap.update(self.config.extra_stats())
        return (json.dumps(snap, indent=1, sort_keys=True) + "\n").encode()

    # ------------------------------------------------------------------ xattrs

    def _xattrs(self, ino: int) -> dict[bytes, bytes]:
        node = self.inodes.get(ino)
        if node.kind not in (Kind.DIR, Kind.FILE, Kind.INFO_DIR) or node.tree is None:
            return {}
        node = self._revalidate(node) if node.kind != Kind.INFO_DIR else node
        tree: _Tree = node.tree
        out = {XATTR_PREFIX + b"commit": tree.view.commit_id.encode()}
        if node.kind == Kind.FILE:
            e = Entry.from_value(node.value)
            out[XATTR_PREFIX + b"etag"] = e.etag.encode()
            out[XATTR_PREFIX + b"physical_address"] = self._physical_address(e).encode()
            if e.content_type:
                out[XATTR_PREFIX + b"content_type"] = e.content_type.encode()
            for k, v in sorted(user_metadata(e.metadata).items()):
                if k not in POSIX_KEYS:
                    out[XATTR_PREFIX + b"meta." + k.encode()] = v.encode()
        return out

    def _physical_address(self, e: Entry) -> str:
        return self.repo.physical_address(e)

    def getxattr(self, ino: int, name: bytes) -> bytes:
        v = self._xattrs(ino).get(name)
        if v is None:
            raise FsError(errno.ENODATA)
        return v

    def listxattr(self, ino: int) -> list[bytes]:
        return list(self._xattrs(ino))

    # ------------------------------------------------------------------ writes (read-only for now)

    def check_writable(self, ino: int) -> None:
        """Every write-type call asks here first: EROFS on every tree for now."""
        self.stats.add("writes_refused")
        raise FsError(errno.EROFS, "read-only tree")

    def statfs(self) -> StatFs:
        return StatFs(block_size=4096, blocks=0, files=len(self.inodes), name_max=paths.MAX_NAME_BYTES)
