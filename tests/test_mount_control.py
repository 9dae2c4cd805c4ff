"""Control-file requests (lakefuse.mount.control), without a kernel: real LMDB and store."""

from __future__ import annotations

import json

import pytest

from graveler.errors import (
    AlreadyExists,
    DirtyBranch,
    InvalidArgument,
    MergeConflict,
    NotFound,
    NothingToCommit,
)
from graveler.model import MergeStrategy
from lakefuse.mount import control as ctl
from tests.graveler_testutil import make_repo


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path)


@pytest.fixture
def controls(repo):
    return ctl.Controls(repo)


@pytest.mark.parametrize(
    "data, want",
    [
        (b"first commit\n", ctl.CommitRequest("first commit")),
        (b"multi\nline\n\n", ctl.CommitRequest("multi\nline")),
        (b'{"message": "m", "metadata": {"k": "v"}, "allow_empty": true}',
         ctl.CommitRequest("m", {"k": "v"}, True)),
        (b'  {"message": "m"}\n', ctl.CommitRequest("m")),
        # text that opens no JSON object (no name after the brace) is the message itself
        (b"{WIP} fix stuff\n", ctl.CommitRequest("{WIP} fix stuff")),
        (b"{not json", ctl.CommitRequest("{not json")),
    ],
)
def test_parse_commit(data, want):
    assert ctl.parse_commit(data) == want


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\n\n", "empty"),
        (b'{"message": x}', "malformed JSON"),
        (b"{}", "non-empty"),
        (b'{"message":' + b"[" * 3000 + b"]" * 3000 + b"}", "nested too deeply"),
        (b'{"message": "bad \\udcff msg"}', "unpaired surrogate"),
        (b'{"message": "m", "metadata": {"k": "\\ud800"}}', "unpaired surrogate"),
        (b'{"message": ""}', "non-empty"),
        (b'{"message": "m", "metadata": {"k": 1}}', "string values"),
        (b'{"message": "m", "allow_empty": "yes"}', "true or false"),
        (b'{"message": "m", "extra": 1}', "unknown field"),
        (b"\xff\xfe", "UTF-8"),
        (b"a\x00b", "NUL"),
        # found by a git user's tour: JSON's \u0000 passed (git refuses a NUL in a message), and
        # metadata keys the CLI's --meta KEY=VALUE refuses ("" ) or cannot give (a NUL)
        (b'{"message": "nul\\u0000inside"}', "NUL"),
        (b'{"message": "m", "metadata": {"": "v"}}', "non-empty"),
        (b'{"message": "m", "metadata": {"k\\u0000": "v"}}', "NUL"),
        (b'{"message": "m", "metadata": {"k": "v\\u0000"}}', "NUL"),
        (b"x" * (ctl.MAX_REQUEST_BYTES + 1), "at most"),
    ],
)
def test_parse_commit_rejects(data, reason):
    with pytest.raises(InvalidArgument, match=reason):
        ctl.parse_commit(data)


def test_parse_other_requests():
    assert ctl.parse_merge(b"dev\n") == ctl.MergeRequest("dev")
    assert ctl.parse_merge(b"dev source-wins") == ctl.MergeRequest("dev", MergeStrategy.SOURCE_WINS)
    assert ctl.parse_reset(b"*\n") == ctl.ResetRequest("all")
    assert ctl.parse_reset(b"/a/b\n") == ctl.ResetRequest("path", "a/b")
    assert ctl.parse_reset(b"a/") == ctl.ResetRequest("prefix", "a/")
    assert ctl.parse_reset(b"/\n") == ctl.ResetRequest("root", "/")  # the root's marker ("M /" in status)
    # the path as written: spaces are part of it (a key may begin or end with one), the line's end is not
    assert ctl.parse_reset(b" sp.txt\n") == ctl.ResetRequest("path", " sp.txt")
    assert ctl.parse_reset(b"tr.txt \r\n") == ctl.ResetRequest("path", "tr.txt ")
    assert ctl.parse_revert(b"main~1") == ctl.RevertRequest("main~1")
    assert ctl.parse_revert(b"abc 2") == ctl.RevertRequest("abc", 2)
    assert ctl.parse_branch(b"dev main~2\n") == ctl.BranchRequest("dev", "main~2")
    assert ctl.parse_branch(b"dev") == ctl.BranchRequest("dev", None)
    assert ctl.parse_tag(b"v1 main") == ctl.TagRequest("v1", "main")
    for fn, data in [
        (ctl.parse_merge, b"dev sideways"), (ctl.parse_merge, b""), (ctl.parse_merge, b"a b c"),
        (ctl.parse_merge, b"a\nb"), (ctl.parse_reset, b""), (ctl.parse_reset, b"a/../b"),
        (ctl.parse_reset, b"  \n"), (ctl.parse_revert, b"x 0"), (ctl.parse_revert, b"x y"),
        (ctl.parse_revert, "x \u00b2".encode()), (ctl.parse_revert, "x \u0661".encode()),  # digits, not ASCII ones
        (ctl.parse_tag, b"v1"), (ctl.parse_branch, b"a b c"),
    ]:
        with pytest.raises(InvalidArgument):
            fn(data)


