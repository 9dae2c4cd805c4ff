"""Blocking work leaves the trio thread here, and only here.

pyfuse3 runs every handler on one trio thread: one blocking call (an object-store
read, an LMDB transaction, a table decode) would stall every other request. Each
kind of blocking work gets a named :class:`trio.CapacityLimiter`, so a burst of
slow data reads cannot take the threads that ``ls`` needs.
"""

from __future__ import annotations

import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import trio

log = logging.getLogger(__name__)

T = TypeVar("T")

META = "meta"  # lookups, listings, ref resolution, LMDB reads
DATA = "data"  # object reads
WRITE = "write"  # fsync, directory fsync, the last close's save or control request: what may wait long
SAVE = "save"  # a branch file's write and close: its spool write, upload and staging
BULK = "bulk"  # a branch file's write or close that moves many bytes (BULK_WRITE_MIN); a control file's
DEFAULT_LIMITS = {META: 8, DATA: 16, WRITE: 8, SAVE: 8, BULK: 4}
HOPS = {name: "thread_hops_" + name for name in DEFAULT_LIMITS}  # counter names (Offload.stats)
# With a local store and an embedded KV (LMDB) a save is Python and short system calls, all
# under the GIL: more threads only take turns at the GIL, and each turn costs a futex handoff.
# 8 processes writing small files went 1.26-1.31x faster with 2 threads than with 8, and with
# 1 faster again than with 2 (1,448-1,656 against 1,289-1,290 files/s; 1 process 1,526-1,890
# against 1,389-1,408; scripts/bench/mount_write.py, two alternating pairs). A save that waits
# on a server (an S3 upload, a PostgreSQL commit) keeps 8.
LOCAL_SAVE_THREADS = 1
# A write this large -- or one that first copies a file this large in, or a close that hashes
# one (handles.Handle.bulky) -- goes to BULK's threads, not SAVE's: hashing and copying leave
# the GIL (two large writers overlap on two CPUs), and small files' writes and closes never
# queue behind it in the one local save thread -- nor behind a control request (a commit, a
# merge), whose write or close also goes there. (Two pools reorder one file's requests no more
# than two save threads did: the kernel sends a buffered write's next piece, and the file's
# flush, only once the last piece was answered.)
BULK_WRITE_MIN = 64 * 1024


def limits_for(local: bool) -> dict[str, int]:
    """A mount's thread limits: :data:`DEFAULT_LIMITS`; ``local`` (a local store and an embedded
    KV: saves bound by the GIL) puts saves in :data:`LOCAL_SAVE_THREADS` threads."""
    limits = dict(DEFAULT_LIMITS)
    if local:
        limits[SAVE] = LOCAL_SAVE_THREADS
    return limits


def _not_cancellable(_raise_cancel) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


class Offload:
    """``await offload.run(META, fn, *args)``: ``fn(*args)`` in a worker thread under
    the named limiter (created lazily, inside the trio run)."""

    def __init__(self, limits: dict[str, int] | None = None):
        self.limits = dict(DEFAULT_LIMITS if limits is None else limits)
        self._limiters: dict[str, trio.CapacityLimiter] = {}
        # the mount's counters (set by the FUSE adapter): each run counts as ``thread_hops_<name>``
        # in .lakefuse/stats (a small file's thread hops: its write and its close)
        self.stats = None
        self._pools: dict[str, ThreadPoolExecutor] = {}  # defer(): threads of our own, one pool per name
        self._pools_lock = threading.Lock()

    def limiter(self, name: str) -> trio.CapacityLimiter:
        lim = self._limiters.get(name)
        if lim is None:
            lim = self._limiters[name] = trio.CapacityLimiter(self.limits[name])
        return lim

    async def run(self, name: str, fn: Callable[..., T], *args) -> T:
        """What ``trio.to_thread.run_sync(fn, *args, limiter=...)`` does (not cancellable once
        the thread runs), leaner: a request makes up to three of these (a small file's create,
        write and close), and ``to_thread`` names the OS thread twice per call
        (``pthread_setname_np``), copies the context and sets up ``trio.from_thread``, which
        nothing here uses."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.stats is not None:
            self.stats.add(HOPS[name] if name in HOPS else "thread_hops_" + name)
        lim = self.limiter(name)
        task = trio.lowlevel.current_task()
        try:  # a free thread slot taken at once: no scheduling round for the limiter's checkpoint
            lim.acquire_on_behalf_of_nowait(task)
        except trio.WouldBlock:
            await lim.acquire_on_behalf_of(task)
        try:
            token = trio.lowlevel.current_trio_token()

            def deliver(result) -> None:
                try:
                    token.run_sync_soon(trio.lowlevel.reschedule, task, result)
                except trio.RunFinishedError:  # (the run ended meanwhile: nobody waits for it)
                    pass

            trio.lowlevel.start_thread_soon(functools.partial(fn, *args), deliver)
            return await trio.lowlevel.wait_task_rescheduled(_not_cancellable)
        finally:
            lim.release_on_behalf_of(task)

    async def wait(self, fut) -> None:
        """Wait, on the trio thread and without a worker thread, until ``fut`` (a
        ``concurrent.futures.Future`` another thread completes) is done; not cancellable, as
        :meth:`run` once its thread runs."""
        if fut.done():
            return
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()

        def done(_fut) -> None:
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task)
            except trio.RunFinishedError:
                pass

        fut.add_done_callback(done)
        await trio.lowlevel.wait_task_rescheduled(_not_cancellable)

    def defer(self, name: str, job: Callable[[], None]) -> None:
        """Run ``job()`` in a worker thread of pool ``name`` (at most the limit of ``name``
        threads) and return at once: nothing on the trio thread waits for it, so ``job``
        finishes its request itself (answers through a ``pyfuse3.Reply``) and must not
        raise. Never blocks; :meth:`close` waits for every job."""
        if self.stats is not None:
            self.stats.add(HOPS[name] if name in HOPS else "thread_hops_" + name)
        pool = self._pools.get(name)
        if pool is None:
            with self._pools_lock:
                pool = self._pools.get(name)
                if pool is None:
                    pool = self._pools[name] = ThreadPoolExecutor(self.limits[name], f"lakefuse-{name}")
        pool.submit(_logged, job)

    def close(self) -> None:
        """Wait for every deferred job (their requests answered) and end their threads:
        before the FUSE session goes (a job answers through it)."""
        with self._pools_lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=True)  # (after every queued job)

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {
            name: {"limit": int(lim.total_tokens), "busy": lim.borrowed_tokens, "waiting": lim.statistics().tasks_waiting}
            for name, lim in self._limiters.items()
        }


def _logged(job: Callable[[], None]) -> None:
    """A deferred job, whose exception (it must not raise) is logged rather than kept unseen in
    its Future."""
    try:
        job()
    except BaseException:  # noqa: BLE001 -- (the pool's thread stays)
        log.exception("a deferred job raised")
