"""Many handles of one branch file's inode: a reader that opened an older version, a writer that
appends and closes, a spool file dropped as another open starts, and attributes read while a
save stages the next version. Every descriptor of an inode reads its current content, and what
the core answers for it never goes back to an older size -- the kernel takes that size for the
inode, cuts reads short at it and places the next ``O_APPEND`` write over the last one (the
stress drivers of scripts/stress/ lost appends and read NUL bytes that way). The core driven
directly, then a real mount with an appender, a rewriter and readers."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import time
import warnings

import pytest

from lakefuse.mount.inodes import Kind, Node
from tests.mount_core_testutil import ino_of, seeded_repo, writable_core
from tests.mount_testutil import MountProc, needs_fuse

FILES = {"d/log": b"r0\n" * 100}
APPEND = os.O_WRONLY | os.O_APPEND


@pytest.fixture
def repo(tmp_path, request):
    with seeded_repo(tmp_path, "shino", FILES, request) as r:
        yield r


def _read(fs, fh: int, off: int, n: int) -> bytes:
    """A read as the adapter makes it: from memory, inline, else in a worker."""
    for fast in (fs.read_fast, fs.read_nowait):
        data = fast(fh, off, n)
        if data is not None:
            return bytes(data)
    return fs.read(fh, off, n)


def _append(fs, ino: int, data: bytes) -> None:
    """open(O_APPEND), write at the size the kernel knows, close: flush and release."""
    size = fs.getattr(ino).size
    w = fs.open(ino, APPEND)
    assert fs.write(w.fh, size, data) == len(data)
    fs.flush(w.fh)
    fs.release(w.fh)


def test_a_reader_open_across_an_append_reads_the_inodes_new_content(repo, tmp_path):
    old = FILES["d/log"]
    with writable_core(repo, tmp_path / "cache") as fs:
        ino = ino_of(fs, "main/d/log")
        r = fs.open(ino, os.O_RDONLY)  # the daemon serves it (no passthrough): the object it opened
        assert _read(fs, r.fh, 0, 1 << 20) == old
        _append(fs, ino, b"new\n")  # through the same inode: its size is the new one now
        assert fs.getattr(ino).size == len(old) + 4
        # past the old end: the appended bytes (before, the old object's end: b"", and the
        # kernel then took the old size back for the inode)
        assert _read(fs, r.fh, len(old), 100) == b"new\n"
        assert _read(fs, r.fh, 0, 1 << 20) == old + b"new\n"
        _append(fs, ino, b"more\n")
        assert _read(fs, r.fh, 0, 1 << 20) == old + b"new\nmore\n"
        fs.release(r.fh)
        r = fs.open(ino, os.O_RDONLY)
        assert _read(fs, r.fh, 0, 1 << 20) == old + b"new\nmore\n"
        fs.release(r.fh)
    assert repo.read("main", "d/log") == old + b"new\nmore\n"


def test_a_small_file_read_whole_at_open_follows_its_inode_too(repo, tmp_path):
    with writable_core(repo, tmp_path / "cache", small_file_bytes=1 << 20) as fs:
        ino = ino_of(fs, "main/d/log")
        r = fs.open(ino, os.O_RDONLY)
        assert fs.read_fast(r.fh, 0, 10) == b"r0\nr0\nr0\nr"  # read whole at open: from memory
        w = fs.open(ino, os.O_WRONLY)
        fs.write(w.fh, 0, b"XX")
        fs.flush(w.fh)
        fs.release(w.fh)
        assert _read(fs, r.fh, 0, 4) == b"XX\nr"
        fs.release(r.fh)


def test_an_open_as_the_last_handle_of_a_spool_file_goes_starts_from_the_saved_content(repo, tmp_path):
    """open_spooled found a spool file, and opened -- two steps: a last release between them
    dropped it, and the open made a new, empty one; the append then wrote past its end and the
    save kept a run of NUL bytes over the file's content. The interleaving made by hand: the
    writer's last handle goes right after the open first finds the spool file."""
    old = FILES["d/log"]
    with writable_core(repo, tmp_path / "cache") as fs:
        ino = ino_of(fs, "main/d/log")
        _append(fs, ino, b"one\n")
        w1 = fs.open(ino, APPEND)
        fs.write(w1.fh, len(old) + 4, b"two\n")
        spool = fs.spool
        found = {}

        def released_after(fn):
            def wrapped(i):
                sf = fn(i)
                if sf is not None and not found:
                    found["sf"] = sf
                    fs.flush(w1.fh)
                    fs.release(w1.fh)  # the writer's last handle: saved, and dropped unless held
                return sf
            return wrapped

        spool.get = released_after(spool.get)
        spool.hold = released_after(spool.hold)
        w2 = fs.open(ino, APPEND)
        assert found, "the open never looked at the spool file"
        size = fs.getattr(ino).size
        assert size == len(old) + 8
        fs.write(w2.fh, size, b"three\n")
        fs.flush(w2.fh)
        fs.release(w2.fh)
        want = old + b"one\ntwo\nthree\n"
        r = fs.open(ino, os.O_RDONLY)
        assert _read(fs, r.fh, 0, 1 << 20) == want
        fs.release(r.fh)
    assert repo.read("main", "d/log") == want


