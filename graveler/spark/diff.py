"""The difference of two commits as a DataFrame, by the committed layer's diff kernel in the tasks.

The driver reads the two metaranges only (never a record).  Ranges with the same ID on
both sides hold the same records and are dropped.  The others are cut into *segments*:
the connected groups of left and right ranges whose key spans overlap.  A key lives in
one range per side, so a key of a segment's range is, on the other side, in a range of
the same segment or absent (were it in a common range, that range would hold it on this
side too): each segment's difference is the diff of its own ranges, independent of the
others.  Each task runs the compiled diff walk (``graveler.committed.kernel``: equal data
blocks skipped undecoded, records compared as bytes, identity decides "changed") over a
run of segments, and only the differing records become entries -- decoded into Arrow
columns by the compiled entry decoder, as ``entries_df`` does.  No shuffle, no join.

A diff whose ranges all overlap one another (boundaries shifted everywhere) is one segment,
hence one task; range boundaries are content-defined (key hashes), so a change leaves the
boundaries away from it in place and segments stay small.
"""

from __future__ import annotations

import bisect
import logging

from graveler import model
from graveler.committed import kernel
from graveler.model import DiffType, RangeInfo, encode_value
from graveler.spark.entries import (
    ENTRY_COLUMNS,
    _c_entry_arrays,
    _py_entry_arrays,
    metarange_of,
    namespace_of,
    per_task_df,
)
from graveler.spark.tables import Namespace, fault_point, open_table, read_metarange, worker_store

log = logging.getLogger(__name__)

_FIELDS = [c for c in ENTRY_COLUMNS if c != "key"]
_STRUCT = ("struct<address:string, etag:string, last_modified:timestamp, size:bigint, range_id:string, "
           "user_metadata:map<string,string>, address_type:string>")
DIFF_SCHEMA = f"diff_type string, key string, left {_STRUCT}, right {_STRUCT}"
_TYPE_NAMES = {DiffType.ADDED: "added", DiffType.REMOVED: "removed", DiffType.CHANGED: "changed"}


def segments(left: list[RangeInfo], right: list[RangeInfo]) -> list[tuple[list[RangeInfo], list[RangeInfo]]]:
    """The differing ranges of two metaranges in independent groups: (left ranges, right ranges) whose
    key spans overlap transitively, in key order; ranges with the same ID on both sides left out."""
    common = {r.id for r in left} & {r.id for r in right}
    items = sorted([(r.min_key, 0, r) for r in left if r.id not in common]
                   + [(r.min_key, 1, r) for r in right if r.id not in common], key=lambda t: (t[0], t[1]))
    out: list[tuple[list[RangeInfo], list[RangeInfo]]] = []
    hi = None
    for lo, side, r in items:
        if hi is None or lo > hi:
            out.append(([], []))
            hi = r.max_key
        else:
            hi = max(hi, r.max_key)
        out[-1][side].append(r)
    return out


def pack(segs: list, tasks: int) -> list[list[int]]:
    """Consecutive runs of segment indexes, about equal in records, at most ``tasks`` runs."""
    if not segs:
        return []
    weights = [sum(r.count for r in a) + sum(r.count for r in b) + 1 for a, b in segs]
    total = sum(weights)
    tasks = max(1, min(tasks, len(segs)))
    runs: list[list[int]] = [[]]
    acc = 0
    for i, w in enumerate(weights):
        if runs[-1] and acc >= total * len(runs) / tasks:
            runs.append([])
        runs[-1].append(i)
        acc += w
    return runs


class _Opener:
    """What the diff walk opens tables through (``.open(id)``), on an executor."""

    def __init__(self, store):
        self.store = store

    def open(self, table_id: str):
        return open_table(self.store, table_id)


def _range_of(infos: list[RangeInfo], maxes: list[bytes], key: bytes) -> str:
    return infos[bisect.bisect_left(maxes, key)].id


def _side(value, key: bytes, infos: list[RangeInfo], maxes: list[bytes], values: list, ranges: list) -> None:
    """Append one side of a difference: its encoded value and the range holding its key, or
    two Nones when the key is absent on that side."""
    if value is None:
        values.append(None)
        ranges.append(None)
    else:
        values.append(encode_value(value))
        ranges.append(_range_of(infos, maxes, key))


