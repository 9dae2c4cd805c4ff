"""What an open tells the kernel, and what that spares: a reader's close sends no FLUSH
(FOPEN_NOFLUSH: nothing to save), a directory of an immutable tree is listed by the daemon
once and then from the kernel's cache (FOPEN_CACHE_DIR), while a writer's close still
flushes (saves) and a branch directory is listed afresh every time. And the inline open of a
committed file the kernel reads itself (``open_fast``) is admitted and released by
:class:`lakefuse.mount.backing.Backings` as every other open is. The core driven directly,
then a real mount (the pyfuse3 that scripts/setup.sh builds has both flags)."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from lakefuse.mount.backing import CACHED, PASSTHROUGH
from tests.mount_core_testutil import ino_of, seeded_repo, writable_core
from tests.mount_testutil import MountProc, needs_fuse

FILES = {f"d/f{i:02d}": f"file {i}\n".encode() * (i + 1) for i in range(6)}


@pytest.fixture
def repo(tmp_path, request):
    with seeded_repo(tmp_path, "oflags", FILES, request) as r:
        yield r


def _open_fast(fs, ino):
    """open_fast of ``ino``, once the object's path is in the dentry cache (the first may miss)."""
    for _ in range(3):
        o = fs.open_fast(ino, os.O_RDONLY, passthrough=True)
        if o is not None:
            return o
        fs.release(fs.open(ino, os.O_RDONLY, True).fh)
    raise AssertionError("open_fast never opened from the dentry cache")


