"""The stamp watch: a branch changed elsewhere drops the kernel's caches of its tree at once.

The kernel keeps the names and attributes of a branch tree for ``--branch-timeout`` (1 s by
default) without asking the daemon, and the pages of a file it read until the file is opened
again. Every request that reaches the daemon re-checks the branch's change stamp
(:meth:`lakefuse.mount.trees.Tree.repin`), but a request the kernel answers from its caches
never arrives. So a thread polls the change stamp of every branch tree the kernel knows, every
:data:`INTERVAL_S` (one short KV read per tree: a point read on LMDB or PostgreSQL), and when
one moved -- a write, commit, merge or reset by another host, another process or this mount
(not changes this mount made through the kernel, :meth:`Tree.own_change`: while saves of
this mount are under way, stamps they may explain get up to 0.5 s to be) -- it drops the kernel's attributes and pages of that tree's inodes (FUSE's ``notify_inval_inode``),
so the next stat, open or read of any of them asks the daemon. A reader on another host then sees a
change within about :data:`INTERVAL_S` plus one request, not after the timeout.

Why a poll and not PostgreSQL's LISTEN/NOTIFY: the stamp is the one signal every backend has
(LMDB too, where another process's CLI commit must show the same way), a poll needs no
connection of its own held open per daemon, survives a database restart without
re-subscribing, and costs a few point reads a second; a NOTIFY would still need the poll as
a fallback after a lost connection.

The invalidations are called from this thread, never from a request handler (the kernel may
wait on the daemon to finish a request on the same directory while it invalidates). A control
request of this mount that changed a branch's files (reset, merge, revert) asks for a round at
once and waits for it (:meth:`StampWatch.poke`, at most :data:`POKE_WAIT_S`), so what the
kernel shows right after the request is the branch as it left it: the names it took away go
too (their files and the directories left with nothing), else the kernel would take a file
created again there for the old one, gone (ENOENT), and a directory made again for one that
exists (EEXIST), until the name timed out.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import Callable

from graveler.errors import GravelerError, NotFound
from lakefuse.mount.inodes import Kind
from lakefuse.mount.trim import Trimmer

log = logging.getLogger(__name__)

INTERVAL_S = 0.25
POKE_WAIT_S = 0.5  # the longest a control request waits for the round it asked for (never a deadlock)


class StampWatch:
    """Poll branch stamps of ``fs`` and drop the kernel's caches of the trees that moved."""

    def __init__(self, fs, invalidate_inode: Callable[[int], None], interval: float = INTERVAL_S,
                 invalidate_entry: Callable[[int, bytes], None] | None = None):
        self.fs = fs
        self._inode = invalidate_inode
        self._entry = invalidate_entry  # (parent inode, name): a name the kernel must look up again
        self._trim = Trimmer(fs, invalidate_entry) if invalidate_entry is not None else None
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.dropped = 0  # trees whose caches were dropped
        self._cv = threading.Condition()
        self._asked = 0  # rounds asked for by poke(), and the last of them a round has answered
        self._answered = 0
        self._forget: list[tuple[str, list[bytes]]] = []  # (branch, keys) a request took away: names to drop

    def poll_once(self) -> int:
        """One round: how many inodes' kernel caches were dropped."""
        n = 0
        for tree in self.fs.branch_trees():
            try:
                s = tree.repin()  # one stamp read; the view is read again only if the stamp moved
            except NotFound:  # the branch is gone (deleted, or made again: another branch)
                n += self._branch_gone(tree)
                continue
            except GravelerError:
                continue  # the KV is down (the requests themselves answer EIO)
            with tree.lock:
                if not tree.unexplained_by_own(s, time.monotonic_ns()):
                    continue
                tree.foreign += 1  # what the mount remembers of this tree is stale too (Filesystem.nlink)
            self.dropped += 1
            for node in self.fs.inodes.of_tree(tree.key):
                if node.kind not in (Kind.FILE, Kind.DIR):
                    continue
                n += self._drop(node)
                if node.kind == Kind.FILE and node.opens > 0:
                    self._gone(tree, node)
        with self._cv:
            forget, self._forget = self._forget, []
        for branch, keys in forget:
            self._forget_names(branch, keys)
        if self._trim is not None:
            self._trim()  # (from this thread too: never from a request handler)
        writes = getattr(self.fs, "writes", None)
        if writes is not None:
            writes.empty.tick()  # (a renewal in a thread of its own when due: lakefuse.mount.emptyobj)
            writes.recovery.tick()  # (leftovers that wait, again when due: lakefuse.mount.recovery)
        return n

    def _forget_names(self, branch: str, keys: list[bytes]) -> None:
        """Drop the kernel's names of ``keys`` of ``branch`` (and of their directories) that the
        branch no longer has; only names the kernel holds (nodes of the mount's table) are
        looked at, one stat each."""
        if self._entry is None or not keys:
            return
        paths: set[bytes] = set()
        for k in keys:
            while k and k not in paths:
                paths.add(k)
                k = k.rpartition(b"/")[0]
        for tree in self.fs.branch_trees():
            if tree.view.branch != branch:
                continue
            for p in sorted(paths, reverse=True):  # (a file before its directory)
                nodes = [n for n in (self.fs.inodes.find(self.fs.file_key(tree, p)),
                                     self.fs.inodes.find(self.fs.dir_key(tree, p))) if n is not None]
                try:
                    if not nodes or tree.view.stat(p).exists:
                        continue
                except GravelerError as e:  # (the KV is down: the name times out)
                    log.debug("dropping the name %r on %s: %s", p, branch, e)
                    continue
                for node in nodes:
                    try:
                        self._entry(node.parent_ino, p.rpartition(b"/")[2])
                    except OSError as e:  # the kernel has no such name (dropped already: _gone)
                        log.debug("dropping the name %r on %s: %s", p, branch, e)

    def _branch_gone(self, tree) -> int:
        """Branch ``tree`` is gone: its directory's name leaves the kernel, as a removed directory's
        does, and the old directory is unnamed (:attr:`Node.unnamed`): what still holds it -- a
        shell's working directory -- sees it as ext4 shows a removed one (``nlink`` 0, empty, no
        creates: :meth:`lakefuse.mount.fs.Filesystem.gone_dir`), while the name shows what is there
        now at its next lookup. Once per directory."""
        if self._entry is None:
            return 0
        root = self.fs.inodes.find(self.fs.dir_key(tree, b""))
        if root is None or root.unnamed:
            return 0
        self.fs.inodes.replace(root)  # (a lookup of the name makes a new inode: the branch there now, if any)
        root.unnamed = True
        try:
            self._entry(root.parent_ino, tree.name.encode())
        except OSError as e:  # (the kernel had dropped the name already)
            log.debug("dropping the name of branch %s: %s", tree.name, e)
        return 1

    def _gone(self, tree, node) -> None:
        """A file held open whose name the change took away (a reset, a revert, another host's
        delete) -- or one being written here whose saved change a reset discarded -- loses its
        name too, and a copy being written here is detached
        (:meth:`lakefuse.mount.fs.Filesystem.removed_behind`: its later writes and close stage
        nothing, as an unlinked open file's). Its open descriptors keep the inode, which answers
        ``stat`` as an unlinked open file does; the kernel would otherwise take the name for that
        inode until its entry timed out (up to ``--branch-timeout``) after the change."""
        try:
            if not self.fs.removed_behind(node, tree.view.stat(node.path).value is None):
                return
            if self._entry is not None:
                self._entry(node.parent_ino, node.path.rpartition(b"/")[2])
        except (GravelerError, OSError) as e:  # (the kernel has no such name: nothing to drop)
            log.debug("dropping the name of %r: %s", node.path, e)

    def _drop(self, node) -> int:
        """Drop the kernel's attributes and pages of ``node``: its next stat asks the daemon, which
        answers from the branch as it is now (ENOENT for a name that is gone). Names are kept: an
        invalidated name would make the kernel forget the inode (a new inode number at the next
        lookup, a process's working directory shown as deleted); the kernel caches no negative
        names of a branch tree and reads its listings from the daemon anyway."""
        try:
            self._inode(node.ino)
            return 1
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):  # the kernel had no such inode: nothing to drop
                log.debug("invalidating inode %d: %s", node.ino, e)
            return 0

    def start(self) -> "StampWatch":
        self._thread = threading.Thread(target=self._run, name="lakefuse-stamp-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            with self._cv:
                if self._asked == self._answered:
                    self._cv.wait(self.interval)
                asked = self._asked
            if self._stop.is_set():
                return
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 -- the watch must outlive one bad round; requests still re-check
                log.exception("stamp watch: one round failed")
            with self._cv:
                self._answered = asked
                self._cv.notify_all()

    def poke(self, timeout: float = POKE_WAIT_S, branch: str | None = None, removed: list[bytes] = ()) -> bool:
        """Run a round now (in the watch's thread) and wait for it, at most ``timeout`` seconds:
        True once a round that began after this call has ended. ``removed``: keys of ``branch``
        a request took away (their names go in that round)."""
        with self._cv:
            if branch is not None and removed:
                self._forget.append((branch, list(removed)))
            self._asked += 1
            ticket = self._asked
            self._cv.notify_all()
            if self._thread is None:
                return False
            return self._cv.wait_for(lambda: self._answered >= ticket or self._stop.is_set(), timeout) \
                and self._answered >= ticket

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(5)
