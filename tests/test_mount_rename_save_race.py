"""A rename of an open file, or of a directory above it, while the file is being saved
(an fsync from another thread) moves the file whole: the old path does not come back with
the saved content, and the new one holds the last content written.

Found by fsx run in a directory that another process renamed back and forth: fsx's
``msync`` (an fsync of the file) saved it at the old path after the rename had moved the
branch's keys, so the old directory reappeared and the moved file kept older bytes."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.mount_testutil import empty_repo_mount, needs_fuse

pytestmark = needs_fuse

REPO = "racerepo"
ROUNDS = 60


@pytest.fixture(scope="module")
def main(tmp_path_factory):
    with empty_repo_mount(tmp_path_factory.mktemp("race"), REPO, "--branch-timeout", "0.1") as main:
        yield main


def _writer(fd: int, stop: threading.Event, last: list[bytes], errors: list[BaseException]) -> None:
    i = 0
    try:
        while not stop.is_set():
            i += 1
            data = f"version {i}\n".encode() * 2000  # ~22 KB: each save uploads an object
            os.pwrite(fd, data, 0)
            last[0] = data
            if i % 2:
                os.fsync(fd)
            else:  # a close of a duplicate: FUSE's flush, which saves too (and, unlike fsync, takes no inode lock)
                os.close(os.dup(fd))
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


@pytest.mark.parametrize("what", ["directory", "file"])
def test_a_rename_during_a_save_moves_the_file_whole(main, what):
    top = main / what
    top.mkdir()
    f = top / "f" if what == "directory" else main / "file-f"
    names = [top, main / f"{what}-other"] if what == "directory" else [f, main / "file-g"]
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    stop = threading.Event()
    last: list[bytes] = [b""]
    errors: list[BaseException] = []
    t = threading.Thread(target=_writer, args=(fd, stop, last, errors))
    t.start()
    try:
        for i in range(ROUNDS):
            os.rename(names[i % 2], names[(i + 1) % 2])
            time.sleep(0.01)
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    os.fsync(fd)
    os.close(fd)
    now = names[ROUNDS % 2]
    gone = names[(ROUNDS + 1) % 2]
    time.sleep(0.3)  # past the branch timeout: the kernel asks the daemon again
    assert not gone.exists(), f"{gone.name} came back: {sorted(os.listdir(main))}"
    final = now / "f" if what == "directory" else now
    assert final.read_bytes() == last[0]
