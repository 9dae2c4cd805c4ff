"""Failed saves of the write spool: kept, retried in the background, and a gate for commits.

A save (close, fsync, the last release) that fails because the store or the KV does
not answer leaves the file dirty in its spool file (:meth:`lakefuse.mount.spool.SpoolFile.flush`
says why). When no handle holds it any more, :class:`SaveRetries` (a part of
:class:`lakefuse.mount.spool.Spool`) keeps it: its spool file stays in the mount's table
and its inode is held (``Spool.pin``, set by the mount core), so every lookup, ``stat``
and read through the mount shows what was written; a thread tries the failed saves again
1 s later, then twice as long each time up to :data:`RETRY_MAX_S`, until none is left --
the user need not touch the file again, which a program that saw its close fail may
never do. A commit of the branch through the mount first retries its failed saves
(:meth:`SaveRetries.check_saved`) and is refused while one still fails: it would publish
the file as the branch shows it (empty, or the old version); so that commits made elsewhere (the CLI,
another mount, another host on a shared KV) are refused too, the mount keeps a record of its
failing files on each such branch in the KV while any is left (:meth:`SaveRetries.note_unsaved`,
:mod:`graveler.fences`). A save that can never go
through (another writer saved the path since: the compare-and-set of a retried save
fails; or the branch is gone) is given up: the written bytes are copied to the spool's
``recovered/`` and the log says where.
"""

from __future__ import annotations

import logging
import threading
import time

from graveler import fences
from graveler.errors import Conflict, GravelerError, NotFound, RepositoryGone, StoreUnavailable
from graveler.repository import ANY_BIRTH
from lakefuse.mount.recovery import RECOVERED_DIR, keep_copy, writer_id

log = logging.getLogger("lakefuse.mount.spool")

RETRY_FIRST_S = 1.0  # a failed save is retried after this, then twice as long each time...
RETRY_MAX_S = 30.0  # ...up to this
NOTE_RETRY_S = 1.0  # a record of unsaved writes the KV refused is put again this often (not at the saves' pace)


def _name(sf) -> str:
    return "?" if sf.key is None else sf.key.decode("utf-8", "replace")


