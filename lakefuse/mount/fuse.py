"""The pyfuse3 ``Operations`` adapter: thin, on purpose.

Each handler counts the request, calls the filesystem core (blocking calls go
through :class:`lakefuse.mount.offload.Offload`), converts plain data into
pyfuse3's types, and sits behind one error boundary: pyfuse3 ends its main loop
(and the mount) on any exception that is not ``FUSEError``, so every failure is
mapped through :func:`lakefuse.mount.errors.errno_for` (the one errno policy,
OSErrors of local files included), and an unexpected one is logged with its
traceback and answered EIO. The mount stays up. The adapter calls only the
core's public methods.
"""

from __future__ import annotations

import errno
import os
import functools
import logging
import time

import pyfuse3
import trio
from pyfuse3 import FUSEError

from graveler.errors import Forbidden, GravelerError, RepositoryGone
from lakefuse.mount.attrs import Attr, Caller, SetAttr
from lakefuse.mount.errors import FsError, LogOnce, errno_for
from lakefuse.mount.fs import Filesystem
from lakefuse.mount.listing import DOTS
from lakefuse.mount.offload import BULK, DATA, META, SAVE, WRITE, Offload

log = logging.getLogger(__name__)

BLKSIZE = 128 * 1024  # st_blksize: the I/O size tools should prefer (FUSE reads 128 KiB at a time)

# The pyfuse3 of scripts/setup.sh (its patch) has the open flags FOPEN_NOFLUSH (a reader's close
# sends no FLUSH) and FOPEN_CACHE_DIR (the kernel keeps an immutable directory's listing), and
# reads requests ahead (Operations.receive_burst); with another build, neither flag is set.
OPEN_FLAGS = hasattr(pyfuse3.FileInfo, "noflush")
# ... and answers a readdir page in one call (readdir_reply_many: no EntryAttributes per entry);
# with another build, an entry at a time (readdir_reply).
READDIR_MANY = hasattr(pyfuse3, "readdir_reply_many")
# ... and lets the kernel send plain READDIR requests (FUSE_CAP_READDIRPLUS_AUTO; ReaddirToken.plus)
READDIR_PLAIN = hasattr(pyfuse3.Operations, "readdirplus_auto")
RECEIVE_BURST = 16  # requests a pyfuse3 task reads in a row before it waits in trio's I/O loop
# ... and lets a worker thread answer the request it served (pyfuse3.Reply: write, flush and fsync
# of a branch file), so the trio thread is not woken to send the answer
REPLY = getattr(pyfuse3, "Reply", None)
# ... and, after answering a request with no handler waiting, reads the fd again for a while
# outside the GIL before it sleeps in trio's I/O loop (Operations.receive_spin_us): the next
# request of a process that waits for each answer is read without a wake-up (on these VMs a
# sleeping thread woken from another CPU costs tens of microseconds)
RECEIVE_SPIN = getattr(pyfuse3, "receive_spin_stats", None)


def _entry(attr: Attr) -> pyfuse3.EntryAttributes:
    e = pyfuse3.EntryAttributes()
    e.st_ino = attr.ino
    e.generation = 0
    e.entry_timeout = attr.entry_timeout
    e.attr_timeout = attr.attr_timeout
    e.st_mode = attr.mode
    e.st_nlink = attr.nlink
    e.st_uid = attr.uid
    e.st_gid = attr.gid
    e.st_rdev = attr.rdev
    e.st_size = attr.size
    e.st_blksize = BLKSIZE
    e.st_blocks = (attr.size + 511) // 512
    e.st_mtime_ns = attr.mtime_ns
    e.st_atime_ns = attr.mtime_ns if attr.atime_ns is None else attr.atime_ns
    e.st_ctime_ns = attr.ctime_ns or attr.mtime_ns
    return e


