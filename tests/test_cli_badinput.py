"""Hostile input at the CLI's edge: undecodable arguments, special files. One line, the right exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakefuse.cli import main

ROOT = Path(__file__).resolve().parent.parent
BAD = "\udcff"  # how Python hands over the byte 0xFF of an argument (surrogateescape)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A home with repository rep1 (one commit on main) for the commands to aim at."""
    h = tmp_path_factory.mktemp("badinput") / "home"
    src = h.parent / "f.txt"
    src.write_bytes(b"hello\n")
    for args in (("repo", "create", "lakefs://rep1"), ("fs", "upload", "lakefs://rep1/main/a/f.txt", "-s", str(src)),
                 ("commit", "lakefs://rep1/main", "-m", "one")):
        assert main([*args, "--home", str(h)]) == 0
    return h


@pytest.mark.parametrize("args", [
    ("log", f"lakefs://rep1/m{BAD}"),
    ("show", f"lakefs://rep1/m{BAD}"),
    ("diff", "lakefs://rep1/main", f"lakefs://rep1/x{BAD}"),
    ("merge", f"lakefs://rep1/x{BAD}", "lakefs://rep1/main"),
    ("revert", "lakefs://rep1/main", f"x{BAD}"),
    ("branch", "create", "lakefs://rep1/b", "-s", f"main{BAD}"),
    ("branch", "delete", f"lakefs://rep1/b{BAD}", "--yes"),
    ("tag", "create", f"lakefs://rep1/t{BAD}", "main"),
    ("tag", "delete", f"lakefs://rep1/t{BAD}"),
    ("commit", "lakefs://rep1/main", "-m", f"msg{BAD}"),
    ("commit", "lakefs://rep1/main", "-m", "m", "--meta", f"k=v{BAD}"),
    ("fs", "ls", f"lakefs://rep1/main/a{BAD}"),
    ("fs", "rm", "-r", f"lakefs://rep1/main/a{BAD}"),
    ("branch", "reset", "lakefs://rep1/main", "--prefix", f"a{BAD}"),
    ("repo", "create", "lakefs://rep2", "--storage", f"/tmp/x{BAD}"),
], ids=lambda a: " ".join(a[:2]))
def test_undecodable_argument_is_usage_error(home, capsys, args):
    capsys.readouterr()
    assert main([*args, "--home", str(home)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lakefuse: argument ") and "not valid UTF-8" in err[0], err
    assert "\\xff" in err[0]


def run(home: Path | None, *args) -> subprocess.CompletedProcess:
    home_args = ["--home", str(home)] if home else []
    return subprocess.run([sys.executable, "-m", "lakefuse", *args, *home_args], capture_output=True,
                          timeout=60, cwd=ROOT)


def test_undecodable_bytes_from_a_shell(home):
    r = run(home, "log", b"lakefs://rep1/m\xff\x1b[2J")
    assert r.returncode == 2, r.stderr
    assert r.stderr.decode().strip() == "lakefuse: argument 2 is not valid UTF-8: 'lakefs://rep1/m\\xff\\x1b[2J'"


def test_sst_dump_refuses_special_files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (str(fifo), "/dev/zero", str(tmp_path)):
        r = run(None, "sst", "dump", target)  # used to hang forever on the FIFO and /dev/zero
        assert r.returncode == 2, (target, r.stderr)
        assert r.stderr.decode().count("\n") == 1 and b"Traceback" not in r.stderr
    r = run(None, "sst", "dump", str(tmp_path / "absent.sst"))
    assert r.returncode == 3 and b"no such file" in r.stderr


@pytest.mark.parametrize("size", [16384, 0], ids=["truncated", "empty"])
def test_damaged_refs_database_is_exit_5_and_repo_list_shows_the_others(tmp_path, size):
    """A truncated data.mdb was SIGBUS (exit 135) for every command, `repo list` included; an empty one
    made the repository silently vanish (exit 3)."""
    home = tmp_path / "home"
    src = tmp_path / "f"
    src.write_bytes(b"x")
    for args in (("repo", "create", "lakefs://rep1"), ("repo", "create", "lakefs://rep2")):
        assert main([*args, "--home", str(home)]) == 0
    for i in range(3):
        main(["fs", "upload", f"lakefs://rep1/main/f{i}", "-s", str(src), "--home", str(home)])
        main(["commit", "lakefs://rep1/main", "-m", f"c{i}", "--home", str(home)])
    from graveler.kv import close_env

    close_env(home / "repos" / "rep1" / "refs.lmdb")
    os.truncate(home / "repos" / "rep1" / "refs.lmdb" / "data.mdb", size)
    r = run(home, "log", "lakefs://rep1/main")
    assert r.returncode == 5, r
    err = r.stderr.decode()
    assert err.count("\n") == 1 and "repository 'rep1'" in err
    r = run(home, "repo", "list")
    assert r.returncode == 5, r
    out = r.stdout.decode().splitlines()
    assert [line.split()[0] for line in out] == ["REPOSITORY", "rep1", "rep2"]
    assert "DAMAGED" in out[1] and "main" in out[2]
    assert "repository 'rep1'" in r.stderr.decode()
    r = run(home, "repo", "list", "--json")
    import json

    rows = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert [row["name"] for row in rows] == ["rep1", "rep2"] and "damaged" in rows[0]
    assert run(home, "log", "lakefs://rep2/main").returncode == 0


def test_damaged_tag_record_in_an_intact_page_is_exit_5(tmp_path):
    """One tag record damaged inside an intact LMDB page (a byte of its commit ID changed in
    data.mdb: the file, its pages and the protobuf framing are sound): every command that
    reads it says which tag is damaged, one line, exit 5 -- it was exit 3 ("commit ...
    not found"), and `refs dump` copied the damage into the dump with exit 0. The other
    refs keep working."""
    home = tmp_path / "home"
    src = tmp_path / "f"
    src.write_bytes(b"x")
    for args in (("repo", "create", "lakefs://rep1"), ("fs", "upload", "lakefs://rep1/main/f", "-s", str(src)),
                 ("commit", "lakefs://rep1/main", "-m", "one"), ("tag", "create", "lakefs://rep1/v1.0-release", "main"),
                 ("tag", "create", "lakefs://rep1/v2", "main")):
        assert main([*args, "--home", str(home)]) == 0
    assert run(home, "tag", "list", "lakefs://rep1").returncode == 0  # healthy first
    from graveler.kv import close_env

    db = home / "repos" / "rep1" / "refs.lmdb"
    close_env(db)
    raw = bytearray((db / "data.mdb").read_bytes())
    record = b"\x0a\x0cv1.0-release\x12\x40"  # the tag's record: id, then its commit ID
    at = raw.find(record)
    assert at >= 0
    while at >= 0:  # the live page's copy, and any older copy of that page left in the file
        raw[at + len(record) + 3] = ord("g")  # one hex digit of the commit ID damaged
        at = raw.find(record, at + 1)
    (db / "data.mdb").write_bytes(bytes(raw))
    for args in (("tag", "list", "lakefs://rep1"), ("log", "lakefs://rep1/v1.0-release"),
                 ("fs", "ls", "lakefs://rep1/v1.0-release/"), ("refs", "dump", "lakefs://rep1")):
        r = run(home, *args)
        err = r.stderr.decode()
        assert r.returncode == 5 and err.count("\n") == 1, (args, r)
        assert "damaged tag record" in err and "v1.0-release" in err and "Traceback" not in err, err
    assert run(home, "log", "lakefs://rep1/v2").returncode == 0
    assert run(home, "log", "lakefs://rep1/main").returncode == 0


def _capture(home, capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([*args, "--home", str(home)])
    res = capsys.readouterr()
    return rc, res.out, res.err


def test_rm_recursive_of_a_whole_branch_needs_all(home, capsys):
    assert main(["branch", "create", "lakefs://rep1/wipe", "-s", "main", "--home", str(home)]) == 0
    rc, _, err = _capture(home, capsys, "fs", "rm", "-r", "lakefs://rep1/wipe/")
    assert rc == 2 and "--all" in err and err.count("\n") == 1  # it deleted every object, exit 0
    rc, out, _ = _capture(home, capsys, "fs", "ls", "-r", "lakefs://rep1/wipe/")
    assert "f.txt" in out  # nothing was staged
    rc, out, _ = _capture(home, capsys, "fs", "rm", "-r", "--all", "lakefs://rep1/wipe/")
    assert rc == 0 and "Deleted 1 objects" in out
    assert _capture(home, capsys, "fs", "ls", "-r", "lakefs://rep1/wipe/")[1] == ""


@pytest.mark.parametrize("manifest, code, fragment", [
    ("[" * 100_000 + "]" * 100_000, 2, "nested too deeply"),  # a RecursionError traceback
    ('{"branches_meta_range_id": "nothing", "tags_meta_range_id": "", "commits_meta_range_id": ""}', 2,
     "is not a metarange ID"),
    ('{"branches_meta_range_id": "../../etc", "tags_meta_range_id": "", "commits_meta_range_id": ""}', 2,
     "is not a metarange ID"),
    ('{"branches_meta_range_id": "' + "a" * 64 + '", "tags_meta_range_id": "", "commits_meta_range_id": ""}', 5,
     "not in the namespace"),  # was 3 (not found): the dump is bad
    ("[1, 2]", 2, "not an object"),
], ids=["nested", "bogus-id", "path-id", "absent-id", "list"])
def test_refs_restore_of_a_bad_manifest(tmp_path, capsys, manifest, code, fragment):
    m = tmp_path / "manifest.json"
    m.write_text(manifest)
    rc, _, err = _capture(tmp_path / "h", capsys, "refs", "restore", "lakefs://fresh", "--manifest", str(m))
    assert rc == code and fragment in err and err.count("\n") == 1, err
    assert _capture(tmp_path / "h", capsys, "repo", "list")[1] == ""  # nothing half-made left behind


def test_upload_of_a_fifo_is_refused(home, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run(home, "fs", "upload", "lakefs://rep1/main/x", "-s", str(fifo))  # hung forever
    assert r.returncode == 2 and b"not a regular file" in r.stderr and r.stderr.count(b"\n") == 1


@pytest.mark.parametrize("dest,meant", [("lakefs://rep1/main//abs", "abs"), ("lakefs://rep1/main/a//b", "a/b")])
def test_upload_to_a_key_with_an_empty_segment_is_refused(home, tmp_path, dest, meant):
    """Found by a security review: ``fs upload`` took the keys ``/abs`` and ``a//b``, which the
    mount hides and no export can write -- every later export of the branch failed on them."""
    f = tmp_path / "f"
    f.write_bytes(b"x")
    r = run(home, "fs", "upload", dest, "-s", str(f))
    assert r.returncode == 2 and b"empty path segment" in r.stderr and f"did you mean '{meant}'".encode() in r.stderr
    assert r.stderr.count(b"\n") == 1
    assert run(home, "fs", "upload", "lakefs://rep1/main/a/b", "-s", str(f)).returncode == 0  # (the key meant)


@pytest.mark.parametrize("dest,why", [("lakefs://rep1/main/.lakefuse/commit", "control files"),
                                      ("lakefs://rep1/main/q/.lakefuse", "control files"),
                                      ("lakefs://rep1/main/" + "n" * 256, "longer than 255 bytes")],
                         ids=["reserved-dir", "reserved-leaf", "long"])
def test_upload_to_a_key_the_mount_cannot_show_is_refused(home, tmp_path, dest, why):
    """Found by a security tour: ``fs upload`` refused ``a//b`` because the mount cannot show it, yet
    took ``.lakefuse/...`` and names over 255 bytes, which the mount hides just the same (``q`` then
    showed as an empty directory that ``rmdir`` called not empty). A recursive upload skips a local
    ``.lakefuse``, saying why; the rest of the tree goes up."""
    f = tmp_path / "f"
    f.write_bytes(b"x")
    r = run(home, "fs", "upload", dest, "-s", str(f))
    assert r.returncode == 2 and why.encode() in r.stderr and r.stderr.count(b"\n") == 1, r.stderr
    tree = tmp_path / "tree"
    (tree / ".lakefuse").mkdir(parents=True)
    (tree / ".lakefuse" / "commit").write_bytes(b"x")
    (tree / "sub").mkdir()
    (tree / "sub" / ".lakefuse").write_bytes(b"x")
    (tree / "sub" / "kept.txt").write_bytes(b"kept")
    r = run(home, "fs", "upload", "-r", "lakefs://rep1/main/up/", "-s", str(tree), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["objects"] == 1 and sorted(s["path"] for s in res["skipped"]) == [
        str(tree / ".lakefuse"), str(tree / "sub" / ".lakefuse")], res


def test_library_upload_of_a_fifo_is_refused(tmp_path):
    from graveler import Graveler
    from graveler.config import GravelerConfig
    from graveler.errors import InvalidArgument

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    g = Graveler(GravelerConfig(home=tmp_path / "h"))
    repo = g.create_repository("rep1", f"file://{tmp_path}/ns")
    with pytest.raises(InvalidArgument, match="not a regular file"):
        repo.upload("main", "x", str(fifo))
    g.close()


def test_escape_sequences_are_escaped_on_a_terminal_and_exact_in_json(home, tmp_path):
    import json
    import pty

    src = tmp_path / "e"
    src.write_bytes(b"e")
    evil_name = "evil\x1b[2Jname\u202etxt"
    evil_msg = "msg \x1b]0;pwned\x07 \x1b[31mred\rover"
    assert main(["fs", "upload", f"lakefs://rep1/main/{evil_name}", "-s", str(src), "--home", str(home)]) == 0
    assert main(["commit", "lakefs://rep1/main", "-m", evil_msg, "--home", str(home)]) == 0

    def on_tty(*args) -> bytes:
        master, slave = pty.openpty()
        try:
            subprocess.run([sys.executable, "-m", "lakefuse", *args, "--home", str(home)], stdout=slave,
                           stderr=subprocess.DEVNULL, timeout=60, cwd=ROOT)
        finally:
            os.close(slave)
        chunks = []
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:
                break
            if not b:
                break
            chunks.append(b)
        os.close(master)
        return b"".join(chunks)

    shown = on_tty("log", "lakefs://rep1/main") + on_tty("fs", "ls", "lakefs://rep1/main/")
    assert b"\x1b" not in shown and b"\x07" not in shown and "\u202e".encode() not in shown  # printed raw
    assert b"\\x1b[2J" in shown and b"\\x1b]0;pwned\\x07" in shown
    r = run(home, "log", "lakefs://rep1/main", "--json")
    assert json.loads(r.stdout.decode().splitlines()[0])["message"] == evil_msg  # JSON stays exact
    r = run(home, "fs", "ls", "lakefs://rep1/main/", "--json")
    assert evil_name in [json.loads(line)["path"] for line in r.stdout.decode().splitlines()]
    r = run(home, "log", "lakefs://rep1/main")  # a pipe: the bytes as they are
    assert evil_msg.split("\r")[0].encode() in r.stdout


def test_names_that_could_fake_a_line_or_a_field_are_quoted_as_git_quotes_paths(tmp_path, capsys):
    """A key with a newline (``x\\n+ evil`` forged a diff line), a tab, a quote, a backslash, a C1
    control (U+0085 NEL is a line break to ``str.splitlines()``) or a Unicode line separator is
    shown in double quotes with C escapes by diff and fs ls, on a terminal or in a pipe; a plain
    name (spaces and non-ASCII letters included) is shown bare; --json keeps every name exact."""
    import json

    h = tmp_path / "home"
    src = tmp_path / "f"
    src.write_bytes(b"x")
    assert main(["repo", "create", "lakefs://qqq", "--home", str(h)]) == 0
    names = {"new\n+ forged": '"new\\n+ forged"', "tab\tx": '"tab\\tx"', 'q"uote': '"q\\"uote"',
             "back\\slash": '"back\\\\slash"', "plain name é": "plain name é",
             # line breaks to str.splitlines() (and to some terminals) beyond the C0 controls
             "nel\x85+ forged": '"nel\\u0085+ forged"', "sep\u2028x": '"sep\\u2028x"', "c1\x9b[31m": '"c1\\u009b[31m"'}
    for name in names:
        assert main(["fs", "upload", f"lakefs://qqq/main/d/{name}", "-s", str(src), "--home", str(h)]) == 0
    capsys.readouterr()
    assert main(["diff", "lakefs://qqq/main", "--home", str(h)]) == 0
    quoted_path = {n: f'"d/{v[1:]}' if v.startswith('"') else f"d/{v}" for n, v in names.items()}  # the whole path
    assert sorted(capsys.readouterr().out.splitlines()) == sorted(f"+ {p}" for p in quoted_path.values())
    assert main(["fs", "ls", "lakefs://qqq/main/d/", "--home", str(h)]) == 0
    shown = [line.split(" B  ", 1)[1] for line in capsys.readouterr().out.splitlines()]  # (after the size)
    assert sorted(shown) == sorted(names.values())
    assert main(["fs", "ls", "lakefs://qqq/main/d/", "--json", "--home", str(h)]) == 0
    listed = [json.loads(x)["path"] for x in capsys.readouterr().out.splitlines()]
    assert sorted(listed) == sorted(f"d/{n}" for n in names)


def test_repo_create_refuses_a_namespace_in_use_and_makes_nothing_for_bad_arguments(tmp_path, capsys):
    """A second repository over a live one's storage namespace -- the same, inside it or
    around it -- is refused (exit 4), as lakeFS refuses a namespace in use: the two would
    share _lakefs/ and data/, and each one's GC would sweep the other's objects. (A bare
    repository for a refs restore may, as in lakeFS.) A bad default branch is refused before
    anything is made (it left an empty namespace directory behind)."""
    h = tmp_path / "home"
    assert main(["repo", "create", "lakefs://first", "--home", str(h)]) == 0
    ns = h / "storage" / "first"
    for storage in (ns, ns / "sub", h / "storage"):
        capsys.readouterr()
        assert main(["repo", "create", "lakefs://second", "--storage", storage.as_uri(), "--home", str(h)]) == 4
        err = capsys.readouterr().err
        assert "namespace of repository 'first'" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "alias").symlink_to(ns)  # another spelling of the same place: a link into it
    capsys.readouterr()
    assert main(["repo", "create", "lakefs://linked", "--storage", (tmp_path / "alias" / "in").as_uri(),
                 "--home", str(h)]) == 4
    assert "namespace of repository 'first'" in capsys.readouterr().err and not (ns / "in").exists()
    assert main(["repo", "create", "lakefs://firstly", "--home", str(h)]) == 0  # (a name that only starts alike)
    assert main(["repo", "create", "lakefs://third", "--default-branch=-x", "--home", str(h)]) == 2
    assert sorted(p.name for p in (h / "storage").iterdir()) == ["first", "firstly"]


@pytest.mark.expect_log("a foreground mount logs why it could not start")
def test_the_tests_in_process_kv_is_refused_by_every_command(tmp_path, capsys, monkeypatch):
    """memory:// keeps nothing past the process: `kv copy --to memory://x` said "copied" and
    `repo create` "created", and the next command found nothing. The CLI refuses it (exit 2)
    wherever it comes from: --kv, $LAKEFUSE_KV, kv copy's --from/--to, mount."""
    h = tmp_path / "home"
    assert main(["repo", "create", "lakefs://abc", "--home", str(h)]) == 0
    for args in (["kv", "copy", "--from", "lmdb", "--to", "memory://x", "abc"],
                 ["kv", "copy", "--from", "memory://x", "--to", "lmdb", "abc"],
                 ["repo", "create", "lakefs://memr", "--kv", "memory://x"],
                 ["repo", "list", "--kv", "memory://x"],
                 ["mount", "lakefs://abc", str(tmp_path), "--kv", "memory://x", "-f"]):
        capsys.readouterr()
        assert main([*args, "--home", str(h)]) == 2, args  # (mount too: its exit codes are every command's)
        assert "in-process KV for tests" in capsys.readouterr().err
    monkeypatch.setenv("LAKEFUSE_KV", "memory://y")
    assert main(["repo", "list", "--home", str(h)]) == 2
    assert sorted(p.name for p in (h / "storage").iterdir()) == ["abc"]


def _json_out(capsys, rc: int) -> str:
    assert rc == 0
    return capsys.readouterr().out


def test_small_cli_edges_found_by_a_new_user(tmp_path, capsys):
    """--home naming a file (it said "no repositories", or blamed a storage path), merge -m ""
    (it used the default message silently, where commit -m "" is refused), and a tag or branch
    that shares a name with a branch or tag (the branch wins every resolution: said, as git
    warns of an ambiguous name)."""
    f = tmp_path / "afile"
    f.write_text("x")
    (tmp_path / "mp").mkdir()
    # (a daemonized mount said "holds no repositories", exit 3: found by a docs tour)
    for args in (["repo", "list"], ["repo", "create", "lakefs://zzz"], ["mount", "lakefs://zzz", str(tmp_path / "mp")]):
        capsys.readouterr()
        assert main([*args, "--home", str(f)]) == 2
        assert "is not a directory" in capsys.readouterr().err
    h = tmp_path / "home"
    assert main(["repo", "create", "lakefs://edg", "--home", str(h)]) == 0
    assert main(["branch", "create", "lakefs://edg/dev", "-s", "main", "--home", str(h)]) == 0
    capsys.readouterr()
    assert main(["merge", "lakefs://edg/dev", "lakefs://edg/main", "-m", " ", "--home", str(h)]) == 2
    assert "the merge message is empty" in capsys.readouterr().err
    assert main(["tag", "create", "lakefs://edg/dev", "main", "--home", str(h)]) == 0
    assert "a branch 'dev' exists too" in capsys.readouterr().err
    assert main(["tag", "create", "lakefs://edg/v1", "main", "--home", str(h)]) == 0
    assert capsys.readouterr().err == ""
    assert main(["branch", "create", "lakefs://edg/v1", "-s", "main", "--home", str(h)]) == 0
    assert "a tag 'v1' exists too: lakefs://edg/v1 now names this branch" in capsys.readouterr().err
    # a name that is also a commit-ID prefix takes the name from the commit (found by a refs tour: silent)
    head = json.loads(_json_out(capsys, main(["show", "lakefs://edg/main", "--json", "--home", str(h)])))["id"]
    assert main(["branch", "create", f"lakefs://edg/{head[:6]}", "-s", "main", "--home", str(h)]) == 0
    assert f"'{head[:6]}' is also a commit-ID prefix" in capsys.readouterr().err
    assert main(["tag", "create", f"lakefs://edg/{head[:5]}", "main", "--home", str(h)]) == 0
    assert "commit-ID prefix: lakefs://edg/" + head[:5] + " now names the tag" in capsys.readouterr().err
    assert main(["tag", "create", "lakefs://edg/beef", "main", "--home", str(h)]) == 0  # healthy: hex, no commit
    assert capsys.readouterr().err == "" or head.startswith("beef")
    assert main(["tag", "create", "lakefs://edg/beef", "main", "--home", str(h)]) == 4  # exists: refused
    capsys.readouterr()
    assert main(["tag", "create", "lakefs://edg/beef", "main", "--force", "--home", str(h), "--json"]) == 0  # moved
    assert json.loads(capsys.readouterr().out)["commit_id"] == head


@pytest.mark.parametrize("args, fragment", [
    (("repo", "create", "lakefs://rep3", "--storage", "file:///tmp/a%00b"), "NUL"),
    (("repo", "create", "lakefs://rep3", "--storage", "file://[x/y"), "IPv6"),
    (("repo", "create", "lakefs://rep3", "--storage", "file:///tmp/%ff"), "not UTF-8"),
    (("repo", "create", "lakefs://rep3\n"), "repository name"),
    (("branch", "create", "lakefs://rep1/feat\n", "--source", "main"), "branch name"),
    (("mount", "lakefs://rep1", "/nonexistent-mnt", "--cache-size", "inf"), "not a size"),
    (("mount", "lakefs://rep1", "/nonexistent-mnt", "--cache-size", "1e999"), "not a size"),
    (("mount", "lakefs://rep1", "/nonexistent-mnt", "--cache-size", "1e30T"), "too large"),
    # found by a docs tour: libfuse's "unknown option(s)" only, naming no way to set it
    (("mount", "lakefs://rep1", "/nonexistent-mnt", "-o", "branch_timeout=2"), "use --branch-timeout"),
    # found by a data engineer: stored, then every `gc mark` an OverflowError; these a traceback
    (("gc", "rules", "lakefs://rep1", "--default-days", "99999999999"), "retention days"),
    (("gc", "rules", "lakefs://rep1", "--branch", "main=99999999999", "--default-days", "7"), "retention days"),
    (("gc", "mark", "lakefs://rep1", "--min-age", "1e12", "--dry-run"), "--min-age"),
    (("gc", "mark", "lakefs://rep1", "--min-age", "inf", "--dry-run"), "--min-age"),
    (("gc", "mark", "lakefs://rep1", "--min-age", "nan", "--dry-run"), "--min-age"),
    (("gc", "run", "lakefs://rep1", "--min-age", "2e7", "--dry-run"), "--min-age"),
    # found by a GC tour: Spark started a JVM, then a traceback (exit 1)
    (("gc", "mark", "lakefs://rep1", "--spark", "bogus", "--dry-run"), "not a Spark master"),
    (("export", "lakefs://rep1/main", "/nonexistent-out", "--spark", "local[x]"), "not a Spark master"),
    # found by a GC tour: '' and a URI with one slash were looked for as local paths (exit 3, not found) or
    # taken as one (an export into ./s3:/out)
    (("import", "", "lakefs://rep1/main/raw/"), "no directory or URI"),
    (("import", "s3:/bucket/x", "lakefs://rep1/main/raw/"), "no directory or URI"),
    (("export", "lakefs://rep1/main", "s3:/bucket/out"), "no directory or URI"),
], ids=lambda a: " ".join(a[:2]) if isinstance(a, tuple) else None)
def test_malformed_values_are_usage_errors_in_one_line(home, args, fragment):
    """Found by fuzzing: these were tracebacks (exit 1: ValueError, OverflowError), or were taken
    (a name ending in a newline; 1e30T; %ff stored as another directory). Exit 2, one line (after
    argparse's usage, for an option's value)."""
    r = run(home, *args)
    err = r.stderr.decode().strip().splitlines()
    assert r.returncode == 2 and fragment in err[-1] and "Traceback" not in r.stderr.decode(), (r.returncode, err)
    assert len(err) == 1 or err[0].startswith("usage:")
    assert not (home / "repos" / "rep3").exists()
    assert "retention" not in (run(home, "gc", "rules", "lakefs://rep1").stdout or b"").decode()  # none stored


def test_a_repository_that_cannot_be_opened_is_unreadable_not_damaged(tmp_path):
    """Found by an administrator's tour: `repo list` of a home another user could not open marked
    every repository DAMAGED (exit 6), which the README keeps for corrupted data (exit 5), and
    said "cannot create" of a directory that was there. An error opening one is UNREADABLE now;
    damage is still DAMAGED (the test above)."""
    home = tmp_path / "home"
    for name in ("rep1", "rep2"):
        assert main(["repo", "create", f"lakefs://{name}", "--home", str(home)]) == 0
    from graveler.kv import close_env

    refs = home / "repos" / "rep1" / "refs.lmdb"
    close_env(refs)
    (refs / "lock.mdb").unlink()
    (refs / "lock.mdb").mkdir()  # (as root no permission is refused: an open that fails all the same)
    r = run(home, "repo", "list")
    out = r.stdout.decode().splitlines()
    assert r.returncode == 6 and "UNREADABLE" in out[1] and "DAMAGED" not in r.stdout.decode(), (r, out)
    assert "main" in out[2]


def test_a_refs_database_replaced_by_a_file_is_damaged_listed_and_deletable(tmp_path):
    """Found by an administrator's tour: a file where ``refs.lmdb`` (a directory) should be hid the
    repository from `repo list` (exit 0), `log` said "not found" (3) and `repo create` of the same
    name "cannot create ... File exists" (6); `repo delete` of a damaged repository failed (5), so
    nothing could remove it. Now it is DAMAGED (5) everywhere, its name is taken, and it can be deleted."""
    home = tmp_path / "home"
    for name in ("rep1", "rep2"):
        assert main(["repo", "create", f"lakefs://{name}", "--home", str(home)]) == 0
    from graveler.kv import close_env

    refs = home / "repos" / "rep1" / "refs.lmdb"
    close_env(refs)
    import shutil

    shutil.rmtree(refs)
    refs.write_bytes(b"not an environment\n")
    r = run(home, "repo", "list")
    out = r.stdout.decode().splitlines()
    assert r.returncode == 5 and "DAMAGED" in out[1] and out[1].startswith("rep1") and "main" in out[2], (r, out)
    r = run(home, "log", "lakefs://rep1/main")
    assert r.returncode == 5 and b"is not a directory" in r.stderr, r
    r = run(home, "repo", "create", "lakefs://rep1")
    assert r.returncode == 4 and b"already exists" in r.stderr, r
    r = run(home, "repo", "delete", "lakefs://rep1", "--yes")
    assert r.returncode == 0 and b"damaged" in r.stdout, r
    assert not (home / "repos" / "rep1").exists() and (home / "repos" / "rep2" / "refs.lmdb").is_dir()
    assert [line.split()[0] for line in run(home, "repo", "list").stdout.decode().splitlines()] == ["REPOSITORY", "rep2"]


def test_a_healthy_repository_is_deleted_as_before(tmp_path):
    """The other side of the check above: an ordinary repository's delete names its namespace."""
    home = tmp_path / "home"
    assert main(["repo", "create", "lakefs://rep1", "--home", str(home)]) == 0
    r = run(home, "repo", "delete", "lakefs://rep1", "--yes")
    assert r.returncode == 0 and b"storage namespace file://" in r.stdout and b"damaged" not in r.stdout, r
    assert run(home, "log", "lakefs://rep1/main").returncode == 3


def test_a_repository_whose_create_was_killed_can_be_created_again_or_deleted(tmp_path):
    """Found by a crash tester: ``repo create`` killed after its refs database existed and before
    its record was written left the name unusable -- ``repo create`` said it already existed,
    ``repo delete`` and every other command that it had no record, and ``repo list`` hid it.
    Such a create that never finished is made again by ``repo create``, and removed by ``repo
    delete``; nothing else is touched."""
    from graveler import Graveler
    from graveler.config import GravelerConfig

    home = tmp_path / "h"
    assert run(home, "repo", "create", "lakefs://warm").returncode == 0
    for name in ("stuck", "gone"):  # (the killed create's state: the refs database, no record)
        g = Graveler(GravelerConfig(home=home))
        g.kv.open(name)
        assert g.unfinished(name) and not g.unfinished("warm")
        g.kv.close(name)
        g.close()
    r = run(home, "repo", "create", "lakefs://stuck")
    assert r.returncode == 0, r.stderr
    assert run(home, "log", "lakefs://stuck/main").returncode == 0
    r = run(home, "repo", "delete", "-y", "lakefs://gone")
    assert r.returncode == 0 and b"create had never finished" in r.stdout, r.stderr
    assert run(home, "repo", "create", "lakefs://warm").returncode == 4  # (a finished one: exists)
    listed = run(home, "repo", "list", "--json").stdout.decode()
    assert '"stuck"' in listed and '"warm"' in listed and '"gone"' not in listed


def test_what_a_reader_of_the_docs_found(tmp_path, capsys):
    """Found following the README and --help literally: a failed read-only command (a mount of
    a mistyped --refs-dump, a refs restore from a namespace holding no dump) left an empty
    directory at that namespace (a later recursive upload from it "uploaded 0 objects", exit 0);
    --log made missing directories anywhere; --branch-timeout -1 mounted; `gc rules --json`
    printed nothing when there are no rules; `sst id` had no --json; a store root below a file
    blamed the root; a name with a newline broke fs upload's and fs rm's line."""
    h = tmp_path / "home"

    def cli(*args):
        capsys.readouterr()
        code = main([*args, "--home", str(h)])
        o = capsys.readouterr()
        return code, o.out, o.err

    assert cli("repo", "create", "lakefs://docs")[0] == 0
    typo = tmp_path / "typo-ns"
    code, _, err = cli("mount", "-f", "--refs-dump", typo.as_uri(), str(tmp_path))
    assert code == 3 and "no refs dump" in err and not typo.exists(), err
    code, _, err = cli("refs", "restore", "lakefs://zzz", "--storage", typo.as_uri())
    assert code == 3 and "no refs dump" in err and not typo.exists(), err
    code, out, _ = cli("repo", "list", "--json")
    assert "zzz" not in out
    code, _, err = cli("mount", "--log", str(tmp_path / "nodir" / "deep" / "x.log"), "lakefs://docs", str(tmp_path))
    assert code == 2 and "no directory" in err and not (tmp_path / "nodir").exists(), err
    with pytest.raises(SystemExit) as e:
        cli("mount", "--branch-timeout", "-1", "lakefs://docs", str(tmp_path))
    assert e.value.code == 2 and ">= 0" in capsys.readouterr().err
    code, out, err = cli("gc", "rules", "--json", "lakefs://docs")
    assert code == 0 and out == "null\n" and "no retention rules" in err
    f = tmp_path / "afile"
    f.write_text("")
    capsys.readouterr()
    assert main(["repo", "create", "lakefs://abc", "--home", str(f / "sub")]) == 2
    err = capsys.readouterr().err
    assert f"below '{f}', which exists and is not a directory" in err, err
    src = tmp_path / "src"
    src.write_text("x")
    code, out, _ = cli("fs", "upload", "lakefs://docs/main/nl\nx", "-s", str(src))
    assert code == 0 and out.count("\n") == 1 and '"lakefs://docs/main/nl\\nx"' in out, out
    code, out, _ = cli("fs", "rm", "lakefs://docs/main/nl\nx")
    assert code == 0 and out == 'Deleted "lakefs://docs/main/nl\\nx"\n', out


def test_sst_id_json(capsys):
    from tests.shared_paths import FIXTURES

    table = FIXTURES / "lakefs" / "range.sst"
    assert main(["sst", "id", str(table)]) == 0
    plain = capsys.readouterr().out.strip()
    assert main(["sst", "id", "--json", str(table)]) == 0
    import json

    got = json.loads(capsys.readouterr().out)
    assert got == {"id": plain, "type": "ranges"}  # (lakeFS's own word in the table)


def test_fs_stat_and_show_keep_each_field_on_one_line(tmp_path, capsys):
    """Found by an xattr user's tour: a newline in a content type or a metadata value (an xattr
    set through the mount, another client's metadata) was printed raw by ``fs stat`` -- on a
    terminal too -- and faked rows (``Metadata:`` / ``owner = mallory``); commit metadata in
    ``show`` alike. Each field is one line now (control characters as ``\\xNN``); --json is exact."""
    import json

    from graveler import Graveler, GravelerConfig
    from graveler.model import Entry

    h = tmp_path / "home"
    src = tmp_path / "f"
    src.write_bytes(b"x")
    assert main(["repo", "create", "lakefs://sss", "--home", str(h)]) == 0
    evil_ct = "text/csv\nMetadata:\n  owner = mallory"
    assert main(["fs", "upload", "lakefs://sss/main/f", "-s", str(src), "--content-type", evil_ct, "--home", str(h)]) == 0
    g = Graveler(GravelerConfig(home=h))
    repo = g.repository("sss")
    e = repo.get("main", "f")
    repo.stage("main", "f", Entry(e.address, e.size, e.etag, e.last_modified_ns, {"note": "ok\n  approved = yes"},
                                  e.address_type, e.content_type))
    repo.commit("main", "with metadata", metadata={"k": "v\nMetadata:   forged = 1"})
    g.close()
    capsys.readouterr()
    assert main(["fs", "stat", "lakefs://sss/main/f", "--home", str(h)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "Content-Type:     text/csv\\x0aMetadata:\\x0a  owner = mallory" in lines
    assert [x for x in lines if x.startswith("  ")] == ["  note = ok\\x0a  approved = yes"]
    assert main(["show", "lakefs://sss/main", "--home", str(h)]) == 0
    assert [x for x in capsys.readouterr().out.splitlines() if x.startswith("Metadata:")] == [
        "Metadata:   k = v\\x0aMetadata:   forged = 1"]
    assert main(["fs", "stat", "lakefs://sss/main/f", "--json", "--home", str(h)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["content_type"] == evil_ct and got["metadata"]["note"] == "ok\n  approved = yes"


def test_an_unknown_option_shows_its_own_commands_usage(tmp_path, capsys):
    """Found by a docs tour: an unknown option of any command printed the top level's usage
    (``usage: lakefuse [-h] ... COMMAND ...``), not the command's own."""
    for args, prog in ((["repo", "list", "--bogus"], "lakefuse repo list"),
                       (["fs", "cat", "lakefs://x/main/a", "--bogus"], "lakefuse fs cat"),
                       (["gc", "rules", "lakefs://x", "--bogus"], "lakefuse gc rules")):
        with pytest.raises(SystemExit) as e:
            main([*args, "--home", str(tmp_path)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"usage: {prog} " in err and f"{prog}: error: unrecognized arguments: --bogus" in err
