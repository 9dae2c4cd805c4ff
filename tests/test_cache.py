"""ImmutableCache: hits and misses, the byte bound, verification and refetch, sharing between processes."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from graveler.cache import ImmutableCache
from graveler.errors import CorruptedData, NotFound
from graveler.objstore import LocalStore, ObjectInfo, ObjectStore

KiB = 1 << 10
MiB = 1 << 20


def sha_key(data: bytes) -> str:
    """Content-addressed key, as range and metarange files are named."""
    return "_lakefs/" + hashlib.sha256(data).hexdigest()


def verify_sha(key: str, data: bytes) -> None:
    if hashlib.sha256(data).hexdigest() != key.rsplit("/", 1)[-1]:
        raise CorruptedData("content does not match its hash", name=key)


class WrappedStore(ObjectStore):
    """Delegates to a real store; can damage the next N downloads, slow them, or count them."""

    def __init__(self, inner: ObjectStore, corrupt_next: int = 0, delay: float = 0.0):
        self.inner = inner
        self.uri = inner.uri
        self.corrupt_next = corrupt_next
        self.delay = delay
        self.gets = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes:
        with self._lock:
            self.gets += 1
            corrupt = self.corrupt_next > 0
            self.corrupt_next -= corrupt
        if self.delay:
            time.sleep(self.delay)
        data = self.inner.get(key)
        if corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    def get_range(self, key, start, length):
        return self.inner.get_range(key, start, length)

    def put(self, key, data) -> ObjectInfo:
        return self.inner.put(key, data)

    def put_file(self, key, path, md5=None) -> ObjectInfo:
        return self.inner.put_file(key, path, md5)

    def get_to_file(self, key, path) -> ObjectInfo:
        return self.inner.get_to_file(key, path)

    def head(self, key) -> ObjectInfo:
        return self.inner.head(key)

    def delete(self, key) -> None:
        self.inner.delete(key)

    def list(self, prefix="", start_after=""):
        return self.inner.list(prefix, start_after)

    def full_uri(self, key) -> str:
        return self.inner.full_uri(key)


@pytest.fixture
def local(tmp_path) -> LocalStore:
    return LocalStore(str(tmp_path / "store"))


def test_miss_then_hit(local, tmp_path):
    data = os.urandom(100 * KiB)
    key = sha_key(data)
    local.put(key, data)
    store = WrappedStore(local)
    with ImmutableCache(store, str(tmp_path / "cache"), verify=verify_sha) as cache:
        assert not cache.contains(key)
        assert cache.get(key) == data
        assert cache.contains(key)
        assert cache.get(key) == data
        assert cache.get(key) == data
        assert cache.stats.snapshot() == {"hits": 2, "misses": 1, "fetches": 1, "verify_failures": 0}
        assert store.gets == 1
        cache.evict(key)
        assert not cache.contains(key)
        cache.evict(key)  # idempotent
        assert cache.get(key) == data
        assert store.gets == 2


def test_put_is_write_through(local, tmp_path):
    data = b"a range file" * 1000
    key = sha_key(data)
    store = WrappedStore(local)
    with ImmutableCache(store, str(tmp_path / "cache")) as cache:
        cache.put(key, data)
        assert local.head(key).size == len(data)
        assert local.get(key) == data  # in the store
        assert cache.contains(key)
        assert cache.get(key) == data
        assert store.gets == 0
        assert cache.stats.hits == 1 and cache.stats.misses == 0


def test_not_found_is_not_cached(local, tmp_path):
    with ImmutableCache(local, str(tmp_path / "cache")) as cache:
        with pytest.raises(NotFound):
            cache.get("_lakefs/missing")
        assert not cache.contains("_lakefs/missing")
        assert cache.stats.fetches == 1


def test_cache_entries_are_per_store(tmp_path):
    """Two stores sharing one cache directory do not see each other's objects."""
    a, b = LocalStore(str(tmp_path / "a")), LocalStore(str(tmp_path / "b"))
    a.put("same/key", b"from a")
    b.put("same/key", b"from b")
    with ImmutableCache(a, str(tmp_path / "cache")) as ca, ImmutableCache(b, str(tmp_path / "cache")) as cb:
        assert ca.get("same/key") == b"from a"
        assert cb.get("same/key") == b"from b"


