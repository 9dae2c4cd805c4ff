"""Data objects: where uploads go, how they are checksummed, POSIX attributes.

Physical addresses of uploads (RELATIVE to the storage namespace)::

    data/<YYYYMMDDHH>/<unix-ns:019d><random:16 hex>

``YYYYMMDDHH`` is the UTC hour of the upload, so objects are grouped in hourly
prefixes that garbage collection can list in parallel slices, and names sort by
upload time within and across prefixes; the 64 random bits make names unique
across processes and machines. Nothing ever overwrites an address.

ETag: the hex MD5 of the content (what S3 returns for a single-part upload),
computed by graveler while uploading, whatever the store does for large files.

POSIX attributes for the mount live in the entry's user metadata under ONE key
prefix, :data:`POSIX_PREFIX` (``lakefuse-posix-``):

=========================  ==========================================
``lakefuse-posix-mode``    st_mode, octal (``100644``, ``120777``, ``40755``; ``10644`` a FIFO,
                           ``140755`` a socket, ``20600`` a character device, ``60660`` a
                           block device: empty objects, like symlinks)
``lakefuse-posix-rdev``    st_rdev of a character or block device, decimal (Linux's
                           ``makedev(major, minor)``); absent for every other kind
``lakefuse-posix-uid``     owner uid, decimal
``lakefuse-posix-gid``     owner gid, decimal
``lakefuse-posix-symlink`` symlink target (UTF-8 text); the object is empty
``lakefuse-posix-mtime``   mtime set explicitly (utimens), unix nanoseconds, decimal;
                           without it the mtime is the entry's last_modified
``lakefuse-posix-atime``   atime set explicitly (utimens), unix nanoseconds, decimal;
                           without it the atime is the mtime (reads never update it)
=========================  ==========================================

A value that no file can have (a mode past ``177777``, an owner, group or device number
outside 32 bits: another client may write anything) is read as not set; a time outside
the 64-bit nanoseconds ``stat`` and FUSE carry (1677-09-21 to 2262-04-11) as that end.

Other metadata keys are the user's and are kept as given.

Directory markers: an empty directory made through the mount is the key
``<dir>/`` (the directory's path plus a trailing ``/``; S3 consoles and lakeFS
make the same zero-byte "folder" objects). It is a real zero-byte object whose
metadata carries the directory's POSIX attributes. A delimited listing of the
parent shows ``<dir>/`` as a common prefix, so the directory appears whether or
not anything else is in it; inside the directory the marker's own name is empty,
and the mount hides it (:func:`is_dir_marker`). A marker stays when files are
added to its directory, so the attributes of a directory made with mkdir
survive; rmdir removes it.

The root directory's marker is the key ``/`` (:data:`ROOT_MARKER`): made when the
root's mode, owner or times are set (``cp -a``, ``rsync -a`` and ``tar -x`` set
them), hidden from every listing (its one component is empty), never removed by
the mount.

``.lakefuse`` (:data:`RESERVED_NAME`) is the mount's control directory in every
tree: no key may have it as a path component (:func:`has_reserved_component`).

Reading data objects: never serve bytes the entry does not describe
--------------------------------------------------------------------
Every read of a data object goes through the three functions below, which
check what the store returns against the entry (its ``size`` and ``etag``) and
raise :class:`~graveler.errors.CorruptedData` (naming the object) on any
difference -- a truncated, emptied, grown, bit-flipped or replaced object is an
error, never wrong bytes:

* :func:`read_verified` -- the whole object: its size, and its MD5 when the
  etag is a plain MD5 (every object graveler uploads; single-part S3 objects).
  A multipart S3 etag (``<hex>-<parts>``) is not an MD5 of the content: those
  objects are checked by size only.
* :func:`read_range_checked` -- ``length`` bytes at ``offset``, with the object's
  size checked in the same request (S3 ``Content-Range``, local ``fstat``).
  The content itself cannot be checked from a part: this is what a mount's
  ``read`` uses.
* :func:`iter_verified` -- the whole object in chunks (``cat`` of a large file):
  size checked on every chunk, the MD5 before the last chunk is handed out (so
  a caller that streams learns of a bad object at the end, as with ``curl``).

A cache of data objects (the mount's, on S3) fills only from
:func:`read_verified` / :func:`iter_verified`, so it never keeps a bad copy.
The checks cost one MD5 pass (~0.6 GB/s per core) on whole reads and nothing
on ranged reads.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import logging
import os
import re
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator

from graveler.errors import CorruptedData, InvalidArgument, NotFound, StoreUnavailable
from graveler.model import TIME_NS_MAX, TIME_NS_MIN, AddressType, Entry, clamp_time_ns  # noqa: F401 (theirs)
from graveler.objstore.uri import FILE, StorageURI
from graveler.objstore.local import LocalStore
from graveler.objstore.readfor import reads_for

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from graveler.objstore.base import ObjectStore

UploadSource = bytes | bytearray | memoryview | str | os.PathLike | BinaryIO

DATA_PREFIX = "data/"

POSIX_PREFIX = "lakefuse-posix-"
POSIX_MODE = POSIX_PREFIX + "mode"
POSIX_UID = POSIX_PREFIX + "uid"
POSIX_GID = POSIX_PREFIX + "gid"
POSIX_SYMLINK = POSIX_PREFIX + "symlink"
POSIX_MTIME = POSIX_PREFIX + "mtime"
POSIX_ATIME = POSIX_PREFIX + "atime"
POSIX_RDEV = POSIX_PREFIX + "rdev"
POSIX_KEYS = (POSIX_MODE, POSIX_UID, POSIX_GID, POSIX_SYMLINK, POSIX_MTIME, POSIX_ATIME, POSIX_RDEV)

RESERVED_NAME = ".lakefuse"

_CHUNK = 1 << 20


_unique: list = [0, 0, None]  # [pid, random prefix, counter] of this process (unique_hex16)
_unique_lock = threading.Lock()


def unique_hex16() -> str:
    """16 hex digits no other call returns: a random prefix drawn once per process, then a
    counter (a random draw per call costs a system call that is slow on some hosts)."""
    u = _unique
    pid = os.getpid()
    if u[0] != pid:  # first call, or a forked child: its own prefix
        with _unique_lock:
            if u[0] != pid:
                u[1], u[2] = (int.from_bytes(os.urandom(4), "big"), itertools.count(1))
                u[0] = pid
    prefix, counter = u[1], u[2]
    return f"{prefix:08x}{next(counter) & 0xFFFFFFFF:08x}"


def new_data_address(now_ns: int | None = None) -> str:
    """A fresh, unique, time-ordered RELATIVE address under ``data/``."""
    ns = time.time_ns() if now_ns is None else now_ns
    hour = time.strftime("%Y%m%d%H", time.gmtime(ns // 1_000_000_000))
    return f"{DATA_PREFIX}{hour}/{ns:019d}{unique_hex16()}"


@dataclass(frozen=True, slots=True)
class PosixAttrs:
    """The POSIX attributes the mount keeps in entry metadata (None = not set)."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    symlink: str | None = None
    mtime_ns: int | None = None
    atime_ns: int | None = None
    rdev: int | None = None  # a character or block device's st_rdev

    def to_metadata(self) -> dict[str, str]:
        md: dict[str, str] = {}
        if self.mode is not None:
            md[POSIX_MODE] = format(self.mode, "o")
        if self.uid is not None:
            md[POSIX_UID] = str(self.uid)
        if self.gid is not None:
            md[POSIX_GID] = str(self.gid)
        if self.symlink is not None:
            md[POSIX_SYMLINK] = self.symlink
        if self.mtime_ns is not None:
            md[POSIX_MTIME] = str(self.mtime_ns)
        if self.atime_ns is not None:
            md[POSIX_ATIME] = str(self.atime_ns)
        if self.rdev is not None:
            md[POSIX_RDEV] = str(self.rdev)
        return md

    @staticmethod
    def from_metadata(md: dict[str, str]) -> "PosixAttrs":
        """The attributes ``md`` keeps. A value that does not parse, or that no file can have (a mode
        past ``0o177777``, an owner or a device number outside 32 bits -- another client may have
        written anything), counts as not set; a time outside :data:`TIME_NS_MIN`..:data:`TIME_NS_MAX`
        is that bound (a time is nanoseconds in 64 bits, as ``stat`` and FUSE carry it)."""
        def num(key: str, base: int, top: int) -> int | None:
            v = md.get(key)
            if v is None:
                return None
            try:
                n = int(v, base)
            except ValueError:
                return None
            return n if 0 <= n <= top else None

        def ns(key: str) -> int | None:
            v = md.get(key)
            if v is None:
                return None
            try:
                return clamp_time_ns(int(v, 10))
            except ValueError:
                return None

        return PosixAttrs(
            num(POSIX_MODE, 8, MODE_MAX), num(POSIX_UID, 10, ID_MAX), num(POSIX_GID, 10, ID_MAX), md.get(POSIX_SYMLINK),
            ns(POSIX_MTIME), ns(POSIX_ATIME), num(POSIX_RDEV, 10, RDEV_MAX),
        )