def test_an_inline_open_is_admitted_and_released_like_every_open(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as fs:
        f = ino_of(fs, "v1/d/f02")
        o = _open_fast(fs, f)
        assert o.noflush and o.backing_fd >= 0
        assert fs.backings.bound(f) and fs.backings.counts() == (1, 0)
        assert not fs.backings.hold(f)  # a cached open of the inode waits for a new inode meanwhile
        o2 = fs.open_fast(f, os.O_RDONLY, passthrough=True)  # a second reader shares the backing file
        assert o2 is not None and fs.backings.counts() == (1, 0)
        fs.release(o.fh)
        assert fs.backings.bound(f)  # o2 still reads through it
        fs.release(o2.fh)
        assert not fs.backings.bound(f) and fs.backings.counts() == (0, 0)

        # the kernel refused the backing file: the daemon serves it, the inode in cached mode till released
        o = _open_fast(fs, f)
        fs.backings.refused(o.fh)
        assert fs.backings.counts() == (0, 1)
        assert fs.open_fast(f, os.O_RDONLY, passthrough=True) is None  # open() decides: cached, with the others
        assert fs.backings.counts() == (0, 1)  # nothing left held by the refused inline attempt
        fs.release(o.fh)
        assert fs.backings.counts() == (0, 0)

        # another object's backing file on the inode: no inline open, nothing bound or held by it
        assert fs.backings.bind(f, b"another object") == PASSTHROUGH
        assert fs.open_fast(f, os.O_RDONLY, passthrough=True) is None
        assert fs.backings.counts() == (1, 0)
        fs.backings.undo(f, True)
        assert fs.backings.bind(f, b"x") == PASSTHROUGH and fs.backings.bind(f, b"x") == PASSTHROUGH
        fs.backings.undo(f, True)
        fs.backings.undo(f, True)
        assert fs.backings.hold(f) and fs.backings.bind(f, b"x") == CACHED
        fs.backings.undo(f, False)
        fs.backings.undo(f, False)
        assert fs.backings.counts() == (0, 0)


def test_readers_need_no_flush_and_writers_do(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache") as fs:
        for path in ("v1/d/f01", "main/d/f01"):
            o = fs.open(ino_of(fs, path), os.O_RDONLY, passthrough=False)
            assert o.noflush and not fs.pending(o.fh), path
            fs.release(o.fh)
        o = fs.open(ino_of(fs, "main/d/f01"), os.O_WRONLY | os.O_TRUNC, passthrough=False)
        assert not o.noflush  # its close saves the file
        fs.write(o.fh, 0, b"new")
        assert fs.pending(o.fh)
        fs.flush(o.fh)
        fs.release(o.fh)


def test_a_name_keeps_its_inode_number_after_the_kernel_forgets_it(repo, tmp_path):
    """The numbers a kept listing shows stay those a later lookup gives, on a tag and on a branch."""
    with writable_core(repo, tmp_path / "cache") as fs:
        for path in ("v1/d/f01", "v1/d", "main/d/f01", "main/d"):
            ino = ino_of(fs, path)
            node = fs.inodes.get(ino)
            fs.forget([(ino, node.nlookup)])
            assert fs.inodes.peek(ino) is None  # dropped
            again = ino_of(fs, path)
            assert again == ino, path
            assert fs.getattr(again).ino == again


def _stats(mp) -> dict:
    return json.loads((mp / ".lakefuse" / "stats").read_text())


@needs_fuse
def test_a_mount_spares_readers_flush_and_immutable_listings_readdir(repo, tmp_path):
    import pyfuse3

    assert hasattr(pyfuse3.FileInfo, "noflush"), "scripts/setup.sh builds the pyfuse3 that has the open flags"
    m = MountProc(repo.config.home, "oflags", tmp_path / "mnt").start()
    try:
        mp = m.mountpoint
        assert _stats(mp)["receive_burst"] == "16"  # pyfuse3 reads requests ahead
        flushes = _stats(mp)["requests"].get("flush", 0)
        for name, data in FILES.items():
            assert (mp / "v1" / name).read_bytes() == data
            assert (mp / "main" / name).read_bytes() == data
        assert _stats(mp)["requests"].get("flush", 0) == flushes  # no reader's close (stats' own neither)
        (mp / "main" / "d" / "new").write_bytes(b"written")  # a writer's close flushes: saved by it
        assert _stats(mp)["requests"].get("flush", 0) > flushes
        assert (mp / "main" / "d" / "new").read_bytes() == b"written"

        want = sorted(n.split("/")[1] for n in FILES)
        assert sorted(os.listdir(mp / "v1" / "d")) == want
        readdirs = _stats(mp)["requests"]["readdir"]
        for _ in range(3):  # listed again: from the kernel's cache, the same names
            assert sorted(os.listdir(mp / "v1" / "d")) == want
        assert _stats(mp)["requests"]["readdir"] == readdirs
        for name, data in FILES.items():  # and its files still look up and read
            assert (mp / "v1" / name).read_bytes() == data
        os.listdir(mp / "main" / "d")
        readdirs = _stats(mp)["requests"]["readdir"]
        os.listdir(mp / "main" / "d")  # a branch directory: the daemon lists it every time
        assert _stats(mp)["requests"]["readdir"] > readdirs
        repo.upload("main", "d/behind", b"b")  # and a change behind the mount shows there
        deadline = time.monotonic() + 5
        while "behind" not in os.listdir(mp / "main" / "d"):
            assert time.monotonic() < deadline, "the branch listing did not show the change within 5 s"
            time.sleep(0.1)
        assert sorted(os.listdir(mp / "v1" / "d")) == want
    finally:
        m.stop()


@needs_fuse
def test_a_mount_without_the_receive_burst_serves_the_same(repo, tmp_path):
    m = MountProc(repo.config.home, "oflags", tmp_path / "mnt", env={"LAKEFUSE_RECEIVE_BURST": "0"}).start()
    try:
        mp = m.mountpoint
        assert _stats(mp)["receive_burst"] == "off"
        for name, data in FILES.items():
            assert (mp / "v1" / name).read_bytes() == data
        (mp / "main" / "d" / "new").write_bytes(b"written")
        assert (mp / "main" / "d" / "new").read_bytes() == b"written"
    finally:
        m.stop()


@needs_fuse
def test_a_branch_file_keeps_its_st_ino_when_the_kernel_drops_its_inode(repo, tmp_path):
    """ext4's rule through the mount: the same file, the same ``st_ino``, however often the kernel
    drops its inode (git's index and backup tools compare it); the daemon drops its node too."""
    m = MountProc(repo.config.home, "oflags", tmp_path / "mnt").start()
    try:
        mp = m.mountpoint
        (mp / "main" / "d" / "written").write_bytes(b"through the mount")
        paths = [mp / "main" / "d" / "written", mp / "main" / "d" / "f01", mp / "main" / "d", mp / "v1" / "d" / "f01"]
        before = [os.stat(p).st_ino for p in paths]
        inodes0 = _stats(mp)["inodes"]
        for _ in range(3):
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:  # dentries and inodes: the kernel sends FORGET
                f.write("2\n")
        deadline = time.monotonic() + 5
        while _stats(mp)["inodes"] >= inodes0:
            assert time.monotonic() < deadline, "the kernel dropped none of the mount's inodes"
            time.sleep(0.05)
        assert [os.stat(p).st_ino for p in paths] == before
        assert (mp / "main" / "d" / "written").read_bytes() == b"through the mount"
    finally:
        m.stop()


def test_a_branch_file_changed_behind_the_mount_keeps_its_handles_and_its_name(repo, tmp_path):
    """Defects a new user's ETL run found with the CLI changing a branch while it was mounted:
    ``stat`` of a file that had been open while it was replaced recursed in the daemon (EIO:
    RecursionError); ``fstat`` of a descriptor whose file was removed, or whose branch was
    deleted, answered ENOENT; an ``O_TRUNC`` create over a name removed that way answered
    ENOENT. Now: an open file's handles see it with ``nlink`` 0, and an inode the kernel holds by
    a stale name answers ESTALE, which has the kernel look the name up again."""
    import errno

    from lakefuse.mount.errors import FsError

    def stale(fn):
        with pytest.raises(FsError) as e:
            fn()
        assert e.value.errno == errno.ESTALE, e.value

    with writable_core(repo, tmp_path / "cache") as fs:
        for path, change in (("main/d/f01", lambda: repo.upload("main", "d/f01", b"another version")),
                             ("main/d/f02", lambda: repo.delete("main", "d/f02"))):
            ino = ino_of(fs, path)
            size = fs.getattr(ino).size
            o = fs.open(ino, os.O_RDONLY, passthrough=False)
            change()
            time.sleep(0.06)  # (past the 50 ms a branch's stamp is taken as current)
            a = fs.getattr(ino)
            assert (a.ino, a.size, a.nlink) == (ino, size, 0), path
            fs.release(o.fh)
            stale(lambda: fs.getattr(ino))  # (was: a RecursionError, answered EIO)
            stale(lambda: fs.open(ino, os.O_RDONLY, passthrough=False))
        # a name removed behind the mount, looked up before: a create with O_TRUNC over it
        ino = ino_of(fs, "main/d/f03")
        repo.delete("main", "d/f03")
        time.sleep(0.06)
        stale(lambda: fs.open(ino, os.O_WRONLY | os.O_TRUNC, passthrough=False))
        # the branch deleted while a file of it is open
        repo.create_branch("gone", "main")
        ino = ino_of(fs, "gone/d/f04")
        o = fs.open(ino, os.O_RDONLY, passthrough=False)
        repo.delete_branch("gone")
        time.sleep(0.06)
        assert fs.getattr(ino).nlink == 0
        assert fs.read(o.fh, 0, 100) == FILES["d/f04"]
        fs.release(o.fh)


@needs_fuse
def test_changes_behind_the_mount_fail_no_open_descriptor_and_no_create(repo, tmp_path):
    """The same through the kernel (its cached names and inodes), as the ETL run saw it."""
    m = MountProc(repo.config.home, "oflags", tmp_path / "mnt").start()
    try:
        d = m.mountpoint / "main" / "d"
        data = os.urandom(200_000)
        (d / "gone.bin").write_bytes(data)
        with open(d / "gone.bin", "rb") as f:
            f.read(100)
            repo.delete("main", "d/gone.bin")
            end = time.monotonic() + 1.2
            while time.monotonic() < end:  # (was: ENOENT until the daemon's inode went)
                assert os.fstat(f.fileno()).st_size == len(data)
                assert os.pread(f.fileno(), 10, 150_000) == data[150_000:150_010]
                time.sleep(0.02)
            assert os.fstat(f.fileno()).st_nlink == 0
        for i in range(4):
            y = d / f"y{i}.txt"
            y.write_bytes(b"v1")
            os.stat(y)
            repo.delete("main", f"d/y{i}.txt")
            y.write_bytes(b"v2")  # (was: ENOENT for up to the entry timeout)
            assert y.read_bytes() == b"v2"
        for i in range(6):
            z = d / "rr.bin"
            z.write_bytes(os.urandom(50_000))
            with open(z, "rb") as f:
                f.read(10)
                repo.upload("main", "d/rr.bin", b"other %d" % i)
                time.sleep(0.05 * i)
                os.fstat(f.fileno())
            os.stat(z)  # (was: EIO now and then: the daemon's getattr recursed)
            z.write_bytes(b"again %d" % i)
            assert z.read_bytes() == b"again %d" % i
        assert "RecursionError" not in m.log_path.read_text(errors="replace")
    finally:
        m.stop()


@needs_fuse
def test_an_imported_file_changed_in_place_since_its_import_is_eio_not_its_new_bytes(repo, tmp_path):
    """A data engineer's finding: a file imported from a local directory (the entry names it
    where it is) and then changed in place, same size, was served by the mount with its new bytes
    (the kernel read it through passthrough), where `fs cat` refused it. Now an open of such a
    file checks its MD5 (remembered by size and mtime: hashed again only after a change): EIO,
    said in the log; a file only touched (same bytes, another mtime) is still served."""
    import hashlib

    from graveler.model import AddressType, Entry

    src = tmp_path / "source"
    src.mkdir()
    f = src / "data.csv"
    data = b"id,value\n" + b"".join(b"%d,%d\n" % (i, i * i) for i in range(2000))
    f.write_bytes(data)
    e = Entry(address=f"file://{src}/data.csv", size=len(data), etag=hashlib.md5(data).hexdigest(),
              last_modified_ns=f.stat().st_mtime_ns, address_type=AddressType.FULL)
    repo.stage("main", "imported/data.csv", e)
    c = repo.commit("main", "import")
    m = MountProc(repo.config.home, "oflags", tmp_path / "mnt").start()
    try:
        path = m.mountpoint / c.id / "imported" / "data.csv"
        assert path.read_bytes() == data
        os.utime(f)  # touched: the same bytes
        assert path.read_bytes() == data
        with open(f, "r+b") as w:  # changed in place, the same size
            w.seek(100)
            w.write(b"X")
        with pytest.raises(OSError) as ei:
            path.read_bytes()
        assert ei.value.errno == errno.EIO
        logged = m.log_path.read_text()
        changed = bytearray(data)
        changed[100:101] = b"X"
        # what the file holds now is not told, not even its MD5 (a security review: the file may
        # be swapped for a link to one the log's readers may not read)
        assert "changed since it was imported" in logged and hashlib.md5(changed).hexdigest() not in logged
    finally:
        m.stop()


@needs_fuse
@pytest.mark.parametrize("writes_after", [True, False])
def test_a_writer_whose_branch_is_deleted_closes_as_an_unlinked_files_writer(repo, tmp_path, writes_after):
    """Found by an ML engineer's tour: a file being written on a branch deleted meanwhile failed
    its close with ENOENT (no close of a local file says that). It is an unlinked file to its
    descriptors: writes and close succeed, nothing is staged, and what was written is kept in
    the spool's recovered/ (the log says where). Found by a cluster operator's tour: a writer
    that wrote nothing after the delete, closing once the stamp watch had seen the branch gone,
    lost it all without a word (detached as a file removed behind the mount)."""
    repo.create_branch("tmpb", "main")
    cache = tmp_path / "cache"
    m = MountProc(repo.config.home, "oflags", tmp_path / "mnt", "--cache-dir", str(cache)).start()
    try:
        w = open(m.mountpoint / "tmpb" / "w.bin", "wb")
        w.write(b"w" * 100)
        w.flush()
        repo.delete_branch("tmpb")
        time.sleep(0.1 if writes_after else 1.0)  # (1 s: rounds of the stamp watch see the branch gone)
        w.write(b"x" * 10 if writes_after else b"")
        w.close()  # (was: OSError ENOENT)
        kept = list((cache / "spool" / "oflags" / "recovered").rglob("w.bin"))
        assert len(kept) == 1 and kept[0].read_bytes() == b"w" * 100 + (b"x" * 10 if writes_after else b"")
        end = time.monotonic() + 5
        while (m.mountpoint / "tmpb").exists() and time.monotonic() < end:  # (the kernel's entry times out)
            time.sleep(0.1)
        assert not (m.mountpoint / "tmpb").exists()
    finally:
        m.stop()
    assert "deleted while it was open for writing" in m.log()


@needs_fuse
@pytest.mark.parametrize("gap", [0.0, 1.0])
def test_a_branch_deleted_and_made_again_is_another_branch_to_those_that_held_the_old_one(repo, tmp_path, gap):
    """Found by a data team lead's tour: a shell inside ``dev/sub`` when ``dev`` was deleted and
    made again from main saw the new branch's files there and wrote into it, and a file being
    written on the old ``dev`` was dropped without a word at its close (neither staged nor kept).
    As on ext4, where a directory removed and made again is another directory: the old one stays
    gone for those holding it (ENOENT), and the writer closes as on a deleted branch, what it wrote
    kept in recovered/. The new branch shows only its own files."""
    repo.upload("main", "sub/s.txt", b"old")
    repo.commit("main", "main")
    repo.create_branch("dev", "main")
    repo.upload("dev", "sub/s.txt", b"new")
    repo.commit("dev", "dev")
    cache = tmp_path / "cache"
    m = MountProc(repo.config.home, "oflags", tmp_path / "mnt", "--cache-dir", str(cache)).start()
    try:
        sub = os.open(m.mountpoint / "dev" / "sub", os.O_RDONLY | os.O_DIRECTORY)
        fd = os.open("s.txt", os.O_RDONLY, dir_fd=sub)
        assert os.read(fd, 10) == b"new"
        os.close(fd)
        w = open(m.mountpoint / "dev" / "w.bin", "wb")
        w.write(b"w" * 100)
        w.flush()
        repo.delete_branch("dev")
        time.sleep(gap)  # (no gap: the mount never sees the branch missing)
        repo.create_branch("dev", "main")
        time.sleep(0.6)  # (a round of the stamp watch)
        w.write(b"x" * 10)
        w.close()
        kept = list((cache / "spool" / "oflags" / "recovered").rglob("w.bin"))
        assert len(kept) == 1 and kept[0].read_bytes() == b"w" * 100 + b"x" * 10
        for attempt in (lambda: os.open("s.txt", os.O_RDONLY, dir_fd=sub),
                        lambda: os.open("made.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=sub)):
            with pytest.raises(FileNotFoundError):
                attempt()
        os.close(sub)
        assert not repo.exists("dev", "w.bin") and not repo.exists("dev", "sub/made.txt")
        end = time.monotonic() + 5  # the new branch through the mount (once the kernel's entry times out)
        while time.monotonic() < end:
            try:
                if (m.mountpoint / "dev" / "sub" / "s.txt").read_bytes() == b"old":
                    break
            except FileNotFoundError:  # (the old branch's entry, until the kernel looks the name up again)
                pass
            time.sleep(0.1)
        assert (m.mountpoint / "dev" / "sub" / "s.txt").read_bytes() == b"old"
    finally:
        m.stop()


_CWD_PROBE = r"""
import errno, json, os, sys
for line in sys.stdin:
    out = {}
    try:
        st = os.stat(".")
        out["stat"] = [oct(st.st_mode >> 12), st.st_nlink]
    except OSError as e:
        out["stat"] = errno.errorcode[e.errno]
    try:
        out["ls"] = sorted(os.listdir("."))
    except OSError as e:
        out["ls"] = errno.errorcode[e.errno]
    try:
        os.close(os.open("made.txt", os.O_WRONLY | os.O_CREAT, 0o644))
        out["create"] = "made"
    except OSError as e:
        out["create"] = errno.errorcode[e.errno]
    print(json.dumps(out), flush=True)
"""


@needs_fuse
def test_a_shell_inside_a_deleted_branch_sees_a_removed_directory_as_on_ext4(repo, tmp_path):
    """Found by an ETL team's tour: a shell whose working directory was in a branch deleted by
    another process got ``ESTALE`` ("Stale file handle") from ``stat .``, ``ls`` and every create
    there once its first lookups were done. ext4's answer for a working directory removed: ``stat``
    shows a directory with no links, the listing is empty, a create is ``ENOENT`` -- for as long
    as the shell stays; the name, meanwhile, shows whatever is there now (a branch made again)."""
    import subprocess
    import sys

    repo.create_branch("dev", "main")
    repo.upload("dev", "kept.txt", b"dev's")
    m = MountProc(repo.config.home, "oflags", tmp_path / "mnt", "--cache-dir", str(tmp_path / "cache")).start()
    sh = None
    try:
        assert (m.mountpoint / "dev" / "kept.txt").read_bytes() == b"dev's"
        sh = subprocess.Popen([sys.executable, "-c", _CWD_PROBE], cwd=m.mountpoint / "dev", stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)

        def probe() -> dict:
            sh.stdin.write("probe\n")
            sh.stdin.flush()
            return json.loads(sh.stdout.readline())

        first = probe()
        assert first["stat"][1] >= 2 and "kept.txt" in first["ls"] and first["create"] == "made", first
        repo.delete_branch("dev")
        time.sleep(1.0)  # (the stamp watch's rounds, and the branch timeout)
        for _ in range(3):
            got = probe()
            assert got == {"stat": [oct(0o04), 0], "ls": [], "create": "ENOENT"}, got
        assert not (m.mountpoint / "dev").exists()
        repo.create_branch("dev", "main")
        end = time.monotonic() + 2
        while not (m.mountpoint / "dev").exists() and time.monotonic() < end:
            time.sleep(0.05)
        now = os.listdir(m.mountpoint / "dev")  # (the new branch, made from main, at once: the name was dropped)
        assert "d" in now and "kept.txt" not in now, now
        assert probe() == {"stat": [oct(0o04), 0], "ls": [], "create": "ENOENT"}  # (still the old one)
        assert not repo.exists("dev", "made.txt")
    finally:
        if sh is not None:
            sh.stdin.close()
            sh.wait(10)
        m.stop()


@needs_fuse
def test_the_daemon_raises_its_open_files_limit_to_the_hard_one(repo, tmp_path):
    """Found by an operator's tour: a mount holds a descriptor per mapped table (of 256 KiB or
    more, up to 512 MiB of them), per file being written and per pre-made spool file; at the usual
    soft limit (1,024) a daemon reading many commits ran out, and then its saves could not write
    their redo log (every close EIO). It raises its soft limit to its hard one at start."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = len(os.listdir("/proc/self/fd")) + 128  # (what this test process has open stays under it)
    if hard != resource.RLIM_INFINITY and hard <= low:
        pytest.skip(f"the hard limit of open files ({hard}) leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))  # (the daemon inherits it)
    try:
        m = MountProc(repo.config.home, "oflags", tmp_path / "mnt").start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        limits = Path(f"/proc/{m.proc.pid}/limits").read_text()
        got = int(next(line for line in limits.splitlines() if line.startswith("Max open files")).split()[3])
        assert got == min(hard, 1 << 20) > low
    finally:
        m.stop()


@needs_fuse
def test_inodes_kept_for_many_commit_trees_are_bounded_and_files_still_read(repo, tmp_path):
    """Found by an operator's tour: a daemon listing one 500-file directory of each of 700 commits
    kept 1.2 GB (an inode per listed file, held as long as the kernel held the name) and was
    OOM-killed in a memory-limited cgroup. Above ``LAKEFUSE_MAX_INODES`` the kernel is asked to
    drop the names of unopened files of the oldest commit trees: the mount comes back under the
    bound, every file still reads the same, and a file held open meanwhile is not disturbed."""
    commits = []
    for c in range(5):
        for i in range(200):
            repo.upload("main", f"many/f{i:03d}", b"%d-%d" % (c, i))
        commits.append(repo.commit("main", f"c{c}").id)
    m = MountProc(repo.config.home, "oflags", tmp_path / "mnt", env={**os.environ, "LAKEFUSE_MAX_INODES": "300"}).start()
    try:
        held = open(m.mountpoint / commits[0] / "many" / "f007", "rb")
        for cid in commits:
            assert len(os.listdir(m.mountpoint / cid / "many")) == 200
            [os.stat(m.mountpoint / cid / "many" / f"f{i:03d}") for i in range(200)]
        stats = lambda: json.loads((m.mountpoint / ".lakefuse" / "stats").read_bytes())  # noqa: E731
        end = time.monotonic() + 10
        while time.monotonic() < end and stats()["inodes"] > 300:
            time.sleep(0.2)
        s = stats()
        assert s["inodes"] <= 300 and s.get("inodes_handed_back", 0) > 0, s
        assert held.read() == b"0-7"  # (open across the trim)
        held.close()
        for c, cid in enumerate(commits):
            assert (m.mountpoint / cid / "many" / "f123").read_bytes() == b"%d-123" % c
    finally:
        m.stop()
