"""The mount's data cache on local disk: object chunks, and whole objects as one file each.

:class:`DataCache` keeps chunks (diskcache, bounded in bytes, multi-process safe, kept across
restarts). A chunk is keyed by the object's physical address, its etag and the chunk's index,
so every ref that points at the same object shares it, and a changed object (new etag) never
hits stale bytes. Each cached chunk carries its CRC32C: a damaged cache entry is dropped and
fetched again, never returned.

Objects up to :attr:`DataCache.whole_max` are also kept whole, one file each under
``whole/`` (:class:`WholeFill`): the file enters the cache only once its size and, for a
plain-MD5 etag, its MD5 are checked; it is not checked again on a hit (it is what a reader,
or the kernel through FUSE passthrough, reads directly). Half of the budget goes to whole
files, the least recently used going first.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import queue
import sqlite3
import threading
import time
import uuid

import diskcache
import google_crc32c

from graveler.errors import StoreUnavailable
from graveler.cache import CheckMemo, open_diskcache
from graveler.objstore.base import file_fingerprint, private_dir
from graveler.objstore.buffers import pool
from graveler.objects import is_md5_etag

log = logging.getLogger("graveler.objstore.chunked")  # one logger for the data path

MiB = 1 << 20
_CACHE_ERRORS = (OSError, sqlite3.Error, diskcache.Timeout)
# Objects up to this size (and a quarter of the whole-object budget) are kept whole in the data cache
# as one file each (see DataCache): filled by a read of the whole object, checked then, not per hit.
WHOLE_MAX = 1 << 30
_TMP = ".tmp-"
# what the data cache leaves free on its disk: this share of it (percent), at most RESERVE_MAX
RESERVE_SHARE = 10
WARN_EVERY_S = 60.0  # failed writes to the cache are said at most this often
FULL_RECHECK_S = 1.0  # a disk found full even after evicting: how long later writes are refused unlooked
RESERVE_MAX = 1 << 30
RECENT_S = 3600.0  # a whole file's use moves its mtime (its eviction order) at most this often
TMP_STALE_S = 600.0  # an unfinished whole file not written to for this long is a dead process's
_PAGE = 4096
_STAGE = 8 * MiB  # a whole object's file is written in pieces of this size
_DIRECT_MIN = 8 * MiB  # objects from this size on are written with O_DIRECT where the file system has it
# The MD5 check of a whole file (after the read that filled it; ~1.5 CPU-s per GiB) runs this much
# nicer than the daemon: it yields the CPU to the reads under way (the next file's stream, say).
VERIFY_NICE = 10


def _page_aligned(view: memoryview) -> bool:
    """Whether a buffer starts on a page boundary (what O_DIRECT needs of it)."""
    if view.readonly or not view.c_contiguous or not len(view):
        return False  # (a bytes object: not known, and seldom)
    import ctypes

    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view)) % _PAGE == 0
    except (TypeError, ValueError):
        return False


def _set_direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for ``fd``; False where the file system refuses it (tmpfs)."""
    import fcntl

    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
        return True
    except OSError:
        return False


