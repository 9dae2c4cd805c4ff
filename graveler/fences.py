"""Fences: a change of a branch that takes several KV transactions, made whole for commits.

A directory rename of more keys than one transaction moves (:func:`graveler.tree.rename_prefix`)
stages them batch by batch. A commit sealing the branch's staging between two batches would
take half the rename -- the files moved so far under the new name, the rest under the old one
-- and a commit made by another process (the CLI, another mount, another host on a shared KV)
has no lock of the renaming mount to wait for. So before its second batch the change puts a
*fence* on the branch, a row of the repository's KV (its ``repo`` table, under ``fence\\0`` +
the branch's name: every backend has that table), and removes it after its last batch; a
commit that finds a fence waits for it to go (:data:`FENCE_WAIT_S` at most), then fails
(:class:`BranchBusy`, a Conflict). A fence whose process is gone (it names its host, pid and
that process's start time: this host's processes only), one its change marked cut short (a
failure midway), and one that made no progress for :data:`STALL_S` (the change counts its
transactions in the fence, ``beat``; a waiter times the count with its own clock, so no two
hosts' clocks are compared: how another host's dead process shows) is not waited for (any
longer): the change was cut short, and the commit is
refused until the branch is whole again -- the mount that made it finishes it when it mounts
again (its spool's intent record, replayed only while the fence stands), a full ``branch
reset`` discards it with the rest of the branch's uncommitted changes, and deleting the branch
removes it.

*Unsaved writes* are the other thing a commit from anywhere must know of: a file written
through a mount whose save failed (the store or the KV did not answer) is kept by that mount
and retried until it goes through, and meanwhile the branch shows it without what was
written (empty, or its old version). The mount puts one record per branch under
``unsaved\0`` + the branch's name + ``\0`` + its own ID (:func:`unsaved_key`), naming the
files, and removes it once they are saved; a commit that finds one is refused at once
(:class:`UnsavedWrites`) -- waiting would be for an outage of unknown length. A record whose
process is gone is taken over by the next mount's recovery of that instance (which stages or
keeps what was written, then drops it), and a full ``branch reset`` discards it with the
branch's other uncommitted changes (a live mount puts its record back at its next retry).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from graveler.errors import Conflict

log = logging.getLogger(__name__)

FENCE_WAIT_S = 60.0  # how long a commit waits for a fence's change to finish
STALL_S = 30.0  # a fence whose change made no progress this long is taken for cut short
_POLL_S = 0.05
FENCE_PREFIX = b"fence\0"  # + the branch's name, in the repository's ``repo`` table
UNSAVED_PREFIX = b"unsaved\0"  # + the branch's name + b"\0" + a writer's ID, in the same table
UNSAVED_NAMES = 10  # the files a record names (its count says how many there are)


class BranchBusy(Conflict):
    """A commit found the branch in the middle of a change made in several transactions."""

    def __init__(self, msg: str, fence: dict, gone: bool, branch: str = "", repository: str = ""):
        super().__init__(msg)
        self.fence = fence
        self.gone = gone  # the process that made it is gone: waiting is no use
        self.branch, self.repository = branch, repository


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (/proc's ticks since boot), None if it is not running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def new_fence(what: str, **details) -> dict:
    """The record of a fence this process puts on a branch: what it does, and who does it."""
    return {"what": what, **details, "host": socket.gethostname(), "pid": os.getpid(),
            "start": _start_time(os.getpid()), "since": time.time()}


def rename_fence(fence: dict | None, src: str, dst: str) -> bool:
    """Whether ``fence`` is the one a rename of ``src`` to ``dst`` put (its interrupted run's)."""
    return fence is not None and (fence.get("src"), fence.get("dst")) == (src, dst)


def encode(fence: dict) -> bytes:
    return json.dumps(fence, sort_keys=True).encode()


def decode(raw: bytes) -> dict:
    try:
        fence = json.loads(raw)
    except ValueError:
        fence = None
    return fence if isinstance(fence, dict) else {"what": "a change", "damaged": True}


def is_gone(fence: dict) -> bool:
    """Whether the process that put ``fence`` is known to be gone (this host's processes only:
    one of another host is taken as alive)."""
    if fence.get("host") != socket.gethostname() or not isinstance(fence.get("pid"), int):
        return False
    start = _start_time(fence["pid"])
    return start is None or (fence.get("start") is not None and start != fence["start"])


def busy(branch: str, fence: dict, repository: str = "REPO", stalled: bool = False) -> BranchBusy:
    """The error of a commit of ``branch`` (of ``repository``) that met ``fence``; ``stalled``:
    the waiter saw it make no progress for :data:`STALL_S`."""
    who = f"pid {fence.get('pid', '?')} on {fence.get('host', '?')}"
    since = fence.get("since")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else ""
    what = fence.get("what", "a change")
    if fence.get("src") is not None:
        what += f" {fence['src']!r} -> {fence.get('dst')!r}"
    what_to_do = ("Mount the repository again on that host to finish it, or discard the branch's uncommitted "
                  f"changes (lakefuse branch reset lakefs://{repository}/{branch})")
    if fence.get("cut") or is_gone(fence):
        return BranchBusy(f"branch {branch!r} holds part of {what}, cut short ({who}{when}): a commit would "
                          f"take part of it. {what_to_do}", fence, True, branch, repository)
    if stalled:
        return BranchBusy(f"branch {branch!r} holds part of {what} ({who}{when}), which made no progress for "
                          f"{STALL_S:g}s: taken for cut short (its process is on another host, or stuck). "
                          f"{what_to_do}", fence, True, branch, repository)
    return BranchBusy(f"branch {branch!r} is in the middle of {what} ({who}{when}), still going after "
                      f"{FENCE_WAIT_S:g}s: commit again once it is done", fence, False, branch, repository)


class UnsavedWrites(Conflict):
    """A commit found files written through a mount whose saves have not gone through yet."""

    def __init__(self, msg: str, records: list[dict], branch: str = ""):
        super().__init__(msg)
        self.records = records
        self.branch = branch


def unsaved_prefix(branch: str) -> bytes:
    return UNSAVED_PREFIX + branch.encode() + b"\0"


def unsaved_key(branch: str, writer: str) -> bytes:
    """The key of ``writer``'s record of unsaved writes on ``branch`` (branch names hold no NUL)."""
    return unsaved_prefix(branch) + writer.encode()


def new_unsaved(files: list[str], count: int, error: str, **details) -> dict:
    """The record a writer (a mount) puts on a branch while ``count`` files it wrote there are not
    saved: the first :data:`UNSAVED_NAMES` names, the last error, and who it is."""
    return new_fence("unsaved writes", files=files[:UNSAVED_NAMES], count=count, error=error, **details)


def unsaved(branch: str, records: list[dict], repository: str = "REPO") -> UnsavedWrites:
    """The error of a commit of ``branch`` that found ``records`` of unsaved writes."""
    parts = []
    for r in records:
        if r.get("damaged") or not isinstance(r.get("files"), list):
            parts.append("a record of unsaved writes that cannot be read (damaged: which mount wrote it and which "
                         "files it names are unknown); if no mount retries writes on this branch, discarding the "
                         "branch's uncommitted changes clears it")
            continue
        files = [str(f) for f in r["files"]]
        count = r.get("count") if isinstance(r.get("count"), int) else len(files)
        names = ", ".join(files) + (f" and {count - len(files)} more" if count > len(files) else "")
        who = f"pid {r.get('pid', '?')} on {r.get('host', '?')}"
        where = f", spool {r['spool']}" if r.get("spool") else ""
        state = ("its process is gone: mounting the repository again with the same --cache-dir on that host "
                 "recovers them" if is_gone(r) else f"it retries them until they go through (last error: "
                 f"{r.get('error', '?')})")
        parts.append(f"{count} file(s) written through the mount of {who}{where}: {names}; {state}")
    return UnsavedWrites(
        f"commit refused: branch {branch!r} has writes not saved yet -- " + "; ".join(parts) + ". Nothing was "
        "committed (the commit would publish those files without what was written to them): commit again once "
        f"they are saved, or discard the branch's uncommitted changes (lakefuse branch reset lakefs://{repository}/"
        f"{branch})", records, branch)


def waiting(fn, wait_s: float | None = None):
    """``fn()``, again while it raises a :class:`BranchBusy` whose process is alive, for up to
    ``wait_s`` seconds (default :data:`FENCE_WAIT_S`; then that error)."""
    deadline = time.monotonic() + (FENCE_WAIT_S if wait_s is None else wait_s)
    said = False
    beat = moved = None  # the fence's progress count as last seen, and when it last moved (this clock)
    while True:
        try:
            return fn()
        except BranchBusy as e:
            now = time.monotonic()
            if e.gone or now >= deadline:
                raise
            if e.fence.get("beat") != beat or moved is None:
                beat, moved = e.fence.get("beat"), now
            elif now - moved >= STALL_S:
                raise busy(e.branch, e.fence, e.repository, stalled=True) from None
            if not said:  # (a wait of up to a minute is said, once)
                f = e.fence
                log.warning("waiting for %s on this branch to finish (pid %s on %s), at most %g s",
                            f.get("what", "a change"), f.get("pid", "?"), f.get("host", "?"), FENCE_WAIT_S)
                said = True
            time.sleep(_POLL_S)


__all__ = ["BranchBusy", "FENCE_WAIT_S", "STALL_S", "UnsavedWrites", "busy", "new_fence", "new_unsaved",
           "rename_fence", "unsaved", "unsaved_key", "waiting"]
