"""Mounts on many hosts sharing one PostgreSQL KV, simulated on this machine.

Each "host" is a ``lakefuse mount -f`` daemon with its own ``$LAKEFUSE_HOME`` (its own spool
and caches), all of them on one PostgreSQL (``$LAKEFUSE_KV``, a schema of the test's own) and
one moto S3 bucket as the storage namespace: what one host writes and commits, another sees.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from graveler import Graveler, GravelerConfig
from graveler.config import KVConfig
from tests.mount_testutil import MountProc, needs_fuse

pytestmark = [needs_fuse, pytest.mark.s3]

REPO = "xrepo"
VISIBLE_S = 1.0  # a change made on one host is seen on every other within this


def wait_for(cond, timeout: float = 10.0, step: float = 0.01) -> float:
    """Poll ``cond()`` until it is true; the seconds it took (AssertionError after ``timeout``)."""
    t0 = time.monotonic()
    last = None
    while True:
        try:
            if cond():
                return time.monotonic() - t0
        except OSError as e:  # a name not there yet, an attribute about to change
            last = e
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not seen within {timeout} s (last error: {last})")
        time.sleep(step)


class World:
    """One PostgreSQL schema, one bucket, a repository on them, and the hosts' daemons."""

    def __init__(self, tmp: Path, kv_url: str, s3_endpoint: str, s3_config, bucket: str):
        self.tmp = tmp
        self.kv_url = kv_url
        self.s3_config = s3_config
        self.env = {"LAKEFUSE_KV": kv_url, "LAKEFUSE_S3_ENDPOINT": s3_endpoint}
        self.g = self.graveler(tmp / "admin")
        self.repo = self.g.create_repository(REPO, f"s3://{bucket}/ns")
        self.repo.upload("main", "seen.txt", b"old content\n")
        self.repo.commit("main", "base")
        self.mounts: list[MountProc] = []

    def graveler(self, home: Path) -> Graveler:
        return Graveler(GravelerConfig(home=home, kv=KVConfig(url=self.kv_url), store=self.s3_config))

    def host(self, name: str, *extra: str) -> tuple[MountProc, Path]:
        mp = self.tmp / f"mnt-{name}"
        m = MountProc(self.tmp / f"home-{name}", REPO, mp, *extra, log_dir=self.tmp / f"log-{name}", env=self.env)
        (self.tmp / f"log-{name}").mkdir(exist_ok=True)
        self.mounts.append(m.start())
        return m, mp

    def close(self) -> None:
        for m in self.mounts:
            m.stop()
        self.g.close()
        for m in self.mounts:
            assert "Traceback" not in m.log(), m.log()


@pytest.fixture
def world(tmp_path, postgres_url, s3_endpoint, s3_config, s3_bucket):
    from tests.pg_testutil import schema_url

    w = World(tmp_path, schema_url(postgres_url, str(tmp_path)), s3_endpoint, s3_config, s3_bucket)
    try:
        yield w
    finally:
        w.close()