def test_byte_bound_and_lru(local, tmp_path):
    max_bytes = 4 * MiB
    item = 256 * KiB
    blobs = [os.urandom(item) for _ in range(40)]  # 10 MiB in all
    keys = [sha_key(b) for b in blobs]
    with ImmutableCache(local, str(tmp_path / "cache"), max_bytes=max_bytes) as cache:
        cache.put(keys[0], blobs[0])
        for i in range(1, 40):
            cache.put(keys[i], blobs[i])
            assert cache.get(keys[0]) == blobs[0]  # keep key 0 recently used
            # diskcache culls after each write: the bound holds within one item
            # (plus the SQLite index, which it counts too).
            assert cache.volume() <= max_bytes + item + 256 * KiB
        cached = [cache.contains(k) for k in keys]
        assert cached[0], "the recently used entry survived"
        assert not all(cached) and sum(cached) <= max_bytes // item
        assert cached[-1]
        for k, b in zip(keys, blobs):  # evicted entries come back from the store
            assert cache.get(k) == b


def test_object_larger_than_the_cache_is_returned_not_cached(local, tmp_path):
    data = os.urandom(2 * MiB)
    key = sha_key(data)
    local.put(key, data)
    with ImmutableCache(local, str(tmp_path / "cache"), max_bytes=1 * MiB) as cache:
        assert cache.get(key) == data
        assert not cache.contains(key)


def test_corrupt_download_is_fetched_again(local, tmp_path, caplog):
    data = os.urandom(64 * KiB)
    key = sha_key(data)
    local.put(key, data)
    store = WrappedStore(local, corrupt_next=1)
    with ImmutableCache(store, str(tmp_path / "cache"), verify=verify_sha) as cache:
        with caplog.at_level(logging.WARNING, logger="graveler.cache"):
            assert cache.get(key) == data
        assert "failed verification" in caplog.text
        assert store.gets == 2
        assert cache.stats.snapshot() == {"hits": 0, "misses": 1, "fetches": 2, "verify_failures": 1}
        assert cache.get(key) == data  # the good copy was cached
        assert store.gets == 2


def test_corrupt_twice_raises_and_caches_nothing(local, tmp_path, caplog):
    data = os.urandom(64 * KiB)
    key = sha_key(data)
    local.put(key, data)
    store = WrappedStore(local, corrupt_next=2)
    with ImmutableCache(store, str(tmp_path / "cache"), verify=verify_sha) as cache:
        with caplog.at_level(logging.WARNING, logger="graveler.cache"):
            with pytest.raises(CorruptedData) as err:
                cache.get(key)
        assert err.value.name == key
        assert store.gets == 2
        assert not cache.contains(key)
        assert cache.stats.verify_failures == 2
        assert cache.get(key) == data  # the store heals: the next read works
        assert store.gets == 3


def test_concurrent_misses_fetch_once(local, tmp_path):
    data = os.urandom(32 * KiB)
    key = sha_key(data)
    local.put(key, data)
    store = WrappedStore(local, delay=0.2)
    with ImmutableCache(store, str(tmp_path / "cache"), verify=verify_sha) as cache:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _: cache.get(key), range(8)))
        assert results == [data] * 8
        assert store.gets == 1
        assert cache.stats.fetches == 1


def test_concurrent_misses_share_the_error(local, tmp_path):
    store = WrappedStore(local, delay=0.2)
    with ImmutableCache(store, str(tmp_path / "cache")) as cache:
        def get():
            with pytest.raises(NotFound):
                cache.get("_lakefs/absent")

        with ThreadPoolExecutor(4) as pool:
            for f in [pool.submit(get) for _ in range(4)]:
                f.result()
        assert store.gets == 1


def test_threads_fill_and_read(local, tmp_path):
    blobs = [os.urandom(40 * KiB + i) for i in range(30)]
    for b in blobs:
        local.put(sha_key(b), b)
    with ImmutableCache(local, str(tmp_path / "cache"), verify=verify_sha) as cache:
        def work(i: int) -> None:
            for j in range(60):
                b = blobs[(i * 7 + j) % len(blobs)]
                assert cache.get(sha_key(b)) == b

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(work, range(8)))
        assert cache.stats.hits + cache.stats.misses == 8 * 60
        assert cache.stats.fetches <= len(blobs) * 2