MODE_MAX = 0o177777  # a file's type and permission bits
ID_MAX = (1 << 32) - 2  # an owner or group (uid_t; its all-ones value is chown(2)'s "unchanged")
RDEV_MAX = (1 << 32) - 1  # a device number (as FUSE carries it: 32 bits)


def user_metadata(md: dict[str, str]) -> dict[str, str]:
    """Entry metadata without the POSIX keys."""
    return {k: v for k, v in md.items() if not k.startswith(POSIX_PREFIX)}


def is_dir_marker(key: bytes | str) -> bool:
    """True for a directory marker key (``<dir>/``)."""
    return key.endswith(b"/" if isinstance(key, bytes) else "/")


def dir_marker_key(directory: bytes) -> bytes:
    """The marker key of ``directory`` (a path without a trailing slash)."""
    return directory + b"/"


ROOT_MARKER = dir_marker_key(b"")  # b"/": the root directory's marker


def has_reserved_component(key: bytes | str) -> bool:
    """True if a path component of ``key`` is the reserved ``.lakefuse``."""
    b = key.encode("utf-8", "surrogateescape") if isinstance(key, str) else key
    return RESERVED_NAME.encode() in b.split(b"/")


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def md5_file(path: str) -> tuple[str, int]:
    """(hex MD5, size) of a regular file; ``InvalidArgument`` for anything else (a FIFO
    or a device would block or never end), ``OSError`` as it comes for the rest."""
    h = hashlib.md5(usedforsecurity=False)
    size = 0
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO must not hang
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidArgument(f"{path} is not a regular file (a FIFO, device or socket cannot be uploaded)")
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


