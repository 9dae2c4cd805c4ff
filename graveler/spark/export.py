"""Export a commit's objects to a plain prefix (a local directory or ``s3://bucket/prefix``).

Each entry's object is copied to ``<dest>/<path>``.  ``_SUCCESS`` is removed
first and written last (JSON: the commit ID, repository, counts), so a reader
that finds it sees a complete export, and it names the commit exported.  An
export onto a destination whose ``_SUCCESS`` names a commit of the same
repository (or given ``previous``) is incremental: only the difference
(``diff_df(previous, commit)``) is applied: added and changed objects are copied,
removed ones deleted (all deletions before the copies, so a path that went from
a directory to a file, or back, is free when its copy comes).  A full export
copies everything and leaves other files at the destination alone; an empty
``_SUCCESS`` (Spark's and Hadoop's) is no export's.  While an export runs,
``_INCOMPLETE`` names the commit it goes to and the one it goes on from: a run
cut short and run again goes on from the same previous export (a full export
instead would keep what the diff removes), and ``_INCOMPLETE`` goes once
``_SUCCESS`` is written; if the branch moved meanwhile (the run goes to another commit
than the one cut short), the difference from that commit is applied too, so what the
cut-short run copied of it is undone; on a local destination it also removes the temp
files of the copies the cut-short run had under way.  A local destination that cannot take the commit (a
file where it has a directory: a commit of both ``k`` and ``k/x``, or stray
files) is ``InvalidArgument`` naming the path.

Copies are idempotent (the same bytes to the same key), so retried tasks are
harmless.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import stat
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from graveler.errors import CorruptedData, InvalidArgument, NotFound
from graveler.model import AddressType
from graveler.objects import POSIX_MODE, POSIX_MTIME, POSIX_SYMLINK, is_md5_etag, refuse_local_root, split_full_address
from graveler.objstore import LocalStore, open_store, sparse
from graveler.objstore.local import TMP_PREFIX, _write_all
from graveler.objstore.uri import place
from graveler.objstore.base import StoreConfig
from graveler.spark.diff import diff_df
from graveler.spark.entries import entries_df, namespace_of
from graveler.spark.tables import Namespace, fault_point, worker_store

log = logging.getLogger(__name__)

SUCCESS = "_SUCCESS"
INCOMPLETE = "_INCOMPLETE"  # an export under way or cut short: the commit it goes to, and from which one
_BIG = 64 << 20  # objects above this go through a temporary file


@dataclass(frozen=True)
class ExportResult:
    commit_id: str
    previous: str | None  # the commit the export was incremental against
    copied: int
    deleted: int
    bytes: int
    seconds: float
    links: int = 0  # symbolic links made again (a local destination)
    skipped: int = 0  # entries no object stands for there: links on S3; FIFOs, sockets, devices anywhere


def read_success(dest_uri: str, config: StoreConfig | None = None, key: str = SUCCESS) -> dict | None:
    """What an export's marker ``key`` (``_SUCCESS``, or ``_INCOMPLETE``) at the destination says;
    None when there is none, or it is empty (the one Spark and Hadoop jobs write: no export's)."""
    st = open_store(dest_uri, config)
    try:
        raw = st.get(key)
        return json.loads(raw) if raw.strip() else None
    except NotFound:
        return None
    except ValueError as e:
        raise CorruptedData(f"malformed {SUCCESS} ({e})", dest_uri) from None
    finally:
        st.close()


def _source(ns: Namespace, address: str, address_type: str, stores: dict):
    if address_type == AddressType.FULL.name or "://" in address:
        root, key = split_full_address(address)
        if root == ns.uri:
            return worker_store(ns), key
        refuse_local_root(ns.uri, root, address)
        st = stores.get(root)
        if st is None:
            st = stores[root] = open_store(root, ns.store)
        return st, key
    return worker_store(ns), address


def _check(key: str, got: int, size: int, etag: str, content) -> None:
    """CorruptedData unless ``content`` (bytes, or a file read from its start) is the object its
    entry describes: ``size`` bytes and, for a plain-MD5 ``etag``, that MD5."""
    if got != size:
        raise CorruptedData(f"{key}: its object is {got} bytes, the entry says {size}")
    if etag and is_md5_etag(etag):
        h = hashlib.md5(usedforsecurity=False)
        if isinstance(content, (bytes, bytearray)):
            h.update(content)
        else:
            while chunk := content.read(8 << 20):
                h.update(chunk)
        if h.hexdigest() != etag.strip('"').lower():
            raise CorruptedData(f"{key}: its object's content does not match its etag (MD5 {h.hexdigest()}, "
                                f"the entry says {etag})")


def _ours(marker: dict, repo, ns: Namespace) -> bool:
    return isinstance(marker, dict) and marker.get("repository") == repo.name and \
        marker.get("storage_namespace") == ns.uri


def _commit_or_none(repo, commit_id) -> str | None:
    try:
        return repo.get_commit(commit_id).id if isinstance(commit_id, str) and commit_id else None
    except NotFound:
        return None


def _overlap(a: str, b: str) -> bool:
    """Whether store roots ``a`` and ``b`` are one place or one holds the other, however each is
    written (``/dir``, ``file:///dir``, a ``..`` or a link on the way; an S3 bucket and prefix).
    An export there would write, or prune, the repository's own objects."""
    pa, pb = place(a), place(b)
    return pa.startswith(pb) or pb.startswith(pa)


def _copy_task(ns: Namespace, dest: Namespace):
    import pyarrow as pa

    def fn(batches):
        out = dest.open()
        if isinstance(out, LocalStore):
            out = NoFollowDest(out)
        stores: dict = {}
        local = isinstance(out, NoFollowDest)
        copied = deleted = nbytes = links = skipped = 0
        for b in batches:
            cols = b.to_pydict()
            for op, key, address, atype, size, etag, mode, link, mtime in zip(
                    cols["op"], cols["key"], cols["address"], cols["address_type"], cols["size"], cols["etag"],
                    cols["mode"], cols["link"], cols["mtime"]):
                if op == "delete":
                    out.delete(key)
                    deleted += 1
                    continue
                kind = _kind(mode, link)
                if kind == "link" and local:  # (a link's entry is an empty object: never written as a file)
                    out.symlink(key, link, _ns(mtime))
                    links += 1
                    continue
                if kind != "file":
                    out.delete(key)  # (an earlier export's file there, if any: this commit has none)
                    skipped += 1
                    continue
                src, skey = _source(ns, address, atype, stores)
                attrs = ((_perm(mode), _ns(mtime)),) if local else ()
                try:
                    _copy_one(out, src, skey, key, size, etag, *attrs)
                except NotFound as e:  # (the store names its address only: say which file, a newline escaped)
                    shown = key if key.isprintable() else repr(key)  # (a name never breaks the line it is on)
                    raise NotFound(f"{shown}: {str(e) if str(e).isprintable() else repr(str(e))}") from None
                copied += 1
                nbytes += size
        fault_point("export_copy")
        yield pa.RecordBatch.from_arrays([pa.array([copied]), pa.array([deleted]), pa.array([nbytes]),
                                          pa.array([links]), pa.array([skipped])],
                                         names=["copied", "deleted", "bytes", "links", "skipped"])

    return fn


class NoFollowDest:
    """Writes and deletes below a local export destination through directory descriptors, each
    directory on the way opened with ``O_NOFOLLOW`` from the one before: a symbolic link there --
    planted before the export or while it runs (whoever can write the destination can) -- is
    refused where it is met, never followed. A root export's files and its deletions stay below
    the destination. (A check of the path before each write left the moment between the check
    and the write.) Each file is written under a temporary name, synced and renamed into place,
    as :class:`LocalStore` does."""

    def __init__(self, store: LocalStore):
        self.store = store  # (its key rules: validate_key, names the local store reserves)
        self.root = store.root

    def _refused(self, path: str) -> InvalidArgument:
        return InvalidArgument(f"{path!r} in the export destination is a symbolic link: refused (an export "
                               "writes and deletes only below its destination)")

    def _conflict(self, key: str) -> InvalidArgument:
        return InvalidArgument(f"{key!r}: the export destination {self.root!r} has a directory where the commit has "
                               "this file, or a file where it has a directory (a local directory cannot hold both "
                               "'x' and 'x/y'; an S3 destination can)")

    def _walk(self, key: str, create: bool) -> tuple[list[int], list[str]] | None:
        """Descriptors of the destination and of each directory on the way to ``key`` (made on
        the way if ``create``; None when one is absent), and the directories' and the file's names."""
        self.store._path(key)  # (the key as the local store takes it, or InvalidArgument)
        names = key.split("/")
        fds = [os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]  # (the destination as named)
        path = self.root
        try:
            for segment in names[:-1]:
                path = os.path.join(path, segment)
                if create:
                    try:
                        os.mkdir(segment, 0o777, dir_fd=fds[-1])
                    except FileExistsError:
                        pass
                try:
                    fds.append(os.open(segment, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                       dir_fd=fds[-1]))
                except OSError as e:
                    if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and os.path.islink(path)):
                        raise self._refused(path) from None
                    if e.errno == errno.ENOENT and not create:
                        _close_all(fds)
                        return None
                    if e.errno == errno.ENOTDIR:
                        raise self._conflict(key) from None
                    raise
        except BaseException:
            _close_all(fds)
            raise
        return fds, names

    def _write(self, key: str, fill, attrs: tuple | None = None) -> None:
        fds, names = self._walk(key, True)
        dfd, name = fds[-1], names[-1]
        try:
            tmp = TMP_PREFIX + uuid.uuid4().hex
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
            try:
                try:
                    fill(fd)
                    if attrs is not None:  # (the commit's permission bits, else 0644, and its mtime: set before the rename)
                        mode, mtime_ns = attrs
                        os.fchmod(fd, 0o644 if mode is None else mode)
                        if mtime_ns is not None:
                            os.utime(fd, ns=(mtime_ns, mtime_ns))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # (a link at the name is replaced, not followed)
                except (IsADirectoryError, NotADirectoryError) as e:
                    raise self._conflict(key) from e
                except OSError as e:
                    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                    raise self._conflict(key) from e
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
            os.fsync(dfd)
        finally:
            _close_all(fds)

    def put(self, key: str, data: bytes, attrs: tuple | None = None) -> None:
        """``data`` at ``key``; ``attrs``: (permission bits or None for 0644, mtime in ns or None) --
        not the owner, nor setuid/setgid bits."""
        self._write(key, lambda fd: _write_all(fd, data), attrs)

    def put_file(self, key: str, path: str, attrs: tuple | None = None) -> None:
        with open(path, "rb") as src:
            def fill(fd: int) -> None:
                off = 0
                while chunk := src.read(sparse.CHUNK):
                    sparse.pwrite_sparse(fd, chunk, off)  # (runs of zeros stay holes, as LocalStore.put_file)
                    off += len(chunk)
                os.ftruncate(fd, off)
            self._write(key, fill, attrs)

    def symlink(self, key: str, target: str, mtime_ns: int | None) -> None:
        """A symbolic link at ``key`` to ``target`` (as the commit has it; never followed here), in place
        of whatever file or link was there."""
        fds, names = self._walk(key, True)
        dfd, name = fds[-1], names[-1]
        try:
            tmp = TMP_PREFIX + uuid.uuid4().hex
            os.symlink(target, tmp, dir_fd=dfd)
            try:
                if mtime_ns is not None:
                    os.utime(tmp, ns=(mtime_ns, mtime_ns), dir_fd=dfd, follow_symlinks=False)
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException as e:
                os.unlink(tmp, dir_fd=dfd)
                if isinstance(e, (IsADirectoryError, NotADirectoryError)) or getattr(e, "errno", 0) == errno.ENOTEMPTY:
                    raise self._conflict(key) from e
                raise
            os.fsync(dfd)
        finally:
            _close_all(fds)

    def delete(self, key: str) -> None:
        """Remove ``key``'s file, then each directory on its way that this left empty (as
        :meth:`LocalStore.delete`); nothing if it is not there."""
        got = self._walk(key, False)
        if got is None:
            return
        fds, names = got
        try:
            try:
                os.unlink(names[-1], dir_fd=fds[-1])
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return  # (gone already, or a directory of other files)
            except PermissionError:
                if not stat.S_ISDIR(os.stat(names[-1], dir_fd=fds[-1], follow_symlinks=False).st_mode):
                    raise
                return
            for i in range(len(fds) - 1, 0, -1):
                try:
                    os.rmdir(names[i - 1], dir_fd=fds[i - 1])  # fails (and stops here) unless empty
                except OSError:
                    return
        finally:
            _close_all(fds)


