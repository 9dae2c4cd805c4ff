"""Real FUSE mounts of a repository: a ``lakefuse mount -f`` daemon per module, driven
through the kernel with the tools a user runs (ls, cat, stat, find, du, cmp)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from graveler import Graveler, GravelerConfig
from tests.graveler_testutil import FAST_KV, damage_second_range
from tests.mount_testutil import MountProc, force_unmount, is_mounted, lakefuse_cmd, needs_fuse
from tests.shared_paths import LAKEFS_FIXTURES

pytestmark = needs_fuse

BIG = os.urandom(1_500_000)
DATA1 = {
    "raw/2024/01.csv": b"day,amount\n1,10\n2,20\n",
    "raw/2024/02.csv": b"day,amount\n1,11\n",
    "raw/big.bin": BIG,
    "docs/readme.txt": b"read me\n",
    "docs/empty.txt": b"",
    "names/with space.txt": b"spaces\n",
    "names/\u00fcn\u00efc\u00f6d\u00e9.txt": "unicode \u2713\n".encode(),
    "deep/a/b/c/d/e/f.txt": b"deep\n",
}
DATA2 = {**DATA1, "raw/2024/01.csv": b"day,amount\n1,10\n2,21\n3,30\n", "raw/2024/03.csv": b"day,amount\n"}
del DATA2["docs/readme.txt"]
DEV = {**DATA1, "dev-only.txt": b"staged on dev\n"}


def walk(root: Path) -> dict[str, bytes]:
    out = {}
    for d, dirs, files in os.walk(root):
        for f in files:
            p = Path(d) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A repository with two commits, a tag and a branch with staged changes, mounted."""
    base = tmp_path_factory.mktemp("mountfuse")
    home = base / "home"
    g = Graveler(GravelerConfig(home=home, kv=FAST_KV))
    r = g.create_repository("demo", f"file://{base}/ns")
    for k, v in DATA1.items():
        r.upload("main", k, v, content_type="text/csv" if k.endswith(".csv") else "",
                 metadata={"origin": "test"} if k == "docs/readme.txt" else None)
    c1 = r.commit("main", "first")
    r.create_tag("v1", "main")
    r.create_branch("dev")
    r.upload("dev", "dev-only.txt", DEV["dev-only.txt"])
    r.upload("main", "raw/2024/01.csv", DATA2["raw/2024/01.csv"])
    r.upload("main", "raw/2024/03.csv", DATA2["raw/2024/03.csv"])
    r.delete("main", "docs/readme.txt")
    c2 = r.commit("main", "second")
    mp = base / "mnt"
    m = MountProc(home, "demo", mp, "--branch-timeout", "0.2")
    m.start()
    try:
        yield {"home": home, "mp": mp, "repo": r, "c1": c1, "c2": c2, "mount": m, "base": base}
    finally:
        m.stop()
        g.close()
    assert not is_mounted(mp)


def test_root_lists_branches_and_tags_only(world):
    assert sorted(os.listdir(world["mp"])) == ["dev", "main", "v1"]


@pytest.mark.parametrize("ref,model", [
    ("main", DATA2), ("v1", DATA1), ("main~1", DATA1), ("main^", DATA1), ("dev", DEV), ("C1PREFIX", DATA1),
    ("C2FULL", DATA2), ("main@", DATA2),
])
def test_tree_contents_match_the_model(world, ref, model):
    ref = ref.replace("C1PREFIX", world["c1"].id[:12]).replace("C2FULL", world["c2"].id)
    root = world["mp"] / ref
    assert walk(root) == model
    found = subprocess.run(["find", str(root), "-type", "f"], capture_output=True, text=True, check=True).stdout
    assert sorted(Path(p).relative_to(root).as_posix() for p in found.split("\n") if p) == sorted(model)
    du = subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True, check=True).stdout
    assert int(du.split()[0]) == sum(len(v) for v in model.values())
    for k, v in model.items():
        st = os.stat(root / k)
        assert st.st_size == len(v)
        # read-only defaults on immutable trees; branch trees are writable (0644)
        assert oct(st.st_mode & 0o777) == oct(0o644 if ref in ("main", "dev") else 0o444)


def test_cat_cmp_and_ls_through_the_tools(world, tmp_path):
    mp = world["mp"]
    src = tmp_path / "big.bin"
    src.write_bytes(BIG)
    subprocess.run(["cmp", str(src), str(mp / "v1" / "raw" / "big.bin")], check=True)
    out = subprocess.run(["cat", str(mp / "main" / "raw" / "2024" / "01.csv")], capture_output=True, check=True)
    assert out.stdout == DATA2["raw/2024/01.csv"]
    ls = subprocess.run(["ls", "-la", str(mp / "main~1" / "docs")], capture_output=True, text=True, check=True)
    assert "readme.txt" in ls.stdout and "empty.txt" in ls.stdout
    st = subprocess.run(["stat", "-c", "%s %F", str(mp / "v1" / "raw" / "big.bin")], capture_output=True,
                        text=True, check=True)
    assert st.stdout.split()[0] == str(len(BIG))
    # reads at odd offsets
    with open(mp / "v1" / "raw" / "big.bin", "rb") as f:
        f.seek(1_000_003)
        assert f.read(70_001) == BIG[1_000_003:1_070_004]