# A file whose MD5 nobody computed while writing it (written out of order, truncated, sparse)
# is hashed when it is stored: from COMPOSITE_MIN bytes on, its etag is S3's multipart form
# instead of its MD5 -- the MD5 of its parts' MD5s, then "-<parts>" -- over parts of
# composite_part(size) bytes. Parts are hashed by several threads at once (hashlib lets go of
# the GIL), and a part the file holds no data in (a hole: SEEK_DATA) is not read at all: its MD5
# is that of as many zeros, made once per length. ``truncate -s 1T`` then costs a close of
# milliseconds, not half an hour of MD5 over zeros (which no shortcut can skip: MD5 is sequential).
COMPOSITE_MIN = 1 << 30
_COMPOSITE_PART = 64 << 20
_COMPOSITE_MAX_PARTS = 10_000  # S3's limit: the part doubles until the file fits in as many
_HASH_THREADS = 4
_zero_digests: dict[int, bytes] = {}
_zero_lock = threading.Lock()


def composite_part(size: int) -> int:
    part = _COMPOSITE_PART
    while (size + part - 1) // part > _COMPOSITE_MAX_PARTS:
        part *= 2
    return part


def _zeros_digest(n: int) -> bytes:
    with _zero_lock:
        d = _zero_digests.get(n)
    if d is None:
        h, zeros, left = hashlib.md5(usedforsecurity=False), bytes(min(n, _CHUNK)), n
        while left:
            h.update(zeros if left >= len(zeros) else zeros[:left])
            left -= min(left, len(zeros))
        d = h.digest()
        with _zero_lock:
            _zero_digests[n] = d
    return d


def _range_digest(fd: int, start: int, end: int) -> bytes:
    """The MD5 of bytes [start, end) of ``fd``'s file (no reads where it has no data)."""
    try:
        data_at = os.lseek(fd, start, os.SEEK_DATA)
    except OSError as e:  # ENXIO: no data from ``start`` on; any other: read it
        data_at = end if e.errno == errno.ENXIO else start
    if data_at >= end:
        return _zeros_digest(end - start)
    h, off = hashlib.md5(usedforsecurity=False), start
    while off < end:
        chunk = os.pread(fd, min(_CHUNK, end - off), off)
        if not chunk:
            raise OSError(errno.EIO, f"the file ended at byte {off} of {end} while it was hashed")
        h.update(chunk)
        off += len(chunk)
    return h.digest()


