"""Filesystem-shaped changes to a branch: renames that restage entries without copying data.

A rename never touches the object store: the entry (same physical address,
etag, metadata) is staged under its new path and a tombstone under the old one.

* :func:`rename_path` moves one key in ONE LMDB transaction.
* :func:`rename_prefix` moves every key under a directory in transactions of at
  most ``batch`` keys (each moves a batch: new paths and tombstones of the old
  ones together), so a huge directory never holds LMDB's writer lock for long.
  The branch shows both halves in between; the mount makes the rename atomic
  for its own readers by holding the branch's tree lock exclusively meanwhile
  (see ``docs/SEMANTICS.md``), and a rename of more than one batch fences the
  branch (:mod:`graveler.fences`) so that no commit, from any process, takes half
  of it. No key is ever lost between batches: each key is
  at its old or at its new path. Running it again after an interruption
  finishes it (it moves whatever is still under the old path, and removes the
  fence the interrupted run left), which is how the mount recovers a rename a
  crash cut short.

Directory markers (``d/``, see :mod:`graveler.objects`) move with their
directory like any other key.
"""

from __future__ import annotations

import logging

from typing import Callable

from graveler.errors import InvalidArgument, NotFound, PathTooLong
from graveler.fences import new_fence, rename_fence
from graveler.staging import MAX_PATH_BYTES

log = logging.getLogger(__name__)

RENAME_BATCH = 5000


def rename_path(repo, branch: str, src: bytes, dst: bytes) -> None:
    """Move the object at ``src`` to ``dst`` on ``branch`` (replacing what is at ``dst``)."""
    if src == dst:
        return
    value = repo.get_value(branch, src)  # NotFound if absent
    repo.stage_many(branch, [(dst, value), (src, None)])


def rename_prefix(repo, branch: str, src_dir: bytes, dst_dir: bytes, batch: int = RENAME_BATCH,
                  first: list | None = None, staged: Callable[[int], None] | None = None) -> int:
    """Move every key under ``src_dir/`` to the same name under ``dst_dir/``; return
    how many keys moved. ``dst_dir`` must not lie inside ``src_dir``. A key that would
    grow past the path limit is :class:`PathTooLong` before anything is staged.
    ``first``: more changes staged with the first batch (in its transaction);
    ``staged(n)`` is called after each batch's transaction (n keys moved by it)."""
    src_dir, dst_dir = src_dir.rstrip(b"/"), dst_dir.rstrip(b"/")
    if not src_dir or not dst_dir:
        raise InvalidArgument("rename_prefix needs non-empty directories")
    if dst_dir == src_dir:
        return 0
    if dst_dir.startswith(src_dir + b"/"):
        raise InvalidArgument(f"cannot move {src_dir!r} into itself ({dst_dir!r})")
    src_pfx, dst_pfx = src_dir + b"/", dst_dir + b"/"
    grow = len(dst_pfx) - len(src_pfx)
    if grow > 0:  # a pass over the keys first: no batch is staged if a later one cannot be
        longest = max((len(item.path) for item in repo.list(branch, src_pfx, delimiter=b"")), default=0)
        if longest + grow > MAX_PATH_BYTES:
            raise PathTooLong(f"moving {src_dir.decode('utf-8', 'replace')!r} to "
                              f"{dst_dir.decode('utf-8', 'replace')!r} makes a path of {longest + grow} bytes "
                              f"below it (at most {MAX_PATH_BYTES})")
    n = 0
    pending: list = list(first or ())
    extra = len(pending)
    op = {"src": src_dir.decode("utf-8", "replace"), "dst": dst_dir.decode("utf-8", "replace")}
    resumed = rename_fence(repo.fence_of(branch), **op)  # an interrupted run's: removed once this one is done
    fenced = False

    def flush() -> None:
        nonlocal n, pending, extra
        repo.stage_many(branch, pending)
        moved = (len(pending) - extra) // 2
        n += moved
        pending, extra = [], 0
        if staged is not None:
            staged(moved)

    fence = new_fence("the rename of a directory", **op)
    try:
        for item in repo.list(branch, src_pfx, delimiter=b""):
            rest = item.path[len(src_pfx):]
            pending.append((dst_pfx + rest, item.value))
            pending.append((item.path, None))
            if len(pending) - extra >= 2 * batch:
                if not fenced and not resumed:  # more than one transaction: no commit takes part of them
                    repo.fence(branch, fence)
                    fenced = True
                flush()
                if fenced:  # progress, for waiters on other hosts (graveler.fences.STALL_S)
                    fence["beat"] = fence.get("beat", 0) + 1
                    repo.fence(branch, fence)
        if pending:
            flush()
    except BaseException:
        if fenced:  # it stays, said cut short: commits need not wait for it
            try:
                repo.fence(branch, {**fence, "cut": True})
            except Exception:  # noqa: BLE001 -- (the KV away: the fence stays as it was)
                log.debug("could not mark the fence of %r on %s cut short", op, branch)
        raise
    if fenced or resumed:  # (a failure before this leaves the fence: the branch holds part of it)
        repo.fence(branch, None)
    if n == 0:
        raise NotFound(f"nothing under {src_pfx.decode('utf-8', 'replace')!r} on {branch!r}")
    log.debug("%s: renamed %d keys %r -> %r on %s", repo.name, n, src_dir, dst_dir, branch)
    return n
