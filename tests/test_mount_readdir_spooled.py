"""A listing of a branch directory (``READDIRPLUS``: names with their attributes) shows a
file being written as its open handles see it -- the spool file's size and times -- not as
its last save staged it. The kernel takes a listing's attributes for the inode it already
has: a staged size smaller than the written one cut reads of the open file short (found by
fsx while ``ls -la`` ran beside it: "short check read")."""

from __future__ import annotations

import os

import pytest

from tests.mount_testutil import empty_repo_mount, needs_fuse

pytestmark = needs_fuse

REPO = "plusrepo"


@pytest.fixture(scope="module")
def main(tmp_path_factory):
    with empty_repo_mount(tmp_path_factory.mktemp("plus"), REPO, "--branch-timeout", "0.1") as main:
        yield main


def test_a_listing_shows_a_file_being_written_as_its_handles_see_it(main):
    d = main / "plus"
    d.mkdir()
    f = d / "growing.bin"
    saved = os.urandom(100_000)
    more = os.urandom(200_000)
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, saved, 0)
        os.fsync(fd)  # staged: 100,000 bytes
        os.pwrite(fd, more, len(saved))  # written, not saved yet: 300,000 bytes
        for _ in range(3):
            with os.scandir(d) as it:  # READDIRPLUS: attributes with the names
                sizes = {e.name: e.stat().st_size for e in it}
            seen = (sizes, os.fstat(fd).st_size, len(os.pread(fd, 400_000, 0)), f.stat().st_size)
            assert seen == ({"growing.bin": 300_000}, 300_000, 300_000, 300_000)
            assert os.pread(fd, 400_000, 0) == saved + more
    finally:
        os.close(fd)
    assert f.read_bytes() == saved + more
