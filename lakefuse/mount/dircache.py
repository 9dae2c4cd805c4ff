"""Whole listings of directories, kept in memory: lookups answered without a thread.

A directory of a commit, tag or ref expression never changes, so once its listing is
read whole (a readdir that read it in one page; the count of its subdirectories, which
reads up to ``FsConfig.nlink_scan`` names, when it has no more; the second lookup there
that needed the KV) every name in it -- and every name not in it -- is known. The FUSE
adapter then answers, on the trio thread, from memory, without a thread hop or a KV read:
a ``lookup`` of a file there (``lookups_memory`` in ``.lakefuse/stats``; a name the
listing does not have is a negative entry at once), a ``readdir`` of it, and a
``getattr`` of it (its link count).

A branch directory's listing changes, so a second instance holds branch listings with the
change stamp each was read at (``put(..., stamp=)``, :meth:`DirCache.get_at`): the
filesystem answers a lookup from one only while the branch's stamp is still that one and
known current (:meth:`lakefuse.mount.fs.Filesystem.lookup_fast`), the rule the attributes
of a branch follow. Its listing is read whole at the second lookup that needed the KV at
the *same* stamp (``wants_whole(..., stamp=)``): a directory being read, not one being
written to, where every lookup would find the listing stale.

Bounded: directories of at most ``FsConfig.readdir_page`` names, and
``FsConfig.dir_cache_names`` names in all (the least recently used directories go
first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Hashable

from lakefuse.mount.attrs import DirEntry


class DirCache:
    """(tree key, directory path) -> {name: DirEntry} of immutable directories (LRU)."""

    def __init__(self, max_names: int):
        self.max_names = max_names
        self._dirs: OrderedDict[tuple[Hashable, bytes], dict[bytes, DirEntry]] = OrderedDict()
        self._names = 0
        self._lock = threading.Lock()
        self._misses: dict[tuple[Hashable, bytes], int] = {}  # lookups that read the KV there; -1: too big
        self._nlinks: dict[tuple[Hashable, bytes], int] = {}  # each held directory's link count
        self._stamps: dict[tuple[Hashable, bytes], int] = {}  # a branch listing's stamp (put(stamp=))

    def __len__(self) -> int:
        return len(self._dirs)

    @property
    def names(self) -> int:
        return self._names

    def get(self, tree_key: Hashable, path: bytes) -> dict[bytes, DirEntry] | None:
        """The whole listing of the directory (name -> entry), or None when not held.
        Never blocks (a dict look-up; the recency update under a lock held for no I/O)."""
        key = (tree_key, path)
        names = self._dirs.get(key)
        if names is not None:
            with self._lock:
                if key in self._dirs:
                    self._dirs.move_to_end(key)
        return names

    def get_at(self, tree_key: Hashable, path: bytes) -> tuple[dict[bytes, DirEntry], int] | None:
        """A branch directory's listing and the stamp it was read at, or None (never blocks)."""
        names = self.get(tree_key, path)
        if names is None:
            return None
        stamp = self._stamps.get((tree_key, path))
        return None if stamp is None else (names, stamp)

    def wants_whole(self, tree_key: Hashable, path: bytes, stamp: int | None = None) -> bool:
        """Whether a lookup in the directory that is about to read the KV should read the
        whole listing instead: at the second such lookup (a lone lookup reads one key, many
        read the listing once), never for a directory known to be too big. ``stamp``: a
        branch's, read just before: only the second such lookup at that same stamp (and
        never where an earlier stamp found the directory too big: one being written to
        would otherwise read a page it cannot hold at every stamp)."""
        key = (tree_key, path)
        with self._lock:
            if stamp is not None:
                if self._misses.get(key) == -1:
                    return False
                key = ((tree_key, stamp), path)
            n = self._misses.get(key, 0)
            if n == 0:
                if len(self._misses) >= 10_000:
                    self._misses.clear()
                self._misses[key] = 1
            return n > 0

    def too_big(self, tree_key: Hashable, path: bytes) -> None:
        """The directory has more names than are held: lookups there read the KV (a branch
        directory's at every stamp, until a listing of it is held: :meth:`put`)."""
        with self._lock:
            self._misses[(tree_key, path)] = -1

    def nlink(self, tree_key: Hashable, path: bytes) -> int | None:
        """The link count of a held directory (:func:`lakefuse.mount.listing.nlink`'s rule,
        from the listing read), or None. Never blocks."""
        return self._nlinks.get((tree_key, path))

    def put(self, tree_key: Hashable, path: bytes, entries: list[DirEntry], nlink: int,
            stamp: int | None = None) -> dict[bytes, DirEntry]:
        """Hold ``entries``, the whole visible listing of a directory, and its link count;
        ``stamp``: a branch directory's, the change stamp it was read at."""
        names = {e.name: e for e in entries}
        if len(names) > self.max_names:
            return names
        key = (tree_key, path)
        with self._lock:
            self._misses.pop(key, None)
            old = self._dirs.pop(key, None)
            if old is not None:
                self._names -= len(old)
            self._dirs[key] = names
            self._nlinks[key] = nlink
            if stamp is not None:
                self._stamps[key] = stamp
            self._names += len(names)
            while self._names > self.max_names and self._dirs:
                k, gone = self._dirs.popitem(last=False)
                self._nlinks.pop(k, None)
                self._stamps.pop(k, None)
                self._names -= len(gone)
        return names

    def drop_tree(self, tree_key: Hashable) -> None:
        """Forget every directory of one tree (the tree is no longer shown)."""
        with self._lock:
            for key in [k for k in self._dirs if k[0] == tree_key]:
                self._names -= len(self._dirs.pop(key))
                self._nlinks.pop(key, None)
                self._stamps.pop(key, None)
