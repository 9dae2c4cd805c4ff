"""readdir reads its next page ahead (lakefuse.mount.listing.fill_ahead) while the kernel takes
in a reply: driven here as the FUSE adapter drives it, the listing is the same -- every name
once, in order, with the offsets a seek resumes at -- on immutable and branch trees, and a
rename between two requests leaves the read-ahead undone rather than wrong."""

from __future__ import annotations

import pytest

from lakefuse.mount.fs import Filesystem, FsConfig
from tests.mount_core_testutil import ino_of, readdir_all, readdir_page, seeded_repo, writable_core

N = 23
FILES = {f"d/f{i:03d}": b"x" for i in range(N)}
FILES["d/sub/y"] = b"y"


@pytest.fixture
def repo(tmp_path, request):
    with seeded_repo(tmp_path, "ahead", FILES, request) as r:
        yield r


def drive(fs, ino: int, per_request: int, between=None) -> list[tuple[bytes, int]]:
    """readdir requests of ``per_request`` entries each, reading ahead after each reply as the
    adapter does (``between(request_no)`` runs between requests); (name, offset) pairs."""
    fh = fs.opendir(ino)
    out, off, req = [], 0, 0
    try:
        while True:
            n = 0
            while n < per_request:
                entries = readdir_page(fs, fh, off)
                if not entries:
                    return out
                for e in entries[:per_request - n]:
                    fs.accept(fh, e)
                    out.append((e.name, e.offset))
                    off = e.offset
                    n += 1
            if fs.readdir_wants_ahead(fh, off, n):
                fs.readdir_ahead(fh, off)
            req += 1
            if between is not None:
                between(req)
    finally:
        fs.releasedir(fh)


@pytest.mark.parametrize("tree", ["v1", "main"])
@pytest.mark.parametrize("per_request", [1, 2, 3, 5, 7, 50])
def test_reading_ahead_lists_every_name_once_in_order(repo, tmp_path, tree, per_request):
    with writable_core(repo, tmp_path / "cache", readdir_page=4) as fs:
        d = ino_of(fs, f"{tree}/d")
        want = [(e.name, e.offset) for e, _ in readdir_all(fs, d)]
        assert len(want) == N + 1
        assert drive(fs, d, per_request) == want


def test_reading_ahead_reads_pages_before_they_are_asked_for(repo):
    fs = Filesystem(repo, FsConfig(readdir_page=4))
    d = ino_of(fs, "v1/d")
    fh = fs.opendir(d)
    fs.readdir_fill(fh, 0)
    assert [e.offset for e in fs.readdir_fast(fh, 0)] == [1, 2, 3, 4]
    assert not fs.readdir_wants_ahead(fh, 1, 1)  # three left: the next request of one has them
    assert fs.readdir_wants_ahead(fh, 3, 3)  # one left: the next request of three would run out
    fs.readdir_ahead(fh, 3)
    assert [e.offset for e in fs.readdir_fast(fh, 3)] == [4, 5, 6, 7, 8]  # kept, and the next page
    fs.readdir_ahead(fh, 99)  # a seek moved on meanwhile: nothing read, nothing lost
    assert [e.offset for e in fs.readdir_fast(fh, 3)] == [4, 5, 6, 7, 8]
    fs.releasedir(fh)


def test_a_rename_between_requests_leaves_the_read_ahead_undone(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache", readdir_page=4) as fs:
        d = ino_of(fs, "main/d")
        main = ino_of(fs, "main")

        def rename(req):
            if req == 2:
                fs.rename(main, b"d", main, b"e", 0)

        got = drive(fs, d, 3, rename)
        assert sorted(n for n, _ in got) == sorted({n for n, _ in got})  # no name twice
        assert [n for n, _ in got] == sorted(n for n, _ in got)  # in order, under the new name too
        assert len(got) == N + 1
