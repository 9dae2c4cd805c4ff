"""The PostgreSQL KV backend against a real server (tests/conftest.py: postgres_cluster).

What the contract (tests/test_kv_contract.py, run on postgres too) cannot show: two
connections racing, the server's serialization failures retried, the server going
away and coming back, a newer schema refused, and how a bad URL or login reads.
"""

from __future__ import annotations

import threading
import time

import pytest

from graveler import kv
from graveler.config import KVConfig
from graveler.errors import CorruptedData, InvalidArgument, StoreUnavailable
from tests import pg_testutil

pytestmark = pytest.mark.usefixtures("postgres_url")

postgres = pytest.importorskip("graveler.kv.postgres")


@pytest.fixture
def url(postgres_url, tmp_path):
    return pg_testutil.schema_url(postgres_url, str(tmp_path))


@pytest.fixture
def two(url):
    """Two backends of one database with pools of their own: two clients' connections."""
    a, b = postgres.PgBackend(url), postgres.PgBackend(url)
    yield a.open("r"), b.open("r", create=False)
    a.shutdown()
    b.shutdown()


def _race(fns, timeout=30):
    out = [None] * len(fns)

    def run(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 -- compared by the test
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return out


def test_concurrent_compare_and_set_from_two_connections_exactly_one_wins(two):
    s1, s2 = two
    for round_ in range(5):
        old = b"v%d" % round_
        s1.write(lambda t: t.put(kv.BRANCHES, b"main", old))
        barrier = threading.Barrier(2, timeout=10)

        def cas(store, mine):
            first = [True]

            def fn(t):
                assert t.get(kv.BRANCHES, b"main") is not None  # both transactions hold a snapshot
                if first[0]:
                    first[0] = False
                    barrier.wait()
                return t.set_if(kv.BRANCHES, b"main", mine, old)
            return lambda: store.write(fn)

        won = _race([cas(s1, b"a%d" % round_), cas(s2, b"b%d" % round_)])
        assert sorted(won) == [False, True], won
        with s2.read() as t:
            assert t.get(kv.BRANCHES, b"main") == (b"a%d" if won[0] else b"b%d") % round_


def test_no_lost_update_among_racing_increments(two):
    s1, s2 = two
    s1.write(lambda t: t.put(kv.STAMPS, b"n", b"0"))

    def bump(store):
        def go():
            for _ in range(20):
                store.write(lambda t: t.put(kv.STAMPS, b"n", b"%d" % (int(t.get(kv.STAMPS, b"n")) + 1)))
        return go

    assert _race([bump(s1), bump(s2), bump(s1), bump(s2)]) == [None] * 4
    with s1.read() as t:
        assert t.get(kv.STAMPS, b"n") == b"80"


def test_a_serialization_failure_is_retried_transparently(two):
    """Write skew: each reads the key the other writes. SERIALIZABLE aborts one (40001); write() reruns it."""
    s1, s2 = two
    s1.write(lambda t: t.put_many(kv.TAGS, [(b"x", b"0"), (b"y", b"0")]))
    barrier = threading.Barrier(2, timeout=10)
    calls = []

    def skew(store, read, written):
        def fn(t):
            calls.append(read)
            seen = t.get(kv.TAGS, read)
            if len(calls) <= 2:
                barrier.wait()
            t.put(kv.TAGS, written, b"saw " + seen)
            return seen
        return lambda: store.write(fn)

    before = postgres.PgStore.stats_retries
    got = _race([skew(s1, b"x", b"y"), skew(s2, b"y", b"x")])
    assert sorted(got) == [b"0", b"saw 0"], got  # serial: the rerun saw the first one's write
    assert len(calls) == 3 and postgres.PgStore.stats_retries == before + 1
    with s1.read() as t:
        assert sorted(v for _, v in t.scan(kv.TAGS)) == [b"saw 0", b"saw saw 0"]


def test_a_deadlock_is_retried_transparently(two):
    """Opposite lock order: the server's deadlock detector (40P01, after deadlock_timeout) aborts one; it reruns."""
    s1, s2 = two
    barrier = threading.Barrier(2, timeout=10)
    calls = []

    def crossed(store, first, second):
        def fn(t):
            calls.append(first)
            t.insert(kv.STAGING, first, b"1")  # (an insert is sent at once; a put waits for the next statement)
            if len(calls) <= 2:
                barrier.wait()
            t.insert(kv.STAGING, second, b"2")
            return True
        return lambda: store.write(fn)

    before = postgres.PgStore.stats_retries
    assert _race([crossed(s1, b"a", b"b"), crossed(s2, b"b", b"a")]) == [True, True]
    assert len(calls) == 3 and postgres.PgStore.stats_retries == before + 1


def test_scans_are_paged(url, monkeypatch):
    monkeypatch.setattr(postgres, "SCAN_PAGE", 3)
    b = postgres.PgBackend(url)
    try:
        s = b.open("r")
        keys = [b"k%02d" % i for i in range(10)]
        s.write(lambda t: t.put_many(kv.STAGING, [(k, k) for k in keys]))
        with s.read() as t:
            assert list(t.scan(kv.STAGING)) == [(k, k) for k in keys]
            assert [k for k, _ in t.scan(kv.STAGING, b"k02", b"k09", values=False)] == keys[2:9]
            assert [k for k, _ in t.scan(kv.STAGING, b"k05", b"k08")] == keys[5:8]
    finally:
        b.shutdown()


def test_a_newer_schema_is_refused(url):
    import psycopg

    postgres.PgBackend(url).shutdown()  # creates the tables at this code's version
    params, _ = postgres.parse_url(url)
    with psycopg.connect(**params, autocommit=True) as c:
        c.execute(f"UPDATE {postgres.SCHEMA_TABLE} SET version = %s", (postgres.SCHEMA_VERSION + 1,))
    with pytest.raises(CorruptedData, match=r"schema version 2, newer than this lakefuse knows \(version 1\)"):
        postgres.PgBackend(url)


def test_a_wrong_password_is_one_line_without_the_password(postgres_cluster, tmp_path):
    bad = postgres_cluster.url_with_password("Wr0ng-Secret")
    with pytest.raises(InvalidArgument) as e:  # a refused login is no outage: retrying cannot help
        kv.open_backend(KVConfig(url=bad), tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "Wr0ng-Secret" not in msg
    assert "password authentication failed" in msg and f"{pg_testutil.PW_ROLE}@" in msg
    good = kv.open_backend(KVConfig(url=postgres_cluster.url_with_password(pg_testutil.PW_SECRET)), tmp_path)
    assert "s3cret" not in good.url and good.exists("nothing-here") is False


def test_the_password_may_come_from_pgpassword(postgres_cluster, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", pg_testutil.PW_SECRET)
    url = postgres_cluster.url.replace("postgresql://postgres@", f"postgresql://{pg_testutil.PW_ROLE}@")
    b = postgres.PgBackend(url)
    b.shutdown()


def test_an_unreachable_server_and_a_bad_url(tmp_path):
    url = f"postgresql://someone:Hidden-Pw@/db?host={tmp_path}/nowhere"
    with pytest.raises(StoreUnavailable, match=r"PostgreSQL server someone@.*/nowhere.*/db") as e:
        kv.open_backend(KVConfig(url=url), tmp_path)
    assert "Hidden-Pw" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(InvalidArgument, match="bad PostgreSQL URL") as e:
        kv.open_backend(KVConfig(url="postgresql://u:Hidden-Pw@h/db?no_such_option=1"), tmp_path)
    assert "Hidden-Pw" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        kv.open_backend(KVConfig(url="mysql://u:Hidden-Pw@h/db"), tmp_path)
    assert "Hidden-Pw" not in str(e.value)


def test_the_server_stopped_mid_run_then_work_resumes():
    """Its own cluster: stopping the session's would disturb the other tests."""
    cluster = pg_testutil.PgCluster()
    try:
        url = cluster.url_with_password(pg_testutil.PW_SECRET)
        b = postgres.PgBackend(url, pool_timeout=2)
        s = b.open("r")
        s.write(lambda t: t.put(kv.BRANCHES, b"main", b"1"))
        with pytest.raises(StoreUnavailable) as e:
            with s.read() as t:
                assert t.get(kv.BRANCHES, b"main") == b"1"
                cluster.stop("fast")  # ends this very session
                t.get(kv.BRANCHES, b"main")
        assert "repository 'r'" in str(e.value) and pg_testutil.PW_SECRET not in str(e.value)
        for call in (lambda: s.write(lambda t: t.put(kv.BRANCHES, b"main", b"2")), lambda: b.names()):
            with pytest.raises(StoreUnavailable, match=f"{pg_testutil.PW_ROLE}@.*no connection( within 2s)?: .*"
                                                       "connection to server on socket .* failed") as e:
                call()
            assert pg_testutil.PW_SECRET not in str(e.value) and "\n" not in str(e.value)
        cluster.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                s.write(lambda t: t.put(kv.BRANCHES, b"dev", b"2"))
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "the pool never reconnected"
                time.sleep(0.2)
        with s.read() as t:
            assert dict(t.scan(kv.BRANCHES)) == {b"main": b"1", b"dev": b"2"}
        assert b.names() == ["r"]
        b.shutdown()
    finally:
        cluster.destroy()


def _resume(pids: list[int]) -> None:
    """SIGCONT to each of ``pids`` still there (one that was on its way out when it was stopped --
    a worker, a backend whose client left -- may be gone by now: seen once under load)."""
    import os
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _server_pids(cluster) -> list[int]:
    """The postmaster of ``cluster`` and every process it started (its backends, its workers)."""
    import os

    main = int((cluster.data / "postmaster.pid").read_text().split()[0])
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == main:
                        kids.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return [main, *kids]


def test_a_hung_server_fails_a_statement_within_the_bound_and_work_resumes_at_once(monkeypatch):
    """A server that keeps its connections but never answers (SIGSTOP: its kernel still takes
    the packets, so no TCP timeout fires) held every request without a bound. A statement now
    fails (StoreUnavailable) once unanswered for ``STATEMENT_TIMEOUT_S``, and is not sent again on
    another connection; once the server answers again, so does the backend -- at once, not
    after the pool's reconnect backoff (its delays double with no cap). Its own cluster."""
    import os
    import signal

    from graveler.kv import pg_wire

    monkeypatch.setattr(pg_wire, "STATEMENT_TIMEOUT_S", 1.0)
    cluster = pg_testutil.PgCluster()
    stopped: list[int] = []
    try:
        b = postgres.PgBackend(cluster.url, pool_timeout=2)
        s = b.open("r")
        s.write(lambda t: t.put(kv.BRANCHES, b"main", b"1"))
        stopped = _server_pids(cluster)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        def get_main():
            with s.read() as t:
                return t.get(kv.BRANCHES, b"main")

        for call in (get_main, lambda: s.write(lambda t: t.put(kv.BRANCHES, b"main", b"2"))):
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable) as e:
                call()
            took = time.monotonic() - t0
            # the bound, the watch's period, and at most one quick connect of 3 s to tell why
            assert took < 1.0 + 0.5 + 3.5, took
            assert "\n" not in str(e.value)
        # known not to answer: the next calls ask a probe first (pg_probe) and fail at once, not
        # each after the whole watch or a connect timeout (a mount request makes several)
        for call in (get_main, lambda: s.write(lambda t: t.put(kv.BRANCHES, b"main", b"3")), get_main):
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable, match="does not answer"):
                call()
            assert time.monotonic() - t0 < 1.0
        _resume(stopped)
        stopped = []
        t0 = time.monotonic()
        s.write(lambda t: t.put(kv.BRANCHES, b"dev", b"2"))  # no wait for the pool's backoff
        with s.read() as t:
            assert dict(t.scan(kv.BRANCHES)) == {b"main": b"1", b"dev": b"2"}
        assert time.monotonic() - t0 < 3.0
        b.shutdown()
    finally:
        _resume(stopped)
        cluster.destroy()


def test_durable_false_then_sync_and_grouped_writes(url):
    b = postgres.PgBackend(url)
    try:
        s = b.open("r")
        s.write(lambda t: t.put(kv.STAGING, b"a", b"1"), durable=False)
        assert b._unsynced == 1
        s.sync()
        assert b._unsynced == 0
        got = _race([lambda i=i: s.write_grouped(lambda t: t.insert(kv.STAGING, b"g%02d" % i, b"v"))
                     for i in range(16)])
        assert got == [True] * 16
        with s.read() as t:
            assert t.count(kv.STAGING) == 17
    finally:
        b.shutdown()


class _LazyWalWriter(pg_testutil.PgCluster):
    """A durable cluster whose WAL writer flushes the unsynced commits only every 10 s: what a
    sync does not flush itself is then still in the server's memory when it crashes."""

    def server_options(self) -> str:
        return super().server_options() + " -c wal_writer_delay=10000"


def test_sync_makes_unsynced_writes_survive_a_server_crash():
    """Found by a cluster operator's tour: files fsync'd through a mount on PostgreSQL were gone
    after ``kill -9`` of the server 40 ms later. The sync committed a transaction that wrote no
    WAL (``SELECT txid_current()``), and PostgreSQL commits such a transaction without waiting
    for the flush even under ``synchronous_commit=on``: the unsynced writes before it stayed in
    memory. A sync writes a WAL record now, so its commit waits for the flush."""
    cluster = _LazyWalWriter(durable=True)
    try:
        b = postgres.PgBackend(cluster.url)
        s = b.open("r")
        for i in range(5):
            s.write(lambda t, i=i: t.put(kv.STAGING, b"k%d" % i, b"v"), durable=False)
        s.sync()
        b.shutdown()
        cluster.stop("immediate")  # a crash: what is not flushed is lost
        cluster.start()
        b = postgres.PgBackend(cluster.url)
        with b.open("r").read() as t:
            assert t.count(kv.STAGING) == 5
        b.shutdown()
    finally:
        cluster.destroy()


def test_a_server_restart_between_calls_costs_no_failed_call():
    """Pooled connections die with the server; the next transaction finds that at its BEGIN and takes
    a fresh connection before the caller's code runs (the pool checks nothing at checkout)."""
    cluster = pg_testutil.PgCluster()
    try:
        b = postgres.PgBackend(cluster.url)
        s = b.open("r")
        got = _race([lambda i=i: s.write(lambda t: t.put(kv.BRANCHES, b"b%d" % i, b"1")) for i in range(4)])
        assert got == [None] * 4  # several connections in the pool now
        cluster.stop("fast")
        cluster.start()
        with s.read() as t:  # the first call after the restart
            assert t.get(kv.BRANCHES, b"b0") == b"1"
        s.write(lambda t: t.put(kv.BRANCHES, b"b9", b"2"))
        with s.read() as t:
            assert len(list(t.scan(kv.BRANCHES))) == 5
        b.shutdown()
    finally:
        cluster.destroy()


def test_buffered_upserts_keep_their_order_with_other_statements(url):
    """put / put_many are sent together before the next read, delete, CAS or commit: each of those
    sees them, and a later put of a key deleted in between wins; a key read again in the same
    transaction (answered without the server) shows the transaction's own changes."""
    b = postgres.PgBackend(url)
    try:
        s = b.open("r")

        def fn(t):
            t.put(kv.TAGS, b"a", b"1")
            t.put_many(kv.STAGING, [(b"x", b"1"), (b"x", b"2"), (b"y", b"1")])
            assert t.get(kv.STAGING, b"x") == b"2"
            assert t.delete(kv.TAGS, b"a")
            t.put(kv.TAGS, b"a", b"3")
            assert t.set_if(kv.TAGS, b"a", b"4", b"3") and t.get(kv.TAGS, b"a") == b"4"
            assert not t.insert(kv.TAGS, b"a", b"5") and t.get(kv.TAGS, b"a") == b"4"
            assert not t.set_if(kv.TAGS, b"a", b"6", b"3") and t.get(kv.TAGS, b"a") == b"4"
            t.put(kv.STAGING, b"y", b"2")
            assert t.delete_range(kv.STAGING, b"z", None) == 0 and t.get(kv.STAGING, b"y") == b"2"
            t.put(kv.STAGING, b"z", b"1")
            assert t.delete_range(kv.STAGING, b"z", None) == 1 and t.get(kv.STAGING, b"z") is None
            return t.count(kv.STAGING)

        assert s.write(fn) == 2
        with s.read() as t:
            assert dict(t.scan(kv.TAGS)) == {b"a": b"4"} and dict(t.scan(kv.STAGING)) == {b"x": b"2", b"y": b"2"}
    finally:
        b.shutdown()
