"""Staging areas (lakeFS's StagingManager) in the repository's KV store (any backend).

A staging token names one staging area: path -> staged value, or a tombstone
(the path is deleted on the branch). A branch has a current token and sealed
tokens (see :mod:`graveler.refs`); all staging areas of a repository live in the
``staging`` table, keyed ``token + b"\\0" + path`` so that a token's keys are
contiguous and in path order. A stored value is the record value encoding of
:mod:`graveler.model` (``encode_value``), or empty for a tombstone.

Paths are bytes (UTF-8 of the object key). :func:`as_path` checks them:
non-empty, valid UTF-8, no NUL, no ``.`` or ``..`` component, and short enough
that ``token + NUL + path`` fits the KV key limit of every backend (:data:`MAX_PATH_BYTES`).
"""

from __future__ import annotations

import bisect
import logging
from typing import Callable, Iterable, Iterator

from graveler import paths
from graveler.kv.base import MAX_KEY_BYTES, STAGING, Store, Txn, prefix_successor
from graveler.model import Value, decode_value, encode_value

log = logging.getLogger(__name__)

SEP = b"\x00"
TOKEN_LENGTH = 16  # graveler.refs.new_staging_token
MAX_PATH_BYTES = MAX_KEY_BYTES - TOKEN_LENGTH - len(SEP)  # 494

Staged = Value | None  # None is a tombstone


def as_path(path: str | bytes, what: str = "path") -> bytes:
    """Check an object path and return it as bytes (raises InvalidArgument): the one
    rule of :func:`graveler.paths.check_path`, within the staging key limit."""
    return paths.check_path(path, what, MAX_PATH_BYTES)


def as_prefix(prefix: str | bytes) -> bytes:
    """A listing prefix (:func:`graveler.paths.check_prefix`): may be empty or end in a
    partial component."""
    return paths.check_prefix(prefix)


def _encode(v: Staged) -> bytes:
    return b"" if v is None else encode_value(v)


def _decode(raw: bytes, key: bytes) -> Staged:
    return None if not raw else decode_value(raw, "staging " + key.decode("utf-8", "replace"))


class StagingManager:
    """Per-token staging areas. ``*_txn`` methods use the caller's transaction."""

    def __init__(self, env: Store):
        self.env = env

    @staticmethod
    def key(token: str, path: bytes) -> bytes:
        """The staging table's key of ``path`` in ``token``."""
        return token.encode("ascii") + SEP + path

    _key = key

    # single keys
    def set_txn(self, txn: Txn, token: str, path: bytes, value: Staged) -> None:
        """Stage ``value`` (None = tombstone) for ``path`` in ``token``."""
        txn.put(STAGING, self._key(token, path), _encode(value))

    def set_many_txn(self, txn: Txn, token: str, items: Iterable[tuple[bytes, Staged]]) -> int:
        t = token.encode("ascii") + SEP
        return txn.put_many(STAGING, [(t + path, _encode(value)) for path, value in items])

    def put_records_txn(self, txn: Txn, token: str, paths: list[bytes], records: list[bytes]) -> int:
        """Stage already-encoded records (:func:`graveler.model.encode_records`; b"" = tombstone) at ``paths``."""
        t = token.encode("ascii") + SEP
        return txn.put_many(STAGING, [(t + path, raw) for path, raw in zip(paths, records, strict=True)])

    def remove_txn(self, txn: Txn, token: str, path: bytes) -> bool:
        """Forget ``path`` in ``token`` entirely (not a tombstone)."""
        return txn.delete(STAGING, self._key(token, path))

    def get_txn(self, txn: Txn, tokens: Iterable[str], path: bytes) -> tuple[bool, Staged]:
        """Look ``path`` up in ``tokens`` in order: (found, value-or-tombstone)."""
        for token in tokens:
            k = self._key(token, path)
            raw = txn.get(STAGING, k)
            if raw is not None:
                return True, _decode(raw, k)
        return False, None

    def get(self, tokens: Iterable[str], path: bytes) -> tuple[bool, Staged]:
        with self.env.read() as txn:
            return self.get_txn(txn, tokens, path)

    # ranges
    def scan_txn(
        self, txn: Txn, token: str, start: bytes = b"", limit: int | None = None, end: bytes | None = None
    ) -> list[tuple[bytes, Staged]]:
        """Up to ``limit`` (path, staged) of ``token`` with start <= path (< end), in path order."""
        t = token.encode("ascii") + SEP
        lo = t + start
        hi = t[:-1] + b"\x01" if end is None else t + end
        out: list[tuple[bytes, Staged]] = []
        n = len(t)
        for k, v in txn.scan(STAGING, lo, hi):
            out.append((k[n:], _decode(v, k)))
            if limit is not None and len(out) >= limit:
                break
        return out

    def scan(
        self,
        token: str,
        start: bytes = b"",
        limit: int | None = None,
        end: bytes | None = None,
        guard: Callable[[Txn], None] | None = None,
    ) -> list[tuple[bytes, Staged]]:
        """``scan_txn`` in its own read transaction; ``guard(txn)`` runs first in the
        same snapshot (it may raise, e.g. when the branch moved on)."""
        with self.env.read() as txn:
            if guard is not None:
                guard(txn)
            return self.scan_txn(txn, token, start, limit, end)

    def iterator(
        self, token: str, start: bytes = b"", guard: Callable[[Txn], None] | None = None, batch: int = 64,
        end: bytes | None = None,
    ) -> "TokenIterator":
        """A seekable iterator over ``token`` that reads in batches, one short
        transaction each, calling ``guard(txn)`` in each of them; ``batch``: the first
        batch after a seek (a reader that wants one or two entries reads few); ``end``: no
        path >= ``end`` is read."""
        it = TokenIterator(self, token, guard, batch, end)
        if start:
            it.seek_ge(start)
        return it

    def stream(self, token: str, start: bytes = b"", batch: int = 8192) -> Iterator[tuple[bytes, Staged]]:
        """Every (path, staged) of ``token`` from ``start`` on, read ``batch`` at a time
        (one transaction each; none is held between yields)."""
        while True:
            items = self.scan(token, start, batch)
            yield from items
            if len(items) < batch:
                return
            start = items[-1][0] + b"\x00"

    def is_empty_txn(self, txn: Txn, token: str) -> bool:
        return not self.scan_txn(txn, token, limit=1)

    def count(self, token: str) -> int:
        t = token.encode("ascii") + SEP
        hi = t[:-1] + b"\x01"
        with self.env.read() as txn:
            return sum(1 for _ in txn.scan(STAGING, t, hi, values=False))

    # dropping
    def drop_prefix_txn(self, txn: Txn, token: str, prefix: bytes) -> int:
        """Forget every path starting with ``prefix`` in ``token``; return how many."""
        t = token.encode("ascii") + SEP
        lo = t + prefix
        return txn.delete_range(STAGING, lo, prefix_successor(lo))

    def drop(self, token: str, batch: int = 20_000) -> int:
        """Forget a whole token, in transactions of at most ``batch`` deletes."""
        total = 0
        while True:

            def one(txn: Txn) -> int:
                t = token.encode("ascii") + SEP
                return txn.delete_range(STAGING, t, t[:-1] + b"\x01", limit=batch)

            n = self.env.write(one)
            total += n
            if n < batch:
                return total

    def drop_many(self, tokens: Iterable[str]) -> None:
        for t in tokens:
            if t:
                self.drop(t)

    def tokens_present(self) -> set[str]:
        """Every token that has at least one staged key (for cleaning orphans)."""
        out: set[str] = set()
        start = b""
        with self.env.read() as txn:
            while True:
                first = next(txn.scan(STAGING, start, values=False), None)
                if first is None:
                    return out
                tok = first[0].split(SEP, 1)[0]
                out.add(tok.decode("ascii", "replace"))
                start = tok + b"\x01"


