"""The Graveler facade: repositories and their version-control operations.

``Graveler`` (defined in :mod:`graveler.repository`, re-exported here) owns the
lakefuse home: create / open / list / delete repositories. A ``Repository`` is
one repository's operations: branches, tags, staging, reads and listings
(staging over committed), commit, log, diff, merge, revert, reset, data upload /
read, refs dump / restore, adopting a metarange::

    g = Graveler(GravelerConfig.from_home(None))
    repo = g.create_repository("demo", "file:///data/demo")   # or g.repository("demo")
    repo.upload("main", "a/b.csv", b"x,y\n")
    repo.commit("main", "first")

Concurrency: any number of threads and processes may use the same repository.
Refs and staging share one LMDB environment, so a staging write reads the
branch and writes to its current token in one write transaction, and a commit
seals the token in one transaction: a write lands either in the commit or in
the next one, never in between. Object-store I/O (uploads, range and
metarange writes) always happens outside LMDB transactions; a commit finishes
with a compare-and-set of the branch and retries (re-reading the branch) when
another operation moved it. Nothing staged is dropped until the branch record
that referenced it has moved on.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from datetime import datetime
from typing import BinaryIO, Iterable, Iterator

from graveler.committed.manager import ApplyStats, CommittedManager
from graveler.errors import (
    Conflict,
    DirtyBranch,
    InvalidArgument,
    NotFound,
    NothingToCommit,
    PreconditionFailed,
    ReadOnlyRef,
)
from graveler.kv import Env
from graveler.listing import CommittedIterator, ListItem, MergedIterator, list_items
from graveler.model import AddressType, DiffRecord, DiffType, Entry, MergeStrategy, Value
from graveler.objects import md5_file, md5_hex, new_data_address, split_full_address, spool
from graveler.refs import (
    Branch,
    Commit,
    RefManager,
    RefType,
    RepositoryRecord,
    ResolvedRef,
    Tag,
    new_staging_token,
    validate_branch_name,
)
from graveler.repository import Graveler, GravelerConfig
from graveler.staging import StagingManager, as_path, as_prefix

log = logging.getLogger(__name__)

MERGE_STRATEGY_METADATA_KEY = ".lakefs.merge.strategy"  # lakeFS's key on merge commits
_STRATEGY_NAMES = {MergeStrategy.NONE: "default", MergeStrategy.DEST_WINS: "dest-wins", MergeStrategy.SOURCE_WINS: "source-wins"}


class Repository:
    """One repository's operations. Thread-safe; get it from :class:`Graveler`."""

    def __init__(self, graveler: Graveler, env: Env, record: RepositoryRecord, store, committed: CommittedManager):
        self.graveler = graveler
        self.config = graveler.config
        self.env = env
        self.record = record
        self.store = store
        self.committed = committed
        self.refs = RefManager(env)
        self.staging = StagingManager(env)
        self._stores_lock = threading.Lock()
        self._full_stores: dict[str, object] = {}

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def default_branch(self) -> str:
        return self.record.default_branch

    # ------------------------------------------------------------------ refs

    def resolve(self, ref: str) -> ResolvedRef:
        """Resolve a ref expression (branch, tag, commit ID or prefix, ``~N``, ``^N``, ``BRANCH@``)."""
        return self.refs.resolve(ref)

    def get_commit(self, ref: str) -> Commit:
        """The commit a ref expression points at (a branch's head)."""
        with self.env.read() as txn:
            rr = self.refs.resolve_txn(txn, ref)
            return self.refs.get_commit_txn(txn, rr.commit_id)

    def _resolve_commit(self, ref: str) -> tuple[ResolvedRef, Commit]:
        with self.env.read() as txn:
            rr = self.refs.resolve_txn(txn, ref)
            return rr, self.refs.get_commit_txn(txn, rr.commit_id)

    def _branch_txn(self, txn, name: str) -> Branch:
        """The branch ``name``; ReadOnlyRef if ``name`` is a tag / commit / expression."""
        try:
            return self.refs.get_branch_txn(txn, name)
        except NotFound:
            try:
                rr = self.refs.resolve_txn(txn, name)
            except (NotFound, InvalidArgument):
                raise NotFound(f"branch {name!r} not found") from None
            raise ReadOnlyRef(f"{name!r} is a {rr.type.value}, not a branch: it cannot be changed") from None

    def get_branch(self, name: str) -> Branch:
        """A branch record (head commit, staging token, sealed tokens)."""
        with self.env.read() as txn:
            return self._branch_txn(txn, name)

    def list_branches(self) -> list[Branch]:
        """All branches, by name."""
        return self.refs.list_branches()

    def create_branch(self, name: str, source: str | None = None) -> Branch:
        """Create branch ``name`` at the commit ``source`` resolves to (default: the
        default branch's head). Staged changes of a source branch are not copied."""
        validate_branch_name(name)

        def fn(txn):
            rr = self.refs.resolve_txn(txn, source or self.default_branch)
            return self.refs.create_branch_txn(txn, name, rr.commit_id)

        b = self.env.write(fn)
        log.info("%s: created branch %s at %s", self.name, name, b.commit_id[:12])
        return b

    def delete_branch(self, name: str) -> None:
        """Delete a branch and its staged changes (not the default branch)."""
        if name == self.default_branch:
            raise Conflict(f"cannot delete the default branch {name!r}")
        b = self.env.write(lambda txn: self.refs.delete_branch_txn(txn, name))
        self.staging.drop_many(b.tokens)
        log.info("%s: deleted branch %s", self.name, name)

    def get_tag(self, name: str) -> Tag:
        with self.env.read() as txn:
            return self.refs.get_tag_txn(txn, name)

    def list_tags(self) -> list[Tag]:
        """All tags, by name."""
        return self.refs.list_tags()

    def create_tag(self, name: str, ref: str) -> Tag:
        """Tag the commit ``ref`` resolves to (a branch's head: staging is not part of it)."""

        def fn(txn):
            rr = self.refs.resolve_txn(txn, ref)
            return self.refs.create_tag_txn(txn, name, rr.commit_id)

        return self.env.write(fn)

    def delete_tag(self, name: str) -> None:
        self.env.write(lambda txn: self.refs.delete_tag_txn(txn, name))

    # ------------------------------------------------------------------ staging writes

    def stage(self, branch: str, path: str | bytes, entry: Entry | Value) -> None:
        """Stage an entry (or raw record value) at ``path`` on ``branch``."""
        p = as_path(path)
        v = entry.to_value() if isinstance(entry, Entry) else entry

        def fn(txn):
            b = self._branch_txn(txn, branch)
            self.staging.set_txn(txn, b.staging_token, p, v)

        self.env.write(fn)

    def stage_many(self, branch: str, items: Iterable[tuple[str | bytes, Entry | Value | None]]) -> int:
        """Stage many entries (None = delete) in one transaction; return how many."""
        prepared = [(as_path(p), e.to_value() if isinstance(e, Entry) else e) for p, e in items]

        def fn(txn):
            b = self._branch_txn(txn, branch)
            return self.staging.set_many_txn(txn, b.staging_token, prepared)

        return self.env.write(fn)

    def delete(self, branch: str, path: str | bytes, must_exist: bool = True) -> None:
        """Delete ``path`` on ``branch`` (stages a tombstone). NotFound if the
        path does not exist on the branch and ``must_exist``."""
        p = as_path(path)
        if must_exist:
            self.get_value(branch, p)  # NotFound, or ReadOnlyRef-worthy refs fail below
        self.stage_many(branch, [(p, None)])

    def delete_prefix(self, branch: str, prefix: str | bytes, batch: int = 1000) -> int:
        """Delete every path under ``prefix`` on ``branch`` (tombstones, ``batch`` per
        transaction); return how many. An empty prefix is refused."""
        pfx = as_prefix(prefix)
        if not pfx:
            raise InvalidArgument("delete_prefix needs a non-empty prefix")
        with self.env.read() as txn:
            self._branch_txn(txn, branch)
        n = 0
        pending: list[tuple[bytes, None]] = []
        for item in self.list(branch, pfx, delimiter=b""):
            pending.append((item.path, None))
            if len(pending) >= batch:
                n += self.stage_many(branch, pending)
                pending = []
        if pending:
            n += self.stage_many(branch, pending)
        return n

    def reset(self, branch: str, path: str | bytes | None = None, prefix: str | bytes | None = None) -> None:
        """Discard uncommitted changes on ``branch``: all of them, one ``path``, or
        every path under ``prefix``."""
        if path is not None and prefix is not None:
            raise InvalidArgument("reset takes a path or a prefix, not both")
        if path is None and prefix is None:
            b = self.env.write(lambda txn: self._reset_all_txn(txn, branch))
            self.staging.drop_many(b.tokens)
            log.info("%s: reset branch %s", self.name, branch)
            return
        is_prefix = prefix is not None
        key = as_prefix(prefix) if is_prefix else as_path(path)
        for attempt in range(self.config.commit_retries):
            with self.env.read() as txn:
                b = self._branch_txn(txn, branch)
                head = self.refs.get_commit_txn(txn, b.commit_id)
            # Paths that sealed tokens (an unfinished commit) change: override them in the
            # current token with the committed value. Sealed tokens themselves never change.
            sealed_keys: list[bytes] = []
            if b.sealed_tokens:
                if is_prefix:
                    it = MergedIterator([self.staging.iterator(t, key) for t in b.sealed_tokens], keep_tombstones=True)
                    for k, _ in it:
                        if not k.startswith(key):
                            break
                        sealed_keys.append(k)
                else:
                    with self.env.read() as txn:
                        found, _ = self.staging.get_txn(txn, b.sealed_tokens, key)
                    if found:
                        sealed_keys.append(key)
            overrides = [(k, self.committed.get(head.meta_range_id, k)) for k in sealed_keys]

            def fn(txn):
                b2 = self._branch_txn(txn, branch)
                if b2.commit_id != b.commit_id or b2.sealed_tokens != b.sealed_tokens:
                    return False
                if is_prefix:
                    self.staging.drop_prefix_txn(txn, b2.staging_token, key)
                else:
                    self.staging.remove_txn(txn, b2.staging_token, key)
                self.staging.set_many_txn(txn, b2.staging_token, overrides)
                return True

            if self.env.write(fn):
                return
            self._backoff(attempt)
        raise PreconditionFailed(f"branch {branch!r} kept changing during reset; try again")

    def _reset_all_txn(self, txn, branch: str) -> Branch:
        b = self._branch_txn(txn, branch)
        self.refs.put_branch_txn(txn, Branch(b.name, b.commit_id, new_staging_token(), ()))
        return b

    # ------------------------------------------------------------------ reads

    def get_value(self, ref: str, path: str | bytes) -> Value:
        """The record value at ``path`` (staging over committed for a branch); NotFound if none."""
        p = as_path(path)
        with self.env.read() as txn:
            rr = self.refs.resolve_txn(txn, ref)
            if rr.tokens:
                found, v = self.staging.get_txn(txn, rr.tokens, p)
                if found:
                    if v is None:
                        raise NotFound(f"{p.decode()!r} not found on {ref!r} (deleted)")
                    return v
            mr = self.refs.get_commit_txn(txn, rr.commit_id).meta_range_id
        v = self.committed.get(mr, p)
        if v is None:
            raise NotFound(f"{p.decode()!r} not found on {ref!r}")
        return v

    def get(self, ref: str, path: str | bytes) -> Entry:
        """The entry at ``path`` on ``ref``; NotFound if none."""
        return Entry.from_value(self.get_value(ref, path))

    def exists(self, ref: str, path: str | bytes) -> bool:
        try:
            self.get_value(ref, path)
            return True
        except NotFound:
            return False

    def _view(self, ref: str):
        """(resolved ref, its commit, guard) read in one snapshot. For a branch, the
        guard raises _BranchMoved inside a later staging read if the branch record
        changed since (its tokens may be gone): the reader then starts over from
        where it was with a fresh view, so a listing never loses an entry to a
        concurrent commit."""
        with self.env.read() as txn:
            rr = self.refs.resolve_txn(txn, ref)
            commit = self.refs.get_commit_txn(txn, rr.commit_id)
            raw = self.refs.branch_raw_txn(txn, rr.branch) if rr.is_branch else None
        if raw is None:
            return rr, commit, None
        name = rr.branch

        def guard(t) -> None:
            if self.refs.branch_raw_txn(t, name) != raw:
                raise _BranchMoved(name)

        return rr, commit, guard

    def list(
        self,
        ref: str,
        prefix: str | bytes = b"",
        delimiter: str | bytes = b"/",
        start_after: str | bytes = b"",
    ) -> Iterator[ListItem]:
        """Objects and common prefixes under ``prefix`` on ``ref``, in byte order of
        their names, names > ``start_after`` (a previous name: resumes a listing).
        A branch lists staging over committed (tombstones hide committed keys). A
        common prefix costs one seek, however much is under it. ``delimiter=""``
        lists recursively. The iterator holds no transaction between items."""
        pfx = as_prefix(prefix)
        delim = delimiter.encode() if isinstance(delimiter, str) else bytes(delimiter)
        after = as_prefix(start_after)
        return self._list(ref, self._view(ref), pfx, delim, after)

    def _list(self, ref, view, pfx: bytes, delim: bytes, after: bytes) -> Iterator[ListItem]:
        last = after
        while True:
            rr, commit, guard = view
            sources = [self.staging.iterator(t, guard=guard) for t in rr.tokens]
            sources.append(CommittedIterator(self.committed, commit.meta_range_id))
            try:
                for item in list_items(MergedIterator(sources), pfx, delim, last):
                    yield item
                    last = item.path
                return
            except _BranchMoved:
                log.debug("%s: branch %s moved during a listing; resuming after %r", self.name, rr.branch, last)
                view = self._view(ref)

    # ------------------------------------------------------------------ data

    def upload(
        self,
        branch: str,
        path: str | bytes,
        source: bytes | str | os.PathLike | BinaryIO,
        content_type: str = "",
        metadata: dict[str, str] | None = None,
    ) -> Entry:
        """Upload bytes, a local file (path) or a binary file object to a new object
        under ``data/`` in the namespace, then stage its entry at ``path`` on
        ``branch``. Returns the staged entry (RELATIVE address, md5 etag)."""
        p = as_path(path)
        with self.env.read() as txn:
            self._branch_txn(txn, branch)  # fail before uploading
        address = new_data_address()
        tmp = None
        try:
            if isinstance(source, (bytes, bytearray, memoryview)):
                data = bytes(source)
                etag, size = md5_hex(data), len(data)
                self.store.put(address, data)
            elif isinstance(source, (str, os.PathLike)):
                fname = os.fspath(source)
                etag, size = md5_file(fname)
                self.store.put_file(address, fname)
            elif hasattr(source, "read"):
                tmp, etag, size = spool(source, self.config.upload_spool_dir)
                self.store.put_file(address, tmp)
            else:
                raise InvalidArgument(f"cannot upload a {type(source).__name__}")
        finally:
            if tmp is not None:
                os.unlink(tmp)
        entry = Entry(
            address=address,
            size=size,
            etag=etag,
            last_modified_ns=time.time_ns(),
            metadata=dict(metadata or {}),
            address_type=AddressType.RELATIVE,
            content_type=content_type,
        )
        self.stage(branch, p, entry)
        return entry

    def _store_for(self, entry: Entry) -> tuple[object, str]:
        addr = entry.address
        if entry.address_type == AddressType.FULL or (
            entry.address_type == AddressType.BY_PREFIX_DEPRECATED and "://" in addr
        ):
            root, key = split_full_address(addr)
            if root == self.record.storage_namespace:
                return self.store, key
            with self._stores_lock:
                st = self._full_stores.get(root)
            if st is None:
                st = self.graveler.store_factory(root)
                with self._stores_lock:
                    st = self._full_stores.setdefault(root, st)
            return st, key
        return self.store, addr

    def read_entry(self, entry: Entry, offset: int = 0, length: int | None = None) -> bytes:
        """The bytes of an entry's object (RELATIVE: in the namespace; FULL: the URI)."""
        st, key = self._store_for(entry)
        if offset == 0 and length is None:
            return st.get(key)
        if length is None:
            length = max(entry.size - offset, 0)
        return st.get_range(key, offset, length)

    def read(self, ref: str, path: str | bytes, offset: int = 0, length: int | None = None) -> bytes:
        """The content of ``path`` on ``ref`` (or ``length`` bytes from ``offset``)."""
        return self.read_entry(self.get(ref, path), offset, length)

    # ------------------------------------------------------------------ commit

    def _backoff(self, attempt: int) -> None:
        time.sleep(min(0.005 * (2**attempt), 0.5) * (0.5 + random.random()))

    def commit(
        self,
        branch: str,
        message: str,
        committer: str | None = None,
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
        date: datetime | None = None,
    ) -> Commit:
        """Commit the staged changes of ``branch``.

        Seals the staging token (later writes go to the next commit), applies the
        sealed changes to the head's metarange, writes the commit and moves the
        branch by compare-and-set, retrying on a lost race. NothingToCommit when
        there are no changes and not ``allow_empty``; PreconditionFailed when the
        branch kept moving (the sealed changes stay staged and readable).
        """
        committer = committer or self.config.committer

        def seal(txn):
            b = self._branch_txn(txn, branch)
            if self.staging.is_empty_txn(txn, b.staging_token):
                if not b.sealed_tokens and not allow_empty:
                    raise NothingToCommit(f"nothing to commit on branch {branch!r}")
                return b
            nb = Branch(b.name, b.commit_id, new_staging_token(), (b.staging_token, *b.sealed_tokens))
            self.refs.put_branch_txn(txn, nb)
            return nb

        self.env.write(seal)
        for attempt in range(self.config.commit_retries):
            with self.env.read() as txn:
                b = self._branch_txn(txn, branch)
                head = self.refs.get_commit_txn(txn, b.commit_id)
            sealed = b.sealed_tokens
            if not sealed and not allow_empty:
                raise NothingToCommit(f"nothing to commit on branch {branch!r} (committed concurrently)")
            if sealed:
                if len(sealed) == 1:  # the usual case: no merging needed
                    changes = self.staging.stream(sealed[0])
                else:
                    changes = iter(MergedIterator([self.staging.iterator(t) for t in sealed], keep_tombstones=True))
                mr, stats = self.committed.apply(head.meta_range_id, changes)
            else:
                mr, stats = head.meta_range_id, ApplyStats()
            if stats.changes == 0:
                mr = head.meta_range_id  # the same tree: keep its ID
                if not allow_empty:
                    if self.env.write(lambda txn: self._unseal_txn(txn, branch, head.id, sealed)):
                        self.staging.drop_many(sealed)
                        raise NothingToCommit(f"nothing to commit on branch {branch!r} (staged changes match the head)")
                    self._backoff(attempt)
                    continue
            commit = Commit.create(committer, message, mr, (head.id,), head.generation + 1, metadata, date)
            if self.env.write(lambda txn: self._move_branch_txn(txn, branch, head.id, sealed, commit)):
                self.staging.drop_many(sealed)
                log.info(
                    "%s: committed %s on %s (+%d -%d ~%d; ranges written %d, reused %d)",
                    self.name, commit.id[:12], branch, stats.added, stats.removed, stats.changed,
                    stats.ranges_written, stats.ranges_reused,
                )
                return commit
            log.info("%s: branch %s moved during commit, retrying (%d)", self.name, branch, attempt + 1)
            self._backoff(attempt)
        raise PreconditionFailed(f"branch {branch!r} kept moving during the commit; the changes stay staged")

    def _unseal_txn(self, txn, branch: str, head_id: str, sealed: tuple[str, ...]) -> bool:
        b = self._branch_txn(txn, branch)
        if b.commit_id != head_id or b.sealed_tokens != sealed:
            return False
        self.refs.put_branch_txn(txn, Branch(b.name, b.commit_id, b.staging_token, ()))
        return True

    def _move_branch_txn(self, txn, branch: str, head_id: str, sealed: tuple[str, ...] | None, commit: Commit) -> bool:
        """CAS: if ``branch`` is still at ``head_id`` with these sealed tokens (None: any),
        store ``commit`` and point the branch at it, dropping the sealed tokens from it."""
        b = self._branch_txn(txn, branch)
        if b.commit_id != head_id or (sealed is not None and b.sealed_tokens != sealed):
            return False
        self.refs.put_commit_txn(txn, commit)
        self.refs.put_branch_txn(txn, Branch(b.name, commit.id, b.staging_token, ()))
        return True

    # ------------------------------------------------------------------ history and diff

    def log(self, ref: str, amount: int | None = None, first_parent: bool = True) -> Iterator[Commit]:
        """Commits from ``ref`` back, newest first: first parents only (default), or
        the whole history ordered by generation."""
        rr = self.resolve(ref)
        return self.refs.log(rr.commit_id, first_parent=first_parent, amount=amount)

    def diff(self, left: str, right: str) -> Iterator[DiffRecord]:
        """Committed differences between two refs (branches as their heads), in key
        order: ADDED = only in right, REMOVED = only in left."""
        _, lc = self._resolve_commit(left)
        _, rc = self._resolve_commit(right)
        return self.committed.diff(lc.meta_range_id, rc.meta_range_id)

    def diff_uncommitted(self, branch: str) -> Iterator[DiffRecord]:
        """The uncommitted changes of ``branch`` (staging vs its head), in key order;
        left = committed value, right = staged value. Staged no-ops are skipped."""
        with self.env.read() as txn:
            self._branch_txn(txn, branch)
        return self._diff_uncommitted(branch, self._view(branch))

    def _diff_uncommitted(self, branch: str, view) -> Iterator[DiffRecord]:
        start = b""
        while True:
            rr, commit, guard = view
            try:
                for d in self._diff_staged(rr.tokens, commit.meta_range_id, start, guard):
                    yield d
                    start = d.key + b"\x00"
                return
            except _BranchMoved:
                view = self._view(branch)

    def _diff_staged(self, tokens: tuple[str, ...], mr: str, start: bytes = b"", guard=None) -> Iterator[DiffRecord]:
        staged = MergedIterator([self.staging.iterator(t, start, guard) for t in tokens], keep_tombstones=True)
        committed = CommittedIterator(self.committed, mr, start)
        for key, sv in staged:
            committed.seek_ge(key)
            item = committed.next()
            cv = item[1] if item is not None and item[0] == key else None
            if sv is None:
                if cv is not None:
                    yield DiffRecord(DiffType.REMOVED, key, cv, None)
            elif cv is None:
                yield DiffRecord(DiffType.ADDED, key, None, sv)
            elif cv.identity != sv.identity:
                yield DiffRecord(DiffType.CHANGED, key, cv, sv)

    def has_uncommitted(self, branch: str) -> bool:
        """True if ``branch`` has staged changes that differ from its head."""
        return next(iter(self.diff_uncommitted(branch)), None) is not None

    # ------------------------------------------------------------------ merge and revert

    def _seal_clean(self, branch: str) -> tuple[Branch, Commit]:
        """Prepare ``branch`` for an operation that moves its head (merge, revert,
        adopting a metarange): DirtyBranch if it has uncommitted changes. Its staged
        no-ops (entries equal to the head, tombstones of absent paths) are sealed, so
        that the head move can drop them: over a new head they would be changes.
        Writes arriving meanwhile go to the fresh token and stay staged."""
        if self.has_uncommitted(branch):
            raise DirtyBranch(f"branch {branch!r} has uncommitted changes; commit or reset them first")

        def seal(txn):
            b = self._branch_txn(txn, branch)
            if self.staging.is_empty_txn(txn, b.staging_token):
                return b
            nb = Branch(b.name, b.commit_id, new_staging_token(), (b.staging_token, *b.sealed_tokens))
            self.refs.put_branch_txn(txn, nb)
            return nb

        b = self.env.write(seal)
        head = self.refs.get_commit(b.commit_id)
        if b.sealed_tokens and next(iter(self._diff_staged(b.sealed_tokens, head.meta_range_id)), None) is not None:
            raise DirtyBranch(f"branch {branch!r} has uncommitted changes; commit or reset them first")
        return b, head

    def _finish_move(self, b: Branch, head: Commit, commit: Commit) -> bool:
        """CAS the branch from ``head`` to ``commit``; drop its (no-op) sealed tokens."""
        if self.env.write(lambda txn: self._move_branch_txn(txn, b.name, head.id, b.sealed_tokens, commit)):
            self.staging.drop_many(b.sealed_tokens)
            return True
        return False

    def merge(
        self,
        source: str,
        dest_branch: str,
        strategy: MergeStrategy | str = MergeStrategy.NONE,
        message: str | None = None,
        committer: str | None = None,
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        """Three-way merge of the commit ``source`` resolves to into ``dest_branch``.

        The merge base is found through parents (lakeFS's generation walk). Always
        makes a merge commit with parents [dest head, source] and lakeFS's
        ``.lakefs.merge.strategy`` metadata. A source branch contributes its head
        (not its staging). DirtyBranch if the destination has uncommitted changes;
        MergeConflict (with ``keys``) unless the strategy decides; NothingToCommit
        if the source has no changes since the merge base and not ``allow_empty``.
        """
        if isinstance(strategy, str):
            strategy = _parse_strategy(strategy)
        committer = committer or self.config.committer
        with self.env.read() as txn:
            self._branch_txn(txn, dest_branch)
            src = self.refs.get_commit_txn(txn, self.refs.resolve_txn(txn, source).commit_id)
        for attempt in range(self.config.commit_retries):
            b, dest = self._seal_clean(dest_branch)
            base = self.refs.find_merge_base(dest.id, src.id)
            if base is None:
                raise Conflict(f"{source!r} and {dest_branch!r} have no common ancestor")
            if not allow_empty and (
                base.id == src.id or next(iter(self.committed.diff(base.meta_range_id, src.meta_range_id)), None) is None
            ):
                raise NothingToCommit(f"nothing to merge: {source!r} has no changes since its merge base with {dest_branch!r}")
            if dest.meta_range_id == base.meta_range_id:
                mr = src.meta_range_id
            else:
                mr, _ = self.committed.merge(base.meta_range_id, src.meta_range_id, dest.meta_range_id, strategy)
            md = dict(metadata or {})
            md[MERGE_STRATEGY_METADATA_KEY] = _STRATEGY_NAMES[strategy]
            commit = Commit.create(
                committer,
                message or f"Merge '{source}' into '{dest_branch}'",
                mr,
                (dest.id, src.id),
                max(dest.generation, src.generation) + 1,
                md,
            )
            if self._finish_move(b, dest, commit):
                log.info("%s: merged %s into %s as %s", self.name, source, dest_branch, commit.id[:12])
                return commit
            self._backoff(attempt)
        raise PreconditionFailed(f"branch {dest_branch!r} kept moving during the merge")

    def revert(
        self,
        branch: str,
        ref: str,
        parent_number: int = 0,
        message: str | None = None,
        committer: str | None = None,
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        """Commit on ``branch`` the inverse of the changes that commit ``ref`` made
        relative to its parent (``parent_number``, 1-based, is required for a merge
        commit). lakeFS's way: merge the parent into the branch with the commit as
        the base. MergeConflict if later changes touched the same paths;
        NothingToCommit if nothing would change; DirtyBranch if uncommitted changes."""
        committer = committer or self.config.committer
        _, target = self._resolve_commit(ref)
        if len(target.parents) > 1 and parent_number <= 0:
            raise InvalidArgument(f"commit {target.id[:12]} is a merge commit: give the parent number to revert against")
        if parent_number > len(target.parents) or parent_number < 0:
            raise InvalidArgument(f"commit {target.id[:12]} has {len(target.parents)} parent(s), not {parent_number}")
        if target.parents:
            parent_mr = self.refs.get_commit(target.parents[max(parent_number, 1) - 1]).meta_range_id
        else:
            parent_mr = self.committed.empty_metarange()
        for attempt in range(self.config.commit_retries):
            b, head = self._seal_clean(branch)
            mr, stats = self.committed.merge(target.meta_range_id, parent_mr, head.meta_range_id, MergeStrategy.NONE)
            if stats.changes == 0:
                if not allow_empty:
                    raise NothingToCommit(f"reverting {ref!r} changes nothing on {branch!r}")
                mr = head.meta_range_id
            commit = Commit.create(committer, message or f"Revert {target.id}", mr, (head.id,), head.generation + 1, metadata)
            if self._finish_move(b, head, commit):
                log.info("%s: reverted %s on %s as %s", self.name, target.id[:12], branch, commit.id[:12])
                return commit
            self._backoff(attempt)
        raise PreconditionFailed(f"branch {branch!r} kept moving during the revert")

    def commit_metarange(
        self,
        branch: str,
        metarange_id: str,
        message: str,
        committer: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> Commit:
        """Adopt an existing metarange of the namespace (e.g. one lakeFS wrote) as a
        new commit on ``branch`` (parent: its head). The branch must be clean."""
        committer = committer or self.config.committer
        if metarange_id and not self.committed.exists(metarange_id):
            raise NotFound(f"metarange {metarange_id} not found in {self.record.storage_namespace}")
        for attempt in range(self.config.commit_retries):
            b, head = self._seal_clean(branch)
            commit = Commit.create(committer, message, metarange_id, (head.id,), head.generation + 1, metadata)
            if self._finish_move(b, head, commit):
                return commit
            self._backoff(attempt)
        raise PreconditionFailed(f"branch {branch!r} kept moving")

    # ------------------------------------------------------------------ refs dump

    def dump_refs(self) -> dict[str, str]:
        """Write commits, tags and branches as metaranges in the namespace plus the
        manifest ``_lakefs/refs_manifest.json`` (lakeFS's refs-dump form); return the
        manifest."""
        from graveler.refsdump import dump_refs

        return dump_refs(self)

    def restore_refs(self, manifest: dict[str, str] | None = None) -> None:
        """Load a refs dump (default: the namespace's ``_lakefs/refs_manifest.json``)
        into this repository, which must have no commits yet (create it bare)."""
        from graveler.refsdump import restore_refs

        restore_refs(self, manifest)


class _BranchMoved(Exception):
    """Internal: a branch record changed under a multi-transaction read."""


def _parse_strategy(s: str) -> MergeStrategy:
    s = s.strip().lower()
    if s in ("", "none", "default"):
        return MergeStrategy.NONE
    for st in MergeStrategy:
        if st.value == s:
            return st
    raise InvalidArgument(f"unknown merge strategy {s!r}: use dest-wins or source-wins")


__all__ = ["Graveler", "GravelerConfig", "ListItem", "RefType", "Repository"]
