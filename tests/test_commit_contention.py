"""Issue 7: ordinary contention on a branch never surfaces as PreconditionFailed; hopeless contention
still fails in bounded time."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from graveler.errors import PreconditionFailed
from tests.graveler_testutil import entry, make_repo


def _intruder(repo, times: int):
    """Make the next ``times`` commit attempts lose their compare-and-set (another committer seals first)."""
    real_apply = repo._committed.apply
    left = [times]

    def apply(base, changes):
        out = real_apply(base, changes)
        if left[0] > 0:
            left[0] -= 1

            def move(txn):
                b = repo._refs.get_branch_txn(txn, "main")
                repo._refs.put_branch_txn(txn, replace(b, sealed_tokens=b.sealed_tokens + ("f" * 16,)))
            repo._env.write(move)
        return out

    repo._committed.apply = apply
    return left


def _drop_intruder_tokens(repo):
    b = repo.get_branch("main")
    repo._env.write(lambda txn: repo._refs.put_branch_txn(
        txn, replace(b, sealed_tokens=tuple(t for t in b.sealed_tokens if t != "f" * 16))))


def test_a_commit_that_loses_many_races_still_lands(tmp_path):
    """12 lost races in a row (4 busy committers do that): the default policy keeps trying (it gave up after 8)."""
    repo = make_repo(tmp_path)
    repo.stage("main", "a", entry("a1"))
    left = _intruder(repo, 12)
    real = repo._core.retry

    def retry(attempt, gave_up):  # the intruder's tokens go away once it stops, as a real committer's would
        def wrapped(n):
            if left[0] == 0:
                _drop_intruder_tokens(repo)
            return attempt(n)
        return real(wrapped, gave_up)

    repo._core.retry = retry
    c = repo.commit("main", "mine")
    assert left[0] == 0 and c.message == "mine"
    assert {it.path for it in repo.list(c.id, delimiter="")} == {b"a"}
    repo.close()


def test_hopeless_contention_fails_within_the_time_budget(tmp_path):
    repo = make_repo(tmp_path, commit_retries=3, commit_retry_seconds=1.0)
    repo.stage("main", "a", entry("a1"))
    _intruder(repo, 10**9)
    t0 = time.monotonic()
    with pytest.raises(PreconditionFailed, match="lost the race"):
        repo.commit("main", "doomed")
    assert 1.0 <= time.monotonic() - t0 < 5
    assert repo.has_uncommitted("main")  # nothing lost: the change is still staged
    repo.close()
