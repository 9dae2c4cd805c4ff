"""Object store on a local directory.

Each object is a regular file at ``<root>/<key>``.  Writes go to a hidden temp
file in the destination directory (``.lakefuse-tmp-<uuid hex>``), are fsynced
and then renamed over the destination with ``os.replace``, so readers -- in this
process or another one -- see the old content or the new content, never a part.
Listings skip those temp files.

ETag: the hex MD5 of the content.  ``put``/``put_file`` compute it while
writing and keep it in an extended attribute together with the file's size and
mtime (``trusted.lakefuse.md5`` as root, else ``user.lakefuse.md5`` on the user's own
files only: :func:`_memo_xattr`); ``head``/``list`` read it back from there and
hash the file again only when the attribute is missing or stale (a file placed
or modified behind the store's back, or a filesystem without such xattrs).

Limits of a directory tree compared with S3: the store cannot hold both an
object ``a`` and an object ``a/b`` (``InvalidArgument``); a path segment may not
be longer than 255 bytes; symlinks are followed by ``get`` but not listed.
Deleting the last object of a directory removes the empty directories above it.
"""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import logging
import os
import re
import stat
import threading
import uuid
from typing import Callable, Iterator

from graveler.errors import GravelerError, InvalidArgument, NoSpace, NotFound, StoreUnavailable
from graveler.objstore import sparse
from graveler.objstore.base import (
    MAP_MIN_BYTES,
    Fingerprint,
    file_fingerprint,
    map_file,
    open_file_path,
    ObjectInfo,
    ObjectReader,
    ObjectStore,
    check_level_prefix,
    check_range,
    validate_key,
    validate_prefix,
)
from graveler.objstore.cached_open import open_cached
from graveler.objstore.uri import FILE, StorageURI

log = logging.getLogger(__name__)

TMP_PREFIX = ".lakefuse-tmp-"
_TMP_NAME = re.compile(r"\.lakefuse-tmp-[0-9a-f]{32}\Z")
ETAG_XATTR = "user.lakefuse.md5"
# as root, the MD5 memo goes where only root may write it: a user's own file's ``user.*``
# attributes are that user's to set, and a forged memo would pass changed bytes as checked
TRUSTED_ETAG_XATTR = "trusted.lakefuse.md5"
_CHUNK = 1 << 20
_NAME_MAX = 255
# a key of segments of letters, digits, '_' and '-' (at most _NAME_MAX each): valid (validate_key), no
# temp name, each segment short enough; what the store's own object names look like (``data/...``)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,255}(?:/[A-Za-z0-9_-]{1,255})*\Z")
# A concurrent delete may prune a directory between our mkdir and our create.
_CREATE_ATTEMPTS = 8
_UMASK = os.umask(0o022)  # read once, at import (reading it means setting it)
os.umask(_UMASK)
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: never hang on a FIFO
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _memo_xattr(st: os.stat_result) -> str | None:
    """Where the MD5 memo of a file (its size, mtime and MD5) is kept and trusted: as root in
    ``trusted.*`` (only root writes it); otherwise in ``user.*``, and only on this user's own
    files (another user could set it on theirs to vouch for changed bytes): None, hash again."""
    euid = os.geteuid()
    if euid == 0:
        return TRUSTED_ETAG_XATTR
    return ETAG_XATTR if st.st_uid == euid else None


def _md5():
    return hashlib.md5(usedforsecurity=False)


_flushers: concurrent.futures.ThreadPoolExecutor | None = None
_flushers_lock = threading.Lock()


def _flush_soon(fn, *args) -> concurrent.futures.Future:
    """``fn(*args)`` (a flush) in one of a few threads kept for it, started at once: a thread
    made per flush cost about twice the hand-off, on every fsync of a file through the mount."""
    global _flushers
    with _flushers_lock:
        if _flushers is None:
            _flushers = concurrent.futures.ThreadPoolExecutor(8, "graveler-fsync")
        return _flushers.submit(fn, *args)