def _struct_type(pa):
    return pa.struct([("address", pa.string()), ("etag", pa.string()), ("last_modified", pa.timestamp("us", tz="UTC")),
                      ("size", pa.int64()), ("range_id", pa.string()),
                      ("user_metadata", pa.map_(pa.string(), pa.string())), ("address_type", pa.string())])


def _side_struct(keys: list[bytes], raws: list[bytes | None], rids: list[str | None], pa):
    """The struct column of one side: entries decoded (compiled, one call per range) where present,
    null elsewhere."""
    arrays_of = _py_entry_arrays if model.entry_columns is None else _c_entry_arrays
    present = [i for i, r in enumerate(raws) if r is not None]
    if not present:
        return pa.nulls(len(keys), _struct_type(pa))
    parts = []
    j, m = 0, len(present)
    while j < m:  # runs of one range among the present rows (sorted keys: a range's rows are together)
        rid = rids[present[j]]
        k = j
        while k < m and rids[present[k]] == rid:
            k += 1
        rows = present[j:k]
        arrays, _ = arrays_of([keys[i] for i in rows], [raws[i] for i in rows], rid, pa)
        parts.append(pa.StructArray.from_arrays(arrays[1:], names=_FIELDS))
        j = k
    compact = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
    if m == len(keys):
        return compact
    idx: list[int | None] = [None] * len(keys)
    for c, i in enumerate(present):
        idx[i] = c
    return compact.take(pa.array(idx, pa.int64()))


def _walker():
    """The diff walk over two lists of ranges: the compiled one unless graveler runs its reference."""
    if kernel.compiled is not None and kernel.selected is kernel.compiled:
        from graveler import native

        diff_iter = native.load("graveler.committed._cdiff").DiffIter
        return lambda opener, left, right: diff_iter(opener.open, left, right)
    from graveler.committed.diff import py_diff

    return py_diff


def _diff_task(ns: Namespace, segs: list, runs: list[list[int]]):
    import pyarrow as pa

    walk = _walker()

    def batch(keys, types, lv, rv, lr, rr):
        return pa.RecordBatch.from_arrays(
            [pa.array(types, pa.string()), pa.array(keys, pa.binary()).cast(pa.string()),
             _side_struct(keys, lv, lr, pa), _side_struct(keys, rv, rr, pa)],
            names=["diff_type", "key", "left", "right"])

    def fn(batches):
        store = worker_store(ns)
        opener = _Opener(store)
        for b in batches:
            for item in b.column(0).to_pylist():
                keys, types, lv, rv, lr, rr = [], [], [], [], [], []
                for si in runs[int(item)]:
                    linfos, rinfos = segs[si]
                    lmax = [r.max_key for r in linfos]
                    rmax = [r.max_key for r in rinfos]
                    for d in walk(opener, linfos, rinfos):
                        keys.append(d.key)
                        types.append(_TYPE_NAMES[d.type])
                        _side(d.left, d.key, linfos, lmax, lv, lr)
                        _side(d.right, d.key, rinfos, rmax, rv, rr)
                        if len(keys) >= 8192:
                            yield batch(keys, types, lv, rv, lr, rr)
                            keys, types, lv, rv, lr, rr = [], [], [], [], [], []
                if keys:
                    yield batch(keys, types, lv, rv, lr, rr)
        fault_point("diff")

    return fn


def diff_df(spark, repo, left: str, right: str, tasks: int | None = None):
    """The committed differences from ``left`` to ``right``: one row per changed key with
    ``diff_type`` (added / removed / changed), ``key``, and the ``left`` and ``right`` entries
    (structs of the entry columns; null on the side where the key is absent).  Only the ranges
    whose IDs differ are read; see the module's docstring for how the work is cut."""
    ns = namespace_of(repo)
    store = ns.open()
    lr = read_metarange(store, metarange_of(repo, left))
    rr = read_metarange(store, metarange_of(repo, right))
    segs = segments(lr, rr)
    runs = pack(segs, tasks or 2 * spark.sparkContext.defaultParallelism)  # a Python task costs tens of ms to start
    log.info("diff %s..%s: %d + %d ranges differ, in %d segments, %d tasks", left, right,
             sum(len(a) for a, _ in segs), sum(len(b) for _, b in segs), len(segs), len(runs))
    return per_task_df(spark, [str(i) for i in range(len(runs))]).mapInArrow(_diff_task(ns, segs, runs),
                                                                              DIFF_SCHEMA)
