"""A branch file replaced behind the mount (another process's `fs upload`, another mount or
host), opened again before the kernel's attributes of it timed out, through the daemon's read
path (branch passthrough off; on S3 always): the open reads the new version whole, and its
`fstat` and `mmap` agree with what it reads."""

from __future__ import annotations

import mmap
import os

from graveler import Graveler, GravelerConfig
from tests.mount_testutil import clean_mount, needs_fuse, seed_repo

pytestmark = needs_fuse

REPO = "behind"


def test_an_open_right_after_a_change_behind_the_mount_reads_the_new_version_whole(tmp_path):
    """Found by a training-job exploration: a data loader reopening a file that a pipeline
    replaced with `fs upload` read the first 100,000 bytes of the 150,000-byte version, and
    `fstat` said 100,000 (the kernel kept the old size until its attributes timed out; a mapping
    past it died of SIGBUS). Each version, larger and smaller in turn, is now read whole at the
    first open after it."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"0" * 100_000)
    home = tmp_path / "home"
    seed_repo(home, REPO, src, tag=None)
    with clean_mount(home, REPO, tmp_path / "mnt", "--branch-timeout", "30",
                     env={"LAKEFUSE_BRANCH_PASSTHROUGH": "0"}) as mp:
        p = mp / "main" / "in" / "f"
        assert p.read_bytes() == b"0" * 100_000  # the kernel has its attributes, for 30 s
        g = Graveler(GravelerConfig(home=home))
        try:
            r = g.repository(REPO)
            for i in range(1, 7):
                data = bytes([48 + i]) * (150_000 if i % 2 else 90_000)
                r.upload("main", "in/f", data)  # behind the mount; the next open comes at once
                with open(p, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    got = f.read()
                    with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                        mapped = m[:]
                assert (len(got), size, len(mapped)) == (len(data), len(data), len(data)), i
                assert got == data and mapped == data, i
        finally:
            g.close()
