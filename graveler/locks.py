"""One shared/exclusive lock, for the few places that need "many at once, or one alone".

``RWLock.shared()`` and ``RWLock.exclusive()`` are context managers: any number of
holders share it, an exclusive holder waits until they are gone and keeps new shared
holders out while it waits (so a resize of LMDB's map, or a directory rename on a
branch tree, is not starved by a stream of readers). Not reentrant. The context
managers are small slotted objects, not generators: a shared hold is on hot paths.
"""

from __future__ import annotations

import threading


class RWLock:
    """Shared/exclusive lock (see the module docstring)."""

    __slots__ = ("_cond", "_shared", "_exclusive")

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    def shared(self) -> "_Shared":
        return _Shared(self)

    def exclusive(self) -> "_Exclusive":
        return _Exclusive(self)

    def try_shared(self) -> bool:
        """Take the lock shared if that needs no wait (nobody holds or wants it exclusively);
        False otherwise. Let go with :meth:`release_shared`."""
        with self._cond:
            if self._exclusive:
                return False
            self._shared += 1
            return True

    def release_shared(self) -> None:
        with self._cond:
            self._shared -= 1
            if not self._shared:
                self._cond.notify_all()


class _Shared:
    __slots__ = ("lock",)

    def __init__(self, lock: RWLock):
        self.lock = lock

    def __enter__(self) -> None:
        lk = self.lock
        with lk._cond:
            while lk._exclusive:
                lk._cond.wait()
            lk._shared += 1

    def __exit__(self, *exc) -> None:
        lk = self.lock
        with lk._cond:
            lk._shared -= 1
            if not lk._shared:
                lk._cond.notify_all()


class _Exclusive:
    __slots__ = ("lock",)

    def __init__(self, lock: RWLock):
        self.lock = lock

    def __enter__(self) -> None:
        lk = self.lock
        with lk._cond:
            while lk._exclusive:
                lk._cond.wait()
            lk._exclusive = True
            while lk._shared:
                lk._cond.wait()

    def __exit__(self, *exc) -> None:
        lk = self.lock
        with lk._cond:
            lk._exclusive = False
            lk._cond.notify_all()


__all__ = ["RWLock"]
