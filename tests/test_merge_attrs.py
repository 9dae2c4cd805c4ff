"""Merges take a file's content and its attributes apart, as git takes content and mode apart.

Found by a git-minded ETL team's tour: a ``touch`` (or a ``chmod``) through the mount on one
branch and a new version of the same file on another made their merge a conflict, where git
merges a mode change with a content change cleanly and a touch is no change to it at all. Now:
a side that changed only a file's times (mtime/atime) leaves it to the other side; a side that
changed only its mode or owner (chmod/chown) and one that changed only its content give a file
with both changes (a file's xattrs count as its content here); anything else both sides changed differently is a conflict, as before.
"""

from __future__ import annotations

import pytest

from graveler.errors import MergeConflict
from graveler.model import Entry
from graveler.objects import POSIX_ATIME, POSIX_GID, POSIX_MODE, POSIX_MTIME, POSIX_UID
from tests.graveler_testutil import make_repo

T0, T1, T2 = "1700000000000000000", "1700000100000000000", "1700000200000000000"


def _entry(content: str, mode: str = "100644", mtime: str = T0, **extra) -> Entry:
    return Entry(address=f"data/{content}", size=len(content), etag=f"{content:0>32}"[:32], last_modified_ns=int(mtime),
                 metadata={POSIX_MODE: mode, POSIX_UID: "0", POSIX_GID: "0", POSIX_MTIME: mtime, POSIX_ATIME: mtime,
                           **extra})


@pytest.fixture
def repo(tmp_path):
    r = make_repo(tmp_path, "mattr")
    r.stage("main", "f", _entry("a"))
    r.commit("main", "base")
    r.create_branch("dev", "main")
    return r


def _merge(repo, dest_change: Entry, src_change: Entry) -> Entry:
    repo.stage("main", "f", dest_change)
    repo.commit("main", "dest's change")
    repo.stage("dev", "f", src_change)
    repo.commit("dev", "source's change")
    repo.merge("dev", "main", message="merge")
    return repo.get("main", "f")


def test_a_touch_on_one_side_and_new_content_on_the_other_merge_to_the_new_content(repo):
    got = _merge(repo, dest_change=_entry("a", mtime=T1), src_change=_entry("bb", mtime=T2))
    assert got.identity() == _entry("bb", mtime=T2).identity()


def test_new_content_on_the_destination_stays_over_a_touch_on_the_source(repo):
    got = _merge(repo, dest_change=_entry("bb", mtime=T2), src_change=_entry("a", mtime=T1))
    assert got.identity() == _entry("bb", mtime=T2).identity()


def test_two_touches_merge_to_the_destinations(repo):
    got = _merge(repo, dest_change=_entry("a", mtime=T1), src_change=_entry("a", mtime=T2))
    assert got.metadata[POSIX_MTIME] == T1


@pytest.mark.parametrize("chmod_on", ["dest", "source"])
def test_a_chmod_on_one_side_and_new_content_on_the_other_give_both(repo, chmod_on):
    chmod, content = _entry("a", mode="100755"), _entry("bb", mtime=T2)
    got = _merge(repo, *((chmod, content) if chmod_on == "dest" else (content, chmod)))
    assert (got.etag, got.size, got.metadata[POSIX_MODE], got.metadata[POSIX_MTIME]) == (
        content.etag, 2, "100755", T2)
    assert got.address == content.address


@pytest.mark.parametrize("dest_change,src_change", [
    (_entry("bb"), _entry("ccc")),  # two contents
    (_entry("a", mode="100755"), _entry("a", mode="100600")),  # two modes
    (_entry("bb", mode="100755"), _entry("ccc")),  # content and mode against content
    (_entry("a", **{"lakefuse-xattr-user.k": "1"}), _entry("a", **{"lakefuse-xattr-user.k": "2"})),  # xattrs
], ids=["contents", "modes", "content+mode", "xattrs"])
def test_anything_else_both_sides_changed_differently_is_still_a_conflict(repo, dest_change, src_change):
    with pytest.raises(MergeConflict):
        _merge(repo, dest_change, src_change)


def test_an_xattr_is_part_of_the_content_a_chmod_merges_with(repo):
    got = _merge(repo, dest_change=_entry("a", mode="100755"), src_change=_entry("a", **{"lakefuse-xattr-user.k": "v"}))
    assert (got.metadata[POSIX_MODE], got.metadata["lakefuse-xattr-user.k"]) == ("100755", "v")


def test_a_deletion_against_a_touch_is_still_a_conflict(repo):
    """(git: modify/delete; a touch is a modification to whoever made it on purpose)"""
    repo.delete("main", "f")
    repo.commit("main", "deleted")
    repo.stage("dev", "f", _entry("a", mtime=T1))
    repo.commit("dev", "touched")
    with pytest.raises(MergeConflict):
        repo.merge("dev", "main", message="merge")
