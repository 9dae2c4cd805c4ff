"""The LMDB redo log (graveler.kv.lmdb_redo): commits flush nothing, yet a power loss leaves the
refs file whole -- the checkpoint plus a prefix of the logged commits, never a mix.

A power loss is simulated on real files: a writer process commits, is killed with SIGKILL,
and then every page of ``data.mdb`` that changed since the checkpoint independently either
reached the disk or did not (its old bytes, or zeros past the old end), and the log is cut
somewhere after the last durable write. The recovered environment must hold exactly the
state after one of the commits from that durable write on. The same files undamaged, and a
restart after a clean close, must come back whole with nothing thrown away.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from graveler import kv
from graveler.errors import CorruptedData, StoreUnavailable
from graveler.kv import lmdb_redo

TABLES = (kv.STAGING, kv.BRANCHES)
N_BASE, N_AFTER, DURABLE_AT = 40, 300, 150  # commits before the checkpoint, after it, the durable one


def _ops(seed: int) -> list[list]:
    """Commits of puts, deletes, range deletes and counter adds (JSON-friendly)."""
    rng = random.Random(seed)
    commits = []
    for _ in range(N_BASE + N_AFTER):
        ops = []
        for _ in range(rng.randint(1, 6)):
            table = rng.choice(TABLES)
            r = rng.random()
            key = f"k{rng.randint(0, 400):04d}"
            if r < 0.6:
                ops.append(["put", table, key, "v" * rng.randint(1, 900) + str(rng.random())])
            elif r < 0.8:
                ops.append(["del", table, key])
            elif r < 0.9:
                start = rng.randint(0, 400)
                ops.append(["delrange", table, f"k{start:04d}", f"k{start + rng.randint(1, 30):04d}",
                            rng.choice([None, 1, 3])])
            else:
                ops.append(["add", kv.STAMPS, f"c{rng.randint(0, 3)}", rng.randint(1, 9)])
        commits.append(ops)
    return commits


def _model(commits: list[list]) -> list[dict]:
    """The state (table -> {key: value}) after each commit: an independent dict model."""
    state: dict[str, dict[bytes, bytes]] = {t: {} for t in kv.TABLES}
    out = []
    for ops in commits:
        for op in ops:
            t = state[op[1]]
            if op[0] == "put":
                t[op[2].encode()] = op[3].encode()
            elif op[0] == "del":
                t.pop(op[2].encode(), None)
            elif op[0] == "delrange":
                keys = sorted(k for k in t if op[2].encode() <= k < op[3].encode())
                for k in keys[:op[4]] if op[4] is not None else keys:
                    del t[k]
            else:
                old = int.from_bytes(t.get(op[2].encode(), b""), "big")
                t[op[2].encode()] = (old + op[3]).to_bytes(8, "big")
        out.append({name: dict(v) for name, v in state.items()})
    return out


_CHILD = r"""
import json, os, sys, time
from graveler import kv
path, ops_file, mode = sys.argv[1], sys.argv[2], sys.argv[3]
commits = json.load(open(ops_file))
N_BASE, DURABLE_AT = int(sys.argv[4]), int(sys.argv[5])
# a map that grows ("grow": from 256 KiB) ends the pin, so the next write checkpoints again
e = kv.open_env(path, kv.KVConfig(map_size=1 << (18 if mode == "grow" else 26), sync_interval=3600))

def run(ops):
    def fn(t):
        for op in ops:
            if op[0] == "put":
                t.put(op[1], op[2].encode(), op[3].encode())
            elif op[0] == "del":
                t.delete(op[1], op[2].encode())
            elif op[0] == "delrange":
                t.delete_range(op[1], op[2].encode(), op[3].encode(), op[4])
            else:
                t.add(op[1], op[2].encode(), op[3])
    return fn

for ops in commits[:N_BASE]:
    e.write(run(ops), durable=False)
e._checkpoint_now()
ckpt = e._redo.current()
print("checkpoint", flush=True)
sys.stdin.readline()  # the parent copies data.mdb as the disk holds it now
durable_log = None
for i, ops in enumerate(commits[N_BASE:], N_BASE):
    e.write(run(ops), durable=(i == DURABLE_AT))
    if i == DURABLE_AT:
        durable_log = sum(os.path.getsize(p) for p in e._redo.path.glob("redo.*.log"))
if mode == "grow":
    assert e._redo.current() != ckpt, "the map grew, yet no new checkpoint"
else:
    assert e._redo.current() == ckpt, "a checkpoint after the parent's copy of data.mdb"