class DataCache:
    """Object chunks on local disk, bounded in bytes (see the module docstring)."""

    def __init__(self, directory: str, max_bytes: int, whole_max: int | None = None):
        self.directory = directory
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.bytes_from_cache = 0
        self.corrupt = 0
        self._damaged: set[str] = set()  # keys found damaged (counted once)
        # whole objects: half the budget, objects up to whole_max (at most a quarter of that half)
        self.whole_budget = max_bytes // 2
        self.whole_max = min(WHOLE_MAX if whole_max is None else whole_max, self.whole_budget // 4)
        self.whole_dir = os.path.join(directory, "whole")
        self.whole_hits = 0
        self.whole_filled = 0
        self.whole_rejected = 0
        self._whole_bytes: int | None = None  # what the whole files take (scanned at the first fill)
        self._cond = threading.Condition(self._lock)
        self._fills = 0  # whole files being checked (WholeFill)
        self._write_failures, self._warned_t = 0, None  # (warn_write)
        self._index_lost = False  # (put: its index was removed while in use)
        self._full_until = 0.0  # (_room: the disk was full, nothing left to evict, until then)
        self.whole_unchecked = 0  # whole files found changed since their check, or never checked here: fetched again
        self._checked: CheckMemo | None = None
        try:
            private_dir(directory)  # (copies of the repository's data: its user's only, as the spool)
            if self.whole_max > 0:
                os.makedirs(self.whole_dir, exist_ok=True)
                self._drop_stale_tmp()
                # each whole file's fingerprint when it passed its check (device, inode, size, mtime,
                # ctime): one changed in place since (same size, other bytes) is not served
                self._checked = CheckMemo(os.path.join(directory, "checked"))
            # least-recently-stored: a hit costs no SQLite write
            self._cache = open_diskcache(directory, size_limit=max_bytes - (self.whole_budget if self.whole_max > 0
                                                                             else 0),
                                         eviction_policy="least-recently-stored")
        except _CACHE_ERRORS as exc:
            raise StoreUnavailable(f"cannot open the data cache {directory!r}: {exc}") from exc

    # -- whole objects: one file each, checked (size, MD5) when filled, then used as they are --

    def _drop_stale_tmp(self) -> None:
        """Remove whole files a process left unfinished: a fill or MD5 check cut short by its exit
        (an unmount right after a large read ends the daemon before its check does). A file
        written to in the last :data:`TMP_STALE_S` may be another process's fill under way: kept."""
        old = time.time() - TMP_STALE_S
        for d, _, fs in os.walk(self.whole_dir):
            for f in fs:
                if f.startswith(_TMP):
                    path = os.path.join(d, f)
                    try:
                        if os.stat(path).st_mtime < old:
                            os.unlink(path)
                    except OSError:
                        pass

    def whole_path(self, address: str, etag: str) -> str:
        name = hashlib.sha256(f"{etag}:{address}".encode()).hexdigest()
        return os.path.join(self.whole_dir, name[:2], name)

    def open_whole(self, address: str, etag: str, size: int) -> int:
        """A read-only descriptor of the object's whole file (-1 when there is none of ``size``
        bytes). The caller owns it (an eviction meanwhile unlinks the name, not the file)."""
        if self.whole_max <= 0 or size > self.whole_max:
            return -1
        path = self.whole_path(address, etag)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1
        try:
            st = os.fstat(fd)
            fp = file_fingerprint(st)
            if st.st_size != size or not self._checked.checked(path, fp):
                # changed since its check (or a size this cache never filled it with), or no record of
                # its check (a cache from before the record, or its record lost): fetched again
                os.close(fd)
                self._unlink(path)
                with self._lock:
                    self.whole_unchecked += 1
                log.info("data cache: %s is not as it was checked; fetching the object again", path)
                return -1
            if time.time() - st.st_mtime > RECENT_S:  # recently used: evicted last (the mtime, an hour's grain)
                os.utime(fd)
                self._checked.remember(path, file_fingerprint(os.fstat(fd)))
        except OSError:
            pass
        with self._lock:
            self.whole_hits += 1
            self.hits += 1
        return fd

    def whole_fill(self, address: str, etag: str, size: int, threaded: bool = True) -> "WholeFill | None":
        """A file to fill with the whole object in order (:class:`WholeFill`), or None when the
        object is too big for the whole-object form or its disk has no room for it."""
        if self.whole_max <= 0 or size > self.whole_max or not self._room(size):
            return None
        try:
            return WholeFill(self, self.whole_path(address, etag), size, etag, threaded)
        except OSError as exc:
            self.warn_write(exc)
            return None

    def whole_put(self, address: str, etag: str, data: bytes) -> None:
        """Keep ``data`` (already checked against size and MD5) as the object's whole file."""
        fill = self.whole_fill(address, etag, len(data), threaded=False)
        if fill is not None:
            fill.write(data)
            fill.commit(check=False)

    def _fill_started(self) -> None:
        with self._lock:
            self._fills += 1

    def _fill_done(self) -> None:
        with self._cond:
            self._fills -= 1
            self._cond.notify_all()

    def wait_fills(self, timeout: float = 60.0) -> bool:
        """Wait until the whole files being checked are kept or dropped; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._fills:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _whole_added(self, n: int) -> None:
        with self._lock:
            if self._whole_bytes is None:
                self._whole_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(self.whole_dir)
                                        for f in fs if not f.startswith(_TMP))
            else:
                self._whole_bytes += n
            self.whole_filled += 1
            over = self._whole_bytes > self.whole_budget
        if over:
            self._evict_whole()

    def _evict_whole(self, need: int = 0) -> int:
        """The least recently used whole files go until the rest fits the budget and at least
        ``need`` bytes went; the bytes that went."""
        files = []
        for d, _, fs in os.walk(self.whole_dir):
            for f in fs:
                if f.startswith(_TMP):
                    continue
                try:
                    st = os.stat(os.path.join(d, f))
                except OSError:
                    continue
                files.append((st.st_mtime_ns, st.st_size, os.path.join(d, f)))
        files.sort()
        total = sum(f[1] for f in files)
        freed = 0
        for _, size, path in files:
            if total <= self.whole_budget and freed >= need:
                break
            self._unlink(path)
            total -= size
            freed += size
        with self._lock:
            self._whole_bytes = total
        return freed

    def warn_write(self, exc: BaseException) -> None:
        """A write to the cache failed (a full disk, a broken database): the read goes on without
        it. Said at most every :data:`WARN_EVERY_S` (a busy mount on a full disk meets it at every
        chunk), with how many more failed since."""
        now = time.monotonic()
        with self._lock:
            self._write_failures += 1
            if self._warned_t is not None and now - self._warned_t < WARN_EVERY_S:
                return
            n, self._write_failures, self._warned_t = self._write_failures, 0, now
        more = f" ({n - 1} more since the last such warning)" if n > 1 else ""
        log.warning("data cache write failed; continuing without it: %s%s", exc, more)

    def _room(self, n: int) -> bool:
        """Whether ``n`` more bytes leave the cache's disk its reserve (:data:`RESERVE_SHARE` of it,
        at most :data:`RESERVE_MAX`: what is written through the mount -- the spool, on the same
        disk by default -- comes first); whole files are evicted, least recently used first, to
        make it. False: the bytes are not kept (no warning: a full disk is no failure of the cache)."""
        if self._full_until and time.monotonic() < self._full_until:
            return False  # (full a moment ago with nothing left to evict: no walk of the whole files per chunk)
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return True  # (the write says why, if it fails)
        reserve = min(RESERVE_MAX, st.f_blocks * st.f_frsize * RESERVE_SHARE // 100)
        need = n + reserve - st.f_bavail * st.f_frsize
        if need <= 0:
            self._full_until = 0.0
            return True
        if self._evict_whole(need) >= need:
            return True
        self._full_until = time.monotonic() + FULL_RECHECK_S
        return False

    def free_up(self) -> int:
        """Give up every kept chunk and whole file (what readers hold open stays theirs until
        they close it): the spool's disk is full. Bytes freed, about."""
        freed = self._evict_whole(1 << 62)
        try:
            freed += self._cache.volume()
            self._cache.clear(retry=True)
        except _CACHE_ERRORS as exc:
            log.warning("data cache: could not empty it for the spool: %s", exc)
        if freed:
            log.warning("data cache in %s: its disk is full; %d MB given up to the files being written",
                        self.directory, freed >> 20)
        return freed

    @staticmethod
    def _unlink(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass

    @staticmethod
    def key(address: str, etag: str, index: int) -> str:
        # ("2": the CRC covers the key, see _crc; chunks kept by older versions are not read)
        return f"2:{etag}:{index}:{address}"

    def get(self, key: str) -> bytes | None:
        try:
            raw = self._cache.get(key, default=None, retry=True)
        except _CACHE_ERRORS as exc:
            log.warning("data cache read failed, reading from the store: %s", exc)
            raw = None
        if raw is not None:
            data = raw[4:]
            if len(raw) >= 4 and int.from_bytes(raw[:4], "little") == _crc(key, data):
                with self._lock:
                    self.hits += 1
                    self.bytes_from_cache += len(data)
                return data
            with self._lock:  # two readers of one damaged entry at once: one damaged entry
                first = key not in self._damaged
                if first:
                    self._damaged.add(key)
                    self.corrupt += 1
            if first:
                log.warning("data cache entry %s is damaged; fetching it again", key)
            self.discard(key)
        with self._lock:
            self.misses += 1
        return None

    def contains(self, key: str) -> bool:
        """Whether a chunk is cached (no read of it, no check)."""
        try:
            return key in self._cache
        except _CACHE_ERRORS:
            return False

    def put(self, key: str, data: bytes) -> None:
        if len(data) > self.max_bytes or not self._room(len(data)):
            return
        if self._damaged:
            with self._lock:
                self._damaged.discard(key)
        if self._index_lost:
            return
        try:
            self._cache.set(key, _crc(key, data).to_bytes(4, "little") + data, retry=True)
        except _CACHE_ERRORS as exc:
            if isinstance(exc, sqlite3.DatabaseError) and "no such table" in str(exc):
                # its index removed under the mount: each write would leave a file nothing evicts (the
                # next mount empties them, open_diskcache); chunks are no longer kept until then
                self._index_lost = True
            self.warn_write(exc)

    def discard(self, key: str) -> None:
        try:
            self._cache.delete(key, retry=True)
        except _CACHE_ERRORS:
            pass

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "bytes_from_cache": self.bytes_from_cache,
                    "damaged": self.corrupt, "whole_hits": self.whole_hits, "whole_filled": self.whole_filled,
                    "whole_rejected": self.whole_rejected, "whole_unchecked": self.whole_unchecked}

    def count_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes_from_cache += n

    def volume(self) -> int:
        return self._cache.volume()

    def close(self) -> None:
        self._cache.close()


