"""A randomized history that reopens the repository from a new process after every step.

Staging writes and deletes (up to 2,000 entries, in an upload's batches of 1,000, metadata from nothing to
3 KB, so LMDB allocates and frees pages of every kind), commits, merges, resets,
branch creation and deletion: each step runs in a freshly forked process that
opens the refs database from its file, first reads back *everything* the model
says (every branch's view, its committed head, the last commits), then does its
step.  The parent holds only the model and never opens the database, so every
open is a real first open of the file.  A step's process dying of a signal (the
SIGBUS of a mapped short file) fails the test like a wrong answer does.

It runs on every persistent KV backend (LMDB and PostgreSQL); on LMDB the pre-open
check's verdict before each open is counted, so the run shows how often the database
file ended before the last page its meta counted (healthy: the pages are free).
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import traceback
from pathlib import Path
from typing import Callable

import pytest

from graveler import Graveler, GravelerConfig, KVConfig
from graveler.kv import lmdb_file
from graveler.errors import DirtyBranch, MergeConflict, NothingToCommit
from graveler.model import Entry, MergeStrategy
from tests.test_graveler_model import _apply, three_way

# the persistent backends this history runs on (the in-memory one cannot be reopened by another process)
BACKENDS = ("lmdb", "postgres")


def backend_config(backend: str, tmp_path: Path, request) -> KVConfig:
    if backend == "postgres":
        from tests.pg_testutil import schema_url

        url = request.getfixturevalue("postgres_url")  # skips when there is no PostgreSQL to run
        return KVConfig(url=schema_url(url, str(tmp_path)))
    return KVConfig(map_size=1 << 20, sync=False)  # a small map: the history also grows it, and reopens after

PATHS = [f"d{i % 7}/s{i % 3}/f{i:05d}" for i in range(6000)]
BRANCHES = ["main", "dev", "feat"]


def in_new_process(fn: Callable[[], object], timeout: float = 120.0):
    """Run ``fn`` in a forked child and return its result (its exception is raised here)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            try:
                out = ("ok", fn())
            except BaseException as e:  # noqa: BLE001 -- handed to the parent
                out = ("err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}", type(e).__name__)
            data = pickle.dumps(out)
            with os.fdopen(w, "wb") as f:
                f.write(data)
        except BaseException:  # noqa: BLE001
            code = 70
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise AssertionError(f"the step's process died of {signal.Signals(os.WTERMSIG(status)).name}")
    assert os.WEXITSTATUS(status) == 0 and data, f"the step's process failed (status {status})"
    out = pickle.loads(data)
    if out[0] == "err":
        return _Failed(out[1], out[2])
    return out[1]


class _Failed:
    def __init__(self, text: str, kind: str):
        self.text, self.kind = text, kind


