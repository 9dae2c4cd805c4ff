"""lakefs:// URI parsing (lakefuse.cli.uri)."""

from __future__ import annotations

import pytest

from graveler.errors import InvalidArgument
from lakefuse.cli.uri import LakeFSURI, parse_uri


@pytest.mark.parametrize(
    "text, want",
    [
        ("lakefs://repo", LakeFSURI("repo")),
        ("lakefs://repo/", LakeFSURI("repo")),
        ("lakefs://repo/main", LakeFSURI("repo", "main")),
        ("lakefs://repo/main/", LakeFSURI("repo", "main", "")),
        ("lakefs://repo/main/a/b.csv", LakeFSURI("repo", "main", "a/b.csv")),
        ("lakefs://repo/main/dir/", LakeFSURI("repo", "main", "dir/")),
        ("lakefs://repo/main~2^2/x", LakeFSURI("repo", "main~2^2", "x")),
        ("lakefs://repo/main@/x", LakeFSURI("repo", "main@", "x")),
        ("lakefs://repo/3f2a9c01/x", LakeFSURI("repo", "3f2a9c01", "x")),
        ("lakefs://my-repo-1/v1.0/a//b", LakeFSURI("my-repo-1", "v1.0", "a//b")),  # kept verbatim
        ("lakefs://repo/main/with space/%20", LakeFSURI("repo", "main", "with space/%20")),  # no decoding
        ("lakefs://repo/main/..x/x..", LakeFSURI("repo", "main", "..x/x..")),  # not a '..' component
        ("lakefs://repo/main/é/ü.txt", LakeFSURI("repo", "main", "é/ü.txt")),
    ],
)
def test_parse(text, want):
    assert parse_uri(text) == want


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "expected lakefs://"),
        ("repo/main", "expected lakefs://"),
        ("s3://bucket/key", "scheme must be lakefs://"),
        ("LAKEFS://repo", "scheme must be lakefs://"),
        ("lakefs://", "no repository"),
        ("lakefs:///main/x", "no repository"),
        ("lakefs://Repo", "invalid repository name"),
        ("lakefs://re/main", "invalid repository name"),  # lakeFS: at least 3 characters
        ("lakefs://repo//x", "empty ref"),
        ("lakefs://repo/main/../etc/passwd", "'..'"),
        ("lakefs://repo/main/a/..", "'..'"),
        ("lakefs://repo/main/./a", "'.'"),
        ("lakefs://repo/main/a\x00b", "NUL"),
        ("lakefs://repo/ma\x00in/a", "NUL"),
        ("lakefs://re\x00po/main", "NUL"),
    ],
)
def test_parse_rejects(text, fragment):
    with pytest.raises(InvalidArgument) as e:
        parse_uri(text)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_str_round_trip():
    for text in ("lakefs://repo", "lakefs://repo/main", "lakefs://repo/main/a/b", "lakefs://repo/main/dir/"):
        assert str(parse_uri(text)) == text


def test_requirements():
    repo = parse_uri("lakefs://repo")
    ref = parse_uri("lakefs://repo/main")
    obj = parse_uri("lakefs://repo/main/a/b")
    assert repo.repo_only() is repo
    with pytest.raises(InvalidArgument):
        ref.repo_only()
    assert ref.with_ref() == "main"
    with pytest.raises(InvalidArgument, match="expected lakefs://REPO/BRANCH"):
        repo.with_ref("branch")
    with pytest.raises(InvalidArgument, match="without a path"):
        obj.with_ref()
    # (an ETL team's tour: `branch create lakefs://repo/etl/daily` said only "without a path")
    with pytest.raises(InvalidArgument, match="main/a/b is no branch name: a name cannot hold '/'"):
        obj.with_ref("branch")
    assert obj.with_path() == ("main", "a/b")
    with pytest.raises(InvalidArgument, match="REPO/REF/PATH"):
        ref.with_path()
    with pytest.raises(InvalidArgument, match="REPO/REF/PATH"):
        parse_uri("lakefs://repo/main/").with_path()
    assert ref.with_prefix() == ("main", "")
    assert parse_uri("lakefs://repo/main/dir/").with_prefix() == ("main", "dir/")
    with pytest.raises(InvalidArgument):
        repo.with_prefix()
