"""What the core hands out, as plain data, and how an entry becomes its attributes.

The dataclasses here are the core's whole vocabulary towards the FUSE adapter
(:class:`Attr`, :class:`DirEntry`, :class:`Opened`, :class:`StatFs`) and from it
(:class:`Caller`, :class:`SetAttr`). :class:`AttrRules` turns graveler entries
(and directory markers, and files being written in the spool) into :class:`Attr`
by one rule for every tree; a writable mount shows branch trees with writable
default modes and ctime/atime from the entry.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from graveler.model import Entry, Value, entry_stat
from graveler.objects import TIME_NS_MAX, TIME_NS_MIN, PosixAttrs, clamp_time_ns
from lakefuse.mount.inodes import Kind

XATTR_PREFIX = b"user.lakefs."
DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444
BRANCH_FILE_MODE = 0o644  # a branch tree's file or directory without POSIX metadata
BRANCH_DIR_MODE = 0o755
# kinds kept as an entry of the empty object, the kind (and a device's rdev) in its metadata
SPECIAL_KINDS = (stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK)
DEVICE_KINDS = (stat.S_IFCHR, stat.S_IFBLK)


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
    read_only: bool = False  # every tree immutable, branch trees too (a mount of a refs dump): no writes anywhere
    # a directory's nlink is 2 + its subdirectories when its listing has at most this many names
    # (a listing read of up to that many per count: ~3 us a name); a larger one shows 1, Linux's "not counted"
    nlink_scan: int = 256
    # names of immutable directories held in memory, whole, so that lookups need no thread (dircache)
    dir_cache_names: int = 50_000  # ~800 bytes a name: 40 MB at most
    # inodes kept for the kernel (about 1-2 KB each) above which the files of the oldest commit and
    # tag trees are handed back (lakefuse.mount.trim); 0: no bound
    max_inodes: int = 250_000


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
    atime_ns: int | None = None  # None: the mtime (0 is a time: 1970's first second)
    ctime_ns: int = 0  # 0: the mtime
    uncounted: bool = False  # a directory from a listing: subdirectories not counted yet (nlink 1, not kept)
    rdev: int = 0  # st_rdev: a character or block device's number

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
    made: Attr | None  # its attributes (ino 0 until accepted); None: made from ``stats`` when asked
    stamp: int
    mode: int = 0  # st_mode (0: ``attr``'s), all a plain READDIR reply needs of the attributes
    stats: tuple | None = None  # a file's (size, mtime) to make ``attr`` from, by ``make``
    make: object = None

    @property
    def attr(self) -> Attr:
        """The entry's attributes, made at the first ask (a plain READDIR never asks)."""
        a = self.made
        if a is None:
            a = self.made = self.make(*self.stats)
        return a


@dataclass(frozen=True, slots=True)
class Opened:
    fh: int
    keep_cache: bool
    direct_io: bool
    backing_fd: int = -1  # >= 0: a file with the same bytes the kernel may read itself (FUSE passthrough)
    noflush: bool = False  # its close has nothing to flush: the kernel need not send FLUSH (a reader)


