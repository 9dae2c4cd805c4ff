"""Control files and listings at their edges, through a real FUSE mount: what a new user
meets first (an oversized request, ``ls -a``, writing an info file, an empty request)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.mount_testutil import (MountProc, branch_dir, clean_mount, lakefuse_cmd, needs_fuse,
                                  oversized_control_request, seed_repo)

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
    (src / "in" / "many").mkdir()
    for i in range(300):  # more than one readdir reply holds
        (src / "in" / "many" / f"f{i:03d}").write_bytes(b"x")
    seed_repo(h, REPO, src / "in")
    return h


@pytest.fixture(scope="module")
def mnt(home, tmp_path_factory):
    with clean_mount(home, REPO, tmp_path_factory.mktemp("cmnt"), "--branch-timeout", "0.2") as mp:
        yield mp


branch = branch_dir  # mkdir at the mount root makes a branch


def head_of(b: Path) -> str:
    return (b / ".lakefuse" / "head").read_text().strip()


def outcome(b: Path, name: str) -> dict:
    return json.loads((b / ".lakefuse" / name).read_text())


def test_oversized_control_request_never_runs(mnt, tmp_path):
    b = branch(mnt, "big")
    (b / "f.txt").write_text("f")
    head = head_of(b)
    # one write(2) of 10 MiB: EFBIG past 1 MiB and at close: the first MiB is not run as a
    # request of its own
    oversized_control_request(b / ".lakefuse" / "commit", 10 << 20)
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
    # a message of lines whose 128 KiB blocks each end a line: no block runs as a request
    msg.write_bytes((b"x" * 63 + b"\n") * (10 << 14))
    r = subprocess.run(["bash", "-c", f"cat {msg} > {b}/.lakefuse/commit"], capture_output=True, text=True)
    assert r.returncode != 0 and "too large" in r.stderr.lower(), r.stderr
    assert head_of(b) == head
    # a request of its own size afterwards runs
    (b / ".lakefuse" / "commit").write_text("a real commit\n")
    assert head_of(b) != head and outcome(b, "commit")["commit"]["message"] == "a real commit"


class _Dirent(ctypes.Structure):
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64), ("d_reclen", ctypes.c_ushort),
                ("d_type", ctypes.c_ubyte), ("d_name", ctypes.c_char * 256)]


def raw_readdir(d: Path, seek_after: int | None = None) -> list[tuple[bytes, int, int]]:
    """(name, d_ino, d_type) of every entry readdir(3) returns, in its order, "." and ".." included.
    With ``seek_after`` n: read n entries, telldir, read the rest, seekdir back and read the
    rest again (which must be the same); return the whole listing."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.opendir.restype = ctypes.c_void_p
    libc.readdir.restype = ctypes.POINTER(_Dirent)
    libc.telldir.restype = ctypes.c_long
    libc.readdir.argtypes = libc.closedir.argtypes = libc.telldir.argtypes = [ctypes.c_void_p]
    libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    dirp = libc.opendir(os.fsencode(d))
    assert dirp, os.strerror(ctypes.get_errno())

    def read(n: int | None = None) -> list[tuple[bytes, int, int]]:
        out = []
        while n is None or len(out) < n:
            e = libc.readdir(dirp)
            if not e:
                break
            out.append((e.contents.d_name, e.contents.d_ino, e.contents.d_type))
        return out

    try:
        if seek_after is None:
            return read()
        head = read(seek_after)
        pos = libc.telldir(dirp)
        rest = read()
        libc.seekdir(dirp, pos)
        assert read() == rest, f"{d}: seekdir to after entry {seek_after} gives another rest"
        return head + rest
    finally:
        libc.closedir(dirp)


