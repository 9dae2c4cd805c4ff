"""A pinned read handle on one ref: resolve once, then stat, list and open many times.

``View(repo, ref)`` resolves ``ref`` once. For a commit, a tag or a ref
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

A view is thread-safe and holds no transaction between calls.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from graveler.errors import NotFound, StoreUnavailable
from graveler.listing import CommittedIterator, ListItem, MergedIterator, list_items
from graveler.model import Entry, Value
from graveler.refs import Commit, ResolvedRef

log = logging.getLogger(__name__)

_SEP = b"/"
_MAX_REPINS = 16


class _BranchMoved(Exception):
    """Internal: the branch record changed under a read of a branch view."""


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


class _Pin:
    """One snapshot of what the view reads: resolved ref, its commit, the branch record."""

    __slots__ = ("resolved", "commit", "raw")

    def __init__(self, resolved: ResolvedRef, commit: Commit, raw: bytes | None):
        self.resolved = resolved
        self.commit = commit
        self.raw = raw


class View:
    """A read handle on ``ref`` of ``repo`` (see the module docstring)."""

    def __init__(self, repo, ref: str):
        self.repo = repo
        self._core = repo._core  # the repository's managers (graveler-internal)
        self.ref = ref
        self._pin = self._resolve()

    # -- what the view shows ---------------------------------------------------------------

    def _resolve(self) -> _Pin:
        core = self._core
        with core.env.read() as txn:
            rr = core.refs.resolve_txn(txn, self.ref)
            commit = core.refs.get_commit_txn(txn, rr.commit_id)
            raw = core.refs.branch_raw_txn(txn, rr.branch) if rr.is_branch else None
        return _Pin(rr, commit, raw)

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
        return self.repo.change_stamp(self._pin.resolved.branch)

    def refresh(self) -> bool:
        """Re-pin a branch view now; True if what it shows moved to another head."""
        if not self.is_branch:
            return False
        old = self._pin
        self._pin = self._resolve()
        return old.commit.id != self._pin.commit.id or old.raw != self._pin.raw

    # -- reads -------------------------------------------------------------------------------

    def _iterator(self, pin: _Pin, start: bytes):
        committed = CommittedIterator(self._core.committed, pin.commit.meta_range_id, start)
        if not pin.resolved.tokens:
            return committed
        raw = pin.raw
        refs = self._core.refs
        name = pin.resolved.branch

        def guard(txn) -> None:
            if refs.branch_raw_txn(txn, name) != raw:
                raise _BranchMoved(name)

        staging = self._core.staging
        sources = [staging.iterator(t, start, guard) for t in pin.resolved.tokens]
        sources.append(committed)
        return MergedIterator(sources)

    def _run(self, fn):
        """``fn(pin)``; for a branch that moved meanwhile, re-pin and run it again."""
        for _ in range(_MAX_REPINS):
            pin = self._pin
            try:
                return fn(pin)
            except _BranchMoved:
                log.debug("view of %s: the branch moved, re-pinning", self.ref)
                if self._pin is pin:
                    self._pin = self._resolve()  # NotFound if the branch is gone
        raise StoreUnavailable(f"branch {self.ref!r} kept moving during a read")

    def get(self, path: bytes) -> Value | None:
        """The value at ``path`` exactly (None: no object there)."""
        if not self.is_branch:
            return self._core.committed.get(self._pin.commit.meta_range_id, path)
        return self.stat(path).value

    def stat(self, path: bytes) -> PathStat:
        """Object at ``path``, directory ``path/``, both or neither (``b""``: the tree root)."""
        if not path:
            return PathStat(path, None, True)
        below = path + _SEP

        def run(pin: _Pin) -> PathStat:
            it = self._iterator(pin, path)
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
            return PathStat(path, value, is_dir, marker)

        return self._run(run)

    def list_page(self, prefix: bytes, after: bytes = b"", limit: int = 1000) -> list[ListItem]:
        """Up to ``limit`` objects and common prefixes directly under ``prefix`` (a
        directory's prefix ends with ``/``), with names > ``after``, in byte order. The
        next page starts after the last name of this one; fewer than ``limit`` items
        means the listing is complete."""

        def run(pin: _Pin) -> list[ListItem]:
            start = after + b"\x00" if after else prefix
            out: list[ListItem] = []
            for item in list_items(self._iterator(pin, start), prefix, _SEP, after):
                out.append(item)
                if len(out) >= limit:
                    break
            return out

        return self._run(run)

    def open(self, entry: Entry, cache=None):
        """A read handle on ``entry``'s object. On a local store: the object's file, kept
        open (``NotFound`` now if it is missing). On a remote store: chunked ranged reads
        with sequential read-ahead through ``cache`` (a
        :class:`graveler.objstore.chunked.DataCache`, optional); a missing object is
        ``NotFound`` at the first read."""
        from graveler.objstore import LocalStore
        from graveler.objstore.chunked import ChunkedReader

        store, key = self.repo._entries.locate(entry)
        if isinstance(store, LocalStore):
            return store.open_reader(key)
        return ChunkedReader(store, key, entry.size, store.full_uri(key), entry.etag, cache)

    def __repr__(self) -> str:
        return f"View({self.repo.name}:{self.ref} -> {self._pin.commit.id[:12]})"


__all__ = ["PathStat", "View"]
