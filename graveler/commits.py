"""Operations that move a branch head: commit, merge, revert, adopting a metarange.

Each seals the branch's staging first (one LMDB transaction, see
:meth:`graveler.core.RepoCore.seal_txn`), does its object-store work outside
any transaction (apply the sealed changes, or merge two trees), then creates
the commit and moves the branch by compare-and-set, retrying from a re-read
branch when another operation moved it (:meth:`graveler.core.RepoCore.retry`).
Nothing staged is dropped until the branch record that referenced it has moved on.
"""

from __future__ import annotations

import logging
from datetime import datetime

from graveler import fences
from graveler.committed.manager import ApplyStats
from graveler.core import RepoCore
from graveler.errors import (Conflict, DirtyBranch, InvalidArgument, MergeConflict, NotFound, NothingToCommit,
                             PreconditionFailed)
from graveler.listing import MergedIterator
from graveler.model import MergeStrategy
from graveler.refs import Branch, Commit

log = logging.getLogger(__name__)

MERGE_STRATEGY_METADATA_KEY = ".lakefs.merge.strategy"  # lakeFS's key on merge commits
_STRATEGY_NAMES = {MergeStrategy.NONE: "default", MergeStrategy.DEST_WINS: "dest-wins", MergeStrategy.SOURCE_WINS: "source-wins"}

REVERT_HINT = "later commits changed them again: change them back by hand, then commit"  # (a revert's conflict)
# (the same, of a commit the branch's history does not hold: nothing "later" changed them)
REVERT_ELSEWHERE_HINT = ("the commit is not in this branch's history, which holds these paths otherwise than "
                         "that commit left them: change them by hand, then commit")

_VIRTUAL_BASE_DEPTH = 8  # nested virtual bases at most (git's recursive merge has no cap; histories this tangled are rare)


def parse_strategy(s: MergeStrategy | str) -> MergeStrategy:
    if isinstance(s, MergeStrategy):
        return s
    s = s.strip().lower()
    if s in ("", "none", "default"):
        return MergeStrategy.NONE
    for st in MergeStrategy:
        if st.value == s:
            return st
    raise InvalidArgument(f"unknown merge strategy {s!r}: use dest-wins or source-wins")