def _ls(*args: str) -> list[str]:
    r = subprocess.run(["ls", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_ls_a_lists_dot_and_dotdot_everywhere(mnt):
    b = branch(mnt, "dots")
    (b / "sub").mkdir()
    (b / "sub" / "x").write_text("x")
    dirs = [mnt, mnt / ".lakefuse", mnt / "main", mnt / "main" / "in", mnt / "main" / ".lakefuse", mnt / "v1" / "in",
            b / "sub", mnt / "v1" / "in" / "many"]
    for d in dirs:
        names = os.listdir(d)
        listed = _ls("-a", str(d))
        assert listed[:2] == [".", ".."], (d, listed[:4])
        assert sorted(listed[2:]) == sorted(names), d
        unsorted = _ls("-f", str(d))  # the raw readdir order: "." and ".." first, each name once
        assert unsorted[:2] == [".", ".."] and len(unsorted) == len(set(unsorted)) == len(names) + 2, d
        # readdir itself: "." is the directory's inode, ".." its parent's (the mount root is its own)
        raw = raw_readdir(d)
        assert [n for n, _, _ in raw[:2]] == [b".", b".."] and raw[0][2] == raw[1][2] == 4, (d, raw[:2])  # DT_DIR
        assert raw[0][1] == os.stat(d).st_ino, d
        assert raw[1][1] == (os.stat(d / "..").st_ino if d != mnt else os.stat(mnt).st_ino), d
        assert sorted(n.decode() for n, _, _ in raw[2:]) == sorted(names), d
    many = mnt / "v1" / "in" / "many"
    assert len(os.listdir(many)) == 300
    for n in (0, 1, 2, 3, 150):  # seekdir back to any position, the dots' included
        assert raw_readdir(many, seek_after=n) == raw_readdir(many)


def test_info_files_refuse_writing_at_open(mnt):
    b = branch(mnt, "info")
    for f in (b / ".lakefuse" / "head", b / ".lakefuse" / "log", b / ".lakefuse" / "status",
              mnt / ".lakefuse" / "stats"):
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND, os.O_RDONLY | os.O_TRUNC):
            with pytest.raises(OSError) as ei:
                os.close(os.open(f, flags))
            assert ei.value.errno == errno.EACCES, (f, flags, ei.value)
        r = subprocess.run(["bash", "-c", f"echo x > {f}"], capture_output=True, text=True)
        assert r.returncode != 0 and "Permission denied" in r.stderr, (f, r.stderr)
        assert f.read_bytes() or f.name == "status"  # still readable (a new branch has no status)
    assert (b / ".lakefuse" / "head").read_text().strip() == (mnt / "main" / ".lakefuse" / "head").read_text().strip()
    with pytest.raises(OSError) as ei:  # on an immutable tree, as every write there
        os.open(mnt / "v1" / ".lakefuse" / "head", os.O_WRONLY)
    assert ei.value.errno == errno.EROFS


def test_control_files_of_commit_and_tag_trees_are_erofs(mnt):
    head = (mnt / "main" / ".lakefuse" / "head").read_text().strip()
    for tree in ("v1", head[:12], "main~0"):
        d = mnt / tree / ".lakefuse"
        for name in ("commit", "merge", "reset", "revert", "newfile"):
            with pytest.raises(OSError) as ei:
                (d / name).write_text("a message\n")
            assert ei.value.errno == errno.EROFS, (tree, name, ei.value)
        for fn in (lambda: os.mkdir(d / "x"), lambda: os.symlink("head", d / "l"), lambda: os.unlink(d / "head"),
                   lambda: os.rename(d / "head", d / "h2")):
            with pytest.raises(OSError) as ei:
                fn()
            assert ei.value.errno == errno.EROFS, (tree, ei.value)
        r = subprocess.run(["bash", "-c", f"echo msg > {d}/commit"], capture_output=True, text=True)
        assert r.returncode != 0 and "Read-only file system" in r.stderr, r.stderr
    assert (mnt / "v1" / ".lakefuse" / "head").read_text().strip() == head


def test_reset_of_a_path_that_names_nothing_is_enoent(mnt):
    b = branch(mnt, "rst")
    (b / "new").mkdir()
    (b / "new" / "n.txt").write_text("n")
    os.unlink(b / "in" / "a.txt")
    status = (b / ".lakefuse" / "status").read_text()
    for request in ("nosuch.txt", "in/nosuch", "nosuch/", "in/a.txt/x"):
        r = subprocess.run(["bash", "-c", f"echo {request} > {b}/.lakefuse/reset"], capture_output=True, text=True)
        assert r.returncode != 0 and "No such file or directory" in r.stderr, (request, r.stderr)
        back = outcome(b, "reset")
        assert not back["ok"] and back["error_type"] == "NotFound" and "matches nothing" in back["error"], back
        with pytest.raises(OSError) as ei:  # without a newline: the close fails
            with open(b / ".lakefuse" / "reset", "w") as f:
                f.write(request)
        assert ei.value.errno == errno.ENOENT
    assert (b / ".lakefuse" / "status").read_text() == status  # nothing changed
    # what exists, staged or committed, still resets; a committed file without changes is no error
    (b / ".lakefuse" / "reset").write_text("in\n")
    time.sleep(0.3)  # the kernel's entry cache of a branch tree (--branch-timeout)
    assert (b / "in" / "a.txt").read_text() == "committed a\n"  # the deletion undone (found in the head commit)
    (b / ".lakefuse" / "reset").write_text("in/a.txt\n")
    assert outcome(b, "reset")["ok"]
    (b / ".lakefuse" / "reset").write_text("new/\n")
    time.sleep(0.3)
    assert not (b / "new").exists() and (b / ".lakefuse" / "status").read_text() == ""


def _outcome_soon(b: Path, name: str, at_least: str) -> dict:
    """The read-back once it is newer than ``at_least`` (the last close's release reaches the
    daemon just after close returns)."""
    deadline = time.monotonic() + 5
    while True:
        back = outcome(b, name)
        if back.get("at", "") > at_least or time.monotonic() > deadline:
            return back
        time.sleep(0.02)


def test_an_empty_request_is_einval(mnt):
    b = branch(mnt, "empty")
    (b / "staged.txt").write_text("s")
    head = head_of(b)
    last = ""
    for cmd in (": > {c}", "printf '' > {c}", "true > {c}"):
        # nothing written: no commit, the read-back says why (a shell cannot show it: it
        # ignores errors of close, the only call that could report it)
        r = subprocess.run(["bash", "-c", cmd.format(c=b / ".lakefuse" / "commit")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        back = _outcome_soon(b, "commit", last)
        assert not back["ok"] and back["error_type"] == "InvalidArgument" and "empty request" in back["error"], back
        last = back["at"]
        assert head_of(b) == head
    for name in ("commit", "reset", "merge"):  # a program that checks close sees EINVAL
        with pytest.raises(OSError) as ei:
            open(b / ".lakefuse" / name, "w").close()
        assert ei.value.errno == errno.EINVAL, name
        fd = os.open(b / ".lakefuse" / name, os.O_WRONLY | os.O_TRUNC)
        with pytest.raises(OSError) as ei:
            os.close(fd)
        assert ei.value.errno == errno.EINVAL, name
    with pytest.raises(OSError) as ei:
        os.close(os.open(mnt / ".lakefuse" / "tag", os.O_WRONLY))
    assert ei.value.errno == errno.EINVAL
    assert head_of(b) == head and (b / ".lakefuse" / "status").read_text() == "A staged.txt\n"
    # one newline is a request: a commit with an empty message, refused by the write itself
    r = subprocess.run(["bash", "-c", f"echo > {b}/.lakefuse/commit"], capture_output=True, text=True)
    assert r.returncode != 0 and "Invalid argument" in r.stderr, r.stderr
    assert "the commit message is empty" in outcome(b, "commit")["error"]
    # truncation at open is no request: with a write after it, the request runs, and the
    # shell's first close (before the command writes) leaves no failure behind
    r = subprocess.run(["bash", "-c", f"echo 'a message' > {b}/.lakefuse/commit"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    time.sleep(0.2)  # any release that could still record something has arrived
    back = outcome(b, "commit")
    assert back["ok"] and back["commit"]["message"] == "a message" and head_of(b) != head


def test_a_close_that_leaves_another_descriptor_open_is_no_empty_request(mnt):
    """Found by an operator running backup tools: a control file's descriptor shared between
    two processes (a parent handing it to a child as its output, or bash's own dance for
    ``echo msg > commit``: open, dup to 1, close the first) failed the first close with EINVAL
    before anything was written -- the parent's close raised, and every shell commit counted an
    EINVAL in the stats -- though the request came and ran. Such a close succeeds now; the last
    close of a file nothing was written to is still EINVAL."""
    b = branch(mnt, "shared")
    stats = lambda: json.loads((mnt / ".lakefuse" / "stats").read_text()).get("errors", {})  # noqa: E731
    (b / "one.txt").write_text("1")
    head, einval = head_of(b), stats().get("EINVAL", 0)
    with open(b / ".lakefuse" / "commit", "w") as f:  # (its close must not raise)
        p = subprocess.Popen(["sh", "-c", "sleep 0.3; echo from the child"], stdout=f)
    assert p.wait() == 0
    assert head_of(b) != head and outcome(b, "commit")["commit"]["message"] == "from the child"
    (b / "two.txt").write_text("2")
    r = subprocess.run(["bash", "-c", f"echo from bash > {b}/.lakefuse/commit"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    reader = open(b / ".lakefuse" / "reset")  # (a reader of the outcome is no descriptor a request comes through)
    fd = os.open(b / ".lakefuse" / "reset", os.O_WRONLY | os.O_TRUNC)
    second = os.dup(fd)
    os.close(fd)  # (the duplicate still has it)
    with pytest.raises(OSError) as ei:
        os.close(second)  # the last one, nothing written: an empty request
    assert ei.value.errno == errno.EINVAL
    reader.close()
    assert stats().get("EINVAL", 0) == einval + 1, stats()  # (only the last, empty close)
    assert outcome(b, "commit")["commit"]["message"] == "from bash"


def test_appended_requests_and_several_on_one_descriptor_run_as_written(mnt):
    """``echo msg >> commit`` (O_APPEND: the write lands at the outcome's size) and a second
    request written through the same descriptor (after the first one's bytes): a request is
    what its writes hold from where the first of them landed. Both used to be padded with
    NULs and refused as "request contains NUL"."""
    b = branch(mnt, "app")
    (b / "x.txt").write_text("x")
    r = subprocess.run(["bash", "-c", f"echo 'appended' >> {b}/.lakefuse/commit"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    back = outcome(b, "commit")
    assert back["ok"] and back["commit"]["message"] == "appended", back
    (b / "y.txt").write_text("y")
    fd = os.open(b / ".lakefuse" / "commit", os.O_WRONLY)
    try:
        assert os.write(fd, b"first\n") == 6  # runs at its newline
        assert outcome(b, "commit")["commit"]["message"] == "first"
        with pytest.raises(OSError) as ei:  # the second request: nothing left to commit
            os.write(fd, b"second\n")
        assert ei.value.errno == errno.EBUSY
        assert outcome(b, "commit")["error_type"] == "NothingToCommit"
    finally:
        os.close(fd)
    with open(b / ".lakefuse" / "reset", "a") as f:  # Python's append mode, a request without a newline
        f.write("x.txt")
    assert outcome(b, "reset")["ok"]


def test_a_reset_of_a_file_held_open_takes_its_name_at_once(mnt):
    """A file another process holds open, reset away through a control file (a revert, a merge alike): its
    name went at once from listings but ``stat`` found it for up to --branch-timeout (the
    kernel's name for the inode the descriptor keeps). The request's round drops the name too;
    the descriptor still reads what it held, as an unlinked open file does."""
    b = branch(mnt, "rso")
    (b / "held.txt").write_text("x\n")
    with open(b / "held.txt", "rb") as held:
        assert (b / "held.txt").stat().st_size == 2  # (the name is cached now)
        (b / ".lakefuse" / "reset").write_text("*\n")
        with pytest.raises(FileNotFoundError):
            os.stat(b / "held.txt")
        assert "held.txt" not in os.listdir(b)
        assert held.read() == b"x\n" and os.fstat(held.fileno()).st_nlink == 0


def test_a_reset_made_through_the_mount_shows_at_once(mnt):
    """The kernel keeps a branch tree's attributes for --branch-timeout; a reset, merge or
    revert made through this mount drops them before it is answered (the stamp watch's
    round, asked for and waited on), so the next stat sees the branch as the request left it."""
    b = branch(mnt, "rsa")
    (b / "in" / "a.txt").write_text("modified and staged, longer\n")
    (b / "new.txt").write_text("n")
    assert (b / "in" / "a.txt").stat().st_size == 28 and (b / "new.txt").stat().st_size == 1  # (now cached)
    (b / ".lakefuse" / "reset").write_text("in/a.txt\n")
    assert (b / "in" / "a.txt").stat().st_size == len("committed a\n")
    assert (b / "in" / "a.txt").read_text() == "committed a\n"
    (b / ".lakefuse" / "reset").write_text("new.txt\n")
    with pytest.raises(FileNotFoundError):
        os.stat(b / "new.txt")


def _until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _cli_rc(home, *args) -> int:
    return subprocess.run(lakefuse_cmd(home, *args), capture_output=True, text=True).returncode


def test_a_file_removed_behind_the_mount_while_open_for_writing_stays_removed(mnt, home):
    """Found by a git user's tour: an appender's file deleted by the CLI (`fs rm`; a CLI reset
    alike) came back, old and new bytes, when the appender wrote again and closed -- a late
    close undid the delete, where an unlinked open file's writes go nowhere (docs/SEMANTICS.md:
    "likewise an unlinked file to its descriptors")."""
    b = branch(mnt, "rbw")
    (b / "held.txt").write_text("base\n")
    fd = os.open(b / "held.txt", os.O_WRONLY | os.O_APPEND)
    try:
        cli(home, "fs", "rm", f"lakefs://{REPO}/rbw/held.txt")
        assert _until(lambda: not (b / "held.txt").exists())
        time.sleep(0.5)  # (a stamp watch round after the one that dropped the name)
        os.write(fd, b"appended\n")
    finally:
        os.close(fd)
    time.sleep(0.3)
    assert not (b / "held.txt").exists() and "held.txt" not in os.listdir(b)
    assert _cli_rc(home, "fs", "cat", f"lakefs://{REPO}/rbw/held.txt") == 3


def test_a_reset_through_the_mount_of_a_file_open_for_writing_is_not_undone_by_its_close(mnt):
    b = branch(mnt, "rbr")
    (b / "held.txt").write_text("staged\n")
    with open(b / "held.txt", "a") as f:
        (b / ".lakefuse" / "reset").write_text("*\n")
        f.write("more\n")
    time.sleep(0.3)
    assert not (b / "held.txt").exists()
    assert outcome(b, "reset")["ok"]


def test_files_open_for_writing_are_saved_as_before_across_changes_elsewhere(mnt, home, tmp_path):
    """The other side of the detach above: a change behind the mount to another path (the stamp
    watch's round runs) leaves open files alone -- a new file not saved yet, a saved one."""
    b = branch(mnt, "rbk")
    (b / "old.txt").write_text("old\n")
    src = tmp_path / "other"
    src.write_bytes(b"other\n")
    new = open(b / "new.txt", "w")
    old = open(b / "old.txt", "a")
    try:
        new.write("new 1\n")
        new.flush()
        old.write("old 2\n")
        old.flush()
        cli(home, "fs", "upload", f"lakefs://{REPO}/rbk/other.txt", "-s", str(src))
        assert _until(lambda: (b / "other.txt").exists())
        time.sleep(0.5)
        new.write("new 2\n")
        old.write("old 3\n")
    finally:
        new.close()
        old.close()
    assert (b / "new.txt").read_text() == "new 1\nnew 2\n"
    assert (b / "old.txt").read_text() == "old\nold 2\nold 3\n"
    r = subprocess.run(lakefuse_cmd(home, "fs", "cat", f"lakefs://{REPO}/rbk/new.txt"), capture_output=True)
    assert r.returncode == 0 and r.stdout == b"new 1\nnew 2\n"


def test_a_reset_of_a_saved_change_of_a_file_open_for_writing_is_not_undone(mnt, home):
    """Found by an ML engineer's tour: a reset discarded an open writer's saved (fsynced) change
    of a committed file, yet the mount went on showing the change and the writer's next close
    staged it again. The reset stands now: the name shows the committed version (a new inode),
    the descriptor writes on into the discarded copy, its close stages nothing."""
    b = branch(mnt, "rbm")
    (b / "r").mkdir()
    (b / "r" / "f").write_bytes(b"A" * 50)
    (b / ".lakefuse" / "commit").write_text("base\n")
    fd = os.open(b / "r" / "f", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"S" * 10)
        os.fsync(fd)
        assert (b / "r" / "f").read_bytes() == b"S" * 10
        (b / ".lakefuse" / "reset").write_text("*\n")
        assert _until(lambda: (b / "r" / "f").read_bytes() == b"A" * 50)
        os.write(fd, b"T")
    finally:
        os.close(fd)
    time.sleep(0.3)
    assert (b / "r" / "f").read_bytes() == b"A" * 50
    assert (b / ".lakefuse" / "status").read_text().strip() == ""
    r = subprocess.run(lakefuse_cmd(home, "diff", f"lakefs://{REPO}/rbm"), capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "", r


def test_a_failed_control_request_is_logged_once(tmp_path):
    """Found by an ML engineer's tour: each failed request was two WARNING lines (the control
    file's and the error boundary's, "answered EBUSY"), at the same instant."""
    from graveler import Graveler, GravelerConfig

    g = Graveler(GravelerConfig.from_home(tmp_path / "home"))
    g.create_repository("onelog", f"file://{tmp_path}/ns")
    g.close()
    m = MountProc(tmp_path / "home", "onelog", tmp_path / "mnt").start()
    try:
        fd = os.open(tmp_path / "mnt" / "main" / ".lakefuse" / "commit", os.O_WRONLY)
        try:  # (one write(2), as echo's: Python's buffered file would write the failed bytes again at close)
            with pytest.raises(OSError) as e:
                os.write(fd, b"nothing\n")
            assert e.value.errno == errno.EBUSY
        finally:
            os.close(fd)
    finally:
        m.stop()
    said = [line for line in m.log().splitlines() if "nothing to commit" in line]
    assert len(said) == 1 and "WARNING" in said[0], said


def test_a_name_a_merge_or_reset_took_away_is_free_at_once(home, tmp_path):
    """Found by an ETL soak: after a merge (or a reset) through the mount removed a file whose
    name the kernel held, the first create of that name failed ENOENT (the kernel took it for
    the old file, gone; a retry worked), and a directory the merge left with nothing could not
    be made again (EEXIST) -- until the names timed out. The request drops them before it is
    answered. (A long --branch-timeout: a name is not left to time out.)"""
    with clean_mount(home, REPO, tmp_path / "m", "--branch-timeout", "30") as mp:
        main = branch(mp, "soakmain")
        (main / "d").mkdir()
        (main / "d" / "x").write_text("base\n")
        (main / "gone").mkdir()
        (main / "gone" / "y").write_text("base\n")
        (main / ".lakefuse" / "commit").write_text("base\n")
        (mp / ".lakefuse" / "branch").write_text("soakfeat soakmain\n")
        feat = mp / "soakfeat"
        (feat / "d" / "x").unlink()
        (feat / "gone" / "y").unlink()
        (feat / "gone").rmdir()
        (feat / ".lakefuse" / "commit").write_text("drop x and gone/\n")
        assert (main / "d" / "x").read_text() == "base\n"  # the kernel holds these names now
        assert (main / "gone" / "y").read_text() == "base\n"
        (main / ".lakefuse" / "merge").write_text("soakfeat\n")
        with open(main / "d" / "x", "w") as f:  # (it was ENOENT)
            f.write("new\n")
        assert (main / "d" / "x").read_text() == "new\n"
        os.mkdir(main / "gone")  # (it was EEXIST)
        (main / "gone" / "y").write_text("again\n")
        (main / "staged").write_text("staged\n")
        assert (main / "staged").read_text() == "staged\n"
        (main / ".lakefuse" / "reset").write_text("staged\n")
        with open(main / "staged", "w") as f:  # (it was ENOENT)
            f.write("new\n")
        assert sorted(os.listdir(main)) == ["d", "gone", "in", "staged"], os.listdir(main)
