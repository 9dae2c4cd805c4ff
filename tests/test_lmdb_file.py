"""The pre-open check of LMDB's data.mdb (graveler.kv.lmdb_file), both ways.

Healthy files made by ordinary use -- raw LMDB transactions, and the staging and
commit of an upload -- must open, even when they end before the last page their
meta page counts (LMDB does not write loose pages).  Files truncated into pages the
database uses, or whose free list is damaged, must be CorruptedData (exit 5), never
a SIGBUS.  Every open of a file under test happens in another process, so a SIGBUS
fails the test instead of killing the run.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import lmdb
import pytest

from graveler import Graveler, GravelerConfig, KVConfig, kv
from graveler.kv import lmdb_file
from graveler.errors import CorruptedData
from graveler.model import Entry
from tests.mount_testutil import FUSE_AVAILABLE, MountProc

ROOT = Path(__file__).resolve().parent.parent


def verdict(path: Path) -> lmdb_file.Verdict:
    fd = os.open(path / "data.mdb", os.O_RDONLY)
    try:
        return lmdb_file.check(fd)
    finally:
        os.close(fd)


_READ_ALL = textwrap.dedent("""
    import json, sys
    from graveler import kv
    from graveler.errors import CorruptedData
    try:
        env = kv.open_env(sys.argv[1], create=False)
        out = {}
        with env.read() as txn:
            for name in kv.TABLES:
                out[name] = {k.hex(): v.hex() for k, v in txn.scan(name)}
    except CorruptedData as e:
        print(e)
        sys.exit(5)
    print(json.dumps(out))
