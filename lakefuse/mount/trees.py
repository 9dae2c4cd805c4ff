"""A ref shown as a tree, and the lock that keeps a directory rename whole.

A :class:`Tree` is one ref of the mount root: a branch (live: its view is
re-pinned when the branch's change stamp moves) or a commit, tag or ref
expression (immutable). A :class:`RWLock` per branch tree lets every request
read while no directory rename runs, and a rename run alone.

A branch tree also keeps track of which changes since a stamp were this mount's own
(:meth:`Tree.staged`: each staged write reports the stamp its transaction read) and which
paths they touched, so what the mount read or staged before can be answered without a read
while only its own changes came since (:meth:`Tree.dir_current`, :meth:`Tree.known_absent`:
a small file's lookup, its directory's stat). A stamp no staged write explains is a *hole*:
a concurrent save of this mount still to report, or, after :data:`HOLE_NS`, another writer's
change, which makes the tree forget all of that.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from graveler.errors import GravelerError
from graveler.locks import RWLock
from graveler.model import clamp_time_ns
from graveler.objects import ROOT_MARKER
from graveler.view import View

log = logging.getLogger(__name__)


MAX_HOLES = 64  # unexplained stamps kept track of; more at once: taken as another writer's changes
MAX_MARKERS = 10_000  # directory markers kept (Tree.markers; past that: forgotten, read again)
MAX_WITNESSES = 10_000  # directories' witnesses kept (Tree.witnesses; past that: forgotten)
MAX_AHEAD = 100_000  # own stamps kept that reported before an earlier own one (Tree.own_change)
DEFER_NS = 500_000_000  # how long the watch waits for stamps that may be own saves still to report
HOLE_NS = 1_000_000_000  # an unexplained stamp this old is another writer's change
# How recently a branch's stamp must have been read (or moved by this mount's own write) for
# what the mount keeps of the tree at that stamp (a directory's or file's attributes, a file's
# entry for an open) to be answered without reading it again: far below the kernel's own
# attribute cache (``branch_timeout``) and the stamp watch's interval.
FRESH_NS = 50_000_000


class Tree:
    """One ref shown as a tree: a branch (live, unless frozen) or a commit (immutable)."""

    __slots__ = ("key", "name", "view", "immutable", "nodes", "stamp", "lock", "watched", "foreign", "confirmed_ns",
                 "own_from", "touched", "known", "holes", "own_ahead", "saving", "deferred", "markers", "witnesses",
                 "_root")

    def __init__(self, name: str, view: View, frozen: bool = False):
        """``frozen``: a branch shown as it is now, never re-pinned (a read-only mount
        whose refs cannot change, e.g. one served from a refs dump)."""
        self.name = name
        self.view = view
        self.immutable = frozen or not view.is_branch
        # (a branch made again after a delete is another tree: its birth is part of the key)
        self.key = ("tree", name, view.commit_id if self.immutable else ("branch", view.born))
        self.nodes = 0
        self.stamp = view.change_stamp()
        self.lock = threading.Lock()
        self.watched = self.stamp  # the stamp the kernel's caches were last dropped at (lakefuse.mount.watch)
        self.foreign = 0  # changes the stamp watch found that this mount did not make (each round: +1)
        self.confirmed_ns = 0  # monotonic time ``stamp`` was last known current (a read, a staged write)
        # every change after stamp ``own_from`` was this mount's, recorded by ``staged``; ``touched``:
        # directory path -> the last of them that may have changed its attributes (dir_current)
        self.own_from = self.stamp
        self.touched: dict[bytes, int] = {}
        # directory path -> every name in it, for directories this mount made (mkdir) and changed
        # only through ``staged`` since (known_absent); forgotten with ``touched``
        self.known: dict[bytes, tuple[int, set[bytes]]] = {}  # path -> (stamp it was made at, names)
        # stamps after ``own_from`` that no ``staged`` explained yet -> when first seen: a concurrent
        # save of this mount whose ``staged`` is still to come, or another writer's change (HOLE_NS)
        self.holes: dict[int, int] = {}
        # this mount's own stamps above ``watched`` whose predecessors are still to come:
        # concurrent saves (sharing a group-committed transaction) report out of order
        self.own_ahead: set[int] = set()
        self.saving = 0  # this mount's saves between their transaction and their ``staged`` (own_saving)
        self.deferred: tuple[int, int] | None = None  # (stamp, when) the watch first left unexplained
        # directory path -> (stamp, its marker's value or None) as this mount last staged it: current
        # while dir_current(path, stamp) says so (lakefuse.mount.creates.create_fast)
        self.markers: dict[bytes, tuple[int, bytes | None]] = {}
        # directory path -> a key under it that held an object when last read (a listing's last, or
        # what BranchWrites._remains found): a hint, always read again before it is believed
        self.witnesses: dict[bytes, bytes] = {}
        self._root: tuple[bytes | None] | None = None  # an immutable tree's root marker, once read

    def root_marker(self) -> bytes | None:
        """The marker of the tree's root directory (the key ``/``, hidden from every listing:
        :mod:`graveler.paths`), which keeps the mode, owner and times set on the root (None:
        none set). A marker that cannot be read (a damaged range, the KV away) counts as none
        set: the root's stat keeps working, its paths report the error. Blocking."""
        if self._root is not None:
            return self._root[0]
        try:
            value = self.view.get(ROOT_MARKER)
        except (GravelerError, OSError) as e:
            log.debug("%s: the root's marker not read: %s", self.name, e)
            return None
        if self.immutable:
            self._root = (value,)
        return value

    def repin(self) -> int:
        """The current change stamp; a branch view re-pins when it moved (NotFound
        if the branch is gone). Blocking (a cheap LMDB read); nothing is made durable."""
        if self.immutable:
            return 0
        t = time.monotonic_ns()
        s = self.view.change_stamp()
        if s != self.stamp or self.holes:
            with self.lock:
                if s > self.stamp:  # (stamps only grow: a read older than a staged write's is not taken)
                    self.view.refresh()
                    self._advance(s, t, own=False)
                self._settle(t)
        if s == self.stamp:
            self.confirmed_ns = t
        return s

    def _unexplained(self, stamp: int) -> None:
        """The stamp moved by changes this mount did not record (another writer's, or its own
        made some other way): nothing kept from before ``stamp`` is known current."""
        self.own_from = stamp
        self.touched.clear()
        self.known.clear()
        self.holes.clear()

    def _advance(self, stamp: int, now: int, own: bool) -> None:
        """``stamp`` (> :attr:`stamp`) was read; the stamps between (and ``stamp`` itself unless
        ``own``: a change this mount staged) are holes until a ``staged`` explains them."""
        top = stamp if not own else stamp - 1
        if top - self.stamp > MAX_HOLES:
            self._unexplained(stamp)
        else:
            for h in range(self.stamp + 1, top + 1):
                self.holes[h] = now
        self.stamp = stamp

    def _settle(self, now: int) -> None:
        """A hole no ``staged`` explained within :data:`HOLE_NS` is another writer's change."""
        if self.holes and now - min(self.holes.values()) > HOLE_NS:
            self._unexplained(self.stamp)

    def fresh(self, within_ns: int) -> bool:
        """Whether ``stamp`` was known current less than ``within_ns`` ago (then what the mount
        keeps of the tree at that stamp may be answered without a read)."""
        return time.monotonic_ns() - self.confirmed_ns < within_ns

    def dir_current(self, path: bytes, stamp: int) -> bool:
        """Whether the attributes of directory ``path`` read at ``stamp`` are still its attributes
        at :attr:`stamp`: every change since was this mount's own (:meth:`staged`), and none of
        them touched that directory."""
        # (max over the dict runs without a thread switch: it is read on the trio thread too)
        return stamp == self.stamp or (stamp >= self.own_from and self.touched.get(path, 0) <= stamp
                                       and max(self.holes, default=0) <= stamp)

    def forget_own(self) -> None:
        """A change is under way that ``staged`` will not record (a directory rename): nothing
        kept from before it is taken as current (:meth:`dir_current`, :meth:`known_absent`)."""
        with self.lock:
            self._unexplained(self.stamp)

    def made_dir(self, path: bytes, stamp: int) -> None:
        """This mount made directory ``path`` (empty) with the staged write that moved the stamp
        to ``stamp``: it knows every name in it from now on, as long as every change is its own."""
        with self.lock:
            # (not while a change of unknown origin is pending: it might have put a name there)
            if len(self.known) < 100_000 and stamp >= self.own_from and not self.holes:
                self.known[path] = (stamp, set())

    def known_absent(self, path: bytes, name: bytes, within_ns: int) -> bool:
        """Whether ``name`` is surely not in directory ``path``: a directory this mount made, every
        change since its own, the stamp known current less than ``within_ns`` ago (never blocks)."""
        known = self.known.get(path)
        return (known is not None and name not in known[1] and max(self.holes, default=0) <= known[0]
                and self.fresh(within_ns))

    def names_added(self, items, locked: bool = False) -> None:
        """Names this mount answers for before they are staged (a create): :meth:`known_absent`
        must not say they are not there. ``locked``: the caller holds :attr:`lock`."""
        if locked:
            if self.known:
                self._names(items)
            return
        with self.lock:
            if self.known:
                self._names(items)

    def markers_staged(self, items, stamp: int) -> None:
        """This mount staged (or will stage with a file's first save) these directory markers
        (``(path + b"/", value or None)``) as of ``stamp``: see :attr:`markers`."""
        markers = self.markers
        if len(markers) >= MAX_MARKERS:
            markers.clear()
        for key, value in items:
            markers[key.rstrip(b"/")] = (stamp, value)

    def witness(self, path: bytes, page) -> None:
        """Directory ``path`` held the objects of listing ``page`` (ListItems) just now: the last
        is kept as its witness (see :attr:`witnesses`; a common prefix is none: no point read
        tells whether a directory without a marker is there)."""
        for item in reversed(page):
            if item.value is not None:
                if len(self.witnesses) >= MAX_WITNESSES:
                    self.witnesses.clear()
                self.witnesses[path] = item.path
                return

    def _names(self, items) -> None:
        """Keep the known directories' names true after staging ``items`` (key, value or None)."""
        known = self.known
        for key, value in items:
            key = key.rstrip(b"/")
            parent, _, name = key.rpartition(b"/")
            if value is None:  # a name may go (or stay, through the keys under it): not known any more
                known.pop(parent, None)
                known.pop(key, None)
                continue
            while True:  # the key's name, and each of its directories' in theirs
                names = known.get(parent)
                if names is not None:
                    names[1].add(name)
                if not parent:
                    break
                parent, _, name = parent.rpartition(b"/")

    def staged(self, stamp: int, raw: bytes | None, dirs=None, items=None) -> int:
        """This mount staged a change and read, in its transaction, the branch's stamp
        ``stamp`` and record ``raw`` (:meth:`graveler.Repository.stage_stamped`): the tree
        takes them as :meth:`repin` would have read them (nothing is read again unless the
        branch record moved), and it is this mount's own change (:meth:`own_change`). Stamps
        only grow: a concurrent save that already moved the tree further is kept. ``dirs``:
        the directories whose attributes the change may have changed (None: unknown: then
        nothing kept from before it is taken as current, :meth:`dir_current`)."""
        if raw is None:
            stamp = self.repin()
            with self.lock:
                self._unexplained(max(stamp, self.stamp))
        else:
            t = time.monotonic_ns()
            with self.lock:
                if stamp > self.stamp:
                    self.view.current(raw)
                    self._advance(stamp, t, own=True)  # changes between: holes till explained
                else:
                    self.holes.pop(stamp, None)  # a concurrent save of this mount: explained
                self._settle(t)
                if dirs is None:
                    self._unexplained(self.stamp)
                else:
                    if items and self.known:
                        self._names(items)
                    touched = self.touched
                    if len(touched) > 100_000:
                        self._unexplained(self.stamp)
                    for d in dirs:
                        if touched.get(d, 0) < stamp:
                            touched[d] = stamp
                if stamp == self.stamp:
                    self.confirmed_ns = t
        self.own_change(stamp)
        return stamp

    def own_change(self, stamp: int) -> None:
        """This mount made a change and the stamp is now ``stamp``: if that change is the only one
        since the stamp watch last looked, the kernel's caches already show it (the write went
        through the kernel), so the watch has nothing to drop for it. Concurrent saves report
        out of order: one reported ahead of an earlier own stamp counts once that one has."""
        with self.lock:
            if stamp <= self.watched:
                return
            ahead = self.own_ahead
            if stamp != self.watched + 1:  # an earlier own change still to report (or a foreign one)
                if len(ahead) < MAX_AHEAD:  # (past that: the watch takes them as changes from elsewhere)
                    ahead.add(stamp)
                return
            self.watched = stamp
            while ahead:  # the ones that reported first follow on
                if self.watched + 1 in ahead:
                    ahead.discard(self.watched + 1)
                    self.watched += 1
                else:
                    ahead.difference_update([s for s in ahead if s <= self.watched])
                    break

    @contextlib.contextmanager
    def own_saving(self):
        """Around one save of this mount, from before its transaction until it reported its stamp
        (:meth:`staged`): while any is under way, a stamp the watch finds unexplained may be one
        of them (:meth:`unexplained_by_own`)."""
        with self.lock:
            self.saving += 1
        try:
            yield
        finally:
            with self.lock:
                self.saving -= 1

    def unexplained_by_own(self, stamp: int, now_ns: int) -> bool:
        """The watch read ``stamp``: whether it comes from changes this mount did not make (then
        the kernel's caches of the tree go). Each save bumps the stamp once, so while no more
        stamps are unexplained than saves of this mount are under way, they may all be its own:
        they get :data:`DEFER_NS` to report (each save reports at once after its transaction; a
        loaded machine can delay that past one round). Called with :attr:`lock` held."""
        if stamp == self.watched:
            self.deferred = None
            return False
        pending = stamp - self.watched - sum(1 for x in self.own_ahead if x <= stamp)
        if 0 < pending <= self.saving:
            if self.deferred is None or self.watched >= self.deferred[0]:
                self.deferred = (stamp, now_ns)  # (the ones deferred before have reported since)
            if now_ns - self.deferred[1] < DEFER_NS:
                return False
        self.deferred = None
        self.watched = stamp
        self.own_ahead.difference_update([x for x in self.own_ahead if x <= stamp])
        return True

    @property
    def mtime_ns(self) -> int:
        # (a foreign commit may carry any year)
        return clamp_time_ns(int(self.view.commit.creation_date.timestamp()) * 1_000_000_000)


class TreeLocks:
    """The :class:`RWLock` of each branch tree, by branch name."""

    def __init__(self) -> None:
        self._locks: dict[str, RWLock] = {}
        self._lock = threading.Lock()

    def __call__(self, tree: Tree) -> RWLock:
        lock = self._locks.get(tree.name)
        if lock is None:
            with self._lock:
                lock = self._locks.setdefault(tree.name, RWLock())
        return lock
