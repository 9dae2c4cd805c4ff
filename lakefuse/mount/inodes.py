"""The inode table: numbers for what the kernel knows, and lookup counts.

Every successful ``lookup`` (and every entry a READDIRPLUS reply hands over)
raises a node's lookup count by one; ``forget`` lowers it. A node at zero with
no open handle is dropped, so memory follows what the kernel keeps, however many
files a walk touches. Inode numbers are never reused for anything else (a 64-bit
counter), so the generation is always 0; but a name of a tree gets the number it had
back when it is looked up again after the kernel forgot it (the last :data:`KEEP_GONE`
such numbers are kept): the inode numbers a kept listing shows (FOPEN_CACHE_DIR) stay
those ``stat`` shows, and a branch file keeps its ``st_ino`` however often the kernel
drops its inode (tools that compare ``st_ino`` -- git's index, ``find -newer`` runs,
backup tools -- see the same file). As on ext4, a new file may get the number of one
removed before it; a number is never given to two live nodes.

A node is keyed by what it shows (its tree and path, or a fixed name); looking
the same thing up again gives the same inode while the kernel still knows it.
"""

from __future__ import annotations

import enum
import errno
import threading
from typing import Callable, Hashable

from graveler.model import entry_location
from lakefuse.mount.errors import FsError

ROOT_INO = 1
KEEP_GONE = 100_000  # numbers of dropped nodes kept for their next lookup
_KEEP = object()
# a node's (attr, value, stamp) changes as one, never back to an older stamp (Node.take)
_STATE = threading.Lock()


class Kind(enum.IntEnum):
    ROOT = 1  # the mount root: one directory per branch and tag
    INFO_DIR = 2  # a .lakefuse directory (the root's or a tree's)
    INFO_FILE = 3  # a generated read-only file in a .lakefuse directory
    DIR = 4  # a directory of a ref's tree (the tree's root when path == b"")
    FILE = 5  # an object of a ref's tree (a regular file or a symlink)


class Node:
    """One inode. ``tree`` is the ref tree it belongs to (None for the root and the
    root's .lakefuse); ``path`` is the directory path or object key in that tree
    (for INFO nodes, the file name). ``attr`` and ``value`` are what the core last
    read, valid while ``stamp`` equals the tree's change stamp."""

    __slots__ = ("ino", "key", "kind", "tree", "path", "parent_ino", "nlookup", "opens",
                 "attr", "value", "stamp", "opened_identity", "renamed_over", "unnamed", "trim_asked")

    def __init__(self, ino: int, key: Hashable, kind: Kind, tree, path: bytes, parent_ino: int):
        self.ino = ino
        self.key = key
        self.kind = kind
        self.tree = tree
        self.path = path
        self.parent_ino = parent_ino
        self.nlookup = 0
        self.opens = 0
        self.trim_asked = float("-inf")  # when the inode bound's trim last asked the kernel to drop its name (trim.py)
        self.attr = None
        self.value = None
        self.stamp = -1
        self.opened_identity: bytes | None = None
        self.renamed_over = False  # a file this mount renamed another over (Opens._open_tree_file)
        # unlinked, removed or renamed over through this mount: no name reaches it any more, only
        # its descriptors (fchmod, fsetxattr): their changes stay with the inode (writes.py)
        self.unnamed = False

    def take(self, attr, stamp: int, value=_KEEP) -> bool:
        """Take ``attr`` (and ``value``) as read at the branch's ``stamp``, unless the node holds a
        state read or staged at a later stamp (False): threads read a branch file's entry while a
        save stages its next version, and one that read before the save must not put the older
        size back -- the kernel would take it from a later lookup or getattr, cut reads short,
        and place an ``O_APPEND`` write over the last one."""
        with _STATE:
            if stamp < self.stamp:
                return False
            self.attr = attr
            if value is not _KEEP:
                self.value = value
            self.stamp = stamp
            return True

    def __repr__(self) -> str:
        return f"Node({self.ino}, {self.kind.name}, {self.path!r}, nlookup={self.nlookup})"

    def take_file(self, attr, stamp: int, value, spooled) -> bool:
        """:meth:`take` of a branch file's entry read at ``stamp``, unless it names another object
        while the file is open (:meth:`other_object`): then False, nothing taken (it was replaced
        behind the mount). The check and the take are one step against :meth:`holds` (an open
        that pins what it serves): a version an open did not serve never shows under its handles."""
        written = spooled(self.ino) is not None
        with _STATE:
            if not written and self._open_on_another(value):
                return False
            if stamp >= self.stamp:
                self.attr, self.value, self.stamp = attr, value, stamp
            return True

    def holds(self, value) -> bool:
        """Whether the node still holds ``value`` (the entry an open of it serves), checked once
        the open counts (``opens`` raised): a :meth:`take_file` that came between the open's read
        of the node and its count put a newer version in its place."""
        with _STATE:
            return self.value is value or (self.value is not None and self.value.identity == value.identity)

    def other_object(self, value, spooled) -> bool:
        """Whether ``value``, read at this open branch file's key, names another object than the
        one it read (not a change of metadata only): it was replaced behind the mount while open,
        and its handles keep what they opened, as if it were renamed over. Never a file this mount
        writes (``spooled(ino)``: its spool file; its saves race with what the branch shows)."""
        return (self.kind == Kind.FILE and not self.tree.immutable and self._open_on_another(value)
                and spooled(self.ino) is None)

    def _open_on_another(self, value) -> bool:
        """Open, and ``value`` names another object than the one the node holds."""
        return self.opens > 0 and self.value is not None and entry_location(value) != entry_location(self.value)