""")


def read_in_child(path: Path) -> subprocess.CompletedProcess:
    """Open with graveler.kv and read every record, in another process."""
    return subprocess.run([sys.executable, "-c", _READ_ALL, str(path)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def free_and_used(path: Path) -> tuple[lmdb_file.Meta, set[int]]:
    """The newest meta and the pages it uses (every page up to last_pg that is not on its free list)."""
    fd = os.open(path / "data.mdb", os.O_RDONLY)
    try:
        meta = lmdb_file.newest(lmdb_file.read_metas(fd))
        used = set(range(2, meta.last_pg + 1))
        lmdb_file._free_list(fd, meta, os.fstat(fd).st_size, used)
        return meta, used
    finally:
        os.close(fd)


def random_lmdb_history(path: Path, seed: int, steps: int, on_commit) -> dict[bytes, bytes]:
    """Ordinary LMDB use: transactions that put and delete keys of mixed sizes (some on overflow pages).
    ``on_commit(model)`` runs after each commit with the expected contents of the ``staging`` database."""
    rnd = random.Random(seed)
    model: dict[bytes, bytes] = {}
    # (room for the pages a reader's snapshot keeps from reuse: a graveler open pins its checkpoint
    # until it closes, and a writer committing as fast as it can outgrew 64 MiB beside one)
    env = lmdb.open(str(path), map_size=1 << 28, max_dbs=len(kv.TABLES) + 2, sync=False)
    try:
        db = env.open_db(kv.STAGING.encode())
        for name in kv.TABLES:
            env.open_db(name.encode())
        for _ in range(steps):
            with env.begin(write=True) as txn:
                keys = [b"k%06d" % rnd.randrange(5000) for _ in range(rnd.randrange(1, 500))]
                for k in keys:
                    v = bytes([rnd.randrange(256)]) * rnd.randrange(10, 3000)
                    txn.put(k, v, db=db)
                    model[k] = v
                if rnd.random() < 0.7:
                    rnd.shuffle(keys)
                    for k in keys[:rnd.randrange(len(keys) + 1)]:
                        txn.delete(k, db=db)
                        model.pop(k, None)
            if on_commit(dict(model)):
                break
    finally:
        env.close()
    return model


def find_short_files(tmp_path: Path, want: int, min_pages: int = 1) -> list[tuple[Path, dict[bytes, bytes], lmdb_file.Verdict]]:
    """Copies of data.mdb taken whenever ordinary use left it short by ``min_pages`` or more pages."""
    found: list = []
    seed = 0
    while len(found) < want and seed < 60:
        live = tmp_path / f"live{seed}"

        def on_commit(model, live=live):
            v = verdict(live)
            assert v.healthy, v  # never a false alarm on a file LMDB itself just wrote
            if v.short_pages >= min_pages:
                snap = tmp_path / f"short{len(found)}" / "refs.lmdb"
                snap.mkdir(parents=True)
                shutil.copyfile(live / "data.mdb", snap / "data.mdb")
                found.append((snap, model, v))
            return len(found) >= want

        random_lmdb_history(live, seed, 20, on_commit)
        shutil.rmtree(live)
        seed += 1
    assert len(found) >= want, f"ordinary LMDB use left only {len(found)} short file(s) in {seed} histories"
    return found


def test_files_lmdb_leaves_short_are_healthy_and_open_in_a_new_process(tmp_path):
    for snap, model, v in find_short_files(tmp_path, 4):
        size = (snap / "data.mdb").stat().st_size
        assert size < v.meta.size_needed  # what the old check refused as "truncated"
        assert v.short_pages == v.meta.last_pg + 1 - size // v.meta.psize
        r = read_in_child(snap)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)  # no exit 5, no SIGBUS
        import json

        got = json.loads(r.stdout)["staging"]
        assert got == {k.hex(): v.hex() for k, v in model.items()}
        # opened once: extended under the writer lock to what its meta counts, so the next open is quick
        assert (snap / "data.mdb").stat().st_size == v.meta.size_needed
        assert verdict(snap).short_pages == 0
        assert read_in_child(snap).stdout == r.stdout


def test_several_trailing_free_pages_are_healthy(tmp_path):
    """'Tolerate one missing page' would be unsound both ways: ordinary use leaves more than one."""
    for snap, model, v in find_short_files(tmp_path, 2, min_pages=2):
        assert v.short_pages >= 2
        r = read_in_child(snap)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)


def test_truncated_into_a_used_page_is_damaged_exit_5_never_sigbus(tmp_path):
    snap, _, v = find_short_files(tmp_path, 1)[0]
    meta, used = free_and_used(snap)
    cut = max(used) * meta.psize  # the highest page the database uses is gone
    os.truncate(snap / "data.mdb", cut)
    bad = verdict(snap)
    assert not bad.healthy and "truncated" in bad.damage and "in use" in bad.damage
    r = read_in_child(snap)
    assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
    assert "truncated" in r.stdout
    assert (snap / "data.mdb").stat().st_size == cut  # nothing written over the evidence


def test_a_cut_inside_the_free_tail_that_takes_a_used_page_is_damaged(tmp_path):
    """Only the free pages may be missing: cutting one used page below them is damage."""
    snap, _, v = find_short_files(tmp_path, 1)[0]
    meta, used = free_and_used(snap)
    size = (snap / "data.mdb").stat().st_size
    below = max(p for p in used if p * meta.psize < size)
    os.truncate(snap / "data.mdb", below * meta.psize + meta.psize // 2)  # half of that page is left
    assert not verdict(snap).healthy
    assert read_in_child(snap).returncode == 5


def test_short_file_with_a_damaged_free_list_is_damaged(tmp_path):
    snap, _, v = find_short_files(tmp_path, 1)[0]
    with open(snap / "data.mdb", "r+b") as f:
        f.seek(v.meta.free_root * v.meta.psize)
        f.write(random.Random(3).randbytes(v.meta.psize))
    bad = verdict(snap)
    assert not bad.healthy and "free-list" in bad.damage
    r = read_in_child(snap)
    assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
    with pytest.raises(CorruptedData, match="free-list"):
        kv.check_data_file(snap)


def test_checks_beside_a_busy_writer_never_call_it_damaged(tmp_path):
    """Another process commits as fast as it can (leaving short files often) while this one checks the
    file over and over and other processes open it: no check may call it damaged."""
    live = tmp_path / "repos" / "busy" / "refs.lmdb"
    live.mkdir(parents=True)
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from pathlib import Path
        sys.path.insert(0, sys.argv[3])
        from tests.test_lmdb_file import random_lmdb_history
        stop = Path(sys.argv[2])
        random_lmdb_history(Path(sys.argv[1]), 11, 100000, lambda model: stop.exists())
    """), str(live), str(stop), str(ROOT)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not (live / "data.mdb").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        seen = {"short": 0, "checks": 0}
        opens: list[subprocess.CompletedProcess] = []

        def opener():
            for _ in range(4):
                opens.append(read_in_child(live))

        t = threading.Thread(target=opener)
        t.start()
        end = time.monotonic() + 4
        while time.monotonic() < end:
            try:
                v = verdict(live)
            except RuntimeError:  # kept changing: busy, never damaged
                continue
            assert v.healthy, v
            seen["checks"] += 1
            seen["short"] += bool(v.short_pages)
        t.join(120)
        assert writer.poll() is None, "the writer died"
        assert seen["checks"] > 50
        for r in opens:
            assert r.returncode == 0, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    finally:
        stop.touch()
        writer.wait(60)


# --- the report: an upload's staging and commit left the refs database one page short -------------