class Commits:
    """The head-moving operations of one repository (behind :class:`graveler.repository.Repository`)."""

    def __init__(self, core: RepoCore):
        self._c = core

    # -- commit ------------------------------------------------------------------------------
    def commit(self, branch: str, message: str, committer: str | None, metadata: dict[str, str] | None,
               allow_empty: bool, date: datetime | None) -> Commit:
        c = self._c
        committer = committer or c.config.committer

        def seal(txn):
            fence = c.refs.get_fence_txn(txn, branch)
            if fence is not None:  # a change made in several transactions is under way: not half of it
                raise fences.busy(branch, fence, c.name)
            unsaved = c.refs.unsaved_txn(txn, branch)
            if unsaved:  # a mount's files whose saves failed: the commit would publish them without their bytes
                raise fences.unsaved(branch, [r for _, r in unsaved], c.name)
            b, sealed_now = c.seal_txn(txn, branch)
            if not sealed_now and not b.sealed_tokens and not allow_empty:
                raise NothingToCommit(f"nothing to commit on branch {branch!r}")

        fences.waiting(lambda: c.env.write(seal))
        # Every object a sealed entry names was written before its staging, so before the
        # seal: make them durable before a commit record can name them. (Objects adopted
        # without an fsync, by this process or another one; one syncfs on a local store.)
        # A home that syncs nothing (KVConfig.sync off: benchmarks, tests) skips it too.
        if c.config.kv.sync:
            c.store.sync()

        def attempt(n: int) -> Commit | None:
            b, head = c.branch_head(branch)
            sealed = b.sealed_tokens
            if not sealed and not allow_empty:
                raise NothingToCommit(f"nothing to commit on branch {branch!r} (committed concurrently)")
            if sealed:
                if len(sealed) == 1:  # the usual case: no merging needed
                    changes = c.staging.stream(sealed[0])
                else:
                    changes = iter(MergedIterator([c.staging.iterator(t) for t in sealed], keep_tombstones=True))
                mr, stats = c.committed.apply(head.meta_range_id, changes)
            else:
                mr, stats = head.meta_range_id, ApplyStats()
            if stats.changes == 0:
                mr = head.meta_range_id  # the same tree: keep its ID
                if not allow_empty:
                    if c.env.write(lambda txn: self._unseal_txn(txn, branch, head.id, sealed)):
                        c.drop_tokens(sealed, f"nothing to commit on {branch}")
                        raise NothingToCommit(f"nothing to commit on branch {branch!r} (staged changes match the head)")
                    return None
            commit = Commit.create(committer, message, mr, (head.id,), head.generation + 1, metadata, date)
            if c.env.write(lambda txn: c.move_branch_txn(txn, branch, head.id, sealed, commit)):
                c.drop_tokens(sealed, f"committed {commit.id[:12]} on {branch}")
                log.info(
                    "%s: committed %s on %s (+%d -%d ~%d; ranges written %d, reused %d)",
                    c.name, commit.id[:12], branch, stats.added, stats.removed, stats.changed,
                    stats.ranges_written, stats.ranges_reused,
                )
                return commit
            log.info("%s: branch %s moved during commit, retrying (%d)", c.name, branch, n + 1)
            return None

        return c.retry(attempt, f"branch {branch!r} kept moving during the commit; the changes stay staged")

    def _unseal_txn(self, txn, branch: str, head_id: str, sealed: tuple[str, ...]) -> bool:
        b = self._c.branch_txn(txn, branch)
        if b.commit_id != head_id or b.sealed_tokens != sealed:
            return False
        self._c.refs.put_branch_txn(txn, Branch(b.name, b.commit_id, b.staging_token, ()))
        return True

    # -- moving a clean branch -----------------------------------------------------------------
    def _seal_clean(self, branch: str) -> tuple[Branch, Commit]:
        """Prepare ``branch`` for an operation that moves its head (merge, revert,
        adopting a metarange): DirtyBranch if it has uncommitted changes. Its staged
        no-ops (entries equal to the head, tombstones of absent paths) are sealed, so
        that the head move can drop them: over a new head they would be changes.
        Writes arriving meanwhile go to the fresh token and stay staged."""
        c = self._c
        if c.has_uncommitted(branch):
            raise DirtyBranch(f"branch {branch!r} has uncommitted changes; commit or reset them first")
        b, _ = c.env.write(lambda txn: c.seal_txn(txn, branch))
        head = c.refs.get_commit(b.commit_id)
        if b.sealed_tokens and next(iter(c.diff_staged(b.sealed_tokens, head.meta_range_id)), None) is not None:
            raise DirtyBranch(f"branch {branch!r} has uncommitted changes; commit or reset them first")
        return b, head

    def _finish_move(self, b: Branch, head: Commit, commit: Commit) -> bool:
        """CAS the branch from ``head`` to ``commit``; drop its (no-op) sealed tokens."""
        c = self._c
        if c.env.write(lambda txn: c.move_branch_txn(txn, b.name, head.id, b.sealed_tokens, commit)):
            c.drop_tokens(b.sealed_tokens, f"moved {b.name} to {commit.id[:12]}")
            return True
        return False

    def merge(self, source: str, dest_branch: str, strategy: MergeStrategy | str, message: str | None,
              committer: str | None, metadata: dict[str, str] | None, allow_empty: bool) -> Commit:
        c = self._c
        strategy = parse_strategy(strategy)
        committer = committer or c.config.committer
        with c.env.read() as txn:
            c.branch_txn(txn, dest_branch)
            src = c.refs.get_commit_txn(txn, c.refs.resolve_txn(txn, source).commit_id)

        def attempt(n: int) -> Commit | None:
            b, dest = self._seal_clean(dest_branch)
            bases = c.refs.find_merge_bases(dest.id, src.id)
            if not bases:
                raise Conflict(f"{source!r} and {dest_branch!r} have no common ancestor")
            base_mr = self._base_tree(bases)
            if not allow_empty and (
                bases[0].id == src.id or next(iter(c.committed.diff(base_mr, src.meta_range_id)), None) is None
            ):
                raise NothingToCommit(f"nothing to merge: {source!r} has no changes since its merge base with {dest_branch!r}")
            if dest.meta_range_id == base_mr:
                mr = src.meta_range_id
            else:
                mr, _ = c.committed.merge(base_mr, src.meta_range_id, dest.meta_range_id, strategy)
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
                log.info("%s: merged %s into %s as %s", c.name, source, dest_branch, commit.id[:12])
                return commit
            return None

        return c.retry(attempt, f"branch {dest_branch!r} kept moving during the merge")

    def merge_base_tree(self, left_id: str, right_id: str) -> str | None:
        """The metarange a merge of commits ``left_id`` and ``right_id`` takes for its base (a
        virtual one for criss-cross histories: :meth:`_base_tree`); None when they share no ancestor."""
        bases = self._c.refs.find_merge_bases(left_id, right_id)
        return self._base_tree(bases) if bases else None

    def _base_tree(self, bases: list[Commit], depth: int = 0) -> str:
        """The metarange a merge takes for its base: the one best common ancestor's; with several
        (criss-cross histories), git's answer, a *virtual* base: the bases merged into each
        other over their own merge base (recursively), what they disagree on left as that base
        had it. One base picked among equals would make a merge conflict, or undo a change, that
        depends only on which base was picked. The virtual base's ranges are written like any
        merge's and named by no commit."""
        c = self._c
        mr = bases[0].meta_range_id
        for other in bases[1:]:
            inner = c.refs.find_merge_bases(bases[0].id, other.id)
            if not inner:
                inner_mr = c.committed.empty_metarange()
            elif depth >= _VIRTUAL_BASE_DEPTH:
                inner_mr = inner[0].meta_range_id
            else:
                inner_mr = self._base_tree(inner, depth + 1)
            if inner_mr == mr:
                mr = other.meta_range_id
            elif inner_mr != other.meta_range_id:
                mr, _ = c.committed.merge(inner_mr, other.meta_range_id, mr, MergeStrategy.NONE,
                                          conflicts_to_base=True)
        return mr

    def revert(self, branch: str, ref: str, parent_number: int, message: str | None, committer: str | None,
               metadata: dict[str, str] | None, allow_empty: bool) -> Commit:
        c = self._c
        committer = committer or c.config.committer
        _, target = c.resolve_commit(ref)
        if len(target.parents) > 1 and parent_number <= 0:
            raise InvalidArgument(f"commit {target.id[:12]} is a merge commit: give the parent number to revert against")
        if parent_number > len(target.parents) or parent_number < 0:
            raise InvalidArgument(f"commit {target.id[:12]} has {len(target.parents)} parent(s), not {parent_number}")
        if target.parents:
            parent_mr = c.refs.get_commit(target.parents[max(parent_number, 1) - 1]).meta_range_id
        else:
            parent_mr = c.committed.empty_metarange()

        def attempt(n: int) -> Commit | None:
            b, head = self._seal_clean(branch)
            try:
                mr, stats = c.committed.merge(target.meta_range_id, parent_mr, head.meta_range_id, MergeStrategy.NONE)
            except MergeConflict as e:  # (a revert is a merge inside: say what it means here)
                hint = REVERT_HINT if c.refs.is_ancestor(target.id, head.id) else REVERT_ELSEWHERE_HINT
                raise MergeConflict.on("revert", e.keys, e.count, hint) from None
            if stats.changes == 0:
                if not allow_empty:
                    raise NothingToCommit(f"reverting {ref!r} changes nothing on {branch!r}")
                mr = head.meta_range_id
            commit = Commit.create(committer, message or f"Revert {target.id}", mr, (head.id,), head.generation + 1, metadata)
            if self._finish_move(b, head, commit):
                log.info("%s: reverted %s on %s as %s", c.name, target.id[:12], branch, commit.id[:12])
                return commit
            return None

        return c.retry(attempt, f"branch {branch!r} kept moving during the revert")

    def commit_metarange(self, branch: str, metarange_id: str, message: str, committer: str | None,
                         metadata: dict[str, str] | None, expected_head: str | None = None) -> Commit:
        c = self._c
        committer = committer or c.config.committer
        if metarange_id and not c.committed.exists(metarange_id):
            raise NotFound(f"metarange {metarange_id} not found in {c.record.storage_namespace}")

        def moved(head_id: str) -> None:
            if expected_head is not None and head_id != expected_head:
                raise PreconditionFailed(f"branch {branch!r} moved from {expected_head[:12]} to {head_id[:12]}; "
                                         "nothing was committed")

        def attempt(n: int) -> Commit | None:
            moved(c.refs.get_branch(branch).commit_id)  # before sealing anything
            b, head = self._seal_clean(branch)
            moved(head.id)
            commit = Commit.create(committer, message, metarange_id, (head.id,), head.generation + 1, metadata)
            return commit if self._finish_move(b, head, commit) else None

        return c.retry(attempt, f"branch {branch!r} kept moving")


__all__ = ["Commits", "MERGE_STRATEGY_METADATA_KEY", "parse_strategy"]