def _kind(mode: str | None, link: str | None) -> str:
    """What an entry stands for by its POSIX metadata: "file" (also with none), "link" or "other"."""
    if link is not None:
        return "link"
    if mode is None:
        return "file"
    try:
        fmt = stat.S_IFMT(int(mode, 8))
    except ValueError:
        return "file"
    return "file" if fmt in (0, stat.S_IFREG) else "link" if fmt == stat.S_IFLNK else "other"


def _perm(mode: str | None) -> int | None:
    try:
        return None if mode is None else int(mode, 8) & 0o777
    except ValueError:
        return None


def _ns(mtime: str | None) -> int | None:
    try:
        return None if mtime is None else int(mtime)
    except ValueError:
        return None


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _copy_one(out, src, skey: str, key: str, size: int, etag: str, *attrs) -> None:
    """One object onto the destination, checked against its entry (size; the MD5 of a plain etag)
    before it is put: an export that writes _SUCCESS holds the commit's bytes, never a changed file's.
    ``attrs``: a local destination's (mode, mtime) for :meth:`NoFollowDest.put`."""
    if size > _BIG:
        fd, tmp = tempfile.mkstemp(prefix="lakefuse-export-")
        os.close(fd)
        try:
            src.get_to_file(skey, tmp)
            with open(tmp, "rb") as f:
                _check(key, os.fstat(f.fileno()).st_size, size, etag, f)
            out.put_file(key, tmp, *attrs)
        finally:
            os.unlink(tmp)
    else:
        data = src.get(skey)
        _check(key, len(data), size, etag, data)
        out.put(key, data, *attrs)


