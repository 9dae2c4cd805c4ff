"""Repository calls the CLI and the mount use instead of reaching into the managers."""

from __future__ import annotations

import io

import pytest

from graveler import Graveler, Repository
from graveler.errors import InvalidArgument, ReadOnlyRef
from graveler.model import AddressType
from tests.graveler_testutil import make_graveler


def test_put_object_uploads_without_staging(tmp_path):
    g: Graveler = make_graveler(tmp_path)
    repo: Repository = g.create_repository("api", f"file://{tmp_path}/ns")
    src = tmp_path / "f.bin"
    src.write_bytes(b"hello")
    for source in (b"hello", str(src), io.BytesIO(b"hello")):
        e = repo.put_object(source, content_type="text/plain", metadata={"k": "v"})
        assert (e.size, e.etag, e.content_type, e.metadata) == (5, "5d41402abc4b2a76b9719d911017c592", "text/plain", {"k": "v"})
        assert e.address_type == AddressType.RELATIVE and repo.read_entry(e) == b"hello"
        assert repo.physical_address(e) == f"file://{tmp_path}/ns/{e.address}"
    assert not repo.has_uncommitted("main")  # nothing was staged
    repo.stage("main", "a", e)
    assert repo.exists("main", "a") and not repo.exists("main", "b")


def test_count_commits_and_home_queries(tmp_path):
    g = make_graveler(tmp_path)
    assert not g.has_repository("api")
    repo = g.create_repository("api", f"file://{tmp_path}/ns")
    assert g.has_repository("api") and not g.has_refs_dump(f"file://{tmp_path}/ns")
    assert repo.count_commits() == 1
    repo.upload("main", "x", b"1")
    c = repo.commit("main", "one")
    assert repo.count_commits() == 2
    repo.dump_refs()
    assert g.has_refs_dump(f"file://{tmp_path}/ns/")
    assert repo.find_merge_base("main", c.id).id == c.id
    assert [r.name for r in g.list_repositories()] == ["api"]


def test_delete_prefix(tmp_path):
    repo = make_graveler(tmp_path).create_repository("api", f"file://{tmp_path}/ns")
    repo.stage_many("main", [(f"d/{i}", repo.put_object(b"x")) for i in range(5)] + [("e", repo.put_object(b"y"))])
    repo.commit("main", "files")
    repo.create_tag("v1", "main")
    with pytest.raises(InvalidArgument):
        repo.delete_prefix("main", "")
    with pytest.raises(ReadOnlyRef):
        repo.delete_prefix("v1", "d/")
    assert repo.delete_prefix("main", "d/", batch=2) == 5
    assert [i.path for i in repo.list("main", delimiter="")] == [b"e"]
    assert repo.delete_prefix("main", "", allow_all=True) == 1
    assert list(repo.list("main")) == []


def test_a_tag_moved_with_force_is_never_missing_to_its_readers(tmp_path, kv_backend):
    """Found by an ML engineer's tour: a tag moved for training jobs ("latest") could only be deleted
    and made again; its readers found it missing (ENOENT through the mount) ~0.25 s each time.
    ``create_tag(force=True)`` moves it in one transaction; without it an existing tag stays refused."""
    import threading

    from graveler.errors import AlreadyExists, NotFound

    g = make_graveler(tmp_path)  # (on kv_backend's backend)
    try:
        repo = g.create_repository("tags", f"file://{tmp_path}/ns")
        commits = []
        for i in range(3):
            repo.upload("main", "x", str(i).encode())
            commits.append(repo.commit("main", f"c{i}"))
        repo.create_tag("latest", commits[0].id)
        with pytest.raises(AlreadyExists):
            repo.create_tag("latest", commits[1].id)  # healthy: no force, no move
        missing, stop = [], threading.Event()

        def read():
            while not stop.is_set():
                try:
                    repo.resolve("latest")
                except NotFound as e:
                    missing.append(e)

        t = threading.Thread(target=read)
        t.start()
        try:
            for i in range(60):
                assert repo.create_tag("latest", commits[i % 3].id, force=True).commit_id == commits[i % 3].id
        finally:
            stop.set()
            t.join()
        assert not missing and repo.get_tag("latest").commit_id == commits[59 % 3].id
    finally:
        g.close()