def test_commit_success_and_read_back(repo, controls):
    repo.upload("main", "a.txt", b"A")
    out = controls.execute("main", "commit", b'{"message": "add a", "metadata": {"who": "me"}}')
    assert out["ok"]
    head = repo.get_commit("main")
    assert out["commit"]["id"] == head.id and head.message == "add a" and head.metadata == {"who": "me"}
    back = json.loads(controls.outcome("main", "commit"))
    assert back["ok"] and back["commit"]["id"] == head.id


def test_a_requests_commit_merge_and_revert_name_the_user_who_wrote_it(repo, controls, monkeypatch):
    import pwd
    nobody = pwd.getpwnam("nobody")
    repo.upload("main", "a.txt", b"A")
    c = controls.execute("main", "commit", b"by nobody", nobody.pw_uid)["commit"]
    assert c["committer"] == repo.get_commit("main").committer == "nobody"
    repo.create_branch("dev", "main")
    repo.upload("dev", "b.txt", b"B")
    repo.commit("dev", "on dev")
    assert controls.execute("main", "merge", b"dev", 0)["commit"]["committer"] == "root"
    assert controls.execute("main", "revert", b"main~1", nobody.pw_uid)["commit"]["committer"] == "nobody"
    unknown = 4_000_000_000  # a user ID the user database does not have
    repo.upload("main", "c.txt", b"C")
    assert controls.execute("main", "commit", b"by a number", unknown)["commit"]["committer"] == f"uid:{unknown}"
    repo.upload("main", "d.txt", b"D")  # no user known (a caller of the core): the repository's committer
    assert controls.execute("main", "commit", b"core")["commit"]["committer"] == repo.config.committer
    monkeypatch.setenv("LAKEFUSE_COMMITTER", "etl-bot")  # the daemon's environment names every commit
    repo.upload("main", "e.txt", b"E")
    assert controls.execute("main", "commit", b"bot", nobody.pw_uid)["commit"]["committer"] == "etl-bot"


@pytest.mark.expect_log("a failed control request is logged as a warning")
def test_failed_requests_change_nothing_and_keep_the_reason(repo, controls):
    head = repo.get_commit("main").id
    with pytest.raises(NothingToCommit):
        controls.execute("main", "commit", b"empty\n")
    back = json.loads(controls.outcome("main", "commit"))
    assert not back["ok"] and back["error_type"] == "NothingToCommit" and "nothing to commit" in back["error"]
    with pytest.raises(InvalidArgument):
        controls.execute("main", "commit", b'{"bad')
    assert "malformed JSON" in json.loads(controls.outcome("main", "commit"))["error"]
    assert repo.get_commit("main").id == head
    controls.execute("main", "commit", b'{"message": "empty ok", "allow_empty": true}')
    assert repo.get_commit("main").parents == (head,)
    with pytest.raises(NotFound):
        controls.execute("main", "merge", b"no-such-branch")
    with pytest.raises(InvalidArgument):
        controls.execute(None, "commit", b"x")  # not a root control file


def test_status_lines(repo, controls):
    repo.upload("main", "keep", b"1")
    repo.upload("main", "change", b"1")
    repo.upload("main", "gone", b"1")
    repo.commit("main", "base")
    repo.upload("main", "change", b"2")
    repo.upload("main", "new/file", b"3")
    repo.delete("main", "gone")
    assert controls.outcome("main", "status") == b"M change\nD gone\nA new/file\n"
    # a name with a newline or tab cannot fake a line: quoted as `lakefuse diff` and git show it
    repo.upload("main", "nl\nname.txt", b"4")
    repo.upload("main", "t\tab \"q\".txt", b"5")
    assert controls.outcome("main", "status").decode().splitlines() == [
        "M change", "D gone", "A new/file", 'A "nl\\nname.txt"', 'A "t\\tab \\"q\\".txt"']