def test_a_node_never_takes_a_state_older_than_the_one_it_holds():
    n = Node(7, ("f", "t", b"p"), Kind.FILE, None, b"p", 1)
    assert n.take("attr@5", 5, "value@5")
    assert not n.take("attr@4", 4, "value@4")  # read before a save that staged stamp 5
    assert (n.attr, n.value, n.stamp) == ("attr@5", "value@5", 5)
    assert n.take("attr@5b", 5)  # the same stamp: taken (a listing's attributes), its value kept
    assert (n.attr, n.value) == ("attr@5b", "value@5")
    assert n.take("attr@9", 9, "value@9") and n.stamp == 9


def test_attributes_read_before_a_save_do_not_put_the_older_size_back(repo, tmp_path):
    """A getattr (or lookup) that read the branch before a save of the same file staged its
    next version, and finished after: the node keeps the saved version, and a later open for
    append starts at its end."""
    old = FILES["d/log"]
    with writable_core(repo, tmp_path / "cache") as fs:
        ino = ino_of(fs, "main/d/log")
        node = fs.inodes.get(ino)
        tree = node.tree
        stamp_before = tree.repin()
        st_before = tree.view.stat(b"d/log")
        _append(fs, ino, b"saved\n")
        assert node.stamp > stamp_before
        # the older read lands now (what fs.revalidate and a lookup's acquire do with it)
        attr_before = fs.rules.file_attr(st_before.value, tree)
        fs.acquire(fs.file_key(tree, b"d/log"), Kind.FILE, tree, b"d/log", node.parent_ino, attr_before,
                   st_before.value, stamp_before)
        assert fs.getattr(ino).size == len(old) + 6
        _append(fs, ino, b"next\n")
    assert repo.read("main", "d/log") == old + b"saved\nnext\n"


def test_a_change_through_an_inode_the_name_left_is_estale_and_stages_nothing(repo, tmp_path):
    """truncate(2), chmod(2), setxattr(2) by a dentry the kernel still holds for the name's older
    inode (the name went to a new inode: a writer was given one while readers read the old
    through the kernel, or the file was replaced behind the mount): ESTALE -- the kernel looks
    the name up again and repeats the call -- and the branch keeps the newer file. Before, the
    old inode's version was copied, cut or extended with zeros, and staged over the newer."""
    old = FILES["d/log"]
    with writable_core(repo, tmp_path / "cache") as fs:
        ino = ino_of(fs, "main/d/log")
        fs.inodes.replace(fs.inodes.get(ino))  # the name's next lookup makes a new inode
        new = ino_of(fs, "main/d/log")
        assert new != ino
        w = fs.open(new, os.O_WRONLY | os.O_TRUNC)
        fs.write(w.fh, 0, b"newer\n")
        fs.flush(w.fh)
        fs.release(w.fh)
        from lakefuse.mount.attrs import SetAttr
        from lakefuse.mount.errors import FsError
        for changes in (SetAttr(size=3), SetAttr(size=len(old) * 2), SetAttr(mode=0o600)):
            with pytest.raises(FsError) as e:
                fs.setattr(ino, changes)
            assert e.value.errno == errno.ESTALE
        with pytest.raises(FsError) as e:
            fs.setxattr(ino, b"user.k", b"v")
        assert e.value.errno == errno.ESTALE
        assert fs.setattr(new, SetAttr(size=3)).size == 3  # through the name's inode: as ever
    assert repo.read("main", "d/log") == b"new"


