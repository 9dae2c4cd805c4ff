"""The KV protocol's transaction over one LMDB transaction (:class:`LmdbTxn`), recording a
write's changes for the redo log (:mod:`graveler.kv.lmdb_redo`) when asked."""

from __future__ import annotations

from typing import Iterator

import lmdb


class LmdbTxn:
    """The protocol's transaction (:class:`graveler.kv.base.Txn`) over an ``lmdb.Transaction``.

    ``raw`` is LMDB's own transaction, for tests and benchmarks that look under the protocol."""

    __slots__ = ("raw", "_dbs", "ops")

    def __init__(self, raw: lmdb.Transaction, dbs: dict[str, object], ops: list | None = None):
        self.raw = raw
        self._dbs = dbs
        self.ops = ops  # a write's changes, for the redo log (graveler.kv.lmdb_redo); None: not kept

    def get(self, table: str, key: bytes) -> bytes | None:
        return self.raw.get(key, db=self._dbs[table])

    def get_many(self, keys: list[tuple[str, bytes]]) -> list[bytes | None]:
        return [self.raw.get(k, db=self._dbs[t]) for t, k in keys]

    def put(self, table: str, key: bytes, value: bytes) -> None:
        self.raw.put(key, value, db=self._dbs[table])
        if self.ops is not None:
            self.ops.append((1, table, bytes(key), bytes(value)))

    def put_many(self, table: str, items: list[tuple[bytes, bytes]]) -> int:
        consumed, _ = self.raw.cursor(db=self._dbs[table]).putmulti(items)
        if self.ops is not None:
            self.ops.extend((1, table, bytes(k), bytes(v)) for k, v in items[:consumed])
        return consumed

    def insert(self, table: str, key: bytes, value: bytes) -> bool:
        done = self.raw.put(key, value, db=self._dbs[table], overwrite=False)
        if done and self.ops is not None:
            self.ops.append((1, table, bytes(key), bytes(value)))
        return done

    def set_if(self, table: str, key: bytes, value: bytes | None, expected: bytes | None) -> bool:
        db = self._dbs[table]
        if self.raw.get(key, db=db) != expected:
            return False
        if value is None:
            self.delete(table, key)
        else:
            self.put(table, key, value)
        return True

    def delete(self, table: str, key: bytes) -> bool:
        done = self.raw.delete(key, db=self._dbs[table])
        if done and self.ops is not None:
            self.ops.append((2, table, bytes(key)))
        return done

    def scan(self, table: str, start: bytes = b"", end: bytes | None = None,
             values: bool = True) -> Iterator[tuple[bytes, bytes | None]]:
        cur = self.raw.cursor(db=self._dbs[table])
        if not (cur.set_range(start) if start else cur.first()):
            return
        if values:
            for k, v in cur:
                if end is not None and k >= end:
                    return
                yield k, v
        else:
            for k in cur.iternext(keys=True, values=False):
                if end is not None and k >= end:
                    return
                yield k, None

    def delete_range(self, table: str, start: bytes, end: bytes | None, limit: int | None = None) -> int:
        cur = self.raw.cursor(db=self._dbs[table])
        n = 0
        if not (cur.set_range(start) if start else cur.first()):
            return 0
        while limit is None or n < limit:
            k = cur.key()
            if not k or (end is not None and k >= end):
                break
            cur.delete()
            n += 1
        if n and self.ops is not None:  # redone on the same state, it deletes the same keys
            self.ops.append((3, table, bytes(start), None if end is None else bytes(end), limit))
        return n

    def count(self, table: str) -> int:
        return self.raw.stat(self._dbs[table])["entries"]

    def add(self, table: str, key: bytes, delta: int) -> None:
        db = self._dbs[table]
        raw = self.raw.get(key, db=db)  # a write transaction of LMDB is the only one: nothing races it
        self.put(table, key, ((int.from_bytes(raw, "big") if raw else 0) + delta).to_bytes(8, "big"))
