"""``lakefuse fsck``: a whole repository checked once, both ways.

Found by a damage tour: there was no way to check a repository after a disk incident or a
restore; damage was found only when something happened to read it. fsck reads every record,
table and (on request) object and lists every problem; healthy repositories made by ordinary
use -- commits with many ranges, merges, reverts, tags, staged changes, gc, a restore from a
dump, an S3 namespace -- report none.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from graveler import Graveler, GravelerConfig
from graveler.config import RangeParams
from graveler.kv.base import COMMITS
from graveler.model import Entry


def _cli(home, *args):
    return subprocess.run([sys.executable, "-m", "lakefuse", "--home", str(home), *args], capture_output=True,
                          text=True, timeout=300)


def _history(g: Graveler, ns: str, n: int = 1500):
    repo = g.create_repository("fsck-repo", ns)
    repo.stage_many("main", [(f"d{i % 7}/f{i:05d}", repo.put_object(f"content {i}\n".encode())) for i in range(n)])
    repo.commit("main", "many ranges")
    repo.create_branch("dev", "main")
    repo.upload("dev", "dev.txt", b"dev\n")
    repo.delete("dev", "d1/f00001")
    repo.commit("dev", "dev")
    repo.upload("main", "main.txt", b"main\n")
    repo.commit("main", "main")
    repo.merge("dev", "main", message="merge")
    repo.create_tag("v1", "main")
    repo.revert("main", "main", parent_number=1, message="revert the merge")
    repo.upload("main", "staged.txt", b"staged, not committed\n")
    repo.upload("dev", "d0/f00000", b"staged over a committed file\n")
    return repo


@pytest.fixture
def history(tmp_path):
    # small ranges: many of them, so damage to one is one among many
    g = Graveler(GravelerConfig(home=tmp_path / "home", range_params=RangeParams(max_range_size=20_000, raggedness=100)))
    repo = _history(g, f"file://{tmp_path}/ns")
    yield g, repo
    g.close()


def test_a_healthy_repository_made_by_ordinary_use_has_no_problem(tmp_path, history):
    g, repo = history
    for objects in ("none", "exist", "md5"):
        rep = repo.fsck(objects)
        assert rep.healthy, rep.problems
        assert rep.commits == 6 and rep.branches == 2 and rep.tags == 1 and rep.metaranges >= 4 and rep.ranges >= 10
    assert rep.objects >= 1504
    repo.dump_refs()
    g.close()
    r = _cli(tmp_path / "home", "fsck", "lakefs://fsck-repo", "--objects", "md5")
    assert r.returncode == 0 and "fsck-repo: healthy" in r.stdout, (r.stdout, r.stderr)
    # restored elsewhere from its dump, and after a gc-shaped deletion of nothing it needs
    r = _cli(tmp_path / "home2", "refs", "restore", "lakefs://fsck-repo", "--storage", f"file://{tmp_path}/ns",
             "--allow-local-storage")
    assert r.returncode == 0, r.stderr
    r = _cli(tmp_path / "home2", "fsck", "lakefs://fsck-repo", "--objects", "exist", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["healthy"], r.stdout


@pytest.mark.s3
def test_a_healthy_s3_repository_has_no_problem(tmp_path, s3_bucket, s3_config):
    g = Graveler(GravelerConfig(home=tmp_path / "home", store=s3_config))
    repo = _history(g, f"s3://{s3_bucket}/ns", n=100)
    rep = repo.fsck("md5")
    assert rep.healthy, rep.problems
    g.close()


def _table_files(ns):
    return sorted(p for p in (ns / "_lakefs").iterdir() if len(p.name) == 64)


def test_every_kind_of_damage_is_listed_each_once(tmp_path, history):
    g, repo = history
    ns = tmp_path / "ns"
    head = repo.get_commit("main")
    tag = repo.get_commit("v1")
    # a commit record changed in place
    forged = dataclasses.replace(tag, message=tag.message + "!")
    repo._env.write(lambda t: t.put(COMMITS, tag.id.encode(), forged.to_bytes()))
    # a range flipped, a range deleted (in the tree of the head)
    infos = repo._committed.list_ranges(head.meta_range_id)
    flipped, gone = ns / "_lakefs" / infos[1].id, ns / "_lakefs" / infos[3].id
    data = bytearray(flipped.read_bytes())
    data[100] ^= 0xFF
    flipped.write_bytes(bytes(data))
    gone.unlink()
    # an object of another size, one missing, one of the same size and other bytes
    e1, e2, e3 = (repo.get("main", p) for p in ("d2/f00002", "d3/f00003", "d4/f00004"))
    with open(ns / e1.address, "ab") as f:
        f.write(b"more")
    os.unlink(ns / e2.address)
    with open(ns / e3.address, "r+b") as f:
        f.write(b"X")
    g.close()
    g = Graveler(GravelerConfig(home=tmp_path / "home"))
    repo = g.repository("fsck-repo")
    rep = repo.fsck("none")
    kinds = sorted((p.kind, p.name) for p in rep.problems)
    assert ("commit", tag.id) in kinds and ("range", infos[1].id) in kinds and ("range", infos[3].id) in kinds, kinds
    assert len(kinds) == 3, rep.problems
    rep = repo.fsck("exist")
    objs = [p for p in rep.problems if p.kind == "object"]
    assert {p.name.split(" ")[0] for p in objs} >= {"d2/f00002", "d3/f00003"}, objs  # (in ranges still readable)
    rep = repo.fsck("md5")
    assert any(p.name.startswith("d4/f00004") and "MD5" in p.detail for p in rep.problems), rep.problems
    g.close()
    r = _cli(tmp_path / "home", "fsck", "lakefs://fsck-repo")
    assert r.returncode == 5 and "3 problem(s)" in r.stdout and f"commit {tag.id}" in r.stdout, (r.stdout, r.stderr)


def test_a_branch_record_lost_while_its_birth_stays_is_a_problem_and_deleted_branches_are_not(tmp_path, history):
    # the damage tour: a flipped LMDB page can hide a branch record (LMDB keeps no checksums), and the
    # branch then simply was not there. Its birth, made and dropped with the record, tells.
    g, repo = history
    repo.create_branch("gone-for-good", "main")
    repo.delete_branch("gone-for-good")  # (an ordinary delete drops both)
    repo.create_branch("again", "main")
    repo.delete_branch("again")
    repo.create_branch("again", "dev")  # (made again: one birth, one record)
    assert repo.fsck("none").healthy
    from graveler.kv.base import BRANCHES
    repo._env.write(lambda t: t.delete(BRANCHES, b"dev"))  # the record lost, as a damaged page loses it
    rep = repo.fsck("none")
    assert [(p.kind, p.name) for p in rep.problems] == [("branch", "dev")], rep.problems
    assert "record is missing" in rep.problems[0].detail
    g.close()
