"""Writable branch trees: the write operations of the filesystem core.

:class:`WritableFilesystem` is the read-only core (:class:`lakefuse.mount.fs.Filesystem`)
plus every write-type operation on branch trees, the control files and branch
creation at the mount root. Commit, tag and ref-expression trees stay immutable
(EROFS). Like the core, it is synchronous, thread-safe, returns plain data and
is tested without a kernel; ``docs/SEMANTICS.md`` is the user's account of it.

How each change reaches graveler:

* File content goes through the spool (:mod:`lakefuse.mount.spool`): written to
  local disk, uploaded and staged on close (FUSE ``flush``) and ``fsync``, which
  return only once the object and the staging entry are durable.
* ``create`` stages the new file at once as an empty entry (pointing at one
  shared empty object of the mount), so every lookup -- another process, the
  CLI -- sees it while it is being written; its content is staged on close.
* ``mkdir`` stages a directory marker ``<dir>/`` (the shared empty object, the
  directory's POSIX attributes in its metadata); ``symlink`` stages an empty
  entry whose metadata holds the target. Neither writes an object.
* ``unlink`` / ``rmdir`` stage tombstones. A directory that would vanish because
  its last entry went away (a directory that only existed through the keys under
  it) gets a marker in the same transaction, so it stays, as POSIX says.
* ``rename`` restages entries under their new names (:mod:`graveler.tree`): no
  data is copied. A directory rename runs in bounded transactions while holding
  its branch tree's lock exclusively, so no reader of the mount sees half of it;
  an intent record in the spool lets the next mount finish one a crash cut short.
* ``chmod`` / ``chown`` / ``utimens`` restage the entry (or the directory's
  marker) with new ``lakefuse-posix-*`` metadata, same object.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, replace

from graveler import paths
from graveler.errors import GravelerError, NotFound
from graveler.model import Entry, Value
from graveler.objects import PosixAttrs, user_metadata
from graveler.staging import MAX_PATH_BYTES
from graveler.tree import rename_prefix
from lakefuse.mount import control
from lakefuse.mount.errors import FsError
from lakefuse.mount.fs import FILE_MODE, INFO_NAME, Attr, DirEntry, Filesystem, FsConfig, Opened, _FileHandle, _Tree
from lakefuse.mount.inodes import ROOT_INO, Kind, Node
from lakefuse.mount.spool import Spool

log = logging.getLogger(__name__)

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
BRANCH_FILE_MODE = 0o644  # a branch tree's file or directory without POSIX metadata
BRANCH_DIR_MODE = 0o755
DIR_RENAME_BATCH = 50_000  # keys per LMDB transaction of a directory rename


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks (pyfuse3's RequestContext as plain data)."""

    uid: int = 0
    gid: int = 0
    umask: int = 0o022


@dataclass(frozen=True, slots=True)
class SetAttr:
    """Which attributes a setattr changes (None: unchanged)."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    mtime_ns: int | None = None
    atime_ns: int | None = None


class _RWLock:
    """Many readers or one writer (a directory rename) per branch tree."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False

    def shared(self):
        return _Shared(self)

    def exclusive(self):
        return _Exclusive(self)


class _Shared:
    __slots__ = ("l",)

    def __init__(self, lock: _RWLock):
        self.l = lock

    def __enter__(self):
        c = self.l._cond
        with c:
            while self.l._writer:
                c.wait()
            self.l._readers += 1

    def __exit__(self, *exc):
        c = self.l._cond
        with c:
            self.l._readers -= 1
            if not self.l._readers:
                c.notify_all()


class _Exclusive:
    __slots__ = ("l",)

    def __init__(self, lock: _RWLock):
        self.l = lock

    def __enter__(self):
        c = self.l._cond
        with c:
            while self.l._writer:
                c.wait()
            self.l._writer = True
            while self.l._readers:
                c.wait()

    def __exit__(self, *exc):
        c = self.l._cond
        with c:
            self.l._writer = False
            c.notify_all()


class _WriteHandle:
    """An open file of a branch tree whose content goes through the spool."""

    __slots__ = ("node", "sf", "writable")

    def __init__(self, node: Node, sf, writable: bool):
        self.node = node
        self.sf = sf
        self.writable = writable


class _ControlHandle:
    """An open control file: what is written is one request, run when a write ends a line,
    else on flush (close) or fsync."""

    __slots__ = ("node", "branch", "name", "buf", "writable", "content")

    def __init__(self, node: Node, branch: str | None, name: str, writable: bool, content: bytes):
        self.node = node
        self.branch = branch
        self.name = name
        self.buf = bytearray()
        self.writable = writable
        self.content = content


