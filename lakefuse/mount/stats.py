"""Counters of the mount, shown as JSON in the root's ``.lakefuse/stats``."""

from __future__ import annotations

import threading
import time
from collections import Counter


class Stats:
    """Thread-safe counters: FUSE requests by type, errors by errno name, and named
    counts (lookups, bytes read from the store...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()

    def request(self, op: str) -> None:
        with self._lock:
            self.requests[op] += 1

    def error(self, name: str) -> None:
        with self._lock:
            self.errors[name] += 1

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "uptime_seconds": round(time.time() - self.started, 3),
                "requests": dict(sorted(self.requests.items())),
                "errors": dict(sorted(self.errors.items())),
                **dict(sorted(self.counts.items())),
            }