def test_unknown_and_invalid_refs_are_enoent(world):
    mp = world["mp"]
    for name in ("nope", "main~99", "v1^3", "0000000000", "main@@", "a:b"):
        with pytest.raises(FileNotFoundError):
            os.stat(mp / name)
    with pytest.raises(FileNotFoundError):
        os.stat(mp / "main" / "no" / "such")
    with pytest.raises(OSError) as ei:
        os.stat(mp / "main" / ("n" * 256))
    assert ei.value.errno == errno.ENAMETOOLONG


@pytest.mark.parametrize("ref", ["v1", "main~1", "C1PREFIX"])
def test_every_write_type_call_is_erofs(world, ref):
    ref = ref.replace("C1PREFIX", world["c1"].id[:12])
    root = world["mp"] / ref
    f = root / "raw" / "2024" / "02.csv"
    d = root / "docs"
    calls = {
        "open-w": lambda: open(f, "wb"),
        "open-a": lambda: open(f, "ab"),
        "open-rw": lambda: open(f, "r+b"),
        "create": lambda: open(d / "new.txt", "xb"),
        "mkdir": lambda: os.mkdir(d / "newdir"),
        "unlink": lambda: os.unlink(f),
        "rmdir": lambda: os.rmdir(root / "deep" / "a" / "b" / "c" / "d" / "e"),
        "rename": lambda: os.rename(f, d / "moved.csv"),
        "chmod": lambda: os.chmod(f, 0o644),
        "chown": lambda: os.chown(f, 1, 1),
        "truncate": lambda: os.truncate(f, 0),
        "utime": lambda: os.utime(f, (1, 1)),
        "setxattr": lambda: os.setxattr(f, "user.x", b"1"),
        "removexattr": lambda: os.removexattr(f, "user.lakefs.etag"),
        "symlink": lambda: os.symlink("x", d / "link"),
        "link": lambda: os.link(f, d / "hard"),
        "mknod": lambda: os.mknod(d / "fifo", 0o600 | 0o010000),
    }
    for name, call in calls.items():
        with pytest.raises(OSError) as ei:
            call()
        assert ei.value.errno == errno.EROFS, name
    assert walk(root).get("raw/2024/02.csv") == DATA1["raw/2024/02.csv"]


def test_xattrs(world):
    mp = world["mp"]
    f = mp / "v1" / "docs" / "readme.txt"
    names = set(os.listxattr(f))
    assert {"user.lakefs.etag", "user.lakefs.physical_address", "user.lakefs.commit",
            "user.lakefs.meta.origin"} <= names
    e = world["repo"].get("v1", "docs/readme.txt")
    assert os.getxattr(f, "user.lakefs.etag") == e.etag.encode()
    assert os.getxattr(f, "user.lakefs.commit") == world["c1"].id.encode()
    assert os.getxattr(f, "user.lakefs.meta.origin") == b"test"
    assert os.getxattr(mp / "v1" / "raw" / "2024" / "01.csv", "user.lakefs.content_type") == b"text/csv"
    assert os.getxattr(mp / "main" / "raw", "user.lakefs.commit") == world["c2"].id.encode()
    assert os.getxattr(mp / "main~1", "user.lakefs.commit") == world["c1"].id.encode()
    with pytest.raises(OSError) as ei:
        os.getxattr(f, "user.nope")
    assert ei.value.errno == errno.ENODATA
    with pytest.raises(OSError) as ei:  # answered on the trio thread (asked before every write)
        os.getxattr(f, "security.capability")
    assert ei.value.errno == errno.ENOTSUP  # only user.* attributes are kept


def test_info_files(world):
    mp = world["mp"]
    assert (mp / "main" / ".lakefuse" / "head").read_text() == world["c2"].id + "\n"
    assert (mp / "main~1" / ".lakefuse" / "head").read_text() == world["c1"].id + "\n"
    log = (mp / "main" / ".lakefuse" / "log").read_text().splitlines()
    assert [ln.split()[0] for ln in log] == [world["c2"].id, world["c1"].id, world["repo"].log("main~1").__next__().parents[0]]
    stats = json.loads((mp / ".lakefuse" / "stats").read_text())
    assert stats["pid"] == world["mount"].proc.pid
    # the files read so far: by the daemon, or by the kernel (FUSE passthrough: only their opens counted)
    assert stats["requests"]["lookup"] > 0 and stats["bytes_from_store"] + stats.get("opens_passthrough", 0) > 0
    assert ".lakefuse" not in os.listdir(mp / "main")  # reserved: reachable by path, never listed


