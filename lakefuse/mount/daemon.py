"""Mount, serve, unmount: the life of a lakefuse mount daemon.

:func:`serve` is the daemon (``lakefuse mount -f``): it opens the repository,
checks the store answers, mounts with pyfuse3, runs the main loop under trio and
sends ``READY=1`` to ``$NOTIFY_SOCKET`` once the mount answers a ``stat``
(systemd's ``Type=notify``). SIGTERM and SIGINT end the loop and unmount
cleanly; a failure before the mount answers is reported as ``STATUS=...`` on the
same socket and a non-zero exit.

:func:`start_daemon` is ``lakefuse mount`` without ``-f``: it starts the same
command with ``-f`` in a new session (stdin/stdout detached, logs to a file) with
a ``NOTIFY_SOCKET`` of its own, and returns once ``READY=1`` arrives -- or fails
with the daemon's reason.

:func:`umount` is ``lakefuse umount``: it asks the mount for its daemon's pid,
unmounts with ``fusermount3 -u`` and waits for the daemon to exit. A mount left
behind by a killed daemon ("transport endpoint is not connected") is cleared the
same way.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

FS_TYPE = "fuse.lakefuse"
# How long the event loop looks for the next request before it sleeps (see MountConfig): long
# enough to cover a small file's close in a worker thread and the writer's next call
RECEIVE_SPIN_US = 500
MAX_SPIN_US = 100_000


class MountError(Exception):
    """A mount or unmount that cannot happen, with the reason for the user."""


@dataclass(frozen=True)
class MountConfig:
    """One mount, built at the edge (the CLI) and passed down."""

    repository: str
    mountpoint: str
    fuse_options: frozenset[str] = frozenset()
    limits: dict = field(default_factory=dict)  # offload limiter sizes by name (defaults when empty)
    read_ahead_kb: int = 4096  # the kernel's read-ahead window for the mount (0: leave it)
    # where the write spool lives (<cache_dir>/spool/<repo>), whose filesystem statfs reports; None: <home>/cache
    cache_dir: str | None = None
    # FUSE passthrough for committed local objects, when the kernel and pyfuse3 have it; off: $LAKEFUSE_PASSTHROUGH=0
    passthrough: bool = field(default_factory=lambda: _env_flag("LAKEFUSE_PASSTHROUGH", True))
    # ... and for branch files no handle writes: on with $LAKEFUSE_BRANCH_PASSTHROUGH=1 (a read-only
    # open then binds the inode to the object's file, and a writer that comes while it lasts gets
    # another inode: locks, appends and inotify are not shared across the two -- off by default)
    branch_passthrough: bool = field(default_factory=lambda: _env_flag("LAKEFUSE_BRANCH_PASSTHROUGH", False))
    # reads a local file's page cache holds whole answered on the trio thread; off: $LAKEFUSE_INLINE_READS=0
    inline_reads: bool = field(default_factory=lambda: _env_flag("LAKEFUSE_INLINE_READS", True))
    # pyfuse3 reads the next request at once after answering one (a patched build); off: $LAKEFUSE_RECEIVE_BURST=0
    receive_burst: bool = field(default_factory=lambda: _env_flag("LAKEFUSE_RECEIVE_BURST", True))
    # readdir replies a page in one call (a patched build); off: $LAKEFUSE_READDIR_MANY=0
    readdir_many: bool = field(default_factory=lambda: _env_flag("LAKEFUSE_READDIR_MANY", True))
    # the kernel may list a directory with plain READDIR where it sees no use for READDIRPLUS
    # (a listing read past its first reply with nothing looked up meanwhile: ``ls -f``); off:
    # $LAKEFUSE_READDIR_PLAIN=0 (READDIRPLUS always)
    readdir_plain: bool = field(default_factory=lambda: _env_flag("LAKEFUSE_READDIR_PLAIN", True))
    # a worker thread answers the write, close (flush) or fsync it served itself, without waking
    # the trio thread (a patched build: pyfuse3.Reply); off: $LAKEFUSE_DEFERRED_REPLIES=0
    deferred_replies: bool = field(default_factory=lambda: _env_flag("LAKEFUSE_DEFERRED_REPLIES", True))
    # how many GETs at once a sequential reader of a large S3 object may reach (a stream and its
    # parallel parts; 1: one stream, no parts); None: graveler's default. $LAKEFUSE_S3_LANES
    s3_lanes: int | None = field(default_factory=lambda: env_int("LAKEFUSE_S3_LANES", None, 1))
    # after answering a request with none waiting, how long (microseconds) the event loop reads the
    # FUSE fd again outside the GIL before it sleeps (a patched build); 0: it sleeps at once.
    # $LAKEFUSE_RECEIVE_SPIN_US
    # (by default 0 where the daemon may run on one CPU only: the next request cannot come while it spins)
    receive_spin_us: int = field(default_factory=lambda: env_int(
        "LAKEFUSE_RECEIVE_SPIN_US", RECEIVE_SPIN_US if len(os.sched_getaffinity(0)) > 1 else 0, 0, MAX_SPIN_US,
        "microseconds"))


def env_int(name: str, default: int | None, low: int, high: int | None = None, what: str = "a whole number"):
    """``$name`` as an integer from ``low`` (to ``high``), ``default`` when unset; else a clear error."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < low or (high is not None and int(value) > high):
        from graveler.errors import InvalidArgument

        bound = "up" if high is None else f"to {high}"
        raise InvalidArgument(f"${name}: expected {what} from {low} {bound}, got {value!r}")
    return int(value)


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value not in ("0", "false", "no", "off")


