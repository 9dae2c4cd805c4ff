"""Walks of the commit graph: logs, the merge base, ancestry.

They read commits through anything with an LMDB ``env`` and ``get_commit_txn``
(the RefManager), in transactions of a bounded number of commits, none held
across a ``yield``.
"""

from __future__ import annotations

import heapq
from typing import Iterator, Protocol

from graveler.refs.records import Commit


class CommitReader(Protocol):
    env: object

    def get_commit_txn(self, txn, commit_id: str) -> Commit: ...


def log(refs: CommitReader, commit_id: str, first_parent: bool = True, amount: int | None = None) -> Iterator[Commit]:
    """Commits from ``commit_id`` back: first parents only, or the full history (every ancestor
    once, newest creation date first, the higher commit ID first among equals: lakeFS's order, and
    git log's by commit date). (It was by generation, which put a branch's own newest commit after
    every commit of a branch merged into it: a refs tour.)"""
    if first_parent:
        yield from _log_first_parent(refs, commit_id, amount)
    else:
        yield from _log_by_date(refs, commit_id, amount)


def _by_date(c: Commit) -> tuple:
    """A commit's place in the full log's min-heap: the newest first; among commits of one time, the
    higher generation (a child made in its parent's microsecond still comes before it), then the higher
    ID (hex, of one length)."""
    return (-c.creation_date.timestamp(), -c.generation, c.id.translate(_DESCENDING), c.id, c)


_DESCENDING = str.maketrans("0123456789abcdefABCDEF", "fedcba9876543210543210")


def _log_first_parent(refs: CommitReader, commit_id: str, amount: int | None) -> Iterator[Commit]:
    remaining = amount if amount is not None else -1
    cid: str | None = commit_id
    while cid is not None and remaining != 0:
        batch: list[Commit] = []
        with refs.env.read() as txn:
            while cid is not None and remaining != 0 and len(batch) < 512:
                c = refs.get_commit_txn(txn, cid)
                batch.append(c)
                remaining -= 1
                cid = c.parents[0] if c.parents else None
        yield from batch


def _log_by_date(refs: CommitReader, commit_id: str, amount: int | None) -> Iterator[Commit]:
    remaining = amount if amount is not None else -1
    with refs.env.read() as txn:
        first = refs.get_commit_txn(txn, commit_id)
    heap: list[tuple] = [_by_date(first)]
    seen = {first.id}
    while heap and remaining != 0:
        batch: list[Commit] = []
        with refs.env.read() as txn:
            while heap and remaining != 0 and len(batch) < 512:
                c = heapq.heappop(heap)[-1]
                batch.append(c)
                remaining -= 1
                for p in c.parents:
                    if p not in seen:
                        seen.add(p)
                        heapq.heappush(heap, _by_date(refs.get_commit_txn(txn, p)))
        yield from batch


def _two_tips(refs: CommitReader, txn, left_id: str, right_id: str) -> list:
    """The merge-base walks' queue at the start: the two commits (one, if they are the same),
    ordered by generation (highest first), newest first among equals."""
    tips = [refs.get_commit_txn(txn, cid) for cid in dict.fromkeys((left_id, right_id))]
    heap = [(-c.generation, -c.creation_date.timestamp(), c.id, c) for c in tips]
    heapq.heapify(heap)
    return heap


def find_merge_base(refs: CommitReader, left_id: str, right_id: str) -> Commit | None:
    """A best common ancestor of two commits (git-merge-base's sense: no other
    common ancestor descends from it); None if the histories never meet.

    lakeFS's walk: both histories from a queue ordered by generation (highest
    first, newest first among equals), each commit marked with the sides it is
    reached from. A commit is the answer when it is taken off the queue with
    both marks: all its descendants have been taken off before it (they have
    higher generations), so it has every mark it will get. (lakeFS answers as
    soon as a parent gets its second mark, which in criss-cross histories can
    be an ancestor of a better base.)
    """
    LEFT, RIGHT = 1, 2
    with refs.env.read() as txn:
        heap = _two_tips(refs, txn, left_id, right_id)
        if len(heap) == 1:
            return heap[0][3]
        reached = {left_id: LEFT, right_id: RIGHT}
        while heap:
            _, _, cid, c = heapq.heappop(heap)
            flags = reached[cid]
            if flags == LEFT | RIGHT:
                return c
            for p in c.parents:
                if p not in reached:
                    pc = refs.get_commit_txn(txn, p)
                    heapq.heappush(heap, (-pc.generation, -pc.creation_date.timestamp(), pc.id, pc))
                    reached[p] = 0
                reached[p] |= flags
    return None


def find_merge_bases(refs: CommitReader, left_id: str, right_id: str) -> list[Commit]:
    """Every best common ancestor of two commits (``git merge-base --all``): common ancestors
    none of which descends from another, in the order the walk meets them (the first is
    :func:`find_merge_base`'s). Two or more only in criss-cross histories.

    The walk of :func:`find_merge_base` goes on past the first answer: an answer marks what it
    reaches *stale* (an ancestor of an answer is no better base), and the walk stops when every
    commit still queued is stale. A commit's descendants all have higher generations, so they are
    taken off the queue first: a stale mark reaches a commit before it is taken off."""
    LEFT, RIGHT, STALE = 1, 2, 4
    BOTH = LEFT | RIGHT
    out: list[Commit] = []
    with refs.env.read() as txn:
        heap = _two_tips(refs, txn, left_id, right_id)
        if len(heap) == 1:
            return [heap[0][3]]
        reached = {left_id: LEFT, right_id: RIGHT}
        queued = {left_id, right_id}
        live = 2  # queued commits not stale
        while heap and live:
            _, _, cid, c = heapq.heappop(heap)
            queued.discard(cid)
            flags = reached[cid]
            if not flags & STALE:
                live -= 1
                if flags & BOTH == BOTH:
                    out.append(c)
                    flags |= STALE
            for p in c.parents:
                if p not in reached:
                    pc = refs.get_commit_txn(txn, p)
                    heapq.heappush(heap, (-pc.generation, -pc.creation_date.timestamp(), pc.id, pc))
                    queued.add(p)
                    reached[p] = 0
                    live += 1
                was = reached[p]
                reached[p] = was | flags
                if p in queued and not was & STALE and flags & STALE:
                    live -= 1
    return out


def is_ancestor(refs: CommitReader, ancestor_id: str, commit_id: str) -> bool:
    """True if ``ancestor_id`` is ``commit_id`` or one of its ancestors."""
    with refs.env.read() as txn:
        target = refs.get_commit_txn(txn, ancestor_id)
        stack = [commit_id]
        seen = set()
        while stack:
            cid = stack.pop()
            if cid == ancestor_id:
                return True
            if cid in seen:
                continue
            seen.add(cid)
            c = refs.get_commit_txn(txn, cid)
            if c.generation <= target.generation and c.generation > 0 and target.generation > 0:
                continue
            stack.extend(c.parents)
    return False


__all__ = ["CommitReader", "find_merge_base", "find_merge_bases", "is_ancestor", "log"]