def commit_by_control(mp: Path, branch: str, message: str) -> dict:
    r = subprocess.run(["bash", "-c", f"echo '{message}' > {mp}/{branch}/.lakefuse/commit"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads((mp / branch / ".lakefuse" / "commit").read_text())
    assert out["ok"], out
    return out["commit"]


class Watcher:
    """A reader on host B that looks at ``probe()`` in a loop (keeping the kernel's caches of it
    warm), noting when it first returns ``want``."""

    def __init__(self, probe, want):
        self.probe, self.want = probe, want
        self.seen_at: float | None = None
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop and self.seen_at is None:
            try:
                if self.probe() == self.want:
                    self.seen_at = time.monotonic()
            except OSError:
                pass
            time.sleep(0.002)

    def latency(self, since: float, timeout: float = 10.0) -> float:
        self.thread.join(timeout)
        self.stop = True
        assert self.seen_at is not None, f"not seen within {timeout} s"
        return max(0.0, self.seen_at - since)


def test_writes_and_commit_on_one_host_are_seen_on_another_within_1s(world):
    """(a) A file written and closed on host A, and a commit by control file on A, are seen on host
    B within 1 s: its listing, attributes and content, ``.lakefuse/head`` -- also for names B keeps
    looking up and a file B keeps reading (the kernel's cached names, attributes and pages)."""
    _, a = world.host("a")
    _, b = world.host("b")
    old = b"old content\n"
    new = b"new content, longer than the old\n"
    assert sorted(os.listdir(b / "main")) == ["seen.txt"]
    assert (b / "main" / "seen.txt").read_bytes() == old
    old_head = (b / "main" / ".lakefuse" / "head").read_text().strip()
    lat = {}
    # B keeps reading, stat-ing, looking up and listing while A writes
    w_content = Watcher(lambda: (b / "main" / "seen.txt").read_bytes(), new)
    w_size = Watcher(lambda: os.stat(b / "main" / "seen.txt").st_size, len(new))
    w_lookup = Watcher(lambda: os.path.exists(b / "main" / "new.txt"), True)
    w_list = Watcher(lambda: "new.txt" in os.listdir(b / "main"), True)
    time.sleep(0.3)
    with open(a / "main" / "seen.txt", "wb") as f:
        f.write(new)
    t_seen = time.monotonic()  # the close returned
    w_new = Watcher(lambda: (b / "main" / "new.txt").read_bytes(), b"written on A\n")
    with open(a / "main" / "new.txt", "wb") as f:  # a create is seen at its close at the latest, with its content
        t_created = time.monotonic()
        f.write(b"written on A\n")
    t_new = time.monotonic()
    lat["content"] = w_content.latency(t_seen)
    lat["size"] = w_size.latency(t_seen)
    lat["lookup"] = w_lookup.latency(t_created)
    lat["listing"] = w_list.latency(t_created)
    lat["new content"] = w_new.latency(t_new)
    # a commit by control file on A
    w_head = Watcher(lambda: (b / "main" / ".lakefuse" / "head").read_text().strip(), "?")
    time.sleep(0.2)
    c = commit_by_control(a, "main", "from host A")
    t0 = time.monotonic()
    w_head.want = c["id"]
    lat["head"] = w_head.latency(t0)
    assert c["id"] != old_head
    assert (b / "main" / ".lakefuse" / "status").read_text() == ""
    assert (b / c["id"] / "new.txt").read_bytes() == b"written on A\n"  # the commit by its ID
    # a delete on A: the name B keeps looking up goes away on B
    w_gone = Watcher(lambda: os.path.exists(b / "main" / "new.txt"), False)
    time.sleep(0.2)
    os.unlink(a / "main" / "new.txt")
    lat["unlink"] = w_gone.latency(time.monotonic())
    print("cross-host latency (s):", {k: round(v, 3) for k, v in lat.items()})
    for what, s in lat.items():
        assert s < VISIBLE_S, (what, lat)


_COMMIT_LOOP = r"""
import errno, json, os, sys, time
mp, host, rounds, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(log, "a") as out:
    for i in range(rounds):
        for j in range(3):
            name = f"{host}-{i:03d}-{j}.txt"
            with open(os.path.join(mp, "main", name), "wb") as f:
                f.write(f"{name} from {host}\n".encode())
            out.write(f"ok {name}\n"); out.flush()
        try:
            with open(os.path.join(mp, "main", ".lakefuse", "commit"), "w") as f:
                f.write(f"{host} round {i}\n")
            out.write(f"commit {i}\n")
        except OSError as e:  # the other host's commit took our files: nothing left to commit
            out.write(f"commitfail {i} {errno.errorcode.get(e.errno)}\n")
        out.flush()
"""


def test_two_hosts_committing_one_branch_lose_nothing(world):
    """(b) Two hosts write their own files and commit the same branch in a loop: every file whose
    close returned is in the final tree with its content; every commit is whole (each later
    commit holds everything an earlier one did; the graph is one first-parent line)."""
    _, a = world.host("a")
    _, b = world.host("b")
    rounds = 8
    procs = [subprocess.Popen([sys.executable, "-c", _COMMIT_LOOP, str(mp), host, str(rounds),
                               str(world.tmp / f"{host}.log")]) for host, mp in (("A", a), ("B", b))]
    for p in procs:
        assert p.wait(240) == 0
    acked, commits, fails = [], 0, []
    for host in ("A", "B"):
        for line in (world.tmp / f"{host}.log").read_text().splitlines():
            kind, rest = line.split(" ", 1)
            if kind == "ok":
                acked.append(rest)
            elif kind == "commit":
                commits += 1
            else:
                fails.append(rest)
    assert len(acked) == 2 * rounds * 3 and commits >= rounds, (commits, fails)
    assert all(f.endswith(("EBUSY", "EAGAIN")) for f in fails), fails
    commit_by_control(a, "main", "the last one") if (a / "main" / ".lakefuse" / "status").read_text() else None
    r = world.repo
    final = {it.path.decode() for it in r.list("main", "", delimiter="")}
    for name in acked:
        assert name in final, name
        assert r.read("main", name) == f"{name} from {name[0]}\n".encode()
    assert not r.has_uncommitted("main")
    # the commit graph: one first-parent line, each commit holding all of its parent's files
    log = list(r.log("main"))
    assert len(log) >= commits + 1
    prev: set[str] | None = None
    for c in reversed(log):
        assert len(c.parents) <= 1, c
        files = {it.path.decode() for it in r.list(c.id, "", delimiter="")}
        if prev is not None:
            assert prev <= files, (c.id, prev - files)
        prev = files
    assert prev == final


_WRITER = r"""
import hashlib, os, sys
mp, log = sys.argv[1], sys.argv[2]
with open(log, "a", buffering=1) as out:
    for i in range(100000):
        name = f"w{i:05d}.bin"
        data = os.urandom(1000 + i * 37 % 50000)
        out.write(f"try {name} {hashlib.md5(data).hexdigest()}\n")
        try:
            with open(os.path.join(mp, "main", name), "wb") as f:
                f.write(data)
        except OSError:
            break
        out.write(f"ok {name} {hashlib.md5(data).hexdigest()}\n")
"""


def test_kill_9_of_a_host_mid_write_loses_nothing_acknowledged(world):
    """(c) kill -9 of host A's daemon while a program writes through it: every file whose close
    had returned is there, with its content, on host B and on a fresh daemon of A's home."""
    ma, a = world.host("a")
    _, b = world.host("b")
    log = world.tmp / "acks.log"
    w = subprocess.Popen([sys.executable, "-c", _WRITER, str(a), str(log)])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (not log.exists() or log.read_text().count("ok ") < 15):
        time.sleep(0.05)
    ma.proc.send_signal(signal.SIGKILL)
    ma.proc.wait()
    w.wait(60)
    ma.stop()
    acked = {}
    for line in log.read_text().splitlines():
        kind, name, md5 = line.split()
        if kind == "ok":
            acked[name] = md5
    assert len(acked) >= 15
    import hashlib

    def check(mp: Path) -> None:
        for name, md5 in acked.items():
            assert hashlib.md5((mp / "main" / name).read_bytes()).hexdigest() == md5, name

    check(b)
    _, a2 = world.host("a")  # a fresh daemon of A's home (it recovers A's spool)
    check(a2)


@pytest.fixture
def own_pg():
    """A PostgreSQL cluster of this test's own (it is stopped and started again mid-test)."""
    from tests import pg_testutil

    reason = pg_testutil.unavailable_reason()
    if reason:
        pytest.skip(reason)
    c = pg_testutil.PgCluster()
    try:
        yield c
    finally:
        from graveler.kv.postgres import close_pg_backends

        close_pg_backends()
        c.destroy()


@pytest.mark.slow
@pytest.mark.expect_log("the KV is down on purpose: graveler reports it while the test runs")
def test_postgres_restart_mid_run(tmp_path, own_pg, s3_endpoint, s3_config, s3_bucket):
    """(d) PostgreSQL stopped mid-run: requests that need it fail with EIO, the daemons stay up, a
    close that could not be staged reports the error (its content stays in the mount and is
    retried); once it is back, reads, writes and commits work again, nothing acknowledged is
    lost, and the failed close's content is saved and committed. A commit cut by the restart is
    whole or absent."""
    w = World(tmp_path, own_pg.url, s3_endpoint, s3_config, s3_bucket)
    try:
        ma, a = w.host("a")
        mb, b = w.host("b")
        (a / "main" / "before.txt").write_bytes(b"acknowledged before the outage\n")
        wait_for(lambda: (b / "main" / "before.txt").read_bytes() == b"acknowledged before the outage\n")
        f = open(a / "main" / "during.txt", "wb")  # created (staged empty) before the outage
        f.write(b"written during the outage\n")
        time.sleep(1.2)  # the kernel's cached names and attributes of B expire
        own_pg.stop("fast")
        t0 = time.monotonic()
        codes = {}
        for what, fn in [
            ("stat", lambda: os.stat(b / "main" / "before.txt")),
            ("create", lambda: (a / "main" / "new.txt").write_bytes(b"x")),
            ("close", f.close),
            ("commit", lambda: (a / "main" / ".lakefuse" / "commit").write_text("during\n")),
        ]:
            with pytest.raises(OSError) as ei:
                fn()
            codes[what] = errno.errorcode.get(ei.value.errno)
        outage = time.monotonic() - t0
        assert set(codes.values()) <= {"EIO", "EAGAIN"}, codes
        assert ma.proc.poll() is None and mb.proc.poll() is None
        own_pg.start()
        # back: reads, writes, commits; what was acknowledged is there, and the failed close is not
        wait_for(lambda: (b / "main" / "before.txt").read_bytes() == b"acknowledged before the outage\n", 30)
        (a / "main" / "after.txt").write_bytes(b"after\n")
        c = commit_by_control(a, "main", "after the outage")
        wait_for(lambda: (b / "main" / ".lakefuse" / "head").read_text().strip() == c["id"])
        assert (b / c["id"] / "before.txt").read_bytes() == b"acknowledged before the outage\n"
        assert (b / c["id"] / "after.txt").read_bytes() == b"after\n"
        # the close that failed was retried once the server was back (by A's background retry,
        # or by the commit, which retries first): the commit holds what was written, not the
        # file as created (empty), and A's spool let go of it (its name goes in the spool pool's
        # thread, within about a second: lakefuse.mount.spoolpool)
        assert (b / c["id"] / "during.txt").read_bytes() == b"written during the outage\n"

        def spooled() -> list:
            out = []
            for p in (w.tmp / "home-a").rglob("*.data"):
                try:
                    if p.read_bytes() == b"written during the outage\n":
                        out.append(p)
                except FileNotFoundError:
                    pass  # (removed while we looked)
            return out
        wait_for(lambda: not spooled(), 10)
        # a commit cut by a restart: stage many paths, stop the server while a commit of them runs
        r = w.repo
        for i in range(3000):
            r.stage("main", f"many/{i:05d}", r.get("main", "after.txt"))
        head0 = r.get_commit("main").id
        t = threading.Thread(target=lambda: subprocess.run(
            ["bash", "-c", f"echo big > {a}/main/.lakefuse/commit"], capture_output=True))
        t.start()
        time.sleep(0.15)
        own_pg.stop("immediate")
        t.join(60)
        own_pg.start()
        wait_for(lambda: r.get_commit("main") is not None, 30, 0.2)
        head1 = r.get_commit("main")
        many = sum(1 for _ in r.list("main", "many/", delimiter=""))
        if head1.id == head0:  # absent: every path still staged
            assert r.has_uncommitted("main") and many == 3000
        else:  # whole: the commit holds every path
            assert sum(1 for _ in r.list(head1.id, "many/", delimiter="")) == 3000
        print(f"outage: {codes} in {outage:.1f}s; interrupted commit {'absent' if head1.id == head0 else 'whole'}")
        assert ma.proc.poll() is None and mb.proc.poll() is None
    finally:
        w.close()


def _host_cut_off(base_url: str, role: str, off: bool) -> None:
    """Host A's database role refused (and its sessions ended) or allowed again: a KV outage seen
    by host A alone, as a network partition would make it."""
    import psycopg

    with psycopg.connect(base_url, autocommit=True) as c:
        c.execute(f"ALTER ROLE {role} {'NOLOGIN' if off else 'LOGIN'}")
        if off:
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))


