"""Model-based test: graveler against a plain-dict model of every branch and commit.

A hypothesis state machine stages, deletes, commits, branches, merges, resets and
reverts on a real repository (LMDB, in memory or PostgreSQL + local namespace) and on a model where a
commit is a dict path -> etag and a branch is a head commit plus a dict of staged
changes (etag or None for a delete). After every step, the full contents of
every branch (staging over head), every branch's committed head, and every
commit the model knows are compared with graveler's listings.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from graveler.errors import DirtyBranch, MergeConflict, NotFound, NothingToCommit
from graveler.model import MergeStrategy
from tests import graveler_testutil
from tests.graveler_testutil import contents, entry, make_repo

PATHS = ["a", "b", "d/x", "d/y", "d/z/1", "e/f"]
ETAGS = ["v0", "v1", "v2"]
BRANCH_NAMES = ["main", "dev", "feat", "fix"]


def _apply(view: dict[str, str], staged: dict[str, str | None]) -> dict[str, str]:
    out = dict(view)
    for p, v in staged.items():
        if v is None:
            out.pop(p, None)
        else:
            out[p] = v
    return out


def three_way(base: dict, source: dict, dest: dict, strategy: MergeStrategy) -> tuple[dict, list[str]]:
    out, conflicts = {}, []
    for k in sorted(set(base) | set(source) | set(dest)):
        b, s, d = base.get(k), source.get(k), dest.get(k)
        if s == b:
            r = d
        elif d == b or d == s:
            r = s
        elif strategy is MergeStrategy.SOURCE_WINS:
            r = s
        elif strategy is MergeStrategy.DEST_WINS:
            r = d
        else:
            conflicts.append(k)
            r = d
        if r is not None:
            out[k] = r
    return out, conflicts


class GravelerModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="graveler-model-"))
        self.repo = make_repo(self.tmp)
        head = self.repo.get_branch("main").commit_id
        self.commits: dict[str, dict[str, str]] = {head: {}}
        self.parents: dict[str, tuple[str, ...]] = {head: ()}
        self.gen: dict[str, int] = {head: 1}
        self.heads: dict[str, str] = {"main": head}
        self.staged: dict[str, dict[str, str | None]] = {"main": {}}

    def teardown(self):
        self.repo.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- model helpers
    def view(self, branch: str) -> dict[str, str]:
        return _apply(self.commits[self.heads[branch]], self.staged[branch])

    def dirty(self, branch: str) -> bool:
        return self.view(branch) != self.commits[self.heads[branch]]

    def ancestors(self, cid: str) -> set[str]:
        seen, stack = set(), [cid]
        while stack:
            c = stack.pop()
            if c not in seen:
                seen.add(c)
                stack.extend(self.parents[c])
        return seen

    def best_bases(self, a: str, b: str) -> set[str]:
        common = self.ancestors(a) & self.ancestors(b)
        return {c for c in common if not any(c != o and c in self.ancestors(o) for o in common)}

    def virtual_base(self, a: str, b: str, depth: int = 0) -> dict[str, str]:
        """The tree a merge of a and b takes for its base: the best common ancestor's, or with
        several (criss-cross), git's virtual base: the bases merged into each other over their
        own merge base, what they disagree on as that base had it. The order is graveler's
        (``find_merge_bases``), its set the model's own."""
        order = [c.id for c in self.repo._refs.find_merge_bases(a, b)]
        assert set(order) == self.best_bases(a, b), "graveler finds every best common ancestor"
        tree = self.commits[order[0]]
        for other in order[1:]:
            inner = self.virtual_base(order[0], other, depth + 1) if depth < 8 else \
                self.commits[self.repo._refs.find_merge_base(order[0], other).id]
            out = {}
            for k in set(inner) | set(tree) | set(self.commits[other]):
                i, t, o = inner.get(k), tree.get(k), self.commits[other].get(k)
                r = o if t == i else t if o == i or o == t else i  # disagreement: the inner base's
                if r is not None:
                    out[k] = r
            tree = out
        return tree

    def record(self, commit, content: dict[str, str]) -> None:
        self.commits[commit.id] = dict(content)
        self.parents[commit.id] = tuple(commit.parents)
        self.gen[commit.id] = commit.generation

    branches = st.sampled_from(BRANCH_NAMES)

    @initialize(files=st.dictionaries(st.sampled_from(PATHS), st.sampled_from(ETAGS), max_size=4))
    def setup(self, files):
        """Some history to start from: a commit on main, then dev and feat from it."""
        for p, e in files.items():
            self.stage("main", p, e)
        self.commit("main", True)
        self.create_branch("dev", "main")
        self.create_branch("feat", "main")

    # -- rules
    @rule(b=branches, path=st.sampled_from(PATHS), etag=st.sampled_from(ETAGS))
    def stage(self, b, path, etag):
        if b not in self.heads:
            return
        self.repo.stage(b, path, entry(etag))
        self.staged[b][path] = etag

    @rule(b1=branches, b2=branches, path=st.sampled_from(PATHS))
    def diverge(self, b1, b2, path):
        """The same path changed differently on two branches: merges of them conflict."""
        if b1 in self.heads and b2 in self.heads and b1 != b2:
            self.stage(b1, path, "left")
            self.stage(b2, path, "right")

    @rule(b1=branches, b2=branches, path=st.sampled_from(PATHS), strategy=st.sampled_from(list(MergeStrategy)),
          cross=st.booleans())
    def diverge_and_merge(self, b1, b2, path, strategy, cross):
        """Conflicting edits then a merge; with ``cross`` also the merge back (criss-cross histories)."""
        self.diverge(b1, b2, path)
        self.merge(b1, b2, strategy, True)
        if cross:
            self.merge(b2, b1, strategy, True)

    @rule(b=branches, path=st.sampled_from(PATHS))
    def delete(self, b, path):
        if b not in self.heads:
            return
        if path in self.view(b):
            self.repo.delete(b, path)
            self.staged[b][path] = None
        else:
            try:
                self.repo.delete(b, path)
                raise AssertionError("delete of a missing path succeeded")
            except NotFound:
                pass

    @rule(b=branches, allow_empty=st.booleans())
    def commit(self, b, allow_empty):
        if b not in self.heads:
            return
        head = self.heads[b]
        new = self.view(b)
        try:
            c = self.repo.commit(b, f"commit on {b}", allow_empty=allow_empty)
        except NothingToCommit:
            assert new == self.commits[head] and not allow_empty
            self.staged[b] = {}
            event("commit: nothing")
            return
        event("commit: ok")
        assert allow_empty or new != self.commits[head]
        assert c.parents == (head,) and c.generation == self.gen[head] + 1
        self.record(c, new)
        self.heads[b] = c.id
        self.staged[b] = {}

    @rule(new=branches, src=branches)
    def create_branch(self, new, src):
        if new in self.heads or src not in self.heads:
            return
        self.repo.create_branch(new, src)
        self.heads[new] = self.heads[src]
        self.staged[new] = {}

    @rule(b=branches)
    def delete_branch(self, b):
        if b not in self.heads or b == "main":
            return
        self.repo.delete_branch(b)
        del self.heads[b], self.staged[b]

    @rule(src=branches, dest=branches, strategy=st.sampled_from(list(MergeStrategy)), clean_first=st.booleans())
    def merge(self, src, dest, strategy, clean_first):
        if src not in self.heads or dest not in self.heads or src == dest:
            return
        if clean_first:  # commit both sides first, so that most merges get to the three-way part
            self.commit(src, False)
            self.commit(dest, False)
        s, d = self.heads[src], self.heads[dest]
        if self.dirty(dest):
            try:
                self.repo.merge(src, dest, strategy)
                raise AssertionError("merge into a dirty branch succeeded")
            except DirtyBranch:
                event("merge: dirty")
                return
        bases = self.best_bases(s, d)
        assert bases, "histories always share the first commit"
        base = self.repo._refs.find_merge_base(d, s).id
        assert base in bases, "graveler's merge base is a best common ancestor"
        base_tree = self.virtual_base(d, s)
        expect, conflicts = three_way(base_tree, self.commits[s], self.commits[d], strategy)
        nothing = base == s or base_tree == self.commits[s]
        try:
            c = self.repo.merge(src, dest, strategy)
        except NothingToCommit:
            assert nothing
            event("merge: nothing")
            return
        except MergeConflict as e:
            assert conflicts and not nothing
            assert sorted(k.decode() for k in e.keys) == conflicts
            event("merge: conflict")
            return
        event(f"merge: ok ({len(bases)} best bases)")
        assert not nothing and not conflicts
        assert c.parents == (d, s) and c.generation == max(self.gen[d], self.gen[s]) + 1
        self.record(c, expect)
        self.heads[dest] = c.id
        self.staged[dest] = {k: v for k, v in self.staged[dest].items() if False}

    @rule(b=branches, how=st.sampled_from(["all", "path", "prefix"]), path=st.sampled_from(PATHS + ["d/", "d/z"]))
    def reset(self, b, how, path):
        if b not in self.heads:
            return
        if how == "all":
            self.repo.reset(b)
            self.staged[b] = {}
        elif how == "path":
            if path.endswith("/"):
                return
            self.repo.reset(b, path=path)
            self.staged[b].pop(path, None)
        else:
            self.repo.reset(b, prefix=path)
            self.staged[b] = {k: v for k, v in self.staged[b].items() if not k.startswith(path)}

    @rule(b=branches, back=st.integers(0, 4), clean_first=st.booleans())
    def revert(self, b, back, clean_first):
        if b not in self.heads:
            return
        if clean_first:
            self.commit(b, False)
        # the back-th first-parent ancestor of the branch head
        target = self.heads[b]
        for _ in range(back):
            if not self.parents[target]:
                return
            target = self.parents[target][0]
        parents = self.parents[target]
        if len(parents) > 1:
            parent_number = 1
        else:
            parent_number = 0
        head = self.heads[b]
        if self.dirty(b):
            try:
                self.repo.revert(b, target, parent_number)
                raise AssertionError("revert on a dirty branch succeeded")
            except DirtyBranch:
                return
        parent_content = self.commits[parents[0]] if parents else {}
        expect, conflicts = three_way(self.commits[target], parent_content, self.commits[head], MergeStrategy.NONE)
        try:
            c = self.repo.revert(b, target, parent_number)
        except MergeConflict as e:
            assert sorted(k.decode() for k in e.keys) == conflicts
            event("revert: conflict")
            return
        except NothingToCommit:
            assert not conflicts and expect == self.commits[head]
            event("revert: nothing")
            return
        event("revert: ok")
        assert not conflicts and expect != self.commits[head]
        assert c.parents == (head,)
        self.record(c, expect)
        self.heads[b] = c.id
        self.staged[b] = {}

    # -- checks
    @invariant()
    def every_ref_matches(self):
        for b in self.heads:
            got = {k.decode(): v for k, v in contents(self.repo, b).items()}
            assert got == self.view(b), f"branch {b}"
            assert self.repo.get_branch(b).commit_id == self.heads[b]
            committed = {k.decode(): v for k, v in contents(self.repo, b + "@").items()}
            assert committed == self.commits[self.heads[b]], f"branch {b}@"
            diff = {d.key.decode() for d in self.repo.diff_uncommitted(b)}
            head = self.commits[self.heads[b]]
            view = self.view(b)
            assert diff == {k for k in set(head) | set(view) if head.get(k) != view.get(k)}
        for cid, content in self.commits.items():
            got = {k.decode(): v for k, v in contents(self.repo, cid).items()}
            assert got == content, f"commit {cid[:12]}"


