"""graveler.kv: nesting rules, damaged files, and maps grown by other processes."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from graveler import kv
from graveler.errors import CorruptedData, NotFound

SMALL = kv.KVConfig(map_size=1 << 16, sync=False)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(tmp_path):
    p = tmp_path / "repos" / "r1" / "refs.lmdb"
    e = kv.open_env(p, SMALL)
    yield e
    kv.close_env(p)


def _fill(env, n: int, size: int = 4000, tag: bytes = b"k"):
    def fn(txn):
        for i in range(n):
            txn.put(kv.STAGING, tag + b"%06d" % i, b"x" * size)

    env.write(fn)


def _in_thread(fn, timeout: float = 20.0):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it does not finish."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "deadlocked"
    if "error" in box:
        raise box["error"]
    return box.get("result")


# --- nesting --------------------------------------------------------------------------


def test_write_inside_read_is_refused_at_once(env):
    """It used to hang as soon as the write had to grow the map (the caller's own read blocked the grow)."""
    def nested():
        with env.read():
            _fill(env, 200)  # 800 KB into a 64 KiB map: must grow

    with pytest.raises(kv.NestedTransaction, match="inside another transaction"):
        _in_thread(nested)
    # refused even when no grow is needed, so the bug shows on the first call
    with pytest.raises(kv.NestedTransaction):
        _in_thread(lambda: _nested_small_write(env))
    _fill(env, 200)  # the environment is fine afterwards
    assert env.stat()["staging"] == 200


def _nested_small_write(env):
    with env.read():
        env.write(lambda txn: txn.put(kv.STAGING, b"a", b"b"))


def test_write_inside_write_is_refused(env):
    def fn(txn):
        env.write(lambda t: None)

    with pytest.raises(kv.NestedTransaction):
        _in_thread(lambda: env.write(fn))


def test_read_inside_write_or_read_uses_the_open_transaction(env):

    def fn(txn):
        txn.put(kv.STAGING, b"k", b"v")
        with env.read() as inner:
            assert inner is txn
            return inner.get(kv.STAGING, b"k")  # sees the write's own change

    assert _in_thread(lambda: env.write(fn)) == b"v"

    def reads():
        with env.read() as outer:
            with env.read() as inner:
                assert inner is outer
            return outer.get(kv.STAGING, b"k")  # the inner exit did not end the outer transaction

    assert _in_thread(reads) == b"v"
    _fill(env, 200)  # and a later grow still works: nothing was left marked open


def test_other_threads_are_not_nested(env):
    """The rule is per thread: another thread's write while this one reads is ordinary."""
    with env.read():
        t = threading.Thread(target=lambda: env.write(lambda txn: txn.put(kv.STAGING, b"t", b"1")))
        t.start()
        t.join(20)
        assert not t.is_alive()
    with env.read() as txn:
        assert txn.get(kv.STAGING, b"t") == b"1"


# --- damaged files --------------------------------------------------------------------

_OPEN_AND_READ = textwrap.dedent("""
    import sys
    from graveler import kv
    from graveler.errors import CorruptedData
    try:
        env = kv.open_env(sys.argv[1], create=False)
        with env.read() as txn:
            for table in kv.TABLES:
                for _ in txn.scan(table):
                    pass
    except CorruptedData as e:
        print(e)
        sys.exit(5)
    print("read everything")
""")


def _open_in_child(path: Path) -> subprocess.CompletedProcess:
    """Open and read every record in another process: a SIGBUS must not kill the test run."""
    return subprocess.run([sys.executable, "-c", _OPEN_AND_READ, str(path)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def _damaged_env(tmp_path: Path) -> Path:
    p = tmp_path / "repos" / "rep1" / "refs.lmdb"
    e = kv.open_env(p, SMALL)
    for i in range(3):
        _fill(e, 100, 1000, tag=b"c%d-" % i)
    kv.close_env(p)
    assert (p / "data.mdb").stat().st_size > 16384 * 4
    return p


def test_truncated_data_file_is_corrupted_data_not_sigbus(tmp_path):
    p = _damaged_env(tmp_path)
    os.truncate(p / "data.mdb", 16384)
    r = _open_in_child(p)
    assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)  # it was -7 (SIGBUS)
    assert "repository 'rep1'" in r.stdout and "truncated" in r.stdout
    with pytest.raises(CorruptedData, match="truncated"):
        kv.Env(p, SMALL, create=False)


def test_empty_data_file_is_corrupted_data_not_a_new_database(tmp_path):
    p = _damaged_env(tmp_path)
    os.truncate(p / "data.mdb", 0)
    with pytest.raises(CorruptedData, match=r"repository 'rep1'.*empty"):
        kv.Env(p, SMALL, create=False)
    assert (p / "data.mdb").stat().st_size == 0  # nothing was written over the evidence


def test_bad_meta_page_is_corrupted_data(tmp_path):
    p = _damaged_env(tmp_path)
    with open(p / "data.mdb", "r+b") as f:
        f.seek(16)
        f.write(b"\0\0\0\0")
    with pytest.raises(CorruptedData, match="magic"):
        kv.Env(p, SMALL)


def test_missing_environment_without_create(tmp_path):
    with pytest.raises(NotFound):
        kv.Env(tmp_path / "nothing", SMALL, create=False)
    assert not (tmp_path / "nothing").exists()


def test_damaged_data_pages_are_corrupted_data(tmp_path):
    """Random bytes over the data pages (the meta pages intact): 5 naming the repository, never 6 or a crash."""
    p = _damaged_env(tmp_path)
    size = (p / "data.mdb").stat().st_size
    rnd = random.Random(7)
    with open(p / "data.mdb", "r+b") as f:
        for pg in range(2, size // 4096):
            f.seek(pg * 4096)
            f.write(rnd.randbytes(4096))
    r = _open_in_child(p)
    assert r.returncode == 5, (r.returncode, r.stdout, r.stderr)
    assert "repository 'rep1'" in r.stdout and "damaged" in r.stdout


# --- other processes growing the map ----------------------------------------------------

_STAGER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from graveler.config import GravelerConfig, KVConfig
    from graveler.home import Graveler
    from graveler.model import Entry
    home, n = Path(sys.argv[1]), int(sys.argv[2])
    g = Graveler(GravelerConfig(home=home, kv=KVConfig(map_size=1 << 26, sync=False)))
    repo = g.repository("big")
    meta = {"m": "x" * 8192}
    for start in range(0, n, 2000):
        repo.stage_many("main", [(f"p/{i:07d}", Entry(address=f"data/x/{i}", size=1, etag="e",
                                                         last_modified_ns=1, metadata=meta))
                                  for i in range(start, min(start + 2000, n))])
    g.close()
""")

_LISTER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from graveler.config import GravelerConfig
    from graveler.errors import GravelerError
    from graveler.home import Graveler
    home, stop = Path(sys.argv[1]), Path(sys.argv[2])
    ok = failed = 0
    while not stop.exists():
        g = Graveler(GravelerConfig(home=home))  # default map size, as a CLI command opens it
        try:
            for _ in range(3):
                assert [b.name for b in g.repository("big").list_branches()] == ["main"]
            ok += 1
        except GravelerError as e:
            failed += 1
            print("FAILED", type(e).__name__, e, flush=True)
        finally:
            g.close()  # closes the environment: the next round opens it again
    print("rounds", ok, failed)
""")


@pytest.mark.slow
def test_map_grown_by_one_process_never_fails_another(tmp_path):
    """One process stages 200,000 entries with 8 KB of metadata (the map grows 64 MiB -> 2 GiB) while
    others list branches in a loop, opening the environment each round: no round may fail."""
    from graveler.config import GravelerConfig
    from graveler.home import Graveler

    home = tmp_path / "home"
    g = Graveler(GravelerConfig(home=home, kv=kv.KVConfig(map_size=1 << 26, sync=False)))
    g.create_repository("big", f"file://{tmp_path}/ns")
    g.close()
    stop = tmp_path / "stop"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    listers = [subprocess.Popen([sys.executable, "-c", _LISTER, str(home), str(stop)], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        stager = subprocess.run([sys.executable, "-c", _STAGER, str(home), "200000"], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=600)
    finally:
        stop.touch()
        outs = [p.communicate(timeout=120)[0] for p in listers]
    assert stager.returncode == 0, stager.stderr
    for out in outs:
        assert "FAILED" not in out and "Traceback" not in out, out
        rounds = out.split()
        assert rounds[-3] == "rounds" and int(rounds[-2]) > 0 and rounds[-1] == "0", out
    e = kv.open_env(home / "repos" / "big" / "refs.lmdb", create=False)
    assert e.stat()["staging"] == 200000
    kv.close_env(e.path)


# --- group commit ---------------------------------------------------------------------


def test_concurrent_grouped_writes_share_transactions_and_keep_their_own_errors(tmp_path):
    """write_grouped: concurrent writers land in shared durable transactions; a failing
    fn fails only its own caller, and every other write is committed."""
    p = tmp_path / "g" / "refs.lmdb"
    e = kv.open_env(p, kv.KVConfig(map_size=1 << 20, sync=True))
    try:
        gate = threading.Barrier(8)
        errors: list[BaseException] = []

        def writer(i: int) -> None:
            gate.wait()
            for j in range(20):
                def fn(txn, i=i, j=j):
                    if i == 3 and j == 7:
                        raise ValueError("bad one")
                    txn.put(kv.STAGING, b"%d-%d" % (i, j), b"v")
                    return (i, j)
                try:
                    assert e.write_grouped(fn) == (i, j)
                except ValueError as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [str(x) for x in errors] == ["bad one"]
        with e.read() as txn:
            keys = {k for k, _ in txn.scan(kv.STAGING)}
        assert keys == {b"%d-%d" % (i, j) for i in range(8) for j in range(20)} - {b"3-7"}
        assert e._synced_seq == e._commit_seq  # every grouped write returned durable
    finally:
        kv.close_env(p)
