"""Writable branch trees through a real FUSE mount (``lakefuse mount -f`` in a subprocess)."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import pwd
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graveler.home import Graveler
from graveler.config import GravelerConfig
from tests.mount_testutil import MountProc, branch_dir, clean_mount, lakefuse_cmd, needs_fuse, seed_repo

pytestmark = needs_fuse

REPO = "wrepo"
SRC = Path(__file__).resolve().parents[1]


def cli(home, *args, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run(lakefuse_cmd(home, *args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"lakefuse {' '.join(args)} failed: {r.stderr}")
    return r


def open_repo(home):
    return Graveler(GravelerConfig.from_home(home)).repository(REPO)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("whome")
    src = tmp_path_factory.mktemp("wsrc")
    (src / "in").mkdir()
    (src / "in" / "a.txt").write_bytes(b"committed a\n")
    (src / "in" / "b.bin").write_bytes(os.urandom(300_000))
    seed_repo(h, REPO, src / "in")
    return h


@pytest.fixture(scope="module")
def mnt(home, tmp_path_factory):
    with clean_mount(home, REPO, tmp_path_factory.mktemp("wmnt"), "--branch-timeout", "0.2") as mp:
        yield mp


branch = branch_dir  # mkdir at the mount root makes a branch


def tree_files(root: Path) -> dict[str, bytes]:
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != ".lakefuse"]
        for f in files:
            p = Path(d) / f
            rel = str(p.relative_to(root))
            out[rel] = os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
    return out


def test_cp_tar_rsync_into_a_branch(mnt, home):
    b = branch(mnt, "tools")
    shutil.copytree(SRC / "graveler", b / "cp", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["cp", "-r", str(SRC / "lakefuse"), str(b / "cpr")], check=True)
    tarball = subprocess.run(["tar", "-C", str(SRC), "--exclude=__pycache__", "-cf", "-", "graveler"],
                             capture_output=True, check=True).stdout
    (b / "tar").mkdir()
    subprocess.run(["tar", "-C", str(b / "tar"), "-xf", "-"], input=tarball, check=True)
    subprocess.run(["rsync", "-a", "--exclude=__pycache__", f"{SRC / 'lakefuse'}/", f"{b / 'rs'}/"], check=True)
    want = {k: v for k, v in tree_files(SRC / "graveler").items() if "__pycache__" not in k}
    assert tree_files(b / "cp") == want
    assert tree_files(b / "tar" / "graveler") == want
    want_l = {k: v for k, v in tree_files(SRC / "lakefuse").items() if "__pycache__" not in k}
    assert tree_files(b / "rs") == want_l
    assert {k: v for k, v in tree_files(b / "cpr").items() if "__pycache__" not in k} == want_l
    # rsync -a kept modes and mtimes
    src_st = os.stat(SRC / "lakefuse" / "cli" / "__init__.py")
    dst_st = os.stat(b / "rs" / "cli" / "__init__.py")
    assert stat.S_IMODE(dst_st.st_mode) == stat.S_IMODE(src_st.st_mode)
    assert int(dst_st.st_mtime) == int(src_st.st_mtime)
    # and all of it is staged on the branch, readable by the CLI
    repo = open_repo(home)
    assert repo.read("tools", "tar/graveler/tree.py") == (SRC / "graveler" / "tree.py").read_bytes()


def test_rsync_cp_a_and_tar_into_a_branch_root_restore_its_attributes(home, tmp_path):
    """The tools that copy a directory's contents into another (``rsync -a src/ dst/``,
    ``cp -a src/. dst/``, ``tar -xf`` of a ``.``-rooted archive) also set the destination
    directory's times, mode, owner and extended attributes: on a branch root they succeed (before, each exited
    with an error), the root shows them after a remount, and its commit keeps them."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x").write_bytes(b"x")
    (src / "y").write_bytes(b"y")
    os.chmod(src, 0o751)
    os.setxattr(src, "user.origin", b"src")
    os.utime(src, ns=(1_400_000_000_000_000_000, 1_400_000_000_000_000_000))
    tarball = subprocess.run(["tar", "-C", str(src), "-cf", "-", "."], capture_output=True, check=True).stdout
    mp = tmp_path / "m"
    with MountProc(home, REPO, mp, "--branch-timeout", "0.2"):
        for name, argv, stdin in (
                ("rsync", ["rsync", "-a", f"{src}/", "{b}/"], None),
                ("cpa", ["cp", "-a", f"{src}/.", "{b}/"], None),
                ("tar", ["tar", "-C", "{b}", "-xf", "-"], tarball)):
            b = branch(mp, f"root-{name}")
            os.utime(b, ns=(1_300_000_000_000_000_000, 1_300_000_000_000_000_000))  # touch -d
            r = subprocess.run([a.replace("{b}", str(b)) for a in argv], input=stdin, capture_output=True)
            assert r.returncode == 0, (name, r.stderr)
            st = os.stat(b)
            assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o751, 1_400_000_000_000_000_000), name
            assert sorted(os.listdir(b)) == ["in", "sub", "y"], name  # the root's marker is no name
            if name == "cpa":  # (rsync without -X: with it, rsync exits 23 on the user.lakefs.* names)
                assert os.getxattr(b, "user.origin") == b"src", name
        os.chown(mp / "root-tar", 1234, 5678)
        (mp / "root-tar" / ".lakefuse" / "commit").write_text("root attributes\n")
        head = (mp / "root-tar" / ".lakefuse" / "head").read_text().strip()
    with MountProc(home, REPO, mp, "--branch-timeout", "0.2"):
        for where in ("root-tar", head):
            st = os.stat(mp / where)
            assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns) == (
                0o751, 1234, 5678, 1_400_000_000_000_000_000), where
        assert stat.S_IMODE(os.stat(mp / "main").st_mode) == 0o755  # a root never set: as before
        assert subprocess.run(["chmod", "700", str(mp / head)], capture_output=True).returncode != 0  # EROFS
        assert sorted(os.listdir(mp / head)) == ["in", "sub", "y"]


