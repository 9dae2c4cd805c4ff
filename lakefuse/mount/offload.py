"""Blocking work leaves the trio thread here, and only here.

pyfuse3 runs every handler on one trio thread: one blocking call (an object-store
read, an LMDB transaction, a table decode) would stall every other request. Each
kind of blocking work gets a named :class:`trio.CapacityLimiter`, so a burst of
slow data reads cannot take the threads that ``ls`` needs.
"""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

import trio

log = logging.getLogger(__name__)

T = TypeVar("T")

META = "meta"  # lookups, listings, ref resolution, LMDB reads
DATA = "data"  # object reads
WRITE = "write"  # spool writes, uploads and staging of written files, control requests
DEFAULT_LIMITS = {META: 8, DATA: 16, WRITE: 8}


class Offload:
    """``await offload.run(META, fn, *args)``: ``fn(*args)`` in a worker thread under
    the named limiter (created lazily, inside the trio run)."""

    def __init__(self, limits: dict[str, int] | None = None):
        self.limits = dict(DEFAULT_LIMITS if limits is None else limits)
        self._limiters: dict[str, trio.CapacityLimiter] = {}

    def limiter(self, name: str) -> trio.CapacityLimiter:
        lim = self._limiters.get(name)
        if lim is None:
            lim = self._limiters[name] = trio.CapacityLimiter(self.limits[name])
        return lim

    async def run(self, name: str, fn: Callable[..., T], *args) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter(name))

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {
            name: {"limit": int(lim.total_tokens), "busy": lim.borrowed_tokens, "waiting": lim.statistics().tasks_waiting}
            for name, lim in self._limiters.items()
        }