@pytest.mark.expect_log("a refused commit is logged as a warning")
def test_only_directory_times_changed_is_nothing_to_commit_as_status_says(repo, controls):
    """Found by a data team lead's tour: a temp file made and removed in a directory left
    ``.lakefuse/status`` empty, yet ``echo msg > commit`` made a commit (of the directory's
    marker: its mtime moved). As git, which sees no directories: nothing to commit, and the
    marker's change stays staged (it goes with the next commit). A directory's mode or owner
    changed is a change: listed, and committed."""
    from graveler.errors import NothingToCommit
    from graveler.model import Entry
    from graveler.objects import POSIX_MODE, POSIX_MTIME

    def marker(**md) -> Entry:
        return Entry(address="data/none", size=0, etag="d41d8cd98f00b204e9800998ecf8427e", last_modified_ns=1,
                     metadata=md)

    repo.stage_many("main", [("loads/", marker(**{POSIX_MODE: "40755", POSIX_MTIME: "1"})), ("loads/a", None)])
    repo.upload("main", "loads/a", b"a")
    c1 = repo.commit("main", "a load")
    repo.stage("main", "loads/", marker(**{POSIX_MODE: "40755", POSIX_MTIME: "2"}))  # (a temp file came and went)
    assert controls.outcome("main", "status") == b""
    with pytest.raises(NothingToCommit, match="status is empty"):
        controls.execute("main", "commit", b"nothing really")
    assert repo.get_branch("main").commit_id == c1.id
    assert controls.execute("main", "commit", b'{"message": "times", "allow_empty": true}')["commit"]
    repo.stage("main", "loads/", marker(**{POSIX_MODE: "40700", POSIX_MTIME: "3"}))  # chmod 700 loads
    assert controls.outcome("main", "status") == b"M loads/\n"
    c3 = controls.execute("main", "commit", b"private loads")["commit"]
    assert repo.get_commit(c3["id"]).id == repo.get_branch("main").commit_id


@pytest.mark.expect_log("the refused request (a real change) is logged as a warning")
@pytest.mark.parametrize("op", ["merge", "revert"])
def test_only_directory_times_changed_leaves_a_branch_clean_for_a_merge_or_a_revert(repo, controls, op):
    """Found by a git power user's tour: a temp file made and removed in a directory (its marker's
    mtime moved) left ``status`` empty and a commit "nothing to commit", yet a merge or a revert
    through the control file refused the branch as having uncommitted changes (EBUSY) -- the only
    way out a reset. As git, which sees no directories, those times are given up and the request
    goes on; a real change (a mode) still refuses it."""
    from graveler.errors import DirtyBranch
    from graveler.model import Entry
    from graveler.objects import POSIX_MODE, POSIX_MTIME

    def marker(**md) -> Entry:
        return Entry(address="data/none", size=0, etag="d41d8cd98f00b204e9800998ecf8427e", last_modified_ns=1,
                     metadata=md)

    repo.stage("main", "loads/", marker(**{POSIX_MODE: "40755", POSIX_MTIME: "1"}))
    repo.upload("main", "loads/a", b"a")
    repo.commit("main", "a load")
    repo.create_branch("dev", "main")
    repo.upload("dev", "b", b"b")
    c2 = repo.commit("dev", "b")
    repo.upload("main", "c", b"c")
    c3 = repo.commit("main", "c")  # (a revert's target)
    request = b"dev" if op == "merge" else c3.id.encode()
    repo.stage("main", "loads/", marker(**{POSIX_MODE: "40700", POSIX_MTIME: "2"}))  # chmod 700 loads: a change
    with pytest.raises(DirtyBranch):
        controls.execute("main", op, request)
    repo.stage("main", "loads/", marker(**{POSIX_MODE: "40755", POSIX_MTIME: "3"}))  # back, times moved: none
    assert controls.outcome("main", "status") == b""
    done = controls.execute("main", op, request)["commit"]
    assert repo.get_branch("main").commit_id == done["id"]
    assert repo.exists("main", "b") if op == "merge" else not repo.exists("main", "c")
    assert not list(repo.diff_uncommitted("main")) and c2.id