def test_stats_say_how_long_requests_took_and_which_path_served_the_bytes(world):
    mp = world["mp"]
    before = json.loads((mp / ".lakefuse" / "stats").read_text())
    data = (mp / "dev" / "dev-only.txt").read_bytes()  # a branch tree: served by the daemon
    assert data == DEV["dev-only.txt"]
    stats = json.loads((mp / ".lakefuse" / "stats").read_text())
    for op in ("lookup", "open", "read"):
        lat = stats["latency"][op]
        in_flight = 1 if op == "open" else 0  # reading the stats: its own open is not answered yet
        assert lat["n"] == stats["requests"][op] - in_flight and 0 < lat["p50_us"] <= lat["p99_us"] < 10_000_000, \
            (op, lat)
    served = {k: stats.get(k, 0) - before.get(k, 0) for k in ("bytes_memory", "bytes_inline", "bytes_thread")}
    assert sum(served.values()) >= len(data), served
    # bytes_read is their sum (it left out reads served on the FUSE thread: an ML engineer's tour)
    assert stats["bytes_read"] == sum(stats.get(k, 0) for k in ("bytes_memory", "bytes_inline", "bytes_thread"))
    assert "data_cache" not in stats  # a local store has no data cache (S3: test_mount_s3)


def _read_everything(root: str) -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def test_concurrent_readers_in_several_processes(world):
    root = str(world["mp"] / "v1")
    expect = {k: hashlib.sha256(v).hexdigest() for k, v in DATA1.items()}
    with ProcessPoolExecutor(4) as pool:
        results = list(pool.map(_read_everything, [root] * 8))
    assert all(r == expect for r in results)


def test_branch_tree_shows_changes_made_behind_the_mount(world):
    r = world["repo"]
    mp = world["mp"]
    f = mp / "dev" / "late.txt"
    assert not f.exists()
    r.upload("dev", "late.txt", b"late\n")
    deadline = time.monotonic() + 5
    while not f.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f.read_bytes() == b"late\n"
    r.upload("dev", "late.txt", b"later, and longer\n")
    time.sleep(0.3)  # the branch timeout
    assert f.read_bytes() == b"later, and longer\n"
    r.commit("dev", "late")
    time.sleep(0.3)
    assert (mp / "dev" / ".lakefuse" / "head").read_text().strip() == r.get_commit("dev").id
    assert f.read_bytes() == b"later, and longer\n"
    r.delete("dev", "late.txt")
    time.sleep(0.3)
    assert not f.exists()


def test_a_file_replaced_behind_the_mount_while_open_keeps_its_version(world):
    """Another process replaces a branch file with a shorter version while it is open through
    the mount: the open descriptor keeps the version it opened -- fstat says its size (and
    nlink 0, as a file renamed over), a read goes on to its end, mmap by that size works --
    and the name shows the new version on a new inode. fstat used to show the new size on the
    old inode: reads stopped short at it (the daemon's path), mmap died of SIGBUS, tail -F
    never looked at the name again."""
    import mmap

    r = world["repo"]
    f = world["mp"] / "dev" / "swapped.bin"
    old, new = os.urandom(300_000), os.urandom(100_000)
    r.upload("dev", "swapped.bin", old)
    deadline = time.monotonic() + 5
    while not f.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(f, "rb") as fd:
        assert fd.read(1000) == old[:1000]
        ino = os.fstat(fd.fileno()).st_ino
        r.upload("dev", "swapped.bin", new)
        time.sleep(0.5)  # (the stamp watch has dropped the kernel's caches of the branch)
        assert "swapped.bin" in os.listdir(f.parent)  # a listing first: it must not refresh the open inode
        deadline = time.monotonic() + 10
        while f.read_bytes() != new:  # the name: within the branch timeout and the stamp watch
            assert time.monotonic() < deadline, "the new version never showed"
            time.sleep(0.05)
        time.sleep(0.3)  # (the kernel keeps an inode's attributes for the branch timeout, 0.2 s here)
        st = os.fstat(fd.fileno())
        assert (st.st_ino, st.st_size, st.st_nlink) == (ino, len(old), 0)
        assert os.stat(f).st_ino != ino and os.stat(f).st_size == len(new)
        assert fd.read() == old[1000:]  # to the end of the version it opened
        with mmap.mmap(fd.fileno(), st.st_size, prot=mmap.PROT_READ) as m:
            assert m[250_000:250_010] == old[250_000:250_010]
    assert f.read_bytes() == new


def test_readdir_restarts_and_seeks(world):
    # os.scandir in two interleaved iterators of the same directory: offsets are per handle
    d = world["mp"] / "v1" / "raw" / "2024"
    a = os.scandir(d)
    b = os.scandir(d)
    first_a = next(a).name
    names_b = [e.name for e in b]
    names_a = [first_a] + [e.name for e in a]
    a.close()
    b.close()
    assert names_a == names_b == ["01.csv", "02.csv"]


# --- lifecycle ----------------------------------------------------------------------------------