def export(spark, repo, ref: str, dest_uri: str, previous: str | None = None, full: bool = False,
           partitions: int | None = None, store_config: StoreConfig | None = None) -> ExportResult:
    """Copy the commit ``ref`` resolves to onto ``dest_uri``; incremental when possible (see the module doc)."""
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    started = time.time()
    commit = repo.get_commit(ref)
    ns = namespace_of(repo)
    cfg = store_config if store_config is not None else repo.config.store
    dest = Namespace(dest_uri.rstrip("/"), cfg)
    if _overlap(dest.uri, ns.uri):
        raise InvalidArgument("the export destination must be outside the repository's storage namespace "
                              "(and hold none of it)")
    for marker in (SUCCESS, INCOMPLETE):  # (its copy would be overwritten by the marker, without a word)
        if repo.exists(commit.id, marker):
            raise InvalidArgument(f"commit {commit.id[:12]} holds {marker} at its root, where an export writes its "
                                  "own marker: the copy would lose it (rename or remove it in a commit first)")
    prev_id = None
    partial: list[str] = []  # commits a run cut short may have left in part at the destination
    stale_from = None  # a full export onto an export of this repository: what that one had and this lacks goes
    if full:
        try:
            done = read_success(dest.uri, cfg)
        except CorruptedData:  # (--full copies whatever the destination's _SUCCESS: one not an export's too)
            done = None
        if done and _ours(done, repo, ns):
            stale_from = _commit_or_none(repo, done.get("commit_id"))
    else:
        done = read_success(dest.uri, cfg)
        cut = read_success(dest.uri, cfg, INCOMPLETE)  # an export cut short: its previous, its commit
        if previous is not None:
            prev_id = repo.get_commit(previous).id
        elif done and _ours(done, repo, ns):
            prev_id = _commit_or_none(repo, done.get("commit_id"))
        elif cut and _ours(cut, repo, ns) and cut.get("previous"):
            prev_id = _commit_or_none(repo, cut["previous"])  # (what it deleted stays deleted: the diff again)
        if cut and _ours(cut, repo, ns):
            # what it copied of a commit other than this one (the branch moved since) is undone
            # below: the difference from each such commit is applied too
            for c in [cut.get("commit_id"), *(cut.get("partial") or [])]:
                cid = _commit_or_none(repo, c)
                if cid is not None and cid not in (commit.id, prev_id) and cid not in partial:
                    partial.append(cid)

    def posix(md):  # (what a local destination keeps of an entry's POSIX metadata, and what tells a link)
        return [md[POSIX_MODE].alias("mode"), md[POSIX_SYMLINK].alias("link"), md[POSIX_MTIME].alias("mtime")]

    def changes_from(base_id: str):
        return diff_df(spark, repo, base_id, commit.id).select(
            F.when(F.col("diff_type") == "removed", F.lit("delete")).otherwise(F.lit("copy")).alias("op"),
            "key",
            F.col("right.address").alias("address"),
            F.col("right.address_type").alias("address_type"),
            F.coalesce(F.col("right.size"), F.lit(0)).alias("size"),
            F.col("right.etag").alias("etag"),
            *posix(F.col("right.user_metadata")),
        )

    if prev_id is not None:
        plan = changes_from(prev_id)
    else:
        plan = entries_df(spark, repo, commit.id).select(F.lit("copy").alias("op"), "key", "address",
                                                         "address_type", "size", "etag",
                                                         *posix(F.col("user_metadata")))
        if stale_from is not None and stale_from != commit.id:
            plan = plan.unionByName(changes_from(stale_from).where(F.col("op") == "delete"))
    for cid in partial:  # (the same key in two plans: the same op, to this commit's version)
        plan = plan.unionByName(changes_from(cid))
    if partial:
        plan = plan.dropDuplicates(["key"])
    plan = plan.where(~F.col("key").endswith("/"))  # directory markers (empty dirs of the mount): no object
    bad_key = F.col("key").contains("//") | F.col("key").startswith("/")
    first_bad = plan.where((F.col("op") == "copy") & bad_key).select("key").limit(1).collect()
    plan = plan.where(~bad_key)  # (a deletion of such a key: no export can have written it)
    if first_bad:  # (refused before the destination is touched: a complete export there stays so)
        raise InvalidArgument(f"commit {commit.id[:12]} holds the key {first_bad[0].key!r}, which has an empty path "
                              "segment ('//' or a leading '/'): no export destination can hold it as it is (the "
                              "mount hides it too); move or remove it in a commit, then export again. The "
                              "destination was not changed")
    out = open_store(dest.uri, cfg)
    try:
        if out.exists(INCOMPLETE):
            _sweep_cut_short(out, started, dest.uri)
        # from now on the destination is not a complete export; a run cut short leaves this behind,
        # and the next one goes on from the same previous export (not a full one, which would keep
        # what the diff removes)
        out.put(INCOMPLETE, json.dumps({"commit_id": commit.id, "repository": repo.name,
                                        "storage_namespace": ns.uri, "previous": prev_id,
                                        "partial": partial}).encode())
        out.delete(SUCCESS)
        nparts = partitions or spark.sparkContext.defaultParallelism * 2
        rows = []
        # the deletions first: a path that went from a directory to a file (or back) is free by the
        # time its copy comes (a directory a deletion emptied goes with it)
        for part in ((plan.where(F.col("op") == "delete"), plan.where(F.col("op") != "delete"))
                     if prev_id is not None or partial or stale_from else (plan,)):
            rows += part.repartition(nparts).mapInArrow(
                _copy_task(ns, dest), "copied long, deleted long, bytes long, links long, skipped long").collect()
        copied = sum(r.copied for r in rows)
        links, skipped = sum(r.links for r in rows), sum(r.skipped for r in rows)
        deleted = sum(r.deleted for r in rows)
        nbytes = sum(r.bytes for r in rows)
        out.put(SUCCESS, json.dumps({
            "commit_id": commit.id,
            "repository": repo.name,
            "storage_namespace": ns.uri,
            "ref": ref,
            "previous": prev_id,
            "exported": datetime.now(timezone.utc).isoformat(),
            "copied": copied,
            "deleted": deleted,
            "links": links,
            "skipped": skipped,
        }).encode())
        out.delete(INCOMPLETE)
    finally:
        out.close()
    res = ExportResult(commit.id, prev_id, copied, deleted, nbytes, time.monotonic() - t0, links, skipped)
    log.info("export %s -> %s: %d copied, %d deleted (%s) in %.1f s", commit.id[:12], dest.uri, copied, deleted,
             "incremental from " + prev_id[:12] if prev_id else "full", res.seconds)
    return res


def _sweep_cut_short(out, started: float, uri: str) -> None:
    """A run cut short (killed) left what the copies it had under way were writing, which
    nothing else removes: in a local destination their temp files, on S3 their open multipart
    uploads (their parts billed). Every one last active before this run began goes (best
    effort: what cannot be removed is logged, and the export goes on)."""
    from graveler.objstore.s3_uploads import sweep_left_behind  # (boto3's modules: only when needed)

    swept = sweep_left_behind(out, started, min_age_s=0)
    if swept is None:
        return
    if swept.files:
        log.info("export to %s: %d %ss of a run cut short %s (%d bytes)", uri, swept.files, swept.kind,
                 "aborted" if swept.kind == "multipart upload" else "removed", swept.bytes)
    if swept.failed:
        log.warning("export to %s: %d %ss of a run cut short (or listings of them) failed; the export goes on",
                    uri, swept.failed, swept.kind)
