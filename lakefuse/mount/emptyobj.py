"""The mount's shared empty object: what every empty file, directory marker, symlink and
special file it makes points at (one upload, not one per create).

Garbage collection deletes an object no entry names once it is older than the mark's
``--min-age``, so the mount must not name one that old: it uploads a new one once its own is
:data:`EMPTY_MAX_AGE_S` old, in a thread of its own, and names the old one until the new one
is there -- a create never waits for the store, and a store that is down or hung then fails
no create (the saves are what wait for it, kept in the spool). The stamp watch asks for the
renewal each round (:meth:`EmptyObject.tick`), so a mount idle for an hour does not name an
hour-old object at its next create. Only the first use uploads in the caller (a mount warms it
up at start: :meth:`EmptyObject.warm`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from graveler.model import Entry

log = logging.getLogger("lakefuse.mount.emptyobj")

# The age at which the shared empty object is uploaded anew (GC's --help says to keep --min-age
# above 12 minutes: the renewal has two minutes to go through).
EMPTY_MAX_AGE_S = 600.0
RETRY_S = 30.0  # a renewal that failed (the store away) is tried again after this


class EmptyObject:
    def __init__(self, repo):
        self.repo = repo
        self._entry: Entry | None = None
        self._at = 0.0  # time.monotonic() when the one in use was uploaded (or its renewal last failed)
        self._lock = threading.Lock()
        self._renewing = False
        self._failed = False

    @property
    def ready(self) -> bool:
        """Whether :meth:`entry` answers without the store (it was uploaded once)."""
        return self._entry is not None

    def entry(self) -> Entry:
        """The shared empty object, as an entry (uploaded here only on first use)."""
        e = self._entry
        if e is not None:
            if time.monotonic() - self._at >= EMPTY_MAX_AGE_S:
                self.tick()
            return e
        with self._lock:
            if self._entry is None:
                at = time.monotonic()
                self._entry = self._upload()
                self._at = at
            return self._entry

    def _upload(self) -> Entry:
        return replace(self.repo.put_object(b""), last_modified_ns=0)

    def tick(self) -> None:
        """Start the renewal in a thread of its own when it is due (never blocks: with the lock
        held by a first upload, there is nothing to renew yet)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._entry is None or self._renewing or time.monotonic() - self._at < EMPTY_MAX_AGE_S:
                return
            self._renewing = True
        finally:
            self._lock.release()
        threading.Thread(target=self._renew, name="lakefuse-empty-object", daemon=True).start()

    def warm(self) -> None:
        """Upload it now if it is not yet (mount start: a later create then needs no store)."""
        try:
            self.entry()
        except Exception as exc:  # noqa: BLE001 -- the first create tries again
            log.warning("the mount's empty object could not be uploaded at start (%s): the first create "
                        "tries again", exc)

    def _renew(self) -> None:
        at = time.monotonic()
        try:
            e = self._upload()
        except Exception as exc:  # noqa: BLE001 -- the old one stays in use; tried again in RETRY_S
            with self._lock:
                self._at = at - EMPTY_MAX_AGE_S + RETRY_S
                self._renewing = False
                said, self._failed = self._failed, True
            if not said:
                log.warning("the mount's empty object could not be renewed (%s): tried again every %.0f s", exc,
                            RETRY_S)
            return
        with self._lock:
            self._entry, self._at, self._renewing = e, at, False
            said, self._failed = self._failed, False
        if said:
            log.info("the mount's empty object is renewed")
