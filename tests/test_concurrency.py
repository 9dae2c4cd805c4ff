"""Several processes on one repository: writers, committers and a reader at once.

Checks that nothing staged or committed is lost or duplicated: every path written
ends up committed exactly once (added by exactly one commit of the first-parent
history, never removed), with the value its writer gave it, and that a reader
never sees a written path disappear while commits seal and drop staging tokens.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from pathlib import Path

from graveler.errors import NothingToCommit, PreconditionFailed
from graveler import Graveler
from graveler.model import DiffType
from graveler.config import GravelerConfig
from tests.graveler_testutil import FAST_KV, entry

WRITERS = 3
PER_WRITER = 3000
COMMITTERS = 2


def _open(home: str):
    return Graveler(GravelerConfig(home=Path(home), kv=FAST_KV, commit_retries=20)).repository("conc")


def writer(home: str, w: int, ready, start, done) -> None:
    repo = _open(home)
    ready.put(w)
    start.wait()
    j = 0
    while j < PER_WRITER:
        if j % 3 == 0 and j + 5 <= PER_WRITER:  # a batch of 5 in one transaction
            repo.stage_many("main", [(f"w{w}/{k:05d}", entry(f"w{w}-{k}")) for k in range(j, j + 5)])
            j += 5
        elif j % 50 == 1:  # now and then a real upload
            repo.upload("main", f"w{w}/{j:05d}", f"w{w}-{j}".encode())
            j += 1
        else:
            repo.stage("main", f"w{w}/{j:05d}", entry(f"w{w}-{j}"))
            j += 1
    done.put(("writer", w))


def committer(home: str, c: int, ready, start, stop, out) -> None:
    repo = _open(home)
    ready.put(c)
    start.wait()
    ok = nothing = lost_race = 0
    slowest = 0.0
    while not stop.is_set():
        t = time.monotonic()
        try:
            repo.commit("main", f"committer {c}")
            ok += 1
        except NothingToCommit:
            nothing += 1
        except PreconditionFailed:
            lost_race += 1
        slowest = max(slowest, time.monotonic() - t)
        time.sleep(0.002)
    out.put(("committer", c, ok, nothing, lost_race, round(slowest, 3)))


def reader(home: str, ready, start, stop, out) -> None:
    repo = _open(home)
    ready.put(-1)
    start.wait()
    seen: set[bytes] = set()
    listings = 0
    problems = []
    while not stop.is_set():
        now = {x.path for x in repo.list("main", delimiter="")}
        missing = seen - now
        if missing:
            problems.append(sorted(missing)[:5])
        seen = now
        listings += 1
    out.put(("reader", listings, problems))


def test_writers_and_committers_in_processes(tmp_path):
    home = str(tmp_path / "home")
    g = Graveler(GravelerConfig(home=Path(home), kv=FAST_KV))
    g.create_repository("conc", f"file://{tmp_path}/ns")
    g.close()

    ctx = mp.get_context("spawn")
    start = ctx.Event()
    stop = ctx.Event()
    out = ctx.Queue()
    ready = ctx.Queue()
    procs = [ctx.Process(target=writer, args=(home, w, ready, start, out)) for w in range(WRITERS)]
    procs += [ctx.Process(target=committer, args=(home, c, ready, start, stop, out)) for c in range(COMMITTERS)]
    procs.append(ctx.Process(target=reader, args=(home, ready, start, stop, out)))
    for p in procs:
        p.start()
    for _ in procs:  # everybody has imported graveler and opened the repository
        ready.get(timeout=120)
    t0 = time.monotonic()
    start.set()
    results = []
    while sum(1 for r in results if r[0] == "writer") < WRITERS:
        results.append(out.get(timeout=120))
    stop.set()
    while len(results) < len(procs):
        results.append(out.get(timeout=60))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    elapsed = time.monotonic() - t0

    repo = Graveler(GravelerConfig(home=Path(home), kv=FAST_KV)).repository("conc")
    try:
        repo.commit("main", "final")
    except NothingToCommit:
        pass
    commits_made = sum(r[2] for r in results if r[0] == "committer")
    (rd,) = [r for r in results if r[0] == "reader"]
    assert rd[2] == [], f"reader saw written paths disappear: {rd[2]}"
    assert commits_made >= 2, results

    expect = {f"w{w}/{j:05d}": f"w{w}-{j}" for w in range(WRITERS) for j in range(PER_WRITER)}
    got = {}
    for x in repo.list("main@", delimiter=""):
        e = x.entry
        got[x.path.decode()] = e.etag if e.address.startswith("data/x/") else repo.read_entry(e).decode()
    assert got == expect
    assert not repo.has_uncommitted("main")
    assert repo.get_branch("main").sealed_tokens == ()

    # every path added by exactly one commit of the history, never removed or changed
    added: dict[bytes, int] = {}
    history = list(repo.log("main"))
    for c in history[:-1]:
        for d in repo.diff(c.parents[0], c.id):
            assert d.type is DiffType.ADDED, (d.type, d.key)
            added[d.key] = added.get(d.key, 0) + 1
    assert len(added) == len(expect) and set(added.values()) == {1}
    # no orphan staging data left behind
    live = {t for b in repo.list_branches() for t in b.tokens}
    assert repo._staging.tokens_present() <= live
    print(f"\n{WRITERS * PER_WRITER} writes, {len(history) - 1} commits, {rd[1]} listings in {elapsed:.1f}s; {results}")


def test_threads_share_one_repository(tmp_path):
    """Many reader threads, a writer thread and a committer thread on one Repository object."""
    g = Graveler(GravelerConfig(home=tmp_path / "home", kv=FAST_KV, commit_retries=20))
    repo = g.create_repository("thr", f"file://{tmp_path}/ns")
    stop = threading.Event()
    errors: list[BaseException] = []
    written: list[str] = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)
                stop.set()
        return run

    @guard
    def write():
        for i in range(800):
            repo.stage("main", f"t/{i:05d}", entry(f"t{i}"))
            written.append(f"t/{i:05d}")
        stop.set()

    @guard
    def commit():
        while not stop.is_set():
            try:
                repo.commit("main", "c")
            except NothingToCommit:
                pass

    @guard
    def read():
        while not stop.is_set():
            n = len(written)
            if n:
                p = written[n - 1]
                assert repo.get("main", p).etag == "t" + str(int(p[2:]))
            seen = sum(1 for _ in repo.list("main", "t/"))
            assert seen >= n

    threads = [threading.Thread(target=write), threading.Thread(target=commit)]
    threads += [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    try:
        repo.commit("main", "final")
    except NothingToCommit:
        pass
    assert sum(1 for _ in repo.list("main@", "t/")) == 800
    g.close()