def _spool_errors(fn):
    """An OSError of the spool (a full or failing local disk, a size the disk cannot
    hold) answers its own errno (ENOSPC, EFBIG, EIO...), not an unexpected error."""

    @functools.wraps(fn)
    def wrapper(*args, **kw):
        try:
            return fn(*args, **kw)
        except OSError as e:
            log.warning("spool: %s", e)
            raise FsError(e.errno or errno.EIO, str(e)) from None

    return wrapper


class WritableFilesystem(Filesystem):
    """The filesystem core with writable branch trees (see the module docstring)."""

    def __init__(self, repo, config: FsConfig | None = None, stats=None, spool: Spool | None = None, **kw):
        super().__init__(repo, config, stats, **kw)
        self.spool = spool
        self.controls = control.Controls(repo)
        self._empty: Entry | None = None
        self._empty_lock = threading.Lock()
        self._rw: dict[str, _RWLock] = {}
        self._rw_lock = threading.Lock()

    # ------------------------------------------------------------------ helpers

    def _tree_rw(self, tree: _Tree) -> _RWLock:
        name = tree.name
        lock = self._rw.get(name)
        if lock is None:
            with self._rw_lock:
                lock = self._rw.setdefault(name, _RWLock())
        return lock

    def _branch_node(self, ino: int, kinds=(Kind.DIR,)) -> Node:
        """The node ``ino`` of a branch tree (EROFS on immutable trees)."""
        node = self.inodes.get(ino)
        if node.kind == Kind.ROOT:
            raise FsError(errno.EPERM, "the mount root holds refs: make a branch with mkdir")
        if node.tree is None or node.kind in (Kind.INFO_DIR, Kind.INFO_FILE):
            raise FsError(errno.EPERM, "the .lakefuse directory is managed by the mount")
        if node.tree.immutable:
            self.stats.add("writes_refused")
            raise FsError(errno.EROFS, f"{node.tree.name!r} is not a branch: its tree is read-only")
        if node.kind not in kinds:
            raise FsError(errno.ENOTDIR if Kind.DIR in kinds else errno.EISDIR)
        return node

    @staticmethod
    def _branch(node: Node) -> str:
        return node.tree.view.branch

    def _child_path(self, parent: Node, name: bytes) -> bytes:
        if len(name) > paths.MAX_NAME_BYTES:
            raise FsError(errno.ENAMETOOLONG, f"name of {len(name)} bytes")
        if name in paths.RESERVED_NAMES:
            raise FsError(errno.EPERM, f"{name.decode()!r} is reserved for the mount's control files")
        why = paths.name_problem(name)
        if why is not None:
            raise FsError(errno.EINVAL, why)
        path = paths.join(parent.path, name)
        if len(path) + 1 > MAX_PATH_BYTES:  # +1: room for a directory marker
            raise FsError(errno.ENAMETOOLONG, f"path of {len(path)} bytes (at most {MAX_PATH_BYTES - 1})")
        try:
            path.decode("utf-8")
        except UnicodeDecodeError:
            raise FsError(errno.EINVAL, "names must be UTF-8") from None
        return path

    def empty_entry(self) -> Entry:
        """The mount's shared empty object (uploaded once), as an entry."""
        with self._empty_lock:
            if self._empty is None:
                self._empty = replace(self.repo.put_object(b""), last_modified_ns=0)
            return self._empty

    def _new_entry(self, attrs: PosixAttrs, now: int | None = None) -> Entry:
        e = self.empty_entry()
        return replace(e, last_modified_ns=now or time.time_ns(), metadata=attrs.to_metadata())

    def _stat(self, tree: _Tree, path: bytes):
        tree.sync()
        return tree.view.stat(path)

    def _touch_parent(self, tree: _Tree, parent_path: bytes, now: int,
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
        cur = tree.view.get(key)
        if cur is not None:
            e = Entry.from_value(cur)
            pa = PosixAttrs.from_metadata(e.metadata)
            md = user_metadata(e.metadata)
        else:
            if not leaving:
                return []
            page = tree.view.list_page(key, b"", len(leaving) + 2)
            if any(it.path not in leaving and it.path.rstrip(b"/") + b"/" not in leaving for it in page):
                return []  # entries remain: the directory stays without a marker
            e = self.empty_entry()
            pa = PosixAttrs(mode=stat.S_IFDIR | BRANCH_DIR_MODE, uid=self.config.uid, gid=self.config.gid)
            md = {}
        md.update(replace(pa, mtime_ns=now).to_metadata())
        return [(key, replace(e, metadata=md, last_modified_ns=now).to_value())]

    def _stage(self, tree: _Tree, items, durable: bool = True) -> None:
        self.repo.stage_many(tree.view.branch, items, durable)
        tree.sync()

    # ------------------------------------------------------------------ attributes (spool-aware)

    def _file_attr(self, value: Value, tree: _Tree) -> Attr:
        a = super()._file_attr(value, tree)
        e = Entry.from_value(value)
        pa = PosixAttrs.from_metadata(e.metadata) if e.metadata else PosixAttrs()
        if pa.mode is not None and stat.S_IFMT(pa.mode) in (stat.S_IFIFO, stat.S_IFSOCK) and pa.symlink is None:
            a.mode, a.size = pa.mode, 0
        elif not tree.immutable and pa.mode is None and pa.symlink is None:
            a.mode = stat.S_IFREG | BRANCH_FILE_MODE  # a writable default on branch trees
        _times(a, e, pa)
        return a

    def _tree_dir_attr(self, tree: _Tree, path: bytes, marker: Value | None = None) -> Attr:
        a = super()._tree_dir_attr(tree, path, marker)
        pa = None
        if marker is not None:
            e = Entry.from_value(marker)
            pa = PosixAttrs.from_metadata(e.metadata)
            _times(a, e, pa)
        if not tree.immutable and (pa is None or pa.mode is None):
            a.mode = stat.S_IFDIR | BRANCH_DIR_MODE
        return a

    def _spool_attr(self, node: Node, attr: Attr) -> Attr:
        sf = self.spool.get(node.ino) if self.spool is not None else None
        if sf is None:
            return attr
        mode = attr.mode
        if sf.attrs.mode is not None:
            mode = stat.S_IFREG | stat.S_IMODE(sf.attrs.mode)
        return replace(attr, size=sf.size, mode=mode,
                       uid=attr.uid if sf.attrs.uid is None else sf.attrs.uid,
                       gid=attr.gid if sf.attrs.gid is None else sf.attrs.gid,
                       mtime_ns=sf.mtime_ns, ctime_ns=sf.ctime_ns,
                       atime_ns=sf.attrs.atime_ns if sf.attrs.atime_ns is not None else sf.mtime_ns)

    def getattr(self, ino: int) -> Attr:
        node = self.inodes.get(ino)
        if node.kind == Kind.FILE and not node.tree.immutable:
            sf = self.spool.get(ino) if self.spool is not None else None
            if sf is not None:
                base = node.attr if node.attr is not None else super().getattr(ino)
                return self._spool_attr(node, base)
            with self._tree_rw(node.tree).shared():
                return super().getattr(ino)
        if node.kind == Kind.INFO_FILE and node.key[0] == "ic":
            return self._control_attr(node)
        if node.kind == Kind.DIR and not node.tree.immutable:
            with self._tree_rw(node.tree).shared():
                return super().getattr(ino)
        return super().getattr(ino)

    def lookup(self, parent_ino: int, name: bytes) -> Attr:
        parent = self.inodes.get(parent_ino)
        if parent.kind == Kind.INFO_DIR:
            names = _ROOT_CONTROLS if parent.tree is None else (
                _BRANCH_CONTROLS if not parent.tree.immutable else ())
            if name in names:
                tree = parent.tree
                node, _ = self.inodes.acquire(("ic", tree.key if tree else None, name), Kind.INFO_FILE, tree, name,
                                              parent_ino)
                return self._control_attr(node)
            return super().lookup(parent_ino, name)
        if parent.kind == Kind.DIR and not parent.tree.immutable:
            with self._tree_rw(parent.tree).shared():
                attr = super().lookup(parent_ino, name)
            node = self.inodes.get(attr.ino)
            return self._spool_attr(node, attr) if node.kind == Kind.FILE else attr
        return super().lookup(parent_ino, name)

    def readdir_fill(self, fh: int, offset: int) -> None:
        node = self._handle(fh).node
        if node.kind == Kind.DIR and not node.tree.immutable:
            with self._tree_rw(node.tree).shared():
                return super().readdir_fill(fh, offset)
        return super().readdir_fill(fh, offset)

    def _info_entries(self, node: Node):
        out = super()._info_entries(node)
        tree = node.tree
        names = _ROOT_CONTROLS if tree is None else (_BRANCH_CONTROLS if not tree.immutable else ())
        for name in names:
            key = ("ic", tree.key if tree else None, name)
            out.append(DirEntry(name, len(out) + 1, key, Kind.INFO_FILE, tree, name, None,
                                self._control_attr_plain(tree, name), 0))
        return out

    def _control_attr_plain(self, tree, name: bytes) -> Attr:
        branch = tree.view.branch if tree is not None else None
        size = len(self.controls.outcome(branch, name.decode())) if name != b"status" else 0
        mode = stat.S_IFREG | (0o444 if name == b"status" else 0o644)
        return Attr(0, mode, size, time.time_ns(), self.config.uid, self.config.gid, 1, 0.0, 0.0)

    def _control_attr(self, node: Node) -> Attr:
        node.attr = replace(self._control_attr_plain(node.tree, node.path), ino=node.ino)
        return node.attr

    # ------------------------------------------------------------------ open / read / write

    def open(self, ino: int, flags: int) -> Opened:
        node = self.inodes.get(ino)
        writing = flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_APPEND)
        if node.kind == Kind.INFO_FILE and node.key[0] == "ic":
            return self._open_control(node, bool(writing))
        if node.kind == Kind.FILE and not node.tree.immutable and self.spool is not None:
            sf = self.spool.get(ino)
            if writing or sf is not None:
                return self._open_spooled(node, flags, bool(writing))
        return super().open(ino, flags)

    @_spool_errors
    def _open_spooled(self, node: Node, flags: int, writing: bool) -> Opened:
        tree: _Tree = node.tree
        sf = self.spool.get(node.ino)
        if sf is None:
            with self._tree_rw(tree).shared():
                node = self._revalidate(node)
            entry = Entry.from_value(node.value)
            pa = PosixAttrs.from_metadata(entry.metadata)
            if pa.symlink is not None:
                raise FsError(errno.ELOOP, "a symlink")
        else:
            entry, pa = None, None
        sf = self.spool.open(node.ino, tree.view.branch, node.path, entry, self._attrs_for(node, pa))
        try:
            if flags & os.O_TRUNC and writing:
                sf.truncate(0)
        except BaseException:
            self.spool.release(node.ino)
            raise
        self.inodes.open(node)
        self.stats.add("opens")
        return Opened(self._new_fh(_WriteHandle(node, sf, writing)), False, False)

    def _attrs_for(self, node: Node, pa: PosixAttrs | None) -> PosixAttrs:
        a = node.attr
        if pa is None:
            pa = PosixAttrs()
        return PosixAttrs(
            mode=pa.mode if pa.mode is not None else (a.mode if a is not None else stat.S_IFREG | BRANCH_FILE_MODE),
            uid=pa.uid if pa.uid is not None else (a.uid if a is not None else self.config.uid),
            gid=pa.gid if pa.gid is not None else (a.gid if a is not None else self.config.gid),
            mtime_ns=pa.mtime_ns,
        )

    def read_fast(self, fh: int, offset: int, size: int) -> bytes | None:
        h = self._handle(fh)
        if isinstance(h, _ControlHandle):
            return h.content[offset:offset + size]
        if isinstance(h, _WriteHandle):
            return None  # the spool file: read in a worker thread
        if self.spool is not None and h.node.kind == Kind.FILE and self.spool.get(h.node.ino) is not None:
            return None  # another handle is writing it: no read-ahead buffer is current
        return super().read_fast(fh, offset, size)

    @_spool_errors
    def read(self, fh: int, offset: int, size: int) -> bytes:
        h = self._handle(fh)
        if isinstance(h, _WriteHandle):
            return h.sf.read(offset, size)
        if isinstance(h, _ControlHandle):
            return h.content[offset:offset + size]
        if isinstance(h, _FileHandle) and self.spool is not None and h.node.kind == Kind.FILE:
            sf = self.spool.get(h.node.ino)
            if sf is not None and (sf.loaded or sf.saved is not None):
                return sf.read(offset, size)  # another handle is writing it: read what it wrote
        return super().read(fh, offset, size)

    @_spool_errors
    def write(self, fh: int, offset: int, data: bytes) -> int:
        h = self._handle(fh)
        if isinstance(h, _ControlHandle):
            if not h.writable:
                raise FsError(errno.EBADF, "not open for writing")
            if offset + len(data) > control.MAX_REQUEST_BYTES:
                raise FsError(errno.EFBIG, f"control requests are at most {control.MAX_REQUEST_BYTES} bytes")
            if offset > len(h.buf):
                h.buf.extend(b"\0" * (offset - len(h.buf)))
            h.buf[offset:offset + len(data)] = data
            if data.endswith(b"\n"):
                # A write that ends a line ends the request: run it now, so the write itself
                # fails when the request does (bash ignores errors of close, not of write).
                req = bytes(h.buf)
                h.buf.clear()
                self._run_control(h, req)
            return len(data)
        if not isinstance(h, _WriteHandle) or not h.writable:
            raise FsError(errno.EBADF, "not open for writing")
        return h.sf.write(offset, data)

    def pending(self, fh: int) -> bool:
        """True when ``flush`` of ``fh`` has work to do (never blocks)."""
        h = self._handles.get(fh)
        if isinstance(h, _WriteHandle):
            return h.sf.dirty
        return isinstance(h, _ControlHandle) and bool(h.buf)

    @_spool_errors
    def flush(self, fh: int) -> None:
        """close(2): save a written file (upload + stage, durable) or run a control request."""
        h = self._handles.get(fh)
        if isinstance(h, _WriteHandle):
            h.sf.flush()
        elif isinstance(h, _ControlHandle) and h.writable and h.buf:
            data = bytes(h.buf)
            h.buf.clear()
            self._run_control(h, data)

    fsync = flush

    @_spool_errors
    def release(self, fh: int) -> None:
        h = self._handles.get(fh)
        if isinstance(h, (_WriteHandle, _ControlHandle)):
            with self._handles_lock:
                self._handles.pop(fh, None)
            try:
                if isinstance(h, _ControlHandle):
                    if h.writable and h.buf:  # written without a flush (never for close(2))
                        try:
                            self._run_control(h, bytes(h.buf))
                        except GravelerError:
                            pass  # the outcome is kept for the read-back
                else:
                    self.spool.release(h.node.ino)
            finally:
                self.inodes.close(h.node)
            return
        super().release(fh)

    # ------------------------------------------------------------------ control files

    def _open_control(self, node: Node, writing: bool) -> Opened:
        tree = node.tree
        name = node.path.decode()
        branch = tree.view.branch if tree is not None else None
        if writing:
            if tree is not None and tree.immutable:
                raise FsError(errno.EROFS, "control files of immutable trees are read-only")
            if name == "status":
                raise FsError(errno.EACCES, "status is read-only")
        content = self.controls.outcome(branch, name)
        self.inodes.open(node)
        return Opened(self._new_fh(_ControlHandle(node, branch, name, writing, content)), False, True)

    def _run_control(self, h: _ControlHandle, data: bytes) -> None:
        try:
            self.controls.execute(h.branch, h.name, data)
        finally:
            h.content = self.controls.outcome(h.branch, h.name)
            if h.node.tree is not None:
                h.node.tree.sync()

    # ------------------------------------------------------------------ create / mkdir / symlink / mknod

    @_spool_errors
    def create(self, parent_ino: int, name: bytes, mode: int, flags: int, caller: Caller) -> tuple[Opened, Attr]:
        parent = self._branch_node(parent_ino)
        path = self._child_path(parent, name)
        tree: _Tree = parent.tree
        attrs = PosixAttrs(mode=stat.S_IFREG | stat.S_IMODE(mode), uid=caller.uid, gid=caller.gid)
        now = time.time_ns()
        entry = self._new_entry(attrs, now)
        with self._tree_rw(tree).shared():
            st = self._stat(tree, path)
            if st.is_dir:
                raise FsError(errno.EISDIR if not flags & os.O_EXCL else errno.EEXIST)
            if st.value is not None and flags & os.O_EXCL:
                raise FsError(errno.EEXIST)
            # Not synced: create(2) promises nothing durable; the close (or fsync) of the
            # file makes this transaction durable (with its own, or alone if unwritten).
            self._stage(tree, [(path, entry.to_value())] + self._touch_parent(tree, parent.path, now),
                        durable=False)
            stamp = tree.stamp
            attr = self._file_attr(entry.to_value(), tree)
            attr = self._acquire_fresh(self._file_key(tree, path), Kind.FILE, tree, path, parent_ino, attr,
                                       entry.to_value(), stamp)
        node = self.inodes.get(attr.ino)
        sf = self.spool.open(node.ino, tree.view.branch, path, entry, attrs)
        self.inodes.open(node)
        self.stats.add("creates")
        return Opened(self._new_fh(_WriteHandle(node, sf, True)), False, False), self._spool_attr(node, attr)

    def _acquire_fresh(self, key, kind: Kind, tree, path: bytes, parent_ino: int, attr: Attr,
                       value: Value | None, stamp: int) -> Attr:
        """The node for ``key`` with these attributes (a stale node of the key is replaced)."""
        old = self.inodes.find(key)
        if old is not None and old.kind != kind:
            self.inodes.replace(old)
        node, _ = self.inodes.acquire(key, kind, tree, path, parent_ino)
        node.attr = replace(attr, ino=node.ino)
        node.value = value
        node.stamp = stamp
        return node.attr

    def mkdir(self, parent_ino: int, name: bytes, mode: int, caller: Caller) -> Attr:
        parent = self.inodes.get(parent_ino)
        if parent.kind == Kind.ROOT:
            return self._mkdir_branch(name)
        parent = self._branch_node(parent_ino)
        path = self._child_path(parent, name)
        tree: _Tree = parent.tree
        attrs = PosixAttrs(mode=stat.S_IFDIR | stat.S_IMODE(mode), uid=caller.uid, gid=caller.gid)
        now = time.time_ns()
        entry = self._new_entry(attrs, now)
        with self._tree_rw(tree).shared():
            st = self._stat(tree, path)
            if st.exists:
                raise FsError(errno.EEXIST)
            self._stage(tree, [(path + b"/", entry.to_value())] + self._touch_parent(tree, parent.path, now))
            attr = self._tree_dir_attr(tree, path, entry.to_value())
            attr = self._acquire_fresh(self._dir_key(tree, path), Kind.DIR, tree, path, parent_ino, attr,
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
        return self.lookup(ROOT_INO, name)

    def symlink(self, parent_ino: int, name: bytes, target: bytes, caller: Caller) -> Attr:
        parent = self._branch_node(parent_ino)
        path = self._child_path(parent, name)
        try:
            text = target.decode("utf-8")
        except UnicodeDecodeError:
            raise FsError(errno.EINVAL, "symlink targets must be UTF-8") from None
        if not text or "\0" in text:
            raise FsError(errno.ENOENT if not text else errno.EINVAL)
        attrs = PosixAttrs(mode=stat.S_IFLNK | 0o777, uid=caller.uid, gid=caller.gid, symlink=text)
        return self._make_special(parent, path, attrs)

    def _make_special(self, parent: Node, path: bytes, attrs: PosixAttrs) -> Attr:
        """A symlink, FIFO or socket: an entry of the shared empty object, kind in its metadata."""
        tree: _Tree = parent.tree
        now = time.time_ns()
        entry = self._new_entry(attrs, now)
        with self._tree_rw(tree).shared():
            if self._stat(tree, path).exists:
                raise FsError(errno.EEXIST)
            self._stage(tree, [(path, entry.to_value())] + self._touch_parent(tree, parent.path, now))
            attr = self._file_attr(entry.to_value(), tree)
            return self._acquire_fresh(self._file_key(tree, path), Kind.FILE, tree, path, parent.ino, attr,
                                       entry.to_value(), tree.stamp)

    def mknod(self, parent_ino: int, name: bytes, mode: int, caller: Caller) -> Attr:
        """A regular file is created empty; a FIFO or a socket is kept as an entry (like a
        symlink); character and block devices: EPERM."""
        parent = self._branch_node(parent_ino)
        kind = stat.S_IFMT(mode)
        if kind in (0, stat.S_IFREG):
            opened, attr = self.create(parent_ino, name, stat.S_IFREG | stat.S_IMODE(mode), os.O_EXCL, caller)
            self.release(opened.fh)
            return attr
        if kind not in (stat.S_IFIFO, stat.S_IFSOCK):
            raise FsError(errno.EPERM, "device files are not supported")
        path = self._child_path(parent, name)
        return self._make_special(parent, path, PosixAttrs(mode=kind | stat.S_IMODE(mode), uid=caller.uid,
                                                           gid=caller.gid))

    def link(self, ino: int, new_parent_ino: int, new_name: bytes) -> Attr:
        self._branch_node(new_parent_ino)
        raise FsError(errno.EPERM, "hard links are not supported")

    # ------------------------------------------------------------------ unlink / rmdir

    def unlink(self, parent_ino: int, name: bytes) -> None:
        parent = self._branch_node(parent_ino)
        if name in paths.RESERVED_NAMES:
            raise FsError(errno.EPERM if parent.path else errno.EISDIR)
        path = self._child_path(parent, name)
        tree: _Tree = parent.tree
        with self._tree_rw(tree).shared():
            st = self._stat(tree, path)
            if st.is_dir:
                raise FsError(errno.EISDIR)
            if st.value is None:
                raise FsError(errno.ENOENT)
            self._stage(tree, [(path, None)] + self._touch_parent(tree, parent.path, time.time_ns(),
                                                                  frozenset({path})))
            self._forget_path(tree, path, Kind.FILE)
        self.stats.add("unlinks")

    def _forget_path(self, tree: _Tree, path: bytes, kind: Kind) -> None:
        key = self._file_key(tree, path) if kind == Kind.FILE else self._dir_key(tree, path)
        node = self.inodes.find(key)
        if node is not None:
            self.inodes.replace(node)
            if kind == Kind.FILE and self.spool is not None:
                self.spool.detach(node.ino)

    def rmdir(self, parent_ino: int, name: bytes) -> None:
        parent = self.inodes.get(parent_ino)
        if parent.kind == Kind.ROOT:
            raise FsError(errno.EPERM, "deleting a branch stays with the CLI (lakefuse branch delete)")
        parent = self._branch_node(parent_ino)
        if name in paths.RESERVED_NAMES:
            raise FsError(errno.EPERM)
        path = self._child_path(parent, name)
        tree: _Tree = parent.tree
        marker = path + b"/"
        with self._tree_rw(tree).shared():
            st = self._stat(tree, path)
            if not st.is_dir:
                raise FsError(errno.ENOTDIR if st.value is not None else errno.ENOENT)
            page = tree.view.list_page(marker, b"", 2)
            if any(it.path != marker for it in page):
                raise FsError(errno.ENOTEMPTY)
            self._stage(tree, [(marker, None)] + self._touch_parent(tree, parent.path, time.time_ns(),
                                                                    frozenset({marker})))
            self._forget_path(tree, path, Kind.DIR)
        self.stats.add("rmdirs")

    # ------------------------------------------------------------------ rename

    def rename(self, old_parent_ino: int, old_name: bytes, new_parent_ino: int, new_name: bytes,
               flags: int) -> None:
        if flags & RENAME_EXCHANGE:
            raise FsError(errno.EINVAL, "RENAME_EXCHANGE is not supported")
        if flags & ~RENAME_NOREPLACE:
            raise FsError(errno.EINVAL, f"rename flags {flags:#x} are not supported")
        op = self.inodes.get(old_parent_ino)
        np_ = self.inodes.get(new_parent_ino)
        if op.kind == Kind.ROOT or np_.kind == Kind.ROOT:
            raise FsError(errno.EPERM, "branches are not renamed through the mount")
        op = self._branch_node(old_parent_ino)
        np_ = self._branch_node(new_parent_ino)
        if op.tree.key != np_.tree.key:
            raise FsError(errno.EXDEV, "rename across refs")
        if old_name in paths.RESERVED_NAMES or new_name in paths.RESERVED_NAMES:
            raise FsError(errno.EPERM, "'.lakefuse' is reserved")
        src = self._child_path(op, old_name)
        dst = self._child_path(np_, new_name)
        tree: _Tree = op.tree
        if src == dst:
            return
        with self._tree_rw(tree).shared():
            s = self._stat(tree, src)
            d = self._stat(tree, dst)
            if not s.exists:
                raise FsError(errno.ENOENT)
            if d.exists and flags & RENAME_NOREPLACE:
                raise FsError(errno.EEXIST)
            if not s.is_dir:
                if d.is_dir:
                    raise FsError(errno.EISDIR)
                self._rename_file(tree, op, np_, src, dst)
                return
            if dst.startswith(src + b"/"):
                raise FsError(errno.EINVAL, "cannot move a directory into itself")
            if d.value is not None and not d.is_dir:
                raise FsError(errno.ENOTDIR)
            if d.is_dir:
                page = tree.view.list_page(dst + b"/", b"", 2)
                if any(it.path != dst + b"/" for it in page):
                    raise FsError(errno.ENOTEMPTY)
        self._rename_dir(tree, op, np_, src, dst, d.is_dir)

    def _rename_file(self, tree: _Tree, op: Node, np_: Node, src: bytes, dst: bytes) -> None:
        branch = tree.view.branch
        now = time.time_ns()
        e = Entry.from_value(tree.view.get(src))
        pa = PosixAttrs.from_metadata(e.metadata)
        md = dict(e.metadata)
        if pa.mtime_ns is None:  # the entry's last_modified becomes the ctime: keep the mtime
            md.update(PosixAttrs(mtime_ns=e.last_modified_ns).to_metadata())
        moved = replace(e, metadata=md, last_modified_ns=now).to_value()
        items = [(dst, moved), (src, None)] + self._touch_parent(tree, op.path, now, frozenset({src}))
        if np_.path != op.path:
            items += self._touch_parent(tree, np_.path, now)
        self._stage(tree, items)
        self._forget_path(tree, dst, Kind.FILE)  # an open file replaced at dst: detached
        node = self.inodes.find(self._file_key(tree, src))
        if node is not None:
            self.inodes.rekey(node, self._file_key(tree, dst), dst)
            sf = self.spool.get(node.ino) if self.spool is not None else None
            if sf is not None:
                sf.move(branch, dst)
        self.stats.add("renames")

    def _rename_dir(self, tree: _Tree, op: Node, np_: Node, src: bytes, dst: bytes, dst_exists: bool) -> None:
        branch = tree.view.branch
        with self._tree_rw(tree).exclusive():
            intent = None
            if self.spool is not None:
                intent = self.spool.begin_intent({"op": "rename_dir", "branch": branch,
                                                  "src": src.decode(), "dst": dst.decode()})
            now = time.time_ns()
            pre = []
            if dst_exists:
                pre.append((dst + b"/", None))  # the empty target's marker (src's own moves over it)
            pre += self._touch_parent(tree, op.path, now, frozenset({src + b"/"}))
            if np_.path != op.path:
                pre += self._touch_parent(tree, np_.path, now)
            if pre:
                self._stage(tree, pre)
            rename_prefix(self.repo, branch, src, dst, batch=DIR_RENAME_BATCH)
            if intent is not None:
                self.spool.end_intent(intent)
            tree.sync()
            self._forget_path(tree, dst, Kind.DIR)
            moved = self.inodes.rekey_prefix(tree.key, src, dst)
            if self.spool is not None:
                for sf in self.spool.open_files():
                    if sf.branch == branch and sf.key is not None and sf.key.startswith(src + b"/"):
                        sf.move(branch, dst + sf.key[len(src):])
        log.debug("renamed directory %r -> %r on %s (%d inodes)", src, dst, branch, moved)
        self.stats.add("renames")

    # ------------------------------------------------------------------ setattr

    @_spool_errors
    def setattr(self, ino: int, changes: SetAttr, fh: int | None = None) -> Attr:
        node = self.inodes.get(ino)
        if node.kind == Kind.INFO_FILE and node.key[0] == "ic":
            if changes.size not in (None, 0) or any(
                    v is not None for v in (changes.mode, changes.uid, changes.gid, changes.mtime_ns, changes.atime_ns)):
                raise FsError(errno.EPERM, "control files only take truncation to zero")
            return self._control_attr(node)
        if node.kind == Kind.DIR:
            node = self._branch_node(ino, (Kind.DIR,))
            return self._setattr_dir(node, changes)
        node = self._branch_node(ino, (Kind.FILE,))
        tree: _Tree = node.tree
        sf = self.spool.hold(ino)  # an open file: change it through its spool (saved at its last close)
        if sf is None and changes.size is not None:
            with self._tree_rw(tree).shared():
                node = self._revalidate(node)
            e = Entry.from_value(node.value)
            sf = self.spool.open(ino, tree.view.branch, node.path, e,
                                 self._attrs_for(node, PosixAttrs.from_metadata(e.metadata)))
        if sf is not None:
            try:
                if changes.size is not None:
                    sf.truncate(changes.size)
                self._apply_attrs(sf, changes)
                if not sf.loaded or sf.handles == 1:
                    sf.flush()  # nothing else will save it soon: truncate(2)/chmod(2) return once saved
            finally:
                self.spool.release(ino)
            return self._fresh_attr(node)
        with self._tree_rw(tree).shared():
            node = self._revalidate(node)
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
            )
            md = user_metadata(e.metadata)
            md.update(new.to_metadata())
            self._stage(tree, [(node.path, replace(e, metadata=md, last_modified_ns=time.time_ns()).to_value())])
        return self._fresh_attr(node)

    def _fresh_attr(self, node: Node) -> Attr:
        node.stamp = -1
        return self.getattr(node.ino)

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
        tree: _Tree = node.tree
        if not node.path:
            raise FsError(errno.EPERM, "the attributes of a branch's root directory are fixed")
        with self._tree_rw(tree).shared():
            tree.sync()
            marker = tree.view.get(node.path + b"/")
            cur = self._tree_dir_attr(tree, node.path, marker)
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

    # ------------------------------------------------------------------ the rest

    def check_writable(self, ino: int) -> None:
        node = self.inodes.get(ino)
        if node.tree is not None and node.tree.immutable:
            self.stats.add("writes_refused")
            raise FsError(errno.EROFS, "read-only tree")

    def setxattr(self, ino: int, name: bytes, value: bytes) -> None:
        self.check_writable(ino)
        raise FsError(errno.ENOTSUP, "extended attributes are read-only")

    def recover(self) -> None:
        """At mount start: take over spool leftovers and finish interrupted directory renames."""
        if self.spool is None:
            return
        report = self.spool.recover()
        for intent in report.intents:
            if intent.get("op") != "rename_dir":
                continue
            try:
                n = rename_prefix(self.repo, intent["branch"], intent["src"].encode(), intent["dst"].encode(),
                                  batch=DIR_RENAME_BATCH)
                log.warning("finished an interrupted rename %s -> %s on %s (%d keys)",
                            intent["src"], intent["dst"], intent["branch"], n)
            except NotFound:
                pass
            except (GravelerError, KeyError) as e:
                log.error("could not finish an interrupted rename %s: %s", intent, e)
        return report


def _times(a: Attr, e: Entry, pa: PosixAttrs) -> None:
    """ctime: when the entry was last staged; atime: as set by utimens, else the mtime."""
    if e.last_modified_ns:
        a.ctime_ns = e.last_modified_ns
    a.atime_ns = pa.atime_ns if pa.atime_ns is not None else a.mtime_ns


_BRANCH_CONTROLS = tuple(n.encode() for n in control.BRANCH_REQUESTS) + (b"status",)
_ROOT_CONTROLS = tuple(n.encode() for n in control.ROOT_REQUESTS)
_CONTROL_NAMES = frozenset(_BRANCH_CONTROLS + _ROOT_CONTROLS)

__all__ = ["Caller", "SetAttr", "WritableFilesystem"]
