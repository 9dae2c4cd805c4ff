"""An LMDB home's schema version: recorded in every environment, an unversioned (older) one
stamped in place with its data intact, a newer one refused before anything is created in it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from graveler import Graveler, GravelerConfig
from graveler.errors import CorruptedData
from graveler.kv import TABLES, close_env
from graveler.kv.lmdb_schema import META_DB, SCHEMA_KEY, SCHEMA_VERSION
from lakefuse.cli import main

REPO = "rep1"


def _refs(home: Path, repo: str = REPO) -> Path:
    return home / "repos" / repo / "refs.lmdb"


def _make_repo(tmp_path: Path, name: str = REPO) -> Path:
    """A home with a repository made by ordinary use: a commit, a branch, a staged change."""
    home = tmp_path / "home"
    src = tmp_path / "f"
    src.write_bytes(b"payload")
    for args in (("repo", "create", f"lakefs://{name}"),
                 ("fs", "upload", f"lakefs://{name}/main/a.txt", "-s", str(src)),
                 ("commit", f"lakefs://{name}/main", "-m", "one"),
                 ("branch", "create", f"lakefs://{name}/dev", "--source", f"lakefs://{name}/main"),
                 ("fs", "upload", f"lakefs://{name}/dev/b.txt", "-s", str(src))):
        assert main([*args, "--home", str(home)]) == 0, args
    close_env(_refs(home, name))
    return home


def _raw_schema(path: Path) -> bytes | None:
    """The recorded version, read with LMDB directly (this process has the env closed)."""
    env = lmdb.open(str(path), max_dbs=len(TABLES) + 2, readonly=True, lock=False)
    try:
        try:
            meta = env.open_db(META_DB, create=False)
        except lmdb.NotFoundError:
            return None
        with env.begin(db=meta) as txn:
            return txn.get(SCHEMA_KEY)
    finally:
        env.close()


def _set_raw(path: Path, value: bytes | None) -> None:
    """Write (or, with None, drop) the version record as another lakefuse would have."""
    env = lmdb.open(str(path), max_dbs=len(TABLES) + 2)
    try:
        meta = env.open_db(META_DB)
        with env.begin(write=True) as txn:
            if value is None:
                txn.drop(meta, delete=True)
            else:
                txn.put(SCHEMA_KEY, value, db=meta)
    finally:
        env.close()


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lakefuse", *args, "--home", str(home)],
                          capture_output=True, text=True, timeout=60)


def test_a_new_repository_records_the_schema_version(tmp_path):
    home = _make_repo(tmp_path)
    assert _raw_schema(_refs(home)) == str(SCHEMA_VERSION).encode()
    r = _cli(home, "fs", "ls", "lakefs://rep1/dev/")
    assert r.returncode == 0 and "a.txt" in r.stdout and "b.txt" in r.stdout, r


def test_an_unversioned_home_is_stamped_and_reads_as_before(tmp_path, caplog):
    """A home written before versions were recorded (no version record; the same tables) is an
    older home: it is migrated (stamped) on first open, its refs and staging intact."""
    home = _make_repo(tmp_path)
    before = _cli(home, "log", "lakefs://rep1/main", "--json").stdout
    _set_raw(_refs(home), None)
    assert _raw_schema(_refs(home)) is None
    caplog.set_level("INFO", logger="graveler.kv.lmdb_schema")
    repo = Graveler(GravelerConfig.from_home(home, kv_url="lmdb")).repository(REPO)
    assert repo.get("dev", "b.txt") is not None  # the staged change survived
    assert [b.name for b in repo.list_branches()] == ["dev", "main"]
    assert any("recorded schema version" in r.getMessage() for r in caplog.records)
    repo.close()
    assert _raw_schema(_refs(home)) == str(SCHEMA_VERSION).encode()
    assert _cli(home, "log", "lakefs://rep1/main", "--json").stdout == before


def test_a_newer_schema_is_refused_and_left_unchanged(tmp_path):
    home = _make_repo(tmp_path)
    _make_repo(tmp_path, "rep2")
    data = _refs(home) / "data.mdb"
    _set_raw(_refs(home), str(SCHEMA_VERSION + 1).encode())
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    r = _cli(home, "log", "lakefs://rep1/main")
    assert r.returncode == 5, r
    assert r.stderr.count("\n") == 1 and "newer lakefuse" in r.stderr and "upgrade lakefuse" in r.stderr
    assert "damaged" not in r.stderr
    r = _cli(home, "repo", "list")
    assert "rep2" in r.stdout  # one unreadable repository never hides the others
    assert hashlib.sha256(data.read_bytes()).hexdigest() == digest


def test_a_newer_schema_in_a_fresh_file_gets_no_tables(tmp_path):
    """Refused before the tables are created: a newer lakefuse's file gains nothing of ours."""
    path = _refs(tmp_path / "home")
    path.mkdir(parents=True)
    _set_raw(path, b"99")
    with pytest.raises(CorruptedData, match="newer lakefuse"):
        Graveler(GravelerConfig.from_home(tmp_path / "home", kv_url="lmdb")).repository(REPO)
    env = lmdb.open(str(path), max_dbs=len(TABLES) + 2, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            names = [k for k, _ in txn.cursor()]
    finally:
        env.close()
    assert names == [META_DB]


def test_a_garbled_version_record_is_damage(tmp_path):
    home = _make_repo(tmp_path)
    _set_raw(_refs(home), b"v1\x00")
    r = _cli(home, "log", "lakefs://rep1/main")
    assert r.returncode == 5 and "damaged" in r.stderr and "schema version record" in r.stderr, r


def test_a_read_left_by_an_exception_gives_its_reader_slot_back(tmp_path):
    """Found by an ETL team running three mounts of one repository: failed lookups (a branch that
    does not exist, an unknown ref) each kept an LMDB reader slot -- py-lmdb's abort of a read only
    resets it, the slot taken until the Transaction object goes, and the exception's traceback kept
    it alive (a daemon's collector runs rarely) -- until the repository's 1,024 slots were gone and
    every mount and command failed with MDB_READERS_FULL. A read gives its slot back as it ends,
    whatever keeps its frames."""
    from graveler.errors import NotFound

    g = Graveler(GravelerConfig(home=tmp_path / "home"))
    repo = g.create_repository("slots", (tmp_path / "ns").as_uri())
    raw = repo._env._env

    def taken() -> int:  # the slots in LMDB's reader table ("(no active readers)", or a header and one a line)
        lines = raw.readers().splitlines()
        return 0 if lines[0].startswith("(no") else len(lines) - 1

    kept = []
    for i in range(200):
        try:
            repo.get_branch(f"nosuch{i}")
        except NotFound as e:
            kept.append(e)  # (its traceback, and the frames in it, alive)
    assert len(kept) == 200 and taken() <= 2  # (py-lmdb keeps one reset transaction for reuse)
    assert repo.get_branch("main").name == "main"
    g.close()


def test_an_open_waiting_for_another_process_s_write_transaction_says_so(tmp_path, caplog, monkeypatch):
    """Found by a concurrency tour: a process stopped inside a write transaction held every command
    back -- read-only ones too (opening the tables takes LMDB's writer lock) -- without a word, and
    the wait held the GIL (py-lmdb's ``open_db``): nothing else in the process ran. The wait now
    releases the GIL and is said after a moment, naming the database; the open goes on once the
    writer is done."""
    import threading
    import time

    from graveler.kv import lmdb_schema

    home = _make_repo(tmp_path)
    monkeypatch.setattr(lmdb_schema, "WAIT_NOTE_S", 0.3)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import lmdb, sys\n"
        f"e = lmdb.open({str(_refs(home))!r}, max_dbs=20, map_size=1 << 20, readahead=False, lock=True)\n"
        "t = e.begin(write=True)\nprint('held', flush=True)\nsys.stdin.readline()\nt.abort()\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    opened: list = []

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "waiting for another process's write transaction"
                in r.getMessage()]

    try:
        assert holder.stdout.readline().strip() == "held"
        caplog.set_level("WARNING", logger="graveler.kv.lmdb_schema")

        def open_it() -> None:
            repo = Graveler(GravelerConfig.from_home(home, kv_url="lmdb")).repository(REPO)
            opened.append([b.name for b in repo.list_branches()])
            repo.close()

        t = threading.Thread(target=open_it, daemon=True)
        t.start()
        end = time.monotonic() + 30  # (this thread runs meanwhile: the wait does not hold the GIL)
        while not said() and time.monotonic() < end:
            time.sleep(0.05)
        assert said() and not opened  # (it waits for the writer, and says so)
    finally:
        holder.stdin.write("go\n")
        holder.stdin.flush()
        holder.wait(10)
    t.join(30)
    assert opened == [["dev", "main"]]
    assert len(said()) == 1 and "refs.lmdb" in said()[0], said()
