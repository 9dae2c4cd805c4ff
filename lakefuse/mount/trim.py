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
from typing import Callable

from lakefuse.mount.inodes import Kind

log = logging.getLogger(__name__)

KEEP = 0.8  # a trim brings the inodes down to this share of the bound


def trim(fs, invalidate_entry: Callable[[int, bytes], None]) -> int:
    """If ``fs`` keeps more inodes than its bound: drop from the kernel the names of unopened files
    of the oldest immutable trees, as many as bring it to :data:`KEEP` of the bound; how many."""
    limit = fs.config.max_inodes
    if not limit or len(fs.inodes) <= limit:
        return 0
    want = len(fs.inodes) - int(limit * KEEP)
    files: dict = {}
    for node in fs.inodes.snapshot():
        tree = node.tree
        if tree is not None and tree.immutable and node.kind == Kind.FILE and node.opens == 0:
            files.setdefault(tree.key, []).append(node)
    n = 0
    for tree in fs.immutable_trees():
        for node in files.get(tree.key, ()):
            try:
                invalidate_entry(node.parent_ino, node.path.rpartition(b"/")[2])
            except OSError:  # (the kernel has no such name any more)
                pass
            n += 1
        if n >= want:
            break
    if n:
        fs.stats.add("inodes_handed_back", n)
        log.info("kept %d inodes (bound %d): the kernel was asked to drop %d names of files of older commit "
                 "and tag trees", len(fs.inodes), limit, n)
    return n
