"""Control files and listings at their edges, through a real FUSE mount: what a new user
meets first (an oversized request, ``ls -a``, writing an info file, an empty request)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.mount_testutil import MountProc, lakefuse_cmd, needs_fuse

pytestmark = needs_fuse

REPO = "crepo"


def cli(home, *args) -> None:
    r = subprocess.run(lakefuse_cmd(home, *args), capture_output=True, text=True)
    assert r.returncode == 0, f"lakefuse {' '.join(args)} failed: {r.stderr}"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("chome")
    src = tmp_path_factory.mktemp("csrc")
    (src / "in").mkdir()
    (src / "in" / "a.txt").write_bytes(b"committed a\n")
    cli(h, "repo", "create", f"lakefs://{REPO}")
    cli(h, "fs", "upload", "--recursive", "-s", str(src / "in"), f"lakefs://{REPO}/main/in")
    cli(h, "commit", f"lakefs://{REPO}/main", "-m", "base")
    cli(h, "tag", "create", f"lakefs://{REPO}/v1", f"lakefs://{REPO}/main")
    return h


@pytest.fixture(scope="module")
def mnt(home, tmp_path_factory):
    mp = tmp_path_factory.mktemp("cmnt")
    m = MountProc(home, REPO, mp, "--branch-timeout", "0.2").start()
    yield mp
    m.stop()
    assert "Traceback" not in m.log(), m.log()


def branch(mnt: Path, name: str) -> Path:
    p = mnt / name
    if not p.exists():
        os.mkdir(p)  # mkdir at the mount root makes a branch
    return p


def head_of(b: Path) -> str:
    return (b / ".lakefuse" / "head").read_text().strip()


def outcome(b: Path, name: str) -> dict:
    return json.loads((b / ".lakefuse" / name).read_text())


def test_oversized_control_request_never_runs(mnt, tmp_path):
    b = branch(mnt, "big")
    (b / "f.txt").write_text("f")
    head = head_of(b)
    # one write(2) of 10 MiB: the kernel splits it; the piece past 1 MiB fails with EFBIG,
    # and the close fails the same way: the first MiB is not run as a request of its own
    fd = os.open(b / ".lakefuse" / "commit", os.O_WRONLY | os.O_TRUNC)
    data = memoryview(b"m" * (10 << 20))
    with pytest.raises(OSError) as ei:
        while data:
            data = data[os.write(fd, data):]
    assert ei.value.errno == errno.EFBIG
    with pytest.raises(OSError) as ei:
        os.close(fd)
    assert ei.value.errno == errno.EFBIG
    assert head_of(b) == head
    assert (b / ".lakefuse" / "status").read_text() == "A f.txt\n"
    back = outcome(b, "commit")
    assert not back["ok"] and back["error_type"] == "NotRun" and "at most 1048576 bytes" in back["error"]
    # the same from the shell: cat fails, nothing is committed
    msg = tmp_path / "10MB.msg"
    msg.write_bytes(b"m" * (10 << 20))
    r = subprocess.run(["bash", "-c", f"cat {msg} > {b}/.lakefuse/commit"], capture_output=True, text=True)
    assert r.returncode != 0 and "too large" in r.stderr.lower(), r.stderr
    assert head_of(b) == head
    # a request of its own size afterwards runs
    (b / ".lakefuse" / "commit").write_text("a real commit\n")
    assert head_of(b) != head and outcome(b, "commit")["commit"]["message"] == "a real commit"
