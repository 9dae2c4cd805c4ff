"""Counters of the mount, shown as JSON in the root's ``.lakefuse/stats``."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable


_SUB = 4  # latency buckets per power of two: each bucket spans 19% (2 ** (1/4))


def _bucket(ns: int) -> int:
    """The latency bucket of ``ns`` nanoseconds: log2 in quarters, by integer arithmetic."""
    b = ns.bit_length()
    if b <= 3:
        return b * _SUB
    return b * _SUB + ((ns >> (b - 3)) & 3)


def _bucket_top_us(i: int) -> float:
    """The upper bound of bucket ``i``, in microseconds."""
    b, sub = divmod(i, _SUB)
    if b <= 3:
        return (1 << b) / 1000
    return ((4 + sub + 1) << (b - 3)) / 1000


def _quantile_us(hist: Counter, q: float) -> float:
    total = sum(hist.values())
    seen = 0
    for i in sorted(hist):
        seen += hist[i]
        if seen >= q * total:
            return _bucket_top_us(i)
    return 0.0


class Stats:
    """Thread-safe counters: FUSE requests by type, errors by errno name, named
    counts (lookups, bytes read from the store, opens served by FUSE passthrough or by
    the daemon, reads answered on the trio thread from the page cache (``reads_inline``),
    after waiting there for a chunk an S3 stream brings (``reads_awaited``), or in a worker
    thread (``reads_thread``)...) and named states (``passthrough``: on, or
    why not; ``inline_reads``: on or off), and each request type's latency as a histogram
    (buckets of a quarter power of two, so p50 / p99 are within 19% above the truth)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.states: dict[str, str] = {}
        self.latency: dict[str, Counter[int]] = {}
        self.probes: dict[str, Callable[[], object]] = {}  # read at each snapshot (never under the lock)

    def request(self, op: str) -> None:
        with self._lock:
            self.requests[op] += 1

    def done(self, op: str, ns: int) -> None:
        """A request of type ``op`` took ``ns`` nanoseconds (answered or failed)."""
        i = _bucket(ns)
        with self._lock:
            h = self.latency.get(op)
            if h is None:
                h = self.latency[op] = Counter()
            h[i] += 1

    def error(self, name: str) -> None:
        with self._lock:
            self.errors[name] += 1

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def count(self, *names: str) -> None:
        """Each of ``names`` +1, under one lock (a hot path's counters together)."""
        with self._lock:
            counts = self.counts
            for name in names:
                counts[name] += 1

    def add_each(self, pairs) -> None:
        """:meth:`add` of each (name, n) of ``pairs``, under one lock."""
        with self._lock:
            counts = self.counts
            for name, n in pairs:
                counts[name] += n

    def set(self, name: str, state: str) -> None:
        """A named state (e.g. whether FUSE passthrough is on, and why not)."""
        with self._lock:
            self.states[name] = state

    def get(self, name: str) -> str | None:
        with self._lock:
            return self.states.get(name)

    def probe(self, name: str, fn: Callable[[], object]) -> None:
        """``name`` in every snapshot is what ``fn()`` returns then (counters kept elsewhere)."""
        self.probes[name] = fn

    def snapshot(self) -> dict:
        with self._lock:
            latency = {op: {"n": sum(h.values()), "p50_us": round(_quantile_us(h, 0.5), 1),
                            "p99_us": round(_quantile_us(h, 0.99), 1)}
                       for op, h in sorted(self.latency.items())}
            snap = {
                "uptime_seconds": round(time.time() - self.started, 3),
                "requests": dict(sorted(self.requests.items())),
                "latency": latency,
                "errors": dict(sorted(self.errors.items())),
                **dict(sorted(self.counts.items())),
                **self.states,
            }
        for name, fn in list(self.probes.items()):
            snap[name] = fn()
        return snap