class SaveRetries:
    """The failed-save part of :class:`lakefuse.mount.spool.Spool` (see the module
    docstring); it uses the spool's ``_lock``, ``_files``, ``pin``, ``config``, ``stats``,
    ``_retrier``, ``_stop``, ``dir`` and ``repo``."""

    _unsaved_lock = threading.Lock()  # (one publisher at a time: the save, the retry and a commit's threads)
    _unsaved_said: dict = {}  # what the records in the KV say, per branch they are on: (files, count, error)
    _unsaved_owed = False  # the KV refused the last record: the retry thread puts it each NOTE_RETRY_S

    def note_unsaved(self, files: list | None = None, again: bool = False) -> None:
        """Put this mount's record of unsaved writes on each branch where saves (of ``files``, else of
        every file) are failing, and remove it where none is left any more (:mod:`graveler.fences`):
        commits from elsewhere are refused meanwhile. Best effort: the KV may be what is down (the
        background retry publishes again at each round while a save fails, ``again``). A record that
        would say what the last one put said is not put again (a failed close notes, then its
        release fails the same way)."""
        with self._unsaved_lock:
            self._note_unsaved_locked(self.failing() if files is None else files, again)

    def _note_unsaved_locked(self, files: list, again: bool = False) -> None:
        failing: dict[str, list] = {}
        for sf in files:
            if sf.failure is not None and sf.key is not None:
                failing.setdefault(sf.branch, []).append(sf)
        if not failing and not self._unsaved_said:
            return  # (the usual case: no KV write)
        said = {b: (sorted(_name(sf) for sf in sfs), len(sfs), str(sfs[0].failure)[:300])
                for b, sfs in failing.items()}
        if not again and said == self._unsaved_said:
            return  # (put already, and saying the same)
        records: dict = dict.fromkeys(self._unsaved_said.keys() - said.keys())
        for branch, (names, count, error) in said.items():
            records[branch] = fences.new_unsaved(names, count, error, spool=str(self.dir))
        try:
            self.repo.set_unsaved(writer_id(self.dir), records)
        except Exception as e:  # noqa: BLE001 -- (the KV away: a commit cannot run either)
            if not self._unsaved_owed:  # (said once per outage: the retry thread tries each second)
                log.warning("spool: could not note the unsaved writes of this mount on branch(es) %s in the KV "
                            "(tried again each %g s): %s", ", ".join(sorted(records)), NOTE_RETRY_S, e)
            self._unsaved_owed = True
            self._ensure_retrier()  # (a removal refused after the last save went through, too)
            return
        if self._unsaved_owed:
            log.warning("spool: noted the unsaved writes of this mount on branch(es) %s in the KV",
                        ", ".join(sorted(records)))
        self._unsaved_said, self._unsaved_owed = said, False

    def _finish(self, sf) -> None:
        """``sf`` is saved: let go of its inode; drop it unless a handle opened it again."""
        with self._lock:
            done = sf.handles == 0 and self._files.get(sf.ino) is sf
            if done:
                del self._files[sf.ino]
                if self.unstaged.get(sf.ino) is sf:  # (given up before its create was ever staged)
                    del self.unstaged[sf.ino]
            pinned, sf.pinned = sf.pinned, False
        if pinned and self.pin is not None:
            self.pin(sf.ino, False)
        if done:
            sf.close()

    def _save_failed(self, sf, e: BaseException, when: str) -> None:
        """The save of a file no handle holds failed: keep it for the background retry, or
        give it up when it can never succeed (another writer saved the path, it is gone)."""
        if isinstance(e, (Conflict, NotFound)):
            self._give_up(sf, e)
            return self.note_unsaved()
        # the store or the KV refused (it is down): its message says why; anything else is a bug
        log.error("could not save %s on branch %s %s (%s); its content stays in the mount and in %s, "
                  "and its save is retried every %d s at most until it goes through", _name(sf), sf.branch, when, e,
                  sf.data_path, RETRY_MAX_S, exc_info=not isinstance(e, (GravelerError, OSError)))
        with self._lock:
            pin = not sf.pinned and sf.handles == 0 and self._files.get(sf.ino) is sf
            sf.pinned = sf.pinned or pin
        if pin and self.pin is not None:
            self.pin(sf.ino, True)
        self._ensure_retrier()
        self.note_unsaved()

    def _ensure_retrier(self) -> None:
        """Start the background retry unless it runs (or the spool is closing)."""
        with self._lock:
            start = self._retrier is None and not self._stop.is_set()
            if start:
                self._retrier = threading.Thread(target=self._retry_loop, name="lakefuse-save-retry", daemon=True)
        if start:
            self._retrier.start()

    def _give_up(self, sf, e: BaseException) -> None:
        """A failed save that can never succeed: the spool copy goes to ``recovered/`` (see
        the log) and the file shows what the branch has."""
        with sf.lock:
            kept = self._keep_copy(sf)
        log.warning("%s on branch %s is not saved: %s; %s", _name(sf), sf.branch, e,
                    f"what was written to it is kept in {kept}" if kept else "nothing of it is kept")
        self._finish(sf)

    def _keep_copy(self, sf):
        """What was written to ``sf`` (under its lock), copied to ``recovered/``: where (None: nothing)."""
        if sf._fd is None or not sf.loaded:
            return None
        return keep_copy(self.config.root / RECOVERED_DIR, sf.branch, sf.key, sf.data_path)

    def branch_deleted(self, sf) -> bool:
        """After a save of ``sf`` failed NotFound: whether its branch is gone (deleted while the
        file was open here). Then what was written is copied to ``recovered/`` (the log says
        where) and the file is detached: its handles go on as an unlinked file's, and its close
        succeeds (it failed ENOENT, which no close of a local file answers)."""
        gone = f"its branch {sf.branch} was deleted"
        try:
            born = self.repo.branch_born(sf.branch)  # (NotFound: gone)
            if sf.born is ANY_BIRTH or born == sf.born:
                return False  # (else a later branch of its name: this one is gone)
        except RepositoryGone as e:
            gone = str(e).split(" since ")[0]  # (the whole repository: say so)
        except NotFound:
            pass
        except GravelerError:  # (the KV down: the save's own failure says so)
            return False
        with sf.lock:
            if sf.key is None:
                return True
            name, kept = _name(sf), self._keep_copy(sf)
            sf.detach()
        log.warning("%s: %s while it was open for writing here; as an unlinked file's, "
                    "its close saves nothing: %s", name, gone,
                    f"what was written to it is kept in {kept}" if kept else "nothing of it was written here")
        return True

    def failing(self, branch: str | None = None) -> list:
        """The files (of ``branch``) whose last save failed."""
        return [sf for sf in self.open_files() if sf.failure is not None and sf.key is not None
                and (branch is None or sf.branch == branch)]

    def retry_saves(self, branch: str | None = None, until_outage: bool = False) -> list:
        """Try the failed saves (of ``branch``) again now; the files still failing. ``until_outage``:
        after one fails because the store or the KV does not answer, the others are not tried (each
        would wait out the same bound: a commit refused at once, not after minutes)."""
        left = []
        outage = False
        for sf in self.failing(branch):
            if until_outage and outage:
                left.append(sf)
                continue
            self.stats["save_retries"] += 1
            try:
                sf.flush()
            except Exception as e:
                outage = isinstance(e, StoreUnavailable)
                if isinstance(e, (Conflict, NotFound)):
                    if sf.handles == 0:
                        self._give_up(sf, e)
                    else:  # never going through: left to its handles (their close says so, EBUSY)
                        with sf.lock:
                            sf.failure = None
                elif sf.failure is not None:
                    left.append(sf)
                continue
            log.warning("saved %s on branch %s: its earlier save had failed", _name(sf), sf.branch)
            self._finish(sf)
        self.note_unsaved(again=True)  # (put again each round: the KV may have been away when it was first put)
        return left

    def check_saved(self, branch: str) -> None:
        """Before a commit of ``branch``: retry its failed saves; if any still fails, refuse
        (the commit would publish such a file as the branch shows it, e.g. empty)."""
        left = self.retry_saves(branch, until_outage=True)
        if left:
            names = ", ".join(sf.key.decode("utf-8", "replace") for sf in left[:10])
            more = f" and {len(left) - 10} more" if len(left) > 10 else ""
            err = left[0].failure
            cls = StoreUnavailable if isinstance(err, StoreUnavailable) else GravelerError
            raise cls(f"commit refused: the save of {len(left)} file(s) written through this mount failed and is "
                      f"retried until it goes through: {names}{more} (last error: {err}); nothing was committed "
                      "(the commit would publish them without what was written); commit again once they are saved")

    def _retry_loop(self) -> None:
        """The background retry: failed saves tried again after 1 s, then twice as long each
        time up to :data:`RETRY_MAX_S`, while any is left; the thread ends when none is. A
        record of unsaved writes the KV refused is put again each :data:`NOTE_RETRY_S` meanwhile."""
        delay = RETRY_FIRST_S
        due = time.monotonic() + delay
        while not self._stop.wait(max(0.0, min(due - time.monotonic(), NOTE_RETRY_S))):
            if time.monotonic() < due:  # (the KV may be back before the store: a record it refused goes now)
                if self._unsaved_owed:
                    self.note_unsaved(again=True)
                continue
            try:
                left = self.retry_saves()
            except Exception:
                log.error("spool: the retry of failed saves failed", exc_info=True)
                left = True
            with self._lock:
                if not left and not self._unsaved_owed and \
                        not any(sf.failure is not None and sf.key is not None for sf in self._files.values()):
                    self._retrier = None  # (a record's removal the KV refused keeps it going: see NOTE_RETRY_S)
                    return
            delay = min(delay * 2, RETRY_MAX_S)
            due = time.monotonic() + delay
        with self._lock:
            self._retrier = None
