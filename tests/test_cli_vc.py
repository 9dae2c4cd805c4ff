"""The version-control CLI end to end: real LMDB, a local storage namespace.

Most tests call ``lakefuse.cli.main`` in-process (fast); a few run the real
``python -m lakefuse`` in a subprocess to check what a shell sees: exit codes,
one-line errors, no tracebacks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lakefuse.cli import build_parser, main

REPO = "lakefs://demo"


class CLI:
    """Runs ``lakefuse ARGS --home HOME`` in-process and captures what it prints."""

    def __init__(self, home: Path, capsys):
        self.home = home
        self.capsys = capsys

    def __call__(self, *args: str, code: int = 0) -> str:
        self.capsys.readouterr()
        rc = main([*args, "--home", str(self.home)])
        res = self.capsys.readouterr()
        assert rc == code, f"lakefuse {' '.join(args)} -> {rc}\nstdout: {res.out}\nstderr: {res.err}"
        self.err = res.err
        return res.out

    def json(self, *args: str):
        return json.loads(self(*args, "--json"))

    def jsonl(self, *args: str) -> list:
        return [json.loads(line) for line in self(*args, "--json").splitlines()]

    def fails(self, code: int, *args: str) -> str:
        """Run a command that must fail with ``code``; return its one-line message."""
        self(*args, code=code)
        lines = self.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lakefuse: "), self.err
        return lines[0]


@pytest.fixture
def cli(tmp_path, capsys) -> CLI:
    return CLI(tmp_path / "home", capsys)


def make_dataset(root: Path) -> dict[str, bytes]:
    files = {
        "sales/2024/01.csv": b"day,amount\n1,10\n2,20\n",
        "sales/2024/02.csv": b"day,amount\n1,30\n",
        "sales/summary.json": b'{"total": 60}\n',
        "readme.txt": b"a small dataset\n",
        "deep/a/b/c/d.json": b"[]\n",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


@pytest.fixture
def story(cli, tmp_path):
    """A repository with the dataset committed on main under ``ds/``."""
    src = tmp_path / "src"
    files = make_dataset(src)
    cli("repo", "create", REPO)
    cli("fs", "upload", f"{REPO}/main/ds", "--source", str(src), "--recursive")
    cli("commit", f"{REPO}/main", "-m", "add dataset")
    return files


def test_user_story(cli, tmp_path):
    home = cli.home
    src = tmp_path / "src"
    files = make_dataset(src)

    out = cli("repo", "create", REPO)
    assert "Repository 'demo' created" in out
    ns = (home / "storage" / "demo").as_uri()
    assert ns in out
    assert [r["name"] for r in cli.jsonl("repo", "list")] == ["demo"]

    res = cli.json("fs", "upload", f"{REPO}/main/ds/", "--source", str(src), "--recursive")
    assert res["objects"] == len(files) and res["bytes"] == sum(map(len, files.values()))

    # ls: folded into common prefixes, names relative to the prefix; recursive: everything
    out = cli("fs", "ls", f"{REPO}/main/ds/")
    names = [line.split()[-1] for line in out.splitlines()]
    assert names == ["deep/", "readme.txt", "sales/"]
    assert out.splitlines()[1].startswith("object ") and "16 B" in out.splitlines()[1]
    # a directory marker (the mount's mkdir makes them) under its own prefix: shown by its key, never as ""
    from graveler import Graveler, GravelerConfig

    def marker(put: bool) -> None:
        g = Graveler(GravelerConfig(home=cli.home))
        try:
            r = g.repository("demo")
            r.upload("main", "ds/deep/", b"") if put else r.delete("main", "ds/deep/")
        finally:
            g.close()

    marker(True)
    assert cli("fs", "ls", f"{REPO}/main/ds/deep/").splitlines()[0].split()[-3:] == ["0", "B", "ds/deep/"]
    marker(False)
    listed = cli.jsonl("fs", "ls", f"{REPO}/main/ds/", "--recursive")
    assert [e["path"] for e in listed] == sorted("ds/" + p for p in files)
    assert all(e["type"] == "object" and e["physical_address"].startswith(ns + "/data/") for e in listed)
    assert cli("fs", "cat", f"{REPO}/main/ds/sales/2024/01.csv").encode() == files["sales/2024/01.csv"]

    assert cli("diff", f"{REPO}/main").splitlines() == sorted(f"+ ds/{p}" for p in files)
    c1 = cli.json("commit", f"{REPO}/main", "-m", "add dataset", "--meta", "source=test", "--meta", "k=v=w")
    assert c1["metadata"] == {"source": "test", "k": "v=w"} and c1["changes"]["added"] == len(files)
    assert cli("diff", f"{REPO}/main") == ""
    # uncommitted changes are a branch's: one commit or tag alone is bad input, said so (exit 2)
    err = cli.fails(2, "diff", f"{REPO}/main~0")
    assert "is a commit, not a branch" in err and "give two refs to compare" in err

    # a branch: change one file, delete one, add one
    cli("branch", "create", f"{REPO}/feature", "--source", "main")
    changed = tmp_path / "02.csv"
    changed.write_bytes(b"day,amount\n1,31\n")
    cli("fs", "upload", f"{REPO}/feature/ds/sales/2024/02.csv", "--source", str(changed))
    cli("fs", "rm", f"{REPO}/feature/ds/readme.txt")
    cli("fs", "upload", f"{REPO}/feature/ds/sales/", "--source", str(changed))  # -> ds/sales/02.csv
    assert cli("diff", f"{REPO}/feature").splitlines() == [
        "- ds/readme.txt", "+ ds/sales/02.csv", "~ ds/sales/2024/02.csv"]
    cli("commit", f"{REPO}/feature", "-m", "fix february")
    assert cli("diff", f"{REPO}/main", f"{REPO}/feature").splitlines() == [
        "- ds/readme.txt", "+ ds/sales/02.csv", "~ ds/sales/2024/02.csv"]
    diff = cli.jsonl("diff", f"{REPO}/main", f"{REPO}/feature")
    assert [(d["type"], d["left"] is None, d["right"] is None) for d in diff] == [
        ("removed", False, True), ("added", True, False), ("changed", False, False)]

    merge = cli.json("merge", f"{REPO}/feature", f"{REPO}/main")
    assert len(merge["parents"]) == 2 and merge["branch"] == "main"
    assert cli("fs", "cat", f"{REPO}/main/ds/sales/2024/02.csv") == "day,amount\n1,31\n"

    log = cli.jsonl("log", f"{REPO}/main")  # every ancestor, as git log and lakectl log
    assert [c["message"] for c in log] == ["Merge 'feature' into 'main'", "fix february", "add dataset",
                                           "Repository created"]
    assert log[0]["id"] == merge["id"]
    first = cli.jsonl("log", f"{REPO}/main", "--first-parent")
    assert [c["message"] for c in first] == ["Merge 'feature' into 'main'", "add dataset", "Repository created"]
    text = cli("log", f"{REPO}/main", "--amount", "2").splitlines()
    assert len(text) == 2 and text[0].startswith(merge["id"][:12]) and text[0].endswith("Merge 'feature' into 'main'")
    assert " root " in text[1]  # the committer: this process's user (lakefuse.users)
    assert cli.json("show", f"{REPO}/main~1")["id"] == c1["id"]
    assert cli("show", f"{REPO}/main").startswith(f"commit {merge['id']}\nMerge:")

    cli("tag", "create", f"{REPO}/v1", "main")
    assert cli.jsonl("tag", "list", REPO) == [{"name": "v1", "commit_id": merge["id"]}]
    # ref expressions in object URIs
    assert cli("fs", "cat", f"{REPO}/main~1/ds/sales/2024/02.csv") == "day,amount\n1,30\n"
    assert cli("fs", "cat", f"{REPO}/v1^2/ds/sales/02.csv") == "day,amount\n1,31\n"
    assert cli("fs", "cat", f"{REPO}/{merge['id'][:10]}/ds/sales/02.csv") == "day,amount\n1,31\n"

    # revert the merge (against its first parent): back to the dataset as committed
    rv = cli.json("revert", f"{REPO}/main", merge["id"], "--parent-number", "1")
    assert rv["changes"] == {"added": 1, "removed": 1, "changed": 1}
    assert cli("diff", f"{REPO}/main~2", f"{REPO}/main") == ""

    # reset: one path, a prefix, everything
    cli("fs", "upload", f"{REPO}/main/tmp/x", "--source", str(changed))
    cli("fs", "upload", f"{REPO}/main/tmp/y", "--source", str(changed))
    cli("fs", "upload", f"{REPO}/main/z", "--source", str(changed))
    assert "discarded" in cli("branch", "reset", f"{REPO}/main", "--path", "z")
    assert cli("diff", f"{REPO}/main").splitlines() == ["+ tmp/x", "+ tmp/y"]
    # a path with no change (a directory's name): said, nothing discarded; a name that is nowhere
    # is an error (3), as `git restore nosuchfile` and the mount's reset control file
    assert "nothing discarded" in cli("branch", "reset", f"{REPO}/main", "--path", "tmp")
    assert "matches nothing" in cli.fails(3, "branch", "reset", f"{REPO}/main", "--path", "nowhere.txt")
    assert "matches nothing" in cli.fails(3, "branch", "reset", f"{REPO}/main", "--prefix", "none/")
    assert "nothing discarded" in cli("branch", "reset", f"{REPO}/main", "--path", "ds/readme.txt")
    assert cli("diff", f"{REPO}/main").splitlines() == ["+ tmp/x", "+ tmp/y"]
    cli("branch", "reset", f"{REPO}/main", "--prefix", "tmp/")
    assert cli("diff", f"{REPO}/main") == ""
    cli("fs", "rm", f"{REPO}/main/ds/sales", "--recursive")
    assert len(cli("diff", f"{REPO}/main").splitlines()) == 3
    cli("branch", "reset", f"{REPO}/main")
    assert cli("diff", f"{REPO}/main") == ""

    # refs dump; lose the LMDB files; restore: the same history and contents
    before_log = cli("log", f"{REPO}/main", "--json")
    before_ls = cli("fs", "ls", f"{REPO}/v1/", "--recursive", "--json")
    before_branches = cli("branch", "list", REPO, "--json")
    manifest = cli.json("refs", "dump", REPO)
    assert set(manifest) == {"branches_meta_range_id", "commits_meta_range_id", "tags_meta_range_id"}
    shutil.rmtree(home / "repos")
    cli.fails(3, "log", f"{REPO}/main")
    restored = cli.json("refs", "restore", REPO)
    assert restored["commits"] == 5 and restored["branches"] == ["feature", "main"] and restored["tags"] == ["v1"]
    assert cli("log", f"{REPO}/main", "--json") == before_log
    assert cli("fs", "ls", f"{REPO}/v1/", "--recursive", "--json") == before_ls
    assert cli("branch", "list", REPO, "--json") == before_branches
    assert cli("fs", "cat", f"{REPO}/main/ds/readme.txt") == "a small dataset\n"

    # the repository keeps working after the restore
    gone = cli("branch", "delete", f"{REPO}/feature")
    assert "(was " in gone and "--source" in gone
    cli("tag", "delete", f"{REPO}/v1")
    assert [b["name"] for b in cli.jsonl("branch", "list", REPO)] == ["main"]
    assert cli("tag", "list", REPO) == ""
    cli("repo", "delete", REPO, "--yes")
    assert cli("repo", "list", "--json") == ""
    assert (home / "storage" / "demo" / "_lakefs" / "refs_manifest.json").exists()  # the namespace is kept


def test_json_outputs_parse(cli, story, tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("hello")
    obj = {
        "repo create": cli.json("repo", "create", "lakefs://other", "--storage", (tmp_path / "ns").as_uri(),
                                "--default-branch", "trunk"),
        "branch create": cli.json("branch", "create", f"{REPO}/b1", "--source", f"{REPO}/main"),
        "upload": cli.json("fs", "upload", f"{REPO}/b1/f.txt", "--source", str(f), "--content-type", "text/x-test"),
        "stat": cli.json("fs", "stat", f"{REPO}/b1/f.txt"),
        "commit": cli.json("commit", f"{REPO}/b1", "-m", "f"),
        "show": cli.json("show", f"{REPO}/b1"),
        "tag create": cli.json("tag", "create", f"{REPO}/t1", f"{REPO}/b1"),
        "rm": cli.json("fs", "rm", f"{REPO}/b1/f.txt"),
        "reset": cli.json("branch", "reset", f"{REPO}/b1"),
        "refs dump": cli.json("refs", "dump", REPO),
        "branch delete": cli.json("branch", "delete", f"{REPO}/b1"),
        "tag delete": cli.json("tag", "delete", f"{REPO}/t1"),
        "repo delete": cli.json("repo", "delete", "lakefs://other", "--yes"),
    }
    assert obj["repo create"]["default_branch"] == "trunk" and obj["repo create"]["commit_id"]
    st = obj["stat"]
    assert st["size"] == 5 and st["etag"] == "5d41402abc4b2a76b9719d911017c592"  # md5("hello")
    assert st["content_type"] == "text/x-test" and st["mtime"].endswith("Z") and st["physical_address"]
    assert obj["upload"] == st
    assert obj["show"] == {k: v for k, v in obj["commit"].items() if k not in ("branch", "changes")}
    assert obj["tag create"]["commit_id"] == obj["commit"]["id"]
    # the branch's commit, said as it goes (git's "(was 70e3a2f)"): the one way back to it
    assert obj["branch delete"] == {"deleted": "b1", "commit_id": obj["commit"]["id"], "discarded_changes": 0}
    for listing in (("repo", "list"), ("branch", "list", REPO), ("tag", "list", REPO), ("log", f"{REPO}/main"),
                    ("fs", "ls", f"{REPO}/main/"), ("diff", f"{REPO}/main~1", f"{REPO}/main")):
        rows = cli.jsonl(*listing) if listing[0] != "tag" else [{}]  # the only tag was deleted above
        assert rows and all(isinstance(r, dict) for r in rows), listing


def test_stat_and_ls_human(cli, story):
    out = cli("fs", "stat", f"{REPO}/main/ds/sales/summary.json")
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert fields["Path"].strip() == "ds/sales/summary.json"
    assert fields["Size"].strip() == "14 bytes"
    assert fields["Content-Type"].strip() == "application/json"
    assert fields["Physical Address"].strip().startswith("file://")
    # a prefix without a trailing '/' lists what starts with it (lakectl's way)
    assert cli("fs", "ls", f"{REPO}/main/ds/sa").split() == ["prefix", "sales/"]
    assert cli("fs", "ls", f"{REPO}/main").split() == ["prefix", "ds/"]
    rows = cli("fs", "ls", f"{REPO}/main/ds/sales/", "-r").splitlines()
    assert [r.split()[-1] for r in rows] == ["2024/01.csv", "2024/02.csv", "summary.json"]
    assert len({r.rindex(" ") for r in rows}) == 1  # aligned


def test_merge_conflict_and_strategies(cli, story, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("a")
    b.write_text("b")
    cli("branch", "create", f"{REPO}/x", "--source", "main")
    cli("fs", "upload", f"{REPO}/x/ds/readme.txt", "--source", str(a))
    cli("commit", f"{REPO}/x", "-m", "a")
    cli("fs", "upload", f"{REPO}/main/ds/readme.txt", "--source", str(b))
    msg = cli.fails(4, "merge", f"{REPO}/x", f"{REPO}/main")
    assert "uncommitted" in msg
    cli("commit", f"{REPO}/main", "-m", "b")
    msg = cli.fails(4, "merge", f"{REPO}/x", f"{REPO}/main")
    assert "conflict" in msg and "ds/readme.txt" in msg and "--strategy" in msg
    out = cli("merge", f"{REPO}/x", f"{REPO}/main", "--json", code=4)  # the conflicts as data too
    assert json.loads(out) == {"merged": False, "conflicts": ["ds/readme.txt"], "count": 1}
    cli("merge", "x", f"{REPO}/main", "--strategy", "dest-wins")  # (a plain SOURCE: a docs tour)
    assert cli("fs", "cat", f"{REPO}/main/ds/readme.txt") == "b"
    cli("fs", "upload", f"{REPO}/x/ds/readme.txt", "--source", str(b))
    cli("fs", "upload", f"{REPO}/main/ds/readme.txt", "--source", str(a))
    cli("commit", f"{REPO}/x", "-m", "b on x")
    cli("commit", f"{REPO}/main", "-m", "a on main")
    m = cli.json("merge", f"{REPO}/x", f"{REPO}/main", "--strategy", "source-wins", "-m", "take x", "--meta", "why=test")
    assert m["message"] == "take x" and m["metadata"]["why"] == "test"
    assert m["metadata"][".lakefs.merge.strategy"] == "source-wins"
    assert cli("fs", "cat", f"{REPO}/main/ds/readme.txt") == "b"


def test_diff_three_dot_shows_the_right_side_since_the_merge_base(cli, story, tmp_path):
    """Found by a lakeFS power user's exploration: `diff LEFT RIGHT` compares the tips (git's
    two-dot) and lakectl's default, the right side's changes since the merge base, had no form.
    --three-dot is it; it needs two refs, and two histories that meet."""
    a = tmp_path / "a"
    a.write_text("a")
    cli("branch", "create", f"{REPO}/dev", "--source", "main")
    cli("fs", "upload", f"{REPO}/dev/dev-only.txt", "--source", str(a))
    cli("commit", f"{REPO}/dev", "-m", "dev")
    cli("fs", "upload", f"{REPO}/main/main-only.txt", "--source", str(a))
    cli("commit", f"{REPO}/main", "-m", "main")
    assert cli("diff", f"{REPO}/main", f"{REPO}/dev").splitlines() == ["+ dev-only.txt", "- main-only.txt"]
    # RIGHT (and merge's SOURCE) may be a plain ref of the repository, as revert's and tag's (a docs tour)
    assert cli("diff", f"{REPO}/main", "dev").splitlines() == ["+ dev-only.txt", "- main-only.txt"]
    assert cli("diff", f"{REPO}/main", f"{REPO}/dev", "--three-dot").splitlines() == ["+ dev-only.txt"]
    assert cli("diff", f"{REPO}/dev", f"{REPO}/main", "--three-dot").splitlines() == ["+ main-only.txt"]
    assert "two refs" in cli.fails(2, "diff", f"{REPO}/main", "--three-dot")


def test_diff_three_dot_agrees_with_the_merge_in_a_criss_cross_history(cli, story, tmp_path):
    """Found by a git user's tour: with two best common ancestors (criss-cross merges), --three-dot
    diffed from one of them, so it listed x1.txt -- made on b1 -- among b2's changes, while the
    merge of b2 into b1 (over a virtual base, as git's) brought g.txt alone. They agree now."""
    a = tmp_path / "a"
    a.write_text("a")
    for b in ("b1", "b2"):
        cli("branch", "create", f"{REPO}/{b}", "--source", "main")
    for b, f in (("b1", "x1.txt"), ("b2", "y1.txt")):
        cli("fs", "upload", f"{REPO}/{b}/{f}", "--source", str(a))
        cli("commit", f"{REPO}/{b}", "-m", f)
    cli("branch", "create", f"{REPO}/b1pre", "--source", "b1")
    cli("merge", f"{REPO}/b2", f"{REPO}/b1")
    cli("merge", f"{REPO}/b1pre", f"{REPO}/b2")
    cli("fs", "upload", f"{REPO}/b2/g.txt", "--source", str(a))
    cli("commit", f"{REPO}/b2", "-m", "g")
    preview = cli("diff", f"{REPO}/b1", f"{REPO}/b2", "--three-dot").splitlines()
    assert preview == ["+ g.txt"], preview
    before = {line.split()[-1] for line in cli("fs", "ls", f"{REPO}/b1/", "--recursive").splitlines()}
    cli("merge", f"{REPO}/b2", f"{REPO}/b1")
    after = {line.split()[-1] for line in cli("fs", "ls", f"{REPO}/b1/", "--recursive").splitlines()}
    assert after - before == {"g.txt"} and before - after == set()


@pytest.mark.parametrize(
    "args, code, fragment",
    [
        (("fs", "cat", f"{REPO}/nope/ds/readme.txt"), 3, "'nope' not found"),
        (("fs", "cat", f"{REPO}/main/ds/nothing"), 3, "not found"),
        (("fs", "cat", "lakefs://unknown/main/x"), 3, "repository 'unknown' not found"),
        (("fs", "cat", f"{REPO}/main/../x"), 2, "'..'"),
        (("fs", "cat", f"{REPO}/main/a\x00b"), 2, "NUL"),
        (("fs", "cat", "s3://demo/main/x"), 2, "scheme"),
        (("fs", "cat", "lakefs://demo/main"), 2, "expected lakefs://REPO/REF/PATH"),
        (("fs", "ls", REPO), 2, "expected lakefs://REPO/REF"),
        (("fs", "stat", f"{REPO}/main~9/ds/readme.txt"), 3, "no parent"),
        (("fs", "ls", f"{REPO}/main^^^x/"), 2, "invalid ref"),
        (("fs", "upload", f"{REPO}/main/x", "--source", "/no/such/file"), 3, "local file not found"),
        (("fs", "upload", f"{REPO}/main/x", "--source", "/"), 2, "is a directory: use --recursive"),
        (("fs", "upload", f"{REPO}/main/x", "--source", __file__, "--recursive"), 2, "needs a directory"),
        (("fs", "upload", f"{REPO}/main~1/x", "--source", __file__), 2, "not a branch"),  # (was 4)
        (("fs", "rm", f"{REPO}/main/ds/none"), 3, "not found"),
        (("fs", "rm", f"{REPO}/main/none", "-r"), 3, "no objects under"),
        (("branch", "create", f"{REPO}/main", "--source", "main"), 4, "already exists"),
        (("branch", "create", f"{REPO}/-x", "--source", "main"), 2, "invalid branch name"),
        (("branch", "create", f"{REPO}/b2", "--source", "lakefs://other/main"), 2, "repository 'demo'"),
        (("branch", "create", f"{REPO}/b2", "--source", "ghost"), 3, "not found"),
        (("branch", "delete", f"{REPO}/main"), 4, "default branch"),
        (("branch", "delete", f"{REPO}/ghost"), 3, "not found"),
        (("branch", "reset", f"{REPO}/main", "--path", "a/../b"), 2, "'..'"),
        (("tag", "create", f"{REPO}/bad..tag", "main"), 2, "invalid tag name"),
        (("tag", "delete", f"{REPO}/ghost"), 3, "not found"),
        (("commit", f"{REPO}/main", "-m", "nothing"), 4, "nothing to commit"),
        (("commit", f"{REPO}/main", "-m", ""), 2, "commit message is empty"),
        (("commit", f"{REPO}/main", "-m", " \n"), 2, "--allow-empty-message"),
        (("commit", f"{REPO}/main", "-m", "x", "--meta", "novalue"), 2, "KEY=VALUE"),
        (("commit", f"{REPO}/main/ds", "-m", "x"), 2, "without a path"),
        (("log", f"{REPO}/main", "--amount", "-1"), 2, "--amount"),
        (("diff", f"{REPO}/main", "lakefs://other/main"), 2, "expected a ref of repository"),
        (("merge", "lakefs://other/main", f"{REPO}/main"), 2, "expected a source of repository"),
        (("merge", f"{REPO}/main", f"{REPO}/main"), 4, "nothing to merge"),
        (("revert", f"{REPO}/main", "ghost"), 3, "not found"),
        (("repo", "create", REPO), 4, "already exists"),
        (("repo", "create", "lakefs://x"), 2, "invalid repository name"),
        (("repo", "create", "lakefs://fresh", "--storage", "relative/dir"), 2, "storage namespace must be file:///PATH, an absolute path"),
        (("repo", "create", f"{REPO}/main"), 2, "without a ref"),
        (("repo", "delete", REPO), 2, "--yes"),
        (("refs", "restore", REPO), 4, "exists and has branches"),
        (("refs", "restore", "lakefs://fresh", "--manifest", "/no/such.json"), 3, "manifest file not found"),
    ],
)
def test_errors(cli, story, monkeypatch, args, code, fragment):
    monkeypatch.setattr("sys.stdin", open(os.devnull))
    msg = cli.fails(code, *args)
    assert fragment in msg, msg


def test_branch_delete_says_how_many_uncommitted_changes_it_discarded(cli, story, tmp_path):
    """Found by two tours (a cluster operator, an ETL team): deleting a branch with uncommitted
    changes dropped them without a word, and its line said the command it printed "brings it
    back" -- which brings back its commit, not them."""
    f = tmp_path / "f.txt"
    f.write_text("dirty")
    cli("branch", "create", f"{REPO}/job", "--source", f"{REPO}/main")
    cli("fs", "upload", f"{REPO}/job/a.txt", "--source", str(f))
    cli("fs", "upload", f"{REPO}/job/b.txt", "--source", str(f))
    said = cli("branch", "delete", f"{REPO}/job")
    assert "with its 2 uncommitted change(s), discarded" in said and "brings back its commit, not them" in said
    cli("branch", "create", f"{REPO}/clean", "--source", f"{REPO}/main")  # healthy: nothing discarded, nothing said
    said = cli("branch", "delete", f"{REPO}/clean")
    assert "uncommitted" not in said and "brings it back" in said


def test_an_empty_commit_message_needs_its_flag(cli, story, tmp_path):
    (tmp_path / "n").write_text("n")
    cli("fs", "upload", f"{REPO}/main/n", "--source", str(tmp_path / "n"))
    assert "commit message is empty" in cli.fails(2, "commit", f"{REPO}/main", "-m", "")
    c = cli.json("commit", f"{REPO}/main", "-m", "", "--allow-empty-message")
    assert c["message"] == "" and cli.json("show", f"{REPO}/main")["id"] == c["id"]


def test_commits_merges_and_reverts_name_this_user_or_lakefuse_committer(cli, story, tmp_path, monkeypatch):
    import pwd
    me = pwd.getpwuid(os.geteuid()).pw_name
    (tmp_path / "u").write_text("u")
    cli("fs", "upload", f"{REPO}/main/u", "--source", str(tmp_path / "u"))
    assert cli.json("commit", f"{REPO}/main", "-m", "mine")["committer"] == me
    monkeypatch.setenv("LAKEFUSE_COMMITTER", "etl-bot")
    cli("branch", "create", f"{REPO}/bot", "--source", "main")
    cli("fs", "rm", f"{REPO}/bot/u")
    assert cli.json("commit", f"{REPO}/bot", "-m", "bot's")["committer"] == "etl-bot"
    assert cli.json("merge", f"{REPO}/bot", f"{REPO}/main")["committer"] == "etl-bot"
    monkeypatch.setenv("LAKEFUSE_COMMITTER", " ")  # blank: as unset
    assert cli.json("revert", f"{REPO}/main", f"{REPO}/main", "-p", "1")["committer"] == me
    # first parents: the revert, the merge, "mine"
    log = cli.jsonl("log", f"{REPO}/main", "--amount", "3", "--first-parent")
    assert [c["committer"] for c in log] == [me, "etl-bot", me]


def test_conflicts_on_names_with_a_newline_or_a_tab_are_one_line_and_a_revert_says_revert(cli, story, tmp_path):
    """Found by a data team lead's tour: a merge conflict on the key "x<newline>y" printed the
    key raw, the error going on over a second line (a tab raw too), and a revert's conflict was
    worded "merge conflict", with no hint."""
    for i, name in enumerate(("x\ny", "t\tab")):
        for side, data in (("c", "a"), ("main", "b")):
            if side == "c" and i == 0:
                cli("branch", "create", f"{REPO}/c", "--source", "main")
            (tmp_path / "f").write_text(data)
            cli("fs", "upload", f"{REPO}/{side}/{name}", "--source", str(tmp_path / "f"))
    cli("commit", f"{REPO}/c", "-m", "c")
    cli("commit", f"{REPO}/main", "-m", "main")
    msg = cli.fails(4, "merge", f"{REPO}/c", f"{REPO}/main")
    assert "merge conflict on 2 key(s)" in msg and "x\\x0ay" in msg and "t\\x09ab" in msg and "--strategy" in msg
    (tmp_path / "f").write_text("later")
    cli("fs", "upload", f"{REPO}/main/x\ny", "--source", str(tmp_path / "f"))
    cli("commit", f"{REPO}/main", "-m", "later")
    msg = cli.fails(4, "revert", f"{REPO}/main", "main~1")
    assert msg.startswith("lakefuse: revert conflict on 1 key(s): x\\x0ay") and "by hand" in msg


def test_revert_merge_commit_needs_parent_number(cli, story):
    cli("branch", "create", f"{REPO}/x", "--source", "main")
    cli("fs", "rm", f"{REPO}/x/ds/readme.txt")
    cli("commit", f"{REPO}/x", "-m", "rm")
    cli("merge", f"{REPO}/x", f"{REPO}/main")
    assert "parent number" in cli.fails(2, "revert", f"{REPO}/main", "main")
    assert ">= 1, not 0" in cli.fails(2, "revert", f"{REPO}/main", "main", "-p", "0")  # (was "give the parent number")
    assert ">= 1, not 0" in cli.fails(2, "revert", f"{REPO}/main", "main~1", "-p", "0")  # (was taken as no number)
    cli("revert", f"{REPO}/main", f"{REPO}/main", "-p", "1")
    assert cli("fs", "cat", f"{REPO}/main/ds/readme.txt") == "a small dataset\n"


def test_recursive_upload_batches_skips_symlinks_and_progress(cli, tmp_path, monkeypatch):
    from lakefuse.cli import vc_fs

    monkeypatch.setattr(vc_fs, "STAGE_BATCH", 7)
    src = tmp_path / "tree"
    for i in range(30):
        p = src / f"d{i % 4}" / f"f{i:02}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes([i]) * i)
    (src / "link").symlink_to(src / "d0" / "f00.bin")
    (src / "dirlink").symlink_to(src / "d1", target_is_directory=True)
    cli("repo", "create", REPO)
    res = cli.json("fs", "upload", f"{REPO}/main/t", "--source", str(src), "-r", "--progress")
    assert res["objects"] == 30 and res["bytes"] == sum(range(30))
    assert sorted(s["path"] for s in res["skipped"]) == [str(src / "dirlink"), str(src / "link")]
    assert "skipped" in cli.err and "uploading" in cli.err  # notes and the progress bar go to stderr
    listed = cli.jsonl("fs", "ls", f"{REPO}/main/t/", "-r")
    assert [e["path"] for e in listed] == sorted(f"t/d{i % 4}/f{i:02}.bin" for i in range(30))
    assert cli("fs", "cat", f"{REPO}/main/t/d1/f29.bin") == chr(29) * 29
    assert cli.json("fs", "rm", f"{REPO}/main/t/d1", "-r")["deleted"] == 8
    assert len(cli.jsonl("fs", "ls", f"{REPO}/main/t/", "-r")) == 22


def test_recursive_upload_checks_paths_first(cli, tmp_path):
    src = tmp_path / "tree"
    src.mkdir()
    (src / "ok.txt").write_text("x")
    (src / "\udcff-bad.txt").write_text("x")  # not UTF-8
    cli("repo", "create", REPO)
    assert "UTF-8" in cli.fails(2, "fs", "upload", f"{REPO}/main/", "--source", str(src), "-r")
    assert cli("fs", "ls", f"{REPO}/main/") == ""
    assert not list((cli.home / "storage" / "demo").glob("data/*/*"))  # nothing was uploaded
    # a path too long for a branch: the refusal names the file (a tour of odd names had to find it)
    (src / "\udcff-bad.txt").unlink()
    deep = src.joinpath(*["d" * 200] * 3)
    deep.mkdir(parents=True)
    (deep / "f.txt").write_text("x")
    err = cli.fails(2, "fs", "upload", f"{REPO}/main/", "--source", str(src), "-r")
    assert str(deep / "f.txt") in err and "494" in err and "nothing was uploaded" in err, err


def test_refs_restore_from_manifest_file_into_new_namespace_name(cli, story, tmp_path):
    manifest = cli.json("refs", "dump", REPO)
    mf = tmp_path / "manifest.json"
    mf.write_text(json.dumps(manifest))
    ns = (cli.home / "storage" / "demo").as_uri()
    # a second repository over the same namespace, restored from the manifest file
    out = cli("refs", "restore", "lakefs://copy", "--storage", ns, "--manifest", str(mf))
    assert "2 commits" in out
    assert cli("log", "lakefs://copy/main", "--json") == cli("log", f"{REPO}/main", "--json")
    mf.write_text("{}")
    assert "not a refs manifest" in cli.fails(2, "refs", "restore", "lakefs://third", "--manifest", str(mf))
    assert cli("repo", "list", "--json").count("\n") == 2  # the failed restore left no repository


def test_home_option_and_env(tmp_path, capsys, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv("LAKEFUSE_HOME", str(a))
    assert main(["repo", "create", "lakefs://in-env"]) == 0
    assert main(["repo", "create", "lakefs://in-opt", "--home", str(b)]) == 0
    capsys.readouterr()
    assert main(["repo", "list", "--json"]) == 0
    assert [json.loads(x)["name"] for x in capsys.readouterr().out.splitlines()] == ["in-env"]
    assert main(["repo", "list", "--json", "--home", str(b)]) == 0
    assert [json.loads(x)["name"] for x in capsys.readouterr().out.splitlines()] == ["in-opt"]


def _leaf_parsers(parser, path=()):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                yield from _leaf_parsers(sp, (*path, name))
            return
    yield path, parser


def test_help_everywhere():
    parser = build_parser()
    leaves = [(p, sp) for p, sp in _leaf_parsers(parser) if p[0] not in ("sst", "mount", "umount")]
    names = {" ".join(p) for p, _ in leaves}
    assert {"repo create", "repo list", "repo delete", "branch create", "branch list", "branch delete",
            "branch reset", "tag create", "tag list", "tag delete", "fs upload", "fs cat", "fs ls", "fs stat",
            "fs rm", "commit", "log", "show", "diff", "merge", "revert", "refs dump", "refs restore"} <= names
    for path, sp in leaves:
        text = sp.format_help()
        assert "--home" in text, path
        assert sp.description and "\n" not in sp.description, path
        if path != ("fs", "cat"):
            assert "--json" in text, path


def run_lakefuse(home: Path, *args: str, env_home: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("LAKEFUSE_HOME", None)
    argv = [sys.executable, "-m", "lakefuse", *args]
    if env_home:
        env["LAKEFUSE_HOME"] = str(home)
    else:
        argv += ["--home", str(home)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def test_real_cli_subprocess(tmp_path):
    home = tmp_path / "home"
    data = tmp_path / "d"
    make_dataset(data)
    r = run_lakefuse(home, "repo", "create", REPO, env_home=True)
    assert r.returncode == 0, r.stderr
    r = run_lakefuse(home, "fs", "upload", f"{REPO}/main/ds", "--source", str(data), "--recursive")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # no progress bar when stderr is not a terminal
    r = run_lakefuse(home, "commit", f"{REPO}/main", "-m", "one")
    assert r.returncode == 0 and r.stdout.startswith("[main "), r.stderr
    r = run_lakefuse(home, "fs", "cat", f"{REPO}/main/ds/sales/2024/02.csv")
    assert r.stdout == "day,amount\n1,30\n"
    for args, code in [(("fs", "cat", f"{REPO}/main/ds/none"), 3),
                       (("fs", "cat", "lakefs://demo/main/../../etc/passwd"), 2),
                       (("log", "lakefs://nothere/main"), 3),
                       (("merge", f"{REPO}/main", f"{REPO}/main"), 4)]:
        r = run_lakefuse(home, *args)
        assert r.returncode == code, (args, r.stderr)
        assert r.stdout == "" and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    r = run_lakefuse(home, "fs", "--help")
    assert r.returncode == 0 and "upload" in r.stdout


def test_diff_takes_gits_two_and_three_dot_forms_and_names_a_bad_expression(cli, story):
    """Found by a refs tour: ``diff lakefs://r/main~3..main`` (a git user's form), ``main...x``,
    ``main^2`` of a commit with one parent, all said "branch '...' not found" (exit 3), where show
    and log give the expression's own error."""
    cli("branch", "create", f"{REPO}/x", "--source", "main")
    cli("fs", "rm", f"{REPO}/x/ds/readme.txt")
    cli("commit", f"{REPO}/x", "-m", "rm on x")
    two = cli("diff", f"{REPO}/main..x")
    assert two == cli("diff", f"{REPO}/main", "x") and "readme.txt" in two
    assert cli("diff", f"{REPO}/main...x") == cli("diff", f"{REPO}/main", "x", "--three-dot")
    assert "parent" in cli.fails(3, "diff", f"{REPO}/main^2")
    assert "both sides" in cli.fails(2, "diff", f"{REPO}/main..")


def test_moving_or_deleting_a_tag_says_which_commit_it_named(cli, story):
    """Found by a refs tour: ``tag create --force`` said only "created", ``tag delete`` only
    "deleted": the commit a moved or deleted tag named was gone from sight, the move not undoable.
    As git ("Updated tag (was ...)", "Deleted tag (was ...)") and lakefuse's branch delete."""
    first = cli.json("show", f"{REPO}/main")["id"]
    cli("tag", "create", f"{REPO}/moving", "main")
    cli("fs", "rm", f"{REPO}/main/ds/readme.txt")
    cli("commit", f"{REPO}/main", "-m", "rm")
    moved = cli("tag", "create", f"{REPO}/moving", "main", "--force")
    assert "moved to" in moved and f"(was {first[:12]})" in moved, moved
    assert cli.json("tag", "create", f"{REPO}/moving", "main", "--force")["was"] != first  # (now the new one)
    gone = cli("tag", "delete", f"{REPO}/moving")
    assert "deleted (was " in gone and "tag create" in gone, gone
