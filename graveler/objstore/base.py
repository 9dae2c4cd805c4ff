"""The object-store interface of graveler, its value types and its configuration.

An ``ObjectStore`` is a flat namespace of immutable-by-convention byte objects
under one root (a local directory or an S3 bucket and prefix).  Keys are
"/"-separated paths relative to that root; ``validate_key`` is the one place
that says what a key may look like, so every backend rejects the same inputs.

Only the modules of this package talk to boto3 or to the filesystem on behalf
of graveler; every error from underneath is wrapped into ``graveler.errors``
where it enters.
"""

from __future__ import annotations

import abc
import functools
import grp
import os
import pwd
import stat
import uuid
from dataclasses import dataclass
from typing import Iterator

from graveler.config import S3_MIN_PART_SIZE, MiB, StoreConfig  # noqa: F401 (re-exported)
from graveler.errors import GravelerError, InvalidArgument, NotFound, StoreUnavailable



@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store knows about one object.

    ``etag`` identifies the content:
      * S3: the ETag without its quotes (hex MD5 for single-part uploads,
        ``<md5-of-part-md5s>-<parts>`` for multipart uploads);
      * local: the hex MD5 of the content, whatever the size.
    """

    key: str  # relative to the store root
    size: int
    mtime: float  # unix seconds
    etag: str


PROBE_PREFIX = "_lakefs/namespace-probe-"


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise ``InvalidArgument``.

    A key is a non-empty "/"-separated relative path: no leading "/", no empty
    segment (so no "//" and no trailing "/"), no "." or ".." segment, no NUL,
    and encodable as UTF-8 (S3 keys are UTF-8).
    """
    if not isinstance(key, str):
        raise InvalidArgument(f"object key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidArgument("object key is empty")
    if "\x00" in key:
        raise InvalidArgument(f"object key {key!r} contains a NUL byte")
    if key.startswith("/"):
        raise InvalidArgument(f"object key {key!r} starts with '/'; keys are relative to the store root")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"object key {key!r} is not valid Unicode (lone surrogate)") from exc
    for segment in key.split("/"):
        if segment == "":
            raise InvalidArgument(f"object key {key!r} has an empty path segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise InvalidArgument(f"object key {key!r} has a {segment!r} path segment")
    return key


def validate_prefix(prefix: str, what: str = "prefix") -> str:
    """Check a listing prefix or start_after value: any string that a key could start with."""
    if not isinstance(prefix, str):
        raise InvalidArgument(f"{what} must be a str, not {type(prefix).__name__}")
    if "\x00" in prefix:
        raise InvalidArgument(f"{what} {prefix!r} contains a NUL byte")
    if prefix.startswith("/"):
        raise InvalidArgument(f"{what} {prefix!r} starts with '/'; keys are relative to the store root")
    return prefix


def check_level_prefix(prefix: str) -> str:
    """A ``list_level`` prefix: ``""`` or a valid key prefix ending in ``/``."""
    validate_prefix(prefix)
    if prefix and (not prefix.endswith("/") or "//" in prefix):
        raise InvalidArgument(f"level prefix {prefix!r} must be empty or end in a single '/'")
    return prefix


def check_range(start: int, length: int) -> None:
    if start < 0 or length < 0:
        raise InvalidArgument(f"bad byte range: start={start} length={length} (both must be >= 0)")


class ObjectReader:
    """A read handle on one object, for many positional reads (``read(offset, length)``).

    The default reads each range from the store; a backend may keep a descriptor
    open (local) or read ahead (S3). ``size`` is the object's size when opened.
    Thread-safe: reads may run in parallel.
    """

    def __init__(self, store: "ObjectStore", key: str, size: int):
        self.store = store
        self.key = key
        self.size = size

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (shorter only at the end of the object)."""
        check_range(offset, length)
        if offset >= self.size or length == 0:
            return b""
        return self.store.get_range(self.key, offset, min(length, self.size - offset))

    def close(self) -> None:
        """Release what the handle keeps; reads afterwards are not allowed."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ObjectStream:
    """A sequential read of ``length`` bytes of one object from ``start`` (:meth:`ObjectStore.open_stream`).

    ``total`` is the object's size when the stream was opened (from the same request where
    the store can tell it), so a reader checks the object against its entry before it uses
    a byte. :meth:`read` returns up to ``n`` bytes, ``b""`` at the end of the range (or of the
    object, if it ends first). This default reads the range in pieces with
    :meth:`ObjectStore.get_range_sized`; S3 keeps one GET open for the whole range.
    """

    def __init__(self, store: "ObjectStore", key: str, start: int, length: int, piece: int = 8 << 20):
        check_range(start, length)
        self.store, self.key, self._pos, self._end, self._piece = store, key, start, start + length, piece
        self._buf = b""
        first = min(length, piece)
        data, self.total = store.get_range_sized(key, start, first) if first else (b"", store.head(key).size)
        self._buf = data
        self._pos += len(data)
        if len(data) < first:
            self._end = self._pos  # the object ends inside the range

    def read(self, n: int) -> bytes:
        if self._buf:
            data, self._buf = self._buf[:n], self._buf[n:]
            return data
        if self._pos >= self._end or n <= 0:
            return b""
        want = min(n, self._end - self._pos)
        data = self.store.get_range(self.key, self._pos, want)
        self._pos += len(data)
        if len(data) < want:
            self._end = self._pos
        return data

    def readinto(self, buf) -> int:
        """:meth:`read` into ``buf`` (a writable buffer): how many bytes, 0 at the end. A store
        whose stream can receive into the caller's buffer directly overrides it."""
        view = memoryview(buf)
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        """Let go of the request (a stream may be closed before its end)."""
        self._buf = b""
        self._end = self._pos

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Below this size an object is read into memory rather than mapped: a mapping keeps a file descriptor
# open (Python's mmap duplicates it), and small files cost little memory.
MAP_MIN_BYTES = 4 << 20


# What identifies one version of a local file: (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns). A file
# rewritten, copied over, replaced, touched or even chmod'ed since gets another fingerprint (ctime cannot be
# set from user space), so a check remembered by fingerprint is never taken for another file's.
Fingerprint = tuple[int, int, int, int, int]


def private_dir(path: str) -> str:
    """Make directory ``path`` (and its parents) if it is not there, itself readable by its owner
    only (0700: the caches hold copies of repository data a mount shows its own user only); an
    existing directory keeps the mode it has (an administrator's choice), but it must be this
    user's (or root's) and no one else's to write, and so must every directory above it unless
    the sticky bit keeps others from moving it away (as /tmp's): a cache another user could
    write would let them change what a mount serves as checked -- or, through the pickles the
    caches' indexes keep, run code as this user (``--cache-dir`` under /tmp, its ``data/``
    made first by someone else). InvalidArgument otherwise (:func:`refuse_unsafe_dir`)."""
    refuse_unsafe_dir(path, 1, "the cache directory", missing_ok=True)  # (nothing made where a link points)
    os.makedirs(path, mode=0o700, exist_ok=True)
    refuse_unsafe_dir(path, 1, "the cache directory")
    return path


def refuse_unsafe_dir(path: str, strict: int, what: str, missing_ok: bool = False) -> None:
    """InvalidArgument unless directory ``path`` and the ``strict - 1`` directories above it are
    this user's (or root's) and no one else may write them, and every directory further up is
    this user's or root's and writable by others only with the sticky bit (as /tmp, where no one
    may move another's entry away). A symbolic link on the way must be this user's or root's
    too -- another user's link in a sticky directory is theirs to point elsewhere later, after
    this check -- and what it leads to is checked the same way. ``missing_ok``: components not
    made yet are passed over (a check before they are made)."""
    euid = os.geteuid()
    d = os.path.abspath(path)
    level, linked = 0, False
    while True:
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            if not missing_ok:
                raise
            st = None
        if st is None:
            pass
        elif stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (euid, 0):
                raise InvalidArgument(f"{what} {path}: {d} is a symbolic link another user owns, which they may "
                                      "point elsewhere: refused (use a --cache-dir only this user may write)")
            linked = True
        elif level < strict:
            if st.st_uid not in (euid, 0) or _others_write(st):
                raise InvalidArgument(f"{what} {d} is another user's or writable by others: refused "
                                      "(use a --cache-dir only this user may write)")
        elif st.st_uid not in (euid, 0) or (_others_write(st) and not st.st_mode & stat.S_ISVTX):
            raise InvalidArgument(f"{what} {path} is inside {d}, which another user owns or may rewrite: "
                                  "refused (use a --cache-dir only this user may write)")
        parent = os.path.dirname(d)
        if parent == d:
            break
        d, level = parent, level + 1
    if linked:
        refuse_unsafe_dir(os.path.realpath(path), strict, what, missing_ok)  # (no link left in it)


def _others_write(st: os.stat_result) -> bool:
    """Whether a user other than the owner of the file ``st`` describes may write it: writable by
    others, or by a group another user is in. A group-writable directory of its owner's own
    user-private group -- what a umask of 002 makes, the default where each user has a group of
    their own -- is not (it was refused, though no one else could write it)."""
    if st.st_mode & 0o002:
        return True
    return bool(st.st_mode & 0o020) and not _private_group(st.st_gid, st.st_uid)


@functools.lru_cache(maxsize=64)
def _private_group(gid: int, uid: int) -> bool:
    """``gid`` is user ``uid``'s primary group, no other user's primary group, and lists no other
    member (unknown to the system's databases: not private)."""
    try:
        owner = pwd.getpwuid(uid)
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    if owner.pw_gid != gid or any(m != owner.pw_name for m in group.gr_mem):
        return False
    return not any(p.pw_gid == gid and p.pw_uid != uid for p in pwd.getpwall())


def open_file_path(path: str, fd: int) -> str:
    """A path that reads the file open as ``fd``: ``path``, or ``/proc/self/fd/<fd>`` once
    ``path`` is gone (its directory removed) while the file, open, is not."""
    return path if os.path.exists(path) else f"/proc/self/fd/{fd}"


def file_fingerprint(st: os.stat_result) -> Fingerprint:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def map_file(fd: int, size: int):
    """A read-only memory map of an open file (``b""`` for an empty one)."""
    import mmap

    return mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""


class ObjectStore(abc.ABC):
    """A flat namespace of byte objects under one root.

    Implementations are thread-safe.  Every method raises only
    ``graveler.errors`` exceptions: ``NotFound`` for a missing object,
    ``InvalidArgument`` for a bad key or argument, ``StoreUnavailable`` when the
    store cannot be reached or refuses access.
    """

    uri: str  # the root, e.g. "file:///abs/path" or "s3://bucket/prefix"

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object; ``NotFound`` if absent."""

    def get_mapped(self, key: str, min_size: int = MAP_MIN_BYTES):
        """The whole object as a read-only buffer: memory-mapped where the store can map it (a local
        file of at least ``min_size`` bytes), else ``get``'s bytes."""
        return self.get(key)

    def get_immutable(self, key: str, min_size: int = MAP_MIN_BYTES) -> tuple[object, Fingerprint | None]:
        """``get_mapped``'s buffer and the fingerprint of the local file it was read from (``None`` when
        the object is not a local file): what a check of an immutable object is remembered by."""
        return self.get_mapped(key, min_size), None

    def fingerprint(self, key: str) -> Fingerprint | None:
        """The fingerprint of the object's local file now (``None`` when objects are not local files)."""
        return None

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start``; shorter (possibly empty) at the end of the object."""

    def get_range_sized(self, key: str, start: int, length: int) -> tuple[bytes, int]:
        """``get_range`` plus the object's size now: ``(bytes, size)``.

        Backends answer both from one request (the local store's ``fstat``, S3's
        ``Content-Range``), so a reader can check the object against its entry at
        no extra cost (see :mod:`graveler.objects`).  This default asks twice.
        """
        info = self.head(key)
        return self.get_range(key, start, length), info.size

    def open_stream(self, key: str, start: int = 0, length: int | None = None) -> ObjectStream:
        """A sequential read of ``length`` bytes from ``start`` (to the end of the object when
        ``None``): see :class:`ObjectStream`. ``NotFound`` if the object is absent."""
        check_range(start, 0 if length is None else length)
        if length is None:
            length = max(self.head(key).size - start, 0)
        return ObjectStream(self, key, start, length)

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> ObjectInfo:
        """Create or replace an object atomically: readers see the old or the new content, whole."""

    def put_immutable(self, key: str, data) -> None:
        """``put`` for a content-addressed object (a range or metarange file), as durable and atomic,
        minus what only mutable objects need now: a store that computes etags itself (the local one's
        MD5, a second pass over the data) leaves it to ``head`` to compute if ever asked."""
        self.put(key, data)

    @abc.abstractmethod
    def put_file(self, key: str, path: str, md5: str | None = None) -> ObjectInfo:
        """Upload a local file (atomically, like ``put``); large files go up in parts. ``md5``: the
        file's MD5 where the caller has it already (a store that checks what it stored against
        the MD5 sent then reads the file once, not twice)."""

    @abc.abstractmethod
    def get_to_file(self, key: str, path: str) -> ObjectInfo:
        """Stream an object into a local file; ``path`` appears only once complete."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size, mtime and etag of an object; ``NotFound`` if absent."""

    def after_stall(self, stalls: int = 1) -> "ObjectStore | None":
        """This store for a request that follows ``stalls`` the store held up for a whole timeout
        in a row (responses that stalled midway): that many attempts fewer, so that all of them
        together take no more than one request's attempts; None when none is left. Stores
        without timeouts: themselves."""
        return self

    def open_reader(self, key: str) -> ObjectReader:
        """A read handle on one object; ``NotFound`` if absent."""
        return ObjectReader(self, key, self.head(key).size)

    def check_namespace(self) -> None:
        """Fail now, with a clear error, if objects cannot be written and deleted here (as
        lakeFS checks a storage namespace at repository creation): a probe object under
        ``_lakefs/`` is written, read back and deleted. Backends add their own checks first."""
        key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        self.put(key, b"lakefuse storage namespace probe\n")
        try:
            if self.get(key) != b"lakefuse storage namespace probe\n":
                raise StoreUnavailable(f"{self.full_uri(key)}: the store returned other bytes than were written")
        finally:
            self.delete(key)

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except NotFound:
            return False
        return True

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; deleting an absent object is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str = "", start_after: str = "") -> Iterator[ObjectInfo]:
        """Objects whose key starts with ``prefix`` and sorts after ``start_after``.

        Sorted by key (UTF-8 byte order, as S3 lists), fetched lazily page by page.
        """

    def list_level(self, prefix: str = "") -> tuple[list[ObjectInfo], list[str]]:
        """One level of the key hierarchy under ``prefix`` (``""`` or ending in ``/``):
        the objects directly there and the sub-prefixes (each ending in ``/``), both sorted.

        Lets a parallel job list a big prefix by sub-prefix.  This default walks the
        full listing; the backends read one directory / one delimited listing.
        """
        check_level_prefix(prefix)
        objs: list[ObjectInfo] = []
        subs: list[str] = []
        for o in self.list(prefix):
            head, sep, _ = o.key[len(prefix):].partition("/")
            if sep:
                sub = prefix + head + "/"
                if not subs or subs[-1] != sub:
                    subs.append(sub)
            else:
                objs.append(o)
        return objs, subs

    def list_level_counted(self, prefix: str = "") -> tuple[list[ObjectInfo], list[str], int]:
        """:meth:`list_level`, and how many keys under ``prefix`` it passed over because they
        can be no object's key (an S3 folder marker ``dir/``, keys below an empty segment
        ``dir//...``): 0 for a store that cannot hold such keys (a local directory)."""
        objs, subs = self.list_level(prefix)
        return objs, subs, 0

    def delete_many(self, keys: list[str]) -> list[tuple[str, str]]:
        """Delete several objects (absent ones are not an error); returns ``(key, reason)``
        for each one that could not be deleted.  S3 sends them 1000 to a request."""
        for k in keys:
            validate_key(k)  # a bad key fails the whole call, before anything is deleted
        failed: list[tuple[str, str]] = []
        for k in keys:
            try:
                self.delete(k)
            except GravelerError as exc:
                failed.append((k, str(exc)))
        return failed

    @abc.abstractmethod
    def full_uri(self, key: str) -> str:
        """The URI of one object: "file:///root/key" or "s3://bucket/prefix/key"."""

    def sync_object(self, key: str) -> None:
        """Make one object durable if a write left it in the page cache only (a local
        store's ``adopt_file(durable=False)``). A no-op where every write is durable when it
        returns (S3 answered the PUT)."""

    def sync(self) -> None:
        """Make every object written so far durable, whoever wrote it (any process): what a
        commit does before its record lands. A no-op where every write is durable when it
        returns."""

    def close(self) -> None:
        """Release clients and connections; the store is unusable afterwards."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"