def _negative(timeout: float) -> pyfuse3.EntryAttributes:
    e = pyfuse3.EntryAttributes()
    e.st_ino = 0  # pyfuse3: an entry with inode 0 is a negative entry the kernel caches
    e.entry_timeout = timeout
    return e


def _failure(ops: "Operations", op: str, args: tuple, e: BaseException) -> int:
    """The errno that answers ``e``, raised by handler ``op``: counted, and logged as its kind
    asks (the one policy of the error boundary, whichever thread answers)."""
    if isinstance(e, FUSEError):
        ops.stats.error(errno.errorcode.get(e.errno, str(e.errno)))
        return e.errno
    if isinstance(e, FsError):
        ops._count_error(e.errno)
        if e.errno == errno.EIO:
            log.debug("%s%r: %s", op, args[:2], e)
        return e.errno
    if isinstance(e, GravelerError):
        code = errno_for(e)
        ops._count_error(code)
        if (code in (errno.EIO, errno.EBUSY, errno.EAGAIN) or isinstance(e, (RepositoryGone, Forbidden))) \
                and not getattr(e, "logged", False):
            ops.log_once(logging.WARNING, (type(e), str(e)), "%s: %s: %s (answered %s)",
                         op, type(e).__name__, e, errno.errorcode.get(code, code))
        else:
            log.debug("%s%r: %s: %s", op, args[:2], type(e).__name__, e)
        return code
    if isinstance(e, OSError):
        # a local file of the daemon's own (a spool file, the cache) refused: its errno
        # (EFBIG, ENOSPC, EDQUOT...) says more than EIO would (errors.OS_ERRNOS)
        code = errno_for(e)
        ops._count_error(code)
        ops.log_once(logging.WARNING, (op, code), "%s%r: %s (answered %s)", op, args[:2], e,
                     errno.errorcode.get(code, code))
        return code
    ops._count_error(errno.EIO)
    log.error("%s%r: unexpected error, answered EIO (the mount stays up)", op, args[:2],
              exc_info=(type(e), e, e.__traceback__))
    return errno.EIO


def boundary(op: str):
    """The error boundary around one handler (see the module docstring). A handler that
    returns a :class:`pyfuse3.Reply` (its request answered later by a worker thread,
    :meth:`Operations._defer`) is timed by that thread."""

    def deco(fn):
        @functools.wraps(fn)
        async def handler(self: "Operations", *args):
            self.stats.request(op)
            t0 = time.perf_counter_ns()
            res = None
            try:
                res = await fn(self, *args)
                return res
            except FsError as e:
                if op == "lookup" and e.errno == errno.ENOENT and e.cache_timeout > 0:
                    return _negative(e.cache_timeout)
                raise FUSEError(_failure(self, op, args, e)) from None
            except FUSEError as e:
                _failure(self, op, args, e)
                raise
            except Exception as e:
                raise FUSEError(_failure(self, op, args, e)) from None
            finally:
                if REPLY is None or type(res) is not REPLY:
                    self.stats.done(op, time.perf_counter_ns() - t0)

        return handler

    return deco


