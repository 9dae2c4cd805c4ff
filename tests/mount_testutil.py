"""Real mounts for tests: a ``lakefuse mount -f`` daemon in a subprocess, always unmounted.

:class:`MountProc` starts the daemon with a ``NOTIFY_SOCKET`` it listens on and
returns once ``READY=1`` arrives (the same path systemd uses); ``stop()`` unmounts
with ``fusermount3 -u`` (lazily if busy) and reaps the daemon, whatever state it is in.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

FUSE_AVAILABLE = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None
needs_fuse = pytest.mark.skipif(not FUSE_AVAILABLE, reason="no /dev/fuse or fusermount3 here")

REPO_ROOT = Path(__file__).resolve().parents[1]
# the log directories MountProc made itself (no log_dir given): read by tests after a mount
# stopped, removed when the test process ends (each CI run left ~130 in /tmp)
_OWN_LOG_DIRS: list[str] = []
atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in _OWN_LOG_DIRS])


def lakefuse_cmd(home: Path | str, *args: str) -> list[str]:
    return [sys.executable, "-m", "lakefuse", "--home", str(home), *args]


def is_mounted(mountpoint: Path | str) -> bool:
    from lakefuse.mount.daemon import mount_type

    return mount_type(str(mountpoint)) is not None


def force_unmount(mountpoint: Path | str) -> None:
    mp = str(mountpoint)
    for args in (["-u"], ["-u", "-z"]):
        if not is_mounted(mp):
            return
        subprocess.run(["fusermount3", *args, mp], capture_output=True)
        time.sleep(0.05)


class MountProc:
    """One ``lakefuse mount -f`` daemon; a context manager."""

    def __init__(self, home: Path | str, repo: str, mountpoint: Path | str, *extra: str, log_dir: Path | None = None,
                 env: dict | None = None, source: list[str] | None = None):
        """``source``: what names the repository on the command line (default ``lakefs://REPO``;
        e.g. ``["--refs-dump", URL]``)."""
        self.home = Path(home)
        self.repo = repo
        self.source = source or [f"lakefs://{repo}"]
        self.mountpoint = Path(mountpoint)
        self.extra = list(extra)
        self.env = env
        self.proc: subprocess.Popen | None = None
        if log_dir is None:
            log_dir = tempfile.mkdtemp(prefix="lakefuse-mountlog-")
            _OWN_LOG_DIRS.append(log_dir)
        self.log_path = Path(log_dir) / f"mount-{repo}.log"
        self.messages: list[str] = []

    def start(self, timeout: float = 60.0) -> "MountProc":
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix="lakefuse-test-notify-")
        sock_path = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(sock_path)
        sock.settimeout(0.1)
        env = {**os.environ, **(self.env or {}), "NOTIFY_SOCKET": sock_path}
        cmd = lakefuse_cmd(self.home, "-v", "mount", *self.source, str(self.mountpoint), "-f", *self.extra)
        self._logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._logf, stderr=self._logf, env=env,
                                     cwd=str(REPO_ROOT))
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    msg = sock.recv(1 << 16).decode()
                    self.messages += msg.splitlines()
                    if "READY=1" in msg.splitlines():
                        return self
                except socket.timeout:
                    pass
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mount daemon exited with {self.proc.returncode}: {self.log()}")
            raise RuntimeError(f"mount daemon not ready after {timeout} s: {self.log()}")
        except BaseException:
            self.stop()
            raise
        finally:
            sock.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        force_unmount(self.mountpoint)
        if self.proc is not None:
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                force_unmount(self.mountpoint)
        if getattr(self, "_logf", None) is not None:
            self._logf.close()
            self._logf = None

    def __enter__(self) -> "MountProc":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def clean_mount(home: Path | str, repo: str, mountpoint: Path | str, *extra: str,
                env: dict | None = None) -> Iterator[Path]:
    """A mount for the ``with`` block: started, then stopped, and its log checked for a
    traceback (a request the daemon answered EIO after an unexpected error)."""
    m = MountProc(home, repo, mountpoint, *extra, env=env).start()
    try:
        yield Path(mountpoint)
    finally:
        m.stop()
    assert "Traceback" not in m.log(), m.log()[-4000:]


@contextlib.contextmanager
def empty_repo_mount(base: Path, repo: str, *extra: str) -> Iterator[Path]:
    """A new empty repository (a local namespace under ``base``) mounted at ``base/mnt``; yields
    its ``main`` branch tree."""
    from graveler import Graveler, GravelerConfig

    g = Graveler(GravelerConfig.from_home(base / "home"))
    try:
        g.create_repository(repo, f"file://{base}/ns")
    finally:
        g.close()
    with clean_mount(base / "home", repo, base / "mnt", *extra) as mp:
        yield mp / "main"


def branch_dir(mnt: Path, name: str) -> Path:
    """The branch tree ``name``, made by a mkdir at the mount root if it is not there."""
    p = mnt / name
    if not p.exists():
        os.mkdir(p)
    return p


def seed_repo(home: Path | str, repo: str, src: Path, tag: str | None = "v1") -> None:
    """Through the CLI: create ``repo``, upload the tree ``src`` to ``main/in``, commit it
    ("base") and tag the commit ``tag``."""
    for args in (("repo", "create", f"lakefs://{repo}"),
                 ("fs", "upload", "--recursive", "-s", str(src), f"lakefs://{repo}/main/in"),
                 ("commit", f"lakefs://{repo}/main", "-m", "base"),
                 *((("tag", "create", f"lakefs://{repo}/{tag}", f"lakefs://{repo}/main"),) if tag else ())):
        r = subprocess.run(lakefuse_cmd(home, *args), capture_output=True, text=True)
        assert r.returncode == 0, f"lakefuse {' '.join(args)} failed: {r.stderr}"


def oversized_control_request(control: Path, size: int) -> None:
    """Write ``size`` bytes (past the 1 MiB limit) to control file ``control`` in one write(2):
    the kernel splits it, the piece past 1 MiB fails with EFBIG, and the close fails the same
    way (asserted)."""
    fd = os.open(control, os.O_WRONLY | os.O_TRUNC)
    data = memoryview(b"m" * size)
    with pytest.raises(OSError) as ei:
        while data:
            data = data[os.write(fd, data):]
    assert ei.value.errno == errno.EFBIG
    with pytest.raises(OSError) as ei:
        os.close(fd)
    assert ei.value.errno == errno.EFBIG


def seeded_home(tmp_path_factory, repo: str, files: dict[str, bytes] | None = None) -> Path:
    """A new home whose ``repo`` holds ``files`` (default: one ``a.txt``) under ``main/in``,
    committed and tagged ``v1`` (:func:`seed_repo`)."""
    home = tmp_path_factory.mktemp(f"{repo}-home")
    src = tmp_path_factory.mktemp(f"{repo}-src") / "in"
    for name, data in (files or {"a.txt": b"committed\n"}).items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    seed_repo(home, repo, src)
    return home


def empty_repo_on(tmp_path: Path, request, store: str, repo: str) -> tuple[Path, dict | None]:
    """A new empty repository on a ``local`` namespace or on the session's moto S3 bucket
    (``s3``); its home, and the environment a mount of it needs."""
    from graveler import Graveler, GravelerConfig

    home = tmp_path / "home"
    env = None
    if store == "s3":
        cfg = GravelerConfig.from_home(home, store=request.getfixturevalue("s3_config"))
        ns = f"s3://{request.getfixturevalue('s3_bucket')}/ns"
        env = {"LAKEFUSE_S3_ENDPOINT": request.getfixturevalue("s3_endpoint")}
    else:
        cfg = GravelerConfig.from_home(home)
        ns = f"file://{tmp_path}/ns"
    g = Graveler(cfg)
    try:
        g.create_repository(repo, ns)
    finally:
        g.close()
    return home, env


def commit_and_read_back(mp: Path, name: str, want: bytes, message: str) -> None:
    """Commit ``main`` through its control file; the new commit's tree and the branch both read
    ``want`` at ``name``."""
    (mp / "main" / ".lakefuse" / "commit").write_text(message + "\n")
    outcome = json.loads((mp / "main" / ".lakefuse" / "commit").read_text())
    assert outcome["ok"], outcome
    commit = (mp / "main" / ".lakefuse" / "head").read_text().strip()
    assert commit == outcome["commit"]["id"]
    assert (mp / commit / name).read_bytes() == want
    assert (mp / "main" / name).read_bytes() == want


def write_across_spool_removal(branch: Path, cache: Path, files: int) -> None:
    """Through ``branch`` (a mount's branch directory, its spool under ``cache``): ``held.bin``
    written before and after the spool directory is removed while it is open, then ``files``
    new files ``n<i>`` (more than the spool's ready-made files): what a mount must keep."""
    held = open(branch / "held.bin", "wb")
    held.write(b"before ")
    held.flush()
    time.sleep(0.3)
    shutil.rmtree(cache / "spool")
    held.write(b"after")
    held.close()
    for i in range(files):
        (branch / f"n{i}").write_bytes(b"n%d" % i)
