"""Counters of the mount, shown as JSON in the root's ``.lakefuse/stats``."""

from __future__ import annotations

import threading
import time
from collections import Counter


class Stats:
    """Thread-safe counters: FUSE requests by type, errors by errno name, named
    counts (lookups, bytes read from the store, opens served by FUSE passthrough or by
    the daemon, reads answered on the trio thread from the page cache (``reads_inline``)
    or in a worker thread (``reads_thread``)...) and named states (``passthrough``: on, or
    why not; ``inline_reads``: on or off)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.states: dict[str, str] = {}

    def request(self, op: str) -> None:
        with self._lock:
            self.requests[op] += 1

    def error(self, name: str) -> None:
        with self._lock:
            self.errors[name] += 1

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def set(self, name: str, state: str) -> None:
        """A named state (e.g. whether FUSE passthrough is on, and why not)."""
        with self._lock:
            self.states[name] = state

    def get(self, name: str) -> str | None:
        with self._lock:
            return self.states.get(name)

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "uptime_seconds": round(time.time() - self.started, 3),
                "requests": dict(sorted(self.requests.items())),
                "errors": dict(sorted(self.errors.items())),
                **dict(sorted(self.counts.items())),
                **self.states,
            }