def test_reset_of_the_root_discards_its_attributes_alone_as_status_names_it(repo, controls):
    """Found by an xattr user's tour: a change of the branch root's attributes shows as ``M /`` (or
    ``A /``) in ``status``, yet ``echo / > reset`` was refused ("use '*'"), which discards everything;
    ``/`` now resets the root's marker alone, as the CLI's ``branch reset --path /`` does."""
    from graveler.model import Entry
    from graveler.objects import POSIX_MODE, ROOT_MARKER

    repo.upload("main", "kept", b"k")
    repo.stage("main", ROOT_MARKER.decode(), Entry(address="data/none", size=0, etag="d41d8cd98f00b204e9800998ecf8427e",
                                                     metadata={POSIX_MODE: "40700"}))
    assert controls.outcome("main", "status") == b"A /\nA kept\n"
    assert controls.execute("main", "reset", b"/\n")["reset"] == "/"
    assert controls.outcome("main", "status") == b"A kept\n"


@pytest.mark.expect_log("a failed control request is logged as a warning")
def test_merge_conflict_lists_paths(repo, controls):
    repo.upload("main", "x", b"0")
    repo.commit("main", "base")
    controls.execute(None, "branch", b"dev main")
    repo.upload("dev", "x", b"dev")
    repo.commit("dev", "dev change")
    repo.upload("main", "x", b"main")
    repo.commit("main", "main change")
    with pytest.raises(MergeConflict):
        controls.execute("main", "merge", b"dev")
    back = json.loads(controls.outcome("main", "merge"))
    assert back["conflicts"] == ["x"]
    out = controls.execute("main", "merge", b"dev source-wins")
    assert repo.read("main", "x") == b"dev" and out["commit"]["parents"][1] == repo.get_commit("dev").id


@pytest.mark.expect_log("a failed control request is logged as a warning")
def test_merge_refuses_dirty_branch(repo, controls):
    controls.execute(None, "branch", b"dev")
    repo.upload("dev", "y", b"1")
    repo.commit("dev", "y")
    repo.upload("main", "dirty", b"1")
    with pytest.raises(DirtyBranch):
        controls.execute("main", "merge", b"dev")
    assert not repo.exists("main", "y")


def test_reset_all_path_prefix(repo, controls):
    repo.upload("main", "d/a", b"1")
    repo.upload("main", "d/b", b"1")
    repo.upload("main", "e", b"1")
    repo.upload("main", "f", b"1")
    controls.execute("main", "reset", b"e")
    assert not repo.exists("main", "e") and repo.exists("main", "f")
    controls.execute("main", "reset", b"d")  # a directory by its name
    assert not repo.exists("main", "d/a") and repo.exists("main", "f")
    controls.execute("main", "reset", b"*")
    assert controls.outcome("main", "status") == b""


def test_reset_takes_the_path_as_written_and_asks_for_the_caches_to_go(repo, controls):
    """' sp.txt' and 'sp.txt' are two keys: resetting one leaves the other (a reset that dropped
    the spaces discarded another file's uncommitted content). A request that changed the
    branch's files (reset, merge, revert) calls after_change before it is answered; a commit does not."""
    called = []
    controls.after_change = lambda branch, removed: called.append((branch, removed))
    repo.upload("main", "sp.txt", b"one")
    repo.upload("main", " sp.txt", b"two")
    assert controls.execute("main", "reset", b" sp.txt\n")["reset"] == " sp.txt"
    assert repo.read("main", "sp.txt") == b"one" and not repo.exists("main", " sp.txt")
    assert called == [("main", [b" sp.txt"])]  # (the names it took away: the mount drops them)
    controls.execute("main", "commit", b"keep sp.txt\n")
    assert len(called) == 1
    repo.create_branch("feat")
    repo.delete("feat", "sp.txt")
    repo.upload("feat", "new.txt", b"n")
    repo.commit("feat", "drop sp.txt")
    controls.execute("main", "merge", b"feat")
    assert called[-1] == ("main", [b"sp.txt"])
    repo.upload("main", "d/a", b"1")
    repo.upload("main", "d/b", b"2")
    repo.upload("main", "e", b"3")
    controls.execute("main", "reset", b"d")
    assert called[-1] == ("main", [b"d/a", b"d/b"])


