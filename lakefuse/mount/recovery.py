"""Spool recovery: what a killed mount daemon left in its spool, taken over by the next mount.

:meth:`lakefuse.mount.spool.Spool.recover` finds the instance directories of dead
mounts of the same repository (their flock free) and hands each to
:func:`recover_instance`, which decides the fate of every leftover spool file:

* its content is what the last acknowledged save of it staged (the sidecar records
  that save), or what the branch shows at its key: it was saved -- the copy is deleted;
* else it holds what was written to the file and never acknowledged as saved (the
  daemon died before close/fsync returned): the ext4 answer after a process kill is
  that the file holds what was written to it, so the bytes are uploaded and **staged
  at its key** -- if the branch still shows there what that file last knew (the
  entry it was opened, saved or renamed with: the sidecar's ``expect``), by
  compare-and-set (:meth:`graveler.Repository.stage_if`). If another writer (another
  mount, host or the CLI) saved that path meanwhile, or the branch is gone, the newer
  version is not put under: the bytes are moved to ``recovered/<stamp>/<branch>/<key>``
  with the reason;
* if the store or the KV cannot take it now (down, or its disk full), it *waits*: left where it
  is, its dead mount's instance directory kept, and a record of unsaved writes put on its
  branch for that mount (:mod:`graveler.fences`), so no commit -- from this mount, the CLI or
  another host -- publishes the file as the branch shows it (empty, or the version before);
  the live mount tries again every :data:`RETRY_S` (:class:`RecoveryRetry`), and the record
  goes once it is staged;
* a file unlinked while open: deleted (nothing to save).

Staged and kept files are listed in ``recovered/<stamp>/REPORT.json`` and the log, and
:meth:`RecoveryReport.lines` is what ``lakefuse mount`` prints on its terminal.

Layout under the mount's cache directory::

    <cache>/spool/<repo>/<instance>/lock        flock'ed for the life of one mount
    <cache>/spool/<repo>/<instance>/owner.json  which repository (namespace, creation date) it serves
    <cache>/spool/<repo>/<instance>/<sid>.data  content of one file being written; where it
                                                belongs (branch, key: for recovery) is its xattr
                                                (<sid>.json beside it where xattrs are not kept:
                                                :mod:`lakefuse.mount.sidecar`)
    <cache>/spool/<repo>/<instance>/<id>.intent an operation in progress (a directory rename)
    <cache>/spool/<repo>/recovered/<stamp>/     spool leftovers a crash left behind

Each mount uses its own instance directory, so two mounts of one repository with
the same cache directory never touch each other's files. An instance directory is
made under a hidden name (``.new-*``) and gets its name only once its lock is held,
so a recovery running at the same moment never sees a live mount's directory
unlocked. :meth:`Spool.recover` (run when a mount starts) takes over what dead mounts
of the same repository left, by the rules above.
A copy-in of a saved file is made as ``<sid>.copyin`` and renamed to ``<sid>.data``
once whole: a daemon killed during it leaves nothing recovery could take for work.
Unfinished intents are returned to the caller, who finishes them (a directory
rename is idempotent, so it is simply run again).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from graveler import fences
from graveler.errors import GravelerError, NotFound, StoreUnavailable
from graveler.model import Entry
from graveler.objects import PosixAttrs, file_etag, user_metadata
from graveler.objstore.base import refuse_unsafe_dir
from lakefuse.mount import sidecar

log = logging.getLogger("lakefuse.mount.spool")

RECOVERED_DIR = "recovered"  # <cache>/spool/<repo>/recovered/<stamp>/: what recovery kept, not staged
LOCK_NAME = "lock"  # <instance>/lock: flock'ed for the life of one mount
PENDING_PREFIX = ".new-"  # an instance directory being made (not locked yet): never recovered
OWNER_NAME = "owner.json"  # <instance>/owner.json: which repository it served (Spool._owner)
PENDING_STALE_S = 600  # a pending directory this old belongs to a daemon that died while starting
RETRY_S = 30.0  # leftovers the store or the KV could not take (waiting) are tried again this often


class StageLater(Exception):
    """A leftover the store or the KV cannot take now (down, full): it waits, tried again."""


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True))
    os.replace(tmp, path)


@dataclass(frozen=True)
class Recovered:
    """One spool leftover found by :meth:`Spool.recover`."""

    branch: str | None
    key: str | None
    size: int
    # "saved" (already staged: copy deleted), "staged" (its bytes staged at its key now),
    # "kept" (moved to recovered_path, not staged: ``reason`` says why) or "waiting" (the store or
    # the KV could not take it now: left in the spool at recovered_path, tried again; commits of its
    # branch refused meanwhile)
    action: str
    recovered_path: str | None = None
    reason: str | None = None


@dataclass
class RecoveryReport:
    files: list[Recovered] = field(default_factory=list)
    intents: list[dict] = field(default_factory=list)  # unfinished operations to run again
    directory: str | None = None  # recovered/<stamp>, when files were staged or kept

    @property
    def kept(self) -> list[Recovered]:
        return [r for r in self.files if r.action == "kept"]

    @property
    def staged(self) -> list[Recovered]:
        return [r for r in self.files if r.action == "staged"]

    @property
    def waiting(self) -> list[Recovered]:
        return [r for r in self.files if r.action == "waiting"]

    def lines(self, limit: int = 20) -> list[str]:
        """What the mount tells its user on the terminal: one line per file staged or kept
        (at most ``limit``, then how many more), the directory of the report."""
        shown = self.staged + self.kept + self.waiting
        out = []
        for r in shown[:limit]:
            where = f"{r.branch}/{r.key}" if r.branch and r.key else "?"
            if r.action == "staged":
                out.append(f"recovered {where}: {r.size} bytes the previous mount left unsaved (its daemon "
                           "killed, or the save still failing when it stopped), staged (not committed)")
            elif r.action == "waiting":
                out.append(f"NOT recovered yet {where}: {r.size} bytes, {r.reason}; kept in {r.recovered_path} and "
                           f"tried again every {RETRY_S:.0f} s; commits of branch {r.branch} are refused until then")
            else:
                out.append(f"NOT recovered {where}: {r.size} bytes kept in {r.recovered_path} ({r.reason})")
        if len(shown) > limit:
            out.append(f"... and {len(shown) - limit} more")
        if self.directory:
            out.append(f"spool recovery report: {self.directory}/REPORT.json")
        return out

    def write(self, out_dir: Path, stamp: str, repository: str) -> None:
        """``REPORT.json`` in ``out_dir`` and the log's warnings, when anything was staged or kept."""
        if self.kept or self.staged:
            self.directory = str(out_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            _write_json(out_dir / "REPORT.json", {
                "recovered_at": stamp,
                "repository": repository,
                "note": "content written through the mount whose close/fsync never returned success "
                        "(the daemon died first, or the save still failed when the mount stopped): "
                        "'staged' files hold it at their path now (not committed); "
                        "'kept' ones are here, not staged (see reason)",
                "files": [r.__dict__ for r in self.files if r.action != "saved"],
            })
        if self.staged:
            log.warning("spool: %d file(s) a previous mount left unsaved were recovered and staged: %s",
                        len(self.staged), ", ".join(f"{r.branch}/{r.key}" for r in self.staged[:20]))
        if self.kept:
            log.warning("spool: %d unsaved file(s) from a previous mount were kept in %s, not staged "
                        "(see REPORT.json)", len(self.kept), out_dir)


# the leftovers (their spool files) whose wait was said: a warning once, then the retries at debug level
_SAID_WAITING: set[str] = set()


class RecoveryRetry:
    """Runs the recovery again (``run``: the mount's) while leftovers wait, every :data:`RETRY_S`;
    asked by the stamp watch's round (:meth:`tick`), in a thread of its own (a hung store never
    holds the caller)."""

    def __init__(self, run):
        self._run = run
        self._lock = threading.Lock()
        self._due: float | None = None
        self._busy = False

    def after(self, report: "RecoveryReport | None") -> None:
        """A recovery ran and left ``report``: due again if files of it wait."""
        with self._lock:
            self._due = time.monotonic() + RETRY_S if report is not None and report.waiting else None

    def tick(self) -> None:
        with self._lock:
            if self._due is None or self._busy or time.monotonic() < self._due:
                return
            self._busy = True
        threading.Thread(target=self._again, name="lakefuse-recovery-retry", daemon=True).start()

    def _again(self) -> None:
        try:
            report = self._run()
        except Exception as e:  # noqa: BLE001 -- tried again in RETRY_S
            log.warning("spool: recovery tried again, failed: %s", e)
            with self._lock:
                self._busy, self._due = False, time.monotonic() + RETRY_S
            return
        with self._lock:
            self._busy = False
        self.after(report)
        if report is not None and report.staged:
            log.warning("spool: recovered at last: %s", ", ".join(f"{r.branch}/{r.key}" for r in report.staged[:20]))


def _entry_etag(repo, branch: str, key: str) -> str | None:
    try:
        return repo.get(branch, key).etag
    except (NotFound, GravelerError):
        return None


def recover_spool(spool) -> RecoveryReport:
    """:meth:`lakefuse.mount.spool.Spool.recover`: hand the instance directories of dead mounts of
    ``spool``'s repository to :func:`recover_instance`; a live mount's (locked) is left alone."""
    report = RecoveryReport()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = spool.config.root / RECOVERED_DIR / stamp
    for inst in sorted(spool.config.root.iterdir()):
        if inst == spool.dir or inst.name == RECOVERED_DIR or not inst.is_dir():
            continue
        if inst.name.startswith(PENDING_PREFIX):
            _drop_stale_pending(inst)
            continue
        try:
            fd = os.open(inst / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            continue  # another recovery just removed it
        except OSError as e:
            log.warning("spool: cannot open %s: %s", inst, e)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live mount
            if not owned(spool, inst):
                log.info("spool: %s belongs to another repository named %s; left alone",
                         inst, spool.config.repository)
                continue
            if recover_instance(spool.repo, inst, out_dir, report):
                continue  # files wait: the instance stays (and its records of unsaved writes)
            _drop_unsaved(spool.repo, inst)
            shutil.rmtree(inst, ignore_errors=True)  # still locked: no other recovery takes it meanwhile
        finally:
            os.close(fd)
    report.write(out_dir, stamp, spool.config.repository)
    return report


def writer_id(instance_dir) -> str:
    """The ID of a mount instance (its spool directory, on this host) in records of unsaved writes."""
    return hashlib.sha256(f"{socket.gethostname()}\0{instance_dir}".encode()).hexdigest()[:16]


def _drop_unsaved(repo, inst: Path) -> None:
    """The dead instance's records of unsaved writes (:mod:`graveler.fences`) go: what it could not
    save is staged or kept in ``recovered/`` now, and commits need not wait for it any more."""
    try:
        if n := repo.drop_unsaved_of(writer_id(inst)):
            log.info("spool: %s: its %d record(s) of unsaved writes removed (taken over)", inst, n)
    except GravelerError as e:
        log.warning("spool: cannot remove the records of unsaved writes of %s: %s", inst, e)


def owned(spool, inst: Path) -> bool:
    """Whether instance ``inst`` served the repository ``spool`` serves (one without an owner
    record, made by an older version, is taken as that repository's)."""
    try:
        owner = json.loads((inst / OWNER_NAME).read_text())
    except FileNotFoundError:
        return True
    except (OSError, ValueError) as e:
        log.warning("spool: unreadable %s (%s); left alone", inst / OWNER_NAME, e)
        return False
    return owner == spool._owner()


def _drop_stale_pending(inst: Path) -> None:
    """Remove a ``.new-*`` directory of a daemon that died while starting (it holds no
    content: only its owner record and lock); a recent or locked one is left alone."""
    try:
        if time.time() - inst.stat().st_mtime < PENDING_STALE_S:
            return
        fd = os.open(inst / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        shutil.rmtree(inst, ignore_errors=True)
        return
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(inst, ignore_errors=True)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)


def recover_instance(repo, inst: Path, out_dir: Path, report: RecoveryReport) -> bool:
    """Take over the leftovers of one dead mount instance ``inst`` (its lock held by the caller):
    see the module docstring. Whether files of it wait (the instance is to be kept)."""
    waiting: dict[str, list[str]] = {}  # branch -> keys whose leftovers wait
    why = ""  # (the last reason one waits: the records say it)
    for p in sorted(inst.glob("*.intent")):
        try:
            report.intents.append(json.loads(p.read_text()))
        except (OSError, ValueError) as e:
            log.warning("spool: unreadable intent %s (%s); ignored", p, e)
    journal = sidecar.records(inst)
    for data in sorted(inst.glob("*.data")):
        meta = sidecar.read(data, journal)
        branch, key = meta.get("branch"), meta.get("key")
        size = data.stat().st_size
        if not meta and size == 0:
            os.unlink(data)  # made, its record not set yet, when the daemon died: nothing was written to it
            continue
        if branch and meta.get("key", "") is None:
            os.unlink(data)  # unlinked while open: nothing to save
            continue
        # its etag in the form of the save it may repeat (an MD5, or a large file's composite)
        like = meta.get("saved_etag") or (_entry_etag(repo, branch, key) if branch and key else None)
        fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
        try:
            etag = file_etag(fd, size, like)
        finally:
            os.close(fd)
        acked = meta.get("saved_etag") == etag and meta.get("saved_size") == size
        if branch and key and (acked or _already_saved(repo, branch, key, etag, size)):
            os.unlink(data)
            report.files.append(Recovered(branch, key, size, "saved"))
            log.info("spool: %s on %s was saved before the crash; dropped its spool copy", key, branch)
            continue
        reason = "no branch or path recorded for it"
        if branch and key and meta.get("expect_known"):
            try:
                reason = _stage_leftover(repo, branch, key, meta, data, etag)
            except StageLater as e:
                waiting.setdefault(branch, []).append(key)
                why = str(e)
                report.files.append(Recovered(branch, key, size, "waiting", str(data), str(e)))
                said = _SAID_WAITING
                if len(said) > 10_000:
                    said.clear()
                log.log(logging.DEBUG if str(data) in said else logging.WARNING,
                        "spool: %s on branch %s: %d bytes a previous mount left unsaved wait in %s: %s; "
                        "tried again every %.0f s", key, branch, size, data, e, RETRY_S)
                said.add(str(data))  # (said once: the retries every RETRY_S say it again at debug level)
                continue
            if reason is None:
                os.unlink(data)
                report.files.append(Recovered(branch, key, size, "staged"))
                log.warning("spool: %s on branch %s: %d bytes a previous mount left unsaved, staged",
                            key, branch, size)
                continue
        elif branch and key:
            reason = "left by an older version of lakefuse, which did not record what it was written over"
        rel = Path(branch or "unknown-branch") / (key if key else data.stem)
        dest = out_dir / rel
        if dest.exists() or not _inside(out_dir, dest):
            dest = out_dir / "unknown-branch" / data.stem
        dest.parent.mkdir(parents=True, exist_ok=True)
        _own_copy(data)  # kept for the user: never another name of a stored (perhaps committed) object
        shutil.move(str(data), dest)
        report.files.append(Recovered(branch, key, size, "kept", str(dest), reason))
        log.warning("spool: unsaved content of %s on branch %s (%d bytes) kept in %s, not staged: %s",
                    key, branch, size, dest, reason)
    if waiting:
        _hold_commits(repo, inst, waiting, why)
    return bool(waiting)


def _hold_commits(repo, inst: Path, waiting: dict[str, list[str]], why: str) -> None:
    """Records of unsaved writes for the dead instance ``inst`` on each branch where its files wait:
    no commit publishes them as their branches show them meanwhile (best effort: the KV may be
    what is down -- then no commit runs either)."""
    records = {b: fences.new_unsaved(sorted(keys), len(keys), why, spool=str(inst)) for b, keys in waiting.items()}
    try:
        repo.set_unsaved(writer_id(inst), records)
    except GravelerError as e:
        log.warning("spool: could not note the waiting files of %s in the KV: %s", inst, e)


def _stage_leftover(repo, branch: str, key: str, meta: dict, data: Path, etag: str) -> str | None:
    """Stage a killed daemon's leftover at its key -- what ext4 shows after a process
    kill: the file holds what was written to it -- if the branch still shows there what
    that file last knew (the sidecar's ``expect``; compare-and-set with
    :meth:`graveler.Repository.stage_if`): another writer's newer save is never put
    under. None when staged, else why not (the caller keeps the file as a copy of its own: a
    local store may have linked it as an object). Its attributes, user metadata and content type are
    what its record says the file had (its mtime the spool file's unless one was set); a record
    of an older lakefuse has none: then the replaced entry's (a new file came back 0644, owned by
    the daemon's user, and a chmod, chown, utimens or setxattr that had returned was lost)."""
    expect = bytes.fromhex(meta["expect"]) if meta.get("expect") else None
    try:
        cur = repo.get(branch, key)
    except NotFound:
        cur = None
    except StoreUnavailable as e:
        raise StageLater(f"the KV could not be read ({e})") from e
    except GravelerError as e:
        return f"cannot read branch {branch}: {e}"
    if (None if cur is None else cur.identity()) != expect:
        return ("the branch shows another version at this path, saved after this content was written "
                "(by another writer or host): not put over it")
    md: dict[str, str] = {}
    content_type = ""
    set_mtime = None
    if isinstance(meta.get("attrs"), dict) and isinstance(meta.get("user_metadata"), dict):
        md = {str(k): str(v) for k, v in meta["user_metadata"].items()}
        pa = PosixAttrs.from_metadata({str(k): str(v) for k, v in meta["attrs"].items()})
        set_mtime = pa.mtime_ns
        md.update(pa.to_metadata())
        content_type = str(meta.get("content_type") or "")
    elif cur is not None:
        md = user_metadata(cur.metadata)
        pa = PosixAttrs.from_metadata(cur.metadata)
        md.update(replace(pa, mtime_ns=None, atime_ns=None).to_metadata())  # its mtime: the content's
        content_type = cur.content_type
    try:
        mtime = data.stat().st_mtime_ns if set_mtime is None else set_mtime
        # handed over: a local store links the file into place (nothing copied); it is unlinked here after
        entry = repo.put_object(str(data), content_type=content_type, metadata=md, adopt=True, etag=etag)
        entry = Entry(entry.address, entry.size, entry.etag, mtime, entry.metadata,
                      entry.address_type, entry.content_type)
        if not repo.stage_if(branch, key, entry, expect):
            return ("the branch shows another version at this path, saved after this content was written "
                    "(by another writer or host): not put over it")
    except (StoreUnavailable, OSError) as e:  # (down, or its disk full): it waits
        _own_copy(data)  # (never another name of a stored object while it waits)
        raise StageLater(f"the store or the KV could not take it now ({e})") from e
    except GravelerError as e:
        return f"could not stage it: {e}"
    return None


def _own_copy(data: Path) -> None:
    """Make ``data`` a file of its own if a local store linked it as an object."""
    try:
        if data.stat().st_nlink > 1:
            tmp = data.with_suffix(".own")
            shutil.copyfile(data, tmp)
            os.replace(tmp, data)
    except OSError as e:
        log.warning("spool: cannot copy %s apart from the store: %s", data, e)


def keep_copy(root: Path, branch: str, key: bytes, data: Path) -> Path:
    """Copy a live spool file whose save can never succeed to ``root/<stamp>/<branch>/<key>``
    (a copy: the live file may be a stored object's other name); where it went."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = root / stamp / branch / key.decode("utf-8", "surrogateescape")
    if dest.exists() or not _inside(root, dest):
        dest = root / stamp / "unknown-branch" / data.stem
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data, dest)
    return dest


def _already_saved(repo, branch: str, key: str, etag: str, size: int) -> bool:
    try:
        e = repo.get(branch, key)
    except (NotFound, GravelerError):
        return False
    return e.etag == etag and e.size == size


def _inside(root: Path, p: Path) -> bool:
    try:
        p.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def make_instance_dir(path: Path, owner: dict) -> int:
    """Make a mount's spool directory ``path`` (under ``spool/<repository>``, made private if
    missing, :func:`refuse_shared`), owned (``owner.json``) and locked: the descriptor holding
    its lock. Made under a hidden name, then renamed: a recovery running meanwhile never finds
    the live directory unlocked (and takes it for a dead mount's)."""
    root = path.parent
    refuse_shared(root, missing_ok=True)  # (nothing made where another user's link points)
    for d in (root.parent.parent, root.parent, root):  # (private, whatever the umask)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    refuse_shared(root)
    pending = root / f"{PENDING_PREFIX}{path.name}"
    pending.mkdir(mode=0o700)
    sidecar.write_json(pending / OWNER_NAME, owner)
    fd = os.open(pending / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(pending, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def refuse_shared(root: Path, missing_ok: bool = False) -> None:
    """InvalidArgument unless a spool's directory and ``spool/`` above it are this user's (or
    root's) and no one else may write them, and the directories above are this user's or root's,
    writable by others only with the sticky bit (as /tmp), with no other user's symbolic link on
    the way (:func:`graveler.objstore.base.refuse_unsafe_dir`): recovery takes what it finds
    under the spool for a dead mount's unsaved work and stages it, and the mount writes its
    files there, so a directory another user could write or point elsewhere (a ``--cache-dir``
    under /tmp) would put their bytes in the branch."""
    refuse_unsafe_dir(str(root), 2, "the spool directory", missing_ok)