"""The command line of a PostgreSQL KV: ``--kv`` / ``$LAKEFUSE_KV``, ``repo list`` across homes,
local namespaces refused on a shared KV, ``kv copy`` between backends, refs restore onto
PostgreSQL, and how a bad URL, a wrong password, a stopped server and a newer schema read.

Real parts: the session's throwaway PostgreSQL cluster (a schema per test), LMDB homes in
temp dirs, local storage namespaces; the CLI in-process (``lakefuse.cli.main``) except where
what a shell or ``ps`` sees is the point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakefuse.cli import main
from tests import pg_testutil
from tests.mount_testutil import force_unmount, is_mounted, lakefuse_cmd, needs_fuse

pytestmark = pytest.mark.usefixtures("postgres_url")
pytest.importorskip("graveler.kv.postgres")

REPO = "lakefs://demo"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("LAKEFUSE_KV", raising=False)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    yield
    from graveler.kv.postgres import close_pg_backends

    close_pg_backends()


@pytest.fixture
def pg(postgres_url, tmp_path) -> str:
    """A PostgreSQL KV of this test alone (a schema of its own in the session's database)."""
    return pg_testutil.schema_url(postgres_url, str(tmp_path))


class Run:
    def __init__(self, capsys):
        self.capsys = capsys

    def __call__(self, *args: str, code: int = 0) -> str:
        self.capsys.readouterr()
        rc = main(list(args))
        res = self.capsys.readouterr()
        self.err = res.err
        assert rc == code, f"lakefuse {' '.join(args)} -> {rc}\nstdout: {res.out}\nstderr: {res.err}"
        return res.out

    def jsonl(self, *args: str) -> list:
        return [json.loads(line) for line in self(*args, "--json").splitlines()]

    def fails(self, code: int, *args: str) -> str:
        """A command that must fail with ``code`` and say why in one line; that line."""
        out = self(*args, code=code)
        lines = self.err.strip().splitlines()
        assert out == "" and len(lines) == 1 and lines[0].startswith("lakefuse: "), self.err
        return lines[0]


@pytest.fixture
def run(capsys) -> Run:
    return Run(capsys)


def _files(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


# --- choosing the KV --------------------------------------------------------------------------


def test_kv_option_env_and_repo_list_from_two_homes(run, pg, tmp_path, monkeypatch):
    home_a, home_b = str(tmp_path / "a"), str(tmp_path / "b")
    ns = (tmp_path / "ns").as_uri()
    # --kv after the command, and before it (the main parser's)
    run("repo", "create", "lakefs://one", "--home", home_a, "--kv", pg, "--storage", ns + "/one",
        "--allow-local-storage")
    run("--kv", pg, "--home", home_b, "repo", "create", "lakefs://two", "--storage", ns + "/two",
        "--allow-local-storage")
    # every host (home) lists every repository of the store
    for home in (home_a, home_b):
        assert [r["name"] for r in run.jsonl("repo", "list", "--home", home, "--kv", pg)] == ["one", "two"]
    # $LAKEFUSE_KV chooses it too; --kv lmdb overrides it
    monkeypatch.setenv("LAKEFUSE_KV", pg)
    assert [r["name"] for r in run.jsonl("repo", "list", "--home", home_b)] == ["one", "two"]
    assert run("repo", "list", "--home", home_b, "--kv", "lmdb") == ""
    assert "no repositories in " + str(Path(home_b)) in run.err
    monkeypatch.delenv("LAKEFUSE_KV")
    # the LMDB homes hold nothing of it
    assert run.jsonl("repo", "list", "--home", home_a) == []
    assert not (Path(home_a) / "repos").exists() and not (Path(home_b) / "repos").exists()
    # work on one host is seen on the other
    _files(tmp_path / "src", {"x.txt": b"x"})
    run("fs", "upload", "lakefs://one/main/x.txt", "--source", str(tmp_path / "src" / "x.txt"), "--home", home_a,
        "--kv", pg)
    run("commit", "lakefs://one/main", "-m", "from host a", "--home", home_a, "--kv", pg)
    assert run("fs", "cat", "lakefs://one/main/x.txt", "--home", home_b, "--kv", pg) == "x"
    assert run.jsonl("log", "lakefs://one/main", "--home", home_b, "--kv", pg)[0]["message"] == "from host a"


def test_repo_create_on_a_shared_kv_refuses_a_local_namespace(run, pg, tmp_path):
    home = str(tmp_path / "home")
    msg = run.fails(2, "repo", "create", REPO, "--home", home, "--kv", pg)
    assert "is a directory of this host" in msg and "shared KV" in msg and "--allow-local-storage" in msg
    msg = run.fails(2, "repo", "create", REPO, "--home", home, "--kv", pg, "--storage", (tmp_path / "ns").as_uri())
    assert "other hosts would see the repository and not its data" in msg
    assert run.jsonl("repo", "list", "--home", home, "--kv", pg) == []  # nothing was made
    msg = run.fails(2, "refs", "restore", REPO, "--home", home, "--kv", pg)
    assert "--allow-local-storage" in msg
    run("repo", "create", REPO, "--home", home, "--kv", pg, "--allow-local-storage")
    assert [r["name"] for r in run.jsonl("repo", "list", "--home", home, "--kv", pg)] == ["demo"]
    # LMDB (the home's own store) takes a local namespace as always
    run("repo", "create", REPO, "--home", home)


# --- kv copy ----------------------------------------------------------------------------------


def _state(run: Run, *where: str) -> dict:
    """What a user sees of repository demo: branches, tags, log, trees, uncommitted changes."""
    return {
        "branches": run.jsonl("branch", "list", REPO, *where),
        "tags": run.jsonl("tag", "list", REPO, *where),
        "log_main": [c["id"] for c in run.jsonl("log", f"{REPO}/main", *where)],
        "log_dev": [c["id"] for c in run.jsonl("log", f"{REPO}/dev", *where)],
        "ls_main": run.jsonl("fs", "ls", f"{REPO}/main/", "--recursive", *where),
        "ls_v1": run.jsonl("fs", "ls", f"{REPO}/v1/", "--recursive", *where),
        "diff_main": run("diff", f"{REPO}/main", *where),
        "diff_dev": run("diff", f"{REPO}/dev", *where),
        "cat": run("fs", "cat", f"{REPO}/main/new.txt", *where),
    }


def test_kv_copy_round_trip_lmdb_postgres_lmdb_with_staged_changes(run, pg, tmp_path):
    home_a, home_b, home_c = (str(tmp_path / h) for h in ("a", "b", "c"))
    src = _files(tmp_path / "src", {"a.txt": b"aaa", "b.txt": b"bbb", "d/c.txt": b"ccc", "new.txt": b"new",
                                    "a2.txt": b"AAA2"})
    lm_a = ("--home", home_a)
    run("repo", "create", REPO, *lm_a)
    for name in ("a.txt", "b.txt", "d/c.txt"):
        run("fs", "upload", f"{REPO}/main/{name}", "--source", str(src / name), *lm_a)
    run("commit", f"{REPO}/main", "-m", "first", *lm_a)
    run("tag", "create", f"{REPO}/v1", "main", *lm_a)
    run("branch", "create", f"{REPO}/dev", "--source", "main", *lm_a)
    run("fs", "rm", f"{REPO}/dev/b.txt", *lm_a)
    run("commit", f"{REPO}/dev", "-m", "drop b on dev", *lm_a)
    # uncommitted: an added file, a changed file, a deletion (a tombstone) on main; one on dev
    run("fs", "upload", f"{REPO}/main/new.txt", "--source", str(src / "new.txt"), *lm_a)
    run("fs", "upload", f"{REPO}/main/a.txt", "--source", str(src / "a2.txt"), *lm_a)
    run("fs", "rm", f"{REPO}/main/d/c.txt", *lm_a)
    run("fs", "rm", f"{REPO}/dev/a.txt", *lm_a)
    before = _state(run, *lm_a)
    assert before["diff_main"].splitlines() == ["~ a.txt", "- d/c.txt", "+ new.txt"]
    assert before["diff_dev"].splitlines() == ["- a.txt"]

    msg = run.fails(2, "kv", "copy", "--from", "lmdb", "--to", pg, REPO, "--home", home_a)
    assert "repository 'demo': storage namespace file://" in msg and "--allow-local-storage" in msg
    assert run.jsonl("repo", "list", "--home", home_b, "--kv", pg) == []
    out = run("kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", REPO, "--home", home_a)
    assert out.startswith("copied demo: 2 branches, 1 tags, 3 commits, 4 staged entries (lmdb (")
    on_pg = ("--home", home_b, "--kv", pg)
    assert _state(run, *on_pg) == before
    # a second copy to the same place is refused, and writes nothing
    msg = run.fails(4, "kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", "--home", home_a)
    assert "already holds repository 'demo'" in msg and "nothing was copied" in msg

    # back to LMDB, in another home
    rows = json.loads(run("kv", "copy", "--from", pg, "--to", "lmdb", "--home", home_c, "--json"))
    assert rows["repository"] == "demo" and rows["rows"]["staging"] == 4 and rows["to"] == f"lmdb ({home_c})"
    lm_c = ("--home", home_c)
    assert _state(run, *lm_c) == before

    # the staged changes commit to the same tree everywhere; every copy keeps working on its own
    trees = {}
    for where in (lm_a, on_pg, lm_c):
        c = json.loads(run("commit", f"{REPO}/main", "-m", "second", "--json", *where))
        trees[where] = c["meta_range_id"]
        assert run("diff", f"{REPO}/main", *where) == ""
        assert [e["path"] for e in run.jsonl("fs", "ls", f"{REPO}/main/", "--recursive", *where)] == [
            "a.txt", "b.txt", "new.txt"]
        assert run("fs", "cat", f"{REPO}/main/a.txt", *where) == "AAA2"
        assert run("diff", f"{REPO}/v1", f"{REPO}/main", *where).splitlines() == [
            "~ a.txt", "- d/c.txt", "+ new.txt"]
    assert len(set(trees.values())) == 1


def test_kv_copy_refuses_before_writing_and_says_why(run, pg, tmp_path):
    home = str(tmp_path / "home")
    for name in ("aaa", "bbb"):
        run("repo", "create", f"lakefs://{name}", "--home", home)
    run("kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", "bbb", "--home", home)
    # one of two already there: exit 4 and the other is not copied either
    run.fails(4, "kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", "--home", home)
    assert [r["name"] for r in run.jsonl("repo", "list", "--home", home, "--kv", pg)] == ["bbb"]
    msg = run.fails(3, "kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", "zzz", "aaa", "--home", home)
    assert "no repository 'zzz'" in msg
    assert "same KV" in run.fails(2, "kv", "copy", "--from", pg, "--to", pg, "--home", home)
    assert "unknown KV backend" in run.fails(2, "kv", "copy", "--from", "lmdb", "--to", "redis://x", "--home", home)
    run("kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", "lakefs://aaa", "--home", home)
    assert [r["name"] for r in run.jsonl("repo", "list", "--home", home, "--kv", pg)] == ["aaa", "bbb"]


def test_refs_dump_then_restore_into_a_postgres_repository(run, pg, tmp_path):
    home = str(tmp_path / "home")
    src = _files(tmp_path / "src", {"k.txt": b"k1", "k2.txt": b"k2"})
    run("repo", "create", REPO, "--home", home)
    run("fs", "upload", f"{REPO}/main/k.txt", "--source", str(src / "k.txt"), "--home", home)
    run("commit", f"{REPO}/main", "-m", "one", "--home", home)
    run("tag", "create", f"{REPO}/v1", "main", "--home", home)
    run("fs", "upload", f"{REPO}/main/k2.txt", "--source", str(src / "k2.txt"), "--home", home)
    run("commit", f"{REPO}/main", "-m", "two", "--home", home)
    manifest = json.loads(run("refs", "dump", REPO, "--home", home, "--json"))
    ns = (Path(home) / "storage" / "demo").as_uri()
    on_pg = ("--home", str(tmp_path / "other"), "--kv", pg)
    res = json.loads(run("refs", "restore", "lakefs://back", "--storage", ns, "--allow-local-storage", "--json",
                         *on_pg))
    assert res["commits"] == 3 and res["branches"] == ["main"] and res["tags"] == ["v1"]
    assert ([c["id"] for c in run.jsonl("log", "lakefs://back/main", *on_pg)]
            == [c["id"] for c in run.jsonl("log", f"{REPO}/main", "--home", home)])
    assert run("fs", "cat", "lakefs://back/v1/k.txt", *on_pg) == "k1"
    # ... and a dump of the PostgreSQL repository names the same commits
    again = json.loads(run("refs", "dump", "lakefs://back", "--json", *on_pg))
    assert again["branches_meta_range_id"] == manifest["branches_meta_range_id"]
    assert again["commits_meta_range_id"] == manifest["commits_meta_range_id"]


# --- failures -----------------------------------------------------------------------------------


def test_bad_urls_wrong_password_stopped_server_newer_schema(run, postgres_cluster, pg, tmp_path):
    home = str(tmp_path / "home")
    secret = "Hidden-Pw-42"

    def fails(code, url, *more):
        msg = run.fails(code, "repo", "list", "--home", home, "--kv", url, *more)
        assert secret not in msg and pg_testutil.PW_SECRET not in msg
        return msg

    assert "bad PostgreSQL URL" in fails(2, f"postgresql://u:{secret}@h/db?no_such_option=1")
    assert "unknown KV backend 'mysql://...'" in fails(2, f"mysql://u:{secret}@h/db")
    assert "unknown KV backend" in fails(2, "lmbd")
    # shapes that are no URL a parser takes apart: the password is still never shown
    for bad in (f"dbname=lakefuse user=u password={secret} host=127.0.0.1", f"u:{secret}@127.0.0.1:5432/db",
                f"postgresql:/u:{secret}@127.0.0.1/db"):
        assert "unknown KV backend" in fails(2, bad)
    assert "bad PostgreSQL URL" in fails(2, f"postgresql://u:{secret}@[::1:5432/db")
    # a password with '/', '@' or '#' written as it is: libpq would take part of it for the host
    for pw in (f"{secret}/x", f"x/{secret}", f"{secret}@x", f"ab+c/{secret}="):
        msg = fails(2, f"postgresql://u:{pw}@127.0.0.1:1/db")
        assert "percent-encode" in msg and not any(part in msg for part in pw.replace("@", "/").split("/"))
    # settings libpq checks only when it connects: bad input too (exit 2), not an outage
    assert "bad PostgreSQL URL" in fails(2, f"postgresql://u:{secret}@127.0.0.1:notaport/db")
    assert "bad PostgreSQL URL" in fails(2, postgres_cluster.url + "?sslmode=bogus")
    # one psycopg reads itself (found by an SRE's tour: exit 6, as if the server were away)
    assert "bad value for connect_timeout" in fails(2, f"postgresql://u:{secret}@127.0.0.1:1/db?connect_timeout=abc")
    msg = fails(2, postgres_cluster.url_with_password(secret))
    assert "refused the login" in msg and "password authentication failed" in msg
    # no password at all for a role that needs one
    assert "refused the login" in fails(2, postgres_cluster.url.replace("postgres@", f"{pg_testutil.PW_ROLE}@"))
    # nobody listens there: a stopped server
    msg = fails(6, f"postgresql://someone:{secret}@/db?host={tmp_path}/nowhere&connect_timeout=2")
    assert "PostgreSQL server someone@" in msg and "No such file or directory" in msg
    import socket

    with socket.socket() as s:  # a TCP port nobody listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        msg = fails(6, f"postgresql://someone:{secret}@127.0.0.1:{port}/db?connect_timeout=2")
    assert f"PostgreSQL server someone@127.0.0.1:{port}/db" in msg and "refused" in msg

    # a schema written by a newer lakefuse is refused, and left as it is
    import psycopg
    from graveler.kv import postgres

    run("repo", "list", "--home", home, "--kv", pg)  # creates the tables
    postgres.close_pg_backends()
    with psycopg.connect(**postgres.parse_url(pg)[0], autocommit=True) as c:
        c.execute(f"UPDATE {postgres.SCHEMA_TABLE} SET version = version + 1")
    msg = fails(5, pg)
    assert "newer than this lakefuse knows" in msg and "upgrade lakefuse" in msg


def test_wrong_password_from_the_environment_in_a_shell(postgres_cluster, tmp_path):
    """What a shell sees: one line, exit 2, no traceback, no password -- with the URL in $LAKEFUSE_KV
    and the right password in $PGPASSWORD working."""
    secret = "Wr0ng-But-Secret"
    env = {**os.environ, "LAKEFUSE_KV": postgres_cluster.url_with_password(secret)}
    r = subprocess.run(lakefuse_cmd(tmp_path / "home", "repo", "list"), capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert secret not in r.stderr and "password authentication failed" in r.stderr
    env["LAKEFUSE_KV"] = postgres_cluster.url.replace("postgres@", f"{pg_testutil.PW_ROLE}@")
    env["PGPASSWORD"] = pg_testutil.PW_SECRET
    r = subprocess.run(lakefuse_cmd(tmp_path / "home", "repo", "list"), capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr


# --- mount --------------------------------------------------------------------------------------


@needs_fuse
def test_daemonized_mount_keeps_the_password_out_of_argv_and_messages(run, postgres_cluster, tmp_path):
    url = pg_testutil.schema_url(postgres_cluster.url_with_password(pg_testutil.PW_SECRET), str(tmp_path))
    home = tmp_path / "home"
    src = _files(tmp_path / "src", {"hello.txt": b"hello"})
    on_pg = ("--home", str(home), "--kv", url)
    run("repo", "create", "lakefs://pwrepo", "--allow-local-storage", *on_pg)
    run("fs", "upload", "lakefs://pwrepo/main/hello.txt", "--source", str(src / "hello.txt"), *on_pg)
    run("commit", "lakefs://pwrepo/main", "-m", "hello", *on_pg)
    mp = tmp_path / "mnt"
    mp.mkdir()
    log = tmp_path / "mount.log"
    r = subprocess.run(lakefuse_cmd(home, "--kv", url, "mount", "lakefs://pwrepo", str(mp), "--log", str(log)),
                       capture_output=True, text=True, timeout=90)
    try:
        assert r.returncode == 0, r.stderr
        assert pg_testutil.PW_SECRET not in r.stderr and "mounted lakefs://pwrepo" in r.stderr
        assert (mp / "main" / "hello.txt").read_bytes() == b"hello"
        pid = json.loads((mp / ".lakefuse" / "stats").read_text())["pid"]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        assert "mount" in cmdline and pg_testutil.PW_SECRET not in cmdline and "--kv" not in cmdline
        u = subprocess.run(lakefuse_cmd(home, "umount", str(mp)), capture_output=True, text=True, timeout=60)
        assert u.returncode == 0, u.stderr
        assert not is_mounted(mp)
    finally:
        force_unmount(mp)
    assert pg_testutil.PW_SECRET not in log.read_text()


# --- Spark --------------------------------------------------------------------------------------


@pytest.mark.slow  # a cold Spark job: ~20 s alone, less after the suite's other Spark tests
def test_spark_import_on_a_postgres_kv(spark, run, pg, tmp_path):
    """Spark's tasks are given the storage namespace and the store's configuration only (never the
    home or the KV): the driver alone reads and moves refs, so a PostgreSQL KV needs nothing shipped
    to the executors."""
    on_pg = ("--home", str(tmp_path / "home"), "--kv", pg)
    run("repo", "create", "lakefs://sparkrepo", "--storage", str(tmp_path / "ns"), "--allow-local-storage", *on_pg)
    src = _files(tmp_path / "src", {f"p{i % 2}/{i}.txt": f"file {i}".encode() for i in range(6)})
    res = json.loads(run("import", str(src), "lakefs://sparkrepo/main/raw/", "--json", *on_pg))
    assert res["imported"] == 6 and res["commit_id"]
    # another host (home) sees the import's commit
    other = ("--home", str(tmp_path / "other"), "--kv", pg)
    assert run.jsonl("log", "lakefs://sparkrepo/main", *other)[0]["id"] == res["commit_id"]
    assert run("fs", "cat", "lakefs://sparkrepo/main/raw/p1/3.txt", *other) == "file 3"


def _trigger(pg_url: str, body: str) -> None:
    """A trigger on the KV table of ``pg_url``'s schema: the server itself misbehaving mid-copy."""
    import psycopg
    from graveler.kv import postgres

    with psycopg.connect(**postgres.parse_url(pg_url)[0], autocommit=True) as c:
        c.execute("DROP TRIGGER IF EXISTS t_copy ON lakefuse_kv")
        if body:
            c.execute(f"CREATE OR REPLACE FUNCTION t_copy_fn() RETURNS trigger LANGUAGE plpgsql AS $$ {body} $$")
            c.execute("CREATE TRIGGER t_copy BEFORE INSERT ON lakefuse_kv FOR EACH ROW EXECUTE FUNCTION t_copy_fn()")


def test_kv_copy_is_all_or_nothing_per_repository(run, pg, tmp_path):
    """The target fails in the middle of a repository's write (the server raises on staging rows), or
    loses rows without an error (the counts read back differ): either way no half repository stays."""
    home = str(tmp_path / "home")
    src = _files(tmp_path / "src", {"s.txt": b"s"})
    run("repo", "create", REPO, "--home", home)
    run("fs", "upload", f"{REPO}/main/s.txt", "--source", str(src / "s.txt"), "--home", home)
    run("repo", "list", "--home", home, "--kv", pg)  # creates the target's tables
    _trigger(pg, "BEGIN IF NEW.tbl = 'staging' THEN RAISE EXCEPTION 'no staging today'; END IF; RETURN NEW; END;")
    msg = run.fails(6, "kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", "--home", home)
    assert "no staging today" in msg
    assert run.jsonl("repo", "list", "--home", home, "--kv", pg) == []
    _trigger(pg, "BEGIN IF NEW.tbl = 'staging' THEN RETURN NULL; END IF; RETURN NEW; END;")  # drops them silently
    msg = run.fails(5, "kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", "--home", home)
    assert "the copy was removed" in msg and "'staging': 0" in msg
    assert run.jsonl("repo", "list", "--home", home, "--kv", pg) == []
    _trigger(pg, "")
    run("kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", "--home", home)
    assert run("diff", f"{REPO}/main", "--home", home, "--kv", pg) == "+ s.txt\n"


def test_fstab_kv_option_becomes_the_global_kv():
    from lakefuse.cli.mount import from_mount_helper

    url = "postgresql://lakefuse@db.example/lakefuse?sslmode=require"
    assert from_mount_helper(["lakefs://repo", "/m", "-o", f"_netdev,kv={url},home=/h,allow_other"]) == [
        "--kv", url, "--home", "/h", "mount", "lakefs://repo", "/m", "-o", "allow_other"]


def test_a_server_restart_between_two_uses_of_the_pool_writes_no_warning_line(tmp_path, caplog):
    """Found by an SRE's tour: after a PostgreSQL restart, a command printed psycopg's pool
    warning ("discarding closed connection") beside its own words -- on success too -- where
    the README promises one line on stderr. The note shows with -v; the daemon's log keeps it."""
    import logging

    from graveler.kv.postgres import close_pg_backends

    reason = pg_testutil.unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = pg_testutil.PgCluster()
    args = ["--home", str(tmp_path / "home"), "--kv", cluster.url]
    try:
        assert main(args + ["repo", "create", "lakefs://restarted", "--storage", f"file://{tmp_path}/ns",
                            "--allow-local-storage"]) == 0
        cluster.stop("immediate")
        cluster.start()
        caplog.clear()
        assert main(args + ["repo", "list"]) == 0  # (a new connection: the command goes on)
        noted = [r for r in caplog.records if r.name.startswith("psycopg") and r.levelno >= logging.WARNING]
        assert not noted, [r.getMessage() for r in noted]
    finally:
        logging.getLogger("psycopg.pool").setLevel(logging.NOTSET)
        close_pg_backends()
        cluster.destroy()


def test_kv_copy_refuses_a_source_repository_a_mount_here_has_open(run, pg, tmp_path):
    """Found by a backup operator's tour: ``kv copy`` copied a repository its mount went on writing
    (the help only advised stopping mounts); what the mount wrote after the snapshot stayed behind.
    As ``repo delete`` does, it refuses now (exit 4), naming the process; after the umount it copies."""
    from tests.mount_testutil import MountProc, needs_fuse

    if needs_fuse.args[0]:
        pytest.skip(needs_fuse.kwargs.get("reason", "no FUSE"))
    home = tmp_path / "home"
    run("repo", "create", REPO, "--home", str(home))
    mp = tmp_path / "mnt"
    mp.mkdir()
    with MountProc(home, "demo", mp):
        msg = run.fails(4, "kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", REPO,
                        "--home", str(home))
        assert "is open in process" in msg and "lakefuse umount" in msg, msg
    assert run.jsonl("repo", "list", "--home", str(home), "--kv", pg) == []
    run("kv", "copy", "--from", "lmdb", "--to", pg, "--allow-local-storage", REPO, "--home", str(home))
