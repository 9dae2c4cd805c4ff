"""A pinned read handle on one ref: resolve once, then stat, list and open many times.

``repo.view(ref)`` resolves ``ref`` once. For a commit, a tag or a ref
expression (``main~1``, ``v1^2``, a commit-ID prefix, ``main@``) the view is
immutable: it reads the commit it resolved to, forever. For a branch it shows the
branch's live state, staging over head: staged writes are read as they land,
and when the branch record moves (a commit, a merge, a reset) the view re-pins
itself to the new head and retries the read, so it never reads a staging token
that a commit has dropped.

* :meth:`View.stat` answers "object, directory, or both" for one path in one seek
  (a second one only when keys such as ``x-1`` sort between ``x`` and ``x/``).
* :meth:`View.list_page` returns one page of a directory listing (objects and
  common prefixes) after a given name, skipping each sub-directory with one seek.
* :meth:`View.open` opens an entry's object for positional reads
  (:class:`graveler.objstore.base.ObjectReader`): a kept descriptor on a local
  store, ranged reads on S3.

A view is thread-safe and holds no transaction between calls. It reads through the
repository's pinned reads (:meth:`graveler.core.RepoCore.pin`): the same staged-over-
committed read as :class:`graveler.repository.Repository`'s own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import islice

from graveler.core import Pin, RepoCore
from graveler.errors import CorruptedData, NotFound
from graveler.kv.base import prefix_successor
from graveler.listing import ListItem, list_items
from graveler.model import AddressType, Entry, EntryLocation, Value
from graveler.objects import EntryReader, is_md5_etag
from graveler.objstore.local import LocalStore
from graveler.refs import Commit, ResolvedRef

log = logging.getLogger(__name__)

_SEP = b"/"


@dataclass(frozen=True, slots=True)
class PathStat:
    """What a view holds at one path: an object (``value``), a directory (some key
    lies below ``path + "/"``), both, or neither."""

    path: bytes
    value: Value | None
    is_dir: bool
    marker: Value | None = None  # the directory marker ``path/`` (its POSIX attributes), if there is one

    @property
    def exists(self) -> bool:
        return self.value is not None or self.is_dir

    @property
    def entry(self) -> Entry:
        if self.value is None:
            raise NotFound(f"{self.path!r} is not an object")
        return Entry.from_value(self.value)


class View:
    """A read handle on one ref of a repository (see the module docstring); get it from
    :meth:`graveler.repository.Repository.view`."""

    def __init__(self, core: RepoCore, entries: EntryReader, ref: str):
        self._core = core
        self._entries = entries
        self.ref = ref
        self._pin = core.pin(ref)
        self.born = self._pin.born  # a branch's birth: the view follows that branch, never a later one of its name

    # -- what the view shows ---------------------------------------------------------------

    @property
    def resolved(self) -> ResolvedRef:
        return self._pin.resolved

    @property
    def commit(self) -> Commit:
        """The commit the view reads (a branch's head as of the last re-pin)."""
        return self._pin.commit

    @property
    def commit_id(self) -> str:
        return self._pin.commit.id

    @property
    def is_branch(self) -> bool:
        return self._pin.resolved.is_branch

    @property
    def branch(self) -> str | None:
        """The branch name for a branch view (None for an immutable one)."""
        return self._pin.resolved.branch if self.is_branch else None

    def change_stamp(self) -> int:
        """A number that changes whenever what a branch view shows may have changed
        (staged writes, commits, head moves); constant for an immutable view."""
        if not self.is_branch:
            return 0
        return self._core.change_stamp(self._pin.resolved.branch)

    def refresh(self) -> bool:
        """Re-pin a branch view now; True if what it shows moved to another head."""
        if not self.is_branch:
            return False
        old = self._pin
        self._pin = self._same_branch(self._core.repin(self.ref, old))
        return old.commit.id != self._pin.commit.id or old.raw != self._pin.raw

    def _same_branch(self, pin: Pin) -> Pin:
        """``pin``, unless its branch is a later one of the view's name (the view's was deleted,
        and a branch of its name made since): NotFound, as for a branch gone."""
        if pin.born != self.born:
            raise NotFound(f"branch {self.ref!r} was deleted (a branch of that name was made again since)")
        return pin

    def current(self, raw: bytes) -> bool:
        """Whether the view still shows the branch whose record is stored as ``raw`` (what a
        staged write of this process read in its transaction: :meth:`Repository.stage_stamped`);
        if not, it re-pins now. Reads nothing when it does."""
        if self._pin.raw == raw:
            return True
        self.refresh()
        return False

    # -- reads -------------------------------------------------------------------------------

    def _run(self, fn):
        """``fn(pin)``; for a branch that moved meanwhile, pin again and run it again."""
        first = self._pin

        def run(pin: Pin):
            if pin is not first:
                self._same_branch(pin)
                if self._pin is first:
                    self._pin = pin  # later reads start from the newer pin
            return fn(pin)

        return self._core.pinned(self.ref, run, pin=first)

    def get(self, path: bytes) -> Value | None:
        """The value at ``path`` exactly (None: no object there)."""
        return self._run(lambda pin: self._core.value_at(pin, path))

    def stat(self, path: bytes) -> PathStat:
        """Object at ``path``, directory ``path/``, both or neither (``b""``: the tree root)."""
        if not path:
            return PathStat(path, None, True)
        below = path + _SEP

        def run(pin: Pin) -> PathStat:
            # it reads one to three entries (not a 64-entry batch), none past the keys under path/
            # (a damaged range after them must not fail a healthy path's stat)
            it = self._core.iterator(pin, path, batch=4, end=prefix_successor(below))
            item = it.next()
            value = None
            if item is not None and item[0] == path:
                value = item[1]
                item = it.next()
            is_dir = False
            marker = None
            if item is not None and item[0].startswith(path):
                if item[0].startswith(below):
                    is_dir = True
                    if item[0] == below:
                        marker = item[1]
                elif item[0] < below:  # e.g. "x-1" sorts between "x" and "x/": seek past them
                    it.seek_ge(below)
                    item = it.next()
                    is_dir = item is not None and item[0].startswith(below)
                    if is_dir and item[0] == below:  # (its marker: the directory's own attributes)
                        marker = item[1]
            return PathStat(path, value, is_dir, marker)

        return self._run(run)

    def list_page(self, prefix: bytes, after: bytes = b"", limit: int = 1000) -> list[ListItem]:
        """Up to ``limit`` objects and common prefixes directly under ``prefix`` (a
        directory's prefix ends with ``/``), with names > ``after``, in byte order. The
        next page starts after the last name of this one; fewer than ``limit`` items
        means the listing is complete."""

        def run(pin: Pin) -> list[ListItem]:
            start = after + b"\x00" if after else prefix
            # (no range after the prefix's keys is opened: list_items reads ahead a batch at a time)
            it = self._core.iterator(pin, start, end=prefix_successor(prefix))
            return list(islice(list_items(it, prefix, _SEP, after), limit))

        return self._run(run)

    def open(self, entry: Entry, cache=None):
        """A read handle on ``entry``'s object. On a local store: the object's file, kept
        open (``NotFound`` now if it is missing). On a remote store: chunked ranged reads
        with sequential read-ahead through ``cache`` (a
        :class:`graveler.objstore.chunked.DataCache`, optional); a missing object is
        ``NotFound`` at the first read."""
        from graveler.objstore import LocalStore
        from graveler.objstore.chunked import ChunkedReader

        store, key = self._entries.locate(entry)
        if isinstance(store, LocalStore):
            reader = store.open_reader(key)
            if entry.address_type == AddressType.FULL and is_md5_etag(entry.etag) and reader.size == entry.size:
                # an imported file, outside the namespace: anyone may have changed it in place since
                # (same size: a stream of it, or the kernel reading it, would hand out its new bytes)
                got = reader.etag()  # (remembered by size and mtime: hashed again only after a change)
                if got != entry.etag:
                    reader.close()
                    # (what it holds now is not said, not even its MD5: the file may have been
                    # swapped for a link to one the log's readers may not read)
                    raise CorruptedData(f"{store.full_uri(key)} is not the object its entry names: it changed "
                                        f"since it was imported (its MD5 is no longer {entry.etag})")
            return reader
        return ChunkedReader(store, key, entry.size, store.full_uri(key), entry.etag, cache)

    def open_cached(self, entry: Entry | EntryLocation):
        """:meth:`open` of an object in this repository's local store when it opens from
        the kernel's caches alone (never waits for the disk), else None: then :meth:`open`.
        ``entry``: an :class:`Entry` or its :class:`EntryLocation` (cheaper to decode)."""
        if entry.address_type == AddressType.FULL:  # maybe another store, made at its first use
            return None
        store, key = self._entries.locate(entry)
        return store.open_reader_cached(key) if isinstance(store, LocalStore) else None

    def __repr__(self) -> str:
        return f"View({self._core.name}:{self.ref} -> {self._pin.commit.id[:12]})"


__all__ = ["PathStat", "View"]