class InodeTable:
    """Thread-safe map of inode numbers to nodes (and keys to inode numbers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[int, Node] = {}
        self._by_key: dict[Hashable, int] = {}
        self._gone: dict[Hashable, int] = {}  # key of a dropped node of an immutable tree -> its number
        self._next = ROOT_INO + 1
        self.on_drop: Callable[[Node], None] | None = None
        self.on_new: Callable[[list[Node]], None] | None = None  # nodes just made (one call a batch)
        root = Node(ROOT_INO, ("root",), Kind.ROOT, None, b"", ROOT_INO)
        root.nlookup = 1  # the kernel never forgets the root
        self._nodes[ROOT_INO] = root
        self._by_key[root.key] = ROOT_INO

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, ino: int) -> Node:
        node = self._nodes.get(ino)
        if node is None:
            raise FsError(errno.ESTALE, f"inode {ino} is not known")
        return node

    def peek(self, ino: int) -> Node | None:
        """The node of ``ino``, or None (never raises)."""
        return self._nodes.get(ino)

    def find(self, key: Hashable) -> Node | None:
        ino = self._by_key.get(key)
        return self._nodes.get(ino) if ino is not None else None

    def acquire(self, key: Hashable, kind: Kind, tree, path: bytes, parent_ino: int,
                lookups: int = 1) -> tuple[Node, bool]:
        """The node for ``key`` (a new one of these fields if there is none), its lookup
        count raised by ``lookups``; and whether it is new."""
        with self._lock:
            ino = self._by_key.get(key)
            node = self._nodes.get(ino) if ino is not None else None
            new = node is None
            if new:
                node = self._make(key, kind, tree, path, parent_ino)
            node.nlookup += lookups
        if new and self.on_new is not None:
            self.on_new([node])
        return node, new

    def _make(self, key: Hashable, kind: Kind, tree, path: bytes, parent_ino: int) -> Node:
        """A new node for ``key`` (the lock held): the number it had before the kernel forgot
        it (an immutable tree's, :meth:`forget`), else the next one."""
        ino = self._gone.pop(key, None) if self._gone else None
        if ino is None:
            ino = self._next
            self._next += 1
        node = Node(ino, key, kind, tree, path, parent_ino)
        self._nodes[ino] = node
        self._by_key[key] = ino
        return node

    def acquire_many(self, entries, parent_ino: int) -> list[Node]:
        """:meth:`acquire` (one lookup each) of every entry of a readdir reply, under one lock:
        ``entries`` have ``key``, ``kind``, ``tree`` and ``path``. A new node has no ``attr`` yet."""
        out: list[Node] = []
        append = out.append
        made = []
        with self._lock:
            nodes, by_key, make = self._nodes, self._by_key, self._make
            for e in entries:
                key = e.key
                ino = by_key.get(key)
                node = nodes.get(ino) if ino is not None else None
                if node is None:
                    node = make(key, e.kind, e.tree, e.path, parent_ino)
                    made.append(node)
                node.nlookup += 1
                append(node)
        if made and self.on_new is not None:
            self.on_new(made)
        return out

    def numbers(self, keys) -> list[int]:
        """Inode numbers for entries a plain READDIR reports (no lookup taken, no node made): a
        live node's, else the one the key had before (or was given by an earlier listing), else a
        new one, remembered with the numbers of forgotten nodes for the key's first lookup (the
        last :data:`KEEP_GONE` of them): ``d_ino`` is the ``st_ino`` a later ``stat`` shows."""
        out: list[int] = []
        append = out.append
        with self._lock:
            by_key, gone = self._by_key, self._gone
            for key in keys:
                ino = by_key.get(key)
                if ino is None:
                    ino = gone.get(key)
                    if ino is None:
                        ino = self._next
                        self._next += 1
                        if len(gone) >= KEEP_GONE:
                            gone.clear()
                        gone[key] = ino
                append(ino)
        return out

    def incref(self, node: Node, n: int = 1) -> None:
        """One more lookup of a node the kernel already holds (``.`` / ``..``)."""
        with self._lock:
            node.nlookup += n

    def replace(self, node: Node) -> None:
        """Detach ``node`` from its key (what it showed is gone or changed kind): the next
        lookup of the key makes a new inode; this one lives until forgotten."""
        with self._lock:
            if self._by_key.get(node.key) == node.ino:
                del self._by_key[node.key]

    def attached(self, node: Node) -> bool:
        """True while ``node`` answers to its key (not unlinked, replaced or renamed over)."""
        with self._lock:
            return self._by_key.get(node.key) == node.ino

    def rekey(self, node: Node, key: Hashable, path: bytes) -> None:
        """``node`` now shows ``path`` (a rename): it answers to ``key`` from now on."""
        with self._lock:
            if self._by_key.get(node.key) == node.ino:
                del self._by_key[node.key]
            node.key = key
            node.path = path
            self._by_key[key] = node.ino

    def rekey_prefix(self, tree_key: Hashable, src: bytes, dst: bytes) -> int:
        """Every node of the tree ``tree_key`` at ``src`` or below now shows the same
        name under ``dst`` (a directory rename); keys are ``(kind, tree_key, path)``.
        Returns how many nodes moved."""
        below = src + b"/"
        n = 0
        with self._lock:
            for node in list(self._nodes.values()):
                k = node.key
                if not (isinstance(k, tuple) and len(k) == 3 and k[1] == tree_key):
                    continue
                p = node.path
                if p != src and not p.startswith(below):
                    continue
                if self._by_key.get(k) == node.ino:
                    del self._by_key[k]
                node.path = dst + p[len(src):]
                node.key = (k[0], k[1], node.path)
                self._by_key[node.key] = node.ino
                n += 1
        return n

    def snapshot(self) -> list[Node]:
        """Every node (a snapshot)."""
        with self._lock:
            return list(self._nodes.values())

    def of_tree(self, tree_key: Hashable) -> list[Node]:
        """Every node of one tree (a snapshot)."""
        with self._lock:
            return [n for n in self._nodes.values() if n.tree is not None and n.tree.key == tree_key]

    def forget(self, ino: int, n: int) -> None:
        with self._lock:
            node = self._nodes.get(ino)
            if node is None or ino == ROOT_INO:
                return
            node.nlookup = max(node.nlookup - n, 0)
            dropped = self._maybe_drop(node)
        if dropped and self.on_drop is not None:
            self.on_drop(node)

    def open(self, node: Node) -> None:
        with self._lock:
            node.opens += 1

    def close(self, node: Node) -> None:
        with self._lock:
            node.opens = max(node.opens - 1, 0)
            dropped = self._maybe_drop(node)
        if dropped and self.on_drop is not None:
            self.on_drop(node)

    def _maybe_drop(self, node: Node) -> bool:
        if node.nlookup > 0 or node.opens > 0 or self._nodes.get(node.ino) is not node:
            return False
        del self._nodes[node.ino]
        if self._by_key.get(node.key) == node.ino:
            del self._by_key[node.key]
            if node.tree is not None:  # the same number at its next lookup (a file of any tree)
                if len(self._gone) >= KEEP_GONE:
                    self._gone.clear()
                self._gone[node.key] = node.ino
        return True