class TokenIterator:
    """Seekable iterator over one token's staged entries.

    ``next()`` returns ``(path, staged)`` or None at the end; ``seek_ge(key)``
    moves to the first path >= key (within the current batch when it can).
    Batches grow from 64 (or ``batch``) to 4096 entries, so a seek-then-few-reads (a
    listing that skips directories) stays cheap.
    """

    __slots__ = ("_sm", "_token", "_guard", "_buf", "_keys", "_i", "_resume", "_done", "_batch", "_first", "_end")

    def __init__(self, sm: StagingManager, token: str, guard: Callable[[Txn], None] | None = None,
                 batch: int = 64, end: bytes | None = None):
        self._sm = sm
        self._end = end  # no path >= end is read (a branch's tombstones past it are never walked)
        self._token = token
        self._guard = guard
        self._buf: list[tuple[bytes, Staged]] = []
        self._keys: list[bytes] = []
        self._i = 0
        self._resume: bytes | None = b""
        self._done = False
        self._first = self._batch = max(1, batch)

    def _fill(self) -> None:
        if self._resume is None:
            self._done = True
            self._buf, self._keys, self._i = [], [], 0
            return
        self._buf = self._sm.scan(self._token, self._resume, self._batch, self._end, guard=self._guard)
        self._keys = [k for k, _ in self._buf]
        self._i = 0
        if len(self._buf) < self._batch:
            self._resume = None
        else:
            self._resume = self._keys[-1] + b"\x00"
        self._batch = min(self._batch * 2, 4096)
        if not self._buf:
            self._done = True

    def seek_ge(self, key: bytes) -> None:
        if self._keys and self._keys[0] <= key <= self._keys[-1]:
            self._i = bisect.bisect_left(self._keys, key)
            return
        if self._keys and self._resume is None and key > self._keys[-1]:
            self._i = len(self._buf)  # past the end of the token
            self._done = True
            return
        self._buf, self._keys, self._i = [], [], 0
        self._resume = key
        self._done = False
        self._batch = self._first

    def next(self) -> tuple[bytes, Staged] | None:
        if self._i >= len(self._buf):
            if self._done:
                return None
            self._fill()
            if not self._buf:
                return None
        item = self._buf[self._i]
        self._i += 1
        return item

    def peek(self) -> tuple[bytes, Staged] | None:
        item = self.next()
        if item is not None:
            self._i -= 1
        return item