def _forget_flushers() -> None:
    global _flushers, _flushers_lock
    _flushers, _flushers_lock = None, threading.Lock()  # a forked child has none of the threads


os.register_at_fork(after_in_child=_forget_flushers)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    """Up to ``length`` bytes at ``offset``; short only at end of file."""
    parts = []
    while length > 0:
        chunk = os.pread(fd, min(length, 1 << 30), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(parts)


_libc = None


def _syncfs(fd: int) -> None:
    """syncfs(2) of the filesystem holding ``fd`` (os.sync() where libc has no syncfs)."""
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(_libc, "syncfs", None)
    if fn is None:
        os.sync()
        return
    if fn(fd) != 0:
        import ctypes

        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _check_root(root: str) -> None:
    """InvalidArgument when ``root``, or the nearest of its ancestors that exists, is no directory
    (a root under a file could never be made); StoreUnavailable when it cannot be looked at."""
    p = root
    while True:
        try:
            st = os.stat(p)
        except (FileNotFoundError, NotADirectoryError):  # (not there, or below a file: look higher)
            if os.path.islink(p):  # a link to nothing: no directory can be made through it
                raise InvalidArgument(f"local store root {root!r}: {p!r} is a symbolic link to nothing") from None
            parent = os.path.dirname(p)
            if parent == p:
                return
            p = parent
            continue
        except OSError as exc:
            raise StoreUnavailable(f"cannot reach local store root {root!r}: {exc.strerror or exc}") from exc
        if not stat.S_ISDIR(st.st_mode):
            where = "exists" if p == root else f"is below {p!r}, which exists"
            raise InvalidArgument(f"local store root {root!r} {where} and is not a directory")
        return


class LocalStore(ObjectStore):
    """An ``ObjectStore`` rooted at a local directory, made by the first write that needs it:
    opening a store only to read (a refs dump's, a restore's) leaves no directory behind."""

    # set when this process reads the store for a repository of another user: every file it
    # opens to read is checked readable by that user (graveler.objstore.readfor)
    read_for = None

    def __init__(self, root: str):
        if not isinstance(root, str) or not os.path.isabs(root):
            raise InvalidArgument(f"a local store root must be an absolute path, not {root!r}")
        self.root = os.path.abspath(root)
        self._root_slash = os.path.join(self.root, "")  # _path's: root + key
        _check_root(self.root)
        self._root_uri = StorageURI(FILE, "", self.root)
        self.uri = str(self._root_uri)

    # -- paths and errors ---------------------------------------------------------------

    def full_uri(self, key: str) -> str:
        validate_key(key)
        return self._root_uri.object_uri(key)

    def _path(self, key: str) -> str:
        if _PLAIN_KEY.match(key):  # the store's own object names (every open): valid by their form
            return self._root_slash + key
        validate_key(key)
        for segment in key.split("/"):
            if len(os.fsencode(segment)) > _NAME_MAX:
                raise InvalidArgument(
                    f"object key {key!r} has a path segment longer than {_NAME_MAX} bytes, "
                    "which a local directory cannot hold"
                )
            if _TMP_NAME.match(segment):
                raise InvalidArgument(f"object key {key!r} uses a name reserved for the local store's temp files")
        return os.path.join(self.root, key)

    def _conflict(self, key: str) -> InvalidArgument:
        return InvalidArgument(
            f"object key {key!r} conflicts with an existing object or directory in {self.uri} "
            "(a local store cannot hold both 'x' and 'x/y')"
        )

    def _os_error(self, op: str, key: str, exc: OSError, *, writing: bool = False) -> GravelerError:
        if isinstance(exc, (NotADirectoryError, IsADirectoryError)):
            return self._conflict(key) if writing else NotFound(f"{self.full_uri(key)} not found")
        if isinstance(exc, FileNotFoundError) and not writing:
            return NotFound(f"{self.full_uri(key)} not found")
        if isinstance(exc, PermissionError):
            return StoreUnavailable(f"{op} {self.full_uri(key)}: permission denied")
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # (ENOSPC to a writer through the mount, not EIO)
            return NoSpace(f"{op} {self.full_uri(key)}: the store's disk is full ({exc.strerror or exc})")
        return StoreUnavailable(f"{op} {self.full_uri(key)} failed: {exc.strerror or exc}")

    def _open_regular(self, op: str, key: str) -> tuple[int, os.stat_result]:
        """An O_RDONLY descriptor on the object's file and its stat; NotFound unless a regular file."""
        path = self._path(key)
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError as exc:
            raise self._os_error(op, key, exc) from exc
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise self._os_error(op, key, exc) from exc
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NotFound(f"{self.full_uri(key)} not found (not a regular file)")
        if self.read_for is not None:
            try:
                self.read_for.check(fd, st, self.full_uri(key))
            except BaseException:
                os.close(fd)
                raise
        return fd, st

    # -- etags -----------------------------------------------------------------------------

    @staticmethod
    def _remember_etag(fd: int, st: os.stat_result, etag: str) -> None:
        name = _memo_xattr(st)
        if name is None:
            return
        try:
            os.setxattr(fd, name, f"{st.st_size}:{st.st_mtime_ns}:{etag}".encode("ascii"))
        except OSError as exc:  # no such xattrs here, or no write permission: hash again next time
            log.debug("cannot keep the etag in an xattr: %s", exc)

    @staticmethod
    def _known_etag(fd: int, st: os.stat_result) -> str | None:
        name = _memo_xattr(st)
        if name is None:
            return None
        try:
            raw = os.getxattr(fd, name)
        except OSError:
            return None
        parts = raw.decode("ascii", "replace").split(":")
        if len(parts) == 3 and parts[0] == str(st.st_size) and parts[1] == str(st.st_mtime_ns):
            return parts[2]
        return None

    def _etag(self, fd: int, st: os.stat_result) -> str:
        etag = self._known_etag(fd, st)
        if etag is None:
            h = _md5()
            offset = 0
            while chunk := os.pread(fd, _CHUNK, offset):
                h.update(chunk)
                offset += len(chunk)
            etag = h.hexdigest()
            self._remember_etag(fd, st, etag)
        return etag

    # -- reads -----------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        fd, st = self._open_regular("get", key)
        try:
            with open(fd, "rb", closefd=False) as f:
                return f.read()
        except OSError as exc:
            raise self._os_error("get", key, exc) from exc
        finally:
            os.close(fd)

    def get_mapped(self, key: str, min_size: int = MAP_MIN_BYTES):
        return self.get_immutable(key, min_size)[0]

    def get_immutable(self, key: str, min_size: int = MAP_MIN_BYTES) -> tuple[object, Fingerprint]:
        fd, st = self._open_regular("get", key)
        try:
            if st.st_size < min_size:
                with open(fd, "rb", closefd=False) as f:
                    data = f.read()
            else:
                data = map_file(fd, st.st_size)
            fp = file_fingerprint(st)
            # changed while we read it (written in place): no fingerprint, so nothing remembered vouches for it
            return data, fp if file_fingerprint(os.fstat(fd)) == fp else None
        except (OSError, ValueError) as exc:
            raise self._os_error("get", key, exc if isinstance(exc, OSError) else OSError(str(exc))) from exc
        finally:
            os.close(fd)

    def fingerprint(self, key: str) -> Fingerprint | None:
        try:
            return file_fingerprint(os.stat(self._path(key)))
        except OSError:
            return None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_range(start, length)
        fd, _ = self._open_regular("get_range", key)
        try:
            return _pread_exact(fd, length, start)
        except OSError as exc:
            raise self._os_error("get_range", key, exc) from exc
        finally:
            os.close(fd)

    def open_reader(self, key: str) -> "LocalReader":
        """A read handle that keeps the object's file open: every read is one ``pread``."""
        fd, st = self._open_regular("open", key)
        return LocalReader(self, key, fd, st.st_size)

    def open_reader_cached(self, key: str) -> "LocalReader | None":
        """:meth:`open_reader` when the object's file opens from the kernel's dentry cache
        alone (never waits for the disk: :func:`graveler.objstore.cached_open.open_cached`),
        else None: then :meth:`open_reader`, which may wait and says what is wrong."""
        fd = open_cached(self._path(key), _READ_FLAGS)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return None
        if not stat.S_ISREG(st.st_mode) or self.read_for is not None:  # (then open_reader checks it)
            os.close(fd)
            return None
        return LocalReader(self, key, fd, st.st_size)

    def get_range_sized(self, key: str, start: int, length: int) -> tuple[bytes, int]:
        check_range(start, length)
        fd, st = self._open_regular("get_range", key)
        try:
            return _pread_exact(fd, length, start), st.st_size
        except OSError as exc:
            raise self._os_error("get_range", key, exc) from exc
        finally:
            os.close(fd)

    def head(self, key: str) -> ObjectInfo:
        fd, st = self._open_regular("head", key)
        try:
            return ObjectInfo(key, st.st_size, st.st_mtime, self._etag(fd, st))
        except OSError as exc:
            raise self._os_error("head", key, exc) from exc
        finally:
            os.close(fd)

    def get_to_file(self, key: str, path: str) -> ObjectInfo:
        fd, st = self._open_regular("get_to_file", key)
        try:
            dest = os.path.abspath(path)
            tmp = os.path.join(os.path.dirname(dest), TMP_PREFIX + uuid.uuid4().hex)
            try:
                out = os.open(tmp, _CREATE_FLAGS, 0o666)
            except OSError as exc:
                raise InvalidArgument(f"cannot write destination file {path!r}: {exc.strerror or exc}") from exc
            try:
                try:
                    etag = self._known_etag(fd, st)
                    if etag is None:
                        h = _md5()
                        offset = 0
                        while chunk := os.pread(fd, _CHUNK, offset):
                            h.update(chunk)
                            _write_all(out, chunk)
                            offset += len(chunk)
                        etag = h.hexdigest()
                        self._remember_etag(fd, st, etag)
                    else:
                        sparse.copy_sparse(fd, out, st.st_size)  # (in the kernel where it can; holes kept)
                finally:
                    os.close(out)
                os.replace(tmp, dest)
            except BaseException as exc:
                _unlink_quietly(tmp)
                if isinstance(exc, OSError):
                    raise self._os_error("get_to_file", key, exc) from exc
                raise
            return ObjectInfo(key, st.st_size, st.st_mtime, etag)
        finally:
            os.close(fd)

    # -- writes ----------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> ObjectInfo:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"object data must be bytes-like, not {type(data).__name__}")
        path = self._path(key)

        def fill(fd: int) -> str:
            _write_all(fd, data)
            return hashlib.md5(data, usedforsecurity=False).hexdigest()

        return self._write_atomic(key, path, fill)

    def put_immutable(self, key: str, data) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"object data must be bytes-like, not {type(data).__name__}")

        def fill(fd: int) -> None:
            _write_all(fd, data)  # no MD5 now: head/list hash the file the first time they need its etag

        self._write_atomic(key, self._path(key), fill)

    def put_file(self, key: str, path: str, md5: str | None = None) -> ObjectInfo:
        dest = self._path(key)  # (md5 unused: the copy hashes what it writes)
        try:
            src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidArgument(f"cannot read source file {path!r}: {exc.strerror or exc}") from exc
        try:

            def fill(fd: int) -> str:
                h = _md5()
                off = 0
                while chunk := os.read(src, sparse.CHUNK):
                    h.update(chunk)
                    sparse.pwrite_sparse(fd, chunk, off)  # (runs of zeros stay holes: a sparse file stays sparse)
                    off += len(chunk)
                os.ftruncate(fd, off)
                return h.hexdigest()

            return self._write_atomic(key, dest, fill)
        finally:
            os.close(src)

    def adopt_file(self, key: str, path: str, etag: str | None = None, durable: bool = True,
                   fd: int | None = None) -> ObjectInfo:
        """Make the local file ``path`` the object ``key`` without copying it: it is
        hard-linked into place, then fsynced, then its new directory entry is fsynced,
        so the object and ``path`` are one inode, durable when this returns. (Linking
        before the fsync lets one journal commit carry both on ext4; until this returns
        nothing refers to the new address, so a crash in between leaves at most an
        unreferenced object.) ``durable=False``: no fsync -- the object is complete and
        visible (it survives the death of this process: it is in the page cache) but a
        power loss before :meth:`sync_object` or :meth:`sync` may lose it, as a file
        closed without fsync on the same filesystem. The caller hands the file over: it
        must never write to it again (it unlinks ``path`` once the object is
        referenced). ``etag``: the MD5 the caller computed while writing (hashed here in
        one read pass if None). Falls back to a copy (:meth:`put_file`, durable) when
        ``path`` is on another filesystem or the filesystem has no hard links. ``fd``: a
        descriptor of ``path`` the caller has open (used instead of opening it again, and
        left open)."""
        dest = self._path(key)
        directory = os.path.dirname(dest)
        own = fd is None
        if own:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise InvalidArgument(f"cannot read source file {path!r}: {exc.strerror or exc}") from exc
        try:
            try:
                st = os.fstat(fd)
                if etag is None:
                    etag = self._etag(fd, st)
                else:
                    self._remember_etag(fd, st, etag)
                os.fchmod(fd, 0o666 & ~_UMASK)  # the mode a put gives its objects
            except OSError as exc:
                raise self._os_error("put", key, exc, writing=True) from exc
            for attempt in range(_CREATE_ATTEMPTS):
                try:
                    if attempt:  # the first try links into the directory as it is (usually there)
                        os.makedirs(directory, exist_ok=True)
                    os.link(path, dest)
                    break
                except FileNotFoundError:
                    if not os.path.exists(path):
                        if not own:  # its name is gone (its directory removed), the open file is not: copy that
                            log.warning("adopt %s: %s is gone; copying the file from its descriptor", key, path)
                            return self.put_file(key, open_file_path(path, fd))
                        raise InvalidArgument(f"source file {path!r} vanished") from None
                    continue  # no directory yet (or a concurrent delete pruned it): make it
                except FileExistsError as exc:
                    raise self._conflict(key) from exc
                except OSError as exc:
                    if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                        log.debug("adopt %s: cannot link %s (%s); copying", key, path, exc.strerror)
                        return self.put_file(key, path)
                    raise self._os_error("put", key, exc, writing=True) from exc
            else:
                raise StoreUnavailable(f"put {self.full_uri(key)}: directory {directory!r} keeps disappearing")
            if durable:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    _unlink_quietly(dest)
                    raise self._os_error("put", key, exc, writing=True) from exc
        finally:
            if own:
                os.close(fd)
        if durable:
            self._fsync_dir(key, directory)
        log.debug("adopted %s (%d bytes) from %s", key, st.st_size, path)
        return ObjectInfo(key, st.st_size, st.st_mtime, etag)

    def sync_object(self, key: str) -> None:
        """fsync the object's file and its directory (see :meth:`adopt_file`); NotFound if absent."""
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise NotFound(f"{self.full_uri(key)} not found") from None
        except OSError as exc:
            raise self._os_error("sync", key, exc, writing=True) from exc
        # the file and its directory (its name) flushed at once: two flushes in the time of one
        dir_synced = _flush_soon(self._fsync_dir, key, os.path.dirname(path))
        try:
            os.fsync(fd)
        except OSError as exc:
            raise self._os_error("sync", key, exc, writing=True) from exc
        finally:
            os.close(fd)
            concurrent.futures.wait([dir_synced])
        dir_synced.result()

    def sync(self) -> None:
        """``syncfs(2)`` of the filesystem holding the store: every object on it is durable
        after this, whichever process adopted it without an fsync (one call, not one fsync
        per object; it also flushes whatever else is dirty on that filesystem)."""
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
        except FileNotFoundError:
            return  # (nothing was ever written here)
        except OSError as exc:
            raise self._os_error("sync", "", exc, writing=True) from exc
        try:
            _syncfs(fd)
        except OSError as exc:
            raise self._os_error("sync", "", exc, writing=True) from exc
        finally:
            os.close(fd)

    def _create_tmp(self, key: str, directory: str) -> tuple[int, str]:
        for _ in range(_CREATE_ATTEMPTS):
            tmp = os.path.join(directory, TMP_PREFIX + uuid.uuid4().hex)
            try:
                os.makedirs(directory, exist_ok=True)
                return os.open(tmp, _CREATE_FLAGS, 0o666), tmp
            except FileNotFoundError:
                continue  # a concurrent delete pruned the directory; make it again
            except (FileExistsError, NotADirectoryError) as exc:
                # makedirs also says "exists" when a concurrent delete removes the directory between
                # its mkdir and its isdir check: a conflict only if a path component is a file.
                if self._file_in_path(directory):
                    raise self._conflict(key) from exc
                continue
            except OSError as exc:
                raise self._os_error("put", key, exc, writing=True) from exc
        raise StoreUnavailable(f"put {self.full_uri(key)}: directory {directory!r} keeps disappearing")

    def _file_in_path(self, directory: str) -> bool:
        """Whether ``directory`` or one of its parents below the root exists as a non-directory."""
        while len(directory) > len(self.root):
            if os.path.lexists(directory) and not os.path.isdir(directory):
                return True
            directory = os.path.dirname(directory)
        return False

    def _write_atomic(self, key: str, path: str, fill: Callable[[int], str | None]) -> ObjectInfo:
        directory = os.path.dirname(path)
        fd, tmp = self._create_tmp(key, directory)
        try:
            try:
                etag = fill(fd)
                st = os.fstat(fd)
                if etag is not None:
                    self._remember_etag(fd, st, etag)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException as exc:
            _unlink_quietly(tmp)
            if isinstance(exc, OSError):
                raise self._os_error("put", key, exc, writing=True) from exc
            raise
        self._fsync_dir(key, directory)
        log.debug("put %s (%d bytes)", key, st.st_size)
        return ObjectInfo(key, st.st_size, st.st_mtime, etag)

    def _fsync_dir(self, key: str, directory: str) -> None:
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            raise self._os_error("put", key, exc, writing=True) from exc

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return  # no such object ("key" may name a directory of other objects)
        except OSError as exc:
            if os.path.isdir(path):
                return
            raise self._os_error("delete", key, exc, writing=True) from exc
        log.debug("deleted %s", key)
        directory = os.path.dirname(path)
        while len(directory) > len(self.root):
            try:
                os.rmdir(directory)  # fails (and stops here) unless empty
            except OSError:
                return
            directory = os.path.dirname(directory)

    # -- listing ---------------------------------------------------------------------------

    def list(self, prefix: str = "", start_after: str = "") -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        validate_prefix(start_after, "start_after")
        return self._list(prefix, start_after)

    def list_level(self, prefix: str = "") -> tuple[list[ObjectInfo], list[str]]:
        check_level_prefix(prefix)
        if prefix and any(s in (".", "..") or _TMP_NAME.match(s) for s in prefix[:-1].split("/")):
            return [], []
        directory = os.path.join(self.root, prefix) if prefix else self.root
        files: list[str] = []
        subs: list[str] = []
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    name = entry.name
                    if _TMP_NAME.match(name):
                        continue
                    try:
                        name.encode("utf-8")
                    except UnicodeEncodeError:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        subs.append(prefix + name + "/")
                    elif entry.is_file(follow_symlinks=False):
                        files.append(prefix + name)
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        except OSError as exc:
            raise StoreUnavailable(f"cannot list {directory!r}: {exc.strerror or exc}") from exc
        objs = []
        for name in sorted(files):
            try:
                objs.append(self.head(name))
            except NotFound:
                continue  # deleted while we listed
        return objs, sorted(subs)

    def _list(self, prefix: str, start_after: str) -> Iterator[ObjectInfo]:
        base = prefix.rpartition("/")[0]  # the directory part of the prefix, if any
        if base:
            if any(s in ("", ".", "..") or _TMP_NAME.match(s) for s in base.split("/")):
                return  # no valid key lives there
            yield from self._walk(base + "/", prefix, start_after)
        else:
            yield from self._walk("", prefix, start_after)

    def _walk(self, rel: str, prefix: str, start_after: str) -> Iterator[ObjectInfo]:
        """Objects under directory ``rel`` ("" or "a/b/"), in key order.

        A directory "d" sorts as "d/": every key below it starts with "d/", so
        comparing "d/" with the file names beside it gives S3's order of the keys.
        """
        directory = os.path.join(self.root, rel) if rel else self.root
        try:
            with os.scandir(directory) as it:
                entries = []
                for entry in it:
                    name = entry.name
                    if _TMP_NAME.match(name):
                        continue
                    try:
                        name.encode("utf-8")
                    except UnicodeEncodeError:
                        continue  # not UTF-8: cannot be a key
                    if entry.is_dir(follow_symlinks=False):
                        entries.append((rel + name + "/", True))
                    elif entry.is_file(follow_symlinks=False):
                        entries.append((rel + name, False))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise StoreUnavailable(f"cannot list {directory!r}: {exc.strerror or exc}") from exc
        entries.sort()
        for name, is_dir in entries:
            if is_dir:
                if not (name.startswith(prefix) or prefix.startswith(name)):
                    if name > prefix:
                        return  # past every key with this prefix
                    continue
                if start_after >= name and not start_after.startswith(name):
                    continue  # every key below sorts before start_after
                yield from self._walk(name, prefix, start_after)
            else:
                if not name.startswith(prefix):
                    if name > prefix:
                        return
                    continue
                if name <= start_after:
                    continue
                try:
                    yield self.head(name)
                except NotFound:
                    continue  # deleted while we listed


class LocalReader(ObjectReader):
    """An open descriptor on a local object's file (no copy through any cache)."""

    def etag(self) -> str:
        """The MD5 of the file as it is now: the one remembered for its size and mtime, else
        hashed (and remembered). Blocking."""
        try:
            return self.store._etag(self._fd, os.fstat(self._fd))
        except OSError as exc:
            raise self.store._os_error("etag", self.key, exc) from exc

    def __init__(self, store: LocalStore, key: str, fd: int, size: int):
        super().__init__(store, key, size)
        self._fd = fd

    def read(self, offset: int, length: int) -> bytes:
        check_range(offset, length)
        fd = self._fd
        if fd < 0:
            raise InvalidArgument(f"read of {self.key!r} after close")
        try:
            data = os.pread(fd, length, offset)  # one call, no copy, in the usual case
            if len(data) == length or not data:
                return data
            return data + _pread_exact(fd, length - len(data), offset + len(data))
        except OSError as exc:
            raise self.store._os_error("read", self.key, exc) from exc

    def fileno(self) -> int:
        """The descriptor of the object's file (opened read-only; -1 after close), for a
        caller that hands the file itself to someone else (the kernel, through FUSE
        passthrough). It stays the reader's: :meth:`close` closes it."""
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