def _crc(key: str, data) -> int:
    """A chunk's check: CRC32C of its key, then its bytes -- a chunk file moved to another key
    (another object's, another offset's) fails it as a damaged one does."""
    return google_crc32c.extend(google_crc32c.value(key.encode("utf-8", "surrogateescape")), data)


def _yield_cpu() -> int | None:
    """Lower the calling thread's CPU priority by :data:`VERIFY_NICE` (Linux: niceness is per
    thread); its niceness then, or None where that is not possible."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + VERIFY_NICE))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except (OSError, AttributeError):
        return None


class WholeFill:
    """A whole object being written into the data cache in order: a temporary file, written in a
    thread of its own (the stream that feeds it goes on reading meanwhile). :meth:`commit` checks
    its size, and then, for a plain-MD5 etag, its MD5 in the background (the reader that streamed
    it is not held up); only a file that passed both is renamed into place -- a bad object never
    enters the cache. :meth:`abort` drops it."""

    def __init__(self, cache: DataCache, path: str, size: int, etag: str, threaded: bool = True):
        self.cache, self.path, self.size, self.etag = cache, path, size, etag
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.tmp = os.path.join(os.path.dirname(path), f"{_TMP}{uuid.uuid4().hex}")
        self._fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self.written = 0
        self.verify_nice: int | None = None  # the niceness its MD5 check ran at (see VERIFY_NICE)
        self._failed = False
        self._queue: queue.Queue = queue.Queue(maxsize=4)
        self._thread = None
        self._stage = None  # an aligned buffer for O_DIRECT writes (a threaded fill of a large object)
        self._staged = 0
        if threaded:
            if size >= _DIRECT_MIN and _set_direct(self._fd, True):
                # written past the page cache: the disk's DMA, not a CPU copy -- the copy into the
                # page cache cost a streaming reader on a 2-core machine half its throughput
                self._stage = mmap.mmap(-1, _STAGE)
            self._thread = threading.Thread(target=self._drain, name="graveler-cache-fill", daemon=True)
            self._thread.start()

    def _drain(self) -> None:
        while True:
            data = self._queue.get()
            if data is None:
                if self._stage is not None and not self._failed:
                    self._guarded(self._flush_stage, True)
                return
            if self._failed:
                continue
            if self._stage is not None:
                self._guarded(self._stage_in, data)
            else:
                self._guarded(self._write_all, data)

    def _guarded(self, fn, arg) -> None:
        try:
            fn(arg)
        except OSError as exc:
            self.cache.warn_write(exc)
            self._failed = True

    def _write_all(self, data) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, self.written)
            view = view[n:]
            self.written += n

    def _stage_in(self, data) -> None:
        view = memoryview(data)
        if not self._staged and len(view) % _PAGE == 0 and _page_aligned(view):
            # whole pages of a page-aligned buffer (a stream's: graveler.objstore.buffers): written
            # from where they are, no copy into the stage
            off = 0
            while off < len(view):
                off += os.pwrite(self._fd, view[off:], self.written + off)
            self.written += off
            return
        while view:
            k = min(len(view), _STAGE - self._staged)
            self._stage[self._staged:self._staged + k] = view[:k]
            self._staged += k
            view = view[k:]
            if self._staged == _STAGE:
                self._flush_stage(False)

    def _flush_stage(self, final: bool) -> None:
        """Write the staged bytes: whole pages with O_DIRECT, a last partial page (``final``) without."""
        n = self._staged
        aligned = n - n % _PAGE
        buf = memoryview(self._stage)
        off = 0
        while off < aligned:
            off += os.pwrite(self._fd, buf[off:aligned], self.written + off)
        if final and n > aligned:
            _set_direct(self._fd, False)
            tail = bytes(buf[aligned:n])
            while tail:
                k = os.pwrite(self._fd, tail, self.written + off)
                tail = tail[k:]
                off += k
        buf.release()
        self.written += off
        self._staged = 0

    def write(self, data) -> None:
        if self._fd >= 0:
            self._queue.put(data)
            if self._thread is None:
                self._queue.put(None)
                self._drain()

    def _finish(self) -> bool:
        """Wait for the writes. False when there is nothing to keep (the file is closed then)."""
        if self._fd < 0:
            return False
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        if self._stage is not None:
            self._close_stage()
            _set_direct(self._fd, False)  # read back (the MD5) through the page cache
        if self._failed:
            self._drop()
            return False
        return True

    def _close_stage(self) -> None:
        if self._stage is not None:
            self._stage.close()
            self._stage = None

    def _drop(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._close_stage()
        DataCache._unlink(self.tmp)

    def commit(self, check: bool = True) -> None:
        """Keep the file if it is the object its entry describes: its size now, its MD5 (a plain-MD5
        etag) in a thread of its own, which renames it into place (:meth:`DataCache.wait_fills`)."""
        if not self._finish():
            return
        if check and self.written != self.size:
            self._reject(f"{self.written} bytes, the entry says {self.size}")
            return
        if check and is_md5_etag(self.etag):
            self.cache._fill_started()
            threading.Thread(target=self._verify, name="graveler-cache-verify", daemon=True).start()
        else:
            self._keep()

    def _verify(self) -> None:
        self.verify_nice = _yield_cpu()
        try:
            h = hashlib.md5(usedforsecurity=False)
            if not self._hash_direct(h):
                off = 0
                while off < self.size:
                    piece = os.pread(self._fd, min(8 * MiB, self.size - off), off)
                    if not piece:
                        break
                    h.update(piece)
                    off += len(piece)
            if h.hexdigest() != self.etag:
                self._reject(f"MD5 {h.hexdigest()}, the entry says {self.etag}")
            else:
                self._keep()
        except OSError as exc:
            log.warning("data cache check failed; the object is not kept: %s", exc)
            self._drop()
        finally:
            self.cache._fill_done()

    def _hash_direct(self, h) -> bool:
        """Feed the file to ``h`` read back with O_DIRECT into a reused page-aligned buffer: the
        disk's DMA, no copy through the page cache (whose fresh pages cost more than the copy) and
        no gigabyte of it pushed out. False, ``h`` untouched, where the file system refuses
        O_DIRECT (the caller reads it the usual way)."""
        if self.size < _DIRECT_MIN:
            return False
        try:
            fd = os.open(self.tmp, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            buf = memoryview(pool(_STAGE).take())
            off = 0
            while off < self.size:
                n = os.preadv(fd, [buf], off)
                if n <= 0:
                    break
                h.update(buf[:min(n, self.size - off)])  # (hashlib lets go of the GIL meanwhile)
                off += n
            buf.release()
            return True
        finally:
            os.close(fd)

    def _reject(self, why: str) -> None:
        self._drop()
        with self.cache._lock:
            self.cache.whole_rejected += 1
        log.warning("data cache: %s read whole is not its entry's object (%s); not kept", self.path, why)

    def _keep(self) -> None:
        try:
            os.rename(self.tmp, self.path)
            self.cache._checked.remember(self.path, file_fingerprint(os.fstat(self._fd)))  # (after the rename: its ctime)
        except OSError as exc:
            self.cache.warn_write(exc)
            DataCache._unlink(self.tmp)
            return
        finally:
            os.close(self._fd)
            self._fd = -1
        self.cache._whole_added(self.size)

    def abort(self) -> None:
        if self._finish():
            self._drop()


__all__ = ["DataCache", "WholeFill", "WHOLE_MAX"]
