"""A bound on the inodes a mount keeps for the commit and tag trees the kernel caches.

The kernel holds an inode for every name it looked up or listed (``ls`` of a directory: each of
its files), and a FUSE daemon must keep each such inode until the kernel forgets it -- which the
kernel does only under its own memory pressure. A daemon that lists the same directory of many
commits (a job comparing versions) keeps about 1-2 KB for each file of each: 700 commits of a
500-file directory were 1.2 GB, and a daemon in a memory-limited cgroup was killed while the
kernel, outside that limit, saw no reason to forget anything.

So when the mount keeps more than ``FsConfig.max_inodes`` inodes, the stamp watch's thread
(:mod:`lakefuse.mount.watch`) tells the kernel to drop the names of files of the commit and tag
trees the mount has known longest -- files only, and none open, so no process's working
directory or open file is disturbed -- until it is back under 80% of the bound; the kernel then
forgets those inodes (``forget``) and the mount frees them. A name dropped is looked up again
when used (from the tree's listing in memory when held, with its inode number back): nothing
visible changes, as when the kernel forgets it by itself. ``.lakefuse/stats`` counts
``inodes_handed_back``.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from lakefuse.mount.inodes import Kind

log = logging.getLogger(__name__)

KEEP = 0.8  # a trim brings the inodes down to this share of the bound
ASKED_S = 30.0  # a name the kernel was asked to drop is not asked again for this long
RESCAN_S = 5.0  # after a pass that found too few names to drop: how long until the next full pass...
RESCAN_GROWTH = 0.05  # ... unless the table grew by this share of the bound meanwhile


class Trimmer:
    """The trim (see the module docstring), called by the stamp watch at each of its rounds. It
    remembers what it asked (on the node: one the kernel forgot and looked up again is a new
    node): a name the kernel kept is not asked for again for :data:`ASKED_S`, and while the
    inodes over the bound are mostly ones no trim may drop (branch trees, open files) it does
    not read the whole table at every round -- only after :data:`RESCAN_S`, or once the table
    grew by :data:`RESCAN_GROWTH` of the bound."""

    def __init__(self, fs, invalidate_entry: Callable[[int, bytes], None], clock: Callable[[], float] = time.monotonic):
        self.fs = fs
        self.invalidate_entry = invalidate_entry
        self.clock = clock
        self._idle_until = 0.0  # no full pass before this, unless the table grows past _idle_size
        self._idle_size = 0
        self.passes = 0  # full passes over the table (for tests and stats)

    def __call__(self) -> int:
        """If the mount keeps more inodes than its bound: drop from the kernel the names of unopened
        files of the oldest immutable trees, as many as bring it to :data:`KEEP` of the bound; how many."""
        fs = self.fs
        limit = fs.config.max_inodes
        size = len(fs.inodes)
        if not limit or size <= limit:
            self._idle_until = 0.0
            return 0
        now = self.clock()
        if now < self._idle_until and size < self._idle_size + limit * RESCAN_GROWTH:
            return 0
        self.passes += 1
        want = size - int(limit * KEEP)
        files: dict = {}
        for node in fs.inodes.snapshot():
            tree = node.tree
            if tree is not None and tree.immutable and node.kind == Kind.FILE and node.opens == 0 \
                    and now - node.trim_asked >= ASKED_S:  # (a node made again since: never asked)
                files.setdefault(tree.key, []).append(node)
        n = 0
        for tree in fs.immutable_trees():
            for node in files.get(tree.key, ()):
                try:
                    self.invalidate_entry(node.parent_ino, node.path.rpartition(b"/")[2])
                except OSError:  # (the kernel has no such name any more)
                    pass
                node.trim_asked = now
                n += 1
            if n >= want:
                break
        if n < want:  # (what is left over the bound is not ours to drop: look again later)
            self._idle_until, self._idle_size = now + RESCAN_S, size
        if n:
            fs.stats.add("inodes_handed_back", n)
            log.info("kept %d inodes (bound %d): the kernel was asked to drop %d names of files of older commit "
                     "and tag trees", size, limit, n)
        return n