@pytest.mark.expect_log("host A's KV is cut off on purpose: its failed saves are logged")
def test_last_close_wins_and_a_retried_save_never_stages_stale_bytes(tmp_path, postgres_cluster):
    """Two hosts' mount clients (each its own Graveler and spool; host A with a database role of its own).
    The last close wins; a save of A that failed while A's KV was unreachable, retried after host B
    saved the same path, does not put A's older bytes over B's (compare-and-set on the staged
    entry): it fails with a Conflict and A's content is kept in its spool's recovered/. A retry
    that nobody overtook goes through."""
    from graveler.errors import Conflict, StoreUnavailable
    from graveler.objects import PosixAttrs
    from lakefuse.mount.spool import Spool, SpoolConfig
    from tests.pg_testutil import PW_ROLE, PW_SECRET, schema_url

    key = str(tmp_path)
    url_b = schema_url(postgres_cluster.url, key)
    url_a = schema_url(postgres_cluster.url_with_password(PW_SECRET), key)
    gb = Graveler(GravelerConfig(home=tmp_path / "hb", kv=KVConfig(url=url_b)))
    rb = gb.create_repository("cas", f"file://{tmp_path}/ns")
    for name in ("lcw.txt", "race.txt", "alone.txt"):
        rb.upload("main", name, b"v0")
    rb.commit("main", "base")
    ga = Graveler(GravelerConfig(home=tmp_path / "ha", kv=KVConfig(url=url_a)))
    ra = ga.repository("cas")
    spool = Spool(ra, SpoolConfig(tmp_path / "cache-a", "cas"))
    attrs = PosixAttrs(mode=0o100644, uid=0, gid=0)

    def open_a(ino: int, name: str):
        return spool.open(ino, "main", name.encode(), ra.get("main", name), attrs)

    try:
        # last close wins: A opened the file before B saved it, A closes after B
        sf = open_a(1, "lcw.txt")
        sf.write(0, b"A, closed last")
        rb.upload("main", "lcw.txt", b"B, closed first")
        sf.flush()
        assert rb.read("main", "lcw.txt") == b"A, closed last"
        spool.release(1)
        # a save of A fails (A cut off), B saves the path meanwhile, A retries: B's bytes stay
        sf = open_a(2, "race.txt")
        sf.write(0, b"A, stale after its failed save")
        sf2 = open_a(3, "alone.txt")
        sf2.write(0, b"A, saved on retry")
        _host_cut_off(postgres_cluster.url, PW_ROLE, True)
        try:
            with pytest.raises(StoreUnavailable):
                sf.flush()
            rb.upload("main", "race.txt", b"B, saved while A was cut off")
            with pytest.raises(StoreUnavailable):
                sf2.flush()
        finally:
            _host_cut_off(postgres_cluster.url, PW_ROLE, False)
        with pytest.raises(Conflict, match="another writer saved a newer version"):
            sf.flush()
        assert rb.read("main", "race.txt") == b"B, saved while A was cut off"
        assert sf.dirty and sf.read(0, 100) == b"A, stale after its failed save"  # kept, not lost
        spool.release(2)  # the last close tries again, fails again: it can never succeed, so it is given up
        (kept,) = (tmp_path / "cache-a" / "spool" / "cas" / "recovered").rglob("race.txt")
        assert kept.read_bytes() == b"A, stale after its failed save"  # kept for the user, not lost
        assert rb.read("main", "race.txt") == b"B, saved while A was cut off"
        # nobody overtook this one: the retry goes through
        assert sf2.flush() is not None
        assert rb.read("main", "alone.txt") == b"A, saved on retry"
        spool.release(3)
    finally:
        spool.close()
        ga.close()
        gb.close()