GravelerModel.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestGravelerModel = GravelerModel.TestCase


class MemoryGravelerModel(GravelerModel):
    """The same machine on the in-memory KV backend."""

    def __init__(self):
        graveler_testutil.current_backend = "memory"
        try:
            super().__init__()
        finally:
            graveler_testutil.current_backend = "lmdb"


MemoryGravelerModel.TestCase.settings = GravelerModel.TestCase.settings
TestGravelerModelMemory = MemoryGravelerModel.TestCase


class PostgresGravelerModel(GravelerModel):
    """The same machine on the PostgreSQL KV backend (a schema of its own per example)."""

    def __init__(self):
        graveler_testutil.current_backend = "postgres"
        try:
            super().__init__()
        finally:
            graveler_testutil.current_backend = "lmdb"

    def teardown(self):
        from graveler.kv.postgres import close_pg_backends

        try:
            super().teardown()
        finally:
            close_pg_backends()


# Half the examples: every step is a few server round trips (about 5x LMDB's time); the machine's logic is
# the same on every backend, and the server's own behaviour is proven by tests/test_kv_postgres.py.
PostgresGravelerModel.TestCase.settings = settings(GravelerModel.TestCase.settings, max_examples=100)
# (slow: about 100 s; the default suite runs the machine on LMDB and in memory)
TestGravelerModelPostgres = pytest.mark.slow(pytest.mark.usefixtures("postgres_url")(PostgresGravelerModel.TestCase))
