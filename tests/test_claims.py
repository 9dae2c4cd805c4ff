"""Claims on a storage namespace: gc refuses to run while another repository writes it.

Found by a backup operator's tour: a refs dump restored into another home (as a restore works:
same namespace) while the first repository went on -- or a ``kv copy`` -- and a ``gc`` of either
deleted the other's committed and staged objects (EIO on read). Now each repository claims its
namespace, and gc refuses (exit 4, naming the others) until they are deleted or, gone for good,
released; a repository alone on its namespace -- made, restored after its original was deleted,
made before claims -- collects as before.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from graveler import Graveler, GravelerConfig, claims
from graveler.errors import Conflict, NotFound


def _cli(home, *args):
    return subprocess.run([sys.executable, "-m", "lakefuse", "--home", str(home), *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def first(tmp_path):
    g = Graveler(GravelerConfig(home=tmp_path / "h1"))
    repo = g.create_repository("claimed", f"file://{tmp_path}/ns")
    repo.upload("main", "a.txt", b"a\n")
    repo.commit("main", "a")
    repo.upload("main", "staged.txt", b"staged\n")
    repo.dump_refs()
    yield g, repo
    g.close()


def test_a_repository_alone_on_its_namespace_may_collect(first):
    _, repo = first
    own = claims.check_sole_writer(repo)
    assert list(claims.list_claims(repo)) == [own] and own.startswith("claimed-")
    assert claims.check_sole_writer(repo) == own  # (the same claim every time)


def test_a_restore_beside_its_original_stops_both_gcs_until_one_is_deleted(tmp_path, first):
    g1, a = first
    r = _cli(tmp_path / "h2", "refs", "restore", "lakefs://claimed", "--storage", f"file://{tmp_path}/ns",
             "--allow-local-storage")
    assert r.returncode == 0, r.stderr
    g2 = Graveler(GravelerConfig(home=tmp_path / "h2"))
    b = g2.repository("claimed")
    with pytest.raises(Conflict, match="written by other repositories too"):
        claims.check_sole_writer(a)
    with pytest.raises(Conflict, match="written by other repositories too"):
        claims.check_sole_writer(b)
    r = _cli(tmp_path / "h1", "gc", "mark", "lakefs://claimed", "--dry-run")
    assert r.returncode == 4 and "written by other repositories too" in r.stderr and "--release" in r.stderr, r.stderr
    g2.close()
    r = _cli(tmp_path / "h2", "repo", "delete", "lakefs://claimed", "-y")
    assert r.returncode == 0, r.stderr
    assert claims.check_sole_writer(a)  # (its claim went with it)


@pytest.mark.expect_log("the restore and the release say what they claimed and released")
def test_a_restore_from_a_repository_made_before_claims_claims_for_it(tmp_path, first):
    g1, a = first
    claims.drop_own(a)  # (as a repository made before claims: none in its namespace)
    g2 = Graveler(GravelerConfig(home=tmp_path / "h2"))
    b = g2.create_repository("claimed", f"file://{tmp_path}/ns", bare=True)
    b.restore_refs()
    found = claims.list_claims(b)
    origin = [k for k in found if k.startswith("origin-")]
    assert len(origin) == 1 and len(found) == 2
    with pytest.raises(Conflict, match=origin[0]):
        claims.check_sole_writer(b)
    with pytest.raises(Conflict):
        claims.check_sole_writer(a)  # (its first gc claims, and finds the restore's)
    with pytest.raises(Conflict, match="own"):
        claims.check_sole_writer(b, [claims.own_claim(b)])
    with pytest.raises(NotFound):
        claims.check_sole_writer(b, ["no-such-claim"])
    g1.delete_repository("claimed")  # the original goes for good: the operator releases what claimed for it
    assert claims.check_sole_writer(b, origin)
    g2.close()


def test_a_kv_copy_of_a_repository_takes_a_claim_of_its_own(tmp_path, first, postgres_url):
    """``kv copy`` copies the refs, the claim ID with them, and leaves the source in use: the copy
    (its claim names the source's refs) claims for itself, and each gc refuses while both stand."""
    from tests.pg_testutil import schema_url

    g1, a = first
    claims.own_claim(a)
    g1.close()  # (kv copy refuses a source another process has open)
    url = schema_url(postgres_url, str(tmp_path))
    r = _cli(tmp_path / "h1", "kv", "copy", "--from", "lmdb", "--to", url, "--allow-local-storage", "lakefs://claimed")
    assert r.returncode == 0, r.stderr
    g1 = Graveler(GravelerConfig(home=tmp_path / "h1"))
    a = g1.repository("claimed")
    from graveler.config import KVConfig

    g2 = Graveler(GravelerConfig(home=tmp_path / "h2", kv=KVConfig(url=url)))
    b = g2.repository("claimed")
    with pytest.raises(Conflict, match="written by other repositories too"):
        claims.check_sole_writer(b)
    assert claims.own_claim(b) != claims.own_claim(a)
    with pytest.raises(Conflict):
        claims.check_sole_writer(a)
    g1.close()
    r = _cli(tmp_path / "h1", "repo", "delete", "lakefs://claimed", "-y")  # (the move's last step)
    assert r.returncode == 0, r.stderr
    assert claims.check_sole_writer(b)
    g2.close()


def test_a_dump_of_a_namespace_that_lost_its_trees_is_refused_and_a_shared_one_is_said(tmp_path, first):
    """Found by a backup operator's tour: with the namespace moved away, ``refs dump`` said it wrote
    a manifest (it made a namespace holding only the dump's tables) and ``refs restore`` of it
    succeeded into a repository nothing of which could be read. Both refuse now (exit 5); and a dump
    of a namespace another repository writes says that the next dump of that one replaces it."""
    import shutil

    g1, a = first
    r = _cli(tmp_path / "h2", "refs", "restore", "lakefs://claimed", "--storage", f"file://{tmp_path}/ns",
             "--allow-local-storage")
    assert r.returncode == 0, r.stderr
    r = _cli(tmp_path / "h1", "refs", "dump", "lakefs://claimed")
    assert r.returncode == 0 and "written by other repositories too" in r.stderr and "--manifest" in r.stderr, r.stderr
    trees = {c.meta_range_id for c in a.list_commits()} - {""}
    g1.close()
    shutil.move(tmp_path / "ns", tmp_path / "moved")
    r = _cli(tmp_path / "h1", "refs", "dump", "lakefs://claimed")
    assert r.returncode == 5 and "refs not dumped" in r.stderr, r.stderr
    for mr in trees:  # (what a namespace restored from a partial copy lacks: the commits' trees, not the dump)
        (tmp_path / "moved" / "_lakefs" / mr).unlink(missing_ok=True)
    r = _cli(tmp_path / "h3", "refs", "restore", "lakefs://claimed", "--storage", f"file://{tmp_path}/moved",
             "--allow-local-storage")
    assert r.returncode == 5 and "is not in the namespace" in r.stderr, r.stderr
