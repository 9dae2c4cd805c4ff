"""A repository deleted and made again under its name, while another host still has it open.

On a shared KV (PostgreSQL) one host may delete repository ``r`` and create a new ``r`` (with
another storage namespace) while a mount on another host still holds the old one open. That old
opening must not write into the new repository -- its objects live in the old namespace, so the
new repository would name files it cannot read -- and must not show the new one's refs through
the old store (which would call a healthy repository damaged). Every write and every fresh read of
the old opening is refused, saying what happened; the new repository is left as its host made it.
"""

from __future__ import annotations

import pytest

from graveler import Graveler, GravelerConfig
from graveler.config import KVConfig
from graveler.errors import NotFound


def _host(tmp_path, name: str, url: str) -> Graveler:
    # each "host" its own backend (its own connections): another application_name, the same schema
    return Graveler(GravelerConfig(home=tmp_path / name, kv=KVConfig(url=f"{url}&application_name={name}")))


@pytest.fixture
def two_hosts(tmp_path, postgres_url):
    from graveler.kv.postgres import close_pg_backends
    from tests.pg_testutil import schema_url

    url = schema_url(postgres_url, str(tmp_path))
    a, b = _host(tmp_path, "a", url), _host(tmp_path, "b", url)
    try:
        yield a, b
    finally:
        a.close()
        b.close()
        close_pg_backends()


def _remade(tmp_path, a: Graveler, b: Graveler):
    old = a.create_repository("repo-r", f"file://{tmp_path}/ns1")
    old.upload("main", "a.txt", b"old\n")
    old.commit("main", "old")
    old.create_branch("dev", "main")
    view = old.view("main")  # what a mount holds for its main/ tree
    born = {n: old.branch_born(n) for n in ("main", "dev")}
    assert view.stat(b"a.txt").value is not None
    b.delete_repository("repo-r")
    new = b.create_repository("repo-r", f"file://{tmp_path}/ns2")
    new.upload("main", "b.txt", b"new\n")
    head = new.commit("main", "new").id
    new.create_branch("dev", "main")
    return old, new, view, born, head


def test_an_old_opening_writes_nothing_into_a_repository_made_again(tmp_path, two_hosts):
    a, b = two_hosts
    old, new, _, born, head = _remade(tmp_path, a, b)
    made_again = "deleted|made again"
    for branch in ("main", "dev"):  # the default branch too: it has a birth of its own
        with pytest.raises(NotFound, match=made_again):
            old.stage_stamped(branch, [("stale.txt", None)], born=born[branch])
    with pytest.raises(NotFound, match=made_again):
        old.upload("main", "stale.txt", b"stale\n")
    with pytest.raises(NotFound, match=made_again):
        old.commit("main", "stale", allow_empty=True)
    with pytest.raises(NotFound, match=made_again):
        old.reset("main")
    # the new repository: as its host left it, every file readable
    again = Graveler(GravelerConfig(home=tmp_path / "c", kv=b.config.kv)).repository("repo-r")
    assert again.get_branch("main").commit_id == head
    assert [it.path for it in again.list("main", delimiter="")] == [b"b.txt"]
    assert again.read("main", "b.txt") == b"new\n"
    assert not again.has_uncommitted("main") and not again.has_uncommitted("dev")


def test_an_old_opening_reads_no_ref_of_a_repository_made_again(tmp_path, two_hosts):
    """A fresh read by the old opening is refused by name (not served through the old namespace,
    where the new repository's trees are not: that would call them damaged)."""
    a, b = two_hosts
    old, _, view, _, head = _remade(tmp_path, a, b)
    with pytest.raises(NotFound, match="made again"):
        view.refresh()
    with pytest.raises(NotFound, match="made again"):
        old.view("main")
    with pytest.raises(NotFound, match="made again"):
        old.view(head)


def test_a_healthy_repository_is_its_own_after_ordinary_use(tmp_path, two_hosts):
    """The check cuts both ways: a repository changed by another host in every ordinary way
    (commits, branches, tags, merges, a reset, a branch deleted and made again) is never taken
    for another one by an opening that has it."""
    a, b = two_hosts
    ra = a.create_repository("repo-r", f"file://{tmp_path}/ns")
    rb = b.repository("repo-r")
    view = ra.view("main")
    rb.upload("main", "x", b"1")
    rb.commit("main", "one")
    rb.create_branch("dev", "main")
    rb.upload("dev", "y", b"2")
    rb.commit("dev", "two")
    rb.create_tag("v1", "dev")
    rb.merge("dev", "main", "dest-wins", "merge")
    rb.delete_branch("dev")
    rb.create_branch("dev", "v1")
    rb.upload("main", "z", b"3")
    rb.reset("main")
    born = ra.branch_born("main")
    ra.stage_stamped("main", [("w", None)], born=born)
    ra.upload("main", "w", b"4")
    c = ra.commit("main", "from a")
    assert ra.read("v1", "y") == b"2" and ra.read("main", "w") == b"4"
    assert rb.get_branch("main").commit_id == c.id
    view.refresh()  # the mount's view of main/ follows every one of those changes
    assert view.stat(b"w").value is not None and view.stat(b"z").value is None