class Operations(pyfuse3.Operations):
    """pyfuse3's entry points, delegating to a :class:`Filesystem`."""

    supports_dot_lookup = True
    enable_writeback_cache = False  # (FUSE passthrough would need it off too)
    enable_acl = False

    def __init__(self, fs: Filesystem, offload: Offload | None = None, passthrough: bool = False,
                 inline_reads: bool = True, receive_burst: bool = True, readdir_many: bool = True,
                 readdir_plain: bool = True, deferred_replies: bool = True, receive_spin_us: int = 0):
        super().__init__()
        # read by the patched pyfuse3 at init: these handlers get one more argument, their Reply
        self.deferred_replies = ("write", "flush", "fsync") if deferred_replies and REPLY is not None else ()
        self.receive_burst = RECEIVE_BURST if receive_burst else 0  # read by the patched pyfuse3.main
        self.fs = fs
        self.stats = fs.stats
        self.offload = offload or Offload()
        self.offload.stats = self.stats  # its thread hops, counted (.lakefuse/stats)
        # reads a local file's page cache holds whole: answered on the trio thread (RWF_NOWAIT)
        self.inline_reads = inline_reads
        self.stats.set("inline_reads", "on" if inline_reads else "off")
        self.stats.set("receive_burst", str(self.receive_burst) if OPEN_FLAGS and receive_burst else
                       "off" if OPEN_FLAGS else "unavailable (pyfuse3 without it)")
        # read by the patched pyfuse3.main: how long it reads again for the next request
        self.receive_spin_us = receive_spin_us if RECEIVE_SPIN is not None and self.receive_burst else 0
        if self.receive_spin_us:
            self.stats.probe("receive_spin", functools.partial(_spin_stats, self.receive_spin_us))
        else:
            self.stats.set("receive_spin", "unavailable (pyfuse3 without it)" if RECEIVE_SPIN is None else "off")
        self.log_once = LogOnce(log)
        self._ahead: dict[int, trio.Event] = {}  # directory handle -> its next page being read (readdir)
        # FUSE passthrough: asked for at init when wanted and pyfuse3 has it (the patched build
        # of scripts/setup.sh); in use once the kernel agreed (init)
        has = hasattr(pyfuse3, "passthrough_open")
        self.enable_passthrough = passthrough and has
        self.passthrough = False
        # readdir replies: a page in one call (pyfuse3.readdir_reply_many), or an entry at a time
        self.readdir_many = readdir_many and READDIR_MANY
        # plain READDIR where the kernel asks for it (read by the patched pyfuse3 at init): names and
        # inode numbers, no lookups handed over (only with batched replies)
        self.readdirplus_auto = bool(readdir_plain and READDIR_PLAIN and self.readdir_many)
        self.stats.set("readdir", ("batched" + (", plain where the kernel asks" if self.readdirplus_auto else ""))
                       if self.readdir_many else "per entry" if READDIR_MANY else
                       "per entry (pyfuse3 without readdir_reply_many)")
        if passthrough and has and not _cap_sys_admin():  # (the kernel refuses passthrough opens without it)
            self.enable_passthrough = False
            self.stats.set("passthrough", "off (the daemon lacks CAP_SYS_ADMIN, i.e. is not root: the kernel "
                                          "refuses its passthrough opens)")
        else:
            self.stats.set("passthrough", "off" if not passthrough else
                           "on" if has else "unavailable (pyfuse3 without passthrough)")
        self.stats.set("deferred_replies", "on" if self.deferred_replies else "off" if REPLY is not None else
                       "unavailable (pyfuse3 without Reply)")

    def init(self):
        if self.enable_passthrough:
            self.passthrough = pyfuse3.passthrough_enabled()
            if not self.passthrough:
                self.stats.set("passthrough", "unavailable (the kernel does not offer it)")
        dio_mmap = getattr(pyfuse3, "direct_io_mmap_enabled", None)
        self.fs.dio_mmap = bool(dio_mmap is not None and dio_mmap())
        self.fs.cold_direct_io = self.passthrough and self.fs.dio_mmap
        self.stats.set("cold_direct_io", "on" if self.fs.cold_direct_io else "off")
        self._branch_passthrough_said()
        log.debug("FUSE passthrough: %s", self.stats.get("passthrough"))

    def _branch_passthrough_said(self) -> None:
        """``branch_passthrough`` asked for where there is no passthrough at all: say it is off
        (it said "on" beside "passthrough": "off (the daemon lacks CAP_SYS_ADMIN ...)")."""
        if not (self.enable_passthrough and self.passthrough) and self.stats.get("branch_passthrough") == "on":
            self.stats.set("branch_passthrough", "off (no passthrough: see passthrough)")

    def _passthrough_open(self, ctx, fi: pyfuse3.FileInfo, fd: int) -> bool:
        """Hand the open file's reads to the kernel (reading ``fd``'s file); False when it
        refuses: the daemon serves it, as without passthrough (counted, never an error)."""
        try:
            fi.backing_id = pyfuse3.passthrough_open(ctx, fd)
            fi.keep_cache = False  # the kernel refuses a passthrough open with any flag but direct_io
            return True
        except OSError as e:
            self.stats.add("passthrough_refused")
            if e.errno in (errno.EPERM, errno.EOPNOTSUPP):  # e.g. not CAP_SYS_ADMIN: for every file
                self.passthrough = False
                self.stats.set("passthrough", f"off (the kernel refused: {e.strerror})")
                self._branch_passthrough_said()
            log.debug("passthrough open refused: %s", e)
            return False

    def _count_error(self, code: int) -> None:
        self.stats.error(errno.errorcode.get(code, str(code)))

    async def _meta(self, fn, *args):
        return await self.offload.run(META, fn, *args)

    async def _writing(self, op: str, pool: str, reply, answer, fn, *args):
        """``fn(*args)`` in a worker thread of ``pool`` (SAVE or WRITE): answered by that thread
        when pyfuse3 handed over the request's ``reply`` (:meth:`_defer`), else returned here to
        be answered."""
        if reply is not None:
            return self._defer(op, pool, reply, answer, fn, *args)
        return await self.offload.run(pool, fn, *args)

    def _defer(self, op: str, pool: str, reply, answer, fn, *args):
        """``fn(*args)`` in a worker thread of ``pool``, which answers the request itself
        through ``reply`` (``answer(reply, result)``, or the errno the error boundary gives its
        exception) and times it: returns ``reply`` (pyfuse3 sends nothing more). Nothing is left
        for the trio thread once ``fn`` returns: ``fn`` does all of the request's work."""
        t0 = time.perf_counter_ns()

        def job() -> None:
            try:
                try:
                    res = fn(*args)
                except BaseException as e:  # noqa: BLE001 -- every failure answers (the caller never hangs)
                    reply.error(_failure(self, op, args, e))
                else:
                    answer(reply, res)
            except Exception:  # noqa: BLE001 -- (the answer itself failed: pyfuse3 logged why)
                log.exception("%s: answering failed", op)
            finally:
                self.stats.done(op, time.perf_counter_ns() - t0)

        self.offload.defer(pool, job)
        return reply

    # -- names and attributes -------------------------------------------------------------

    @boundary("lookup")
    async def lookup(self, parent_inode, name, ctx=None):
        log.debug("lookup %d %r", parent_inode, name)
        name = bytes(name)
        attr = self.fs.lookup_fast(parent_inode, name)  # a file of an immutable directory held in memory
        if attr is None:
            if self.fs.lookup_absent(parent_inode, name):  # known without a read (a directory this mount made)
                raise FsError(errno.ENOENT)
            attr = await self._meta(self.fs.lookup, parent_inode, name)
        return _entry(attr)

    async def forget(self, inode_list):
        try:  # must not raise
            self.fs.forget(list(inode_list))
        except Exception:
            log.exception("forget failed")

    @boundary("getattr")
    async def getattr(self, inode, ctx=None):
        attr = self.fs.getattr_fast(inode)
        if attr is None:
            attr = await self._meta(self.fs.getattr, inode)
        return _entry(attr)

    @boundary("readlink")
    async def readlink(self, inode, ctx):
        return await self._meta(self.fs.readlink, inode)

    @boundary("statfs")
    async def statfs(self, ctx):
        s = await self._meta(self.fs.statfs)
        out = pyfuse3.StatvfsData()
        out.f_bsize, out.f_frsize = s.block_size, s.fragment_size
        out.f_blocks, out.f_bfree, out.f_bavail = s.blocks, s.blocks_free, s.blocks_avail
        out.f_files, out.f_ffree, out.f_favail = s.files, s.files_free, s.files_avail
        out.f_namemax = s.name_max
        return out

    # -- directories ---------------------------------------------------------------------

    @boundary("opendir")
    async def opendir(self, inode, ctx):
        fh = self.fs.opendir(inode)
        if OPEN_FLAGS and self.fs.listing_fixed(inode):  # the kernel keeps the listing (readdir once)
            return pyfuse3.FileInfo(fh=fh, keep_cache=True, cache_readdir=True)
        return fh

    @boundary("readdir")
    async def readdir(self, fh, start_id, token):
        # "." and ".." first (the kernel fills in neither for FUSE, and links neither: no
        # lookup to count), then the directory's entries, their offsets shifted past the two
        fs = self.fs
        ahead = self._ahead.get(fh)
        if ahead is not None:  # the next page is being read: wait for it rather than read it twice
            await ahead.wait()
        if start_id < DOTS:
            for i, (name, attr) in enumerate(fs.readdir_dots(fh)[start_id:], start_id + 1):
                if not pyfuse3.readdir_reply(token, name, _entry(attr), i):
                    return
        off = max(start_id - DOTS, 0)
        n = 0
        plus = getattr(token, "plus", True)  # False: a plain READDIR (readdirplus_auto)
        while True:
            entries = fs.readdir_fast(fh, off)
            if entries is None:
                await self._meta(fs.readdir_fill, fh, off)
                entries = fs.readdir_fast(fh, off)
                if entries is None:
                    return
            if not entries:
                return
            if self.readdir_many:
                k = pyfuse3.readdir_fits(token, entries)  # what this reply has room for, accepted
                batch = entries if k == len(entries) else entries[:k]
                if plus:
                    attrs = fs.accept_many(fh, batch) if k else []
                    try:
                        sent = pyfuse3.readdir_reply_many(token, batch, attrs, DOTS, BLKSIZE)
                    except BaseException:  # answered with an error: the kernel takes none of them
                        fs.forget([(a.ino, 1) for a in attrs])
                        raise
                    if sent < k:  # (cannot happen: the room was counted) not handed over: no lookup
                        fs.forget([(a.ino, 1) for a in attrs[sent:]])
                else:  # a plain READDIR: names, numbers and types; nothing handed over to forget
                    sent = pyfuse3.readdir_reply_many(token, batch, fs.numbered(batch), DOTS, BLKSIZE,
                                                      [e.mode or e.attr.mode for e in batch])
                    self.stats.add("readdir_plain_entries", sent)
                if sent:
                    off = batch[sent - 1].offset
                    n += sent
                if sent < len(entries):
                    if fs.readdir_wants_ahead(fh, off, n):
                        self._read_ahead(fh, off, n)  # while the kernel takes in this reply
                    return
                continue
            for e in entries:
                attr = fs.accept(fh, e)
                if not pyfuse3.readdir_reply(token, e.name, _entry(attr), e.offset + DOTS):
                    fs.forget([(attr.ino, 1)])
                    if fs.readdir_wants_ahead(fh, off, n):
                        self._read_ahead(fh, off, n)  # while the kernel takes in this reply
                    return
                off = e.offset
                n += 1

    def _read_ahead(self, fh: int, keep_from: int, n: int) -> None:
        done = self._ahead[fh] = trio.Event()

        async def run():
            try:
                await self.offload.run(META, self.fs.readdir_ahead, fh, keep_from, n)
            except Exception as e:  # the next readdir reads the page itself, and answers its error
                log.debug("readdir ahead of %d: %s", fh, e)
            finally:
                if self._ahead.get(fh) is done:
                    del self._ahead[fh]
                done.set()

        trio.lowlevel.spawn_system_task(run)

    @boundary("releasedir")
    async def releasedir(self, fh):
        self.fs.releasedir(fh)

    @boundary("fsyncdir")
    async def fsyncdir(self, fh, datasync):
        await self.offload.run(WRITE, self.fs.fsyncdir)

    # -- files ---------------------------------------------------------------------------

    @boundary("open")
    async def open(self, inode, flags, ctx):
        # a committed local file the kernel will read itself, opened from the dentry cache: no thread
        o = self.fs.open_fast(inode, flags, True) if self.passthrough else None
        if o is None:
            o = await self._meta(self.fs.open, inode, flags, self.passthrough, ctx.uid)
        fi = pyfuse3.FileInfo(fh=o.fh, keep_cache=o.keep_cache, direct_io=o.direct_io)
        if o.noflush and OPEN_FLAGS:
            fi.noflush = True  # nothing to flush at its close: the kernel sends no FLUSH
        if o.backing_fd >= 0 and self.passthrough and self._passthrough_open(ctx, fi, o.backing_fd):
            self.stats.add("opens_passthrough")
            if self.fs.data_cache is not None:  # a remote store's object: its whole file in the data cache
                self.stats.add("opens_passthrough_cache")
        else:
            if o.backing_fd >= 0:
                self.fs.backings.refused(o.fh)  # the daemon serves it: the inode is in cached mode
            self.stats.add("opens_daemon")
        return fi

    @boundary("read")
    async def read(self, fh, off, size):
        data = self.fs.read_fast(fh, off, size)
        if data is None and self.inline_reads:
            data = self.fs.read_nowait(fh, off, size)
        if data is None:
            pending = self.fs.read_pending(fh, off, size)  # a chunk on its way: wait here, no thread
            if pending is not None:
                await self.offload.wait(pending)
                data = self.fs.read_fast(fh, off, size)
        if data is None:
            data = await self.offload.run(DATA, self.fs.read, fh, off, size)
        return data

    @boundary("flush")
    async def flush(self, fh, reply=None):
        if self.fs.pending(fh):
            pool = BULK if self.fs.bulky(fh, 0) else SAVE  # (see offload.BULK_WRITE_MIN)
            return await self._writing("flush", pool, reply, _ok, self.fs.flush, fh)

    @boundary("fsync")
    async def fsync(self, fh, datasync, reply=None):
        # always: a close saved the file without syncing it (fsync = fdatasync here: what
        # is synced is a new object and its entry, metadata included)
        return await self._writing("fsync", WRITE, reply, _ok, self.fs.fsync, fh)

    @boundary("fallocate")
    async def fallocate(self, fh, mode, offset, length):
        await self.offload.run(SAVE, self.fs.fallocate, fh, mode, offset, length)

    @boundary("release")
    async def release(self, fh):
        if self.fs.release_pending(fh):  # a control request to run, a spool file to save
            await self.offload.run(WRITE, self.fs.release, fh)
        else:
            self.fs.release(fh)  # closes a descriptor or drops buffers: nothing that waits

    # -- extended attributes -------------------------------------------------------------

    @boundary("getxattr")
    async def getxattr(self, inode, name, ctx):
        name = bytes(name)
        # e.g. security.capability, asked before every write: refused here, no thread needed
        self.fs.check_xattr_name(name)
        return await self._meta(self.fs.getxattr, inode, name)

    @boundary("listxattr")
    async def listxattr(self, inode, ctx):
        return await self._meta(self.fs.listxattr, inode)

    # -- writes: branch trees are writable, every other tree answers EROFS (the core decides) --

    @staticmethod
    def _caller(ctx) -> Caller:
        return Caller(uid=ctx.uid, gid=ctx.gid, umask=ctx.umask)

    @boundary("setattr")
    async def setattr(self, inode, attr, fields, fh, ctx):
        log.debug("setattr %d", inode)
        mtime = None
        if fields.update_mtime:
            mtime = attr.st_mtime_ns
        changes = SetAttr(
            mode=attr.st_mode if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            size=attr.st_size if fields.update_size else None,
            mtime_ns=mtime,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
        )
        if changes == SetAttr():  # ctime only: nothing is kept for it
            self.fs.check_writable(inode)
            return _entry(await self._meta(self.fs.getattr, inode))
        attr = self.fs.setattr_fast(inode, changes)  # a file open for writing: into its spool file
        if attr is not None:
            return _entry(attr)
        return _entry(await self.offload.run(DATA, self.fs.setattr, inode, changes, fh))

    @boundary("setxattr")
    async def setxattr(self, inode, name, value, ctx):
        # pyfuse3 passes no flags: it checks XATTR_CREATE / XATTR_REPLACE with a getxattr first
        await self.offload.run(DATA, self.fs.setxattr, inode, bytes(name), bytes(value))

    @boundary("removexattr")
    async def removexattr(self, inode, name, ctx):
        await self.offload.run(DATA, self.fs.removexattr, inode, bytes(name))

    @boundary("mknod")
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        return _entry(await self.offload.run(DATA, self.fs.mknod, parent_inode, bytes(name), mode,
                                             self._caller(ctx), rdev))

    @boundary("mkdir")
    async def mkdir(self, parent_inode, name, mode, ctx):
        log.debug("mkdir %d %r", parent_inode, name)
        return _entry(await self._meta(self.fs.mkdir, parent_inode, bytes(name), mode, self._caller(ctx)))

    @boundary("unlink")
    async def unlink(self, parent_inode, name, ctx):
        log.debug("unlink %d %r", parent_inode, name)
        await self._meta(self.fs.unlink, parent_inode, bytes(name))

    @boundary("rmdir")
    async def rmdir(self, parent_inode, name, ctx):
        log.debug("rmdir %d %r", parent_inode, name)
        await self._meta(self.fs.rmdir, parent_inode, bytes(name))

    @boundary("symlink")
    async def symlink(self, parent_inode, name, target, ctx):
        log.debug("symlink %d %r", parent_inode, name)
        return _entry(await self._meta(self.fs.symlink, parent_inode, bytes(name), bytes(target), self._caller(ctx)))

    @boundary("rename")
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        log.debug("rename %d %r -> %d %r (%#x)", parent_inode_old, name_old, parent_inode_new, name_new, flags)
        await self._meta(self.fs.rename, parent_inode_old, bytes(name_old), parent_inode_new, bytes(name_new), flags)

    @boundary("link")
    async def link(self, inode, new_parent_inode, new_name, ctx):
        return _entry(self.fs.link(inode, new_parent_inode, bytes(new_name)))

    @boundary("create")
    async def create(self, parent_inode, name, mode, flags, ctx):
        log.debug("create %d %r", parent_inode, name)
        got = self.fs.create(parent_inode, bytes(name), mode, flags, self._caller(ctx), True)  # no thread if no I/O
        o, attr = got or await self._meta(self.fs.create, parent_inode, bytes(name), mode, flags, self._caller(ctx))
        return pyfuse3.FileInfo(fh=o.fh, keep_cache=o.keep_cache, direct_io=o.direct_io), _entry(attr)

    @boundary("write")
    async def write(self, fh, off, buf, reply=None):
        pool = BULK if self.fs.bulky(fh, len(buf)) else SAVE  # (see offload.BULK_WRITE_MIN)
        return await self._writing("write", pool, reply, _written, self.fs.write, fh, off, bytes(buf))


def _cap_sys_admin() -> bool:
    """Whether this process has CAP_SYS_ADMIN (bit 21 of its effective capabilities), which the
    kernel asks of a FUSE server's passthrough open; True when it cannot tell (the open says)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 21 & 1)
    except (OSError, ValueError, IndexError):
        pass
    return True


def _spin_stats(us: int) -> dict:
    caught, expired, seconds = RECEIVE_SPIN()
    return {"us": us, "caught": caught, "expired": expired, "seconds": round(seconds, 3)}


def _ok(reply, _result) -> None:
    reply.ok()


def _written(reply, size: int) -> None:
    reply.write(size)

__all__ = ["Operations"]