def test_daemonized_mount_and_umount(world, tmp_path):
    mp = tmp_path / "mnt2"
    mp.mkdir()
    r = subprocess.run(lakefuse_cmd(world["home"], "mount", "lakefs://demo", str(mp), "--log",
                                    str(tmp_path / "d.log")), capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert "lakefuse umount" in r.stderr
        assert (mp / "v1" / "docs" / "readme.txt").read_bytes() == DATA1["docs/readme.txt"]
        pid = json.loads((mp / ".lakefuse" / "stats").read_text())["pid"]
        u = subprocess.run(lakefuse_cmd(world["home"], "umount", str(mp)), capture_output=True, text=True,
                           timeout=60)
        assert u.returncode == 0, u.stderr
        assert not is_mounted(mp)
        from lakefuse.mount.daemon import _alive

        assert not _alive(pid)  # gone (or a zombie nobody reaps in this container)
    finally:
        force_unmount(mp)
    u = subprocess.run(lakefuse_cmd(world["home"], "umount", str(mp)), capture_output=True, text=True)
    assert u.returncode == 1 and "not mounted" in u.stderr


def test_mount_and_umount_find_a_mount_point_named_through_symbolic_links(world, tmp_path):
    """A mount point named through a link -- a linked parent directory, or a link to the mount
    point itself -- is the path the kernel lists: the mount says that path, its busy check and
    umount find it (umount through a link used to answer "not mounted" and leave it mounted)."""
    real = tmp_path / "real"
    (real / "mnt").mkdir(parents=True)
    via = tmp_path / "via"
    via.symlink_to(real)  # a linked parent
    link = tmp_path / "link"
    link.symlink_to(real / "mnt")  # a link to the mount point
    home = world["home"]

    def run(*args):
        return subprocess.run(lakefuse_cmd(home, *args), capture_output=True, text=True, timeout=60)

    try:
        for mount_as, umount_as in ((via / "mnt", link), (link, via / "mnt")):
            r = run("mount", "lakefs://demo", str(mount_as), "--log", str(tmp_path / "d.log"))
            assert r.returncode == 0, r.stderr
            assert f"on {real / 'mnt'} " in r.stderr  # the path the kernel lists
            assert is_mounted(real / "mnt") and is_mounted(link) and is_mounted(via / "mnt")
            assert (link / "v1" / "docs" / "readme.txt").read_bytes() == DATA1["docs/readme.txt"]
            again = run("mount", "lakefs://demo", str(umount_as))
            assert again.returncode != 0 and "busy" in again.stderr
            u = run("umount", str(umount_as))
            assert u.returncode == 0, u.stderr
            assert not is_mounted(real / "mnt")
    finally:
        force_unmount(real / "mnt")


def test_a_daemonized_mount_passes_its_store_timeouts_on(world, tmp_path):
    """``--timeout`` and ``--max-attempts`` bound an S3 read through the mount (timeout x
    attempts): the background daemon must get them, given before or after ``mount`` (it ran
    with the defaults, 8 s x 3, whatever was asked)."""
    for i, (before, after) in enumerate(((["--timeout", "3", "--max-attempts", "2"], []),
                                         ([], ["--timeout", "3", "--max-attempts", "2"]))):
        mp = tmp_path / f"mnt{i}"
        mp.mkdir()
        r = subprocess.run([*lakefuse_cmd(world["home"]), *before, "mount", "lakefs://demo", str(mp),
                            *after, "--log", str(tmp_path / f"d{i}.log")], capture_output=True, text=True, timeout=60)
        try:
            assert r.returncode == 0, r.stderr
            pid = json.loads((mp / ".lakefuse" / "stats").read_text())["pid"]
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            i_t, i_a = argv.index(b"--timeout"), argv.index(b"--max-attempts")
            assert float(argv[i_t + 1]) == 3.0 and argv[i_a + 1] == b"2"
        finally:
            subprocess.run(lakefuse_cmd(world["home"], "umount", str(mp)), capture_output=True, timeout=60)
            force_unmount(mp)


def test_a_mounted_repository_is_not_deleted_under_its_daemon(world):
    """Found by a git user's tour: `repo delete` of a mounted repository went through; the mount
    went on serving it, its saves failed (EIO) or, after a `repo create` of the same name, went
    into the deleted database (lost). The delete is refused while a process has it open."""
    r = subprocess.run(lakefuse_cmd(world["home"], "repo", "delete", "lakefs://demo", "--yes"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 4 and "is open in process" in r.stderr and "umount" in r.stderr, r
    assert str(world["mount"].proc.pid) in r.stderr
    assert f"{world['mp']})" in r.stderr or f"{world['mp']} " in r.stderr  # (its mount point whole: a docs tour)
    assert (world["home"] / "repos" / "demo" / "refs.lmdb" / "data.mdb").exists()
    assert (world["mp"] / "v1" / "raw" / "2024" / "02.csv").read_bytes() == DATA1["raw/2024/02.csv"]


def test_mount_failures_say_why(world, tmp_path):
    home = world["home"]

    def mount(*args):
        r = subprocess.run(lakefuse_cmd(home, "mount", *args), capture_output=True, text=True, timeout=60)
        assert "Traceback" not in r.stderr, r.stderr
        return r

    r = mount("lakefs://nosuchrepo", str(tmp_path))
    assert r.returncode == 3 and "not found" in r.stderr  # the exit codes of every command (was 1)
    # a mistyped --home: said before a daemon starts, nothing made there (it left logs/mount-demo.log)
    typo = tmp_path / "hmoe"
    r = subprocess.run(lakefuse_cmd(typo, "mount", "lakefs://demo", str(tmp_path)), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 3 and "holds no repositories" in r.stderr and "--home" in r.stderr, r.stderr
    assert not typo.exists() and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "afile").write_text("")
    r = mount("lakefs://demo", str(tmp_path), "--log", str(tmp_path / "afile" / "x.log"))
    assert r.returncode == 2 and "is not a directory" in r.stderr, r.stderr  # (it said "File exists")
    r = mount("lakefs://demo", str(tmp_path), "--timeout", "0")
    assert r.returncode == 2 and "--timeout must be a positive" in r.stderr
    r = mount("lakefs://demo", str(tmp_path / "missing"))
    assert r.returncode == 1 and "does not exist" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1  # one line, the reason
    r = mount("lakefs://demo", str(world["mp"]))
    assert r.returncode != 0 and "busy" in r.stderr
    r = mount("lakefs://demo", str(world["mp"]), "-f")
    assert r.returncode != 0 and "busy" in r.stderr
    f = tmp_path / "file"
    f.write_text("x")
    r = mount("lakefs://demo", str(f))
    assert r.returncode != 0 and "not a directory" in r.stderr


def test_a_log_file_that_is_a_symbolic_link_is_never_written_through(tmp_path):
    """Found by a tour as a non-root user's admin: root mounting a repository of a user's home
    appended its daemon's log through a symbolic link that user put at ``<home>/logs/mount-REPO.log``
    -- to any file. A log is opened without following links now: the mount is refused, saying
    why, the file the link names untouched; a log file that is a plain file is appended to."""
    home = tmp_path / "home"
    r = subprocess.run(lakefuse_cmd(home, "repo", "create", "lakefs://logs"), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    (home / "logs").mkdir()
    (home / "logs" / "mount-logs.log").symlink_to(victim)
    mp = tmp_path / "mp"
    mp.mkdir()
    for extra in ([], ["-f", "--log", str(home / "logs" / "mount-logs.log")]):
        r = subprocess.run(lakefuse_cmd(home, "mount", "lakefs://logs", str(mp), *extra), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and "symbolic link" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert victim.read_text() == "root's file\n" and not is_mounted(mp)


def test_a_log_file_that_is_a_fifo_or_another_users_is_refused_not_waited_on(tmp_path):
    """Found by a security tour: a FIFO at the log's path (planted by another user in a sticky
    directory) hung ``lakefuse mount`` for good, saying nothing; a log file another user owns was
    appended to, handing that user the daemon's log. Both are refused now, saying why; a log file
    of this user's own is appended to as before."""
    home = tmp_path / "home"
    r = subprocess.run(lakefuse_cmd(home, "repo", "create", "lakefs://logs"), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    mp = tmp_path / "mp"
    mp.mkdir()
    fifo, foreign, own = tmp_path / "fifo.log", tmp_path / "foreign.log", tmp_path / "own.log"
    os.mkfifo(fifo)
    foreign.write_text("another user's\n")
    os.chown(foreign, 54321, -1)
    own.write_text("earlier lines\n")
    for path, why in ((fifo, "FIFO"), (foreign, "belongs to another user")):
        for extra in ([], ["-f"]):
            r = subprocess.run(lakefuse_cmd(home, "mount", "lakefs://logs", str(mp), *extra, "--log", str(path)),
                               capture_output=True, text=True, timeout=60)
            assert r.returncode != 0 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
            assert not is_mounted(mp)
    assert foreign.read_text() == "another user's\n"
    r = subprocess.run(lakefuse_cmd(home, "mount", "lakefs://logs", str(mp), "--log", str(own)),
                       capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
    finally:
        subprocess.run(lakefuse_cmd(home, "umount", str(mp)), capture_output=True, text=True, timeout=60)
    assert own.read_text().startswith("earlier lines\n") and "mounted lakefs://logs" in own.read_text()


def test_the_unmount_hint_quotes_a_mount_point_a_shell_would_split(tmp_path):
    """The hint ``mount`` prints ("unmount with: lakefuse umount MP") is pasted into a shell: a
    mount point holding a space is quoted (found by a non-root user's tour), and the command works."""
    import shlex

    home = tmp_path / "home"
    r = subprocess.run(lakefuse_cmd(home, "repo", "create", "lakefs://hint"), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    mp = tmp_path / "my mount"
    mp.mkdir()
    r = subprocess.run(lakefuse_cmd(home, "mount", "lakefs://hint", str(mp)), capture_output=True, text=True,
                       timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        hint = r.stderr.split("unmount with: ")[1].strip()
        assert hint == f"lakefuse umount {shlex.quote(str(mp))}" and shlex.split(hint)[2] == str(mp)
    finally:
        u = subprocess.run(lakefuse_cmd(home, "umount", str(mp)), capture_output=True, text=True, timeout=60)
    assert u.returncode == 0 and not is_mounted(mp), u.stderr


def test_a_second_daemon_starting_on_a_mount_point_another_is_mounting_is_refused(world, tmp_path):
    """Two ``mount -f`` started together both found the mount point free, and the second mounted
    over the first. A daemon holds the directory it mounts over (``flock``) from its check on:
    one that finds it held is refused, nothing is mounted, and the holder's mount goes on."""
    import fcntl

    mp = tmp_path / "mp"
    mp.mkdir()
    fd = os.open(mp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a daemon between its check and its mount
        r = subprocess.run(lakefuse_cmd(world["home"], "mount", "lakefs://demo", str(mp), "-f"),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "another lakefuse daemon is mounting there" in r.stderr, r.stderr
        assert not is_mounted(mp)
    finally:
        os.close(fd)
    m = MountProc(world["home"], "demo", mp).start()  # once let go: mounts as ever
    try:
        assert sorted(os.listdir(mp)) == sorted(os.listdir(world["mp"]))
    finally:
        m.stop()


def test_sigterm_unmounts_cleanly(world, tmp_path):
    mp = tmp_path / "mnt3"
    m = MountProc(world["home"], "demo", mp).start()
    try:
        assert os.listdir(mp / "v1")
        m.proc.send_signal(signal.SIGTERM)
        assert m.proc.wait(15) == 0
        assert not is_mounted(mp)
    finally:
        m.stop()


def test_killed_daemon_is_cleared_by_umount(world, tmp_path):
    mp = tmp_path / "mnt4"
    m = MountProc(world["home"], "demo", mp).start()
    try:
        m.proc.kill()
        m.proc.wait(10)
        assert is_mounted(mp)
        with pytest.raises(OSError) as ei:
            os.listdir(mp)
        assert ei.value.errno == errno.ENOTCONN
        u = subprocess.run(lakefuse_cmd(world["home"], "umount", str(mp)), capture_output=True, text=True,
                           timeout=60)
        assert u.returncode == 0, u.stderr
        assert not is_mounted(mp)
        # and the mount point is usable again
        with MountProc(world["home"], "demo", mp):
            assert os.listdir(mp / "v1")
    finally:
        m.stop()


def test_sigterm_saves_a_file_still_open_for_writing_and_says_so(world, tmp_path):
    """A SIGTERM (systemctl stop) while a file is open for writing: what was written is saved
    and staged, as after a kill -9, and the log says so for that file (it was saved silently)."""
    mp = tmp_path / "mnt5"
    m = MountProc(world["home"], "demo", mp).start()
    try:
        f = open(mp / "dev" / "open-at-stop.bin", "wb", buffering=0)
        f.write(b"written before the stop\n")
        m.proc.send_signal(signal.SIGTERM)
        assert m.proc.wait(15) == 0
        with pytest.raises(OSError):
            f.close()  # (the mount is gone: ENOTCONN)
        assert world["repo"].read("dev", "open-at-stop.bin") == b"written before the stop\n"
        assert "open-at-stop.bin on branch dev was open for writing when the mount stopped" in m.log()
    finally:
        m.stop()


def test_umount_clears_a_killed_daemons_mount_while_a_file_is_held_open(world, tmp_path):
    """A killed daemon's mount with a file still open there: nothing can be served any more, so
    umount detaches it (lazily) rather than answer "busy" until that process exits."""
    mp = tmp_path / "mnt6"
    m = MountProc(world["home"], "demo", mp).start()
    try:
        holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'rb'); f.read(1);"
                                   " print('open', flush=True); time.sleep(60)", str(mp / "v1" / "docs" / "readme.txt")],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "open"
            m.proc.kill()
            m.proc.wait(10)
            u = subprocess.run(lakefuse_cmd(world["home"], "umount", str(mp)), capture_output=True, text=True,
                               timeout=60)
            assert u.returncode == 0, u.stderr
            assert not is_mounted(mp) and "detached lazily" in u.stderr
        finally:
            holder.kill()
            holder.wait(10)
    finally:
        m.stop()


# --- a repository adopted from lakeFS ------------------------------------------------------------

FIXTURES = LAKEFS_FIXTURES


def test_restored_lakefs_refs_dump_mounts(tmp_path):
    """lakeFS's own range and metarange files, adopted, dumped as a refs dump, restored into a
    fresh home and mounted: ls and stat work; the object lakeFS kept elsewhere is EIO on read."""
    from tests.test_graveler_ops import _table_id

    nsdir = tmp_path / "lakefs-ns"
    (nsdir / "_lakefs").mkdir(parents=True)
    range_id, mr_id = _table_id(FIXTURES / "range.sst"), _table_id(FIXTURES / "metarange.sst")
    shutil.copy(FIXTURES / "range.sst", nsdir / "_lakefs" / range_id)
    shutil.copy(FIXTURES / "metarange.sst", nsdir / "_lakefs" / mr_id)
    (nsdir / "fdf87fcf9ec849f98514ddb7e041ad56").write_bytes(b"yes!")
    g = Graveler(GravelerConfig(home=tmp_path / "old", kv=FAST_KV))
    r = g.create_repository("lake", f"file://{nsdir}")
    r.commit_metarange("main", mr_id, "adopt lakeFS metarange")
    r.create_tag("adopted", "main")
    r.dump_refs()
    g.close()
    home = tmp_path / "new"
    subprocess.run(lakefuse_cmd(home, "refs", "restore", "lakefs://lake", "--storage", f"file://{nsdir}"),
                   check=True, capture_output=True)
    mp = tmp_path / "mnt"
    with MountProc(home, "lake", mp):
        assert sorted(os.listdir(mp)) == ["adopted", "main"]
        assert sorted(os.listdir(mp / "adopted" / "a" / "b" / "c")) == ["no", "yes"]
        assert (mp / "main" / "a" / "b" / "c" / "yes").read_bytes() == b"yes!"
        assert os.stat(mp / "main" / "a" / "b" / "c" / "no").st_size == 11
        with pytest.raises(OSError) as ei:
            (mp / "main" / "a" / "b" / "c" / "no").read_bytes()
        assert ei.value.errno == errno.EIO
        assert os.listdir(mp / "main" / "a")  # the daemon is still there


def test_corrupt_range_is_eio_for_its_paths_only(tmp_path):
    """A damaged range file in the store: the paths it covers are EIO (one log line), every
    other path still reads, and the daemon stays up."""
    from graveler.committed.writer import RangeParams

    home = tmp_path / "home"
    g = Graveler(GravelerConfig(home=home, kv=FAST_KV,
                                range_params=RangeParams(min_range_size=0, max_range_size=2048, raggedness=5)))
    r = g.create_repository("corrupt", f"file://{tmp_path}/ns")
    keys = [f"d{i:02d}/f{j:02d}" for i in range(8) for j in range(8)]
    for k in keys:
        r.upload("main", k, k.encode())
    r.commit("main", "many ranges")
    commit_id = r.get_commit("main").id
    _, victim = damage_second_range(r, tmp_path / "ns")
    g.close()
    mp = tmp_path / "mnt"
    with MountProc(home, "corrupt", mp) as m:
        for tree in ("main", commit_id):  # a branch and a commit: a listing read whole for lookups
            ok, bad = 0, 0  # (the second lookup in a directory) must not fail names outside the damage
            for k in keys:
                p = mp / tree / k
                inside = victim.min_key <= k.encode() <= victim.max_key
                try:
                    assert p.read_bytes() == k.encode()
                    ok += 1
                except OSError as e:
                    assert e.errno in (errno.EIO,), k
                    bad += 1
                    assert inside, k
            assert ok > 0 and bad > 0
        for i in range(8):  # a directory whose keys avoid the damaged range still lists
            lo, hi = f"d{i:02d}/".encode(), f"d{i:02d}0".encode()
            if hi <= victim.min_key or lo > victim.max_key:
                assert len(os.listdir(mp / "main" / f"d{i:02d}")) == 8
            else:
                with pytest.raises(OSError) as ei:
                    os.listdir(mp / "main" / f"d{i:02d}")
                assert ei.value.errno == errno.EIO
        assert (mp / "main" / "d07" / "f07").read_bytes() == b"d07/f07"  # the daemon is still up
    assert m.log().count("CorruptedData") >= 1


def test_directory_of_100000_entries(tmp_path):
    """ls -f of 100,000 entries through the mount, paged (never loaded whole); the daemon's
    inode table follows what the kernel keeps (plain READDIR past the first reply: none)."""
    home = tmp_path / "home"
    g = Graveler(GravelerConfig(home=home, kv=FAST_KV))
    r = g.create_repository("big", f"file://{tmp_path}/ns")
    one = r.upload("main", "one", b"1")
    n = 100_000
    r.stage_many("main", ((f"d/e{i:06d}", one) for i in range(n)))
    r.commit("main", "100k")
    g.close()
    mp = tmp_path / "mnt"
    with MountProc(home, "big", mp):
        out = subprocess.run(["ls", "-f", str(mp / "main" / "d")], capture_output=True, check=True).stdout
        names = [x for x in out.split(b"\n") if x and x not in (b".", b"..")]
        assert len(names) == n and len(set(names)) == n
        with os.scandir(mp / "main" / "d") as it:  # a second listing gives the same, in order
            first = [e.name for _, e in zip(range(5), it)]
        assert first == [f"e{i:06d}" for i in range(5)]
        stats = json.loads((mp / ".lakefuse" / "stats").read_text())
        # many replies, not one: READDIRPLUS for the first (~800 names), then plain READDIR (~4,000
        # short names each: nothing stats them) -- no inode made for those, here or in the kernel
        assert stats["requests"]["readdir"] >= n // 5000
        assert stats["readdir_plain_entries"] >= n - 1000
        assert stats["inodes"] < 5000


def _mount_options(mp: Path) -> set[str]:
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[1] == str(mp):
                return set(fields[3].split(","))
    raise AssertionError(f"{mp} is not in /proc/mounts")


def test_no_allow_other_unless_asked_and_the_kernel_checks_permissions(world):
    opts = _mount_options(world["mp"])
    assert "default_permissions" in opts and "allow_other" not in opts, opts


def test_root_names_are_resolved_again_when_a_tag_moves(world):
    """A moved tag leads to the new tree once the root's name expires (the branch timeout, 0.2 s
    here); a program that holds a file of the old tree keeps reading it."""
    mp, r, c1, c2 = world["mp"], world["repo"], world["c1"], world["c2"]
    old = mp / "v1" / "docs" / "readme.txt"  # in the first commit, deleted by the second
    with open(old, "rb") as held:
        try:
            r.delete_tag("v1")
            r.create_tag("v1", c2.id)
            time.sleep(0.6)
            assert not old.exists()
            assert (mp / "v1" / "raw" / "2024" / "03.csv").read_bytes() == DATA2["raw/2024/03.csv"]
            assert held.read() == DATA1["docs/readme.txt"]
        finally:
            r.delete_tag("v1")
            r.create_tag("v1", c1.id)
    time.sleep(0.6)
    assert old.read_bytes() == DATA1["docs/readme.txt"]


def test_an_administrators_daemon_lifecycle(world, tmp_path):
    """An administrator's findings: SIGHUP (logrotate's signal) unmounted the mount and nothing
    opened the log again; after a kill -9 the next mount said "busy: something is already
    mounted there"; `umount` of a stopped daemon said "its daemon is gone", exited 0 and left it
    running; a daemonized mount that libfuse refused said only "fuse_session_new() failed"."""
    import signal

    home, mp, logf = world["home"], tmp_path / "m", tmp_path / "d.log"
    mp.mkdir()

    def run(*args, timeout=60):
        return subprocess.run(lakefuse_cmd(home, *args), capture_output=True, text=True, timeout=timeout)

    def pid_of() -> int:
        return json.loads((mp / ".lakefuse" / "stats").read_text())["pid"]

    try:
        assert run("mount", "lakefs://demo", str(mp), "--log", str(logf)).returncode == 0
        pid = pid_of()
        logf.rename(tmp_path / "d.log.1")  # a rotation by rename, then its signal
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not logf.exists():
            assert time.monotonic() < deadline, "the log was not opened again"
            time.sleep(0.05)
        assert is_mounted(mp) and pid_of() == pid  # still serving
        assert "opened again" in logf.read_text()
        os.kill(pid, signal.SIGKILL)  # a killed daemon leaves its mount behind
        time.sleep(0.2)
        r = run("mount", "lakefs://demo", str(mp), "--log", str(logf))
        assert r.returncode == 1 and f"lakefuse umount {mp}" in r.stderr, r.stderr
        assert run("umount", str(mp)).returncode == 0
        assert run("mount", "lakefs://demo", str(mp), "--log", str(logf)).returncode == 0
        pid = pid_of()
        os.kill(pid, signal.SIGSTOP)  # a daemon that does not answer
        try:
            t0 = time.monotonic()
            u = run("umount", str(mp), "--timeout", "2")
            assert u.returncode == 1 and f"pid {pid}" in u.stderr and "did not answer" in u.stderr, u.stderr
            assert time.monotonic() - t0 < 4.5  # --timeout counts from the call (it took 7.6 s: a docs tour)
            assert not is_mounted(mp)  # detached all the same
        finally:
            os.kill(pid, signal.SIGCONT)
        # --lazy with a file open there: detached at once, exit 0 (it waited 30 s and said 1)
        assert run("mount", "lakefs://demo", str(mp), "--log", str(logf)).returncode == 0
        with open(mp / "v1" / "docs" / "readme.txt", "rb") as held:
            t0 = time.monotonic()
            assert run("umount", str(mp), "--lazy").returncode == 0 and time.monotonic() - t0 < 10
            assert not is_mounted(mp) and held.read() == DATA1["docs/readme.txt"]
        r = run("mount", "lakefs://demo", str(mp), "--log", str(logf), "-o", "bogus_opt=1")
        assert r.returncode == 1 and "unknown option" in r.stderr and "bogus_opt" in r.stderr, r.stderr
        r = run("mount", "lakefs://demo", str(mp), "--log", str(logf), "-o", "allow_other,allow_root")
        assert r.returncode == 1 and "exclude each other" in r.stderr, r.stderr
    finally:
        force_unmount(mp)