# Each process fills the shared cache with its own objects (write-through) and reads
# a shared set through misses; then readers on a store that refuses every GET must
# find everything in the cache.
_PROCESS = r"""
import hashlib, sys
from graveler.cache import ImmutableCache
from graveler.errors import StoreUnavailable
from graveler.objstore import LocalStore

mode, root, cache_dir, name = sys.argv[1:5]

def key_of(data):
    return "_lakefs/" + hashlib.sha256(data).hexdigest()

def blob(tag, i):
    return (f"{tag}-{i}-".encode() * 4000)[: 30_000 + i]

own = [blob(name, i) for i in range(40)]
shared = [blob("shared", i) for i in range(40)]
store = LocalStore(root)
if mode == "fill":
    cache = ImmutableCache(store, cache_dir)
    for i in range(40):
        cache.put(key_of(own[i]), own[i])
        assert cache.get(key_of(shared[i])) == shared[i]
else:
    class Refusing(LocalStore):
        def get(self, key):
            raise StoreUnavailable("the store is not to be read in this phase")
    cache = ImmutableCache(Refusing(root), cache_dir)
    for tag in ("p", "q", "shared"):
        for i in range(40):
            b = blob(tag, i)
            assert cache.get(key_of(b)) == b
    assert cache.stats.hits == 120, cache.stats
cache.close()
"""


def test_two_processes_share_one_cache_directory(tmp_path):
    root, cache_dir = str(tmp_path / "store"), str(tmp_path / "cache")
    store = LocalStore(root)
    for i in range(40):
        b = (f"shared-{i}-".encode() * 4000)[: 30_000 + i]
        store.put(sha_key(b), b)

    def run_both(mode: str) -> None:
        procs = [subprocess.Popen([sys.executable, "-c", _PROCESS, mode, root, cache_dir, name],
                                  stderr=subprocess.PIPE) for name in ("p", "q")]
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err.decode()

    run_both("fill")
    run_both("read")


def test_a_full_cache_disk_with_nothing_to_evict_is_not_walked_per_chunk(tmp_path, monkeypatch):
    """The data cache's disk below its reserve and no whole file left to evict: each chunk asked
    again (a statvfs and a walk of the whole files per chunk of every read). Now the answer
    stands for FULL_RECHECK_S; once the disk has room again, chunks are kept again."""
    import graveler.objstore.datacache as dc

    cache = dc.DataCache(str(tmp_path / "dc"), 64 << 20)
    real = os.statvfs(tmp_path)
    free = {"blocks": 0}

    class Vfs:
        f_blocks, f_frsize = real.f_blocks, real.f_frsize

        @property
        def f_bavail(self):
            return free["blocks"]

    walks = []
    evict = cache._evict_whole
    monkeypatch.setattr(dc.os, "statvfs", lambda path: Vfs())
    monkeypatch.setattr(cache, "_evict_whole", lambda need=0: walks.append(need) or evict(need))
    assert not any(cache._room(1 << 20) for _ in range(200))
    assert len(walks) == 1  # (was: 200)
    free["blocks"] = real.f_blocks  # room again
    monkeypatch.setattr(dc, "FULL_RECHECK_S", 0.0)
    cache._full_until = time.monotonic()
    assert cache._room(1 << 20)
    cache.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="makes directories of another user (needs root)")