@pytest.mark.expect_log("the failed listing of what a merge removed is logged as a warning")
def test_a_merge_done_is_reported_done_when_listing_what_it_removed_fails(repo, controls, monkeypatch):
    """Found reviewing the change: the diff that lists what a merge removed (for the mount to
    drop those names) ran inside the request; a store hiccup there answered a merge that had
    moved the branch as failed, and a user would merge again."""
    from graveler.errors import StoreUnavailable

    called = []
    controls.after_change = lambda branch, removed: called.append(removed)
    repo.upload("main", "a", b"1")
    repo.commit("main", "base")
    repo.create_branch("feat")
    repo.delete("feat", "a")
    repo.commit("feat", "drop a")
    before = repo.get_branch("main").commit_id

    def hiccup(*a, **k):
        raise StoreUnavailable("store hiccup (test)")

    monkeypatch.setattr(repo, "diff", hiccup)
    out = controls.execute("main", "merge", b"feat")
    assert out["ok"] and repo.get_branch("main").commit_id != before and not repo.exists("main", "a")
    assert json.loads(controls.outcome("main", "merge"))["ok"] and called == [[]]


def test_an_unexpected_error_is_kept_for_the_read_back(repo, controls, monkeypatch):
    """A defect (not a GravelerError: the mount answers EIO) is recorded too: the read-back
    never shows the previous request's outcome as if it were this one's."""
    repo.upload("main", "a", b"1")
    controls.execute("main", "commit", b"first\n")

    def broken(*args, **kwargs):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(repo, "commit", broken)
    repo.upload("main", "b", b"1")
    with pytest.raises(RuntimeError):
        controls.execute("main", "commit", b"second\n")
    back = json.loads(controls.outcome("main", "commit"))
    assert not back["ok"] and back["error_type"] == "RuntimeError" and "broken on purpose" in back["error"]


def test_revert(repo, controls):
    repo.upload("main", "r", b"1")
    c = repo.commit("main", "add r")
    controls.execute("main", "revert", c.id[:12].encode())
    assert not repo.exists("main", "r")


@pytest.mark.expect_log("a failed control request is logged as a warning")
def test_a_revert_that_conflicts_says_revert_and_what_to_do(repo, controls):
    """Found reviewing the data team lead's fix: the CLI reworded a revert's conflict, but the
    revert file of a mount still answered "merge conflict on 1 key(s)" (graveler's words for
    the merge a revert makes inside), with no hint."""
    repo.upload("main", "r", b"1")
    c = repo.commit("main", "add r")
    repo.upload("main", "r", b"2")
    repo.commit("main", "change r")
    with pytest.raises(MergeConflict) as e:
        controls.execute("main", "revert", c.id[:12].encode())
    assert str(e.value).startswith("revert conflict on 1 key(s): r;") and "by hand" in str(e.value)
    assert e.value.keys == [b"r"] and e.value.count == 1
    back = json.loads(controls.outcome("main", "revert"))
    assert not back["ok"] and back["error"].startswith("revert conflict")


@pytest.mark.expect_log("a failed control request is logged as a warning")
def test_root_branch_and_tag(repo, controls):
    out = controls.execute(None, "branch", b"feature main")
    assert out["branch"] == "feature" and repo.get_branch("feature").commit_id == repo.get_commit("main").id
    with pytest.raises(AlreadyExists):
        controls.execute(None, "branch", b"feature")
    with pytest.raises(InvalidArgument):
        controls.execute(None, "branch", b"bad/name?")
    controls.execute(None, "tag", b"v1 main")
    assert repo.get_tag("v1").commit_id == repo.get_commit("main").id
    assert json.loads(controls.outcome(None, "tag"))["tag"] == "v1"
    with pytest.raises(NotFound):
        controls.execute(None, "tag", b"v2 nosuchref")


def test_a_tag_or_branch_named_like_the_other_says_so_in_the_read_back(repo, controls):
    """Found by a git user's tour: the root's tag file made a tag named like a branch in silence
    (the CLI notes it): the mount's name shows the branch, the tag only by its commit ID."""
    out = controls.execute(None, "tag", b"main main")
    assert "branch 'main' exists too" in out["note"] and "commit ID" in out["note"]
    assert json.loads(controls.outcome(None, "tag"))["note"] == out["note"]
    controls.execute(None, "tag", b"t9 main")
    out = controls.execute(None, "branch", b"t9 main")
    assert "tag 't9' exists too" in out["note"]
    assert "note" not in controls.execute(None, "branch", b"plain main")
    assert "note" not in controls.execute(None, "tag", b"t10 main")
    head = repo.get_commit("main").id  # a name that is also a commit-ID prefix (a refs tour: silent)
    out = controls.execute(None, "branch", f"{head[:7]} main".encode())
    assert f"'{head[:7]}' is also a commit-ID prefix: the name now shows this branch" in out["note"]