@dataclass(frozen=True, slots=True)
class StatFs:
    """statvfs(3) of the mount: the filesystem holding its spool and caches, NAME_MAX of its own."""

    block_size: int  # f_bsize
    fragment_size: int  # f_frsize: the unit of the block counts
    blocks: int
    blocks_free: int
    blocks_avail: int  # free to an unprivileged user
    files: int
    files_free: int
    files_avail: int
    name_max: int

    @classmethod
    def of(cls, path: str, name_max: int) -> "StatFs":
        """statvfs of ``path``, or of its nearest existing parent (a cache directory not made
        yet: the disk it will be on). Blocking."""
        while True:
            try:
                st = os.statvfs(path)
                break
            except FileNotFoundError:
                parent = os.path.dirname(path)
                if parent == path:
                    raise
                path = parent
        return cls(block_size=st.f_bsize, fragment_size=st.f_frsize, blocks=st.f_blocks,
                   blocks_free=st.f_bfree, blocks_avail=st.f_bavail, files=st.f_files,
                   files_free=st.f_ffree, files_avail=st.f_favail, name_max=name_max)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks (pyfuse3's RequestContext as plain data)."""

    uid: int = 0
    gid: int = 0
    umask: int = 0o022


@dataclass(frozen=True, slots=True)
class SetAttr:
    """Which attributes a setattr changes (None: unchanged). A time past the range a file can show
    is that range's end (:func:`graveler.objects.clamp_time_ns`), as ext4 clamps one past its own:
    ``touch -d 2300-01-01`` keeps 2262-04-11T23:47:16.854775807Z."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    mtime_ns: int | None = None
    atime_ns: int | None = None

    def __post_init__(self) -> None:
        for name in ("mtime_ns", "atime_ns"):
            v = getattr(self, name)
            if v is not None and not TIME_NS_MIN <= v <= TIME_NS_MAX:
                object.__setattr__(self, name, clamp_time_ns(v))


class AttrRules:
    """Entries, markers and spool files as :class:`Attr` (see the module docstring)."""

    def __init__(self, config: FsConfig, writable: bool):
        self.config = config
        self.writable = writable
        # directory markers this mount just made, decoded (value -> (entry, POSIX attributes)):
        # their attributes follow without decoding them again (:meth:`marker_made`)
        self._markers: dict = {}

    def marker_made(self, value: Value, entry: Entry, pa: PosixAttrs) -> None:
        """A marker this mount made (``entry`` as ``value``, ``pa`` its POSIX attributes): the
        :meth:`tree_dir_attr` of it that follows takes them as they are."""
        markers = self._markers
        if len(markers) >= 256:
            markers.clear()
        markers[value] = (entry, pa)

    def dir_attr(self, ino: int, mtime_ns: int, entry_timeout: float, attr_timeout: float) -> Attr:
        c = self.config
        return Attr(ino, DIR_MODE, 0, mtime_ns, c.uid, c.gid, 2, entry_timeout, attr_timeout)

    @staticmethod
    def uncounted(attr: Attr) -> Attr:
        """A directory's ``attr`` before its subdirectories are counted (a listing's entry):
        nlink 1, and the kernel must ask again before showing it (attribute timeout 0)."""
        attr.nlink, attr.attr_timeout, attr.uncounted = 1, 0.0, True
        return attr

    def counted(self, attr: Attr, tree, nlink: int) -> Attr:
        """``attr`` (a directory of ``tree``) with its link count: a copy, kept as long as the tree says."""
        at = self.config.branch_timeout if tree is None else self.timeouts(tree)[1]
        return replace(attr, nlink=nlink, attr_timeout=at, uncounted=False)

    def timeouts(self, tree) -> tuple[float, float]:
        t = self.config.immutable_timeout if tree.immutable else self.config.branch_timeout
        return t, t

    def special_attr(self, size: int, writable: bool = False) -> Attr:
        """A file of a ``.lakefuse`` directory (never cached by the kernel)."""
        c = self.config
        mode = stat.S_IFREG | 0o644 if writable else FILE_MODE
        return Attr(0, mode, size, time.time_ns(), c.uid, c.gid, 1, 0.0, 0.0)

    def file_attr(self, value: Value, tree) -> Attr:
        """A file's attributes from its entry, decoded once (:func:`graveler.model.entry_stat`:
        a listing hands out one per name, so this is on the listing's hot path)."""
        return self._file_attr(*entry_stat(value), tree)

    def plain_file(self, tree) -> tuple[int, object]:
        """The mode a file of ``tree`` without user metadata shows, and the function of its
        ``(size, mtime)`` (as :func:`graveler.model.entry_stats` decodes them from a listing
        page) that makes its attributes: what :meth:`file_attr` gives such a file."""
        make = self._plain_attr(tree)
        return make(0, 0).mode, make

    def _plain_attr(self, tree):
        """What a file of ``tree`` without user metadata shows, as a function of its size and
        last-modified time (ns; 0: none kept, the tree's time shows)."""
        c = self.config
        et, at = self.timeouts(tree)
        uid, gid, tmt = c.uid, c.gid, tree.mtime_ns
        if not self.writable:
            return lambda size, mtime: Attr(0, FILE_MODE, size, mtime or tmt, uid, gid, 1, et, at)
        mode = FILE_MODE if tree.immutable else stat.S_IFREG | BRANCH_FILE_MODE  # a writable default on branches
        # atime: the mtime; ctime: when last staged (0: none kept, the mtime)
        return lambda size, mtime: Attr(0, mode, size, mtime or tmt, uid, gid, 1, et, at, mtime or tmt, mtime)

    def entry_attr(self, entry: Entry, tree) -> Attr:
        """:meth:`file_attr` of ``entry.to_value()``, from the entry as it is (no encoding, no decoding)."""
        return self._file_attr(entry.size, entry.last_modified_ns, entry.metadata or None, tree)

    def _file_attr(self, size: int, mtime_ns: int, metadata: dict | None, tree) -> Attr:
        if not metadata:
            return self._plain_attr(tree)(size, mtime_ns)
        c = self.config
        et, at = self.timeouts(tree)
        pa = PosixAttrs.from_metadata(metadata)
        mode, uid, gid = FILE_MODE, c.uid, c.gid
        if pa.symlink is not None:
            mode, size = stat.S_IFLNK | 0o777, len(pa.symlink.encode())
        elif pa.mode is not None and stat.S_IFMT(pa.mode) in (0, stat.S_IFREG):
            mode = stat.S_IFREG | stat.S_IMODE(pa.mode)
        uid = pa.uid if pa.uid is not None else uid
        gid = pa.gid if pa.gid is not None else gid
        mtime = pa.mtime_ns if pa.mtime_ns is not None else (mtime_ns or tree.mtime_ns)
        a = Attr(0, mode, size, mtime, uid, gid, 1, et, at)
        if self.writable:
            if pa.mode is not None and stat.S_IFMT(pa.mode) in SPECIAL_KINDS and pa.symlink is None:
                a.mode, a.size = pa.mode, 0
                if stat.S_IFMT(pa.mode) in DEVICE_KINDS:
                    a.rdev = pa.rdev or 0
            elif not tree.immutable and pa.mode is None and pa.symlink is None:
                a.mode = stat.S_IFREG | BRANCH_FILE_MODE
            a.ctime_ns = mtime_ns  # when the entry was last staged (0: none kept, the mtime)
            a.atime_ns = pa.atime_ns if pa.atime_ns is not None else a.mtime_ns
        return a

    def tree_dir_attr(self, tree, path: bytes, marker: Value | None = None) -> Attr:
        """A directory of a tree: read-only defaults, or the POSIX attributes of its
        directory marker (``path/``) when it has one."""
        et, at = self.timeouts(tree)
        if not path:
            et = self.config.branch_timeout  # the root's name -> commit mapping can change
        attr = self.dir_attr(0, tree.mtime_ns, et, at)
        pa = None
        if marker is not None:
            made = self._markers.get(marker)
            if made is not None:
                e, pa = made
            else:
                try:
                    e = Entry.from_value(marker)
                except Exception:
                    if self.writable:
                        raise
                    return attr
                pa = PosixAttrs.from_metadata(e.metadata) if e.metadata else PosixAttrs()
            if pa.mode is not None:
                attr.mode = stat.S_IFDIR | stat.S_IMODE(pa.mode)
            if pa.uid is not None:
                attr.uid = pa.uid
            if pa.gid is not None:
                attr.gid = pa.gid
            attr.mtime_ns = pa.mtime_ns if pa.mtime_ns is not None else (e.last_modified_ns or attr.mtime_ns)
            if self.writable:
                _times(attr, e, pa)
        if self.writable and not tree.immutable and (pa is None or pa.mode is None):
            attr.mode = stat.S_IFDIR | BRANCH_DIR_MODE
        return attr

    @staticmethod
    def spooled(sf, attr: Attr) -> Attr:
        """``attr`` of a file being written, as its spool file says (size, mode, times)."""
        if sf is None:
            return attr
        mode = attr.mode
        if sf.attrs.mode is not None:
            mode = stat.S_IFREG | stat.S_IMODE(sf.attrs.mode)
        a = sf.attrs
        return Attr(attr.ino, mode, sf.size, sf.mtime_ns, attr.uid if a.uid is None else a.uid,
                    attr.gid if a.gid is None else a.gid, attr.nlink, attr.entry_timeout, attr.attr_timeout,
                    a.atime_ns if a.atime_ns is not None else sf.mtime_ns, sf.ctime_ns, attr.uncounted, attr.rdev)


def _times(a: Attr, e: Entry, pa: PosixAttrs) -> None:
    """ctime: when the entry was last staged; atime: as set by utimens, else the mtime."""
    if e.last_modified_ns:
        a.ctime_ns = e.last_modified_ns
    a.atime_ns = pa.atime_ns if pa.atime_ns is not None else a.mtime_ns
