"""Staged writes on PostgreSQL (graveler.kv.postgres): a group of them runs at READ COMMITTED with
the branch row locked ``FOR SHARE``, and bumps its process's stripe of the branch's change stamp
(graveler.refs.manager), so writers of many processes never wait for each other's commit.

What must hold: a staged write never lands in a token a commit sealed (it waits for the commit
holding the branch row, then writes into the new token); staged writes of several processes
racing commits lose nothing; the stamp a mount watches rises by exactly one per staged write,
whichever process made it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from graveler import Graveler, GravelerConfig, kv
from graveler.errors import NothingToCommit
from graveler.refs.records import new_staging_token
from tests import pg_testutil
from tests.graveler_testutil import entry

pytestmark = pytest.mark.usefixtures("postgres_url")

ROOT = Path(__file__).resolve().parents[1]

# A writer process: stages N paths under PREFIX on main from THREADS threads, then prints "done".
_WRITER = """
import sys, threading
sys.path.insert(0, {root!r})
from graveler import Graveler, GravelerConfig
from tests.graveler_testutil import entry
g = Graveler(GravelerConfig.from_home({home!r}, kv_url={url!r}))
repo = g.repository("rep")
def run(t):
    for i in range(t, {n}, {threads}):
        repo.stage("main", f"{prefix}/{{i:04d}}", entry(f"{prefix}-{{i}}"))
ths = [threading.Thread(target=run, args=(t,)) for t in range({threads})]
[th.start() for th in ths]
[th.join() for th in ths]
print("done", flush=True)
"""


@pytest.fixture
def repo(postgres_url, tmp_path):
    url = pg_testutil.schema_url(postgres_url, str(tmp_path))
    g = Graveler(GravelerConfig.from_home(tmp_path / "home", kv_url=url))
    r = g.create_repository("rep", f"file://{tmp_path}/ns")
    r.url, r.tmp = url, tmp_path
    yield r
    g.close()


def _writer(repo, name: str, prefix: str, n: int, threads: int = 4) -> subprocess.Popen:
    code = _WRITER.format(root=str(ROOT), home=str(repo.tmp / f"home-{name}"), url=repo.url, n=n,
                          threads=threads, prefix=prefix)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)


def _staged_keys(repo, token: str) -> list[bytes]:
    store = repo._env
    t = token.encode() + b"\0"
    with store.read() as txn:
        return [k[len(t):] for k, _ in txn.scan(kv.STAGING, t, t[:-1] + b"\x01")]


def test_a_staged_write_waits_for_a_commit_holding_the_branch_and_lands_in_the_new_token(repo):
    old = repo.get_branch("main")
    new_token = new_staging_token()
    holding, release = threading.Event(), threading.Event()

    def seal(txn):  # a commit's seal: the branch record moves to a new token, the old one sealed
        b = repo._refs.get_branch_txn(txn, "main")
        repo._refs.put_branch_txn(txn, replace(b, staging_token=new_token,
                                               sealed_tokens=(b.staging_token,) + b.sealed_tokens))
        txn.flush()  # the update reaches the server now: the row is locked until this commits
        holding.set()
        assert release.wait(20)

    sealer = threading.Thread(target=lambda: repo._env.write(seal))
    sealer.start()
    assert holding.wait(20)
    staged = threading.Event()
    stager = threading.Thread(target=lambda: (repo.stage("main", "p", entry("p")), staged.set()))
    stager.start()
    assert not staged.wait(0.5), "a staged write went ahead while a commit held the branch"
    release.set()
    sealer.join(20)
    assert staged.wait(20)
    stager.join(20)
    assert _staged_keys(repo, new_token) == [b"p"] and _staged_keys(repo, old.staging_token) == []


def test_staged_writes_of_three_processes_racing_commits_lose_nothing(repo):
    n = 120
    writers = [_writer(repo, f"w{i}", f"w{i}", n) for i in range(3)]
    commits = 0
    deadline = time.monotonic() + 120
    while any(w.poll() is None for w in writers) and time.monotonic() < deadline:
        try:
            repo.commit("main", f"round {commits}")
            commits += 1
        except NothingToCommit:
            time.sleep(0.01)
    for w in writers:
        assert w.communicate(timeout=60)[0].strip() == "done" and w.returncode == 0
    assert commits >= 2, "the writers finished before commits could race them"
    want = {f"w{i}/{j:04d}".encode(): f"w{i}-{j}" for i in range(3) for j in range(n)}
    seen = {it.path: it.entry.etag for it in repo.list("main", delimiter="")}
    assert seen == want  # committed or still staged: every write is there once, none lost
    if repo.has_uncommitted("main"):
        repo.commit("main", "the rest")
    assert {it.path: it.entry.etag for it in repo.list("main", delimiter="")} == want
    assert not repo.has_uncommitted("main") and repo._refs.stamp("main") > 0


def test_the_stamp_rises_by_one_per_staged_write_whichever_process_made_it(repo):
    s0 = repo.change_stamp("main")
    for i in range(3):
        repo.stage("main", f"a/{i}", entry(f"a{i}"))
        assert repo.change_stamp("main") == s0 + i + 1
    w = _writer(repo, "w", "b", 5, threads=1)
    assert w.communicate(timeout=60)[0].strip() == "done"
    assert repo.change_stamp("main") == s0 + 8
    with repo._env.read() as txn:
        assert repo._refs.stamp_txn(txn, "main") == s0 + 8
    repo.commit("main", "c")
    assert repo.change_stamp("main") > s0 + 8


def test_a_save_checking_its_branchs_birth_costs_no_more_round_trips_than_one_that_does_not(repo, monkeypatch):
    """The mount's save checks that the branch is the one its file was opened on (a read of the
    branch's birth beside its record): the two are read in one statement, so on a server the check
    costs no round trip of its own. Counted at the wire; the check still refuses a branch made again."""
    from graveler.errors import NotFound
    from graveler.kv import pg_wire
    from graveler.repository import ANY_BIRTH

    statements: list[bytes] = []
    real = pg_wire.run

    def counted(conn, name, params):
        statements.append(name)
        return real(conn, name, params)

    monkeypatch.setattr(pg_wire, "run", counted)
    born = repo.branch_born("main")
    counts = []
    for i, b in enumerate((ANY_BIRTH, born, ANY_BIRTH, born)):
        statements.clear()
        repo.stage_stamped("main", [(f"k{i}", entry(f"k{i}"))], False, b)
        counts.append(len(statements))
    assert counts[0] == counts[1] == counts[2] == counts[3], (counts, statements)
    assert b"lakefuse_get2_share" in statements
    repo.create_branch("again")
    old = repo.branch_born("again")
    repo.delete_branch("again")
    repo.create_branch("again")
    with pytest.raises(NotFound, match="was deleted"):
        repo.stage_stamped("again", [("x", entry("x"))], False, old)
