"""The spool's disk when it is small (``--cache-dir`` on a disk of its own, or any S3
repository): a file saved and closed gives its space back before the next file needs it."""

from __future__ import annotations

import errno
import os
import stat
import subprocess

import pytest

from lakefuse.mount.writes import Caller
from tests.mount_core_testutil import ino_of, seeded_repo, writable_core

ME = Caller(uid=1000, gid=100)
MiB = 1 << 20

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "small"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def write_file(fs, name: bytes, data: bytes) -> None:
    opened, _ = fs.create(ino_of(fs, "main"), name, stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    try:
        off = 0
        while off < len(data):  # (a short write, as write(2) callers do: the rest again)
            off += fs.write(opened.fh, off, data[off:off + MiB])
        fs.flush(opened.fh)
    finally:
        fs.release(opened.fh)


def test_files_written_one_after_another_each_fitting_the_spool_disk_all_fit(tmp_path, small_disk):
    """Found by an operator's tour: with the spool on a 51 MB disk of its own, ``cp`` of 30 MB
    then at once of 45 MB failed the second with ENOSPC (and staged it truncated): a saved
    file's spool copy lost its name in the pool's thread up to a second later, its space held
    meanwhile. A write that finds the disk full now removes those names first, and tries again."""
    with seeded_repo(tmp_path, "space", {"a": b"a"}) as repo, writable_core(repo, small_disk / "cache") as fs:
        first, second = os.urandom(24 * MiB), os.urandom(24 * MiB)  # each fits; both do not
        write_file(fs, b"one.bin", first)
        write_file(fs, b"two.bin", second)  # (was: ENOSPC)
        assert repo.read("main", "one.bin") == first and repo.read("main", "two.bin") == second
        # healthy refusals stay: a file larger than the disk is ENOSPC, the daemon's answer to it
        with pytest.raises(OSError) as e:
            write_file(fs, b"huge.bin", os.urandom(48 * MiB))
        assert e.value.errno == errno.ENOSPC


@pytest.mark.expect_log("the failed save is logged as an error")
def test_a_save_the_full_store_refuses_fails_enospc_not_eio(tmp_path, small_disk):
    """Found by an operator's tour: with a local store's disk full, ``cp`` failed at close with
    "Input/output error" (read as a hardware fault) where ext4 says ENOSPC, the errno programs and
    operators act on. The file stays written in the spool (its save retried, commits refused)."""
    from graveler.errors import NoSpace
    from lakefuse.mount.errors import errno_for
    from tests.graveler_testutil import make_repo

    ns = tmp_path / "ns-fullstore"
    ns.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(ns)], check=True)
    try:
        repo = make_repo(tmp_path, "fullstore")
        with writable_core(repo, tmp_path / "cache") as fs:  # (the spool on another disk: the save copies)
            write_file(fs, b"fits.bin", b"f" * MiB)  # healthy: a file the store has room for
            assert repo.read("main", "fits.bin") == b"f" * MiB
            with pytest.raises(Exception) as e:
                write_file(fs, b"big.bin", os.urandom(6 * MiB))
            assert errno_for(e.value) == errno.ENOSPC, e.value  # (what the adapter answers the close)
            with pytest.raises(NoSpace):
                repo.put_object(os.urandom(6 * MiB))
        repo.close()
    finally:
        subprocess.run(["umount", "-l", str(ns)], check=False)