def test_a_cache_directory_another_user_can_write_is_refused(tmp_path):
    """Found by an administrator's tour: with --cache-dir under /tmp, another user who made its
    data/ (0777) first could plant a whole file and its check in the cache -- the mount then
    served his bytes as the repository's -- or a pickle that diskcache's index ran as the mounting
    user. The data cache and the table cache now take a directory only this user (or root) may
    write, under directories no one else may rewrite unless sticky (as /tmp); the spool had that
    check already. Healthy setups are taken: a new directory, an existing one an administrator
    made 0755, one under a sticky world-writable directory."""
    from graveler.errors import InvalidArgument
    from graveler.objstore import datacache as dc
    from graveler.objstore.base import private_dir

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # as /tmp
    theirs = shared / "theirs"
    theirs.mkdir()
    os.chown(theirs, 12345, 12345)
    open_to_all = shared / "open"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    loose = tmp_path / "loose"  # writable by others, no sticky bit: what is below it can be swapped
    loose.mkdir()
    os.chmod(loose, 0o777)
    for bad in (theirs, open_to_all, loose / "cache"):
        with pytest.raises(InvalidArgument, match="only this user may write"):
            dc.DataCache(str(bad), 64 << 20)
        with pytest.raises(InvalidArgument, match="only this user may write"):
            ImmutableCache(dc.DataCache.__new__(dc.DataCache), str(bad / "tables"))  # (refused before the store is used)
    admin = tmp_path / "admin"
    admin.mkdir(mode=0o755)
    for good in (shared / "mine" / "data", admin, tmp_path / "new" / "dir"):
        private_dir(str(good))
        dc.DataCache(str(good), 64 << 20).close()
    assert oct(os.stat(shared / "mine" / "data").st_mode & 0o777) == "0o700"
    # another user's symbolic link in the sticky directory (found by a security review): they may
    # point it elsewhere once the check passed. Refused, and nothing made where it points; the
    # same link made this user's is followed (what it names checked as any directory)
    roots = tmp_path / "roots"
    roots.mkdir(mode=0o755)
    (shared / "link").symlink_to(roots)
    os.lchown(shared / "link", 12345, 12345)
    with pytest.raises(InvalidArgument, match="symbolic link another user owns"):
        dc.DataCache(str(shared / "link" / "data"), 64 << 20)
    assert list(roots.iterdir()) == []
    os.lchown(shared / "link", 0, 0)
    dc.DataCache(str(shared / "link" / "data"), 64 << 20).close()
    (shared / "to-theirs").symlink_to(theirs)  # this user's link to a directory another user owns
    with pytest.raises(InvalidArgument, match="only this user may write"):
        private_dir(str(shared / "to-theirs"))


@pytest.mark.skipif(os.geteuid() != 0, reason="sets directories' groups (needs root)")
def test_a_group_writable_directory_of_its_owners_private_group_is_taken(tmp_path):
    """Found by a non-root user's tour: under umask 002 -- the default where each user has a group
    of their own -- ``repo create`` made a 0775 home that ``mount`` then refused ("another user ...
    may rewrite"), though no one else was in that group. A group-writable directory is taken when
    its group is its owner's own (their primary group, no one else's, no other member); a group
    another user may be in, or one writable by all, is refused as before."""
    import grp
    import pwd

    from graveler.errors import InvalidArgument
    from graveler.objstore.base import private_dir

    me = pwd.getpwuid(0)
    if grp.getgrgid(me.pw_gid).gr_mem or any(p.pw_gid == me.pw_gid and p.pw_uid != 0 for p in pwd.getpwall()):
        pytest.skip("root's group is not private on this machine")
    others = next((g.gr_gid for g in grp.getgrall() if g.gr_gid != me.pw_gid), None)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 0, me.pw_gid)
    os.chmod(home, 0o775)  # umask 002
    private_dir(str(home / "cache" / "spool"))  # taken: its owner's own group
    os.chmod(home / "cache", 0o775)
    private_dir(str(home / "cache"))
    if others is not None:
        os.chown(home, 0, others)  # a group another user may be in
        with pytest.raises(InvalidArgument, match="may rewrite"):
            private_dir(str(home / "cache" / "spool"))
        os.chown(home, 0, me.pw_gid)
    os.chmod(home, 0o777)
    with pytest.raises(InvalidArgument, match="may rewrite"):
        private_dir(str(home / "cache" / "spool"))


@pytest.mark.expect_log("a damaged cache index is said once, and the cache made again")
def test_a_damaged_table_cache_is_made_again_not_store_unavailable(local, tmp_path):
    """Found by an S3 user's tour: a damaged <home>/cache/cache.db made every command exit 6
    ("cannot open the cache directory: file is not a database"); the cache holds only copies."""
    data = b"range file bytes " * 3000
    key = sha_key(data)
    local.put(key, data)
    c = ImmutableCache(local, str(tmp_path / "tc"), verify=verify_sha)
    assert c.get(key) == data
    c.close()
    with open(tmp_path / "tc" / "cache.db", "r+b") as f:
        f.write(os.urandom(4096))
    c = ImmutableCache(local, str(tmp_path / "tc"), verify=verify_sha)
    assert c.get(key) == data and c.get(key) == data
    c.close()