# ---------------------------------------------------------------------- notify socket


def sd_notify(message: str) -> bool:
    """Send ``message`` to ``$NOTIFY_SOCKET`` (systemd's protocol); False if there is none."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(path)
            s.sendall(message.encode())
        return True
    except OSError as e:
        log.warning("cannot notify %s: %s", path, e)
        return False


NOTICE = "LAKEFUSE_NOTICE"  # a notify-socket variable: one line for the terminal of `lakefuse mount`


def tell_user(lines: list[str]) -> None:
    """Say ``lines`` on the terminal of whoever started the mount: this daemon's stderr
    (``-f``), and to a daemonizing ``lakefuse mount`` as ``LAKEFUSE_NOTICE=`` lines on the
    notify socket before ``READY=1`` (:func:`start_daemon` prints them; systemd ignores them)."""
    if not lines:
        return
    import sys

    for line in lines:
        print(f"lakefuse: {line}", file=sys.stderr, flush=True)
    sd_notify("\n".join(f"{NOTICE}={line.replace(chr(10), ' ')}" for line in lines))


# ---------------------------------------------------------------------- mount table


def _unescape(field_: str) -> str:
    out, i = [], 0
    while i < len(field_):
        if field_[i] == "\\" and i + 3 < len(field_) and field_[i + 1:i + 4].isdigit():
            out.append(chr(int(field_[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field_[i])
            i += 1
    return "".join(out)


def canonical_mountpoint(mountpoint: str) -> str:
    """``mountpoint`` as the kernel lists mounts (``/proc/self/mountinfo``): absolute, with every
    symbolic link on the way resolved (``/data/lake`` where ``/data`` links to ``/srv``). The path
    itself is never stat'ed -- a hung daemon serving it would not answer --: its parent is
    resolved, then its last element if that is a link (``readlink`` of a mount point answers
    EINVAL without asking the file system mounted there)."""
    p = os.path.abspath(mountpoint)
    for _ in range(40):  # (as the kernel's limit on links followed)
        parent, name = os.path.split(p)
        p = os.path.join(os.path.realpath(parent), name)
        if not name:
            return p
        try:
            target = os.readlink(p)
        except OSError:  # not a link (EINVAL), or not there
            return p
        p = os.path.normpath(os.path.join(os.path.dirname(p), target))
    return p


def mount_type(mountpoint: str) -> str | None:
    """The filesystem type mounted exactly at ``mountpoint`` (None: nothing is)."""
    mp = canonical_mountpoint(mountpoint)
    found = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                parts = left.split()
                if len(parts) >= 5 and _unescape(parts[4]) == mp:
                    found = right.split()[0] if right else "?"
    except OSError:
        return None
    return found  # the last one listed is the one on top


def check_mountpoint(mountpoint: str) -> str:
    """The absolute mount point, or MountError when nothing can be mounted there."""
    mp = canonical_mountpoint(mountpoint)
    if not os.path.exists("/dev/fuse"):
        raise MountError("no /dev/fuse: FUSE is not available here (load the fuse module; "
                         "in a container, pass --device /dev/fuse)")
    kind = mount_type(mp)
    if kind == FS_TYPE and daemon_pid(mp, timeout=2.0) is None:
        raise MountError(f"mount point {mp} still holds a lakefuse mount whose daemon is gone or not answering "
                         f"(killed?): clear it with `lakefuse umount {mp}` (its spool is recovered at the next mount)")
    if kind is not None:
        raise MountError(f"mount point {mp} is busy: something is already mounted there")
    try:
        st = os.stat(mp)
    except FileNotFoundError:
        raise MountError(f"mount point {mp} does not exist") from None
    except OSError as e:
        raise MountError(f"mount point {mp}: {e.strerror}") from None
    import stat as stat_

    if not stat_.S_ISDIR(st.st_mode):
        raise MountError(f"mount point {mp} is not a directory")
    return mp


def _say_what_is_hidden(mp: str) -> None:
    """A mount point that is not empty: what is in it (written while nothing was mounted there,
    perhaps by a job meaning the mount) is hidden while the mount is there -- said, not refused
    (as mount(8) and FUSE 3 allow it)."""
    try:
        with os.scandir(mp) as it:
            n = sum(1 for _ in it)
    except OSError:
        return
    if n:
        tell_user([f"mount point {mp} is not empty: its {n} {'entry is' if n == 1 else 'entries are'} hidden while "
                   "lakefuse is mounted there (written while it was not mounted?)"])


def claim_mountpoint(mp: str) -> int:
    """Hold the directory at ``mp`` -- the one a mount covers -- for this daemon (an exclusive
    ``flock``, let go when the process ends): two daemons started together on one mount point
    both passed :func:`check_mountpoint` before either mounted, and the second mounted over the
    first, whose mount then served no one and whose ``umount`` reached the wrong daemon. The
    directory's descriptor, kept open; MountError if another daemon holds it."""
    import fcntl

    try:
        fd = os.open(mp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(f"mount point {mp}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise MountError(f"mount point {mp} is busy: another lakefuse daemon is mounting there") from None
    except OSError as e:  # a filesystem without flock (some network ones): mounted unclaimed, as before
        log.debug("mount point %s: no flock (%s); not claimed", mp, e.strerror)
    try:
        check_mountpoint(mp)  # (one that mounted between our check and our open: its mount is there now)
    except MountError:
        os.close(fd)
        raise
    return fd


# ---------------------------------------------------------------------- the daemon

# The daemon's collector thresholds: young collections every 100,000 allocations (not 700), older
# ones rarely. The daemon keeps an inode, its attributes and its entry for every name the kernel
# holds (100,000s after a big listing), almost none of them in reference cycles; with the default
# thresholds a full collection walks all of them every few listing pages, and one request waits
# 100-200 ms behind it (measured: a getattr's p99 right after `ls -f` of 100,000 names).
GC_THRESHOLDS = (100_000, 20, 100)


# pyfuse3's request tasks kept while idle (its default: 1). A task whose request waits (a thread
# hop) leaves the reading to a new one, and pyfuse3 ends a task once more than this many are
# idle: with 1, a branch tree's lookups and opens (each a thread hop) made and ended two tasks
# per file read (~20 us of trio's Python each); kept, they are made once.
MIN_TASKS = 16
SWITCH_INTERVAL = 0.001  # seconds: how long a thread waits for the GIL before it asks for it (see serve)


def _attrs_stale(ino: int) -> None:
    """The kernel's attributes of ``ino`` are stale (the core's ``kernel_attrs_stale``): attributes
    only, so it never waits on the inode's pages -- safe from a request's own thread."""
    import pyfuse3

    try:
        pyfuse3.invalidate_inode(ino, True)
    except OSError as e:  # the kernel has no such inode (forgotten meanwhile): nothing is stale
        if e.errno not in (errno.ENOENT, errno.ENOTDIR):
            log.debug("invalidating the attributes of inode %d: %s", ino, e)


def tune_gc() -> None:
    import gc

    gc.collect()
    gc.freeze()  # what start-up made (modules, the repository) is never collected: not walked again
    gc.set_threshold(*GC_THRESHOLDS)



FD_LIMIT = 1 << 20  # the soft limit of open files a daemon raises itself to (at most its hard limit)


def raise_fd_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (at most :data:`FD_LIMIT`),
    as daemons that hold many files do; the limit now. A mount holds a descriptor per mapped table
    (each of 256 KiB or more: up to 512 MiB of them are kept), per file being written and per
    pre-made spool file: 1,024, the usual soft limit, runs out on a mount that reads many commits,
    and with no descriptor left its saves cannot write their redo log."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_LIMIT if hard == resource.RLIM_INFINITY else min(hard, FD_LIMIT)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return want
        except (ValueError, OSError) as e:
            log.debug("could not raise the open-files limit from %d to %d: %s", soft, want, e)
    return soft


def serve(repo, config: MountConfig, fs_config=None, data_cache=None) -> None:
    """Mount ``repo`` and serve it until unmounted or signalled (the ``-f`` daemon).

    Raises MountError (after sending ``STATUS=``) when it cannot mount."""
    import pyfuse3
    import trio

    from graveler.objstore import LocalStore
    from graveler.objstore.chunked import ReadAheadPool
    from lakefuse.mount.fs import Filesystem
    from lakefuse.mount.fuse import Operations
    from lakefuse.mount.offload import SAVE, Offload, limits_for
    from lakefuse.mount.spool import Spool, SpoolConfig
    from lakefuse.mount.writes import WritableFilesystem

    mp = check_mountpoint(config.mountpoint)
    claim_mountpoint(mp)  # (held until the process ends: a second daemon on mp is refused meanwhile)
    _say_what_is_hidden(mp)
    raise_fd_limit()
    if {"allow_other", "allow_root"} <= set(config.fuse_options):
        raise MountError("-o allow_other and -o allow_root exclude each other (allow_other lets root in too)")
    # The store must answer before we mount (a cached tree would not tell): list it once,
    # then read the default branch's tree.
    repo.check_store()
    repo.view(repo.default_branch).list_page(b"", b"", 1)
    cache_dir = config.cache_dir or os.path.join(str(repo.config.home), "cache")
    if fs_config is not None and fs_config.read_only:  # nothing is written: no spool, no recovery
        spool = None
        fs = Filesystem(repo, fs_config, data_cache=data_cache, space_dir=cache_dir)  # statfs: the caches' disk
    else:
        spool = Spool(repo, SpoolConfig(Path(cache_dir), repo.name))
        if data_cache is not None and os.stat(data_cache.directory).st_dev == os.stat(spool.dir).st_dev:
            spool.pool.free_reads = data_cache.free_up  # a full disk: what is read gives way to what is written
        fs = WritableFilesystem(repo, fs_config, spool=spool, data_cache=data_cache)
        report = fs.recover()  # spool leftovers and unfinished renames of a killed daemon
        tell_user(report.lines() if report is not None else [])
        fs.writes.empty.warm()  # (a create later needs no store: lakefuse.mount.emptyobj)
    fs.branch_passthrough = config.branch_passthrough
    fs.mountpoint = mp
    fs.stats.set("branch_passthrough", "on" if config.branch_passthrough else "off")
    # a local store's saves with an embedded KV: GIL-bound, one thread (offload.LOCAL_SAVE_THREADS)
    limits = limits_for(isinstance(repo.store, LocalStore) and repo.config.kv.embedded)
    limits.update(config.limits)
    fs.stats.set("save_threads", str(limits[SAVE]))
    ops = Operations(fs, Offload(limits), passthrough=config.passthrough,
                     inline_reads=config.inline_reads, receive_burst=config.receive_burst,
                     readdir_many=config.readdir_many, readdir_plain=config.readdir_plain,
                     deferred_replies=config.deferred_replies, receive_spin_us=config.receive_spin_us)
    options = {"fsname=lakefs://" + repo.name, "subtype=lakefuse", "default_permissions", *config.fuse_options}
    read_ahead = ReadAheadPool(lanes=config.s3_lanes)  # the chunked readers' streams: ended with the mount
    fs.stats.set("s3_lanes", str(read_ahead.lanes))
    # A stream's thread takes the GIL back after every socket read, a request's worker thread after
    # every syscall (a small file's write and close: several each): a shorter switch interval than
    # the default 5 ms keeps them from waiting behind the trio thread while it answers other
    # requests (S3 reads ~20% faster here with 1 ms). 0.2 ms looked ~15% faster for tar -x under
    # load, but a quiet A/B (3 alternating pairs of scripts/bench/mount_write.py) had it equal or
    # slower on every small-file row, so 1 ms stays.
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        pyfuse3.init(ops, mp, options)
    except RuntimeError as e:
        read_ahead.close()
        raise MountError(f"cannot mount on {mp}: {e}") from None
    log.info("mounted lakefs://%s on %s (pid %d)", repo.name, mp, os.getpid())
    from lakefuse.mount.watch import StampWatch

    watch = StampWatch(fs, lambda ino: pyfuse3.invalidate_inode(ino, False),
                       invalidate_entry=pyfuse3.invalidate_entry).start()
    # a reset, merge or revert: the kernel's caches go first, and the names it took away
    fs.controls.after_change = lambda branch, removed: watch.poke(branch=branch, removed=removed)
    fs.kernel_attrs_stale = _attrs_stale
    report = os.path.join(str(repo.config.home), "logs", f"unmount-{os.getpid()}.txt")
    fs.stats.set("unmount_report", report)  # (lakefuse umount reads what this daemon said there)
    try:
        tune_gc()
        trio.run(_main, mp, config.read_ahead_kb)
    finally:
        said = ErrorsSaid()
        logging.getLogger().addHandler(said)
        try:
            watch.stop()
            ops.offload.close()  # requests still in worker threads: done and answered before the session goes
            try:
                pyfuse3.close(unmount=True)
            except Exception:  # already unmounted from outside
                log.debug("pyfuse3.close", exc_info=True)
            read_ahead.close()
            if spool is not None:
                spool.close()
            log.info("unmounted %s", mp)
        finally:
            logging.getLogger().removeHandler(said)
            said.write(report)


class ErrorsSaid(logging.Handler):
    """The errors this daemon logs while it stops (a save or the final sync of the store and the
    KV that failed), written to a file ``lakefuse umount`` reads once the daemon has exited: the
    command says them and fails, where it said nothing and exited 0."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        from lakefuse.cli.logsafe import guard

        guard(self)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        self.lines.append(msg.splitlines()[0] if msg else record.levelname)

    def write(self, path: str) -> None:
        if not self.lines:
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)  # (a -f mount without --log made no logs/)
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(self.lines) + "\n")
        except OSError as e:  # (the log says them anyway)
            log.warning("cannot write %s: %s", path, e)


async def _main(mountpoint: str, read_ahead_kb: int = 0) -> None:
    import pyfuse3
    import trio

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_on_signals)
        nursery.start_soon(_announce_ready, mountpoint, read_ahead_kb)
        await pyfuse3.main(min_tasks=MIN_TASKS)
        nursery.cancel_scope.cancel()


async def _on_signals() -> None:
    import pyfuse3
    import trio

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:  # logrotate's signal: the log file is opened again (its new one)
                reopen_logs()
                log.info("SIGHUP: log file opened again")
                continue
            log.info("%s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


def reopen_logs() -> None:
    """Open every log file of this process again by its name (after a rotation renamed it)."""
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.acquire()
            try:
                if h.stream is not None:
                    h.stream.close()
                h.stream = h._open()
            except OSError as e:  # (the old stream is gone: the next record tries again)
                h.stream = None
                sys.stderr.write(f"lakefuse: cannot open the log file {h.baseFilename} again: {e}\n")
            finally:
                h.release()


def set_read_ahead(mountpoint: str, kib: int) -> bool:
    """Raise the kernel's read-ahead window of the mount (``/sys/class/bdi/<dev>/read_ahead_kb``):
    with the default 128 KiB every FUSE read is 128 KiB; with 4 MiB a sequential reader's
    requests grow to 1 MiB (FUSE's largest), 8 times fewer. Needs root; False if not done."""
    mp = canonical_mountpoint(mountpoint)
    dev = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 5 and _unescape(parts[4]) == mp:
                    dev = parts[2]
        if dev is None:
            return False
        with open(f"/sys/class/bdi/{dev}/read_ahead_kb", "w") as f:
            f.write(str(kib))
        return True
    except OSError as e:
        log.debug("cannot set the read-ahead of %s: %s", mp, e)
        return False


async def _announce_ready(mountpoint: str, read_ahead_kb: int = 0) -> None:
    import trio

    # The stat goes through the kernel to our own main loop: when it returns, the mount answers.
    await trio.to_thread.run_sync(os.stat, mountpoint)
    if read_ahead_kb and set_read_ahead(mountpoint, read_ahead_kb):
        log.debug("read-ahead of %s set to %d KiB", mountpoint, read_ahead_kb)
    if sd_notify(f"READY=1\nSTATUS=serving {mountpoint}\nMAINPID={os.getpid()}"):
        log.debug("READY=1 sent")


# ---------------------------------------------------------------------- daemonizing


def open_log(path: str) -> int:
    """A descriptor appending to log file ``path`` -- never through a symbolic link (``ELOOP``): in a home
    another user owns (root mounting their repository) such a link would have this process append to a
    file of their choosing; only a regular file of this process's user (a FIFO planted there hung the
    mount for good; another user's file would get this daemon's log to read and rewrite: ``EPERM``)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "the log file is a symbolic link, which a log is never written through "
                                       "(one in a home another user may write could point at any file): remove it, "
                                       "or name another file with --log", path) from None
        if e.errno == errno.ENXIO:  # (a FIFO no one reads: O_NONBLOCK's answer)
            raise OSError(errno.EINVAL, "the log file is a FIFO, not a regular file: remove it, or name another "
                                        "file with --log", path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "the log file is not a regular file: remove it, or name another file "
                                        "with --log", path)
        if st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"the log file belongs to another user (uid {st.st_uid}), who could read "
                                       "and rewrite this daemon's log: remove it, or name another file with --log",
                          path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class LogFile(logging.FileHandler):
    """:class:`logging.FileHandler` on :func:`open_log`."""

    def _open(self):
        return os.fdopen(open_log(self.baseFilename), "a", encoding=self.encoding or "utf-8", errors=self.errors)


def start_daemon(argv: list[str], log_path: str, timeout: float = 60.0, env: dict[str, str] | None = None,
                 notices: list[str] | None = None) -> int:
    """Run ``argv`` (a ``lakefuse mount ... -f`` command line) as a daemon in a new
    session and wait for its ``READY=1``. Returns its pid; MountError with the
    daemon's reason if it exits or stays silent. ``env``: variables the daemon gets on top
    of this process's environment (e.g. a KV URL kept out of its command line).
    ``notices``: gets the lines the daemon said for the user's terminal (:func:`tell_user`)."""
    tmp = tempfile.mkdtemp(prefix="lakefuse-notify-")
    sock_path = os.path.join(tmp, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(sock_path)
        sock.settimeout(0.1)
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        with os.fdopen(open_log(log_path), "ab") as logf:
            log_start = logf.tell()  # (what the daemon says from here on: its reason, if it fails)
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd="/", start_new_session=True,
                env={**os.environ, **(env or {}), "NOTIFY_SOCKET": sock_path}, close_fds=True,
            )
        status = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = sock.recv(1 << 16).decode(errors="replace")
            except socket.timeout:
                msg = ""
            for line in msg.splitlines():
                if line.startswith("STATUS="):
                    status = line[len("STATUS="):]
                if line.startswith(NOTICE + "=") and notices is not None:
                    notices.append(line[len(NOTICE) + 1:])
                if line == "READY=1":
                    return proc.pid
            if proc.poll() is not None:
                # drain what it said before exiting
                try:
                    while True:
                        for line in sock.recv(4096).decode(errors="replace").splitlines():
                            if line.startswith("STATUS="):
                                status = line[len("STATUS="):]
                except (socket.timeout, OSError):
                    pass
                said = _daemon_said(log_path, log_start)
                if status and said and said not in status:
                    status = f"{status} ({said})"  # (libfuse's or fusermount3's own words: why)
                err = MountError(status or said or f"the mount daemon exited with status {proc.returncode} "
                                                   f"(see {log_path})")
                err.exit_status = proc.returncode  # the CLI passes the daemon's exit code on
                raise err
        proc.terminate()
        raise MountError(f"the mount did not answer within {timeout:.0f} s (see {log_path})")
    finally:
        sock.close()
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------- unmounting


def _daemon_by_cmdline(mp: str) -> int | None:
    """The pid of a live ``lakefuse mount ... MP -f`` process (a daemon whose stats do not
    answer), from /proc; None when there is none (or it is not ours to see)."""
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                args = f.read().decode("utf-8", "surrogateescape").split("\0")
        except OSError:
            continue
        # (the daemon's argv names the canonical mount point: start_daemon, or a unit's absolute path)
        if "mount" in args and "-f" in args and mp in args[args.index("mount") + 1:] \
                and any(a == "lakefuse" or a.endswith("/lakefuse") for a in args):
            return int(d)
    return None


def _daemon_said(log_path: str, start: int) -> str:
    """The reason a daemon that failed before it answered gave in its log (from offset ``start``):
    libfuse's and fusermount3's own lines (``fuse: ...``, ``fusermount3: ...``), else our one
    line (``lakefuse: ...``), else the last line it wrote; "" when it wrote nothing."""
    try:
        with open(log_path, "rb") as f:
            f.seek(start)
            lines = [x.strip() for x in f.read(1 << 16).decode("utf-8", "replace").splitlines() if x.strip()]
    except OSError:
        return ""
    for prefixes in (("fuse:", "fusermount3:", "fusermount:"), ("lakefuse:",)):
        found = [x for x in lines if x.startswith(prefixes)]
        if found:
            return "; ".join(dict.fromkeys(x.removeprefix("lakefuse: ") for x in found[-2:]))
    return lines[-1] if lines else ""


def daemon_pid(mountpoint: str, timeout: float = 5.0) -> int | None:
    """The pid of the daemon serving ``mountpoint``, read from its ``.lakefuse/stats``
    (None when the daemon is gone or does not answer in time)."""
    return daemon_stats(mountpoint, timeout).get("pid")


def daemon_stats(mountpoint: str, timeout: float = 5.0) -> dict:
    """The ``.lakefuse/stats`` of the daemon serving ``mountpoint`` ({} when the daemon is gone or
    does not answer in time)."""
    import json

    result: list = []

    def read() -> None:
        try:
            with open(os.path.join(mountpoint, ".lakefuse", "stats"), "rb") as f:
                got = json.loads(f.read())
            if isinstance(got, dict) and "pid" in got:
                result.append(got)
        except (OSError, ValueError):
            pass

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    return result[0] if result else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own child in tests) counts as gone
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] != b"Z"
    except OSError:
        return False


def umount(mountpoint: str, lazy: bool = False, timeout: float = 30.0) -> None:
    """Unmount a lakefuse mount and wait for its daemon to exit (see the module docstring): ``timeout``
    counts from the call (the read of its stats that finds a daemon not answering included)."""
    started = time.monotonic()
    mp = canonical_mountpoint(mountpoint)
    kind = mount_type(mp)
    if kind is None:
        raise MountError(f"{mp} is not mounted")
    if kind != FS_TYPE:
        raise MountError(f"{mp} is a {kind} mount, not a lakefuse one")
    stats = daemon_stats(mp, min(5.0, max(timeout, 0.5)))
    pid, report = stats.get("pid"), stats.get("unmount_report")
    silent = None  # a daemon alive but not answering (stopped, hung): found by its command line
    if pid is None:
        silent = _daemon_by_cmdline(mp)
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise MountError("fusermount3 not found (install the fuse3 package)")
    cmd = [tool, "-u"] + (["-z"] if lazy else []) + [mp]
    r = subprocess.run(cmd, capture_output=True, text=True)
    busy = r.returncode != 0 and "busy" in (r.stderr or r.stdout).lower()
    if busy and not lazy and pid is None:
        # its daemon is gone (killed) or does not answer: nothing is served there, and a file a
        # process still holds open (our own read of its stats, if it hangs) keeps it busy for
        # good -- detach it now, as --lazy does
        if silent is None:
            log.warning("%s: its daemon is gone and files are still open there: detached lazily", mp)
        else:
            log.warning("%s: its daemon (pid %d) does not answer: detached lazily", mp, silent)
        r = subprocess.run([tool, "-u", "-z", mp], capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip()
        hint = (" (files are open there, or something is mounted inside it; close them, or use --lazy)"
                if "busy" in msg.lower() else "")
        raise MountError(f"cannot unmount {mp}: {msg}{hint}")
    if pid is None and silent is None:
        log.info("unmounted %s (its daemon was gone)", mp)
        return
    if pid is None:
        pid = silent
    if lazy and silent is None:
        # (detached: the daemon serves the files still open there and exits with the last of them)
        log.info("detached %s; its daemon (pid %d) exits once the last file open there is closed", mp, pid)
        return
    try:
        owner = os.stat(f"/proc/{pid}").st_uid  # (whose report this command may read and remove)
    except OSError:
        owner = None
    deadline = max(started + timeout, time.monotonic() + 0.5)  # (a stats probe that waited: counted in)
    while _alive(pid):
        if time.monotonic() > deadline:
            why = " (it did not answer: stopped or hung? `kill -CONT` or `kill` it)" if silent else ""
            raise MountError(f"unmounted {mp}, but its daemon (pid {pid}) has not exited after "
                             f"{time.monotonic() - started:.0f} s{why}")
        time.sleep(0.05)
    said = _unmount_report(report, pid, owner)
    if said:
        raise MountError(f"unmounted {mp}, but its daemon said as it stopped: " + "; ".join(said))
    log.info("unmounted %s; daemon %d exited", mp, pid)


def _unmount_report(path, pid: int, owner: int | None) -> list[str]:
    """What daemon ``pid`` wrote to ``path`` as it stopped (:class:`ErrorsSaid`); the file goes.
    Only a regular file of that daemon's own name, owned by its user (``owner``): the path comes
    from the daemon, and root's umount must not read or remove a file another user named."""
    if not isinstance(path, str) or os.path.basename(path) != f"unmount-{pid}.txt" or owner is None:
        return []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    with open(fd, encoding="utf-8", errors="replace") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_size > 1 << 16:
            return []
        lines = [line.strip() for line in f if line.strip()]
    try:
        os.unlink(path)
    except OSError:
        pass
    return lines
