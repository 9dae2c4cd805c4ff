"""systemd/lakefuse@.service as systemd would run it, and the fstab form (mount -t fuse.lakefuse)."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from graveler import Graveler
from graveler import GravelerConfig
from lakefuse.mount.daemon import mount_type
from tests.graveler_testutil import FAST_KV
from tests.mount_testutil import force_unmount, needs_fuse

pytestmark = needs_fuse

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "lakefuse@.service"
BIN = Path(sys.executable).parent


def unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def expand(cmd: str, instance: str, mountpoint: Path, env: dict[str, str]) -> list[str]:
    """systemd's specifiers and $VAR (a separate word: split at whitespace, dropped when empty)."""
    cmd = cmd.replace("/mnt/%i", str(mountpoint)).replace("%i", instance).removeprefix("-")  # ("-": failure ignored)
    words = []
    for w in shlex.split(cmd):
        if w.startswith("$") and w[1:].isidentifier():
            words += env.get(w[1:], "").split()
        else:
            words.append(w)
    if words[0] == "/usr/local/bin/lakefuse":
        words[0] = str(BIN / "lakefuse")
    return words


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    g = Graveler(GravelerConfig(home=h, kv=FAST_KV))
    r = g.create_repository("svc", f"file://{tmp_path}/ns")
    r.upload("main", "hello.txt", b"hello from a unit\n")
    r.commit("main", "one")
    g.close()
    return h


def test_unit_sends_ready_once_the_mount_answers(home, tmp_path):
    s = unit_settings()
    assert s["Type"] == ["notify"]
    assert s["EnvironmentFile"] == ["-/etc/lakefuse/%i.env"]
    assert s["UMask"] == ["0077"]  # (what it writes under its home is the daemon's user's alone)
    env_file = tmp_path / "svc.env"  # what /etc/lakefuse/svc.env would hold
    env_file.write_text(f"LAKEFUSE_HOME={home}\nLAKEFUSE_MOUNT_OPTIONS=--branch-timeout 0.5\n")
    env = {k: v for k, _, v in (e.partition("=") for e in s["Environment"])}
    env.update(dict(line.split("=", 1) for line in env_file.read_text().splitlines()))
    mp = tmp_path / "mnt"
    mp.mkdir()
    start = expand(s["ExecStart"][0], "svc", mp, env)
    assert start[1:5] == ["-v", "mount", "lakefs://svc", str(mp)] and "-f" in start and "--branch-timeout" in start
    # (-v: the journal says what the daemon did, not only what failed -- an operator's tour read nothing
    # of mounts, commits or stops there; "-": a stop while a writer holds a file fails umount, and the
    # SIGTERM after it unmounts saving the file: not the unit's failure)
    assert s["ExecStop"][0].startswith("-/usr/local/bin/lakefuse umount ")
    sock_dir = tempfile.mkdtemp(prefix="lakefuse-unit-")
    sock_path = os.path.join(sock_dir, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(0.2)
    proc = subprocess.Popen(start, env={**os.environ, **env, "NOTIFY_SOCKET": sock_path},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ready = None
        deadline = time.monotonic() + 60
        while ready is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                msg = sock.recv(4096).decode()
            except socket.timeout:
                continue
            if "READY=1" in msg.splitlines():
                # at the moment READY=1 arrives the mount is there and answers
                assert mount_type(str(mp)) == "fuse.lakefuse"
                ready = (mp / "main" / "hello.txt").read_bytes()
                assert "STATUS=serving " + str(mp) in msg
        assert ready == b"hello from a unit\n", proc.stderr.read() if proc.poll() is not None else ""
        stop = expand(s["ExecStop"][0], "svc", mp, env)
        r = subprocess.run(stop, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert proc.wait(30) == 0
        assert mount_type(str(mp)) is None
    finally:
        sock.close()
        shutil.rmtree(sock_dir, ignore_errors=True)
        force_unmount(mp)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(shutil.which("mount") is None or not os.path.exists("/sbin/mount.fuse3"),
                    reason="no mount(8) or mount.fuse3")
def test_fstab_form(home, tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    # In fstab the type is fuse.lakefuse and mount.fuse3 runs `lakefuse` from root's PATH
    # (/usr/local/bin when installed). mount(8) resets PATH, so the test names the program with
    # mount.fuse3's PROGRAM#SOURCE form: the same command line reaches lakefuse.
    opts = f"_netdev,nofail,x-systemd.automount,home={home},branch_timeout=0.5,log={tmp_path}/m.log"
    r = subprocess.run(["mount", "-t", "fuse3", f"{BIN / 'lakefuse'}#lakefs://svc", str(mp), "-o", opts],
                       capture_output=True, text=True, timeout=90)
    try:
        assert r.returncode == 0, r.stderr + r.stdout
        assert (mp / "main" / "hello.txt").read_bytes() == b"hello from a unit\n"
        u = subprocess.run([str(BIN / "lakefuse"), "umount", str(mp)], capture_output=True, text=True, timeout=60)
        assert u.returncode == 0, u.stderr
    finally:
        force_unmount(mp)


def test_mount_helper_argv():
    from lakefuse.cli.mount import from_mount_helper

    assert from_mount_helper(["lakefs://r", "/m", "-o", "rw,_netdev,home=/h,cache_size=2G,allow_other,x-a.b"]) == [
        "--home", "/h", "mount", "lakefs://r", "/m", "--cache-size", "2G", "-o", "rw,allow_other"]
    assert from_mount_helper(["mount", "lakefs://r", "/m"]) == ["mount", "lakefs://r", "/m"]


def test_what_a_daemon_said_as_it_stopped_reaches_umount_without_a_logs_directory(tmp_path):
    """Found by a data engineer on a flaky network: a `-f` mount without --log (systemd's
    unit runs one so) has no <home>/logs; its daemon could not write what failed as it stopped
    ("cannot write ... unmount-PID.txt"), so `lakefuse umount` said nothing and exited 0."""
    import logging

    from lakefuse.mount.daemon import ErrorsSaid, _unmount_report

    path = str(tmp_path / "home" / "logs" / f"unmount-{os.getpid()}.txt")
    said = ErrorsSaid()
    said.handle(logging.LogRecord("t", logging.ERROR, __file__, 1, "could not save %s on branch %s at unmount",
                                  ("a/b.bin", "main"), None))
    said.write(path)
    assert _unmount_report(path, os.getpid(), os.getuid()) == ["could not save a/b.bin on branch main at unmount"]
    assert not os.path.exists(path)


@needs_fuse
def test_a_mount_over_a_non_empty_mount_point_says_what_it_hides(home, tmp_path):
    """Found by an operator's tour: a job that wrote into /mnt/REPO while the mount was down wrote
    to the root disk, and the next mount hid its output without a word. The mount says so now (on
    its terminal, and so in the journal under systemd); an empty mount point says nothing."""
    from tests.mount_testutil import MountProc

    for name, leftovers in (("empty", []), ("full", ["main", "job.csv"])):
        mp = tmp_path / name
        mp.mkdir()
        for n in leftovers:
            (mp / n).mkdir() if n == "main" else (mp / n).write_text("written while unmounted")
        (tmp_path / f"log-{name}").mkdir()
        m = MountProc(home, "svc", mp, log_dir=tmp_path / f"log-{name}").start()
        try:
            assert (mp / "main" / "hello.txt").read_bytes() == b"hello from a unit\n"
        finally:
            m.stop()
        said = "is not empty" in m.log()
        assert said == bool(leftovers), m.log()
        if leftovers:
            assert "2 entries" in m.log() and "hidden" in m.log()