def test_a_truncate_that_finds_the_file_replaced_behind_the_mount_is_estale(repo, tmp_path):
    """The read the truncate makes finds another object at the name while a reader holds the
    inode open (replaced behind the mount: the inode keeps the old version for its handles)."""
    with writable_core(repo, tmp_path / "cache") as fs:
        ino = ino_of(fs, "main/d/log")
        r = fs.open(ino, os.O_RDONLY)
        repo.upload("main", "d/log", b"uploaded behind\n")
        from lakefuse.mount.attrs import SetAttr
        from lakefuse.mount.errors import FsError
        with pytest.raises(FsError) as e:
            fs.setattr(ino, SetAttr(size=5))
        assert e.value.errno == errno.ESTALE
        fs.release(r.fh)
        assert fs.setattr(ino_of(fs, "main/d/log"), SetAttr(size=5)).size == 5
    assert repo.read("main", "d/log") == b"uploa"


def _renamed_between(fs, rename):
    """Have the next change's path (made before the tree lock) be followed by ``rename`` -- a
    directory rename that lands before the change takes the lock."""
    w = fs.writes
    made = w._child_path
    done = []

    def child_path(parent, name, room=0):
        path = made(parent, name, room)
        if not done:
            done.append(path)
            rename()
        return path

    w._child_path = child_path
    return done


@pytest.mark.parametrize("op", ["create", "mkdir", "symlink", "unlink", "rename"])
def test_a_change_in_a_directory_renamed_meanwhile_never_brings_the_old_name_back(repo, tmp_path, op):
    """A create (or another change) made its path from its directory's, then a rename of the
    directory above ran before it took the tree lock: it staged under the old name, and the
    renamed directory came back there (scripts/stress/s4: 1 trial in 7). ESTALE now: the kernel
    looks the path up again -- the old name is gone -- and the branch shows the rename whole."""
    from lakefuse.mount.attrs import Caller
    from lakefuse.mount.errors import FsError

    me = Caller(uid=1000, gid=100)
    with writable_core(repo, tmp_path / "cache") as fs:
        t = ino_of(fs, "main/d")
        a = fs.mkdir(t, b"A", 0o755, me).ino
        z = fs.mkdir(a, b"z", 0o755, me).ino
        o, _ = fs.create(z, b"there", 0o644, os.O_WRONLY, me)
        fs.release(o.fh)
        done = _renamed_between(fs, lambda: fs.rename(t, b"A", t, b"B", 0))
        calls = {
            "create": lambda: fs.release(fs.create(z, b"new", 0o644, os.O_WRONLY, me)[0].fh),
            "mkdir": lambda: fs.mkdir(z, b"sub", 0o755, me),
            "symlink": lambda: fs.symlink(z, b"ln", b"there", me),
            "unlink": lambda: fs.unlink(z, b"there"),
            "rename": lambda: fs.rename(z, b"there", z, b"moved", 0),
        }
        with pytest.raises(FsError) as e:
            calls[op]()
        assert e.value.errno == errno.ESTALE and done
        names = sorted(it.path.decode() for it in repo.list("main", "d/", ""))
        assert not any(p.startswith("d/A/") for p in names), names
        assert "d/B/z/there" in names
    assert repo.read("main", "d/B/z/there") == b""


