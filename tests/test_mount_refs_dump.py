"""``lakefuse mount --refs-dump URL MOUNTPOINT``: one repository's commits, tags and branches
(as of a ``lakefuse refs dump``) mounted from the object store alone, in a fresh home with no
repository and no refs database, read-only. Local and S3 (moto) namespaces; bad dumps."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from graveler import Graveler, GravelerConfig
from graveler.config import KVConfig
from graveler.errors import AlreadyExists, CorruptedData, InvalidArgument, NotFound
from graveler.kv.memory import forget_space
from tests.graveler_testutil import FAST_KV
from tests.mount_testutil import MountProc, force_unmount, is_mounted, lakefuse_cmd, needs_fuse

ONE = {"a.csv": b"id,v\n1,a\n", "b/c.txt": b"c one\n", "old.txt": b"to be deleted\n",
       "deep/x/y/z.bin": os.urandom(300_000)}
# A PostgreSQL URL nothing listens on: a dump mount must never try it.
NO_KV = "postgresql://nobody@127.0.0.1:9/nodb?connect_timeout=1"


def build_story(home: Path, ns: str, store=None) -> dict:
    """Several commits, a tag, a second branch, a merge, a staged change; then
    ``lakefuse refs dump`` (the CLI, as a user runs it). What each ref shows, by commit."""
    g = Graveler(GravelerConfig(home=home, kv=FAST_KV, store=store))
    r = g.create_repository("sales", ns)
    for k, v in ONE.items():
        r.upload("main", k, v)
    c1 = r.commit("main", "one")
    r.upload("main", "a.csv", b"id,v\n1,a\n2,b\n")
    r.delete("main", "old.txt")
    r.commit("main", "two")
    r.create_tag("v1", "main")
    r.create_branch("dev", "main")
    r.upload("dev", "dev/only.txt", b"made on dev\n")
    r.commit("dev", "dev work")
    r.upload("main", "b/c.txt", b"c three\n")
    r.commit("main", "three")
    merge = r.merge("dev", "main")
    r.upload("main", "staged.txt", b"staged: not part of a dump\n")
    refs = {"main": merge.id, "dev": r.get_commit("dev").id, "v1": r.get_commit("v1").id,
            "main~1": r.get_commit("main~1").id, c1.id[:10]: c1.id}
    expect = {ref: {k.decode(): r.read(cid, k) for k, _ in r.iter_committed(cid)} for ref, cid in refs.items()}
    log_main = [c.id for c in r.log("main")]
    g.close()
    env = {**os.environ, "LAKEFUSE_KV": "lmdb"}
    if store is not None:
        env["LAKEFUSE_S3_ENDPOINT"] = store.s3_endpoint_url
    d = subprocess.run(lakefuse_cmd(home, "refs", "dump", "lakefs://sales", "--json"), capture_output=True,
                       text=True, env=env, timeout=120)
    assert d.returncode == 0, d.stderr
    return {"refs": refs, "expect": expect, "log": log_main, "manifest": json.loads(d.stdout), "c1": c1.id}


def walk(root: Path) -> dict[str, bytes]:
    out = {}
    for d, dirs, files in os.walk(root):
        if Path(d) == root:
            dirs[:] = [x for x in dirs if x != ".lakefuse"]
        for f in files:
            p = Path(d) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def _errno(fn) -> int:
    try:
        fn()
    except OSError as e:
        return e.errno
    return 0


def mount_options(mp: Path) -> set[str]:
    """The per-mount options of the mount at ``mp`` (/proc/self/mountinfo)."""
    found: set[str] = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        if parts[4] == str(mp):
            found = set(parts[5].split(","))
    return found


def check_dump_mount(mp: Path, story: dict, kernel_ro: bool = True) -> None:
    """What a dump mount must show and refuse (the same on every namespace). ``kernel_ro``:
    mounted ``ro`` (the default), else (``-o rw``) every write reaches the daemon, which refuses it."""
    assert ("ro" in mount_options(mp)) == kernel_ro
    assert sorted(os.listdir(mp)) == ["dev", "main", "v1"]  # branches and tags
    for ref, files in story["expect"].items():
        assert walk(mp / ref) == files, ref
    assert not (mp / "main" / "staged.txt").exists()  # staging is not part of a dump
    # .lakefuse/head and log work; there are no control files; stats says it is a dump
    assert (mp / "main" / ".lakefuse" / "head").read_text() == story["refs"]["main"] + "\n"
    assert [ln.split()[0] for ln in (mp / "main" / ".lakefuse" / "log").read_text().splitlines()] == story["log"]
    assert (mp / "v1" / ".lakefuse" / "head").read_text().strip() == story["refs"]["v1"]
    assert sorted(os.listdir(mp / "main" / ".lakefuse")) == ["head", "log"]
    assert os.listdir(mp / ".lakefuse") == ["stats"]
    stats = json.loads((mp / ".lakefuse" / "stats").read_text())
    assert stats["source"] == "refs-dump" and stats["read_only"] is True and stats["repository"] == "sales"
    # branch trees are immutable: read-only modes, and every write is EROFS
    assert os.stat(mp / "main" / "a.csv").st_mode & 0o222 == 0
    main = mp / "main"
    refused = {
        "create": lambda: open(main / "new.txt", "w").close(),
        "write": lambda: open(main / "a.csv", "r+b").close(),
        "append": lambda: open(main / "a.csv", "ab").close(),
        "truncate": lambda: os.truncate(main / "a.csv", 0),
        "mkdir": lambda: os.mkdir(main / "newdir"),
        "mkdir at the root (a branch)": lambda: os.mkdir(mp / "newbranch"),
        "unlink": lambda: os.unlink(main / "a.csv"),
        "rmdir": lambda: os.rmdir(main / "b"),
        "rename": lambda: os.rename(main / "a.csv", main / "z.csv"),
        "symlink": lambda: os.symlink("a.csv", main / "ln"),
        "chmod": lambda: os.chmod(main / "a.csv", 0o600),
        "commit control file": lambda: (main / ".lakefuse" / "commit").write_text("msg"),
        "write to a tag": lambda: open(mp / "v1" / "new.txt", "w").close(),
    }
    got = {what: _errno(fn) for what, fn in refused.items()}
    assert got == {w: errno.EROFS for w in refused}, got
    assert (main / "a.csv").read_bytes() == story["expect"]["main"]["a.csv"]
    # bad requests get their errno; the daemon keeps serving
    assert _errno(lambda: os.stat(mp / "no-such-ref")) == errno.ENOENT
    assert _errno(lambda: os.listdir(mp / "main~99")) == errno.ENOENT
    assert _errno(lambda: os.stat(main / "nope" / "deeper")) == errno.ENOENT
    assert _errno(lambda: os.listdir(main / "a.csv")) == errno.ENOTDIR
    assert _errno(lambda: os.stat(mp / "main" / ".lakefuse" / "status")) == errno.ENOENT
    with open(main / "a.csv", "rb") as f:
        f.seek(10**9)
        assert f.read(10) == b""
    refused_by_daemon = json.loads((mp / ".lakefuse" / "stats").read_text()).get("writes_refused", 0)
    assert refused_by_daemon == 0 if kernel_ro else refused_by_daemon >= len(refused) - 1
    assert walk(mp / "dev") == story["expect"]["dev"]


# ---------------------------------------------------------------------- graveler: Graveler.open_refs_dump


def test_open_refs_dump_reads_the_namespace_only(tmp_path):
    ns = tmp_path / "lake" / "sales"
    story = build_story(tmp_path / "src", ns.as_uri())
    before = sorted(str(p.relative_to(ns)) for p in ns.rglob("*"))
    url = "memory://test-open-refs-dump"
    g = Graveler(GravelerConfig(home=tmp_path / "fresh", kv=KVConfig(url=url)))
    try:
        r = g.open_refs_dump(ns.as_uri())
        assert r.name == "sales" and r.default_branch == "main"  # the last path element
        assert {b.name: b.commit_id for b in r.list_branches()} == {"main": story["refs"]["main"],
                                                                   "dev": story["refs"]["dev"]}
        assert r.get_commit("v1").id == story["refs"]["v1"]
        assert [c.id for c in r.log("main")] == story["log"]
        with pytest.raises(AlreadyExists):
            g.open_refs_dump(ns.as_uri())
        assert g.open_refs_dump(ns.as_uri(), name="other").name == "other"
        # nothing was written to the namespace (no probe object) or to the home's refs
        assert sorted(str(p.relative_to(ns)) for p in ns.rglob("*")) == before
        assert not (tmp_path / "fresh" / "repos").exists()
        # a name the manifest carries wins over the path; one that is no name is not used
        mpath = ns / "_lakefs" / "refs_manifest.json"
        m = json.loads(mpath.read_text())
        mpath.write_text(json.dumps({**m, "repository": "from-manifest"}))
        assert g.open_refs_dump(ns.as_uri()).name == "from-manifest"
        mpath.write_text(json.dumps({**m, "repository": "Not A Name"}))
        with pytest.raises(AlreadyExists):  # falls back to "sales", opened above
            g.open_refs_dump(ns.as_uri())
        bad = tmp_path / "Bad_Name"
        shutil.copytree(ns, bad)
        with pytest.raises(InvalidArgument, match="give a name"):
            g.open_refs_dump(bad.as_uri())
        # a failed load leaves the KV as it was
        names = g.kv.names()
        with pytest.raises(NotFound, match="no refs dump"):
            g.open_refs_dump((tmp_path / "src").as_uri(), name="none-here")
        mr = m["commits_meta_range_id"]
        victim = next(p for p in bad.rglob(f"*{mr}*"))
        victim.unlink()
        with pytest.raises(CorruptedData, match="incomplete"):
            g.open_refs_dump(bad.as_uri(), name="broken")
        assert g.kv.names() == names
    finally:
        g.close()
        forget_space(url)


def test_read_only_core_freezes_branch_trees(tmp_path):
    """``FsConfig.read_only``: a branch tree is immutable (pinned at its head, read-only modes,
    no control files, EROFS); a writable core cannot be read-only."""
    from lakefuse.mount.errors import FsError
    from lakefuse.mount.fs import Filesystem, FsConfig
    from lakefuse.mount.inodes import ROOT_INO
    from lakefuse.mount.writes import BranchWrites
    from tests.graveler_testutil import make_repo

    repo = make_repo(tmp_path)
    repo.upload("main", "f.txt", b"one")
    repo.commit("main", "one")
    fs = Filesystem(repo, FsConfig(read_only=True))
    main = fs.lookup(ROOT_INO, b"main")
    assert fs.tree(b"main").immutable and main.mode & 0o222 == 0
    f = fs.lookup(main.ino, b"f.txt")
    assert f.mode & 0o222 == 0 and f.attr_timeout == fs.config.immutable_timeout
    info = fs.lookup(main.ino, b".lakefuse")
    assert sorted(e.name for e in _listing(fs, info.ino)) == [b"head", b"log"]
    for call in (lambda: fs.mkdir(main.ino, b"d", 0o755, None), lambda: fs.unlink(main.ino, b"f.txt"),
                 lambda: fs.open(f.ino, os.O_WRONLY)):
        with pytest.raises(FsError) as ei:
            call()
        assert ei.value.errno == errno.EROFS
    repo.upload("main", "f.txt", b"two")  # a branch that moved anyway is not followed
    repo.commit("main", "two")
    assert fs.getattr(f.ino).size == 3
    with pytest.raises(ValueError):
        Filesystem(repo, FsConfig(read_only=True), writes=BranchWrites)


def _listing(fs, ino):
    fh = fs.opendir(ino)
    try:
        fs.readdir_fill(fh, 0)
        return fs.readdir_fast(fh, 0)
    finally:
        fs.releasedir(fh)


# ---------------------------------------------------------------------- mounts


@needs_fuse
def test_refs_dump_mount_local_namespace(tmp_path):
    ns = tmp_path / "lake" / "sales"
    story = build_story(tmp_path / "src", ns.as_uri())
    fresh = tmp_path / "fresh"  # a home with no repository at all
    mp = tmp_path / "mnt"
    with MountProc(fresh, "sales", mp, source=["--refs-dump", ns.as_uri()], env={"LAKEFUSE_KV": NO_KV}):
        check_dump_mount(mp, story)
    assert not is_mounted(mp)
    assert not (fresh / "repos").exists()


@needs_fuse
@pytest.mark.s3
def test_refs_dump_mount_s3_namespace_without_any_refs_database(tmp_path, s3_endpoint, s3_config, s3_bucket):
    src = tmp_path / "src"
    story = build_story(src, f"s3://{s3_bucket}/lake/sales", store=s3_config)
    shutil.rmtree(src)  # the source's refs database is gone: only the bucket is left
    fresh = tmp_path / "fresh"
    mp = tmp_path / "mnt"
    cache = tmp_path / "cache"
    env = {"LAKEFUSE_S3_ENDPOINT": s3_endpoint, "LAKEFUSE_KV": NO_KV}
    with MountProc(fresh, "sales", mp, "--cache-dir", str(cache), "-o", "rw",
                   source=["--refs-dump", f"s3://{s3_bucket}/lake/sales"], env=env):
        check_dump_mount(mp, story, kernel_ro=False)  # the daemon itself refuses every write
        stats = json.loads((mp / ".lakefuse" / "stats").read_text())
        assert stats["refs_dump"] == f"s3://{s3_bucket}/lake/sales"
        assert stats["data_cache"]["misses"] >= 1
    # the per-host caches are where this host keeps them
    assert any((cache / "tables").rglob("*")) and any((cache / "data").rglob("*"))
    assert not (fresh / "repos").exists()


def _mount(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(lakefuse_cmd(home, "mount", *args), capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LAKEFUSE_KV": NO_KV, **(env or {})})


@needs_fuse
def test_refs_dump_mount_refuses_bad_dumps_in_one_line(tmp_path):
    ns = tmp_path / "lake" / "sales"
    build_story(tmp_path / "src", ns.as_uri())
    fresh = tmp_path / "fresh"
    mp = tmp_path / "mnt"
    mp.mkdir()
    manifest_path = ns / "_lakefs" / "refs_manifest.json"
    good = manifest_path.read_bytes()

    def refused(url: str, code: int, words: str, *extra: str) -> None:
        r = _mount(fresh, "--refs-dump", url, str(mp), *extra)
        assert r.returncode == code, (r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lakefuse: ") and words in lines[0], r.stderr
        assert not is_mounted(mp)

    empty = tmp_path / "empty-ns"
    empty.mkdir()
    refused(empty.as_uri(), 3, "no refs dump", "-f")
    refused(empty.as_uri(), 3, "no refs dump")  # the daemonizing path passes the exit code on
    manifest_path.write_bytes(good[: len(good) // 2])  # truncated
    refused(ns.as_uri(), 5, "malformed refs manifest", "-f")
    manifest_path.write_bytes(b"\x00\xffgarbage{")
    refused(ns.as_uri(), 5, "malformed refs manifest", "-f")
    manifest_path.write_bytes(good)
    mr = json.loads(good)["branches_meta_range_id"]
    victim = next(p for p in ns.rglob(f"*{mr}*"))
    saved = victim.read_bytes()
    victim.unlink()
    refused(ns.as_uri(), 5, "incomplete", "-f")
    victim.write_bytes(saved)
    refused("ftp://host/x", 2, "file:///", "-f")
    # usage mistakes
    r = _mount(fresh, "--refs-dump", ns.as_uri(), "lakefs://sales", str(mp), "-f")
    assert r.returncode == 2 and "only the MOUNTPOINT" in r.stderr and not is_mounted(mp)
    r = _mount(fresh, "--name", "x", "lakefs://sales", str(mp), "-f")
    assert r.returncode == 2 and "--name is for --refs-dump" in r.stderr
    assert not (fresh / "repos").exists()


@needs_fuse
def test_refs_dump_mount_daemonizes(tmp_path):
    ns = tmp_path / "lake" / "sales"
    story = build_story(tmp_path / "src", ns.as_uri())
    fresh = tmp_path / "fresh"
    mp = tmp_path / "mnt"
    mp.mkdir()
    r = _mount(fresh, "--refs-dump", ns.as_uri(), str(mp), "--name", "train")
    try:
        assert r.returncode == 0, r.stderr
        assert "mounted " + ns.as_uri() in r.stderr
        assert walk(mp / "v1") == story["expect"]["v1"]
        assert json.loads((mp / ".lakefuse" / "stats").read_text())["repository"] == "train"
        assert (fresh / "logs" / "mount-dump-sales.log").exists()
        u = subprocess.run(lakefuse_cmd(fresh, "umount", str(mp)), capture_output=True, text=True, timeout=60)
        assert u.returncode == 0, u.stderr
        assert not is_mounted(mp)
    finally:
        force_unmount(mp)