print("done", durable_log, flush=True)
if mode == "close":
    kv.close_env(path)
    print("closed", flush=True)
time.sleep(3600)
"""


def _writer(tmp_path: Path, seed: int, mode: str = "kill") -> tuple[Path, bytes, int, list[dict]]:
    """Run the writer; return (env path, data.mdb at the checkpoint, log bytes at the durable
    write, model states). The writer is dead when this returns (SIGKILL, no close)."""
    commits = _ops(seed)
    ops_file = tmp_path / "ops.json"
    ops_file.write_text(json.dumps(commits))
    path = tmp_path / "refs.lmdb"
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(ops_file), mode, str(N_BASE),
                          str(DURABLE_AT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    try:
        assert p.stdout.readline().strip() == "checkpoint"
        image = (path / "data.mdb").read_bytes()
        p.stdin.write("go\n")
        p.stdin.flush()
        line = p.stdout.readline().split()
        assert line[0] == "done", line
        durable_log = int(line[1])
        if mode == "close":
            assert p.stdout.readline().strip() == "closed"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    return path, image, durable_log, _model(commits)


def _state(path: Path) -> dict:
    e = kv.open_env(path, kv.KVConfig(map_size=1 << 26, sync_interval=3600), create=False)
    try:
        with e.read() as t:
            return {name: dict(t.scan(name)) for name in kv.TABLES}
    finally:
        kv.close_env(path)


def _lose_power(path: Path, image: bytes, durable_log: int, rng: random.Random, pages: str) -> None:
    """What the disk may hold after a power loss: each page changed since the checkpoint written
    or not (``pages``: "old", "new" or "mix"), the log cut after its durable part."""
    data = path / "data.mdb"
    cur = data.read_bytes()
    ps = 4096
    out = bytearray(cur)
    for off in range(0, len(cur), ps):
        new = cur[off:off + ps]
        old = image[off:off + ps].ljust(len(new), b"\0")
        if old != new and (pages == "old" or (pages == "mix" and rng.random() < 0.5)):
            out[off:off + ps] = old
    if pages == "old":
        out = out[:len(image)]  # the file's growth lost too
    data.write_bytes(bytes(out))
    (log,) = sorted(path.glob("redo.*.log"))
    raw = log.read_bytes()
    cut = rng.randint(durable_log, len(raw))
    log.write_bytes(raw[:cut] + (os.urandom(rng.randint(0, 60)) if pages == "mix" else b""))


@pytest.fixture
def new_boot(monkeypatch):
    """The next opens run as after a restart of the machine."""
    monkeypatch.setattr(lmdb_redo, "boot_id", lambda: b"\x42" * 16)


@pytest.mark.parametrize("pages,seed", [("old", 1), ("new", 2), ("mix", 3), ("mix", 4)])
def test_after_a_power_loss_the_file_holds_the_checkpoint_and_a_prefix_of_the_logged_commits(
        tmp_path, new_boot, pages, seed, caplog):
    path, image, durable_log, states = _writer(tmp_path, seed)
    _lose_power(path, image, durable_log, random.Random(seed), pages)
    with caplog.at_level(logging.WARNING, logger="graveler.kv.lmdb_redo"):
        got = _state(path)
    assert "restored its checkpoint" in caplog.text
    later = states[DURABLE_AT:]  # the durable write and any commit after it: never less
    assert got in later, "the recovered state is no commit's state from the durable write on"
    assert _state(path) == got  # and it stays so (recovered once, checkpointed)


def test_a_restart_with_every_write_on_disk_loses_no_commit(tmp_path, new_boot, caplog):
    path, image, durable_log, states = _writer(tmp_path, 5)
    with caplog.at_level(logging.WARNING, logger="graveler.kv.lmdb_redo"):
        assert _state(path) == states[-1]
    assert "torn" not in caplog.text


def test_a_restart_after_the_map_grew_redoes_from_the_checkpoint_made_after_the_grow(tmp_path, new_boot, caplog):
    path, image, durable_log, states = _writer(tmp_path, 10, mode="grow")
    with caplog.at_level(logging.WARNING, logger="graveler.kv.lmdb_redo"):
        assert _state(path) == states[-1]
    assert "restored its checkpoint" in caplog.text


def test_a_process_killed_without_a_restart_needs_no_recovery(tmp_path, caplog):
    path, image, durable_log, states = _writer(tmp_path, 6)
    with caplog.at_level(logging.INFO, logger="graveler.kv.lmdb_redo"):
        assert _state(path) == states[-1]
    assert "restart" not in caplog.text


def test_a_restart_after_a_clean_close_redoes_nothing_and_changes_no_page(tmp_path, new_boot, caplog):
    path, image, durable_log, states = _writer(tmp_path, 7, mode="close")
    before = (path / "data.mdb").read_bytes()
    assert all(p.stat().st_size == 0 for p in path.glob("redo.*.log"))  # the close checkpointed
    with caplog.at_level(logging.INFO, logger="graveler.kv.lmdb_redo"):
        assert _state(path) == states[-1]
    assert "nothing was committed after its checkpoint" in caplog.text
    assert "restored" not in caplog.text
    assert (path / "data.mdb").read_bytes() == before


def test_a_damaged_checkpoint_record_is_refused_and_the_file_left_alone(tmp_path, new_boot):
    path, image, durable_log, states = _writer(tmp_path, 8)
    before = (path / "data.mdb").read_bytes()
    ck = path / lmdb_redo.CKPT
    raw = bytearray(ck.read_bytes())
    raw[30] ^= 0xFF
    ck.write_bytes(bytes(raw))
    with pytest.raises(CorruptedData, match="redo.ckpt"):
        _state(path)
    assert (path / "data.mdb").read_bytes() == before


def test_a_second_writer_commits_on_the_pin_another_process_holds_until_that_process_dies(tmp_path):
    """Another live process pins the checkpoint (``redo.pin`` names it): this one appends to its
    log without a checkpoint of its own. Once that process is dead and an open has cleared its
    reader slot, the next write here makes a checkpoint (the pages are no longer kept)."""
    path, image, durable_log, states = _writer(tmp_path, 9)  # (killed: an open clears its pin)
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom graveler import kv\n"
        f"e = kv.open_env({str(path)!r}, kv.KVConfig(map_size=1 << 26, sync_interval=3600))\n"
        "for i in range(3):\n"
        "    e.write(lambda t: t.put(kv.STAGING, b'from-child', b'%d' % i), durable=False)\n"
        "print('pinned', e._keeper.pin_txnid, flush=True)\ntime.sleep(3600)\n")],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    e = None
    try:
        line = child.stdout.readline().split()
        assert line[0] == "pinned" and line[1] != "None"
        child_ck = (path / lmdb_redo.CKPT).stat().st_ino
        e = kv.open_env(path, kv.KVConfig(map_size=1 << 26, sync_interval=3600))
        for i in range(21):
            e.write(lambda t, i=i: t.put(kv.STAGING, b"p%d" % i, b"x"), durable=False)
        assert (path / lmdb_redo.CKPT).stat().st_ino == child_ck  # no checkpoint of its own
        assert e._keeper.pin_txnid is None
        (log,) = sorted(path.glob("redo.*.log"))
        records, torn = lmdb_redo.read_records(log)
        assert len(records) == 3 + 21 and torn == 0

        child.send_signal(signal.SIGKILL)
        child.wait()
        subprocess.run([sys.executable, "-c", (  # an open: its reader check clears the dead pin
            "from graveler import kv\n"
            f"kv.open_env({str(path)!r}, kv.KVConfig(map_size=1 << 26, sync_interval=3600))\n")],
            check=True, cwd=Path(__file__).resolve().parent.parent)
        assert lmdb_redo.RedoLog(path, "x").read_pin() is None
        e.write(lambda t: t.put(kv.STAGING, b"after", b"x"), durable=False)
        assert (path / lmdb_redo.CKPT).stat().st_ino != child_ck
        assert e._keeper.pin_txnid == e._redo.current().txnid
    finally:
        if e is not None:
            kv.close_env(path)
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_records_round_trip_and_a_torn_or_damaged_tail_ends_the_log(tmp_path):
    ops = [(1, kv.STAGING, b"a", b"1" * 300), (2, kv.BRANCHES, b"b"), (3, kv.STAGING, b"", None, None),
           (3, kv.TAGS, b"x", b"y", 7)]
    assert lmdb_redo.decode_ops(lmdb_redo.encode_ops(ops)) == ops
    log = tmp_path / "redo.log"
    recs = [lmdb_redo._record(1, 11, lmdb_redo.encode_ops(ops)), lmdb_redo._record(1, 12, b""),
            lmdb_redo._record(2, 12, b""), lmdb_redo._record(1, 12, lmdb_redo.encode_ops(ops[:1]))]
    log.write_bytes(b"".join(recs))
    got, torn = lmdb_redo.read_records(log)
    assert torn == 0 and [(k, t) for k, t, _ in got] == [(1, 11), (1, 12), (2, 12), (1, 12)]
    # the last record of an ID wins (an attempt that never committed, an abort marker)
    assert lmdb_redo.commits_after(got, 10) == [(11, ops), (12, ops[:1])]
    assert lmdb_redo.commits_after(got, 11) == [(12, ops[:1])]
    assert lmdb_redo.commits_after(got[:3], 10) == [(11, ops)]  # 12 aborted: the commits end at 11
    assert lmdb_redo.commits_after(got, 12) == []
    whole = b"".join(recs)
    log.write_bytes(whole[:-3])  # torn in the last record
    got, torn = lmdb_redo.read_records(log)
    assert len(got) == 3 and torn == len(recs[-1]) - 3
    damaged = bytearray(whole)
    damaged[len(recs[0]) + 5] ^= 1  # a flipped bit in the second record: it and all after it go
    log.write_bytes(bytes(damaged))
    got, torn = lmdb_redo.read_records(log)
    assert len(got) == 1 and torn == len(whole) - len(recs[0])


def test_a_record_cut_short_by_a_full_disk_commits_nothing_and_leaves_no_torn_record(tmp_path, monkeypatch):
    path = tmp_path / "refs.lmdb"
    e = kv.open_env(path, kv.KVConfig(map_size=1 << 22, sync_interval=3600))
    try:
        e.write(lambda t: t.put(kv.STAGING, b"a", b"1"), durable=False)
        (log,) = sorted(path.glob("redo.*.log"))
        size = log.stat().st_size
        real_write = os.write
        log_ino = log.stat().st_ino

        def short_write(fd, data):
            if os.fstat(fd).st_ino == log_ino:
                return real_write(fd, data[: len(data) // 2])  # the disk filled mid-record
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", short_write)
        with pytest.raises(StoreUnavailable, match="redo log"):
            e.write(lambda t: t.put(kv.STAGING, b"b", b"2"), durable=False)
        monkeypatch.setattr(os, "write", real_write)
        assert log.stat().st_size == size
        with e.read() as t:
            assert t.get(kv.STAGING, b"b") is None  # not committed
        e.write(lambda t: t.put(kv.STAGING, b"c", b"3"), durable=False)
        records, torn = lmdb_redo.read_records(log)
        assert torn == 0 and len(records) == 2
    finally:
        e._keeper.since = 0
        kv.close_env(path)


def test_a_checkpoint_due_is_made_by_the_background_thread_not_by_a_commit(tmp_path, monkeypatch):
    """Half way to a limit a commit wakes the background thread, which checkpoints (the bulk of
    the flush before it takes the writer lock); a commit checkpoints itself only at the limit."""
    monkeypatch.setattr(lmdb_redo, "CKPT_COMMITS", 40)
    made_by = []
    real = lmdb_redo.Keeper.checkpoint

    def spy(self, last):
        made_by.append(threading.current_thread().name)
        return real(self, last)

    monkeypatch.setattr(lmdb_redo.Keeper, "checkpoint", spy)
    path = tmp_path / "refs.lmdb"
    e = kv.open_env(path, kv.KVConfig(map_size=1 << 22, sync_interval=3600))  # (no timed checkpoint)
    try:
        e.write(lambda t: t.put(kv.STAGING, b"k", b"0"), durable=False)
        made_by.clear()
        for i in range(25):  # past 20: due
            e.write(lambda t, i=i: t.put(kv.STAGING, b"k%d" % i, b"v"), durable=False)
        deadline = time.monotonic() + 10
        while (not made_by or e._keeper.since >= 25) and time.monotonic() < deadline:
            time.sleep(0.01)  # (made_by says one began; ``since`` drops once it is done)
        assert made_by and all(n.startswith("lmdb-sync") for n in made_by), made_by
        assert e._keeper.since < 25
        ck = e._redo.current()
        assert ck is not None and ck.txnid > 2  # (a checkpoint of a later commit than the first's)
        # not due (a few commits since): no checkpoint is made meanwhile
        n = len(made_by)
        for i in range(3):
            e.write(lambda t, i=i: t.put(kv.STAGING, b"m%d" % i, b"v"), durable=False)
        time.sleep(0.2)
        assert len(made_by) == n
    finally:
        kv.close_env(path)
    with kv.open_env(path, kv.KVConfig(map_size=1 << 22)).read() as t:  # everything kept
        assert t.get(kv.STAGING, b"k24") == b"v" and t.get(kv.STAGING, b"m2") == b"v"
    kv.close_env(path)


def test_an_io_error_writing_the_database_on_a_full_disk_is_no_space_elsewhere_unavailable(tmp_path, monkeypatch):
    """Found by an operator's tour: with the home's disk nearly full, closes through the mount
    failed EIO (LMDB's commit answered "Input/output error": the disk took the pages, then had no
    block for them when they were flushed), where ENOSPC is documented for the refs database's
    disk full. An I/O error on a disk with under 8 MiB (or no inode) left is NoSpace; on a disk
    with room it stays StoreUnavailable (a failing disk is no full one)."""
    import lmdb

    from graveler.errors import NoSpace, StoreUnavailable
    from graveler.kv import lmdb as kv_lmdb
    from graveler.kv import lmdb_redo

    real = os.statvfs(tmp_path)

    def statvfs_with(free_bytes: int, free_inodes: int):
        class S:
            f_frsize = 4096
            f_bavail = free_bytes // 4096
            f_files = 1000
            f_favail = free_inodes
        return lambda p: S()

    eio = lmdb.Error("mdb_txn_commit: Input/output error")
    assert isinstance(kv_lmdb._wrap(eio, tmp_path / "refs.lmdb"), StoreUnavailable) == (
        real.f_bavail * real.f_frsize >= lmdb_redo.NEARLY_FULL_BYTES)
    monkeypatch.setattr(lmdb_redo.os, "statvfs", statvfs_with(300 << 10, 100))
    assert type(kv_lmdb._wrap(eio, tmp_path / "refs.lmdb")) is NoSpace
    monkeypatch.setattr(lmdb_redo.os, "statvfs", statvfs_with(1 << 30, 0))  # no inode left
    assert type(kv_lmdb._wrap(eio, tmp_path / "refs.lmdb")) is NoSpace
    monkeypatch.setattr(lmdb_redo.os, "statvfs", statvfs_with(1 << 30, 100))
    assert type(kv_lmdb._wrap(eio, tmp_path / "refs.lmdb")) is StoreUnavailable
    assert type(kv_lmdb._wrap(lmdb.Error("mdb_put: Permission denied"), tmp_path)) is StoreUnavailable


@pytest.mark.expect_log("a failing background checkpoint is said once, and its recovery")
def test_background_checkpoints_that_fail_are_said_once_and_when_they_go_through_again(tmp_path, monkeypatch, caplog):
    """Found by an operator's tour: with the home's inodes exhausted, background checkpoints
    stopped without a word (the redo log grew, the power-loss window the docs give widened)."""
    from graveler.kv import lmdb as kv_lmdb

    e = kv.open_env(tmp_path / "refs.lmdb", kv.KVConfig(map_size=1 << 22, sync_interval=0.05))
    real = kv_lmdb.Env._checkpoint_now
    failures = []

    def failing(self):
        if len(failures) < 4:
            failures.append(1)
            raise StoreUnavailable("cannot write its checkpoint: No space left on device")
        return real(self)

    monkeypatch.setattr(kv_lmdb.Env, "_checkpoint_now", failing)
    try:
        with caplog.at_level(logging.WARNING, logger="graveler.kv.lmdb"):
            for i in range(40):
                e.write(lambda t, i=i: t.put(kv.STAGING, b"k%d" % i, b"v"), durable=False)
                time.sleep(0.02)
                if len(failures) >= 4 and "go through again" in caplog.text:
                    break
        said = [r.getMessage() for r in caplog.records if r.name == "graveler.kv.lmdb"]
        assert len([m for m in said if "background checkpoint failed" in m]) == 1, said
        assert len([m for m in said if "go through again" in m]) == 1, said
    finally:
        e.close()


def test_a_write_to_a_repository_deleted_meanwhile_is_not_found_not_the_store_unavailable(tmp_path):
    """Found by a concurrency tour: an upload racing ``repo delete`` failed with exit 6 ("cannot
    write its redo log: No such file", a storage problem to look for) where the others said the
    repository was not found (exit 3)."""
    import shutil

    from graveler import Graveler, GravelerConfig
    from graveler.errors import NotFound
    from tests.graveler_testutil import entry

    g = Graveler(GravelerConfig(home=tmp_path / "h"))
    r = g.create_repository("gone-soon", f"file://{tmp_path}/ns")
    r.stage("main", "a", entry("a"))
    shutil.rmtree(tmp_path / "h" / "repos" / "gone-soon")  # (what `repo delete` does, from another process)
    with pytest.raises(NotFound, match="is gone"):
        for i in range(5):
            r.stage("main", f"b{i}", entry("b"))
    g.close()  # (and its close says nothing: it was "cannot write its redo log", then a traceback)
