"""An in-memory backend of the KV protocol, for unit tests: ``KVConfig(url="memory://NAME")``.

Every backend of one process with the same NAME sees the same repositories (so several
``Graveler`` objects, or a repository reopened, share them); nothing outlives the
process. One lock per repository serializes transactions (reads included): a read is
a consistent snapshot because no write runs meanwhile, and a write that raises is
undone from its undo log. The nesting rules and key limit are the protocol's.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from typing import Callable, Iterator, TypeVar

from graveler.errors import InvalidArgument, NotFound
from graveler.kv.base import MAX_KEY_BYTES, TABLES, NestedTransaction, SnapshotReads, ThreadTxns

T = TypeVar("T")


class _Table:
    __slots__ = ("data", "keys")

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.keys: list[bytes] = []  # sorted

    def set(self, key: bytes, value: bytes) -> None:
        if key not in self.data:
            bisect.insort(self.keys, key)
        self.data[key] = value

    def remove(self, key: bytes) -> bool:
        if key not in self.data:
            return False
        del self.data[key]
        del self.keys[bisect.bisect_left(self.keys, key)]
        return True


class MemoryTxn:
    """A transaction of :class:`MemoryStore`; a write one keeps an undo log."""

    __slots__ = ("_tables", "_undo", "_write")

    def __init__(self, tables: dict[str, _Table], write: bool):
        self._tables = tables
        self._write = write
        self._undo: list[tuple[str, bytes, bytes | None]] = []

    def _change(self, table: str, key: bytes, value: bytes | None) -> None:
        if not self._write:
            raise InvalidArgument("a write in a read transaction")
        if not isinstance(key, bytes) or not key or len(key) > MAX_KEY_BYTES:
            raise InvalidArgument(f"a key must be 1 to {MAX_KEY_BYTES} bytes")
        t = self._tables[table]
        self._undo.append((table, key, t.data.get(key)))
        if value is None:
            t.remove(key)
        else:
            t.set(key, bytes(value))

    def rollback(self) -> None:
        for table, key, old in reversed(self._undo):
            t = self._tables[table]
            if old is None:
                t.remove(key)
            else:
                t.set(key, old)
        self._undo.clear()

    def get(self, table: str, key: bytes) -> bytes | None:
        return self._tables[table].data.get(key)

    def get_many(self, keys: list[tuple[str, bytes]]) -> list[bytes | None]:
        return [self._tables[t].data.get(k) for t, k in keys]

    def put(self, table: str, key: bytes, value: bytes) -> None:
        self._change(table, key, value)

    def put_many(self, table: str, items: list[tuple[bytes, bytes]]) -> int:
        for k, v in items:
            self._change(table, k, v)
        return len(items)

    def insert(self, table: str, key: bytes, value: bytes) -> bool:
        if key in self._tables[table].data:
            return False
        self._change(table, key, value)
        return True

    def set_if(self, table: str, key: bytes, value: bytes | None, expected: bytes | None) -> bool:
        if self._tables[table].data.get(key) != expected:
            return False
        if value is not None or expected is not None:
            self._change(table, key, value)
        return True

    def delete(self, table: str, key: bytes) -> bool:
        if key not in self._tables[table].data:
            return False
        self._change(table, key, None)
        return True

    def scan(self, table: str, start: bytes = b"", end: bytes | None = None,
             values: bool = True) -> Iterator[tuple[bytes, bytes | None]]:
        t = self._tables[table]
        i = bisect.bisect_left(t.keys, start)
        hi = len(t.keys) if end is None else bisect.bisect_left(t.keys, end)
        for k in t.keys[i:hi]:
            yield k, (t.data[k] if values else None)

    def delete_range(self, table: str, start: bytes, end: bytes | None, limit: int | None = None) -> int:
        keys = [k for k, _ in self.scan(table, start, end, values=False)]
        if limit is not None:
            keys = keys[:limit]
        for k in keys:
            self._change(table, k, None)
        return len(keys)

    def count(self, table: str) -> int:
        return len(self._tables[table].keys)

    def add(self, table: str, key: bytes, delta: int) -> None:
        raw = self._tables[table].data.get(key)
        self._change(table, key, ((int.from_bytes(raw, "big") if raw else 0) + delta).to_bytes(8, "big"))


class MemoryStore(SnapshotReads):
    """One repository's tables in memory (see the module docstring)."""

    def __init__(self, label: str):
        self.label = label
        self._tables = {name: _Table() for name in TABLES}
        self._lock = threading.RLock()
        self._txns = ThreadTxns()
        self.closed = False

    @contextlib.contextmanager
    def read(self) -> Iterator[MemoryTxn]:
        held = self._txns.held()
        if held is not None:
            yield held
            return
        with self._lock:
            t = MemoryTxn(self._tables, write=False)
            with self._txns.holding(t):
                yield t

    def write(self, fn: Callable[[MemoryTxn], T], durable: bool = True) -> T:
        if self._txns.held() is not None:
            raise NestedTransaction(f"{self.label}: a write was asked for inside another transaction of the "
                                    "same thread; finish that one first")
        with self._lock:
            t = MemoryTxn(self._tables, write=True)
            try:
                with self._txns.holding(t):
                    return fn(t)
            except BaseException:
                t.rollback()
                raise

    def write_grouped(self, fn: Callable[[MemoryTxn], T], durable: bool = True) -> T:
        return self.write(fn, durable)

    def sync(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def stat(self) -> dict[str, int]:
        with self.read() as txn:
            return {name: txn.count(name) for name in TABLES}


_spaces_lock = threading.Lock()
_spaces: dict[str, dict[str, MemoryStore]] = {}


class MemoryBackend:
    """``memory://NAME``: the repositories of one in-process space."""

    def __init__(self, url: str):
        self.url = url
        with _spaces_lock:
            self._repos = _spaces.setdefault(url, {})

    def open(self, repo: str, create: bool = True) -> MemoryStore:
        with _spaces_lock:
            store = self._repos.get(repo)
            if store is None:
                if not create:
                    raise NotFound(f"repository {repo!r}: no refs in {self.url}")
                store = self._repos[repo] = MemoryStore(f"repository {repo!r}: refs in {self.url}")
            store.closed = False
            return store

    def exists(self, repo: str) -> bool:
        with _spaces_lock:
            return repo in self._repos

    def names(self) -> list[str]:
        with _spaces_lock:
            return sorted(self._repos)

    @contextlib.contextmanager
    def borrowed(self, repo: str) -> Iterator[MemoryStore]:
        yield self.open(repo, create=False)

    def close(self, repo: str) -> None:
        pass  # the data stays for the process's lifetime, as a file would stay on disk

    def refuse_in_use(self, repo: str, doing: str) -> None:
        """(Another process's use is not seen here: nothing is refused.)"""

    def remove(self, repo: str) -> None:
        with _spaces_lock:
            self._repos.pop(repo, None)


def forget_space(url: str) -> None:
    """Drop every repository of ``memory://NAME`` (tests call it between cases)."""
    with _spaces_lock:
        _spaces.pop(url, None)
