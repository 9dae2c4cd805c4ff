"""One repository's managers, and the primitives its reads and its head moves share.

:class:`RepoCore` holds the repository's LMDB environment, its RefManager,
StagingManager and CommittedManager, its store and its record. It is private
to :class:`graveler.repository.Repository` (reads, staging writes, listings)
and :class:`graveler.commits.Commits` (commit, merge, revert: operations that
move a branch head). What both need lives here: a branch by name (ReadOnlyRef
for anything else), a consistent view of a ref for multi-transaction reads, the
staged-vs-committed diff, the seal step and the compare-and-set retry loop.

Reads that span transactions are *pinned*: :meth:`RepoCore.pin` resolves a ref once
(its commit, and for a branch the branch record as it was); :meth:`RepoCore.iterator`
and :meth:`RepoCore.value_at` read staging over committed through a pin and raise
:class:`BranchMoved` when the branch record changed since (its staging tokens may be
gone), and the caller pins again and resumes. :class:`graveler.view.View` (the
mount's read handle) and :class:`graveler.repository.Repository`'s listings both read
this way: one staged-over-committed read in graveler. A single lookup needs no pin: it
reads the ref and its staging in one snapshot (:meth:`RepoCore.value_of`).

Concurrency: refs and staging share one LMDB environment, so a staging write
reads the branch and writes to its current token in one write transaction, and
sealing a token is one transaction too: a write lands either in the commit or
in the next one, never in between. Object-store I/O always happens outside
LMDB transactions; a head move ends with a compare-and-set of the branch and is
retried (re-reading the branch) when another operation moved it first.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

from graveler.committed.manager import CommittedManager
from graveler.config import GravelerConfig
from graveler.errors import GravelerError, InvalidArgument, NotFound, PreconditionFailed, ReadOnlyRef, StoreUnavailable
from graveler.kv.base import BRANCHES, Store
from graveler.listing import CommittedIterator, MergedIterator
from graveler.model import DiffRecord, DiffType, Value
from graveler.refs import Branch, Commit, RefManager, RepositoryRecord, ResolvedRef, new_staging_token
from graveler.staging import StagingManager

log = logging.getLogger(__name__)

T = TypeVar("T")

class BranchMoved(Exception):
    """Internal to graveler: a branch record changed under a pinned read (pin again and resume)."""


@dataclass(frozen=True, slots=True)
class Pin:
    """A ref resolved once: its commit and, for a branch, the branch record as it was.

    ``guard(txn)`` (branches only) raises BranchMoved inside a later read transaction if
    the branch record is no longer ``raw``."""

    resolved: ResolvedRef
    commit: Commit
    raw: bytes | None
    guard: Callable[[object], None] | None
    born: str | None = None  # a branch's birth (RefManager.get_born_txn): another for a branch made again

    @property
    def is_branch(self) -> bool:
        return self.resolved.is_branch


class RepoCore:
    """The managers of one repository and the primitives built on them (not public API)."""

    def __init__(self, config: GravelerConfig, env: Store, record: RepositoryRecord, store,
                 committed: CommittedManager):
        self.config = config
        self.env = env
        self.record = record
        self.store = store
        self.committed = committed
        self.refs = RefManager(env)
        self.staging = StagingManager(env)

    @property
    def name(self) -> str:
        return self.record.name

    # -- refs ----------------------------------------------------------------------------------
    def branch_txn(self, txn, name: str) -> Branch:
        """The branch ``name``; ReadOnlyRef if ``name`` is a tag / commit / expression."""
        try:
            return self.refs.get_branch_txn(txn, name)
        except NotFound:
            try:
                rr = self.refs.resolve_txn(txn, name)
            except (NotFound, InvalidArgument):
                raise NotFound(f"branch {name!r} not found") from None
            raise ReadOnlyRef(f"{name!r} is a {rr.type.value}, not a branch: it cannot be changed") from None

    def same_txn(self, txn) -> None:
        """NotFound unless the KV still holds the repository this opening read (not one deleted
        since, or made again under its name by another host: :meth:`RefManager.check_same_txn`).
        Every write of a branch, tag or head, and every pin, checks it in its transaction."""
        self.refs.check_same_txn(txn, self.record)

    def write_branch_txn(self, txn, name: str) -> Branch:
        """:meth:`branch_txn` for a transaction that changes it or what it holds: checked against a
        repository made again (:meth:`same_txn`); both read in one round trip on a server's store."""
        txn.get_many([(BRANCHES, name.encode()), self.refs.record_key()])
        self.same_txn(txn)
        return self.branch_txn(txn, name)

    def own_value(self, key: bytes, default: bytes | str | None = None, replace: bool = False) -> str | None:
        """A value of the repository's own table under ``key`` (:mod:`graveler.claims`); with
        ``default``, stored first if there is none (or, ``replace``, in any case; the value stored
        then is returned)."""
        if default is None:
            with self.env.read() as txn:
                raw = self.refs.repo_value_txn(txn, key)
            return None if raw is None else raw.decode("utf-8", "replace")

        def fn(txn):
            self.same_txn(txn)
            raw = self.refs.repo_value_txn(txn, key)
            if raw is None or replace:
                raw = default.encode() if isinstance(default, str) else default
                self.refs.put_repo_value_txn(txn, key, raw)
            return raw.decode("utf-8", "replace")

        return self.env.write(fn)

    def resolve_commit(self, ref: str) -> tuple[ResolvedRef, Commit]:
        with self.env.read() as txn:
            rr = self.refs.resolve_txn(txn, ref)
            return rr, self.refs.get_commit_txn(txn, rr.commit_id)

    def branch_head(self, branch: str) -> tuple[Branch, Commit]:
        """A branch and its head commit, read in one snapshot."""
        with self.env.read() as txn:
            b = self.branch_txn(txn, branch)
            return b, self.refs.get_commit_txn(txn, b.commit_id)

    def pin(self, ref: str) -> Pin:
        """``ref`` resolved in one snapshot (see :class:`Pin`). A reader that meets
        BranchMoved pins again and resumes from where it was, so a listing never loses
        an entry to a concurrent commit."""
        with self.env.read() as txn:
            self.same_txn(txn)
            rr = self.refs.resolve_txn(txn, ref)
            commit = self.refs.get_commit_txn(txn, rr.commit_id)
            raw = self.refs.branch_raw_txn(txn, rr.branch) if rr.is_branch else None
            born = self.refs.get_born_txn(txn, rr.branch) if raw is not None else None
        if raw is None:
            return Pin(rr, commit, None, None)
        name, refs = rr.branch, self.refs

        def guard(t) -> None:
            if refs.branch_raw_txn(t, name) != raw:
                raise BranchMoved(name)

        return Pin(rr, commit, raw, guard, born)

    def repin(self, ref: str, pin: Pin) -> Pin:
        """``pin`` itself while its branch record is unchanged (a staged write moves the
        branch's change stamp, not its record: one point read, nothing decoded), else
        :meth:`pin` again."""
        if pin.raw is not None and self.refs.branch_raw(pin.resolved.branch) == pin.raw:
            return pin
        return self.pin(ref)

    def iterator(self, pin: Pin, start: bytes = b"", batch: int = 64, end: bytes | None = None):
        """Seekable (path, value) iterator of what ``pin`` shows from ``start``: the
        committed tree, under the branch's staging tokens for a branch (tombstones hide
        committed keys). BranchMoved from ``next`` when the branch moved. ``batch``: the
        staged entries read at first (and after each seek; more as reading goes on).
        ``end``: no key >= ``end`` is wanted (:class:`CommittedIterator`)."""
        committed = CommittedIterator(self.committed, pin.commit.meta_range_id, start, end)
        if not pin.resolved.tokens:
            return committed
        sources = [self.staging.iterator(t, start, pin.guard, batch, end) for t in pin.resolved.tokens]
        sources.append(committed)
        return MergedIterator(sources)

    def value_at(self, pin: Pin, path: bytes) -> Value | None:
        """The value at ``path`` exactly (None: nothing there, or a staged delete): staging
        over committed, in one snapshot checked against the pin (BranchMoved)."""
        if pin.resolved.tokens:
            with self.env.read() as txn:
                if pin.guard is not None:
                    pin.guard(txn)
                found, v = self.staging.get_txn(txn, pin.resolved.tokens, path)
            if found:
                return v
        return self.committed.get(pin.commit.meta_range_id, path)

    def value_of(self, ref: str, path: bytes) -> Value | None:
        """The value at ``path`` on ``ref`` (None: nothing there, or a staged delete): the ref,
        its commit and its staging read in one snapshot, then the committed tree if staging
        has nothing (one read transaction: what :meth:`pin` + :meth:`value_at` take two for)."""
        with self.env.read() as txn:
            rr = self.refs.resolve_txn(txn, ref)
            commit = self.refs.get_commit_txn(txn, rr.commit_id)
            if rr.tokens:
                found, v = self.staging.get_txn(txn, rr.tokens, path)
                if found:
                    return v
        return self.committed.get(commit.meta_range_id, path)

    def pinned(self, ref: str, fn: Callable[[Pin], T], pin: Pin | None = None, attempts: int = 16) -> T:
        """``fn(pin)`` (a fresh pin of ``ref`` if none is given); pin again and rerun it
        while the branch moves under it. StoreUnavailable if it keeps moving."""
        for _ in range(attempts):
            p = pin or self.pin(ref)
            try:
                return fn(p)
            except BranchMoved:
                log.debug("%s: branch of %r moved during a read; pinning again", self.name, ref)
                pin = None
        raise StoreUnavailable(f"branch {ref!r} kept moving during a read")

    def change_stamp(self, branch: str) -> int:
        """The branch's change stamp (see :meth:`graveler.repository.Repository.change_stamp`)."""
        return self.refs.stamp(branch)

    # -- staging vs committed ---------------------------------------------------------------
    def diff_staged(self, tokens: tuple[str, ...], mr: str, start: bytes = b"", guard=None) -> Iterator[DiffRecord]:
        """Staged changes of ``tokens`` (in precedence order) against metarange ``mr``;
        staged no-ops (same identity, tombstones of absent keys) are skipped."""
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

    def diff_uncommitted(self, branch: str, prefix: bytes = b"") -> Iterator[DiffRecord]:
        """The uncommitted changes of ``branch`` (of keys under ``prefix``) in key order, resuming
        over a fresh view when the branch moves meanwhile."""
        with self.env.read() as txn:
            self.branch_txn(txn, branch)
        return self._diff_uncommitted(branch, self.pin(branch), prefix)

    def _diff_uncommitted(self, branch: str, pin: Pin, prefix: bytes = b"") -> Iterator[DiffRecord]:
        start = prefix
        while True:
            try:
                for d in self.diff_staged(pin.resolved.tokens, pin.commit.meta_range_id, start, pin.guard):
                    if not d.key.startswith(prefix):
                        return  # (past the prefix: key order)
                    yield d
                    start = d.key + b"\x00"
                return
            except BranchMoved:
                pin = self.pin(branch)

    def has_uncommitted(self, branch: str) -> bool:
        return next(iter(self.diff_uncommitted(branch)), None) is not None

    # -- head moves ------------------------------------------------------------------------
    def seal_txn(self, txn, branch: str) -> tuple[Branch, bool]:
        """Seal the current staging token of ``branch`` if it holds anything: it joins
        the sealed tokens (newest first) and a fresh token takes its place, so later
        writes go to the next commit. Returns (the branch now, whether it sealed)."""
        b = self.write_branch_txn(txn, branch)
        if self.staging.is_empty_txn(txn, b.staging_token):
            return b, False
        nb = Branch(b.name, b.commit_id, new_staging_token(), (b.staging_token, *b.sealed_tokens))
        self.refs.put_branch_txn(txn, nb)
        return nb, True

    def move_branch_txn(self, txn, branch: str, head_id: str, sealed: tuple[str, ...] | None, commit: Commit) -> bool:
        """CAS: if ``branch`` is still at ``head_id`` with these sealed tokens (None: any),
        store ``commit`` and point the branch at it, dropping the sealed tokens from it."""
        b = self.write_branch_txn(txn, branch)
        if b.commit_id != head_id or (sealed is not None and b.sealed_tokens != sealed):
            return False
        self.refs.put_commit_txn(txn, commit)
        self.refs.put_branch_txn(txn, Branch(b.name, commit.id, b.staging_token, ()))
        return True

    def drop_tokens(self, tokens, after: str) -> None:
        """Remove the staged rows of ``tokens``, which a transaction that just committed (``after``:
        what it did) left no branch naming -- best effort: that operation stands whatever happens
        here (a commit whose head moved is a commit). Rows a failure leaves (the KV away for a
        moment) are orphans, which the next such call removes too (:meth:`sweep_orphans`)."""
        try:
            self.sweep_orphans(tokens)
        except GravelerError as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            log.warning("%s: %s; its staged rows stay for now (%s): the next commit, merge, reset or branch "
                        "delete removes them", self.name, after, why)

    def sweep_orphans(self, tokens=()) -> int:
        """Drop ``tokens`` and every token with staged rows that no branch names; how many tokens.
        The tokens that have rows are read before the branches: a token with rows already was
        named by a branch from its start (a seal or a new branch makes it in the transaction that
        names it), so one that no branch names after is an orphan for good, never a new one."""
        present = self.staging.tokens_present()
        drop = {t for t in tokens if t}
        if present - drop:
            named = {t for b in self.refs.list_branches() for t in b.tokens}
            drop = (drop | present) - named
        self.staging.drop_many(sorted(drop))
        return len(drop)

    def retry(self, attempt: Callable[[int], T | None], gave_up: str) -> T:
        """The compare-and-set loop: call ``attempt(n)`` until it returns a result (not
        None), backing off between tries (jittered, 5 ms doubling to 0.5 s);
        PreconditionFailed(``gave_up``) once both ``config.commit_retries`` tries and
        ``config.commit_retry_seconds`` have been spent."""
        deadline = time.monotonic() + self.config.commit_retry_seconds
        n = 0
        while True:
            result = attempt(n)
            if result is not None:
                return result
            n += 1
            if n >= self.config.commit_retries and time.monotonic() >= deadline:
                raise PreconditionFailed(f"{gave_up} (lost the race {n} times)")
            time.sleep(min(0.005 * (2 ** min(n, 7)), 0.5) * (0.5 + random.random()))


__all__ = ["BranchMoved", "Pin", "RepoCore"]