def test_git_clone_into_a_branch(mnt, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    subprocess.run(["git", "init", "-q", str(src)], check=True, env=env)
    for i in range(5):
        (src / f"f{i}.txt").write_text(f"file {i}\n" * 100)
        subprocess.run(["git", "-C", str(src), "add", "."], check=True, env=env)
        subprocess.run(["git", "-C", str(src), "commit", "-q", "-m", f"c{i}"], check=True, env=env)
    b = branch(mnt, "gitb")
    subprocess.run(["git", "clone", "-q", str(src), str(b / "clone")], check=True, env=env)
    r = subprocess.run(["git", "-C", str(b / "clone"), "fsck", "--strict"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    st = subprocess.run(["git", "-C", str(b / "clone"), "status", "--porcelain"], capture_output=True, text=True,
                        check=True, env=env)
    assert st.stdout == ""
    log = subprocess.run(["git", "-C", str(b / "clone"), "log", "--oneline"], capture_output=True, text=True,
                         check=True, env=env).stdout
    assert len(log.splitlines()) == 5


def test_pyarrow_writes_a_parquet_dataset(mnt):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    b = branch(mnt, "arrow")
    t = pa.table({"k": [i % 4 for i in range(10_000)], "v": [float(i) for i in range(10_000)]})
    pq.write_to_dataset(t, str(b / "table"), partition_cols=["k"])
    pq.write_table(t, str(b / "single.parquet"))
    back = ds.dataset(str(b / "table"), format="parquet", partitioning="hive").to_table()
    assert back.num_rows == 10_000 and sorted(back.column("v").to_pylist()) == t.column("v").to_pylist()
    assert pq.read_table(str(b / "single.parquet")).equals(t)


def test_spark_style_output_committer_pattern(mnt, home):
    """FileOutputCommitter v1: task files under _temporary/0/_temporary/attempt_*/, each task
    directory renamed into _temporary/0/task_*/, then moved into place, _temporary removed,
    _SUCCESS written; then a commit through the control file."""
    b = branch(mnt, "spark")
    out = b / "out"
    job_tmp = out / "_temporary" / "0"
    os.makedirs(job_tmp / "_temporary")
    for t in range(4):
        att = job_tmp / "_temporary" / f"attempt_{t}"
        att.mkdir()
        for p in range(3):
            (att / f"part-{t:05d}-{p}.csv").write_text(f"task {t} part {p}\n")
        os.rename(att, job_tmp / f"task_{t}")  # task commit
    for t in range(4):  # job commit
        for f in os.listdir(job_tmp / f"task_{t}"):
            os.rename(job_tmp / f"task_{t}" / f, out / f)
    shutil.rmtree(out / "_temporary")
    (out / "_SUCCESS").write_bytes(b"")
    assert sorted(os.listdir(out)) == ["_SUCCESS"] + sorted(f"part-{t:05d}-{p}.csv" for t in range(4) for p in range(3))
    (b / ".lakefuse" / "commit").write_text("spark output\n")
    repo = open_repo(home)
    keys = sorted(it.path.decode() for it in repo.list("spark", "out/", delimiter="") if not it.path.endswith(b"/"))
    assert "out/_SUCCESS" in keys and not any("_temporary" in k for k in keys) and len(keys) == 13
    assert repo.get_commit("spark").message == "spark output"


def test_control_files_through_the_mount(mnt, home):
    b = branch(mnt, "ctl")
    (b / "new.txt").write_text("new\n")
    assert (b / ".lakefuse" / "status").read_text() == "A new.txt\n"
    r = subprocess.run(["bash", "-c", f"echo 'first write' > {b}/.lakefuse/commit"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads((b / ".lakefuse" / "commit").read_text())
    assert out["ok"] and out["commit"]["message"] == "first write"
    head = (b / ".lakefuse" / "head").read_text().strip()
    assert head == out["commit"]["id"]
    # its committer: the user whose process wrote the request (lakefuse.users)
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert out["commit"]["committer"] == me and f" {me}: first write" in (b / ".lakefuse" / "log").read_text()
    assert (mnt / head / "new.txt").read_text() == "new\n"  # the new commit, by its ID
    # an empty commit fails in bash and in Python, and the reason is read back
    r = subprocess.run(["bash", "-c", f"echo nothing > {b}/.lakefuse/commit"], capture_output=True, text=True)
    assert r.returncode != 0
    with pytest.raises(OSError):
        with open(b / ".lakefuse" / "commit", "w") as f:
            f.write("no newline, runs at close")
    back = json.loads((b / ".lakefuse" / "commit").read_text())
    assert not back["ok"] and back["error_type"] == "NothingToCommit"
    with pytest.raises(OSError) as ei:
        (b / ".lakefuse" / "commit").write_text('{"broken json\n')
    assert ei.value.errno == errno.EINVAL
    assert "malformed JSON" in json.loads((b / ".lakefuse" / "commit").read_text())["error"]
    (b / ".lakefuse" / "commit").write_text(json.dumps({"message": "empty ok", "metadata": {"k": "v"},
                                                        "allow_empty": True}) + "\n")
    repo = open_repo(home)
    assert repo.get_commit("ctl").metadata == {"k": "v"}
    # reset and revert
    (b / "scratch.txt").write_text("x")
    (b / ".lakefuse" / "reset").write_text("scratch.txt\n")
    time.sleep(0.3)
    assert not (b / "scratch.txt").exists()
    (b / ".lakefuse" / "revert").write_text(f"{head}\n")
    time.sleep(0.3)
    assert not (b / "new.txt").exists()
    # merge conflict: the write fails, the paths are read back
    (mnt / ".lakefuse" / "branch").write_text("ctl2 ctl\n")
    (mnt / "ctl2" / "c.txt").write_text("from ctl2")
    (mnt / "ctl2" / ".lakefuse" / "commit").write_text("ctl2 c\n")
    (b / "c.txt").write_text("from ctl")
    (b / ".lakefuse" / "commit").write_text("ctl c\n")
    with pytest.raises(OSError):
        (b / ".lakefuse" / "merge").write_text("ctl2\n")
    assert json.loads((b / ".lakefuse" / "merge").read_text())["conflicts"] == ["c.txt"]
    (b / ".lakefuse" / "merge").write_text("ctl2 source-wins\n")
    time.sleep(0.3)
    assert (b / "c.txt").read_text() == "from ctl2"
    # root tag, and malformed requests change nothing
    (mnt / ".lakefuse" / "tag").write_text("ctl-tag ctl\n")
    assert (mnt / "ctl-tag" / "c.txt").read_text() == "from ctl2"
    with pytest.raises(OSError) as ei:
        (mnt / ".lakefuse" / "tag").write_text("only-a-name\n")
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(OSError) as ei:
        os.rmdir(mnt / "ctl2")
    assert ei.value.errno == errno.EPERM


def test_erofs_on_commit_and_tag_trees(mnt, home):
    head = (mnt / "main" / ".lakefuse" / "head").read_text().strip()
    for tree in ("v1", head[:12], "main~0"):
        t = mnt / tree
        for fn in (lambda: (t / "x").write_text("x"), lambda: os.mkdir(t / "d"), lambda: os.unlink(t / "in" / "a.txt"),
                   lambda: os.chmod(t / "in" / "a.txt", 0o600), lambda: open(t / "in" / "a.txt", "r+b"),
                   lambda: os.rename(t / "in" / "a.txt", t / "in" / "z"), lambda: os.symlink("a", t / "l"),
                   lambda: (t / ".lakefuse" / "head").write_text("x")):
            with pytest.raises(OSError) as ei:
                fn()
            assert ei.value.errno in (errno.EROFS, errno.EACCES), (tree, ei.value)


def _renameat2(src: Path, dst: Path, flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD = -100
    r = libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags)
    return 0 if r == 0 else ctypes.get_errno()


def test_errnos_of_unsupported_and_refused_operations(mnt):
    b = branch(mnt, "errs")
    (b / "f").write_text("f")
    (b / "g").write_text("g")
    (b / "d").mkdir()
    (b / "d" / "x").write_text("x")
    (b / "e").mkdir()
    cases = [
        (lambda: os.link(b / "f", b / "hard"), errno.EPERM),
        (lambda: (b / "d" / ".lakefuse").write_text("x"), errno.EPERM),
        (lambda: os.mkdir(b / "d" / ".lakefuse"), errno.EPERM),
        (lambda: os.rename(b / "f", b / "d" / ".lakefuse"), errno.EPERM),
        (lambda: os.rmdir(b / "d"), errno.ENOTEMPTY),
        (lambda: os.rename(b / "e", b / "d"), errno.ENOTEMPTY),
        (lambda: os.rename(b / "f", mnt / "main" / "f"), errno.EXDEV),
        (lambda: os.rename(b / "d", b / "d" / "sub"), errno.EINVAL),
        (lambda: os.setxattr(b / "f", "user.lakefs.etag", b"1"), errno.EPERM),
        # a path inside the branch over the key limit; a directory whose rename would put one there
        (lambda: os.makedirs(b / ("y" * 250) / ("z" * 250)), errno.ENAMETOOLONG),
        (lambda: os.rename(b / "long", b / ("n" * 100)), errno.ENAMETOOLONG),
        (lambda: open(os.path.join(os.fsencode(b), b"latin-\xe9"), "w"), errno.EINVAL),  # not UTF-8
        (lambda: os.symlink(b"\xff", os.path.join(os.fsencode(b), b"lnk")), errno.EINVAL),
    ]
    (b / "long" / ("y" * 200) / ("z" * 200)).mkdir(parents=True)
    (b / "long" / ("y" * 200) / ("z" * 200) / "f").write_text("deep")
    for fn, want in cases:
        with pytest.raises(OSError) as ei:
            fn()
        assert ei.value.errno == want, (fn, ei.value)
    os.mkfifo(b / "fifo", 0o640)  # FIFOs and sockets are kept as entries, like symlinks
    assert stat.S_ISFIFO(os.stat(b / "fifo").st_mode)
    assert _renameat2(b / "f", b / "g", 1) == errno.EEXIST  # RENAME_NOREPLACE
    assert _renameat2(b / "f", b / "g", 2) == errno.EINVAL  # RENAME_EXCHANGE is not supported
    assert _renameat2(b / "f", b / "new", 1) == 0
    assert (b / "new").read_text() == "f"
    assert (b / "long" / ("y" * 200) / ("z" * 200) / "f").read_text() == "deep"  # the refused rename moved nothing


def _mount_options(mp: Path) -> set[str]:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        f = line.split()
        if f[1] == str(mp):
            return set(f[3].split(","))
    raise AssertionError(f"{mp} is not mounted")


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs CAP_MKNOD")
def test_device_nodes_through_the_mount(mnt):
    b = branch(mnt, "devs")
    d = b / "dev"
    d.mkdir()
    os.mknod(d / "null", stat.S_IFCHR | 0o644, os.makedev(1, 3))
    os.mknod(d / "disk", stat.S_IFBLK | 0o640, os.makedev(8, 17))
    st = os.stat(d / "null")
    assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 and st.st_size == 0
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    st = os.stat(d / "disk")
    assert stat.S_ISBLK(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (8, 17)
    assert "nodev" in _mount_options(mnt)  # the kernel refuses to open them
    with pytest.raises(OSError) as ei:
        open(d / "null", "rb")
    assert ei.value.errno == errno.EACCES
    os.chmod(d / "disk", 0o600)
    os.chown(d / "disk", 7, 8)
    os.rename(d / "disk", d / "sda1")
    st = os.stat(d / "sda1")
    assert st.st_mode == stat.S_IFBLK | 0o600 and (st.st_uid, st.st_gid) == (7, 8)
    assert st.st_rdev == os.makedev(8, 17)
    assert not (d / "disk").exists()
    os.mknod(d / "gone", stat.S_IFCHR | 0o600, os.makedev(4, 5))
    os.unlink(d / "gone")
    assert sorted(os.listdir(d)) == ["null", "sda1"]
    (b / ".lakefuse" / "commit").write_text("devices\n")
    head = (b / ".lakefuse" / "head").read_text().strip()
    for tree in (mnt / head / "dev", d):
        st = os.stat(tree / "sda1")
        assert st.st_mode == stat.S_IFBLK | 0o600 and st.st_rdev == os.makedev(8, 17), tree
        st = os.stat(tree / "null")
        assert st.st_mode == stat.S_IFCHR | 0o644 and st.st_rdev == os.makedev(1, 3), tree
    assert not (mnt / head / "dev" / "gone").exists()


def test_read_back_while_writing_from_two_handles(mnt):
    b = branch(mnt, "rw")
    with open(b / "data", "wb") as w:
        w.write(b"A" * 100_000)
        w.flush()
        with open(b / "data", "rb") as r:
            assert r.read() == b"A" * 100_000
        w.seek(50_000)
        w.write(b"B" * 10)
        w.flush()
        os.fsync(w.fileno())  # saved now
        with open(b / "data", "rb") as r:
            got = r.read()
        assert got[50_000:50_010] == b"B" * 10 and len(got) == 100_000
    with open(b / "data", "ab") as a:
        a.write(b"tail")
    with open(b / "data", "r+b") as f:
        f.truncate(10)
    assert (b / "data").read_bytes() == b"A" * 10
    os.truncate(b / "data", 3)
    assert (b / "data").read_bytes() == b"AAA"


def test_state_survives_remount_and_commit(home, tmp_path):
    mp = tmp_path / "m"
    with MountProc(home, REPO, mp, "--branch-timeout", "0.2"):
        b = branch(mp, "persist")
        (b / "empty").mkdir(mode=0o750)
        (b / "deep" / "er").mkdir(parents=True)
        (b / "f").write_text("f")
        os.chmod(b / "f", 0o604)
        os.utime(b / "f", ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
        os.symlink("f", b / "ln")
        os.chown(b / "f", 1234, 5678)
    with MountProc(home, REPO, mp, "--branch-timeout", "0.2"):
        b = mp / "persist"
        assert stat.S_IMODE(os.stat(b / "empty").st_mode) == 0o750 and os.listdir(b / "empty") == []
        assert os.listdir(b / "deep") == ["er"]
        st = os.stat(b / "f")
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns) == (
            0o604, 1234, 5678, 1_000_000_000_000_000_000)
        assert os.readlink(b / "ln") == "f"
        (b / ".lakefuse" / "commit").write_text("persist\n")
    with MountProc(home, REPO, mp, "--branch-timeout", "0.2"):
        head = (mp / "persist" / ".lakefuse" / "head").read_text().strip()
        c = mp / head
        assert os.listdir(c / "empty") == [] and os.readlink(c / "ln") == "f"
        assert sorted(os.listdir(mp / "persist")) == ["deep", "empty", "f", "in", "ln"]  # markers are hidden


def test_cli_changes_behind_the_mount(mnt, home):
    b = branch(mnt, "behind")
    (b / "mine.txt").write_text("from the mount")
    f = open(b / "open.txt", "w+b")
    f.write(b"being written")
    f.flush()
    repo = open_repo(home)
    repo.upload("behind", "cli.txt", b"from the CLI")
    c = repo.commit("behind", "by the CLI")  # includes what the mount staged
    assert repo.read(c.id, "mine.txt") == b"from the mount"
    time.sleep(0.5)
    assert (b / "cli.txt").read_text() == "from the CLI"
    assert (b / ".lakefuse" / "head").read_text().strip() == c.id
    f.seek(0)
    assert f.read() == b"being written"  # the open file is not disturbed
    f.close()
    assert repo.read("behind", "open.txt") == b"being written"
    repo.reset("behind")
    time.sleep(0.5)
    # back to the committed state: the CLI's commit came before open.txt's close (its first save,
    # which staged its create too), so that commit does not have it
    assert not (b / "open.txt").exists()


_WRITER = r"""
import hashlib, os, sys, random
root, log = sys.argv[1], sys.argv[2]
rnd = random.Random(int(sys.argv[3]))
i = 0
with open(log, "a") as out:
    while True:
        i += 1
        try:
            if rnd.random() < 0.1:
                os.makedirs(os.path.join(root, f"d{i}"), exist_ok=True)
                out.write(f"dir d{i}\n"); out.flush()
                continue
            name = f"f{rnd.randrange(40)}"
            data = random.Random(f"{sys.argv[3]}-{i}").randbytes(rnd.choice([0, 10, 5000, 200_000]))
            rec = f"{name} {hashlib.md5(data).hexdigest()} {len(data)} {i}"
            out.write(f"try {rec}\n"); out.flush()
            fd = os.open(os.path.join(root, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, data)
            if rnd.random() < 0.3:
                os.fsync(fd)
            os.close(fd)
            out.write(f"ok {rec}\n"); out.flush()
        except OSError:
            break
"""

EMPTY = ("d41d8cd98f00b204e9800998ecf8427e", 0)


@pytest.mark.slow
def test_kill_9_crash_loop_loses_nothing_acknowledged(home, tmp_path):
    """kill -9 of the daemon at random points while a writer saves files; after each
    remount every file whose close returned success holds that content (or what was
    written of the one write still in flight when the daemon died: the next mount stages
    the bytes the killed daemon had, as ext4 keeps what was written before a kill)."""
    mp = tmp_path / "crash"
    rnd = random.Random(7)
    checked = 0
    for it in range(5):
        m = MountProc(home, REPO, mp, "--branch-timeout", "0.2").start()
        b = branch(mp, "crash")
        log = tmp_path / f"acks{it}.log"
        w = subprocess.Popen([sys.executable, "-c", _WRITER, str(b), str(log), str(it)])
        time.sleep(rnd.uniform(0.3, 2.0))
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait()
        w.wait(60)
        m.stop()
        allowed: dict[str, set] = {}
        acked: dict[str, tuple] = {}
        in_flight: dict[str, bytes] = {}  # the last attempt at each name: any prefix of it may be there
        dirs = []
        for line in log.read_text().splitlines():
            kind, *rest = line.split()
            if kind == "dir":
                dirs.append(rest[0])
                continue
            name, rec = rest[0], (rest[1], int(rest[2]))
            if kind == "ok":
                acked[name] = rec
                allowed[name] = {rec}
            else:  # an attempt: may be what is there (or a prefix of it) if the daemon died during it
                allowed.setdefault(name, {EMPTY} if name not in acked and it == 0 else set()).add(rec)
                in_flight[name] = random.Random(f"{it}-{rest[3]}").randbytes(rec[1])
        repo = open_repo(home)
        for name, rec in acked.items():
            e = repo.get("crash", name)
            prefix = in_flight.get(name, b"")[:e.size]
            ok = (e.etag, e.size) in allowed[name] or (
                len(prefix) == e.size and hashlib.md5(prefix).hexdigest() == e.etag)
            assert ok, (it, name, rec, (e.etag, e.size))
            checked += 1
        for d in dirs:
            assert repo.exists("crash", d + "/"), d
        repo.close()
    assert checked > 0
    with MountProc(home, REPO, mp) as m2:
        assert sorted(os.listdir(mp / "crash"))  # mounts and lists after the crashes
    assert "Traceback" not in m2.log()


def test_a_reader_and_a_writer_of_one_branch_file_share_its_inode_its_locks_and_its_appends(mnt):
    """Found by a Linux user's tour: with branch files handed to the kernel (FUSE passthrough) by
    default, a file held open read-only (``flock -s``, ``tail -f``, a read-only sqlite connection)
    and then opened for writing gave the writer another inode -- the kernel binds an inode to one
    backing file while such opens last -- so its exclusive lock was granted beside the shared one,
    the appends never reached the reader, and inotify watches saw nothing. Branch files go
    through the daemon now (``LAKEFUSE_BRANCH_PASSTHROUGH=1`` brings passthrough back for
    read-mostly branches): one inode, as on a local filesystem."""
    import fcntl

    if os.environ.get("LAKEFUSE_BRANCH_PASSTHROUGH", "").strip() in ("1", "on", "true", "yes"):
        pytest.skip("branch passthrough asked for: a writer after a reader gets another inode (docs/SEMANTICS.md)")
    p = mnt / "main" / "shared_lock.log"
    p.write_bytes(b"first\n")
    r = os.open(p, os.O_RDONLY)
    try:
        fcntl.flock(r, fcntl.LOCK_SH)
        assert os.read(r, 100) == b"first\n"
        code = ("import fcntl, os, sys\n"
                "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n"
                "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
                "except BlockingIOError:\n    print('refused')\n"
                "else:\n    print('granted')\n"
                "os.write(fd, b'second\\n')\nos.close(fd)\n")
        out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == "refused", out
        assert os.fstat(r).st_ino == os.stat(p).st_ino
        assert os.read(r, 100) == b"second\n"  # (as tail -f reads on)
    finally:
        os.close(r)


def test_an_access_time_of_exactly_zero_is_shown_as_set(mnt):
    """``touch -a -d @0``: an access time of 1970's first second was kept (its metadata said
    0) and shown as the modification time, by stat and by a listing's attributes alike (0
    stood for "not set"). Found by a Linux user's tour; ext4 shows 0."""
    p = mnt / "main" / "atime0"
    p.write_bytes(b"x")
    os.utime(p, ns=(0, 1_000_000_000 * 10**9))
    assert os.stat(p).st_atime_ns == 0 and os.stat(p).st_mtime_ns == 10**18
    time.sleep(0.5)  # (past the branch timeout: a listing's attributes are what the kernel takes next)
    names = {e.name: e.stat(follow_symlinks=False).st_atime_ns for e in os.scandir(mnt / "main")}
    assert names["atime0"] == 0
    assert os.stat(p).st_atime_ns == 0