# ---------------------------------------------------------------- a real mount

REC = 32


def _rec(seq: int) -> bytes:
    return b"%08d " % seq + b"x" * (REC - 10) + b"\n"


def _check(data: bytes, cut: bool = False) -> str | None:
    """What is wrong with ``data`` as whole records (None: nothing). ``cut``: the last may be a
    record's start -- a read that spans two versions of a file rewritten meanwhile (the first
    read of ``f.read()`` ends in the newer version, the next finds it truncated by the one after)."""
    if len(data) % REC and not cut:
        return f"{len(data)} bytes: not whole records"
    for i in range(0, len(data), REC):
        r = data[i:i + REC]
        if not r[:8].isdigit() or r != _rec(int(r[:8]))[:len(r)]:
            return f"record at {i}: {r[:16]!r}"
    return None


def _appender(path: str, seconds: float, q) -> None:
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        n += 1
        with open(path, "ab") as f:
            f.write(_rec(n))
    q.put(("appended", n))


def _rewriter(path: str, seconds: float, q) -> None:
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        n += 1
        with open(path, "wb") as f:
            f.write(b"".join(_rec(n * 100 + k) for k in range(1 + n % 40)))
    q.put(("rewrote", n))


def _truncater(path: str, seconds: float, q) -> None:
    """Rewrites the file whole, then cuts it with truncate(2) by its name, in turn."""
    n, end, stale = 0, time.monotonic() + seconds, []
    while time.monotonic() < end:
        n += 1
        if n % 2:
            with _retrying(lambda: open(path, "wb"), stale) as f:
                f.write(b"".join(_rec(n * 100 + k) for k in range(30)))
        else:
            _retrying(lambda: os.truncate(path, REC * (n % 29)), stale)
    q.put(("cut", n, len(stale)))


def _reader(path: str, seconds: float, cut: bool, q) -> None:
    n, bad, end, stale = 0, [], time.monotonic() + seconds, []
    while time.monotonic() < end:
        with _retrying(lambda: open(path, "rb"), stale) as f:
            data = f.read()
        n += 1
        why = _check(data, cut)
        if why is not None and len(bad) < 5:
            bad.append(why)
    q.put(("read", n, bad, len(stale)))


def _reporting(fn, *args) -> None:
    """Run ``fn``; an error is put on its queue (the last argument) as ("error", name, repr)."""
    try:
        fn(*args)
    except Exception as e:
        args[-1].put(("error", fn.__name__, repr(e)))


def _retrying(call, stale: list):
    """``call()``, again after an ESTALE (counted in ``stale``): the kernel retries a stale open or
    truncate once; under heavy load both tries can meet a replaced inode (open, below)."""
    for _ in range(3):
        try:
            return call()
        except OSError as e:
            if e.errno != errno.ESTALE:
                raise
            stale.append(1)
    return call()


def _run(target, path: str, seconds: float, readers: int = 2) -> list:
    cut = target is not _appender
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=_reporting, args=(target, path, seconds, q))]
    ps += [ctx.Process(target=_reporting, args=(_reader, path, seconds, cut, q)) for _ in range(readers)]
    for p in ps:
        p.start()
    out = [q.get(timeout=seconds + 120) for _ in ps]
    for p in ps:
        p.join(30)
    return out


