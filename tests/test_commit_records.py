"""A commit record is checked against its ID (the hash of its content, lakeFS's), both ways.

Found by a damage tour: a commit record whose metarange ID was changed in place (another commit's
tree) was served under its ID -- the branch and the tag on it silently showed another tree, ``diff``
between them was empty -- and a changed message was shown under the old ID. Such a record is now
``CorruptedData`` naming the refs database (exit 5); every commit ordinary use makes (commits with
metadata and any message, merges, reverts, restores from a refs dump) passes.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from graveler import Graveler, GravelerConfig
from graveler.errors import CorruptedData
from graveler.kv.base import COMMITS
from graveler.refs import manager as refs_manager
from tests.graveler_testutil import make_repo


def _history(repo):
    repo.upload("main", "a.txt", b"a\n")
    first = repo.commit("main", "première: ünïcode, \"quotes\"\nand a second line", metadata={"k": "v", "": "e"})
    repo.create_branch("dev", "main")
    repo.upload("dev", "b.txt", b"b\n")
    repo.commit("dev", "on dev")
    repo.upload("main", "c.txt", b"c\n")
    repo.commit("main", "on main")
    repo.merge("dev", "main", message="merge dev")
    repo.upload("main", "d.txt", b"d\n")
    repo.commit("main", "d")
    repo.revert("main", "main", message="revert d")
    repo.create_tag("v1", "main~1")
    return repo


def test_every_commit_ordinary_use_makes_passes(tmp_path):
    repo = _history(make_repo(tmp_path, "crec"))
    refs_manager._VERIFIED.clear()  # (as a fresh process: nothing checked yet)
    ids = [c.id for c in repo.log("main", first_parent=False)]
    assert len(ids) >= 7
    for cid in ids:
        assert repo.get_commit(cid).id == cid
    assert {c.id for c in repo.list_commits()} >= set(ids)
    # and a repository restored from its refs dump (the restore checks them too)
    repo.dump_refs()
    g = Graveler(GravelerConfig(home=tmp_path / "other", kv=dataclasses.replace(repo.config.kv, url="memory://dump")))
    restored = g.open_refs_dump(repo.storage_namespace, name="crec2")
    refs_manager._VERIFIED.clear()
    assert [c.id for c in restored.log("main", first_parent=False)] == ids


@pytest.mark.parametrize("change", ["meta_range_id", "message"])
def test_a_commit_record_changed_in_place_is_damage(tmp_path, change):
    repo = _history(make_repo(tmp_path, "crec"))
    head = repo.get_commit("main")
    other = repo.get_commit("v1")
    forged = dataclasses.replace(head, **({"meta_range_id": other.meta_range_id} if change == "meta_range_id"
                                          else {"message": head.message + "!"}))
    assert forged.id == head.id
    env = repo._env
    env.write(lambda t: t.put(COMMITS, head.id.encode(), forged.to_bytes()))
    for read in (lambda: repo.get_commit("main"), lambda: list(repo.log("main")), lambda: list(repo.list_commits()),
                 lambda: repo.list("main")):
        with pytest.raises(CorruptedData, match=f"damaged commit record {head.id}.*refs"):
            read()
    r = subprocess.run([sys.executable, "-m", "lakefuse", "--home", str(tmp_path / "home"), "log", "lakefs://crec/main"],
                       capture_output=True, text=True)
    assert r.returncode == 5 and "damaged commit record" in r.stderr, r.stderr