def _stage_upload_shape(home: Path, name: str, order: str) -> None:
    """The staging a recursive upload of the issue's tree makes (22,001 entries, batches of 1,000,
    the 200 MiB file last), then its commit."""
    g = Graveler(GravelerConfig(home=home, kv=KVConfig(sync=False)))
    try:
        repo = g.create_repository(name, f"file://{home.parent}/ns-{name}")
        paths = [f"small/d{i % 20:02d}/f{i:05d}.txt" for i in range(2000)] + [f"wide/w{i:06d}" for i in range(20000)]
        if order == "sorted":
            paths.sort()
        elif order == "big-first":
            paths.insert(0, "big.bin")
        items = [(p, Entry(address=f"data/{i:032x}", size=16, etag=f"{i:032x}", last_modified_ns=1_700_000_000 * 10**9,
                           content_type="application/octet-stream")) for i, p in enumerate(paths)]
        for s in range(0, len(items), 1000):
            repo.stage_many("main", items[s:s + 1000])
        if order != "big-first":
            repo.stage_many("main", [("big.bin", Entry(address="data/big", size=200 << 20, etag="b" * 32,
                                                       last_modified_ns=1))])
        repo.commit("main", "tree")
    finally:
        g.close()


def test_upload_shaped_staging_and_commit_open_and_read_back(tmp_path):
    """Reproduces the report with graveler's own calls: at least one of these shapes leaves data.mdb
    shorter than its meta page counts (the old check refused it), and every one opens and lists."""
    shorts = 0
    mounted = False
    for order in ("sorted", "walk", "big-first"):
        home = tmp_path / order / "home"
        _stage_upload_shape(home, f"rep-{order}", order)
        path = home / "repos" / f"rep-{order}" / "refs.lmdb"
        v = verdict(path)
        assert v.healthy, v
        shorts += bool(v.short_pages)
        r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import sys
            from pathlib import Path
            from graveler import Graveler, GravelerConfig
            g = Graveler(GravelerConfig(home=Path(sys.argv[1])))
            repo = g.repository(sys.argv[2])
            print(sum(1 for _ in repo.list("main", delimiter="")), len(list(repo.log("main"))))
        """), str(home), f"rep-{order}"], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert r.returncode == 0, (order, r.returncode, r.stdout, r.stderr)
        assert r.stdout.split() == ["22001", "2"], (order, r.stdout)
        if v.short_pages:  # and the commands of the report, on a copy as short as the commit left it
            copy = tmp_path / order / "copy"
            shutil.copytree(home, copy)
            os.truncate(copy / "repos" / f"rep-{order}" / "refs.lmdb" / "data.mdb", v.size)
            for args in (["log", f"lakefs://rep-{order}/main"], ["repo", "list"]):
                c = subprocess.run([sys.executable, "-m", "lakefuse", *args, "--home", str(copy)],
                                   capture_output=True, text=True, timeout=120, cwd=ROOT)
                assert c.returncode == 0, (args, c.returncode, c.stderr)  # it was exit 5: "is truncated"
                assert "tree" in c.stdout or f"rep-{order}" in c.stdout
            if FUSE_AVAILABLE and not mounted:  # the mount (it was exit 1), once
                os.truncate(copy / "repos" / f"rep-{order}" / "refs.lmdb" / "data.mdb", v.size)
                mp = tmp_path / "mnt"
                with MountProc(copy, f"rep-{order}", mp):
                    assert len(os.listdir(mp / "main" / "wide")) == 20000
                    assert (mp / "main" / "small" / "d00" / "f00000.txt").stat().st_size == 16
                mounted = True
    assert shorts >= 1, "no shape left a short file: the reproduction no longer reproduces"


def test_an_unknown_data_version_is_refused_as_unreadable_not_as_damaged(tmp_path):
    """A layout this check does not know is not judged by its pages (no false 'truncated'): it is refused
    before LMDB maps anything, as a format this LMDB cannot read (exit 5), and left as it was."""
    snap, _, v = find_short_files(tmp_path, 1)[0]
    with open(snap / "data.mdb", "r+b") as f:
        for page in (0, 1):
            f.seek(page * v.meta.psize + 20)
            f.write((2).to_bytes(4, "little"))
    assert verdict(snap).healthy
    r = read_in_child(snap)
    assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
    assert "format v2" in r.stdout and "damaged" not in r.stdout


@pytest.mark.parametrize("page", [0, 1])
def test_one_meta_page_of_another_format_is_damage_not_a_foreign_format(tmp_path, page):
    """Found by a damage tour: one byte flipped in the version field of meta page 0 was reported
    as LMDB's own "data format v91 is not supported" (exit 6, "try again"), the same flip in page 1
    as a foreign format: LMDB reads both meta pages, and two that disagree are one damaged page."""
    snap, _, v = find_short_files(tmp_path, 1)[0]
    with open(snap / "data.mdb", "r+b") as f:
        f.seek(page * v.meta.psize + 20)
        f.write((91).to_bytes(4, "little"))
    assert not verdict(snap).healthy
    r = read_in_child(snap)
    assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
    assert "damaged" in r.stdout and "two data formats (v" in r.stdout, r.stdout