@needs_fuse
@pytest.mark.parametrize("passthrough", ["1", "0"])
def test_appends_and_rewrites_under_concurrent_readers(repo, tmp_path, passthrough):
    """One process appends a record per open/close (then another rewrites the file whole, then
    rewrites and truncates it by name in turn) while two read it whole in a loop: no append whose
    close succeeded is lost, and no read returns anything but records some version held (before:
    a few appends lost and reads with NUL bytes in every few seconds' run, ~5% of the reads while
    truncating, and truncate(2) put zeros in the branch; the control on a native directory: none)."""
    env = {"LAKEFUSE_BRANCH_PASSTHROUGH": passthrough}
    m = MountProc(repo.config.home, "shino", tmp_path / "mnt", env=env).start()
    try:
        path = str(m.mountpoint / "main" / "d" / "stress")
        with open(path, "wb") as f:
            f.write(_rec(0))
        out = _run(_appender, path, 4.0)
        assert [o for o in out if o[0] == "error"] == []
        appended = next(o[1] for o in out if o[0] == "appended")
        reads = [o for o in out if o[0] == "read"]
        assert all(r[1] > 10 for r in reads), reads
        assert [r[2] for r in reads] == [[], []]
        time.sleep(0.2)
        data = open(path, "rb").read()
        assert _check(data) is None
        assert [int(data[i:i + 8]) for i in range(0, len(data), REC)] == list(range(appended + 1))

        for target in (_rewriter, _truncater):
            out = _run(target, path, 3.0)
            assert [o for o in out if o[0] == "error"] == [], target.__name__
            assert [o[2] for o in out if o[0] == "read"] == [[], []], target.__name__
            assert _check(open(path, "rb").read()) is None
            # an ESTALE that reached a caller past the kernel's own retry: none in the stress runs
            # here, once in a loaded CI rehearsal (an open while truncations replace the inode):
            # counted, not failed on (docs/SEMANTICS.md)
            stale = sum(o[-1] for o in out if o[0] in ("read", "cut"))
            if stale:
                warnings.warn(f"{target.__name__}: ESTALE reached callers {stale} times")
    finally:
        m.stop()
    assert b"Traceback" not in m.log_path.read_bytes()


def test_an_open_of_a_file_this_mount_renamed_another_over_opens_what_the_kernel_found(repo, tmp_path):
    """An open whose path walk found a file's inode just before this mount renamed another file
    over its name (the kernel moves its entry only once the rename is answered) opens the file it
    found, the name's older version with ``nlink`` 0, as on a local filesystem -- daemon-served
    and passthrough alike. Before, it was ESTALE, and when a second rename came within the
    kernel's one retry ESTALE reached the caller (2 in 40,000 opens of 8 files one process
    replaced by rename while 4 read them). A file replaced behind the mount still has the kernel
    look the name up again."""
    from lakefuse.mount.errors import FsError
    from lakefuse.mount.writes import Caller

    old = FILES["d/log"]
    with writable_core(repo, tmp_path / "cache") as fs:
        d = ino_of(fs, "main/d")
        ino = ino_of(fs, "main/d/log")
        o, _ = fs.create(d, b".tmp", 0o644, os.O_WRONLY | os.O_CREAT, Caller(uid=1000, gid=100))
        fs.write(o.fh, 0, b"newer\n")
        fs.flush(o.fh)
        fs.release(o.fh)
        fs.rename(d, b".tmp", d, b"log", 0)
        for passthrough in (False, True):
            r = fs.open(ino, os.O_RDONLY, passthrough=passthrough)
            if r.backing_fd >= 0:
                assert passthrough
                assert os.pread(r.backing_fd, 1000, 0) == old
            else:
                assert _read(fs, r.fh, 0, 1000) == old
            attr = fs.getattr(ino)
            assert (attr.size, attr.nlink) == (len(old), 0)
            fs.release(r.fh)
        assert fs.stats.snapshot()["opens_renamed_over"] == 2
        new = ino_of(fs, "main/d/log")
        assert new != ino
        r = fs.open(new, os.O_RDONLY)
        assert _read(fs, r.fh, 0, 1000) == b"newer\n"
        repo.upload("main", "d/log", b"uploaded behind\n")  # (while open: the inode keeps its version)
        with pytest.raises(FsError) as e:
            fs.open(new, os.O_RDONLY)
        assert e.value.errno == errno.ESTALE
        fs.release(r.fh)
    assert repo.read("main", "d/log") == b"uploaded behind\n"