@pytest.mark.slow
@pytest.mark.expect_log("the KV is stopped on purpose before the unmount")
def test_umount_says_what_failed_as_the_daemon_stopped(tmp_path, own_pg):
    """Found by an SRE's tour: with PostgreSQL down, `lakefuse umount` exited 0 and said nothing
    while the daemon's log said it could not sync the store and the KV as it stopped. The
    command now says what the daemon logged then, and fails (exit 1); a clean unmount is
    silent and exit 0, as before."""
    from tests.mount_testutil import force_unmount, is_mounted, lakefuse_cmd

    home = tmp_path / "home"
    env = {**os.environ, "LAKEFUSE_KV": own_pg.url, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(lakefuse_cmd(home, *args), capture_output=True, text=True, env=env, timeout=120)

    assert run("repo", "create", "lakefs://umrep", "--storage", f"file://{tmp_path}/ns",
               "--allow-local-storage").returncode == 0
    for stop_kv in (False, True):
        mp = tmp_path / f"mnt{int(stop_kv)}"
        mp.mkdir()
        r = run("mount", "lakefs://umrep", str(mp))
        assert r.returncode == 0, r.stderr
        try:
            (mp / "main" / "f").write_bytes(b"saved at close\n")
            if stop_kv:
                own_pg.stop("immediate")
            r = run("umount", str(mp))
            if stop_kv:
                assert r.returncode == 1, (r.stdout, r.stderr)
                assert "said as it stopped" in r.stderr and "could not sync" in r.stderr, r.stderr
                assert len(r.stderr.strip().splitlines()) == 1, r.stderr
            else:
                assert (r.returncode, r.stderr) == (0, ""), r.stderr
            assert not is_mounted(mp)
            assert not list((home / "logs").glob("unmount-*.txt"))
        finally:
            if is_mounted(mp):
                force_unmount(mp)
    own_pg.start()


def test_a_repository_made_again_under_its_name_elsewhere_is_not_written_through_an_old_mount(world, s3_bucket):
    """Found by a PostgreSQL tour: host B deleted the repository and made one of its name in another
    namespace while host A had it mounted. A's writes then went into the new repository's staging
    with their objects in the old namespace (the first branch of a repository had no birth to tell
    them apart), and a commit on A recorded in the new repository a tree stored in the old one. Now
    A's mount refuses them, saying why; the new repository is as B made it."""
    m, a = world.host("a")
    assert (a / "main" / "seen.txt").read_bytes() == b"old content\n"
    f = open(a / "main" / "open.txt", "wb")  # open on A across the delete
    world.g.delete_repository(REPO)
    new = world.g.create_repository(REPO, f"s3://{s3_bucket}/other")
    new.upload("main", "fresh.txt", b"fresh\n")
    head = new.commit("main", "fresh").id
    f.write(b"written on A after the repository was made again\n")
    f.close()  # (as a file of a deleted branch: detached, its bytes kept in the spool's recovered/)
    try:  # (ENOENT once the mount has met the new repository, as in a deleted branch's directory; else
        # the create goes on as in a branch deleted behind it, and its close keeps the bytes aside)
        (a / "main" / "late.txt").write_bytes(b"written on A after the repository was made again\n")
    except FileNotFoundError:
        pass
    r = subprocess.run(["bash", "-c", f"echo stale > {a}/main/.lakefuse/commit"], capture_output=True, text=True)
    assert r.returncode != 0, r.stderr
    again = world.graveler(world.tmp / "check").repository(REPO)
    assert again.get_branch("main").commit_id == head
    assert [it.path for it in again.list("main", delimiter="")] == [b"fresh.txt"]
    assert again.read("main", "fresh.txt") == b"fresh\n" and not again.has_uncommitted("main")
    assert "open.txt: repository 'xrepo' was deleted and one of its name made again (at " in m.log(), m.log()
