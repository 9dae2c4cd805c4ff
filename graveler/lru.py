"""One thread-safe LRU, bounded by the summed weight (bytes) of its values.

Used for decoded SSTable blocks, open table files and parsed metaranges. The
hit path takes no lock: ``OrderedDict.get`` and ``move_to_end`` are single C
calls, atomic under the GIL, and a concurrent eviction between the two only
costs the recency bump. Inserts and evictions take the lock. Hit and miss
counters are approximate (unlocked), for benchmarks and tests.

A hot path may do the hit itself, without a call frame, on :attr:`LRU.data`
(``v = data.get(k)``, then ``data.move_to_end(k)`` in ``try/except KeyError``):
it must never insert or delete there, and such hits are not counted.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

from graveler import native

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PyLRU(Generic[K, V]):
    """At most ``max_bytes`` of values (as ``weight(value)`` counts them); the most
    recently used value is always kept, however heavy."""

    __slots__ = ("max_bytes", "_weight", "_d", "_bytes", "_lock", "hits", "misses")

    def __init__(self, max_bytes: int, weight: Callable[[V], int]):
        self.max_bytes = max_bytes
        self._weight = weight
        self._d: OrderedDict[K, V] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def data(self) -> OrderedDict[K, V]:
        """The entries, least recently used first, for lock-free hits (read and
        ``move_to_end`` only; see the module docstring)."""
        return self._d

    def get(self, key: K) -> V | None:
        v = self._d.get(key)
        if v is None:
            self.misses += 1
            return None
        try:
            self._d.move_to_end(key)
        except KeyError:  # evicted meanwhile
            pass
        self.hits += 1
        return v

    def put(self, key: K, value: V) -> None:
        """Insert or replace ``key``, then evict the least recently used past the budget."""
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self._bytes -= self._weight(old)
            self._insert(key, value)

    def setdefault(self, key: K, value: V) -> V:
        """The value already cached under ``key`` if any (another thread won the race),
        else ``value``, now cached."""
        with self._lock:
            old = self._d.get(key)
            if old is not None:
                return old
            self._insert(key, value)
            return value

    def _insert(self, key: K, value: V) -> None:
        d = self._d
        d[key] = value
        self._bytes += self._weight(value)
        while self._bytes > self.max_bytes and len(d) > 1:
            _, ev = d.popitem(last=False)
            self._bytes -= self._weight(ev)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: K) -> bool:
        return key in self._d

    @property
    def size_bytes(self) -> int:
        return self._bytes


if native.PURE_PYTHON:
    LRU = PyLRU
else:  # the same class, compiled (graveler._clru.LRU): a hit is one C call
    LRU = native.load("graveler._clru").LRU

__all__ = ["LRU", "PyLRU"]