def file_etag(fd: int, size: int, like: str | None = None) -> str:
    """The etag of the ``size`` bytes of the file open at ``fd`` (read with ``pread``: its
    offset does not matter): its hex MD5, or from :data:`COMPOSITE_MIN` bytes on the composite
    form above. ``like``: an etag to compare with -- the result takes its form (an MD5, or a
    composite), whatever the size."""
    composite = not is_md5_etag(like) if like else size >= COMPOSITE_MIN
    if not composite:
        return _range_digest(fd, 0, size).hex()
    part = composite_part(size)
    bounds = [(i, min(size, i + part)) for i in range(0, size, part)] or [(0, 0)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(_HASH_THREADS, len(bounds)), "graveler-etag") as pool:
        digests = list(pool.map(lambda b: _range_digest(fd, *b), bounds))
    return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(bounds)}"


def spool(fileobj: BinaryIO, spool_dir: str | None = None) -> tuple[str, str, int]:
    """Copy a readable binary file object to a temp file: (temp path, md5 hex, size).
    The caller removes the temp file."""
    h = hashlib.md5(usedforsecurity=False)
    size = 0
    fd, tmp = tempfile.mkstemp(prefix="lakefuse-upload-", dir=spool_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = fileobj.read(_CHUNK)
                if not chunk:
                    break
                if not isinstance(chunk, (bytes, bytearray, memoryview)):
                    raise InvalidArgument("upload source must be opened in binary mode")
                h.update(chunk)
                size += len(chunk)
                out.write(chunk)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp, h.hexdigest(), size


_MD5_ETAG = re.compile(r"[0-9a-f]{32}\Z")
READ_CHUNK = 8 << 20


def is_md5_etag(etag: str) -> bool:
    """Whether ``etag`` is the hex MD5 of the content (not a multipart ``<hex>-<parts>`` etag)."""
    return bool(_MD5_ETAG.match(etag.strip('"').lower()))


def _check_size(store: "ObjectStore", key: str, actual: int, size: int) -> None:
    if actual != size:
        raise CorruptedData(f"data object is {actual} bytes but its entry says {size}", store.full_uri(key))


def _check_length(store: "ObjectStore", key: str, data: bytes, offset: int, expected: int) -> None:
    if len(data) != expected:
        raise CorruptedData(f"the store returned {len(data)} bytes at offset {offset} where the entry "
                            f"promises {expected}", store.full_uri(key), offset)


def _check_md5(store: "ObjectStore", key: str, digest: str, etag: str) -> None:
    if digest != etag.strip('"').lower():
        raise CorruptedData(f"data object content does not match its etag (MD5 {digest}, entry {etag})",
                            store.full_uri(key))


def read_range_checked(store: "ObjectStore", key: str, size: int, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of an object whose entry says ``size`` bytes.

    Short only at the end of the object, as the entry's size says.
    ``CorruptedData`` if the object's size differs from ``size`` or the store
    returns fewer bytes than that size promises; ``NotFound`` / ``StoreUnavailable``
    from the store as they are.
    """
    if offset < 0 or length < 0:
        raise InvalidArgument(f"bad byte range: offset={offset} length={length} (both must be >= 0)")
    data, actual = store.get_range_sized(key, offset, length)
    _check_size(store, key, actual, size)
    _check_length(store, key, data, offset, max(0, min(length, size - offset)))
    return data


def read_verified(store: "ObjectStore", key: str, size: int, etag: str) -> bytes:
    """The whole object, checked: its size against ``size`` and, when ``etag`` is an
    MD5, its content against ``etag``.  ``CorruptedData`` on any difference that a second
    fetch shows too: one transfer damaged or cut short on the way (a network glitch, a proxy)
    is not the store's copy, and was reported as corrupted data."""
    for attempt in (1, 2):
        try:
            data = read_range_checked(store, key, size, 0, size)
            if is_md5_etag(etag):
                _check_md5(store, key, md5_hex(data), etag)
            return data
        except CorruptedData as e:
            if attempt == 2:
                raise
            log.info("%s: %s; fetching it once more", store.full_uri(key), e)
    raise AssertionError("unreachable")


def iter_verified(store: "ObjectStore", key: str, size: int, etag: str,
                  chunk: int = READ_CHUNK) -> Iterator[bytes]:
    """The whole object in chunks of ``chunk`` bytes: the size is checked with every
    chunk, the MD5 (when ``etag`` is one) before the last chunk is yielded."""
    if chunk < 1:
        raise InvalidArgument(f"chunk must be >= 1, not {chunk}")
    h = hashlib.md5(usedforsecurity=False) if is_md5_etag(etag) else None
    offset = 0
    while True:
        data = read_range_checked(store, key, size, offset, min(chunk, size - offset))
        if h is not None:
            h.update(data)
        offset += len(data)
        if offset >= size:
            if h is not None:
                _check_md5(store, key, h.hexdigest(), etag)
            if data:
                yield data
            return
        yield data


def split_full_address(address: str) -> tuple[str, str]:
    """A FULL address (a whole URI) as (store root URI, key in that store).

    ``s3://bucket/a/b`` -> (``s3://bucket``, ``a/b``);
    ``file:///dir/sub/f`` -> (``file:///dir/sub``, ``f``).
    """
    root, key = StorageURI.split_object(address)
    return str(root), key


def put_object(store, source: UploadSource, content_type: str = "", metadata: dict[str, str] | None = None,
               spool_dir: str | None = None, adopt: bool = False, etag: str | None = None,
               durable: bool = True, fd: int | None = None, last_modified_ns: int | None = None) -> Entry:
    """Upload bytes, a local file (path) or a readable binary file object to a new
    RELATIVE address under ``data/`` of ``store``; return its entry (md5 etag), unstaged,
    last modified at ``last_modified_ns`` (None: now, when the upload ends).
    A file object is spooled to a temp file in ``spool_dir`` first (removed after).

    ``adopt`` (a path source): the caller hands the file over -- a local store links it
    into place instead of copying (:meth:`LocalStore.adopt_file`), so the caller must
    never write to that file again; ``etag`` is its MD5 if the caller already knows it;
    ``durable=False``: an adopted file is not fsynced (see :meth:`LocalStore.adopt_file`;
    :meth:`ObjectStore.sync_object` makes it durable later); ``fd``: an open descriptor of that
    file, which a local store adopts it through (no second open; left open); with ``etag``, any
    other store uploads it without hashing it again."""
    address = new_data_address()
    tmp = None
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            etag, size = md5_hex(data), len(data)
            store.put(address, data)
        elif isinstance(source, (str, os.PathLike)):
            fname = os.fspath(source)
            from graveler.objstore.base import open_file_path
            from graveler.objstore.local import LocalStore

            if adopt and isinstance(store, LocalStore) and (fd is not None or os.path.isfile(fname)):
                info = store.adopt_file(address, fname, etag, durable, fd)
                etag, size = info.etag, info.size
            elif isinstance(store, LocalStore) and os.path.isfile(fname):
                # the local store hashes what it copies (its etag is always the MD5): one pass, not two
                info = store.put_file(address, fname)
                etag, size = info.etag, info.size
            elif etag is not None and fd is not None:  # the caller's MD5 of the file it has open: no second pass
                size = os.fstat(fd).st_size
                store.put_file(address, open_file_path(fname, fd), md5=etag if is_md5_etag(etag) else None)
            else:
                try:
                    etag, size = md5_file(fname)
                except FileNotFoundError:
                    raise NotFound(f"upload source {fname!r} not found") from None
                except OSError as e:
                    raise InvalidArgument(f"cannot read upload source {fname!r}: {e.strerror or e}") from None
                store.put_file(address, fname, md5=etag)
        elif hasattr(source, "read"):
            try:
                tmp, etag, size = spool(source, spool_dir)
            except OSError as e:
                raise StoreUnavailable(f"cannot spool the upload ({e.strerror or e})") from None
            store.put_file(address, tmp, md5=etag)
        else:
            raise InvalidArgument(f"cannot upload a {type(source).__name__}")
    finally:
        if tmp is not None:
            os.unlink(tmp)
    return Entry(
        address=address,
        size=size,
        etag=etag,
        last_modified_ns=time.time_ns() if last_modified_ns is None else last_modified_ns,
        metadata=dict(metadata or {}),
        address_type=AddressType.RELATIVE,
        content_type=content_type,
    )


def refuse_local_root(namespace: str | StorageURI, root: str | StorageURI, address: str) -> None:
    """CorruptedData for an entry of a repository stored remotely (S3) whose FULL address is a
    file of this host: such an entry may not read the files of whichever host reads it (a
    crafted entry, or a refs dump from shared storage mounted with ``allow_other``, served any
    file the daemon could read). A repository stored locally may name local files (an import
    of a local directory keeps them where they are)."""
    ns = namespace if isinstance(namespace, StorageURI) else StorageURI.parse(namespace)
    rt = root if isinstance(root, StorageURI) else StorageURI.parse(root)
    if rt.scheme == FILE and ns.scheme != FILE:
        raise CorruptedData(f"entry address {address!r} names a local file, and the repository is stored at "
                            f"{ns}: refused (an entry of a remote repository never reads this host's files)")


class EntryReader:
    """Reads the objects entries point at: RELATIVE addresses in the namespace's
    store, FULL ones (whole URIs) in the store of their root, opened once by
    ``store_factory(root_uri)`` and kept (never a local file for a remote namespace:
    :func:`refuse_local_root`)."""

    def __init__(self, namespace: str, store, store_factory: Callable[[str], object]):
        self._namespace = StorageURI.parse(namespace)
        self._store = store
        self._factory = store_factory
        self._lock = threading.Lock()
        self._stores: dict[StorageURI, object] = {}
        # a local repository of another user (root serving it): read only what its owner may
        self._read_for = reads_for(store.root) if isinstance(store, LocalStore) else None
        if self._read_for is not None:
            store.read_for = self._read_for

    def locate(self, entry: Entry) -> tuple[object, str]:
        """(store, key) of an entry's object."""
        addr = entry.address
        if entry.address_type == AddressType.FULL or (
            entry.address_type == AddressType.BY_PREFIX_DEPRECATED and "://" in addr
        ):
            try:
                root, key = StorageURI.split_object(addr)
            except InvalidArgument as e:  # a stored entry's address: damage, not the caller's input
                raise CorruptedData(f"damaged entry: {e}") from None
            if root == self._namespace:
                return self._store, key
            refuse_local_root(self._namespace, root, addr)
            with self._lock:
                st = self._stores.get(root)
            if st is None:
                st = self._factory(str(root))
                if self._read_for is not None and isinstance(st, LocalStore):
                    st.read_for = self._read_for
                with self._lock:
                    st = self._stores.setdefault(root, st)
            return st, key
        return self._store, addr

    def read(self, entry: Entry, offset: int = 0, length: int | None = None) -> bytes:
        """The bytes of an entry's object (or ``length`` bytes from ``offset``), checked
        against the entry: a whole read by size and MD5 (:func:`read_verified`), a
        part by the object's size (:func:`read_range_checked`). ``CorruptedData`` on
        any difference."""
        st, key = self.locate(entry)
        if offset == 0 and (length is None or length >= entry.size):
            return read_verified(st, key, entry.size, entry.etag)
        if length is None:
            length = max(entry.size - offset, 0)
        return read_range_checked(st, key, entry.size, offset, length)

    def iter(self, entry: Entry, chunk: int = READ_CHUNK) -> Iterator[bytes]:
        """The whole object in chunks, checked as :func:`iter_verified` says."""
        st, key = self.locate(entry)
        return iter_verified(st, key, entry.size, entry.etag, chunk)


__all__ = [
    "EntryReader",
    "UploadSource",
    "put_object",
    "DATA_PREFIX",
    "POSIX_GID",
    "POSIX_KEYS",
    "POSIX_MODE",
    "POSIX_ATIME",
    "POSIX_MTIME",
    "POSIX_PREFIX",
    "POSIX_RDEV",
    "POSIX_SYMLINK",
    "POSIX_UID",
    "PosixAttrs",
    "RESERVED_NAME",
    "dir_marker_key",
    "ROOT_MARKER",
    "has_reserved_component",
    "is_dir_marker",
    "READ_CHUNK",
    "is_md5_etag",
    "iter_verified",
    "md5_file",
    "md5_hex",
    "new_data_address",
    "read_range_checked",
    "read_verified",
    "split_full_address",
    "spool",
    "user_metadata",
]