class History:
    """The model (commits as path -> etag, heads, staged changes) and the steps, each in a new process."""

    def __init__(self, tmp: Path, kv: KVConfig, seed: int):
        self.home = tmp / "home"
        self.ns = f"file://{tmp}/ns"
        self.kv = kv
        self.rnd = random.Random(seed)
        self.short_opens = 0
        self.opens = 0
        head = self.run(lambda g: g.create_repository("reopen", self.ns).get_branch("main").commit_id, create=True)
        self.commits: dict[str, dict[str, str]] = {head: {}}
        self.parents: dict[str, tuple[str, ...]] = {head: ()}
        self.heads = {"main": head}
        self.staged: dict[str, dict[str, str | None]] = {"main": {}}
        self.order = [head]

    def view(self, b: str) -> dict[str, str]:
        return _apply(self.commits[self.heads[b]], self.staged[b])

    def run(self, step, create: bool = False):
        """A new process: judge the file, open the repository, read everything back, then ``step``."""
        refs = self.home / "repos" / "reopen" / "refs.lmdb"

        def child():
            short = 0
            if (refs / "data.mdb").exists():
                fd = os.open(refs / "data.mdb", os.O_RDONLY)
                try:
                    v = lmdb_file.check(fd)
                finally:
                    os.close(fd)
                assert v.healthy, f"a database made by ordinary use judged damaged: {v}"
                short = v.short_pages
            g = Graveler(GravelerConfig(home=self.home, kv=self.kv))
            try:
                if create:
                    return short, step(g)
                repo = g.repository("reopen")
                self.read_back(repo)
                return short, step(repo)
            finally:
                g.close()

        out = in_new_process(child)
        if isinstance(out, _Failed):
            raise AssertionError(out.text)
        short, result = out
        self.opens += 1
        self.short_opens += bool(short)
        return result

    def read_back(self, repo) -> None:
        """Everything the model knows must read back exactly from the reopened repository."""
        assert sorted(b.name for b in repo.list_branches()) == sorted(self.heads)
        for b in self.heads:
            assert repo.get_branch(b).commit_id == self.heads[b], b
            got = {it.path.decode(): it.entry.etag for it in repo.list(b, delimiter="")}
            assert got == self.view(b), f"branch {b}"
            head = {it.path.decode(): it.entry.etag for it in repo.list(b + "@", delimiter="")}
            assert head == self.commits[self.heads[b]], f"branch {b}@"
        for cid in self.order[-3:]:
            got = {it.path.decode(): it.entry.etag for it in repo.list(cid, delimiter="")}
            assert got == self.commits[cid], f"commit {cid[:12]}"

    # -- steps -----------------------------------------------------------------------------------

    def entry(self, etag: str) -> Entry:
        meta = {"m": "x" * self.rnd.choice([0, 0, 40, 300, 1200, 3000])}
        return Entry(address=f"data/{etag}", size=len(etag), etag=etag, last_modified_ns=1, metadata=meta)

    def stage(self, b: str, n: int) -> None:
        items = [(p, self.entry(f"e{self.rnd.randrange(10**9)}")) for p in self.rnd.sample(PATHS, n)]
        if self.rnd.random() < 0.5:
            items.sort()  # as an upload walks a tree

        def step(repo):
            for i in range(0, len(items), 1000):  # an upload's batches, one transaction each
                repo.stage_many(b, items[i:i + 1000])

        self.run(step)
        for p, e in items:
            self.staged[b][p] = e.etag

    def upload(self, b: str, n: int) -> None:
        """A recursive upload of a new tree (sorted paths, batches of 1,000), then its commit: the shape
        that left the refs database a page short in the report."""
        self.uploads = getattr(self, "uploads", 0) + 1
        top = f"up{self.uploads}"
        items = [(f"{top}/w{i:06d}", Entry(address=f"data/{top}-{i}", size=16, etag=f"{top}-{i}", last_modified_ns=1))
                 for i in range(n)]

        def step(repo):
            for i in range(0, len(items), 1000):
                repo.stage_many(b, items[i:i + 1000])

        self.run(step)
        for p, e in items:
            self.staged[b][p] = e.etag
        self.commit(b)

    def delete(self, b: str, n: int) -> None:
        visible = sorted(self.view(b))
        paths = self.rnd.sample(visible, min(n, len(visible)))
        if paths:
            self.run(lambda repo: repo.stage_many(b, [(p, None) for p in paths]))
            for p in paths:
                self.staged[b][p] = None

    def commit(self, b: str) -> None:
        new = self.view(b)

        def step(repo):
            try:
                c = repo.commit(b, "step")
            except NothingToCommit:
                return None
            return c.id, tuple(c.parents)

        out = self.run(step)
        if out is None:
            assert new == self.commits[self.heads[b]]
        else:
            assert out[1] == (self.heads[b],)
            self.commits[out[0]], self.parents[out[0]] = new, out[1]
            self.heads[b] = out[0]
            self.order.append(out[0])
        self.staged[b] = {}

    def merge(self, src: str, dest: str, strategy: MergeStrategy) -> None:
        s, d = self.heads[src], self.heads[dest]
        dirty = self.view(dest) != self.commits[d]

        def step(repo):
            base = repo.find_merge_base(dest, src)
            try:
                c = repo.merge(src, dest, strategy)
            except (NothingToCommit, DirtyBranch, MergeConflict) as e:
                return type(e).__name__, base.id if base else None
            return (c.id, tuple(c.parents)), base.id

        out, base = self.run(step)
        if dirty:
            assert out == "DirtyBranch"
            return
        expect, conflicts = three_way(self.commits[base], self.commits[s], self.commits[d], strategy)
        if out == "MergeConflict":
            assert conflicts
        elif out == "NothingToCommit":
            assert base == s or self.commits[base] == self.commits[s]
        else:
            cid, parents = out
            assert parents == (d, s) and not conflicts
            self.commits[cid], self.parents[cid] = expect, parents
            self.heads[dest] = cid
            self.order.append(cid)

    def reset(self, b: str) -> None:
        how = self.rnd.choice(["all", "path", "prefix"])
        if how == "all":
            self.run(lambda repo: repo.reset(b))
            self.staged[b] = {}
        elif how == "path":
            p = self.rnd.choice(PATHS)
            self.run(lambda repo: repo.reset(b, path=p))
            self.staged[b].pop(p, None)
        else:
            pre = f"d{self.rnd.randrange(7)}/"
            self.run(lambda repo: repo.reset(b, prefix=pre))
            self.staged[b] = {k: v for k, v in self.staged[b].items() if not k.startswith(pre)}

    def branch(self) -> None:
        b = self.rnd.choice(BRANCHES[1:])
        if b in self.heads:
            self.run(lambda repo: repo.delete_branch(b))
            del self.heads[b], self.staged[b]
        else:
            src = self.rnd.choice(sorted(self.heads))
            self.run(lambda repo: repo.create_branch(b, src))
            self.heads[b], self.staged[b] = self.heads[src], {}

    def step(self) -> str:
        b = self.rnd.choice(sorted(self.heads))
        kind = self.rnd.choices(["stage", "upload", "delete", "commit", "merge", "reset", "branch"],
                                [30, 3, 12, 22, 14, 10, 6])[0]
        if kind == "upload":
            self.upload(b, self.rnd.choice([3000, 8000]))
        elif kind == "stage":
            self.stage(b, self.rnd.choice([1, 5, 50, 400, 1000, 2000]))
        elif kind == "delete":
            self.delete(b, self.rnd.choice([1, 20, 300, 1000]))
        elif kind == "commit":
            self.commit(b)
        elif kind == "merge" and len(self.heads) > 1:
            src, dest = self.rnd.sample(sorted(self.heads), 2)
            if self.rnd.random() < 0.7:  # usually commit both sides first, so most merges do work
                self.commit(src)
                self.commit(dest)
            self.merge(src, dest, self.rnd.choice(list(MergeStrategy)))
        elif kind == "reset":
            self.reset(b)
        else:
            self.branch()
        return kind


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [1, pytest.param(8, marks=pytest.mark.slow)])  # (seed 8: CI's second history)
def test_every_step_reopens_and_reads_back_exactly(tmp_path, backend, seed, request):
    h = History(tmp_path, backend_config(backend, tmp_path, request), seed)
    kinds: dict[str, int] = {}
    for _ in range(70):
        k = h.step()
        kinds[k] = kinds.get(k, 0) + 1
    h.run(lambda repo: None)  # and once more after the last step
    assert kinds.get("commit", 0) >= 5 and kinds.get("merge", 0) >= 3, kinds
    print(f"{backend} seed {seed}: {h.opens} opens, {h.short_opens} of a file shorter than its meta "
          f"counted (free pages only); steps {kinds}")
